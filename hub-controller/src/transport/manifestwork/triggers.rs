//! What the hub's watch events mean to the ManifestWork controller: the
//! Applications to reconcile. An Application changing reconciles itself;
//! the work agent writing feedback on a work, or deleting it, reconciles
//! the work's Application (the echo of our own write of the work does
//! not); a cluster joining (a new generation of its
//! ManagedCluster) reconciles the Applications that wait for it; a
//! Placement changing its decisions re-checks its namespace's Applications;
//! an AppProject changing re-checks the Applications that use it.

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event as E;

use super::Context;
use crate::route::HubRef;
use crate::watch::cached::CachedApp;
use crate::watch::caches;
use crate::watch::watches::{Consumer, Event};

impl Consumer for Context {
    fn event(&self, event: &Event) {
        self.tell_project_works(event);
        self.trigger_reconciles(event);
    }

    fn synced(&self) {}
}

impl Context {
    /// Tells the AppProject works what `event` may have changed.
    fn tell_project_works(&self, event: &Event) {
        // The AppProject works: an Application changing may change its own
        // cluster's projects; anything else that decides routes, any.
        match event {
            Event::App(E::Apply(_) | E::InitApply(_) | E::Delete(_)) => self.projects.app_changed(),
            Event::Work(E::Apply(w) | E::Delete(w))
                if w.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(crate::render::project::PROJECT_LABEL))
                    && !self.caches.written.is_echo(&w.metadata) =>
            {
                self.projects.app_changed()
            }
            Event::Project(_) | Event::Credential(_) | Event::Decision(_) | Event::Addon(_) => {
                self.projects.everything_changed()
            }
            Event::Cluster(E::Delete(_) | E::InitDone) => self.projects.everything_changed(),
            _ => {}
        }
    }

    /// Triggers the reconciles of the Applications `event` concerns.
    fn trigger_reconciles(&self, event: &Event) {
        match event {
            Event::App(E::Apply(a) | E::InitApply(a) | E::Delete(a)) => {
                if !matches!(event, Event::App(E::Delete(_))) {
                    self.trigger(ObjectRef::from_obj(a), "application");
                }
                // The other hub Applications that name its spoke
                // Application (before or after): their owner may have
                // changed.
                for r in self.caches.slots.touched() {
                    self.trigger(ObjectRef::new(&r.name).within(&r.namespace), "spoke-owner");
                }
            }
            // The echo of our own write of the work: the reconcile that wrote
            // it went on from the write's response.
            Event::Work(E::Apply(w)) if self.caches.written.is_echo(&w.metadata) => {}
            Event::Work(E::Apply(w) | E::InitApply(w) | E::Delete(w)) => {
                if let Some(owner) = caches::work_owner(w)
                    && self.caches.apps.get(&owner).is_some()
                {
                    self.trigger(owner, "work");
                }
            }
            Event::Cluster(E::Apply(mc) | E::InitApply(mc)) => {
                let generation = mc.metadata.generation;
                let seen = self
                    .cluster_generations
                    .lock()
                    .expect("lock")
                    .insert(mc.name_any(), generation);
                if seen != Some(generation) || generation.is_none() {
                    for r in caches::apps_targeting(&self.caches.apps, &mc.name_any()) {
                        self.trigger(r, "cluster");
                    }
                }
            }
            Event::Cluster(E::Delete(mc)) => {
                self.cluster_generations
                    .lock()
                    .expect("lock")
                    .remove(&mc.name_any());
            }
            // A project changed (its spec: see `Event::Project`): its
            // Applications are decided again. Before the caches are synced
            // every Application is reconciled anyway.
            Event::Project(E::Apply(p) | E::InitApply(p) | E::Delete(p))
                if self.caches.is_synced() =>
            {
                for r in caches::apps_of_project(&self.caches.apps, &p.name_any()) {
                    self.trigger(r, "project");
                }
            }
            // Listed again after the watch was down: a project deleted
            // meanwhile shows no event of its own.
            Event::Project(E::InitDone) if self.caches.is_synced() => {
                for app in self.caches.apps.state() {
                    self.trigger(ObjectRef::from_obj(app.as_ref()), "project");
                }
            }
            Event::Decision(E::Apply(pd) | E::InitApply(pd) | E::Delete(pd)) => {
                for r in caches::apps_in(&self.caches.apps, &pd.namespace().unwrap_or_default()) {
                    self.trigger(r, "placement");
                }
            }
            _ => {}
        }
    }

    /// Whether `app` is the gRPC transport's with no work of ours left to
    /// hand over: nothing for this side to do. At 100,000 Applications on
    /// the gRPC transport every start reconciled each of them here (parsed,
    /// routed, found no work), and every status write came back here too.
    pub(crate) fn held_by_grpc(&self, r: &HubRef) -> bool {
        let Some(hub) = &self.grpc else {
            return false;
        };
        hub.grpc_cluster(r).is_some_and(|cluster| {
            self.caches.no_work(
                &cluster,
                &crate::render::work::work_name(&r.namespace, &r.name),
            )
        })
    }

    /// Records why the reconcile of `app` that its requeue brings comes.
    pub(crate) fn trigger_later(
        &self,
        app: &argocd_pull_apis::argocd::Application,
        why: &'static str,
    ) {
        let r = ObjectRef::new(&app.name_any()).within(&app.namespace().unwrap_or_default());
        self.queue.triggered(r, why);
    }

    /// Reconciles `app` (soon), recording what asked for it; nothing
    /// between terms (the next term looks at every Application), and
    /// nothing while the gRPC transport holds it (its status writes and
    /// the index's first build come here too; a switch away from it is
    /// told by `Gate::transport_switched` once the index shows it).
    pub(crate) fn trigger(&self, app: ObjectRef<CachedApp>, why: &'static str) {
        let r = HubRef {
            namespace: app.namespace.clone().unwrap_or_default(),
            name: app.name.clone(),
        };
        if self.held_by_grpc(&r) {
            return;
        }
        if let Some(tx) = &*self.triggers.lock().expect("lock") {
            self.queue.triggered(app.clone(), why);
            // Closed only when the term's controller has stopped.
            let _ = tx.send(app);
        }
    }
}

