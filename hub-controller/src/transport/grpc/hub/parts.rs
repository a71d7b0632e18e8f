//! How a [`Hub`] is built: from [`HubParts`], known before it starts, so
//! nothing is wired into it afterwards; and what it offers the tree
//! writer ([`GrpcView`]).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};

use argocd_pull_proto::v1::ObjectKey;
use argocd_pull_runtime::workqueue::WorkQueue;
use tokio::sync::watch;

use super::super::claims::Claims;
use super::super::cluster::Work;
use super::super::config::GrpcConfig;
use super::super::holders::Holders;
use super::super::metrics::GrpcMetrics;
use super::{
    Acting, Clusters, CommandRelay, Granted, Holding, Hub, Mirrors, Offers, Routes, Switches,
    Workers, Writing,
};
use crate::authorized::Records;
use crate::route::HubRef;
use crate::status::AppWriter;
use crate::status::trees::{GrpcView, Trees};
use crate::watch::caches::Caches;

/// Builds the tree writer once the transport it asks exists.
pub type MakeTrees = Box<dyn FnOnce(Weak<dyn GrpcView>) -> Arc<Trees> + Send>;

/// What a [`Hub`] is built from: everything it works with is known before
/// it starts, so nothing is wired into it afterwards.
pub struct HubParts {
    pub config: GrpcConfig,
    pub client: kube::Client,
    pub metrics: GrpcMetrics,
    /// The hub's one set of caches; they must be fed by
    /// [`crate::watch::watches`] with [`Scope::grpc`](crate::watch::watches::Scope)
    /// and this hub among the consumers.
    pub caches: Caches,
    /// With several replicas: who writes for a cluster.
    pub claims: Option<Arc<Claims>>,
    /// The record of what each agent holds (decides keys with it).
    pub holders: Option<Arc<Holders>>,
    /// The record of what the hub authorized; its changes make the
    /// sessions send their project sets again.
    pub authorized: Option<Arc<Records>>,
    /// Builds the writer of the trees agents report (capability
    /// `trees`), given what it asks of this transport.
    pub trees: Option<MakeTrees>,
    /// The live endpoint's URL when it serves argocd-server: agents are
    /// offered `live-views`.
    pub live_url: Option<String>,
    /// Told of each Application that moves to or from this transport, for
    /// the ManifestWork side to look at again.
    pub switches: Option<Switches>,
}

impl HubParts {
    /// The parts of a transport with one replica, no record of holders or
    /// grants, no trees and no live endpoint.
    pub fn new(
        config: GrpcConfig,
        client: kube::Client,
        metrics: GrpcMetrics,
        caches: Caches,
    ) -> Self {
        Self {
            config,
            client,
            metrics,
            caches,
            claims: None,
            holders: None,
            authorized: None,
            trees: None,
            live_url: None,
            switches: None,
        }
    }
}

impl Hub {
    /// The transport of `parts`.
    pub fn new(parts: HubParts) -> Arc<Self> {
        let HubParts {
            config,
            client,
            metrics,
            caches,
            claims,
            holders,
            authorized,
            trees,
            live_url,
            switches,
        } = parts;
        let queue = WorkQueue::new();
        let writer = AppWriter::new(client.clone());
        let clusters = Arc::new(Clusters::new(metrics.writes.delivery.clone()));
        let routes = Arc::new(Routes::new(
            caches.clone(),
            config.authorization.clone(),
            clusters.clone(),
            queue.clone(),
            switches,
        ));
        let shared = Shared {
            client: &client,
            metrics: &metrics,
            caches: &caches,
            writer: &writer,
            queue: &queue,
            clusters: &clusters,
            routes: &routes,
        };
        let writing = shared.writers(claims, holders, authorized.clone());
        Arc::new_cyclic(|me: &Weak<Hub>| {
            if let Some(records) = &authorized {
                let me = me.clone();
                records.on_change(move |_, _, _| {
                    if let Some(hub) = me.upgrade() {
                        hub.project_or_credential_changed();
                    }
                });
            }
            let trees = trees.map(|make| make(me.clone()));
            Self {
                me: me.clone(),
                writer,
                caches,
                config,
                client,
                metrics,
                next_session: AtomicU64::new(1),
                routes,
                clusters,
                writing,
                offers: Offers {
                    projects_epoch: watch::channel(0).0,
                    trees,
                    live_url: live_url.map(|u| u.trim_end_matches('/').to_string()),
                },
            }
        })
    }
}

/// What the parts that write are built from.
struct Shared<'a> {
    client: &'a kube::Client,
    metrics: &'a GrpcMetrics,
    caches: &'a Caches,
    writer: &'a Arc<AppWriter>,
    queue: &'a WorkQueue<Work>,
    clusters: &'a Arc<Clusters>,
    routes: &'a Arc<Routes>,
}

impl Shared<'_> {
    /// The workers and what they consult: which clusters this replica
    /// acts for, the holders record kept, and the grants.
    fn writers(
        &self,
        claims: Option<Arc<Claims>>,
        holders: Option<Arc<Holders>>,
        authorized: Option<Arc<Records>>,
    ) -> Writing {
        let relay = Arc::new(CommandRelay::new(self.writer.clone()));
        let mirrors = Arc::new(Mirrors {
            client: self.client.clone(),
            caches: self.caches.clone(),
            writer: self.writer.clone(),
            metrics: self.metrics.clone(),
            clusters: self.clusters.clone(),
            relay: relay.clone(),
        });
        let acting = Arc::new(Acting::new(
            self.clusters.clone(),
            self.routes.clone(),
            mirrors.clone(),
            self.queue.clone(),
            claims,
        ));
        let holding = Arc::new(Holding::new(
            self.routes.clone(),
            self.clusters.clone(),
            self.caches.clone(),
            acting.clone(),
            holders,
        ));
        let granted = Arc::new(Granted::new(
            self.routes.clone(),
            self.clusters.clone(),
            authorized,
        ));
        let workers = Arc::new(Workers {
            granted: granted.clone(),
            routes: self.routes.clone(),
            clusters: self.clusters.clone(),
            caches: self.caches.clone(),
            writer: self.writer.clone(),
            metrics: self.metrics.clone(),
            queue: self.queue.clone(),
            acting: acting.clone(),
            relay,
            mirrors,
        });
        Writing {
            queue: self.queue.clone(),
            workers,
            acting,
            holding,
            granted,
        }
    }
}

/// What the tree writer asks of the transport.
impl GrpcView for Hub {
    fn grpc_cluster(&self, r: &HubRef) -> Option<String> {
        Hub::grpc_cluster(self, r)
    }

    fn acts_for(&self, cluster: &str) -> bool {
        Hub::acts_for(self, cluster)
    }

    fn granted_to(&self, cluster: &str, key: &ObjectKey, hub_uid: Option<&str>) -> bool {
        Hub::granted_to(self, cluster, key, hub_uid)
    }

    fn live_url(&self) -> Option<&str> {
        Hub::live_url(self)
    }
}
