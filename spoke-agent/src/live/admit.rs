//! Whether one more live read may start on this cluster: the agent's own
//! bounds, which keep the cluster's API server from serving more reads at
//! once than it should, counted per share ([`Share`]: the namespace, with
//! followed logs apart), so that one reader's follows never hold back
//! another's LIVE MANIFEST. The hub shares reads out more tightly first
//! (its `--live-reads-per-namespace`, `--live-follows-per-namespace`);
//! these are ceilings above its defaults.

use argocd_pull_core::live::{Refusal, Share};

/// Reads other than followed logs under way in one namespace.
pub const MAX_READS_PER_SHARE: usize = 16;
/// Followed logs under way in one namespace.
pub const MAX_FOLLOWS_PER_SHARE: usize = 16;
/// Reads of every kind under way on the cluster.
pub const MAX_RUNNING: usize = 256;

/// `Ok` if a read of `share` may start beside the `running` ones, or the
/// 429 it is answered with.
pub fn admit<'a>(running: impl Iterator<Item = &'a Share>, share: &Share) -> Result<(), Refusal> {
    let (mut same, mut all) = (0, 0);
    for s in running {
        all += 1;
        same += usize::from(s == share);
    }
    let limit = if share.follow {
        MAX_FOLLOWS_PER_SHARE
    } else {
        MAX_READS_PER_SHARE
    };
    if same >= limit {
        return Err(Refusal::new(
            429,
            format!(
                "{limit} {share} are under way on this cluster, the most its agent serves at once; close one and try again"
            ),
        ));
    }
    if all >= MAX_RUNNING {
        return Err(Refusal::new(
            429,
            format!(
                "{MAX_RUNNING} live reads are under way on this cluster, the most its agent serves at once; try again"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_pull_core::live::Scope;

    fn share(ns: &str, follow: bool) -> Share {
        Share {
            scope: Scope::Namespace(ns.into()),
            follow,
        }
    }

    #[test]
    fn follows_of_one_namespace_hold_back_neither_reads_nor_other_namespaces() {
        let running: Vec<Share> = (0..MAX_FOLLOWS_PER_SHARE)
            .map(|_| share("a", true))
            .collect();
        let refused = admit(running.iter(), &share("a", true)).unwrap_err();
        assert_eq!(refused.code, 429);
        assert!(
            refused.message.contains("followed logs in namespace a"),
            "{}",
            refused.message
        );
        assert_eq!(admit(running.iter(), &share("a", false)), Ok(()));
        assert_eq!(admit(running.iter(), &share("b", true)), Ok(()));
    }

    #[test]
    fn the_cluster_has_a_ceiling() {
        let running: Vec<Share> = (0..MAX_RUNNING)
            .map(|i| share(&format!("ns-{i}"), false))
            .collect();
        assert_eq!(
            admit(running.iter(), &share("new", false))
                .unwrap_err()
                .code,
            429
        );
    }
}
