//! The terminal messages (capability `terminal`): an id, frames within
//! [`MAX_TERMINAL_FRAME_BYTES`] on the channels their sender may use, and
//! bounded reasons. A frame a reader sent is the hub's to check before it
//! goes on the stream ([`frame_ok`] with [`FROM_HUB`]); a message that fails here ends the
//! stream, as every malformed message does.

use super::{Malformed, malformed};
use crate::limits::MAX_TERMINAL_FRAME_BYTES;
use crate::v1::{TerminalClose, TerminalCredit, TerminalData, TerminalOpen, TerminalOpened};

/// The longest `TerminalClose.reason`, `TerminalOpened.hub_uid`.
pub const MAX_TERMINAL_TEXT: usize = 1024;

/// Channels of `v5.channel.k8s.io` the hub sends on: stdin, a resize, and
/// the close of stdin.
pub const FROM_HUB: &[u8] = &[0, 4, 255];
/// Channels the agent sends on: stdout, stderr, the exec's Status, and a
/// close.
pub const FROM_AGENT: &[u8] = &[1, 2, 3, 255];

/// Whether `frame` is one a side that may use `channels` sends.
pub fn frame_ok(frame: &[u8], channels: &[u8]) -> Result<(), String> {
    let Some(channel) = frame.first() else {
        return Err("frame is empty (no channel byte)".into());
    };
    if frame.len() > MAX_TERMINAL_FRAME_BYTES {
        return Err(format!(
            "frame is {} bytes, over {MAX_TERMINAL_FRAME_BYTES}",
            frame.len()
        ));
    }
    if !channels.contains(channel) {
        return Err(format!(
            "frame is on channel {channel}, not one of {channels:?}"
        ));
    }
    Ok(())
}

fn id(what: &str, id: u64) -> Result<(), Malformed> {
    if id == 0 {
        return Err(malformed(what, "id is 0"));
    }
    Ok(())
}

fn text(what: &str, field: &str, s: &str) -> Result<(), Malformed> {
    if s.len() > MAX_TERMINAL_TEXT {
        return Err(malformed(
            what,
            format!("{field} is over {MAX_TERMINAL_TEXT} bytes"),
        ));
    }
    Ok(())
}

pub(super) fn data(d: &TerminalData, channels: &[u8]) -> Result<(), Malformed> {
    id("TerminalData", d.id)?;
    frame_ok(&d.frame, channels).map_err(|e| malformed("TerminalData", e))
}

pub(super) fn credit(c: &TerminalCredit) -> Result<(), Malformed> {
    id("TerminalCredit", c.id)
}

pub(super) fn close(c: &TerminalClose) -> Result<(), Malformed> {
    id("TerminalClose", c.id)?;
    text("TerminalClose", "reason", &c.reason)
}

pub(super) fn opened(o: &TerminalOpened) -> Result<(), Malformed> {
    id("TerminalOpened", o.id)?;
    super::key("TerminalOpened", o.key.as_ref())?;
    text("TerminalOpened", "hub_uid", &o.hub_uid)
}

/// A hub's TerminalOpen: an id. What it names is a reader's, checked by the
/// agent and refused for that session alone.
pub(super) fn open(o: &TerminalOpen) -> Result<(), Malformed> {
    id("TerminalOpen", o.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_side_sends_on_its_own_channels() {
        assert!(frame_ok(b"\x00ls\n", FROM_HUB).is_ok());
        assert!(frame_ok(b"\x01out", FROM_HUB).is_err());
        assert!(frame_ok(b"\x01out", FROM_AGENT).is_ok());
        assert!(frame_ok(b"\x00in", FROM_AGENT).is_err());
        assert!(frame_ok(b"", FROM_AGENT).is_err());
        let big = vec![1u8; MAX_TERMINAL_FRAME_BYTES + 1];
        assert!(frame_ok(&big, FROM_AGENT).unwrap_err().contains("over"));
    }
}
