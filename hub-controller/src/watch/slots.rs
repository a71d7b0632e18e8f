//! Which hub Applications name each spoke Application (cluster, spoke
//! namespace, name), from their annotations alone, whatever transport
//! delivers them and whether or not they may be delivered: the claimants
//! among which [`crate::route::owner`] picks the owner. Fed by the
//! Applications watch before any transport hears the event, so a
//! transport deciding from it sees the event's outcome.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::watcher::Event;

use super::cached::CachedApp;
use crate::route::HubRef;
use crate::route::target::{pulled, target_of};

/// A spoke Application: cluster, namespace there, name.
pub type Slot = (String, String, String);

/// The slot `app` names, if it opted in and its annotations are valid.
pub fn slot_of(app: &CachedApp) -> Option<Slot> {
    let meta = app.metadata();
    if !pulled(&meta) {
        return None;
    }
    let t = target_of(&meta).ok()?;
    Some((t.cluster, t.app_namespace, meta.name.unwrap_or_default()))
}

#[derive(Default)]
pub struct Slots {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_app: HashMap<HubRef, Slot>,
    by_slot: HashMap<Slot, Vec<HubRef>>,
    /// A relist in progress: what it has shown so far.
    relist: Option<HashMap<HubRef, Slot>>,
    /// The other claimants of the slots the last event touched.
    touched: Vec<HubRef>,
}

impl Inner {
    fn set(&mut self, r: &HubRef, slot: Option<Slot>) {
        let old = match &slot {
            Some(s) => self.by_app.insert(r.clone(), s.clone()),
            None => self.by_app.remove(r),
        };
        if old == slot {
            self.touch(slot.as_ref(), r);
            return;
        }
        if let Some(o) = &old
            && let Some(v) = self.by_slot.get_mut(o)
        {
            v.retain(|x| x != r);
            if v.is_empty() {
                self.by_slot.remove(o);
            }
        }
        if let Some(s) = &slot {
            let v = self.by_slot.entry(s.clone()).or_default();
            if !v.contains(r) {
                v.push(r.clone());
            }
        }
        self.touch(old.as_ref(), r);
        self.touch(slot.as_ref(), r);
    }

    fn touch(&mut self, slot: Option<&Slot>, r: &HubRef) {
        if let Some(v) = slot.and_then(|s| self.by_slot.get(s)) {
            let others: Vec<HubRef> = v.iter().filter(|x| *x != r).cloned().collect();
            self.touched.extend(others);
        }
    }
}

impl Slots {
    /// Takes in one event of the Applications watch.
    pub fn observe(&self, event: &Event<CachedApp>) {
        let mut inner = self.inner.lock().expect("never poisoned");
        inner.touched.clear();
        match event {
            Event::Apply(a) => inner.set(&HubRef::of(a), slot_of(a)),
            Event::Delete(a) => inner.set(&HubRef::of(a), None),
            Event::Init => inner.relist = Some(HashMap::new()),
            Event::InitApply(a) => {
                let (r, slot) = (HubRef::of(a), slot_of(a));
                if let (Some(seen), Some(s)) = (inner.relist.as_mut(), &slot) {
                    seen.insert(r.clone(), s.clone());
                }
                inner.set(&r, slot);
            }
            Event::InitDone => {
                if let Some(seen) = inner.relist.take() {
                    let gone: Vec<HubRef> = inner
                        .by_app
                        .keys()
                        .filter(|r| !seen.contains_key(*r))
                        .cloned()
                        .collect();
                    for r in gone {
                        inner.set(&r, None);
                    }
                }
            }
        }
    }

    /// The hub Applications that name `slot`.
    pub fn claimants(&self, slot: &Slot) -> Vec<HubRef> {
        let inner = self.inner.lock().expect("never poisoned");
        inner.by_slot.get(slot).cloned().unwrap_or_default()
    }

    /// The other claimants of the slots the last event touched (it may
    /// have changed their owner).
    pub fn touched(&self) -> Vec<HubRef> {
        self.inner.lock().expect("never poisoned").touched.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_pull_apis::argocd::Application;
    use argocd_pull_apis::keys;
    use serde_json::json;

    fn app(ns: &str, name: &str, cluster: &str, spoke_ns: &str) -> CachedApp {
        let a: Application = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": name, "namespace": ns,
                "labels": { keys::PULL_LABEL: "true" },
                "annotations": { keys::MANAGED_CLUSTER: cluster,
                                 keys::MANAGED_CLUSTER_APP_NAMESPACE: spoke_ns } },
            "spec": {}
        }))
        .unwrap();
        CachedApp::from(a)
    }

    fn r(ns: &str) -> HubRef {
        HubRef {
            namespace: ns.into(),
            name: "shared".into(),
        }
    }

    #[test]
    fn claimants_follow_every_move_and_a_relist() {
        let slots = Slots::default();
        let shared = ("c1".to_string(), "argocd".to_string(), "shared".to_string());
        slots.observe(&Event::Apply(app("argocd", "shared", "c1", "argocd")));
        slots.observe(&Event::Apply(app("aaa", "shared", "c1", "argocd")));
        assert_eq!(slots.claimants(&shared), [r("argocd"), r("aaa")]);
        assert_eq!(slots.touched(), [r("argocd")], "the other claimant");
        // Moved elsewhere: the one left behind is touched.
        slots.observe(&Event::Apply(app("aaa", "shared", "c2", "argocd")));
        assert_eq!(slots.claimants(&shared), [r("argocd")]);
        assert_eq!(slots.touched(), [r("argocd")]);
        // A relist that no longer shows one forgets it.
        slots.observe(&Event::Init);
        slots.observe(&Event::InitApply(app("aaa", "shared", "c1", "argocd")));
        slots.observe(&Event::InitDone);
        assert_eq!(slots.claimants(&shared), [r("aaa")]);
        slots.observe(&Event::Delete(app("aaa", "shared", "c1", "argocd")));
        assert!(slots.claimants(&shared).is_empty());
    }
}
