//! Capability `terminal`: the hub's argocd-server's web terminal, an exec
//! into a pod, which the hub relays as `TerminalOpen` and frames of
//! Kubernetes' WebSocket exec protocol (`v5.channel.k8s.io`). Only with
//! `--terminal` (the agent's exec right exists only then); only into a pod
//! of an Application this agent applied for the hub, or owned by one, as
//! live views decide it (`live/owners.rs`); at most [`MAX_SESSIONS`] on the
//! cluster and [`MAX_PER_APPLICATION`] per Application at once; each ends
//! after the hub's idle time and length, within this agent's own ceilings
//! ([`MAX_IDLE`], [`MAX_LENGTH`]). The exec goes through the cluster's API
//! server with the agent's identity; frames pass both ways as they are, by
//! credits ([`TERMINAL_WINDOW`]). A log line records each session's start
//! and end: which pod and container, which Application, how long.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_pull_core::live::{Refusal, ResourceRef};
use argocd_pull_proto::limits::{MAX_TERMINAL_FRAME_BYTES, TERMINAL_WINDOW};
use argocd_pull_proto::v1::{
    AgentMessage, ObjectKey, TerminalClose, TerminalCredit, TerminalData, TerminalOpen,
    TerminalOpened, agent_message,
};
use argocd_pull_proto::validate::terminal::{FROM_AGENT, frame_ok};
use argocd_pull_runtime::task::AbortOnDrop;
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use super::Reader;

mod connect;

/// Terminal sessions at once on the cluster.
pub const MAX_SESSIONS: usize = 16;
/// Terminal sessions at once into the pods of one Application.
pub const MAX_PER_APPLICATION: usize = 4;
/// The longest idle time and length of a session, whatever the hub asks.
pub const MAX_IDLE: Duration = Duration::from_secs(3600);
pub const MAX_LENGTH: Duration = Duration::from_secs(8 * 3600);

/// The input frames taken before they are granted back to the hub.
const CREDIT_BATCH: u32 = TERMINAL_WINDOW / 4;

/// What the hub sends a session.
#[derive(Debug)]
enum Input {
    Data(Vec<u8>),
    Credit(u32),
    Close(String),
}

/// A session under way: where its input goes, the Application its pod
/// belongs to (once known), and its task (ended by dropping).
struct Session {
    input: mpsc::Sender<Input>,
    application: Option<String>,
    _task: AbortOnDrop<()>,
}

/// The agent's terminal sessions.
pub struct Terminals {
    reader: Arc<Reader>,
    sessions: Arc<Mutex<HashMap<u64, Session>>>,
}

impl Terminals {
    pub fn new(reader: Arc<Reader>) -> Arc<Self> {
        Arc::new(Self {
            reader,
            sessions: Arc::default(),
        })
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Session>> {
        self.sessions.lock().expect("not poisoned")
    }

    /// Starts session `open`; refused (for it alone) over the cluster's
    /// bound or when its names are not names.
    pub fn open(self: &Arc<Self>, open: TerminalOpen) {
        let id = open.id;
        let mut sessions = self.sessions();
        sessions.retain(|_, s| !s.input.is_closed());
        if let Err(r) = check(&open, sessions.len()) {
            drop(sessions);
            tracing::warn!(namespace = %open.namespace, pod = %open.pod, code = r.code, reason = %r.message, "refused a terminal of the hub");
            return self.send(close(id, r.code.into(), &r.message));
        }
        let (input, inputs) = mpsc::channel(TERMINAL_WINDOW as usize + 8);
        let me = self.clone();
        let task = AbortOnDrop(tokio::spawn(async move {
            let started = Instant::now();
            let (code, reason) = me.run(&open, inputs).await;
            let application = me.sessions().remove(&open.id).and_then(|s| s.application);
            tracing::info!(
                namespace = %open.namespace,
                pod = %open.pod,
                container = %open.container,
                application = application.as_deref().unwrap_or(""),
                seconds = started.elapsed().as_secs(),
                code,
                %reason,
                "a terminal of the hub ended"
            );
        }));
        sessions.insert(
            id,
            Session {
                input,
                application: None,
                _task: task,
            },
        );
    }

    /// A frame of input for session `id`; a hub past its window ends it.
    pub fn data(&self, id: u64, frame: Vec<u8>) {
        self.input(id, Input::Data(frame));
    }

    /// The hub took `frames` more frames of session `id`'s output.
    pub fn credit(&self, id: u64, frames: u32) {
        self.input(id, Input::Credit(frames));
    }

    /// The hub ended session `id`.
    pub fn close(&self, id: u64, reason: String) {
        self.input(id, Input::Close(reason));
    }

    fn input(&self, id: u64, input: Input) {
        let mut sessions = self.sessions();
        let Some(s) = sessions.get(&id) else { return };
        match s.input.try_send(input) {
            Ok(()) => {}
            // The session is ending: it tells the hub itself.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                sessions.remove(&id);
                drop(sessions);
                self.send(close(id, 502, "the hub sent more than its window"));
            }
        }
    }

