//! Capability `projects` (managed mode): the AppProjects and project-scoped
//! repository credentials the hub's Applications on this cluster use, kept
//! in the Argo CD namespace as the hub last sent them ([`ProjectSet`]).
//!
//! Each object is applied server-side by the agent's field manager, so an
//! edit of a field it set is reverted (a watch of the objects it applied
//! brings it back within a second, and every minute regardless). A
//! credential the hub no longer lists is deleted; a project is left on the
//! cluster (an Application still being deleted may need it, as over the
//! ManifestWork transport). What the hub sends is checked first: only
//! AppProjects and `repository`/`repo-creds` Secrets, each in this agent's
//! namespace whatever the hub wrote, and never a Secret of that name that
//! argocd-pull did not create (the Argo CD namespace holds Argo CD's own).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_pull_apis::argocd::appproject_resource;
use argocd_pull_apis::keys;
use argocd_pull_proto::v1::{AckOutcome, ProjectSet, ProjectSetAck};
use argocd_pull_runtime::shutdown::Shutdown;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

use crate::apply::MANAGER;
use crate::state::AgentState;

/// Label on every object the agent keeps for its ProjectSet: what it
/// deletes when the hub stops listing it (and nothing else).
pub const PROJECT_SET_LABEL: &str = "argocd-pull.io/project-set";
const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
const MANAGED_BY: &str = "argocd-pull";
const CREDENTIAL_TYPES: [&str; 2] = ["repository", "repo-creds"];
/// Applied again even without a change seen.
const RESYNC: Duration = Duration::from_secs(60);
/// Applied again this soon after the cluster's API server failed.
const RETRY: Duration = Duration::from_secs(5);
/// Lets a burst of watch events pass before applying again.
const SETTLE: Duration = Duration::from_millis(200);

/// One object of a ProjectSet, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Project(Value),
    Secret(Value),
}

impl Object {
    fn name(&self) -> &str {
        let (Object::Project(v) | Object::Secret(v)) = self;
        v["metadata"]["name"].as_str().unwrap_or_default()
    }

    fn value(&self) -> &Value {
        let (Object::Project(v) | Object::Secret(v)) = self;
        v
    }
}

/// Pure: the objects of `set` as this agent applies them in `namespace`,
/// and why each refused one is refused.
pub fn check(set: &ProjectSet, namespace: &str) -> (Vec<Object>, Vec<String>) {
    let mut objects = Vec::new();
    let mut refused = Vec::new();
    let mut names = BTreeSet::new();
    for (i, raw) in set.objects_json.iter().enumerate() {
        match check_one(raw, namespace) {
            Ok(o) if !names.insert((matches!(o, Object::Secret(_)), o.name().to_string())) => {
                refused.push(format!("object {i}: {} is listed twice", o.name()))
            }
            Ok(o) => objects.push(o),
            Err(why) => refused.push(format!("object {i}: {why}")),
        }
    }
    (objects, refused)
}

fn check_one(raw: &[u8], namespace: &str) -> Result<Object, String> {
    let v: Value = serde_json::from_slice(raw).map_err(|e| format!("not JSON: {e}"))?;
    let name = v["metadata"]["name"]
        .as_str()
        .filter(|n| is_name(n))
        .ok_or("no valid metadata.name")?
        .to_string();
    let labels = |extra: Option<(&str, &str)>| {
        let mut l = Map::new();
        l.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
        l.insert(PROJECT_SET_LABEL.into(), "true".into());
        if let Some((k, v)) = extra {
            l.insert(k.into(), v.into());
        }
        Value::Object(l)
    };
    let metadata = |extra| json!({ "name": name, "namespace": namespace, "labels": labels(extra) });
    match (v["apiVersion"].as_str(), v["kind"].as_str()) {
        (
            Some(argocd_pull_apis::argocd::API_VERSION),
            Some(argocd_pull_apis::argocd::PROJECT_KIND),
        ) => Ok(Object::Project(json!({
            "apiVersion": argocd_pull_apis::argocd::API_VERSION,
            "kind": argocd_pull_apis::argocd::PROJECT_KIND,
            "metadata": metadata(None),
            "spec": v.get("spec").cloned().unwrap_or_else(|| json!({})),
        }))),
        (Some("v1"), Some("Secret")) => {
            let kind = v["metadata"]["labels"][keys::ARGOCD_SECRET_TYPE]
                .as_str()
                .filter(|k| CREDENTIAL_TYPES.contains(k))
                .ok_or_else(|| format!("Secret {name} is not a repository or repo-creds Secret"))?;
            Ok(Object::Secret(json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": metadata(Some((keys::ARGOCD_SECRET_TYPE, kind))),
                "type": v.get("type").cloned().unwrap_or_else(|| json!("Opaque")),
                "data": v.get("data").cloned().unwrap_or_else(|| json!({})),
            })))
        }
        (api, kind) => Err(format!(
            "{}/{} {name} is neither an AppProject nor a credential Secret",
            api.unwrap_or_default(),
            kind.unwrap_or_default()
        )),
    }
}

