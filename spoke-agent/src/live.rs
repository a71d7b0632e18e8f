//! Capability `live-views`: the reads the hub's argocd-server makes of this
//! cluster (a resource's live manifest, its events, a pod's log), which the
//! hub forwards as `LiveRequest`s. Each is checked before anything is read
//! ([`argocd_pull_core::live::parse`]: single objects, one object's events,
//! one pod's log, discovery; never a list, a watch or a write), then the
//! object (for events each event's involved object, for a log its pod) must
//! belong to an Application this agent applied for the hub: listed in its
//! `status.resources`, or owned by one through at most
//! [`MAX_OWNER_HOPS`] owner references (a Pod of a ReplicaSet of a
//! Deployment). A Secret leaves without its values. Answers go back in
//! chunks after the status reports; at most [`MAX_READS`] run at once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use argocd_pull_apis::keys;
use argocd_pull_core::live::{self, MAX_OWNER_HOPS, Read, Refusal, ResourceRef};
use argocd_pull_proto::limits::MAX_LIVE_CHUNK_BYTES;
use argocd_pull_proto::v1::{LiveRequest, LiveResponse};
use argocd_pull_runtime::task::AbortOnDrop;
use futures::AsyncBufReadExt;
use kube::ResourceExt;
use serde_json::Value;

use crate::cache::Cache;
use crate::state::AgentState;

/// Reads served at once; more are answered 429 at once.
pub const MAX_READS: usize = 8;
/// The largest answer that is not a log: an object, or one object's
/// events.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// The agent's reader of live views.
pub struct Reader {
    client: kube::Client,
    cache: Cache,
    state: Arc<AgentState>,
    cluster: String,
    /// The reads under way, by request id (cancelled by dropping).
    running: Mutex<HashMap<u64, AbortOnDrop<()>>>,
    /// The chunks each read may still send (capability `live-credits`:
    /// its window, then what the hub grants back); a read without an entry
    /// sends without waiting.
    credits: Mutex<HashMap<u64, Arc<tokio::sync::Semaphore>>>,
    /// How each kind is served, by group and kind (owners are named by
    /// kind; the API is asked by resource): [`Reader::plural`]'s memory.
    plurals: Mutex<HashMap<(String, String), Plural>>,
}

/// The JSON content type.
const JSON: &str = "application/json";