    /// Ends every session (the stream they run on ended).
    pub fn cancel_all(&self) {
        self.sessions().clear();
    }

    fn send(&self, kind: agent_message::Kind) {
        self.reader.state.control(AgentMessage { kind: Some(kind) });
    }

    /// Checks the pod, opens the exec and relays it: how it ended. The
    /// hub is told, unless it ended it.
    async fn run(&self, open: &TerminalOpen, inputs: mpsc::Receiver<Input>) -> (u32, String) {
        let (key, hub_uid, application) = match self.admit(open).await {
            Ok(admitted) => admitted,
            Err(r) => {
                tracing::warn!(namespace = %open.namespace, pod = %open.pod, code = r.code, reason = %r.message, "refused a terminal of the hub");
                self.send(close(open.id, r.code.into(), &r.message));
                return (r.code.into(), r.message);
            }
        };
        let ws = match connect::exec(&self.reader.client, open).await {
            Ok(ws) => ws,
            Err(r) => {
                self.send(close(open.id, r.code.into(), &r.message));
                return (r.code.into(), r.message);
            }
        };
        tracing::info!(namespace = %open.namespace, pod = %open.pod, container = %open.container, %application, command = ?open.command, "a terminal of the hub opened");
        self.send(agent_message::Kind::TerminalOpened(TerminalOpened {
            id: open.id,
            key: Some(key),
            hub_uid,
            window: TERMINAL_WINDOW,
        }));
        let (code, reason, by_hub) = self.relay(open, ws, inputs).await;
        if !by_hub {
            self.send(close(open.id, code, &reason));
        }
        (code, reason)
    }

    /// The delivered copy the pod belongs to (its key and hub uid, and its
    /// instance name), within the per-Application bound; or the refusal.
    async fn admit(&self, open: &TerminalOpen) -> Result<(ObjectKey, String, String), Refusal> {
        let pod = ResourceRef::new("v1", "Pod", &open.namespace, &open.pod);
        let not_owned = || {
            Refusal::forbidden(format!(
                "pod {}/{} belongs to no Application this agent applied for the hub: the terminal opens only in those",
                open.namespace, open.pod
            ))
        };
        let instance = self
            .reader
            .belongs(&pod, None)
            .await?
            .ok_or_else(not_owned)?;
        let (key, hub_uid) = self.reader.delivered(&instance).ok_or_else(not_owned)?;
        let mut sessions = self.sessions();
        let same = sessions
            .values()
            .filter(|s| s.application.as_deref() == Some(instance.as_str()))
            .count();
        if same >= MAX_PER_APPLICATION {
            return Err(Refusal::new(
                429,
                format!(
                    "{same} terminals into the pods of Application {instance} are open, the most this agent opens at once: close one"
                ),
            ));
        }
        if let Some(s) = sessions.get_mut(&open.id) {
            s.application = Some(instance.clone());
        }
        Ok((key, hub_uid, instance))
    }

