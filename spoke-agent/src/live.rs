//! Capability `live-views`: the reads the hub's argocd-server makes of this
//! cluster (a resource's live manifest, its events, a pod's log), which the
//! hub forwards as `LiveRequest`s. Each is checked before anything is read
//! (its path's length and form, [`limits::check_live_path`], and what it
//! asks for, [`argocd_pull_core::live::parse`]: single objects, one
//! object's events by its uid, one pod's log, discovery; never a list, a
//! watch or a write), and refused for that read alone when it fails: no
//! reader's request ends the stream. Then the object (for events the
//! object of that uid, for a log its pod) must be one Argo CD applied for
//! an Application this agent applied for the hub, or owned by one
//! (`live/owners.rs`). A Secret leaves without its values. Answers go back
//! in chunks after the status reports; how many run at once is bounded per
//! namespace, followed logs apart (`live/admit.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argocd_pull_core::live::{self, Read, Refusal, ResourceRef, Share, tracking};
use argocd_pull_proto::limits::{self, MAX_LIVE_CHUNK_BYTES};
use argocd_pull_proto::v1::{LiveRequest, LiveResponse};
use argocd_pull_runtime::task::AbortOnDrop;
use futures::AsyncBufReadExt;
use serde_json::Value;

use crate::cache::Cache;
use crate::state::AgentState;

mod admit;
mod owners;
mod terminal;

pub use admit::{MAX_FOLLOWS_PER_SHARE, MAX_READS_PER_SHARE, MAX_RUNNING};
pub use terminal::Terminals;

/// The largest answer that is not a log: an object, or one object's
/// events.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// The agent's reader of live views.
pub struct Reader {
    client: kube::Client,
    cache: Cache,
    state: Arc<AgentState>,
    cluster: String,
    /// The namespace of the cluster's Argo CD (its Applications' tracking
    /// names them without their namespace there).
    argocd_namespace: String,
    /// The reads under way, by request id (cancelled by dropping), with
    /// the share each takes.
    running: Mutex<HashMap<u64, (AbortOnDrop<()>, Share)>>,
    /// The chunks each read may still send (capability `live-credits`:
    /// its window, then what the hub grants back); a read without an entry
    /// sends without waiting.
    credits: Mutex<HashMap<u64, Arc<tokio::sync::Semaphore>>>,
    /// How each kind is served, by group and kind (owners are named by
    /// kind; the API is asked by resource): [`Reader::plural`]'s memory.
    plurals: Mutex<HashMap<(String, String), owners::Plural>>,
    /// The cluster's Argo CD tracking method and when it was read
    /// ([`Reader::tracking_method`]).
    tracking: Mutex<Option<(std::time::Instant, tracking::Method)>>,
}

/// The JSON content type.
const JSON: &str = "application/json";

