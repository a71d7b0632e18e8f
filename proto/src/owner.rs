//! How an agent says it refused an upsert because the Application at that
//! key on the managed cluster belongs to someone else (capability
//! `owner-check`, see `ACK_OUTCOME_REJECTED` in transport.proto).
//!
//! The refusal travels in the existing `ObjectAck.message`, behind a fixed
//! prefix, so that hubs that do not know it still show it as a plain
//! rejection, and hubs that do can tell who holds the Application. Both
//! ends use this module: the text is the contract.

use crate::v1::ObjectKey;

/// Every refusal message starts with this.
pub const PREFIX: &str = "OwnerConflict: ";
const HELD_BY: &str = "held by hub Application ";
const NOT_OURS: &str = "not delivered by argocd-pull";

/// Who holds the Application an upsert was refused for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The agent delivered it for another hub Application, by this uid.
    HubApplication(String),
    /// argocd-pull did not deliver it (created on the managed cluster, or
    /// by a ManifestWork without argocd-pull's mark).
    NotArgocdPull,
}

/// The `ObjectAck.message` of a refused upsert of `key`.
pub fn conflict_message(key: &ObjectKey, holder: &Holder) -> String {
    let (ns, name) = (&key.namespace, &key.name);
    match holder {
        Holder::HubApplication(uid) => format!(
            "{PREFIX}{HELD_BY}{uid}: Application {ns}/{name} on this cluster was delivered for another hub Application, which keeps it; the agent neither overwrites nor deletes it"
        ),
        Holder::NotArgocdPull => format!(
            "{PREFIX}{NOT_OURS}: Application {ns}/{name} exists on this cluster and argocd-pull did not create it; the agent neither overwrites nor deletes it (rename one of the two, or delete it on the cluster)"
        ),
    }
}

/// The holder named by a refusal message; `None` for any other message.
pub fn parse_conflict(message: &str) -> Option<Holder> {
    let rest = message.strip_prefix(PREFIX)?;
    if let Some(after) = rest.strip_prefix(HELD_BY) {
        let uid = after.split(':').next().unwrap_or_default();
        return (!uid.is_empty()).then(|| Holder::HubApplication(uid.to_string()));
    }
    rest.starts_with(NOT_OURS).then_some(Holder::NotArgocdPull)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_its_holder_and_reads_back() {
        let key = ObjectKey {
            namespace: "argocd".into(),
            name: "gb".into(),
        };
        for holder in [
            Holder::HubApplication("0f1e-uid".into()),
            Holder::NotArgocdPull,
        ] {
            let m = conflict_message(&key, &holder);
            assert!(m.starts_with(PREFIX) && m.contains("argocd/gb"), "{m}");
            assert_eq!(parse_conflict(&m), Some(holder));
        }
        for other in [
            "",
            "the cluster's API server refused it: forbidden",
            "OwnerConflict: something else",
            "OwnerConflict: held by hub Application : x",
        ] {
            assert_eq!(parse_conflict(other), None, "{other:?}");
        }
    }
}
