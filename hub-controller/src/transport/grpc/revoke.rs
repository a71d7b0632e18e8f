//! Cutting agents off: a certificate's validity checked on every new stream
//! (not only at the handshake of its connection), a deny list of client
//! certificates kept in a ConfigMap and watched live, and whole clusters
//! revoked by the hub's watches when they leave OCM or their addon is
//! disabled. This module holds the rules and the list as plain data; the
//! hub applies them (`hub/admission.rs`: admit, revoke, the deny list's
//! watch). A refused stream gets a status saying why (a [`Refusal`],
//! turned into a gRPC status at the server's edge), is logged with the
//! cluster and the certificate, and counted in
//! `argocd_pull_hub_grpc_refused_total`.
//!
//! The deny list: ConfigMap `--grpc-denied-certificates` (default
//! `argocd-pull-denied-certificates`) in the hub-controller's namespace; each
//! key is the SHA-256 of a client certificate (DER), 64 hex digits, and its
//! value a note for the log and the refusal. A session whose certificate is
//! listed is ended as soon as the watch delivers the change.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

/// How long a cluster whose addon was disabled stays connected at most, for
/// its agent to acknowledge letting go of its Applications.
pub const LEAVE_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

pub use argocd_pull_apis::keys::DENY_LIST;

/// How the agent is told of a refusal: the gRPC code it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalCode {
    /// The certificate is not valid (now).
    Unauthenticated,
    /// The certificate or its cluster may not connect.
    PermissionDenied,
    /// Not yet: the agent should try again.
    Unavailable,
}

/// Why a stream is refused, for the metric (`reason`) and for the agent
/// (`code` and `message`).
#[derive(Debug)]
pub struct Refusal {
    pub reason: &'static str,
    pub code: RefusalCode,
    pub message: String,
}

impl Refusal {
    pub fn new(reason: &'static str, code: RefusalCode, message: String) -> Self {
        Self {
            reason,
            code,
            message,
        }
    }

    pub fn expired(not_after: i64) -> Self {
        Self::new(
            "certificate-expired",
            RefusalCode::Unauthenticated,
            format!(
                "the client certificate expired at {not_after} (Unix time): reconnect with the renewed one"
            ),
        )
    }

    pub fn denied(list: &DenyList, fingerprint: &str, note: &str) -> Self {
        let note = if note.is_empty() {
            String::new()
        } else {
            format!(": {note}")
        };
        Self::new(
            "certificate-denied",
            RefusalCode::PermissionDenied,
            format!(
                "the client certificate (SHA-256 {fingerprint}) is on the hub's deny list (ConfigMap {}){note}",
                list.source()
            ),
        )
    }

    pub fn revoked(cluster: &str, why: &str) -> Self {
        Self::new(
            "revoked",
            RefusalCode::PermissionDenied,
            format!("cluster {cluster} may not connect to this hub: {why}"),
        )
    }
}

/// Refuses a certificate that is no longer valid at `now` (Unix seconds).
pub fn check_validity(not_after: i64, now: i64) -> Result<(), Refusal> {
    if now >= not_after {
        return Err(Refusal::expired(not_after));
    }
    Ok(())
}

/// The deny list in force: fingerprint -> note.
pub struct DenyList {
    namespace: String,
    name: String,
    entries: RwLock<HashMap<String, String>>,
    loaded: watch::Sender<bool>,
}

impl std::fmt::Debug for DenyList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyList")
            .field("source", &self.source())
            .finish()
    }
}

impl DenyList {
    /// The list kept in ConfigMap `namespace/name`; an empty `name` turns
    /// it off (nothing is ever denied).
    pub fn new(namespace: &str, name: &str) -> Arc<Self> {
        Arc::new(Self {
            namespace: namespace.into(),
            name: name.into(),
            entries: RwLock::default(),
            loaded: watch::channel(name.is_empty()).0,
        })
    }

    pub fn source(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The namespace and name of the ConfigMap; an empty name: no list.
    pub fn configmap(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }

    /// The note of `fingerprint`, when it is denied.
    pub fn denied(&self, fingerprint: &str) -> Option<String> {
        self.entries
            .read()
            .expect("never poisoned")
            .get(fingerprint)
            .cloned()
    }

    /// Resolves once the ConfigMap has been read (or found missing).
    pub async fn wait_loaded(&self) {
        let mut rx = self.loaded.subscribe();
        let _ = rx.wait_for(|l| *l).await;
    }

    /// The entries in force from now on; how many.
    pub fn replace(&self, entries: HashMap<String, String>) -> usize {
        let n = entries.len();
        *self.entries.write().expect("never poisoned") = entries;
        self.loaded.send_replace(true);
        n
    }
}

/// The entries of the deny list's data, and what is wrong with the keys
/// that are not fingerprints (left out).
pub fn parse(data: &BTreeMap<String, String>) -> (HashMap<String, String>, Vec<String>) {
    let mut entries = HashMap::new();
    let mut errors = Vec::new();
    for (key, note) in data {
        let fingerprint = key.to_ascii_lowercase();
        if fingerprint.len() == 64 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
            entries.insert(fingerprint, note.trim().to_string());
        } else {
            errors.push(format!(
                "deny list entry {key:?} is not a SHA-256 fingerprint (64 hex digits of the certificate's DER, e.g. from `openssl x509 -in tls.crt -outform DER | sha256sum`); ignored"
            ));
        }
    }
    (entries, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_keys_and_anything_else_is_reported() {
        let fp = "AB".repeat(32);
        let data: BTreeMap<String, String> = [
            (fp.clone(), " stolen laptop, ticket 42\n".to_string()),
            ("cluster1".to_string(), String::new()),
            ("ab".repeat(31), String::new()),
            ("zz".repeat(32), String::new()),
        ]
        .into();
        let (entries, errors) = parse(&data);
        assert_eq!(
            entries,
            [(
                fp.to_ascii_lowercase(),
                "stolen laptop, ticket 42".to_string()
            )]
            .into()
        );
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].contains("not a SHA-256 fingerprint"),
            "{errors:?}"
        );
    }

    #[test]
    fn validity_is_checked_against_now() {
        assert!(check_validity(100, 99).is_ok());
        let r = check_validity(100, 100).unwrap_err();
        assert_eq!(r.reason, "certificate-expired");
        assert_eq!(r.code, RefusalCode::Unauthenticated);
        assert!(r.message.contains("expired at 100"), "{r:?}");
    }

    #[tokio::test]
    async fn the_list_answers_once_loaded() {
        let list = DenyList::new("ns", DENY_LIST);
        assert!(
            !*list.loaded.borrow(),
            "not loaded before the ConfigMap was read"
        );
        list.replace([("f".repeat(64), "why".to_string())].into());
        list.wait_loaded().await;
        assert_eq!(list.denied(&"f".repeat(64)).as_deref(), Some("why"));
        assert_eq!(list.denied(&"e".repeat(64)), None);
        let r = Refusal::denied(&list, &"f".repeat(64), "why");
        assert_eq!(r.code, RefusalCode::PermissionDenied);
        assert!(
            r.message
                .contains("deny list (ConfigMap ns/argocd-pull-denied-certificates): why"),
            "{r:?}"
        );
        // Turned off: loaded at once, nothing denied.
        DenyList::new("ns", "").wait_loaded().await;
    }
}