/// The ManifestWork transport's share of the hub's watches, heard only
/// while this replica leads: from [`Gate::open`] to [`Gate::close`]. In
/// between, events are dropped, and opening looks at every Application, as
/// a fresh start would.
pub struct Gate {
    open: std::sync::atomic::AtomicBool,
    ctx: std::sync::Arc<Context>,
}

impl Gate {
    pub fn new(ctx: std::sync::Arc<Context>) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            open: std::sync::atomic::AtomicBool::new(false),
            ctx,
        })
    }

    /// This replica leads: every Application is looked at, and every event
    /// from now on is heard, by the controller reading the receiver
    /// ([`super::controller::run`]).
    pub fn open(&self) -> tokio::sync::mpsc::UnboundedReceiver<ObjectRef<CachedApp>> {
        let triggered = self.ctx.start_term();
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
        for app in self.ctx.caches.apps.state() {
            self.ctx
                .trigger(ObjectRef::from_obj(app.as_ref()), "leading");
        }
        triggered
    }

    /// This replica no longer leads: nothing more is heard, and the
    /// term's controller gets no new work.
    pub fn close(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        self.ctx.end_term();
    }

    /// The gRPC side changed what `app` is to it: it moved to or from the
    /// gRPC transport (`transport-switch`), or the agent's record of who
    /// holds its spoke key changed (`holder-change`). While open, its work
    /// is delivered, handed over or refused again; `trigger` is what the
    /// reconcile is counted under.
    pub fn transport_switched(&self, app: &HubRef, trigger: &'static str) {
        if self.open.load(std::sync::atomic::Ordering::SeqCst) {
            let r = ObjectRef::new(&app.name).within(&app.namespace);
            self.ctx.trigger(r, trigger);
        }
    }

    /// Hears the gRPC side's switches ([`crate::transport::grpc::hub::Switches`])
    /// until the hub or the gate is gone.
    pub async fn hear_switches(
        gate: std::sync::Weak<Gate>,
        mut switched: tokio::sync::mpsc::UnboundedReceiver<(HubRef, &'static str)>,
    ) {
        while let Some((app, trigger)) = switched.recv().await {
            let Some(gate) = gate.upgrade() else { return };
            gate.transport_switched(&app, trigger);
        }
    }
}

impl Consumer for Gate {
    fn event(&self, event: &Event) {
        if self.open.load(std::sync::atomic::Ordering::SeqCst) {
            self.ctx.event(event);
        }
    }

    fn synced(&self) {
        self.ctx.synced();
    }
}
