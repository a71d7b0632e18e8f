//! Autonomous mode: the read-only hub mirror of each Application an
//! autonomous agent reports, written by server-side apply as
//! `argocd-pull-mirror`, deleted when the spoke's copy is gone, and the
//! commands a mirror carries.

use std::sync::Arc;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_proto::content;
use argocd_pull_proto::digest::bucket_of;
use argocd_pull_proto::v1::ObjectKey;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use super::super::cluster::{ClusterState, Observation, Report, Work};
use super::super::metrics::GrpcMetrics;
use super::MIRROR_MANAGER;
use super::clusters::Clusters;
use super::relay::CommandRelay;
use crate::status::AppWriter;
use crate::transport::grpc::render;
use crate::watch::cached::CachedApp;
use crate::watch::caches::Caches;

/// Writes the mirrors, from what the agents reported.
pub struct Mirrors {
    pub(super) client: kube::Client,
    pub(super) caches: Caches,
    pub(super) writer: Arc<AppWriter>,
    pub(super) metrics: GrpcMetrics,
    pub(super) clusters: Arc<Clusters>,
    pub(super) relay: Arc<CommandRelay>,
}

impl Mirrors {
    /// A mirror seen on the hub is part of the hub's replica of the
    /// observed set until the agent reports it again (after a restart).
    pub fn seed(&self, cluster: &str, key: &ObjectKey, mirror: &CachedApp) {
        let Some(version) = mirror.annotations().get(render::MIRROR_VERSION) else {
            return;
        };
        let cs = self.clusters.get(cluster);
        let mut inner = cs.lock();
        inner
            .observed
            .entry(key.clone())
            .or_insert_with(|| Observation::Mirrored {
                version: version.to_string(),
            });
    }

    /// What the hub's mirrors of `cluster` show, as the observations a
    /// fresh replica starts from.
    pub fn seed_all(&self, cluster: &str) {
        for m in self.caches.mirrors.state() {
            if let Some(Work::Mirror { cluster: c, key }) = mirror_work(&m)
                && c == cluster
            {
                self.seed(&c, &key, &m);
            }
        }
    }

    /// The work of every mirror of a cluster `wanted` accepts.
    pub fn works_where(&self, wanted: impl Fn(&str) -> bool) -> Vec<Work> {
        self.caches
            .mirrors
            .state()
            .iter()
            .filter_map(|m| mirror_work(m))
            .filter(|w| matches!(w, Work::Mirror { cluster, .. } if wanted(cluster)))
            .collect()
    }

    /// Writes, deletes or rechecks the mirror of `key` on `cluster`, as its
    /// agent's latest report says.
    pub async fn reconcile(&self, cluster: &str, key: &ObjectKey) -> Result<(), kube::Error> {
        let cs = self.clusters.get(cluster);
        let cached = self
            .caches
            .mirrors
            .get(&ObjectRef::new(&key.name).within(cluster));
        let cached_rv = cached
            .as_ref()
            .and_then(|m| m.identity().resource_version.clone());
        if self.writer.written().behind_key(
            &(cluster.to_string(), key.name.clone()),
            cached_rv.as_deref(),
        ) {
            // Decided again when the echo of our last write arrives.
            return Ok(());
        }
        let mirror = Mirror {
            cluster,
            key,
            api: Api::namespaced_with(self.client.clone(), cluster, &application_resource()),
            source: format!("{}/{}", key.namespace, key.name),
            current: cached.map(|m| m.application()),
            cs,
        };
        let observation = mirror.cs.lock().observed.get(key).cloned();
        match observation {
            Some(Observation::Observed { version, report }) => {
                self.write_mirror(&mirror, &version, &report).await
            }
            Some(Observation::Gone) => self.delete_mirror(&mirror).await,
            Some(Observation::Mirrored { .. }) => self.recheck_mirror(&mirror).await,
            None => Ok(()),
        }
    }

