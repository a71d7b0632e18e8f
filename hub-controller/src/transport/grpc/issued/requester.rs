//! Who asked for a certificate, and whether that is the cluster it names
//! (pure).
//!
//! The API server records the requester of a CertificateSigningRequest in
//! `spec.username` and `spec.groups`; nobody can forge those. A
//! klusterlet files its addons' CSRs with its own hub identity: user
//! `system:open-cluster-management:<cluster>:<agent-id>`, in group
//! `system:open-cluster-management:<cluster>`. OCM's addon-manager signs
//! whatever subject such a request asks for (docs/security.md), so a
//! certificate of our signer counts for cluster X only when the request
//! came from X's klusterlet, is labelled for X, and its subject names X.

use argocd_pull_apis::names::dns_label;

use super::super::identity::{IdentityMap, cert_info, fingerprint};

/// What every klusterlet's hub user name and group start with.
pub const OCM_PREFIX: &str = "system:open-cluster-management:";
/// The label OCM puts on an addon's CSR: the cluster it is for.
pub const CLUSTER_LABEL: &str = "open-cluster-management.io/cluster-name";

/// The cluster whose klusterlet is `username` in `groups`: the user is
/// `system:open-cluster-management:<cluster>:<agent-id>` and the groups
/// hold `system:open-cluster-management:<cluster>`, for the same cluster.
pub fn requester_cluster(username: &str, groups: &[String]) -> Option<String> {
    let rest = username.strip_prefix(OCM_PREFIX)?;
    let (cluster, agent) = rest.split_once(':')?;
    if agent.is_empty() || agent.contains(':') || dns_label(cluster).is_err() {
        return None;
    }
    let group = format!("{OCM_PREFIX}{cluster}");
    groups.contains(&group).then(|| cluster.to_string())
}

/// The facts of one CSR that matter here.
#[derive(Clone, Debug, Default)]
pub struct Csr<'a> {
    pub name: &'a str,
    /// `metadata.labels[open-cluster-management.io/cluster-name]`.
    pub label_cluster: Option<&'a str>,
    pub username: &'a str,
    pub groups: &'a [String],
    /// `status.certificate` (PEM), once signed.
    pub certificate: Option<&'a [u8]>,
}

/// A certificate OCM issued, and what the hub makes of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    /// The CSR it was issued on.
    pub csr: String,
    /// Who filed the CSR (`spec.username`).
    pub requester: String,
    /// SHA-256 of the certificate (DER), as the hub sees it on a connection.
    pub fingerprint: String,
    pub not_before: i64,
    pub not_after: i64,
    /// The cluster its subject names (for `Refused`, if any).
    pub cluster: Option<String>,
}

/// The verdict on one CSR of our signer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// Not signed (yet): nothing to record.
    Pending,
    /// The signed certificate cannot be read (logged, never accepted).
    Unreadable(String),
    /// Issued on a request by the cluster its subject names.
    Issued(Issue),
    /// Issued, but not on a request by the cluster it names: never
    /// accepted. The reason, for the log, the Event and the refusal.
    Refused(Issue, String),
}

