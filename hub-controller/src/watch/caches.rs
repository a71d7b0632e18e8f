//! The watch-fed caches both transports read (fed by [`super::watches`]),
//! so that a steady-state reconcile makes no API call at all, and the
//! questions asked of them: which clusters a namespace's Placements select,
//! whether a cluster exists or has the addon, which Applications an event
//! concerns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use super::written::Written;

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{
    AddOnDeploymentConfig, ManagedCluster, ManagedClusterAddOn, ManifestWork, decided_clusters,
    placement_of,
};

use crate::watch::cached::CachedWork;
use kube::ResourceExt;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use prometheus_client::metrics::gauge::Gauge;

use crate::watch::cached::CachedApp;

/// Read side of the caches.
#[derive(Clone)]
pub struct Caches {
    /// Applications with the pull label.
    pub apps: Store<CachedApp>,
    /// Autonomous agents' read-only mirrors (only with the gRPC transport).
    pub mirrors: Store<CachedApp>,
    pub decisions: Store<DynamicObject>,
    pub clusters: Store<PartialObjectMeta<ManagedCluster>>,
    pub works: Store<CachedWork>,
    /// The addon's objects: which clusters enable it, and how.
    pub addon: AddonCaches,
    /// The hub's AppProjects and their credentials.
    pub projects: ProjectCaches,
    /// Works this process wrote and the cache has not shown yet (read
    /// live until it does: deciding from the older copy would lose an
    /// operation handed over a moment ago).
    pub written: Written,
    /// Which hub Applications name each spoke Application.
    pub slots: Arc<super::slots::Slots>,
    /// True once every cache has its first full list.
    pub synced: Arc<tokio::sync::watch::Sender<bool>>,
}

/// The addon's objects in the caches (only with the gRPC transport).
#[derive(Clone)]
pub struct AddonCaches {
    /// argocd-pull's ManagedClusterAddOns.
    pub addons: Store<ManagedClusterAddOn>,
    /// The AddOnDeploymentConfigs in the addon's namespace: which mode each
    /// cluster's agent runs in.
    pub configs: Store<AddOnDeploymentConfig>,
    /// The addon's default AddOnDeploymentConfig (`--addon-namespace`,
    /// `--addon-deployment-config`).
    pub default_config: Arc<super::mode::ConfigRef>,
}

/// The hub's AppProjects in the caches (only when projects are enforced:
/// [`super::watches::Scope::projects`]).
#[derive(Clone)]
pub struct ProjectCaches {
    /// The AppProjects in the hub's Argo CD namespace.
    pub objects: Store<DynamicObject>,
    /// That namespace.
    pub namespace: Arc<Option<String>>,
    /// The `repository` and `repo-creds` Secrets there (only with
    /// `--project-credentials`).
    pub credentials: Store<k8s_openapi::api::core::v1::Secret>,
}

impl Caches {
    /// Waits until every cache has its first full list: deciding from a
    /// half-listed cache would, say, take an existing work for a missing one.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|synced| *synced).await;
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// AppProject `name`, if it exists.
    pub fn project_object(&self, name: &str) -> Option<Arc<DynamicObject>> {
        let ns = self.projects.namespace.as_deref()?;
        self.projects.objects.get(
            &ObjectRef::new_with(name, argocd_pull_apis::argocd::appproject_resource()).within(ns),
        )
    }

    /// The spec of AppProject `name`, if it exists.
    pub fn project(&self, name: &str) -> Option<argocd_pull_apis::argocd::ProjectSpec> {
        self.project_object(name)
            .map(|p| argocd_pull_apis::argocd::ProjectSpec::of(&p))
    }

    pub fn cluster_exists(&self, name: &str) -> bool {
        self.clusters.get(&ObjectRef::new(name)).is_some()
    }

    /// Whether the addon of `cluster` is enabled (its ManagedClusterAddOn exists).
    pub fn addon_enabled(&self, cluster: &str) -> bool {
        self.addon
            .addons
            .get(&ObjectRef::new(keys::ADDON_NAME).within(cluster))
            .is_some()
    }

    /// The mode the addon configuration gives the agent of `cluster`
    /// (see [`super::mode`]); `None` when the addon is not enabled there.
    pub fn configured_mode(
        &self,
        cluster: &str,
    ) -> Option<Result<super::mode::Configured, String>> {
        let addon = self
            .addon
            .addons
            .get(&ObjectRef::new(keys::ADDON_NAME).within(cluster))?;
        let default = &self.addon.default_config;
        let reference = super::mode::config_ref(&addon, default);
        if reference.namespace != default.namespace {
            return Some(Err(format!(
                "the addon of cluster {cluster} is configured by {reference}; the hub-controller reads AddOnDeploymentConfigs only in namespace {}: move it there",
                default.namespace
            )));
        }
        let config = self
            .addon
            .configs
            .get(&ObjectRef::new(&reference.name).within(&reference.namespace));
        Some(super::mode::configured(&reference, config.as_deref()))
    }

