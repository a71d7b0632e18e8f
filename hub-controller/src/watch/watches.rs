//! The hub-controller's one set of watches: pull-model Applications,
//! autonomous mirrors, PlacementDecisions, ManagedClusters (metadata only),
//! argocd-pull's ManagedClusterAddOns, the AddOnDeploymentConfigs in the
//! addon's namespace, argocd-pull's ManifestWorks and the AppProjects in
//! the hub's Argo CD namespace. Each
//! is watched once, kept in one cache ([`Caches`]) and its events go, in
//! the order they came, to every transport ([`Consumer`]): the ManifestWork
//! controller turns them into reconciles, the gRPC transport into its index
//! and the desired sets of the clusters.
//!
//! A transport never starts a watch of its own, so a second transport costs
//! no second copy of the hub's Applications (the largest cache by far).

use std::sync::Arc;

use argocd_pull_apis::argocd::appproject_resource;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{
    AddOnDeploymentConfig, ManagedCluster, ManagedClusterAddOn, placement_decision_resource,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{WatchStreamExt, watcher};

use super::cached::{CachedApp, CachedWork};
use super::caches::{AddonCaches, Caches, ProjectCaches};
use super::mode::ConfigRef;
use crate::render::work::{MANAGED_BY, MANAGED_BY_LABEL};

/// One event of one watch, after its cache has applied it.
#[derive(Debug)]
pub enum Event {
    App(watcher::Event<CachedApp>),
    Mirror(watcher::Event<CachedApp>),
    Decision(watcher::Event<DynamicObject>),
    Cluster(watcher::Event<PartialObjectMeta<ManagedCluster>>),
    Addon(watcher::Event<ManagedClusterAddOn>),
    Work(watcher::Event<CachedWork>),
    Config(watcher::Event<AddOnDeploymentConfig>),
    /// An AppProject; an update that leaves its spec as it was is not
    /// passed on (nothing a decision reads changed).
    Project(watcher::Event<DynamicObject>),
    /// A `repository` or `repo-creds` Secret in the Argo CD namespace.
    Credential(watcher::Event<Secret>),
}

impl Event {
    /// Which watch it came from (an index into the listed flags).
    fn source(&self) -> usize {
        match self {
            Event::App(_) => 0,
            Event::Mirror(_) => 1,
            Event::Decision(_) => 2,
            Event::Cluster(_) => 3,
            Event::Addon(_) => 4,
            Event::Work(_) => 5,
            Event::Config(_) => 6,
            Event::Project(_) => 7,
            Event::Credential(_) => 8,
        }
    }

    /// The name of its watch, for the logs.
    fn watch_name(&self) -> &'static str {
        WATCH_NAMES[self.source()]
    }

    /// Where it stands in its watch's full list, if in one.
    fn list_step(&self) -> Option<ListStep> {
        fn step<K>(e: &watcher::Event<K>) -> Option<ListStep> {
            match e {
                watcher::Event::InitApply(_) => Some(ListStep::Object),
                watcher::Event::InitDone => Some(ListStep::Done),
                _ => None,
            }
        }
        match self {
            Event::App(e) | Event::Mirror(e) => step(e),
            Event::Decision(e) | Event::Project(e) => step(e),
            Event::Cluster(e) => step(e),
            Event::Addon(e) => step(e),
            Event::Work(e) => step(e),
            Event::Config(e) => step(e),
            Event::Credential(e) => step(e),
        }
    }
}