    /// Relays the exec `ws` and the hub's `inputs` until either ends or a
    /// bound does: the status, why, and whether the hub ended it.
    async fn relay<S>(
        &self,
        open: &TerminalOpen,
        ws: tokio_tungstenite::WebSocketStream<S>,
        mut inputs: mpsc::Receiver<Input>,
    ) -> (u32, String, bool)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let (idle, length) = bounds(open);
        let (mut sink, mut source) = ws.split();
        let deadline = Instant::now() + length;
        let mut last = Instant::now();
        let (mut credit, mut taken) = (open.window, 0u32);
        loop {
            tokio::select! {
                m = source.next(), if credit > 0 => match m {
                    Some(Ok(Message::Binary(frame))) => {
                        last = Instant::now();
                        for piece in pieces(&frame) {
                            credit = credit.saturating_sub(1);
                            let data = TerminalData { id: open.id, frame: piece };
                            self.send(agent_message::Kind::TerminalData(data));
                        }
                    }
                    Some(Ok(Message::Close(_))) | None => return (200, "the command ended".into(), false),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return (502, format!("the cluster's exec failed: {e}"), false),
                },
                input = inputs.recv() => match input {
                    Some(Input::Data(frame)) => {
                        last = Instant::now();
                        if let Err(e) = sink.send(Message::Binary(frame.into())).await {
                            return (502, format!("the cluster's exec failed: {e}"), false);
                        }
                        taken += 1;
                        if taken >= CREDIT_BATCH {
                            let credit = TerminalCredit { id: open.id, frames: taken };
                            self.send(agent_message::Kind::TerminalCredit(credit));
                            taken = 0;
                        }
                    }
                    Some(Input::Credit(n)) => credit = credit.saturating_add(n).min(TERMINAL_WINDOW),
                    Some(Input::Close(reason)) => {
                        let _ = sink.send(Message::Close(None)).await;
                        return (200, format!("the hub ended it: {reason}"), true);
                    }
                    None => return (200, "the stream to the hub ended".into(), true),
                },
                () = tokio::time::sleep_until(last + idle) => {
                    return (408, format!("no input or output for {idle:?}"), false);
                }
                () = tokio::time::sleep_until(deadline) => {
                    return (408, format!("open for {length:?}, the most a terminal stays"), false);
                }
            }
        }
    }
}

impl Reader {
    /// The key and hub uid of the delivered copy whose tracking instance is
    /// `instance`.
    fn delivered(&self, instance: &str) -> Option<(ObjectKey, String)> {
        use argocd_pull_apis::keys;
        use kube::ResourceExt;
        self.cache.all().iter().find_map(|a| {
            let uid = a.annotations().get(keys::HUB_UID)?;
            let namespace = a.namespace().unwrap_or_default();
            let named = argocd_pull_core::status::tree::instance_name(
                &namespace,
                &a.name_any(),
                &self.argocd_namespace,
            );
            (named == instance).then(|| {
                let key = ObjectKey {
                    namespace,
                    name: a.name_any(),
                };
                (key, uid.clone())
            })
        })
    }
}

/// Whether `open` names a pod, a container and a command, and fits beside
/// `running` sessions.
fn check(open: &TerminalOpen, running: usize) -> Result<(), Refusal> {
    use argocd_pull_core::live::exec::{MAX_COMMAND_WORD, MAX_COMMAND_WORDS};
    use argocd_pull_proto::validate::{is_name, is_namespace};
    if !is_namespace(&open.namespace) || !is_name(&open.pod) || !is_name(&open.container) {
        return Err(Refusal::new(
            400,
            "the namespace, pod or container is not a valid name",
        ));
    }
    let words = open.command.len();
    if words == 0
        || words > MAX_COMMAND_WORDS
        || open
            .command
            .iter()
            .any(|w| w.is_empty() || w.len() > MAX_COMMAND_WORD)
    {
        return Err(Refusal::new(400, "the command is empty or too long"));
    }
    if running >= MAX_SESSIONS {
        return Err(Refusal::new(
            429,
            format!(
                "{MAX_SESSIONS} terminals are open on this cluster, the most its agent opens at once"
            ),
        ));
    }
    Ok(())
}

