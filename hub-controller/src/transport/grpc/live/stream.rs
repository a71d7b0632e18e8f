//! An answer of several chunks, streamed to the reader as the agent sends
//! them: credits granted back as the reader takes chunks, the agent told
//! to stop when the reader goes away, and a followed log ended at its
//! deadline (`--live-follow-timeout`), so that a LOGS tab left open does
//! not hold its share of the cluster's reads for ever.

use std::sync::Arc;

use argocd_pull_proto::v1::LiveResponse;
use axum::body::Body;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::transport::grpc::cluster::ClusterState;
use crate::transport::grpc::cluster::live::CREDIT_BATCH;

/// The body of an answer whose `first` chunk is not its last: the rest
/// come on `chunks`, until the last, the session's end, or `deadline`.
pub fn body(
    cs: Arc<ClusterState>,
    id: u64,
    first: LiveResponse,
    chunks: mpsc::Receiver<LiveResponse>,
    credits: bool,
    deadline: Option<Instant>,
) -> Body {
    // Dropped when the reader goes away: the agent is told to stop.
    let mut guard = Cancel {
        cs,
        id,
        done: false,
        credits,
        taken: 0,
    };
    guard.took_one();
    let head = futures::stream::once(async move { Ok::<_, std::io::Error>(first.body) });
    let rest = futures::stream::unfold(
        (chunks, guard),
        move |(mut chunks, mut guard)| async move {
            if guard.done {
                return None;
            }
            let chunk = match deadline {
                Some(at) => match tokio::time::timeout_at(at, chunks.recv()).await {
                    Ok(chunk) => chunk?,
                    Err(_) => {
                        tracing::info!(cluster = %guard.cs.name, "a followed log reached --live-follow-timeout: ended");
                        return None;
                    }
                },
                None => chunks.recv().await?,
            };
            guard.done = chunk.last;
            guard.took_one();
            Some((Ok(chunk.body), (chunks, guard)))
        },
    );
    Body::from_stream(futures::StreamExt::chain(head, rest))
}

/// Tells the agent to stop when the reader goes away before the answer's
/// last chunk; with `live-credits`, grants back what the reader took.
struct Cancel {
    cs: Arc<ClusterState>,
    id: u64,
    done: bool,
    credits: bool,
    /// Chunks taken and not granted back yet.
    taken: usize,
}

impl Cancel {
    /// The reader took a chunk off the channel: room for one more.
    fn took_one(&mut self) {
        if !self.credits || self.done {
            return;
        }
        self.taken += 1;
        if self.taken >= CREDIT_BATCH {
            self.cs.live_credit(self.id, self.taken);
            self.taken = 0;
        }
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if !self.done {
            self.cs.live_cancel(self.id);
        }
    }
}