impl Reader {
    pub fn new(
        client: kube::Client,
        store: kube::runtime::reflector::Store<argocd_pull_apis::argocd::Application>,
        state: Arc<AgentState>,
        cluster: &str,
        argocd_namespace: &str,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            cache: Cache::new(store),
            state,
            cluster: cluster.to_string(),
            argocd_namespace: argocd_namespace.to_string(),
            running: Mutex::default(),
            credits: Mutex::default(),
            plurals: Mutex::default(),
            tracking: Mutex::default(),
        })
    }

    /// Starts answering `request`, received on stream `session`; a path
    /// the agent does not take, or a read over its share, is answered at
    /// once, for that read alone.
    pub fn request(self: &Arc<Self>, session: u64, request: LiveRequest) {
        let id = request.id;
        let read = limits::check_live_path(&request.path)
            .map_err(|e| Refusal::new(e.http_status(), e.to_string()))
            .and_then(|()| live::parse("GET", &request.path));
        let read = match read {
            Ok(read) => read,
            Err(refusal) => {
                let length = request.path.len();
                tracing::warn!(length, code = refusal.code, reason = %refusal.message, "refused a live read of the hub");
                return self.refuse_later(session, id, refusal);
            }
        };
        let share = read.share();
        let mut running = self.running.lock().expect("not poisoned");
        running.retain(|_, (task, _)| !task.0.is_finished());
        if let Err(busy) = admit::admit(running.values().map(|(_, s)| s), &share) {
            drop(running);
            tracing::warn!(%share, reason = %busy.message, "refused a live read of the hub");
            return self.refuse_later(session, id, busy);
        }
        if request.window > 0 {
            let window = tokio::sync::Semaphore::new(request.window as usize);
            self.credits().insert(id, Arc::new(window));
        }
        let me = self.clone();
        let task = AbortOnDrop(tokio::spawn(async move {
            me.serve(session, id, read).await;
            me.running.lock().expect("not poisoned").remove(&id);
            me.credits().remove(&id);
        }));
        running.insert(id, (task, share));
    }

    /// Answers read `id` with `refusal` without holding up the stream.
    fn refuse_later(self: &Arc<Self>, session: u64, id: u64, refusal: Refusal) {
        let me = self.clone();
        tokio::spawn(async move { me.refuse(session, id, &refusal).await });
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

    async fn serve(&self, session: u64, id: u64, read: Read) {
        let what = format!("{read:?}");
        let answer = match read {
            Read::Discovery(path) => self.discovery(&path).await,
            Read::Get(target) => self.get(&target).await,
            Read::Events {
                namespace,
                name,
                uid,
            } => self.events(&namespace, &name, &uid).await,
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
                    tracing::warn!(read = %what, reason = %refusal.message, "refused a live read of the hub");
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
        if self.belongs(&r, Some(object.clone())).await?.is_none() {
            return Err(live::not_owned(&r, &self.cluster));
        }
        live::redact(&mut object);
        Ok(serde_json::to_vec(&object).expect("a Value always serializes"))
    }

    /// The events of the object of `uid` (`name` in `namespace`): only
    /// those whose involved object is that uid, and only if the object of
    /// that uid is on the cluster and belongs to a pulled Application.
    async fn events(&self, namespace: &str, name: &str, uid: &str) -> Result<Vec<u8>, Refusal> {
        let selector = format!(
            "involvedObject.name={name},involvedObject.namespace={namespace},involvedObject.uid={uid}"
        );
        let query = form_query(&[("fieldSelector", &selector)]);
        let body = self
            .fetch(&format!("/api/v1/namespaces/{namespace}/events?{query}"))
            .await?;
        let mut list: Value = serde_json::from_slice(&body)
            .map_err(|e| Refusal::new(502, format!("the cluster's answer is not JSON: {e}")))?;
        let items: Vec<Value> = list
            .get_mut("items")
            .and_then(Value::as_array_mut)
            .map(std::mem::take)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.pointer("/involvedObject/uid").and_then(Value::as_str) == Some(uid))
            .collect();
        if let Some(first) = items.first() {
            let s = |f: &str| {
                first
                    .pointer(&format!("/involvedObject/{f}"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
            };
            let r = ResourceRef::new(s("apiVersion"), s("kind"), s("namespace"), s("name"));
            let object = self
                .read(&r)
                .await?
                .filter(|o| o.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid));
            let owned = match object {
                Some(o) => self.belongs(&r, Some(o)).await?.is_some(),
                None => false,
            };
            if !owned {
                return Err(live::not_owned(&r, &self.cluster));
            }
        }
        list["items"] = Value::Array(items);
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
            Ok(Some(_)) => {}
            Ok(None) => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_pull_proto::v1::agent_message;
    use argocd_pull_proto::version::CAPABILITY_LIVE_VIEWS;

    /// The answers (code, last) queued on stream 1 by the time both `ids`
    /// have one.
    async fn answers(state: &AgentState, ids: &[u64]) -> HashMap<u64, (u32, bool)> {
        let mut got = HashMap::new();
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while ids.iter().any(|id| !got.contains_key(id)) {
            assert!(tokio::time::Instant::now() < until, "answered: {got:?}");
            for m in state.next_messages(1, 64) {
                if let Some(agent_message::Kind::LiveResponse(r)) = m.kind {
                    got.insert(r.id, (r.http_status, r.last));
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        got
    }

    #[tokio::test]
    async fn a_request_the_agent_does_not_take_is_answered_for_itself_alone() {
        // No API server: these are answered before anything is read.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let writer =
            kube::runtime::reflector::store::Writer::<argocd_pull_apis::argocd::Application>::new(
                argocd_pull_apis::argocd::application_resource(),
            );
        let state = Arc::new(AgentState::default());
        state.attach(1, [CAPABILITY_LIVE_VIEWS.to_string()].into());
        let reader = Reader::new(client, writer.as_reader(), state.clone(), "c1", "argocd");
        let long = format!(
            "/api/v1/namespaces/gb/pods/p/log?container={}",
            "c".repeat(6000)
        );
        for (id, path) in [
            (7, long),
            (8, "/api/v1/namespaces/gb/pods/p/exec".to_string()),
            (
                9,
                "/api/v1/namespaces/gb/events?fieldSelector=involvedObject.name%3Dp".into(),
            ),
        ] {
            reader.request(
                1,
                LiveRequest {
                    id,
                    path,
                    window: 32,
                },
            );
        }
        let got = answers(&state, &[7, 8, 9]).await;
        assert_eq!(got[&7], (414, true));
        assert_eq!(got[&8], (403, true));
        assert_eq!(got[&9], (403, true), "events without a uid");
        assert_eq!(state.live_session(), Some(1), "the stream goes on");
    }
}
