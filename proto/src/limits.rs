//! Size limits of protocol 1, and the errors that say what to do about them.
//!
//! One object's JSON may be at most what Kubernetes itself stores (etcd's
//! default request limit), and one message must hold the largest message
//! there is (an autonomous agent's report: an Application and its status,
//! each up to the object limit) with room to spare.

use std::fmt;

/// The largest encoded message either side sends or accepts (gRPC's usual
/// default). Servers and clients configure their codecs with it.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The largest JSON payload of one object (an Application, its status, or a
/// sync operation): etcd's default `--max-request-bytes`, so nothing the API
/// server could store is refused, and nothing larger is carried only to fail
/// there.
pub const MAX_OBJECT_JSON_BYTES: usize = 1536 * 1024;

/// The largest chunk of one live answer (`LiveResponse.body`): an object
/// up to [`MAX_OBJECT_JSON_BYTES`] goes in several.
pub const MAX_LIVE_CHUNK_BYTES: usize = 256 * 1024;

/// The longest path of one live read (`LiveRequest.path`, with its query).
pub const MAX_LIVE_PATH_LEN: usize = 4096;

/// The largest frame of a terminal session (`TerminalData.frame`): its
/// channel byte and payload.
pub const MAX_TERMINAL_FRAME_BYTES: usize = 64 * 1024;

/// Frames of a terminal session one side sends beyond what the other
/// granted back (`TerminalOpen.window`, `TerminalOpened.window`).
pub const TERMINAL_WINDOW: u32 = 16;

/// Why the path of a live read cannot be sent as a `LiveRequest`: the one
/// check the hub makes before it puts a read on the stream and the agent
/// makes when it takes one, so that whatever the hub sends, the agent
/// accepts; a path that fails it is answered for that read alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LivePathError {
    #[error(
        "the path and query are {0} characters, over the {MAX_LIVE_PATH_LEN} a live read may have"
    )]
    TooLong(usize),
    #[error("the path must start with / and hold only printable ASCII (URL-encoded)")]
    Malformed,
}

impl LivePathError {
    /// The HTTP code a read with such a path is answered with: 414 (URI
    /// Too Long) or 400.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::TooLong(_) => 414,
            Self::Malformed => 400,
        }
    }
}

/// Checks the path (with its query) of one live read.
pub fn check_live_path(path: &str) -> Result<(), LivePathError> {
    if path.len() > MAX_LIVE_PATH_LEN {
        return Err(LivePathError::TooLong(path.len()));
    }
    if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(LivePathError::Malformed);
    }
    Ok(())
}

/// A payload or message over its limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error(
        "{what} is {} of JSON, over the {} limit of one object (what the Kubernetes API server stores): make it smaller",
        Bytes(*.size),
        Bytes(*.limit)
    )]
    Object {
        what: String,
        size: usize,
        limit: usize,
    },
    #[error(
        "a message of {} is over the {} limit of one message",
        Bytes(*.size),
        Bytes(*.limit)
    )]
    Message { size: usize, limit: usize },
}

impl From<SizeError> for tonic::Status {
    fn from(e: SizeError) -> Self {
        tonic::Status::resource_exhausted(e.to_string())
    }
}

/// Checks one object's JSON, e.g. `check_object_json("Application
/// argocd/guestbook", json.len())`. A failure is answered per object (an
/// `ACK_OUTCOME_REJECTED` acknowledgement), not by ending the stream.
pub fn check_object_json(what: &str, size: usize) -> Result<(), SizeError> {
    if size > MAX_OBJECT_JSON_BYTES {
        return Err(SizeError::Object {
            what: what.to_string(),
            size,
            limit: MAX_OBJECT_JSON_BYTES,
        });
    }
    Ok(())
}

/// Checks one encoded message before it is sent.
pub fn check_message(size: usize) -> Result<(), SizeError> {
    if size > MAX_MESSAGE_BYTES {
        return Err(SizeError::Message {
            size,
            limit: MAX_MESSAGE_BYTES,
        });
    }
    Ok(())
}