    /// Clusters selected by the PlacementDecisions of Placements in
    /// namespace `ns` (a decision no Placement controls is ignored: anyone
    /// allowed to write PlacementDecisions could forge one).
    pub fn decided_in(&self, ns: &str) -> Vec<String> {
        self.decisions
            .state_filter(|pd| pd.namespace().as_deref() == Some(ns) && placement_of(pd).is_some())
            .iter()
            .flat_map(|pd| decided_clusters(pd))
            .collect()
    }

    /// Whether no work `name` is in `cluster`, as far as the cache knows
    /// and nothing this process wrote says otherwise.
    pub fn no_work(&self, cluster: &str, name: &str) -> bool {
        matches!(self.cached_work(cluster, name), Some(None))
    }

    /// The cached work, unless this process has written a newer one that
    /// the cache does not show yet; `None` in the answer means "read it from
    /// the API server".
    pub fn work(&self, cluster: &str, name: &str) -> Lookup {
        match self.cached_work(cluster, name) {
            None => Lookup::Stale,
            Some(cached) => Lookup::Known(cached.map(|w| Box::new(w.work()))),
        }
    }

    /// The cached work, still unparsed (its metadata is at hand without
    /// parsing the rest); `None` when this process wrote a newer one than
    /// the cache shows.
    pub fn cached_work(&self, cluster: &str, name: &str) -> Option<Option<Arc<CachedWork>>> {
        let cached = self.works.get(&ObjectRef::new(name).within(cluster));
        let cached_rv = cached.as_ref().and_then(|w| w.resource_version());
        let key = (cluster.to_string(), name.to_string());
        (!self.written.behind_key(&key, cached_rv.as_deref())).then_some(cached)
    }
}

impl crate::route::decide::World for Caches {
    fn addon_enabled(&self, cluster: &str) -> bool {
        Caches::addon_enabled(self, cluster)
    }
    fn cluster_exists(&self, cluster: &str) -> bool {
        Caches::cluster_exists(self, cluster)
    }
    fn decided_in(&self, ns: &str) -> Vec<String> {
        Caches::decided_in(self, ns)
    }
    fn project(&self, name: &str) -> Option<argocd_pull_apis::argocd::ProjectSpec> {
        Caches::project(self, name)
    }
    fn project_version(&self, name: &str) -> Option<crate::authorized::ProjectVersion> {
        self.project_object(name)
            .map(|p| crate::authorized::ProjectVersion {
                resource_version: p.metadata.resource_version.clone().unwrap_or_default(),
                generation: p.metadata.generation.unwrap_or_default(),
            })
    }
}

pub enum Lookup {
    /// What the cache holds is at least as new as anything written here.
    Known(Option<Box<ManifestWork>>),
    /// The cache lags behind a write of this process.
    Stale,
}

/// The hub Application a work delivers, from its back-pointer annotations.
pub fn work_owner(work: &impl kube::Resource) -> Option<ObjectRef<CachedApp>> {
    let a = work.annotations();
    match (a.get(keys::HUB_APP_NAMESPACE), a.get(keys::HUB_APP_NAME)) {
        (Some(ns), Some(name)) => Some(ObjectRef::new(name).within(ns)),
        _ => None,
    }
}

/// Whether `app` names `cluster` as its target.
pub fn targets(app: &CachedApp, cluster: &str) -> bool {
    app.annotations().get(keys::MANAGED_CLUSTER) == Some(cluster)
}