/// The watches' names, by [`Event::source`].
const WATCH_NAMES: [&str; 9] = [
    "applications",
    "mirrors",
    "placementdecisions",
    "managedclusters",
    "managedclusteraddons",
    "manifestworks",
    "addondeploymentconfigs",
    "appprojects",
    "repository-credentials",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum ListStep {
    /// One object of a full list.
    Object,
    /// The end of a full list.
    Done,
}

/// A transport fed by the watches. Called on the watches' task, one event
/// at a time: keep it short (queue work, never wait on the API server).
pub trait Consumer: Send + Sync {
    /// One event; the caches already show it.
    fn event(&self, event: &Event);
    /// Every watch has had its first full list (called once, before the
    /// caches report synced).
    fn synced(&self);
}

/// What to watch beyond what every hub needs.
#[derive(Clone, Debug)]
pub struct Scope {
    /// The gRPC transport is served: watch the addons (which clusters it
    /// delivers to, and in which mode: their AddOnDeploymentConfigs) and
    /// the autonomous mirrors too.
    pub grpc: bool,
    /// The addon's default AddOnDeploymentConfig; per-cluster configs are
    /// read only in its namespace.
    pub default_config: ConfigRef,
    /// AppProjects are enforced: watch them in this namespace (the hub's
    /// Argo CD's).
    pub projects: Option<String>,
    /// Deliver the project-scoped repository credentials with the projects:
    /// watch the `repository` and `repo-creds` Secrets of that namespace.
    pub credentials: bool,
}

impl Default for Scope {
    fn default() -> Self {
        Self {
            grpc: false,
            default_config: ConfigRef {
                namespace: argocd_pull_addon::HUB_NAMESPACE.into(),
                name: argocd_pull_addon::DEPLOYMENT_CONFIG.into(),
            },
            projects: Some(crate::route::authz::DEFAULT_ARGOCD_NAMESPACE.into()),
            credentials: false,
        }
    }
}

/// The write sides of the caches, until [`Watches::run`] takes them.
pub struct Watches {
    scope: Scope,
    apps: reflector::store::Writer<CachedApp>,
    mirrors: reflector::store::Writer<CachedApp>,
    decisions: reflector::store::Writer<DynamicObject>,
    clusters: reflector::store::Writer<PartialObjectMeta<ManagedCluster>>,
    addons: reflector::store::Writer<ManagedClusterAddOn>,
    works: reflector::store::Writer<CachedWork>,
    configs: reflector::store::Writer<AddOnDeploymentConfig>,
    projects: reflector::store::Writer<DynamicObject>,
    credentials: reflector::store::Writer<Secret>,
    caches: Caches,
}

impl Watches {
    pub fn new(scope: Scope) -> Self {
        let apps = reflector::store::Writer::default();
        let mirrors = reflector::store::Writer::default();
        let decisions = reflector::store::Writer::new(placement_decision_resource());
        let clusters = reflector::store::Writer::default();
        let addons = reflector::store::Writer::default();
        let works = reflector::store::Writer::default();
        let configs = reflector::store::Writer::default();
        let projects = reflector::store::Writer::new(appproject_resource());
        let credentials = reflector::store::Writer::default();
        let caches = Caches {
            apps: apps.as_reader(),
            mirrors: mirrors.as_reader(),
            decisions: decisions.as_reader(),
            clusters: clusters.as_reader(),
            works: works.as_reader(),
            addon: AddonCaches {
                addons: addons.as_reader(),
                configs: configs.as_reader(),
                default_config: Arc::new(scope.default_config.clone()),
            },
            projects: ProjectCaches {
                objects: projects.as_reader(),
                namespace: Arc::new(scope.projects.clone()),
                credentials: credentials.as_reader(),
            },
            written: Default::default(),
            slots: Default::default(),
            synced: Default::default(),
        };
        Self {
            scope,
            apps,
            mirrors,
            decisions,
            clusters,
            addons,
            works,
            configs,
            projects,
            credentials,
            caches,
        }
    }

    /// The read side, for the transports.
    pub fn caches(&self) -> Caches {
        self.caches.clone()
    }

    /// Watches the hub until `shutdown`, feeding every consumer.
    pub async fn run(
        self,
        client: Client,
        consumers: Vec<Arc<dyn Consumer>>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let (streams, caches) = self.streams(&client);
        // What each AppProject's spec was when last passed on.
        let mut project_specs: std::collections::HashMap<String, serde_json::Value> =
            Default::default();
        let mut lists = FirstLists::new(streams.len());
        let events = futures::stream::select_all(streams).take_until(shutdown);
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Err(e) => tracing::warn!(error = %e, "watch of the hub failed; retrying"),
                Ok(event) => {
                    if let Event::Project(e) = &event
                        && !project_spec_changed(&mut project_specs, e)
                    {
                        continue;
                    }
                    if let Event::App(e) = &event {
                        caches.slots.observe(e);
                    }
                    for c in &consumers {
                        c.event(&event);
                    }
                    if lists.count(&event) {
                        for c in &consumers {
                            c.synced();
                        }
                        tracing::info!(after = ?lists.started.elapsed(), "hub caches synced");
                        caches.synced.send_replace(true);
                    }
                }
            }
        }
    }

    /// Every watch the scope asks for, each through its cache, and the
    /// caches' read side.
    fn streams(self, client: &Client) -> (Vec<WatchStream>, Caches) {
        let pdr = placement_decision_resource();
        let mut streams: Vec<WatchStream> = vec![
            watch(
                self.apps,
                Api::<CachedApp>::all(client.clone()),
                watcher::Config::default().labels(keys::PULL_LABEL),
                Event::App,
            ),
            watch(
                self.decisions,
                Api::<DynamicObject>::all_with(client.clone(), &pdr),
                watcher::Config::default(),
                Event::Decision,
            ),
            watch(
                self.clusters,
                Api::<PartialObjectMeta<ManagedCluster>>::all(client.clone()),
                watcher::Config::default(),
                Event::Cluster,
            ),
            watch(
                self.works,
                Api::<CachedWork>::all(client.clone()),
                watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")),
                Event::Work,
            ),
        ];
        if self.scope.grpc {
            streams.extend(grpc_streams(
                self.mirrors,
                self.addons,
                self.configs,
                &self.scope.default_config.namespace,
                client,
            ));
        }
        if let Some(ns) = &self.scope.projects {
            // Only the Argo CD namespace: Argo CD reads projects nowhere else.
            streams.push(watch(
                self.projects,
                Api::<DynamicObject>::namespaced_with(client.clone(), ns, &appproject_resource()),
                watcher::Config::default(),
                Event::Project,
            ));
        }
        if let (Some(ns), true) = (&self.scope.projects, self.scope.credentials) {
            // Only the credential types, and only there (docs/security.md).
            streams.push(watch(
                self.credentials,
                Api::<Secret>::namespaced(client.clone(), ns),
                watcher::Config::default().labels(&format!(
                    "{} in (repository,repo-creds)",
                    keys::ARGOCD_SECRET_TYPE
                )),
                Event::Credential,
            ));
        }
        (streams, self.caches)
    }
}

