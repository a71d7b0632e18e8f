//! Capability `live-views`, one cluster's share: the reads of the hub's
//! live endpoint under way on the agent's session, each with the channel
//! its answer's chunks go to and the share ([`Share`]: a namespace, with
//! followed logs apart) it is counted against. Each share has its own
//! limit ([`ShareLimits`]), so no reader's reads take a cluster's whole
//! live views; all of them end (their channels close) when the session
//! ends.

use std::collections::HashMap;

use argocd_pull_core::live::Share;

use argocd_pull_proto::v1::{
    HubMessage, LiveCancel, LiveCredit, LiveRequest, LiveResponse, hub_message,
};
use argocd_pull_proto::version::{CAPABILITY_LIVE_CREDITS, CAPABILITY_LIVE_VIEWS};
use tokio::sync::mpsc;

use super::ClusterState;

/// How many reads of one share of a cluster may be under way at once;
/// more are answered 429.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareLimits {
    /// Reads other than followed logs, per namespace.
    pub reads: usize,
    /// Followed logs, per namespace.
    pub follows: usize,
}

impl ShareLimits {
    /// The limit of `share`.
    pub fn of(&self, share: &Share) -> usize {
        if share.follow {
            self.follows
        } else {
            self.reads
        }
    }
}
/// Chunks of one answer waiting for their reader: an agent with
/// `live-credits` sends no more than that beyond what the reader took (the
/// window of each read); a reader slower than that on an agent without it
/// (a followed log nobody reads) is cut off.
pub const LIVE_CHUNKS: usize = 32;
/// The reader's chunks are granted back to the agent this many at a time.
pub const CREDIT_BATCH: usize = 8;

#[derive(Default)]
pub struct LiveReads {
    next_id: u64,
    pending: HashMap<u64, (mpsc::Sender<LiveResponse>, Share)>,
    /// Capability `terminal`: the terminal sessions under way.
    pub(super) terminals: super::terminal::Terminals,
}

impl LiveReads {
    pub(super) fn clear(&mut self) {
        self.pending.clear();
        self.terminals.clear();
    }
}

/// Why a read cannot be sent to the cluster's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// No agent session on this replica.
    NoAgent,
    /// The agent does not serve live views; its version.
    NotOffered(String),
    /// The reads of this share under way are at its limit.
    Busy { share: Share, limit: usize },
}

impl ClusterState {
    /// Sends a read of `path`, counted against `share`, to the agent; the
    /// chunks of its answer come on the receiver, which ends when the
    /// answer or the session does. With `live-credits` (the third value),
    /// the reader grants what it took back with [`Self::live_credit`].
    pub fn live_read(
        &self,
        path: &str,
        share: &Share,
        limits: &ShareLimits,
    ) -> Result<(u64, mpsc::Receiver<LiveResponse>, bool), Unavailable> {
        let mut inner = self.lock();
        let Some(session) = &inner.session else {
            return Err(Unavailable::NoAgent);
        };
        if !session
            .agent
            .capabilities
            .iter()
            .any(|c| c == CAPABILITY_LIVE_VIEWS)
        {
            return Err(Unavailable::NotOffered(session.agent.version.clone()));
        }
        let credits = session
            .agent
            .capabilities
            .iter()
            .any(|c| c == CAPABILITY_LIVE_CREDITS);
        let limit = limits.of(share);
        let same = inner.live.pending.values().filter(|(_, s)| s == share);
        if same.count() >= limit {
            return Err(Unavailable::Busy {
                share: share.clone(),
                limit,
            });
        }
        inner.live.next_id += 1;
        let id = inner.live.next_id;
        let (tx, rx) = mpsc::channel(LIVE_CHUNKS);
        inner.live.pending.insert(id, (tx, share.clone()));
        inner.push_control(HubMessage {
            kind: Some(hub_message::Kind::LiveRequest(LiveRequest {
                id,
                path: path.to_string(),
                window: if credits { LIVE_CHUNKS as u32 } else { 0 },
            })),
        });
        drop(inner);
        self.wake.notify_one();
        Ok((id, rx, credits))
    }

    /// The reader of `id` took `chunks` more chunks: the agent may send as
    /// many more (capability `live-credits`).
    pub fn live_credit(&self, id: u64, chunks: usize) {
        let mut inner = self.lock();
        if inner.live.pending.contains_key(&id) {
            inner.push_control(HubMessage {
                kind: Some(hub_message::Kind::LiveCredit(LiveCredit {
                    id,
                    chunks: chunks as u32,
                })),
            });
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// One chunk of an answer, from the agent: handed to its reader; a
    /// chunk of a read nobody waits for any more is dropped, and a reader
    /// too slow for its answer is cut off (the agent is told to stop).
    pub fn live_answer(&self, chunk: LiveResponse) {
        let mut inner = self.lock();
        let id = chunk.id;
        let last = chunk.last;
        let Some((tx, _)) = inner.live.pending.get(&id) else {
            return;
        };
        let cut = tx.try_send(chunk).is_err();
        if cut || last {
            inner.live.pending.remove(&id);
        }
        if cut && !last {
            inner.push_control(cancel(id));
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// The reader of `id` went away: the agent is told to stop, unless the
    /// answer was whole.
    pub fn live_cancel(&self, id: u64) {
        let mut inner = self.lock();
        if inner.live.pending.remove(&id).is_some() {
            inner.push_control(cancel(id));
            drop(inner);
            self.wake.notify_one();
        }
    }
}

fn cancel(id: u64) -> HubMessage {
    HubMessage {
        kind: Some(hub_message::Kind::LiveCancel(LiveCancel { id })),
    }
}