/// A byte count as people read it: `512 bytes`, `800.0 KiB`, `1.5 MiB`.
struct Bytes(usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KIB: f64 = 1024.0;
        let n = self.0 as f64;
        if self.0 < 1024 {
            write!(f, "{} bytes", self.0)
        } else if n < KIB * KIB {
            write!(f, "{:.1} KiB", n / KIB)
        } else {
            write!(f, "{:.1} MiB", n / (KIB * KIB))
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::v1::{
        AgentMessage, ObjectKey, ObjectMeta, ObservedApplication, StatusReport, agent_message,
        status_report,
    };

    #[test]
    fn byte_counts_read_well() {
        for (n, want) in [
            (0, "0 bytes"),
            (1023, "1023 bytes"),
            (1024, "1.0 KiB"),
            (800 * 1024, "800.0 KiB"),
            (MAX_OBJECT_JSON_BYTES, "1.5 MiB"),
            (MAX_MESSAGE_BYTES, "4.0 MiB"),
        ] {
            assert_eq!(Bytes(n).to_string(), want);
        }
    }

    #[test]
    fn object_limit() {
        assert_eq!(
            check_object_json("Application argocd/guestbook", MAX_OBJECT_JSON_BYTES),
            Ok(())
        );
        let err = check_object_json("Application argocd/guestbook", 2 * 1024 * 1024).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Application argocd/guestbook is 2.0 MiB of JSON, over the 1.5 MiB limit of one object (what the Kubernetes API server stores): make it smaller"
        );
    }

    #[test]
    fn message_limit() {
        assert_eq!(check_message(MAX_MESSAGE_BYTES), Ok(()));
        let status = tonic::Status::from(check_message(MAX_MESSAGE_BYTES + 1).unwrap_err());
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "a message of 4.0 MiB is over the 4.0 MiB limit of one message"
        );
    }

    #[test]
    fn a_live_path_is_checked_once_for_both_ends() {
        assert_eq!(
            check_live_path("/api/v1/namespaces/gb/pods/p/log?container=c"),
            Ok(())
        );
        let at_limit = format!("/{}", "a".repeat(MAX_LIVE_PATH_LEN - 1));
        assert_eq!(check_live_path(&at_limit), Ok(()));
        let long = format!(
            "/api/v1/namespaces/gb/pods/p/log?container={}",
            "c".repeat(6000)
        );
        let e = check_live_path(&long).unwrap_err();
        assert_eq!(e.http_status(), 414);
        assert!(e.to_string().contains("over the 4096"), "{e}");
        for bad in ["", "api/v1", "/api/v1 x", "/api/\u{e9}", "/a\nb"] {
            assert_eq!(
                check_live_path(bad).map_err(|e| e.http_status()),
                Err(400),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_largest_message_fits() {
        // An autonomous agent's report with both payloads at the object limit.
        let key = ObjectKey {
            namespace: "n".repeat(63),
            name: "a".repeat(253),
        };
        let report = AgentMessage {
            kind: Some(agent_message::Kind::Status(StatusReport {
                key: Some(key),
                seq: u64::MAX,
                state: Some(status_report::State::Observed(ObservedApplication {
                    meta: Some(ObjectMeta {
                        uid: "u".repeat(36),
                        resource_version: "9".repeat(20),
                        generation: i64::MAX,
                        version: "v".repeat(64),
                    }),
                    status_json: vec![b'x'; MAX_OBJECT_JSON_BYTES],
                    application_json: vec![b'x'; MAX_OBJECT_JSON_BYTES],
                    last_operation_id: "o".repeat(128),
                    hub_uid: "u".repeat(36),
                })),
                trace_parent: String::new(),
            })),
        };
        assert_eq!(check_message(report.encoded_len()), Ok(()));
    }
}