/// The hub's idle time and length, within the agent's ceilings (0: the
/// ceiling).
fn bounds(open: &TerminalOpen) -> (Duration, Duration) {
    let within = |secs: u32, max: Duration| match secs {
        0 => max,
        s => Duration::from_secs(s.into()).min(max),
    };
    (
        within(open.idle_seconds, MAX_IDLE),
        within(open.max_seconds, MAX_LENGTH),
    )
}

/// A frame of the cluster's output as frames within
/// [`MAX_TERMINAL_FRAME_BYTES`], each with the channel byte; none when
/// it is on a channel the agent does not send on.
fn pieces(frame: &[u8]) -> Vec<Vec<u8>> {
    let Some((&channel, payload)) = frame.split_first() else {
        return Vec::new();
    };
    if frame_ok(&[channel], FROM_AGENT).is_err() {
        return Vec::new();
    }
    if payload.is_empty() {
        return vec![vec![channel]];
    }
    payload
        .chunks(MAX_TERMINAL_FRAME_BYTES - 1)
        .map(|c| [&[channel][..], c].concat())
        .collect()
}

fn close(id: u64, code: u32, reason: &str) -> agent_message::Kind {
    let reason = reason.chars().take(512).collect();
    agent_message::Kind::TerminalClose(TerminalClose { id, code, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_cut_to_frames_the_hub_takes_on_the_channels_it_takes() {
        let big = [vec![1u8], vec![b'x'; MAX_TERMINAL_FRAME_BYTES * 2]].concat();
        let cut = pieces(&big);
        assert_eq!(cut.len(), 3);
        assert!(
            cut.iter()
                .all(|p| p[0] == 1 && p.len() <= MAX_TERMINAL_FRAME_BYTES)
        );
        assert_eq!(
            cut.iter().map(|p| p.len() - 1).sum::<usize>(),
            MAX_TERMINAL_FRAME_BYTES * 2
        );
        assert_eq!(pieces(b"\x03{}"), [b"\x03{}".to_vec()]);
        assert!(pieces(b"\x00stdin?").is_empty(), "stdin is not output");
        assert!(pieces(b"").is_empty());
    }

    #[test]
    fn the_hubs_bounds_hold_within_the_agents() {
        let open = |idle, max| TerminalOpen {
            idle_seconds: idle,
            max_seconds: max,
            ..Default::default()
        };
        assert_eq!(bounds(&open(60, 0)), (Duration::from_secs(60), MAX_LENGTH));
        assert_eq!(bounds(&open(u32::MAX, u32::MAX)), (MAX_IDLE, MAX_LENGTH));
    }

    #[test]
    fn a_session_names_a_pod_a_container_and_a_command() {
        let ok = TerminalOpen {
            id: 1,
            namespace: "gb".into(),
            pod: "web-1".into(),
            container: "main".into(),
            command: vec!["sh".into()],
            ..Default::default()
        };
        assert!(check(&ok, 0).is_ok());
        assert_eq!(check(&ok, MAX_SESSIONS).unwrap_err().code, 429);
        let bad = TerminalOpen {
            pod: "../x".into(),
            ..ok.clone()
        };
        assert_eq!(check(&bad, 0).unwrap_err().code, 400);
        let none = TerminalOpen {
            command: vec![],
            ..ok
        };
        assert_eq!(check(&none, 0).unwrap_err().code, 400);
    }
}