    /// The agent reported the Application: its mirror is written unless
    /// its name is taken, and a mirror already as reported only has its
    /// commands looked at.
    async fn write_mirror(
        &self,
        mirror: &Mirror<'_>,
        version: &str,
        report: &Report,
    ) -> Result<(), kube::Error> {
        let app: Value = report
            .application
            .as_ref()
            .and_then(|a| a.parse().ok())
            .unwrap_or_default();
        let status: Value = report.status.parse().unwrap_or_default();
        let wanted = render::mirror(mirror.cluster, mirror.key, &app, &status, version);
        if !self.mirror_name_free(mirror).await? {
            return Ok(());
        }
        if let Some(m) = &mirror.current
            && render::mirror_matches(m, &wanted)
        {
            return self
                .relay
                .commands(m, mirror.work(), &mirror.cs, mirror.key)
                .await;
        }
        self.apply_mirror(mirror, &wanted).await
    }

    /// Whether the mirror may have its name: false when a hub Application
    /// that is not this mirror has it, which is warned about and left
    /// alone.
    async fn mirror_name_free(&self, mirror: &Mirror<'_>) -> Result<bool, kube::Error> {
        let (cluster, source) = (mirror.cluster, &mirror.source);
        match &mirror.current {
            // The mirror cache sees only mirrors: a hub Application
            // of that name without our label is someone else's and
            // must not be taken over.
            None => {
                if let Some(other) = mirror.api.get_opt(&mirror.key.name).await?
                    && !mirror.is_ours(&other)
                {
                    let message = format!(
                        "cluster {cluster}'s Application {source} is not mirrored: this Application has its name in namespace {cluster}; rename one of them"
                    );
                    tracing::warn!(%cluster, %source, "a hub Application that is not this mirror has its name; not mirrored");
                    self.writer
                        .event(&other, EventType::Warning, "MirrorNameTaken", &message)
                        .await;
                    return Ok(false);
                }
                Ok(true)
            }
            Some(m) if !mirror.is_ours(m) => {
                tracing::warn!(%cluster, %source, "a hub Application that is not this mirror has its name; not mirrored");
                Ok(false)
            }
            Some(_) => Ok(true),
        }
    }

