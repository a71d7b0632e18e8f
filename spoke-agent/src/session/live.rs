//! What a session does for the hub's live endpoint: the capabilities it
//! offers (`live-views` with `live-credits`, and `terminal`), the hub's
//! live reads and terminal sessions handed to their owners, and their end
//! with the stream.

use argocd_pull_proto::v1::{Hello, hub_message::Kind};
use argocd_pull_proto::version;

use super::Connection;
use crate::Mode;

impl Connection {
    /// Adds `live-views` (with `live-credits`) to `hello` when this
    /// managed agent serves them, and `terminal` when it opens terminals.
    pub(super) fn offer_live(&self, hello: &mut Hello) {
        if self.config.mode != Mode::Managed || self.live.is_none() {
            return;
        }
        let caps = &mut hello.capabilities;
        caps.push(version::CAPABILITY_LIVE_VIEWS.to_string());
        caps.push(version::CAPABILITY_LIVE_CREDITS.to_string());
        if self.terminal.is_some() {
            caps.push(version::CAPABILITY_TERMINAL.to_string());
        }
    }

    /// A live read or terminal message of the hub; one that opens what
    /// this stream did not negotiate ends it.
    pub(super) fn live_message(&self, kind: Kind) -> Result<(), String> {
        let session = self.state().live_session();
        match kind {
            Kind::LiveRequest(r) => match (&self.live, session) {
                (Some(live), Some(session)) => live.request(session, r),
                _ => {
                    return Err(
                        "the hub sent a live read, which this stream did not negotiate".into(),
                    );
                }
            },
            Kind::LiveCancel(c) => self.live.iter().for_each(|l| l.cancel(c.id)),
            Kind::LiveCredit(c) => self.live.iter().for_each(|l| l.credit(c.id, c.chunks)),
            Kind::TerminalOpen(o) => match (&self.terminal, session) {
                (Some(terminal), Some(_)) => terminal.open(o),
                _ => {
                    return Err(
                        "the hub sent a terminal, which this stream did not negotiate".into(),
                    );
                }
            },
            Kind::TerminalData(d) => {
                if let Some(t) = &self.terminal {
                    t.data(d.id, d.frame);
                }
            }
            Kind::TerminalCredit(c) => self.terminal.iter().for_each(|t| t.credit(c.id, c.frames)),
            Kind::TerminalClose(c) => {
                if let Some(t) = &self.terminal {
                    t.close(c.id, c.reason);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The stream ended: so do its live reads and terminal sessions.
    pub(super) fn end_live(&self) {
        if let Some(live) = &self.live {
            live.cancel_all();
        }
        if let Some(terminal) = &self.terminal {
            terminal.cancel_all();
        }
    }
}