/// Judges a CSR of our signer: was its certificate issued on a request
/// by the very cluster its subject names?
pub fn judge(csr: &Csr<'_>, identities: &IdentityMap) -> Judgement {
    let Some(pem) = csr.certificate.filter(|c| !c.is_empty()) else {
        return Judgement::Pending;
    };
    let der = match x509_parser::pem::parse_x509_pem(pem) {
        Ok((_, pem)) => pem.contents,
        Err(e) => return Judgement::Unreadable(format!("status.certificate is not PEM: {e}")),
    };
    let info = match cert_info(&der) {
        Ok(i) => i,
        Err(e) => return Judgement::Unreadable(e.to_string()),
    };
    let claimed = identities.cluster(&info.subject).ok();
    let issue = Issue {
        csr: csr.name.to_string(),
        requester: csr.username.to_string(),
        fingerprint: fingerprint(&der),
        not_before: info.not_before,
        not_after: info.not_after,
        cluster: claimed.clone(),
    };
    let Some(claimed) = claimed else {
        let why = format!(
            "its subject {:?} names no cluster the hub accepts",
            info.subject
        );
        return Judgement::Refused(issue, why);
    };
    let Some(requester) = requester_cluster(csr.username, csr.groups) else {
        let why = format!(
            "it was requested by {:?}, which is not a klusterlet's hub identity ({OCM_PREFIX}<cluster>:<agent> in group {OCM_PREFIX}<cluster>); only cluster {claimed}'s own klusterlet may ask for cluster {claimed}'s certificate",
            csr.username
        );
        return Judgement::Refused(issue, why);
    };
    if requester != claimed {
        let why = format!(
            "it was requested by cluster {requester}'s klusterlet ({}), not by cluster {claimed}'s",
            csr.username
        );
        return Judgement::Refused(issue, why);
    }
    if csr.label_cluster != Some(claimed.as_str()) {
        let why = format!(
            "its label {CLUSTER_LABEL} is {:?}, not {claimed:?}",
            csr.label_cluster.unwrap_or_default()
        );
        return Judgement::Refused(issue, why);
    }
    Judgement::Issued(issue)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(cluster: &str) -> Vec<String> {
        vec![
            format!("{OCM_PREFIX}{cluster}"),
            "system:open-cluster-management:managed-clusters".into(),
            "system:authenticated".into(),
        ]
    }

    #[test]
    fn the_requester_is_a_klusterlet_of_one_cluster() {
        let user = "system:open-cluster-management:cluster1:b4x7q";
        assert_eq!(
            requester_cluster(user, &groups("cluster1")).as_deref(),
            Some("cluster1")
        );
        for (user, groups, why) in [
            // The group must name the same cluster as the user.
            (user, groups("cluster2"), "another cluster's group"),
            (user, vec![], "no group"),
            // Not a klusterlet.
            ("kubernetes-admin", groups("cluster1"), "an admin"),
            (
                "system:serviceaccount:open-cluster-management:cluster-bootstrap",
                groups("cluster1"),
                "the bootstrap account",
            ),
            // An addon's own identity is not its klusterlet's.
            (
                "system:open-cluster-management:cluster:cluster1:addon:argocd-pull:agent:x",
                groups("cluster"),
                "an addon certificate",
            ),
            (
                "system:open-cluster-management:cluster1:a:b",
                groups("cluster1"),
                "an extra part",
            ),
            (
                "system:open-cluster-management:cluster1:",
                groups("cluster1"),
                "no agent id",
            ),
            (
                "system:open-cluster-management:Bad_Name:x",
                groups("Bad_Name"),
                "not a DNS label",
            ),
        ] {
            assert_eq!(requester_cluster(user, &groups), None, "{why}: {user}");
        }
    }

    fn signed(subject: &str) -> String {
        let ca = testenv::pki::Ca::new("ca").unwrap();
        ca.client(subject, None).unwrap().cert_pem
    }

    fn subject(cluster: &str) -> String {
        format!(
            "system:open-cluster-management:cluster:{cluster}:addon:argocd-pull:agent:argocd-pull-agent"
        )
    }

    #[test]
    fn only_the_named_clusters_own_request_counts() {
        let map = IdentityMap::default();
        let own = signed(&subject("cluster1"));
        let g1 = groups("cluster1");
        let g2 = groups("cluster2");
        let csr = |user: &'static str, g: &'static [String], label: &'static str, cert: &str| {
            let cert: &'static [u8] = Box::leak(cert.as_bytes().to_vec().into_boxed_slice());
            Csr {
                name: "addon-cluster1-argocd-pull-x",
                label_cluster: Some(label),
                username: user,
                groups: g,
                certificate: Some(cert),
            }
        };
        let g1: &'static [String] = Box::leak(g1.into_boxed_slice());
        let g2: &'static [String] = Box::leak(g2.into_boxed_slice());
        let user1 = "system:open-cluster-management:cluster1:abc";
        let user2 = "system:open-cluster-management:cluster2:def";

        let Judgement::Issued(issue) = judge(&csr(user1, g1, "cluster1", &own), &map) else {
            panic!("cluster1's own request");
        };
        assert_eq!(issue.cluster.as_deref(), Some("cluster1"));
        assert_eq!(issue.requester, user1);
        assert_eq!(issue.fingerprint.len(), 64);
        assert!(issue.not_before < issue.not_after);

        // The forgery: cluster2's klusterlet asks for cluster1.
        for (label, want) in [
            ("cluster2", "requested by cluster cluster2's klusterlet"),
            ("cluster1", "requested by cluster cluster2's klusterlet"),
        ] {
            match judge(&csr(user2, g2, label, &own), &map) {
                Judgement::Refused(issue, why) => {
                    assert!(why.contains(want), "{why}");
                    assert!(why.contains(user2), "{why}");
                    assert_eq!(issue.cluster.as_deref(), Some("cluster1"));
                }
                other => panic!("{other:?}"),
            }
        }
        // A user that is no klusterlet.
        match judge(&csr("kubernetes-admin", g1, "cluster1", &own), &map) {
            Judgement::Refused(_, why) => assert!(why.contains("not a klusterlet"), "{why}"),
            other => panic!("{other:?}"),
        }
        // The right requester, a wrong label.
        match judge(&csr(user1, g1, "cluster2", &own), &map) {
            Judgement::Refused(_, why) => assert!(why.contains(CLUSTER_LABEL), "{why}"),
            other => panic!("{other:?}"),
        }
        // A subject of no cluster.
        match judge(&csr(user1, g1, "cluster1", &signed("someone")), &map) {
            Judgement::Refused(issue, why) => {
                assert!(why.contains("names no cluster"), "{why}");
                assert_eq!(issue.cluster, None);
            }
            other => panic!("{other:?}"),
        }
        // Not signed yet, or junk.
        let mut pending = csr(user1, g1, "cluster1", "");
        assert_eq!(judge(&pending, &map), Judgement::Pending);
        pending.certificate = None;
        assert_eq!(judge(&pending, &map), Judgement::Pending);
        assert!(matches!(
            judge(&csr(user1, g1, "cluster1", "junk"), &map),
            Judgement::Unreadable(_)
        ));
    }
}
