//! Which pulled Application an object of the cluster belongs to, read
//! from the object and its owners on the cluster itself.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use argocd_pull_apis::keys;
use argocd_pull_core::live::{self, MAX_OWNER_HOPS, Refusal, ResourceRef, tracking};
use argocd_pull_core::status::tree::instance_name;
use kube::ResourceExt;
use serde_json::Value;

use super::Reader;

/// How long the tracking method read from argocd-cm is taken as it was.
const TRACKING_REFRESH: Duration = Duration::from_secs(60);

impl Reader {
    /// The pulled Application `object` belongs to: the one whose tracking
    /// ([`tracking::tracked_by`]) it carries, or that of an owner within
    /// [`MAX_OWNER_HOPS`] owner references (a Pod of a ReplicaSet of a
    /// Deployment Argo CD applied). `fetched` is the object when the
    /// caller has it. An object that is not on the cluster, or that no
    /// pulled Application's Argo CD applied, belongs to none, whatever an
    /// Application's `status.resources` lists.
    pub(super) async fn belongs(
        &self,
        object: &ResourceRef,
        fetched: Option<Value>,
    ) -> Result<Option<String>, Refusal> {
        let pulled = self.pulled();
        let method = self.tracking_method().await;
        let mut level: Vec<(ResourceRef, Option<Value>)> = vec![(object.clone(), fetched)];
        let mut seen: HashSet<ResourceRef> = HashSet::from([object.clone()]);
        // The object itself, then each level of owners.
        for _ in 0..=MAX_OWNER_HOPS {
            let mut next = Vec::new();
            for (r, obj) in level {
                let obj = match obj {
                    Some(o) => o,
                    None => match self.read(&r).await? {
                        Some(o) => o,
                        None => continue,
                    },
                };
                if let Some(instance) =
                    tracking::tracked_by(&obj, method).filter(|i| pulled.contains(i))
                {
                    return Ok(Some(instance));
                }
                for owner in live::owners(&obj) {
                    if seen.insert(owner.clone()) {
                        next.push((owner, None));
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            level = next;
        }
        Ok(None)
    }

    /// How the cluster's Argo CD tracks what it applies: its argocd-cm's
    /// setting, read at most once a [`TRACKING_REFRESH`]; annotation
    /// tracking (v3's default, and the one that trusts no label) when
    /// argocd-cm cannot be read.
    async fn tracking_method(&self) -> tracking::Method {
        let fresh =
            |(at, m): &(Instant, tracking::Method)| (at.elapsed() < TRACKING_REFRESH).then_some(*m);
        if let Some(m) = self
            .tracking
            .lock()
            .expect("not poisoned")
            .as_ref()
            .and_then(fresh)
        {
            return m;
        }
        let path = format!(
            "/api/v1/namespaces/{}/configmaps/{}",
            self.argocd_namespace,
            tracking::SETTINGS_CONFIGMAP
        );
        let setting = match self.fetch(&path).await {
            Ok(body) => serde_json::from_slice::<Value>(&body).ok().and_then(|cm| {
                cm.pointer("/data")?
                    .get(tracking::METHOD_KEY)?
                    .as_str()
                    .map(String::from)
            }),
            Err(refusal) => {
                if refusal.code != 404 {
                    tracing::warn!(code = refusal.code, reason = %refusal.message, "could not read the tracking method of the cluster's Argo CD; taking annotation tracking");
                }
                None
            }
        };
        let method = tracking::Method::from_setting(setting.as_deref());
        *self.tracking.lock().expect("not poisoned") = Some((Instant::now(), method));
        method
    }

    /// The Argo CD instance names of the Applications this agent applied
    /// for the hub (what their objects' tracking names).
    fn pulled(&self) -> HashSet<String> {
        self.cache
            .all()
            .iter()
            .filter(|a| a.annotations().contains_key(keys::HUB_UID))
            .map(|a| {
                instance_name(
                    &a.namespace().unwrap_or_default(),
                    &a.name_any(),
                    &self.argocd_namespace,
                )
            })
            .collect()
    }

    /// The object `r` names (its version found through discovery); `None`
    /// when it is not there. A namespaced kind is read in `r`'s namespace,
    /// a cluster-scoped one without.
    pub(super) async fn read(&self, r: &ResourceRef) -> Result<Option<Value>, Refusal> {
        let Some(kind) = self.plural(&r.group, &r.kind).await? else {
            return Ok(None);
        };
        let target = live::Target {
            group: r.group.clone(),
            version: kind.version,
            resource: kind.plural,
            namespace: (kind.namespaced && !r.namespace.is_empty()).then(|| r.namespace.clone()),
            name: r.name.clone(),
        };
        match self.fetch(&target.path()).await {
            Ok(body) => Ok(serde_json::from_slice(&body).ok()),
            Err(refusal) if refusal.code == 404 => {
                let key = (r.group.clone(), r.kind.clone());
                self.plurals.lock().expect("not poisoned").remove(&key);
                Ok(None)
            }
            Err(refusal) => Err(refusal),
        }
    }

    /// The preferred version, plural and scope of `group`/`kind`, from the
    /// cluster's discovery the first time, then from memory (at most 1,024
    /// kinds; forgotten when a read at it finds nothing, so a CRD whose
    /// version went is looked up again).
    async fn plural(&self, group: &str, kind: &str) -> Result<Option<Plural>, Refusal> {
        let key = (group.to_string(), kind.to_string());
        if let Some(known) = self.plurals.lock().expect("not poisoned").get(&key) {
            return Ok(Some(known.clone()));
        }
        let version = if group.is_empty() {
            "v1".to_string()
        } else {
            let body = self.fetch(&format!("/apis/{group}")).await?;
            let g: Value = serde_json::from_slice(&body).unwrap_or_default();
            match g
                .pointer("/preferredVersion/version")
                .and_then(Value::as_str)
            {
                Some(v) => v.to_string(),
                None => return Ok(None),
            }
        };
        let path = if group.is_empty() {
            "/api/v1".to_string()
        } else {
            format!("/apis/{group}/{version}")
        };
        let body = self.fetch(&path).await?;
        let list: Value = serde_json::from_slice(&body).unwrap_or_default();
        let found = list
            .get("resources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|r| {
                r.get("kind").and_then(Value::as_str) == Some(kind)
                    && !r
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("/")
                        .contains('/')
            });
        let Some(r) = found else { return Ok(None) };
        let known = Plural {
            version,
            plural: r["name"].as_str().unwrap_or_default().to_string(),
            namespaced: r["namespaced"].as_bool().unwrap_or(true),
        };
        let mut plurals = self.plurals.lock().expect("not poisoned");
        if plurals.len() < 1024 {
            plurals.insert(key, known.clone());
        }
        Ok(Some(known))
    }
}

/// How the cluster's API serves one kind: its preferred version, its
/// resource name and whether it is namespaced.
#[derive(Clone, Debug)]
pub(super) struct Plural {
    version: String,
    plural: String,
    namespaced: bool,
}