/// One watch's events, through its cache.
type WatchStream = BoxStream<'static, Result<Event, watcher::Error>>;

/// The watches only the gRPC transport needs: the autonomous mirrors, the
/// addons, and the AddOnDeploymentConfigs of the addon's namespace
/// (`config_namespace`).
fn grpc_streams(
    mirrors: reflector::store::Writer<CachedApp>,
    addons: reflector::store::Writer<ManagedClusterAddOn>,
    configs: reflector::store::Writer<AddOnDeploymentConfig>,
    config_namespace: &str,
    client: &Client,
) -> [WatchStream; 3] {
    [
        watch(
            mirrors,
            Api::<CachedApp>::all(client.clone()),
            watcher::Config::default().labels(keys::MIRROR_OF),
            Event::Mirror,
        ),
        watch(
            addons,
            Api::<ManagedClusterAddOn>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={}", keys::ADDON_NAME)),
            Event::Addon,
        ),
        // Only the addon's namespace: the hub-controller may read
        // configs nowhere else (docs/security.md).
        watch(
            configs,
            Api::<AddOnDeploymentConfig>::namespaced(client.clone(), config_namespace),
            watcher::Config::default(),
            Event::Config,
        ),
    ]
}

/// How far the watches are through their first full lists, which tell
/// when the caches are synced and how long a start took.
struct FirstLists {
    /// Each watch's first full list counts once.
    listed: [bool; WATCH_NAMES.len()],
    /// Objects in each watch's first full list.
    objects: [usize; WATCH_NAMES.len()],
    started: std::time::Instant,
    /// Watches whose first full list has not ended yet.
    unlisted: usize,
}

impl FirstLists {
    fn new(watches: usize) -> Self {
        Self {
            listed: [false; WATCH_NAMES.len()],
            objects: [0; WATCH_NAMES.len()],
            started: std::time::Instant::now(),
            unlisted: watches,
        }
    }

    /// Counts an event of a first list; true when it ends the last of the
    /// first lists (the caches are synced).
    fn count(&mut self, event: &Event) -> bool {
        let (source, step) = (event.source(), event.list_step());
        if !self.listed[source] && step == Some(ListStep::Object) {
            self.objects[source] += 1;
        }
        if step == Some(ListStep::Done) && !std::mem::replace(&mut self.listed[source], true) {
            // How long a start takes, and on what (docs/operations.md).
            tracing::info!(
                watch = event.watch_name(),
                objects = self.objects[source],
                after = ?self.started.elapsed(),
                "first list of the hub done"
            );
            self.unlisted -= 1;
            return self.unlisted == 0;
        }
        false
    }
}

/// Records the spec an AppProject event shows; whether it differs from
/// the one last recorded (a status or metadata change does not).
fn project_spec_changed(
    seen: &mut std::collections::HashMap<String, serde_json::Value>,
    e: &watcher::Event<DynamicObject>,
) -> bool {
    use kube::ResourceExt;
    match e {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
            let spec = p.data.get("spec").cloned().unwrap_or_default();
            seen.insert(p.name_any(), spec.clone()) != Some(spec)
        }
        watcher::Event::Delete(p) => {
            seen.remove(&p.name_any());
            true
        }
        // A relist: what was recorded may be gone (deleted while the
        // watch was down), so every project it lists counts as changed.
        watcher::Event::Init => {
            seen.clear();
            true
        }
        watcher::Event::InitDone => true,
    }
}

/// One watch through its cache, its events wrapped by `wrap`. The caches
/// never read managedFields, often the largest part of an object.
fn watch<K>(
    writer: reflector::store::Writer<K>,
    api: Api<K>,
    config: watcher::Config,
    wrap: fn(watcher::Event<K>) -> Event,
) -> BoxStream<'static, Result<Event, watcher::Error>>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
{
    reflector(
        writer,
        watcher::watcher(api, config)
            .default_backoff()
            .modify(|o: &mut K| o.meta_mut().managed_fields = None),
    )
    .map(move |e| e.map(wrap))
    .boxed()
}
