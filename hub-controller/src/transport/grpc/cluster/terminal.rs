//! Capability `terminal`, one cluster's share: the terminal sessions under
//! way on the agent's session, each with the channel its agent's messages
//! go to. At most a limit of them at once per cluster
//! (`--terminal-sessions-per-cluster`); all of them end (their channels
//! close) when the agent's session does.

use std::collections::HashMap;

use argocd_pull_core::live::exec::Exec;
use argocd_pull_proto::limits::TERMINAL_WINDOW;
use argocd_pull_proto::v1::{
    HubMessage, ObjectKey, TerminalClose, TerminalCredit, TerminalData, TerminalOpen,
    agent_message, hub_message,
};
use argocd_pull_proto::version::CAPABILITY_TERMINAL;
use tokio::sync::mpsc;

use super::ClusterState;

/// What the agent says of one session.
#[derive(Debug)]
pub enum FromAgent {
    /// The exec runs: the hub Application the pod's Application was
    /// delivered for (as the agent says), and the frames the hub may send
    /// before the agent's first credit.
    Opened {
        key: ObjectKey,
        hub_uid: String,
        window: u32,
    },
    Data(Vec<u8>),
    Credit(u32),
    /// The session ended, or was refused before it opened.
    Closed {
        code: u32,
        reason: String,
    },
}

/// Room for a whole window of frames and the messages beside them.
const QUEUE: usize = TERMINAL_WINDOW as usize + 8;

#[derive(Default)]
pub struct Terminals {
    next_id: u64,
    open: HashMap<u64, mpsc::Sender<FromAgent>>,
}

impl Terminals {
    pub(super) fn clear(&mut self) {
        self.open.clear();
    }
}

/// Why a terminal cannot be opened on the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No agent session on this replica.
    NoAgent,
    /// The agent does not open terminals: its version.
    Off(String),
    /// The cluster's sessions are at the limit.
    Busy(usize),
}

impl ClusterState {
    /// Asks the agent to open `exec`, unless `limit` sessions of the
    /// cluster are under way; what the agent says of it comes on the
    /// receiver, which ends when the session or the agent's stream does.
    pub fn terminal_open(
        &self,
        exec: &Exec,
        bounds: (std::time::Duration, std::time::Duration),
        limit: usize,
    ) -> Result<(u64, mpsc::Receiver<FromAgent>), Refused> {
        let mut inner = self.lock();
        let Some(session) = &inner.session else {
            return Err(Refused::NoAgent);
        };
        if !session
            .agent
            .capabilities
            .iter()
            .any(|c| c == CAPABILITY_TERMINAL)
        {
            return Err(Refused::Off(session.agent.version.clone()));
        }
        let terminals = &mut inner.live.terminals;
        terminals.open.retain(|_, tx| !tx.is_closed());
        if terminals.open.len() >= limit {
            return Err(Refused::Busy(limit));
        }
        terminals.next_id += 1;
        let id = terminals.next_id;
        let (tx, rx) = mpsc::channel(QUEUE);
        terminals.open.insert(id, tx);
        let (idle, max) = bounds;
        inner.push_control(message(hub_message::Kind::TerminalOpen(TerminalOpen {
            id,
            namespace: exec.namespace.clone(),
            pod: exec.pod.clone(),
            container: exec.container.clone(),
            command: exec.command.clone(),
            tty: exec.tty,
            window: TERMINAL_WINDOW,
            idle_seconds: idle.as_secs().try_into().unwrap_or(u32::MAX),
            max_seconds: max.as_secs().try_into().unwrap_or(u32::MAX),
            stdin: exec.stdin,
            stdout: exec.stdout,
            stderr: exec.stderr,
        })));
        drop(inner);
        self.wake.notify_one();
        Ok((id, rx))
    }

    /// Sends a frame of input (checked by the caller) of session `id`.
    pub fn terminal_data(&self, id: u64, frame: Vec<u8>) {
        self.terminal_send(
            id,
            hub_message::Kind::TerminalData(TerminalData { id, frame }),
        );
    }

    /// The user took `frames` more frames of session `id`'s output.
    pub fn terminal_credit(&self, id: u64, frames: u32) {
        let credit = TerminalCredit { id, frames };
        self.terminal_send(id, hub_message::Kind::TerminalCredit(credit));
    }

    /// Session `id` ends on the hub's side (the user went, or a bound was
    /// reached): the agent is told, unless it ended there.
    pub fn terminal_close(&self, id: u64, code: u32, reason: &str) {
        let mut inner = self.lock();
        if inner.live.terminals.open.remove(&id).is_some() {
            let reason = reason.chars().take(512).collect();
            inner.push_control(message(hub_message::Kind::TerminalClose(TerminalClose {
                id,
                code,
                reason,
            })));
            drop(inner);
            self.wake.notify_one();
        }
    }

    fn terminal_send(&self, id: u64, kind: hub_message::Kind) {
        let mut inner = self.lock();
        if inner.live.terminals.open.contains_key(&id) {
            inner.push_control(message(kind));
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// A terminal message of the agent: handed to its session. A message
    /// of a session that is not (or no longer) open is dropped; an agent
    /// that sends beyond its window ends its session.
    pub fn terminal_message(&self, kind: agent_message::Kind) {
        let (id, event) = match kind {
            agent_message::Kind::TerminalOpened(o) => (
                o.id,
                FromAgent::Opened {
                    key: o.key.unwrap_or_default(),
                    hub_uid: o.hub_uid,
                    window: o.window,
                },
            ),
            agent_message::Kind::TerminalData(d) => (d.id, FromAgent::Data(d.frame)),
            agent_message::Kind::TerminalCredit(c) => (c.id, FromAgent::Credit(c.frames)),
            agent_message::Kind::TerminalClose(c) => (
                c.id,
                FromAgent::Closed {
                    code: c.code,
                    reason: c.reason,
                },
            ),
            _ => return,
        };
        let closed = matches!(event, FromAgent::Closed { .. });
        let mut inner = self.lock();
        let Some(tx) = inner.live.terminals.open.get(&id) else {
            return;
        };
        let (failed, gone) = (tx.try_send(event).is_err(), tx.is_closed());
        if closed {
            inner.live.terminals.open.remove(&id);
        }
        drop(inner);
        if failed && !closed {
            if gone {
                self.terminal_close(id, 200, "the user closed the terminal");
            } else {
                tracing::warn!(cluster = %self.name, id, "the agent sent a terminal session more than its window: ended it");
                self.terminal_close(id, 502, "the agent sent more than its window");
            }
        }
    }
}

fn message(kind: hub_message::Kind) -> HubMessage {
    HubMessage { kind: Some(kind) }
}