    /// Writes the mirror as `wanted` by server-side apply.
    async fn apply_mirror(&self, mirror: &Mirror<'_>, wanted: &Value) -> Result<(), kube::Error> {
        let (api, name) = (&mirror.api, &mirror.key.name);
        let applied = api
            .patch(
                name,
                &PatchParams::apply(MIRROR_MANAGER).force(),
                &Patch::Apply(wanted),
            )
            .await?;
        self.writer.written().record(&applied.metadata);
        self.metrics.writes.status_writes.inc();
        // Fields someone else added to the spec are not the
        // mirror's: take them out (server-side apply keeps them).
        let have = serde_json::to_value(&applied).unwrap_or_default();
        if let Some(diff) = content::merge_diff(
            have.get("spec").unwrap_or(&Value::Null),
            wanted.get("spec").unwrap_or(&Value::Null),
        ) {
            let patch = json!({ "metadata": { "resourceVersion": applied.resource_version() }, "spec": diff });
            match api
                .patch(
                    name,
                    &PatchParams::apply(MIRROR_MANAGER),
                    &Patch::Merge(patch),
                )
                .await
            {
                Ok(m) => self.writer.written().record(&m.metadata),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The agent reported the Application gone: so is its mirror, and the
    /// hub forgets what it observed of it.
    async fn delete_mirror(&self, mirror: &Mirror<'_>) -> Result<(), kube::Error> {
        let (cluster, key, source) = (mirror.cluster, mirror.key, &mirror.source);
        mirror.cs.lock().observed.remove(key);
        if let Some(m) = mirror.current.as_ref().filter(|m| mirror.is_ours(m)) {
            let dp = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: m.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match mirror.api.delete(&key.name, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(e),
            }
            self.writer.written().forget(cluster, &key.name);
            tracing::info!(%cluster, %source, "spoke Application gone; mirror deleted");
        }
        Ok(())
    }

    /// Known from the hub only (after a restart): the spec must
    /// still be what the mirror was written with, else the agent
    /// is asked for the Application again.
    async fn recheck_mirror(&self, mirror: &Mirror<'_>) -> Result<(), kube::Error> {
        let (cs, key) = (&mirror.cs, mirror.key);
        if let Some(m) = mirror.current.as_ref().filter(|m| mirror.is_ours(m)) {
            let spec_hash = m.data.get("spec").map(content::hash).unwrap_or_default();
            if m.annotations().get(keys::SPEC_HASH) != Some(&spec_hash) {
                cs.lock().observed.remove(key);
                cs.request_resync(bucket_of(key));
            }
            self.relay.commands(m, mirror.work(), cs, key).await?;
        }
        Ok(())
    }
}

/// The mirror of one spoke Application being reconciled, and what the
/// hub's cache holds under its name.
struct Mirror<'a> {
    cluster: &'a str,
    key: &'a ObjectKey,
    cs: Arc<ClusterState>,
    /// Applications in the cluster's hub namespace.
    api: Api<Application>,
    /// The spoke Application mirrored, as `namespace/name`.
    source: String,
    /// The mirror cache's Application of the mirror's name.
    current: Option<Application>,
}

impl Mirror<'_> {
    /// Whether a hub Application of the mirror's name is this mirror:
    /// written for this spoke Application of this cluster.
    fn is_ours(&self, m: &Application) -> bool {
        m.annotations().get(keys::MIRROR_SOURCE) == Some(&self.source)
            && m.labels().get(keys::MIRROR_OF).map(String::as_str) == Some(self.cluster)
    }

    /// The work that reconciles this mirror, owner of the commands it
    /// carries.
    fn work(&self) -> Work {
        Work::Mirror {
            cluster: self.cluster.into(),
            key: self.key.clone(),
        }
    }
}

/// The mirror work of a mirror seen on the hub. Only an Application in
/// the cluster's own hub namespace is a mirror of it: anyone who may
/// create Applications elsewhere could set the label, and such an object
/// must neither count against the cluster's mirror limit nor be taken for
/// what its agent reported (it is not delivered either: see
/// `route::target`).
pub(super) fn mirror_work(m: &CachedApp) -> Option<Work> {
    let cluster = m.labels().get(keys::MIRROR_OF)?.to_string();
    if m.namespace().as_deref() != Some(cluster.as_str()) {
        return None;
    }
    let (ns, name) = m.annotations().get(keys::MIRROR_SOURCE)?.split_once('/')?;
    Some(Work::Mirror {
        cluster,
        key: ObjectKey {
            namespace: ns.into(),
            name: name.into(),
        },
    })
}

impl Mirrors {
    /// Whether the hub's mirror named `key.name` in `cluster`'s namespace
    /// mirrors an Application of another namespace on the spoke (two
    /// spoke Applications of one name cannot both be mirrored).
    pub fn taken(&self, cluster: &str, key: &ObjectKey) -> bool {
        self.caches
            .mirrors
            .get(&kube::runtime::reflector::ObjectRef::new(&key.name).within(cluster))
            .is_some_and(|m| {
                m.annotations().get(argocd_pull_apis::keys::MIRROR_SOURCE)
                    != Some(format!("{}/{}", key.namespace, key.name).as_str())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(ns: &str, of: &str) -> CachedApp {
        let app: Application = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": "guestbook", "namespace": ns,
                          "labels": { keys::MIRROR_OF: of },
                          "annotations": { keys::MIRROR_SOURCE: "argocd/guestbook" } },
            "spec": {}
        }))
        .unwrap();
        CachedApp::from(app)
    }

    #[test]
    fn only_the_clusters_own_namespace_holds_its_mirrors() {
        assert!(matches!(
            mirror_work(&labelled("cluster1", "cluster1")),
            Some(Work::Mirror { cluster, key }) if cluster == "cluster1" && key.name == "guestbook"
        ));
        // A tenant labels its own Application as a mirror of cluster1.
        assert!(mirror_work(&labelled("aaa-team", "cluster1")).is_none());
        assert!(mirror_work(&labelled("cluster2", "cluster1")).is_none());
    }
}