impl Reader {
    pub fn new(
        client: kube::Client,
        store: kube::runtime::reflector::Store<argocd_pull_apis::argocd::Application>,
        state: Arc<AgentState>,
        cluster: &str,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            cache: Cache::new(store),
            state,
            cluster: cluster.to_string(),
            running: Mutex::default(),
            credits: Mutex::default(),
            plurals: Mutex::default(),
        })
    }

    /// Starts answering `request`, received on stream `session`.
    pub fn request(self: &Arc<Self>, session: u64, request: LiveRequest) {
        let id = request.id;
        let mut running = self.running.lock().expect("not poisoned");
        running.retain(|_, task| !task.0.is_finished());
        if running.len() >= MAX_READS {
            drop(running);
            let me = self.clone();
            tokio::spawn(async move {
                let busy = Refusal::new(
                    429,
                    format!("{MAX_READS} live reads are under way on this cluster; try again"),
                );
                me.refuse(session, id, &busy).await;
            });
            return;
        }
        if request.window > 0 {
            let window = tokio::sync::Semaphore::new(request.window as usize);
            self.credits().insert(id, Arc::new(window));
        }
        let me = self.clone();
        running.insert(
            id,
            AbortOnDrop(tokio::spawn(async move {
                me.serve(session, request).await;
                me.running.lock().expect("not poisoned").remove(&id);
                me.credits().remove(&id);
            })),
        );
    }

    fn credits(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<tokio::sync::Semaphore>>> {
        self.credits.lock().expect("not poisoned")
    }

    /// The hub's reader of request `id` took `chunks` more.
    pub fn credit(&self, id: u64, chunks: u32) {
        if let Some(window) = self.credits().get(&id) {
            // Capped where the semaphore would panic: whatever the hub
            // grants, nothing here breaks.
            let room = tokio::sync::Semaphore::MAX_PERMITS - window.available_permits();
            window.add_permits((chunks as usize).min(room));
        }
    }

    /// Stops answering request `id` (the hub's reader went away).
    pub fn cancel(&self, id: u64) {
        self.running.lock().expect("not poisoned").remove(&id);
        self.credits().remove(&id);
    }

    /// Stops every read (the stream they answer on ended).
    pub fn cancel_all(&self) {
        self.running.lock().expect("not poisoned").clear();
        self.credits().clear();
    }

    async fn serve(&self, session: u64, request: LiveRequest) {
        let id = request.id;
        let read = match live::parse("GET", &request.path) {
            Ok(read) => read,
            Err(refusal) => {
                tracing::warn!(path = %request.path, reason = %refusal.message, "refused a live read of the hub");
                return self.refuse(session, id, &refusal).await;
            }
        };
        let answer = match read {
            Read::Discovery(path) => self.discovery(&path).await,
            Read::Get(target) => self.get(&target).await,
            Read::Events {
                namespace,
                name,
                uid,
            } => self.events(&namespace, &name, uid.as_deref()).await,
            Read::Logs {
                namespace,
                pod,
                query,
                follow,
            } => {
                return self
                    .logs(session, id, &namespace, &pod, &query, follow)
                    .await;
            }
        };
        match answer {
            Ok(body) if body.len() > MAX_ANSWER_BYTES => {
                let big = Refusal::new(
                    413,
                    format!(
                        "the answer is {} bytes, over the {MAX_ANSWER_BYTES} bytes a live view carries",
                        body.len()
                    ),
                );
                self.refuse(session, id, &big).await
            }
            Ok(body) => {
                self.send(session, id, 200, JSON, body, true).await;
            }
            Err(refusal) => {
                if refusal.code == 403 {
                    tracing::warn!(path = %request.path, reason = %refusal.message, "refused a live read of the hub");
                }
                self.refuse(session, id, &refusal).await
            }
        }
    }

    async fn refuse(&self, session: u64, id: u64, refusal: &Refusal) {
        self.send(session, id, refusal.code, JSON, refusal.status_json(), true)
            .await;
    }

    /// Sends `body` in chunks; false when the stream ended.
    async fn send(
        &self,
        session: u64,
        id: u64,
        http_status: u16,
        content_type: &str,
        body: Vec<u8>,
        last: bool,
    ) -> bool {
        let mut chunks: Vec<&[u8]> = body.chunks(MAX_LIVE_CHUNK_BYTES).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let n = chunks.len();
        let window = self.credits().get(&id).cloned();
        for (i, chunk) in chunks.into_iter().enumerate() {
            // With a window, each chunk waits for room in it: the hub's
            // reader is slower than the cluster.
            if let Some(window) = &window {
                match window.acquire().await {
                    Ok(permit) => permit.forget(),
                    Err(_) => return false,
                }
            }
            let response = LiveResponse {
                id,
                http_status: http_status.into(),
                content_type: content_type.to_string(),
                body: chunk.to_vec(),
                last: last && i + 1 == n,
            };
            if !self.state.live_response(session, response).await {
                return false;
            }
        }
        true
    }

    /// What the API serves, as the API answers it.
    async fn discovery(&self, path: &str) -> Result<Vec<u8>, Refusal> {
        self.fetch(path).await
    }

    /// One object, if it belongs to a pulled Application.
    async fn get(&self, target: &live::Target) -> Result<Vec<u8>, Refusal> {
        let body = self.fetch(&target.path()).await?;
        let mut object: Value = serde_json::from_slice(&body)
            .map_err(|e| Refusal::new(502, format!("the cluster's answer is not JSON: {e}")))?;
        let Some(r) = ResourceRef::of(&object) else {
            return Err(Refusal::new(502, "the cluster's answer is not an object"));
        };
        if !self.belongs(&r, Some(object.clone())).await? {
            return Err(live::not_owned(&r, &self.cluster));
        }
        live::redact(&mut object);
        Ok(serde_json::to_vec(&object).expect("a Value always serializes"))
    }

    /// The events of one object in `namespace`, each kept only if its
    /// involved object belongs to a pulled Application.
    async fn events(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<Vec<u8>, Refusal> {
        let mut selector = vec![
            format!("involvedObject.name={name}"),
            format!("involvedObject.namespace={namespace}"),
        ];
        if let Some(uid) = uid {
            selector.push(format!("involvedObject.uid={uid}"));
        }
        let query = form_query(&[("fieldSelector", &selector.join(","))]);
        let body = self
            .fetch(&format!("/api/v1/namespaces/{namespace}/events?{query}"))
            .await?;
        let mut list: Value = serde_json::from_slice(&body)
            .map_err(|e| Refusal::new(502, format!("the cluster's answer is not JSON: {e}")))?;
        let mut allowed: HashMap<ResourceRef, bool> = HashMap::new();
        let items = list
            .get_mut("items")
            .and_then(Value::as_array_mut)
            .map(std::mem::take)
            .unwrap_or_default();
        let mut kept = Vec::new();
        for event in items {
            let s = |f: &str| {
                event
                    .pointer(&format!("/involvedObject/{f}"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
            };
            let r = ResourceRef::new(s("apiVersion"), s("kind"), s("namespace"), s("name"));
            let ok = match allowed.get(&r) {
                Some(ok) => *ok,
                None => {
                    let ok = self.belongs(&r, None).await?;
                    allowed.insert(r, ok);
                    ok
                }
            };
            if ok {
                kept.push(event);
            }
        }
        list["items"] = Value::Array(kept);
        Ok(serde_json::to_vec(&list).expect("a Value always serializes"))
    }

    /// One pod's log, streamed in chunks as the API gives it; a followed
    /// one for [`live::MAX_FOLLOW`] at the most.
    async fn logs(
        &self,
        session: u64,
        id: u64,
        namespace: &str,
        pod: &str,
        query: &str,
        follow: bool,
    ) {
        let r = ResourceRef::new("v1", "Pod", namespace, pod);
        match self.belongs(&r, None).await {
            Ok(true) => {}
            Ok(false) => {
                return self
                    .refuse(session, id, &live::not_owned(&r, &self.cluster))
                    .await;
            }
            Err(refusal) => return self.refuse(session, id, &refusal).await,
        }
        let mut path = format!("/api/v1/namespaces/{namespace}/pods/{pod}/log");
        if !query.is_empty() {
            path.push('?');
            path.push_str(query);
        }
        let request = http::Request::get(&path)
            .body(Vec::new())
            .expect("a valid path");
        let mut stream = match self.client.request_stream(request).await {
            Ok(s) => Box::pin(s),
            Err(e) => return self.refuse(session, id, &refusal_of(e)).await,
        };
        let text = "text/plain";
        let until = tokio::time::Instant::now() + live::MAX_FOLLOW;
        loop {
            let next = tokio::time::timeout_at(until, stream.fill_buf()).await;
            let chunk = match next {
                Ok(Ok([])) => Vec::new(),
                Ok(Ok(buf)) => buf[..buf.len().min(MAX_LIVE_CHUNK_BYTES)].to_vec(),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, pod, "a followed log ended");
                    Vec::new()
                }
                Err(_) => {
                    tracing::debug!(pod, follow, "a followed log reached its time limit");
                    Vec::new()
                }
            };
            let last = chunk.is_empty();
            stream.consume_unpin(chunk.len());
            if !self.send(session, id, 200, text, chunk, last).await || last {
                return;
            }
        }
    }

    /// GET `path` from the cluster's API, with the agent's own identity.
    async fn fetch(&self, path: &str) -> Result<Vec<u8>, Refusal> {
        let request = http::Request::get(path)
            .header(http::header::ACCEPT, JSON)
            .body(Vec::new())
            .expect("a valid path");
        self.client
            .request_text(request)
            .await
            .map(String::into_bytes)
            .map_err(refusal_of)
    }

    /// Whether `object` belongs to an Application this agent applied for
    /// the hub: it is one of their managed resources, or owned by one
    /// within [`MAX_OWNER_HOPS`] owner references. `fetched` is the object
    /// when the caller has it.
    async fn belongs(&self, object: &ResourceRef, fetched: Option<Value>) -> Result<bool, Refusal> {
        let managed = self.managed();
        if managed.contains(object) {
            return Ok(true);
        }
        let mut level: Vec<(ResourceRef, Option<Value>)> = vec![(object.clone(), fetched)];
        let mut seen: HashSet<ResourceRef> = HashSet::from([object.clone()]);
        for _ in 0..MAX_OWNER_HOPS {
            let mut next = Vec::new();
            for (r, obj) in level {
                let obj = match obj {
                    Some(o) => o,
                    None => match self.read(&r).await? {
                        Some(o) => o,
                        None => continue,
                    },
                };
                for owner in live::owners(&obj) {
                    if managed.contains(&owner) {
                        return Ok(true);
                    }
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
        Ok(false)
    }

    /// Every resource the Applications this agent applied for the hub
    /// manage.
    fn managed(&self) -> BTreeSet<ResourceRef> {
        self.cache
            .all()
            .iter()
            .filter(|a| a.annotations().contains_key(keys::HUB_UID))
            .flat_map(|a| live::managed_resources(&a.data))
            .collect()
    }

    /// The object `r` names (its version found through discovery); `None`
    /// when it is not there. A namespaced kind is read in `r`'s namespace,
    /// a cluster-scoped one without.
    async fn read(&self, r: &ResourceRef) -> Result<Option<Value>, Refusal> {
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
struct Plural {
    version: String,
    plural: String,
    namespaced: bool,
}

/// `key=value&...`, encoded.
fn form_query(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// The cluster API's error as the answer to a live read.
fn refusal_of(e: kube::Error) -> Refusal {
    match e {
        kube::Error::Api(s) => Refusal::new(
            if s.code == 0 { 502 } else { s.code },
            format!("the cluster's API server: {}", s.message),
        ),
        other => Refusal::new(
            502,
            format!("cannot read the cluster's API server: {other}"),
        ),
    }
}