/// Applications in `apps` that target `cluster`.
pub fn apps_targeting(apps: &Store<CachedApp>, cluster: &str) -> Vec<ObjectRef<CachedApp>> {
    apps.state_filter(|a| targets(a, cluster))
        .iter()
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

/// Applications in `apps` that use AppProject `project`.
pub fn apps_of_project(apps: &Store<CachedApp>, project: &str) -> Vec<ObjectRef<CachedApp>> {
    apps.state_filter(|a| uses_project(a, project))
        .iter()
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

/// Whether `app` uses AppProject `project`.
pub fn uses_project(app: &CachedApp, project: &str) -> bool {
    app.project() == project
}

/// Applications in `apps` that live in namespace `ns`.
pub fn apps_in(apps: &Store<CachedApp>, ns: &str) -> Vec<ObjectRef<CachedApp>> {
    apps.state_filter(|a| a.namespace().as_deref() == Some(ns))
        .iter()
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

/// The reconcile queue's depth: Applications that something triggered and
/// whose reconcile has not started yet, with what triggered each (the last
/// trigger, when several came before the reconcile started). kube-runtime
/// keeps its queue private, so the triggers are recorded on their way in;
/// requeues and error retries are recorded when they are scheduled.
#[derive(Clone)]
pub struct Queue {
    pending: Arc<Mutex<HashMap<ObjectRef<CachedApp>, &'static str>>>,
    gauge: Gauge,
    /// Reconciles started and not finished yet.
    running: Arc<std::sync::atomic::AtomicUsize>,
}

impl Queue {
    pub fn new(gauge: Gauge) -> Self {
        Self {
            pending: Arc::default(),
            gauge,
            running: Arc::default(),
        }
    }

    pub fn triggered(&self, key: ObjectRef<CachedApp>, trigger: &'static str) {
        let mut p = self.pending.lock().expect("lock");
        p.insert(key, trigger);
        self.gauge.set(p.len() as i64);
    }

    /// The reconcile of `key` starts; returns what triggered it.
    pub fn started(&self, key: &ObjectRef<CachedApp>) -> &'static str {
        let mut p = self.pending.lock().expect("lock");
        let trigger = p.remove(key);
        self.gauge.set(p.len() as i64);
        self.running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // Nothing recorded: a timer the reconcile itself asked for.
        trigger.unwrap_or("requeue")
    }

    /// A reconcile [`Queue::started`] has finished.
    pub fn finished(&self) {
        self.running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Reconciles running now.
    pub fn running(&self) -> usize {
        self.running.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Drops entries whose Application is gone: kube-runtime never
    /// reconciles those, so they would otherwise count forever.
    pub fn prune(&self, apps: &Store<CachedApp>) {
        let mut p = self.pending.lock().expect("lock");
        p.retain(|k, _| apps.get(k).is_some());
        self.gauge.set(p.len() as i64);
    }

    pub fn depth(&self) -> usize {
        self.pending.lock().expect("lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_pull_apis::argocd::Application;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn application(ns: &str, name: &str, cluster: &str) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": name, "namespace": ns,
                          "annotations": { keys::MANAGED_CLUSTER: cluster } },
            "spec": {}
        }))
        .unwrap()
    }

    fn app_store(apps: &[Application]) -> Store<CachedApp> {
        let mut writer = store::Writer::default();
        let reader = writer.as_reader();
        for a in apps {
            writer.apply_watcher_event(&Event::Apply(CachedApp::from(a.clone())));
        }
        reader
    }

    fn work(rv: &str) -> ManifestWork {
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": { "name": "ns.app", "namespace": "c1", "resourceVersion": rv,
                "annotations": { keys::HUB_APP_NAMESPACE: "ns", keys::HUB_APP_NAME: "app" } },
            "spec": {}
        }))
        .unwrap()
    }

    #[test]
    fn triggers_map_to_the_applications_concerned() {
        let apps = app_store(&[
            application("a", "one", "c1"),
            application("a", "two", "c2"),
            application("b", "three", "c1"),
        ]);
        let mut names: Vec<String> = apps_targeting(&apps, "c1")
            .into_iter()
            .map(|r| r.name)
            .collect();
        names.sort();
        assert_eq!(names, ["one", "three"]);
        assert_eq!(apps_in(&apps, "a").len(), 2);
        assert!(apps_targeting(&apps, "c9").is_empty());
        let owner = work_owner(&work("1")).unwrap();
        assert_eq!(
            (owner.namespace.as_deref(), owner.name.as_str()),
            (Some("ns"), "app")
        );
    }

    #[test]
    fn a_work_written_here_is_read_live_until_the_cache_shows_it() {
        let (reader, mut writer) = store::store::<CachedWork>();
        let caches = Caches {
            works: reader,
            ..crate::watch::watches::Watches::new(Default::default()).caches()
        };
        writer.apply_watcher_event(&Event::Apply(CachedWork::from(work("1"))));
        assert!(matches!(
            caches.work("c1", "ns.app"),
            Lookup::Known(Some(_))
        ));
        caches.written.record(&work("2").metadata);
        assert!(matches!(caches.work("c1", "ns.app"), Lookup::Stale));
        writer.apply_watcher_event(&Event::Apply(CachedWork::from(work("2"))));
        assert!(
            matches!(caches.work("c1", "ns.app"), Lookup::Known(Some(w)) if w.resource_version().as_deref() == Some("2"))
        );
        // Caught up: the record is gone, later cache versions are trusted.
        writer.apply_watcher_event(&Event::Apply(CachedWork::from(work("3"))));
        assert!(
            matches!(caches.work("c1", "ns.app"), Lookup::Known(Some(w)) if w.resource_version().as_deref() == Some("3"))
        );
        // A cache that jumps past the written version has caught up too
        // (the work agent wrote status right after us).
        caches.written.record(&work("5").metadata);
        assert!(matches!(caches.work("c1", "ns.app"), Lookup::Stale));
        writer.apply_watcher_event(&Event::Apply(CachedWork::from(work("6"))));
        assert!(matches!(
            caches.work("c1", "ns.app"),
            Lookup::Known(Some(_))
        ));
    }

    #[test]
    fn queue_depth_counts_each_application_once_until_it_starts() {
        let gauge = Gauge::default();
        let q = Queue::new(gauge.clone());
        let apps = app_store(&[application("a", "one", "c1")]);
        let one = apps_in(&apps, "a").remove(0);
        let gone = ObjectRef::new("gone").within("a");
        q.triggered(one.clone(), "application");
        q.triggered(one.clone(), "work");
        q.triggered(gone, "application");
        assert_eq!((q.depth(), gauge.get()), (2, 2));
        q.prune(&apps);
        assert_eq!((q.depth(), gauge.get()), (1, 1));
        assert_eq!(q.started(&one), "work", "the last trigger counts");
        assert_eq!((q.depth(), gauge.get()), (0, 0));
        assert_eq!(q.started(&one), "requeue");
    }
}