/// A DNS subdomain name, as the API server requires of both kinds.
fn is_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// What the hub last sent, checked.
struct Wanted {
    version: String,
    objects: Vec<Object>,
    refused: Vec<String>,
    /// Its outcome was sent on the current stream.
    answered: bool,
}

pub struct Projects {
    client: kube::Client,
    namespace: String,
    state: Arc<AgentState>,
    wanted: Mutex<Option<Wanted>>,
    wake: Notify,
}

fn secret_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Secret"), "secrets")
}

impl Projects {
    pub fn new(client: kube::Client, namespace: &str, state: Arc<AgentState>) -> Arc<Self> {
        Arc::new(Self {
            client,
            namespace: namespace.into(),
            state,
            wanted: Mutex::new(None),
            wake: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Wanted>> {
        self.wanted.lock().expect("never poisoned")
    }

    /// The hub sent `set`: applied by [`Projects::run`], which answers it.
    pub fn set(&self, set: &ProjectSet) {
        let (objects, refused) = check(set, &self.namespace);
        *self.lock() = Some(Wanted {
            version: set.version.clone(),
            objects,
            refused,
            answered: false,
        });
        self.wake.notify_one();
    }

    /// Keeps the last set on the cluster until `down`.
    pub async fn run(self: Arc<Self>, down: Shutdown) {
        let watched = self.clone();
        let watch = tokio::spawn(async move { watched.watch().await });
        let mut next = RESYNC;
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(next) => {}
                _ = down.clone().wait() => break,
            }
            tokio::time::sleep(SETTLE).await;
            next = if self.apply_wanted().await {
                RESYNC
            } else {
                RETRY
            };
        }
        watch.abort();
    }

    /// Wakes [`Projects::run`] on any change of what it applied.
    async fn watch(self: Arc<Self>) {
        let selector = format!("{PROJECT_SET_LABEL}=true");
        let config = watcher::Config::default().labels(&selector);
        let projects: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &appproject_resource());
        let secrets: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &secret_resource());
        let events = futures::stream::select(
            watcher::watcher(projects, config.clone())
                .default_backoff()
                .boxed(),
            watcher::watcher(secrets, config).default_backoff().boxed(),
        );
        tokio::pin!(events);
        while let Some(e) = events.next().await {
            match e {
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => self.wake.notify_one(),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "watch of the delivered AppProjects failed; retrying")
                }
            }
        }
    }

    /// A new stream: the outcome of the last set is sent again (where its
    /// hub takes it, [`AgentState::project_set_ack`]).
    pub fn reconnected(&self) {
        if let Some(w) = self.lock().as_mut() {
            w.answered = false;
        }
        self.wake.notify_one();
    }

    /// Applies what the hub last sent and answers it; false when the
    /// cluster's API server failed.
    async fn apply_wanted(&self) -> bool {
        let Some((version, objects, refused)) = self
            .lock()
            .as_ref()
            .map(|w| (w.version.clone(), w.objects.clone(), w.refused.clone()))
        else {
            return true;
        };
        let (outcome, message) = match self.apply(&objects).await {
            Ok(more) => {
                let refused: Vec<String> = refused.into_iter().chain(more).collect();
                if refused.is_empty() {
                    (AckOutcome::Applied, String::new())
                } else {
                    tracing::warn!(version, refused = %refused.join("; "), "AppProjects or credentials of the hub refused");
                    (AckOutcome::Rejected, refused.join("; "))
                }
            }
            Err(e) => {
                tracing::warn!(version, error = %e, "applying the hub's AppProjects failed; retrying");
                (AckOutcome::Retry, e.to_string())
            }
        };
        let ok = outcome != AckOutcome::Retry;
        let mut wanted = self.lock();
        // Answer once per set and stream, unless the set changed meanwhile.
        let Some(w) = wanted.as_mut().filter(|w| w.version == version) else {
            return ok;
        };
        if w.answered && ok {
            return ok;
        }
        let mut message = message;
        message.truncate(argocd_pull_proto::validate::MAX_ACK_MESSAGE_LEN);
        while !message.is_char_boundary(message.len()) {
            message.pop();
        }
        let sent = self.state.project_set_ack(ProjectSetAck {
            version,
            outcome: outcome as i32,
            message,
        });
        w.answered = ok && sent;
        ok
    }

    /// Applies `objects` and deletes the credentials no longer wanted;
    /// returns why each refused one is refused.
    async fn apply(&self, objects: &[Object]) -> Result<Vec<String>, kube::Error> {
        let projects: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &appproject_resource());
        let secrets: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &secret_resource());
        let params = PatchParams::apply(MANAGER).force();
        let mut refused = Vec::new();
        for o in objects {
            let api = match o {
                Object::Project(_) => &projects,
                Object::Secret(_) => {
                    let existing = secrets.get_opt(o.name()).await?;
                    if existing.is_some_and(|s| {
                        s.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(MANAGED_BY_LABEL))
                            .is_none_or(|m| m != MANAGED_BY)
                    }) {
                        refused.push(format!(
                            "Secret {}/{} exists on the cluster and argocd-pull did not create it: rename one of them",
                            self.namespace,
                            o.name()
                        ));
                        continue;
                    }
                    &secrets
                }
            };
            api.patch(o.name(), &params, &Patch::Apply(o.value()))
                .await?;
        }
        let wanted: BTreeSet<&str> = objects
            .iter()
            .filter(|o| matches!(o, Object::Secret(_)))
            .map(Object::name)
            .collect();
        let ours = secrets
            .list_metadata(&ListParams::default().labels(&format!("{PROJECT_SET_LABEL}=true")))
            .await?;
        for s in ours.items {
            let name = s.metadata.name.unwrap_or_default();
            if wanted.contains(name.as_str()) || s.metadata.deletion_timestamp.is_some() {
                continue;
            }
            match secrets.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(namespace = %self.namespace, secret = %name, "credential removed: the hub no longer lists it")
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(objects: &[Value]) -> ProjectSet {
        ProjectSet {
            version: "v".into(),
            objects_json: objects
                .iter()
                .map(|o| serde_json::to_vec(o).unwrap())
                .collect(),
        }
    }

    #[test]
    fn only_projects_and_credentials_are_applied_in_the_agents_namespace() {
        let (objects, refused) = check(
            &set(&[
                json!({ "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                        "metadata": { "name": "team", "namespace": "elsewhere",
                                      "labels": { "x": "y" }, "finalizers": ["f"] },
                        "spec": { "sourceRepos": ["*"] } }),
                json!({ "apiVersion": "v1", "kind": "Secret",
                        "metadata": { "name": "repo", "namespace": "argocd",
                                      "labels": { "argocd.argoproj.io/secret-type": "repository" } },
                        "type": "Opaque", "data": { "url": "aHR0cHM6Ly9naXQ=" } }),
                json!({ "apiVersion": "v1", "kind": "Secret",
                        "metadata": { "name": "argocd-secret", "namespace": "argocd" },
                        "data": { "admin.password": "eA==" } }),
                json!({ "apiVersion": "v1", "kind": "Secret",
                        "metadata": { "name": "cluster", "namespace": "argocd",
                                      "labels": { "argocd.argoproj.io/secret-type": "cluster" } } }),
                json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                        "metadata": { "name": "own" } }),
                json!({ "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                        "metadata": { "name": "Bad/Name" } }),
                json!({ "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                        "metadata": { "name": "team" } }),
            ]),
            "gitops",
        );
        assert_eq!(
            objects,
            vec![
                Object::Project(json!({
                    "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                    "metadata": { "name": "team", "namespace": "gitops",
                                  "labels": { MANAGED_BY_LABEL: MANAGED_BY, PROJECT_SET_LABEL: "true" } },
                    "spec": { "sourceRepos": ["*"] },
                })),
                Object::Secret(json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": { "name": "repo", "namespace": "gitops",
                                  "labels": { MANAGED_BY_LABEL: MANAGED_BY, PROJECT_SET_LABEL: "true",
                                              "argocd.argoproj.io/secret-type": "repository" } },
                    "type": "Opaque", "data": { "url": "aHR0cHM6Ly9naXQ=" },
                })),
            ]
        );
        assert_eq!(
            refused,
            vec![
                "object 2: Secret argocd-secret is not a repository or repo-creds Secret",
                "object 3: Secret cluster is not a repository or repo-creds Secret",
                "object 4: rbac.authorization.k8s.io/v1/ClusterRoleBinding own is neither an AppProject nor a credential Secret",
                "object 5: no valid metadata.name",
                "object 6: team is listed twice",
            ]
        );
    }

    #[test]
    fn names_must_be_dns_subdomains() {
        for ok in ["a", "team-1", "a.b", "x".repeat(253).as_str()] {
            assert!(is_name(ok), "{ok}");
        }
        for bad in ["", "A", "-a", "a-", "a..b", "a/b", "x".repeat(254).as_str()] {
            assert!(!is_name(bad), "{bad}");
        }
    }
}
