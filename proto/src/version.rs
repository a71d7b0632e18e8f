//! Protocol version and capability negotiation (the Hello/Welcome exchange).
//!
//! Each release speaks its own protocol version and the one before it, so a
//! hub and its agents may be one release apart in either direction while a
//! fleet is upgraded: the hub picks the highest version both ranges contain.
//! Optional features that old peers may ignore are capabilities, not
//! versions; the session gets the ones both sides listed.

use std::time::Duration;
use std::{collections::BTreeSet, fmt};

use crate::v1::{AgentMode, Hello, Welcome};

/// The protocol version this release speaks natively.
pub const PROTOCOL_VERSION: u32 = 1;

/// The oldest protocol version this release still speaks: one behind
/// [`PROTOCOL_VERSION`], and never below 1.
pub const MIN_PROTOCOL_VERSION: u32 = if PROTOCOL_VERSION > 1 {
    PROTOCOL_VERSION - 1
} else {
    1
};

/// The agent can terminate a running sync (`OperationRequest.terminate`).
pub const CAPABILITY_TERMINATE_OPERATION: &str = "terminate-operation";

/// The agent never overwrites or deletes an Application it did not deliver
/// for the hub Application a message is about: it refuses the upsert with
/// `ObjectAck.owner_conflict`, runs a command only where
/// `OperationRequest.hub_uid` matches, and reports `ObservedApplication.hub_uid`.
pub const CAPABILITY_OWNER_CHECK: &str = "owner-check";

/// Managed mode: the hub sends the AppProjects and project-scoped
/// credentials the cluster's Applications use (`ProjectSet`), the agent
/// keeps them on its cluster and answers with `ProjectSetAck`.
pub const CAPABILITY_PROJECTS: &str = "projects";

/// Managed mode: the agent sends the resource tree of each Application it
/// applied (`ResourceTreeReport`), read from its cluster's Argo CD Redis.
/// Offered only by an agent that reads that Redis and by a hub that writes
/// trees for its argocd-server; so never part of [`CAPABILITIES`].
pub const CAPABILITY_TREES: &str = "trees";

/// Managed mode: the hub forwards reads of its argocd-server's live views
/// (`LiveRequest`: a live object, its events, a pod's log) to the agent,
/// which answers them (`LiveResponse`) for objects of Applications it
/// applied. Offered only by a hub with a live endpoint and an agent that
/// serves them; so never part of [`CAPABILITIES`].
pub const CAPABILITY_LIVE_VIEWS: &str = "live-views";

/// With `live-views`: the answer to a `LiveRequest` flows by credits
/// (`LiveRequest.window`, `LiveCredit`), so that a slow reader makes the
/// agent wait instead of being cut off. Offered with `live-views` by a hub
/// and an agent of this release; a hub without it cuts a reader off after
/// the chunks it holds, an agent without it sends without waiting.
pub const CAPABILITY_LIVE_CREDITS: &str = "live-credits";

/// Managed mode, with `live-views`: the hub relays its argocd-server's web
/// terminal (an exec into a pod) to the agent (`TerminalOpen`,
/// `TerminalData`, `TerminalCredit`, `TerminalClose`), which execs only
/// into pods of Applications it applied. Offered only by a hub with a live
/// endpoint and an agent started with `--terminal`; so never part of
/// [`CAPABILITIES`].
pub const CAPABILITY_TERMINAL: &str = "terminal";

/// Every capability this release implements, offered by default.
pub const CAPABILITIES: &[&str] = &[
    CAPABILITY_TERMINATE_OPERATION,
    CAPABILITY_OWNER_CHECK,
    CAPABILITY_PROJECTS,
];

/// At most this many capabilities in one Hello.
pub const MAX_CAPABILITIES: usize = 64;

/// At most this many characters in one capability name.
pub const MAX_CAPABILITY_LEN: usize = 63;

/// An inclusive range of protocol versions, `min <= max`, both at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolRange {
    min: u32,
    max: u32,
}

impl ProtocolRange {
    /// The versions this release speaks.
    pub const SUPPORTED: ProtocolRange = ProtocolRange {
        min: MIN_PROTOCOL_VERSION,
        max: PROTOCOL_VERSION,
    };

    pub fn new(min: u32, max: u32) -> Result<Self, NegotiationError> {
        if min == 0 || min > max {
            return Err(NegotiationError::Malformed(format!(
                "protocol range {min}..={max} is empty or starts at 0 (versions start at 1)"
            )));
        }
        Ok(Self { min, max })
    }

    pub fn min(self) -> u32 {
        self.min
    }

    pub fn max(self) -> u32 {
        self.max
    }

    pub fn contains(self, version: u32) -> bool {
        (self.min..=self.max).contains(&version)
    }
}

impl fmt::Display for ProtocolRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}..={}", self.min, self.max)
        }
    }
}

/// What a hub accepts from agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubOffer {
    pub range: ProtocolRange,
    pub capabilities: BTreeSet<String>,
    /// The agent modes this hub serves.
    pub modes: Vec<AgentMode>,
    /// The hub's heartbeat interval: what an agent gets unless it asks
    /// for a shorter one.
    pub heartbeat: Duration,
    /// The shortest interval an agent may ask for.
    pub heartbeat_min: Duration,
}

impl Default for HubOffer {
    /// This release: its protocol range, every capability, both modes.
    fn default() -> Self {
        Self {
            range: ProtocolRange::SUPPORTED,
            capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
            modes: vec![AgentMode::Managed, AgentMode::Autonomous],
            heartbeat: DEFAULT_HEARTBEAT,
            heartbeat_min: DEFAULT_HEARTBEAT_MIN,
        }
    }
}

/// The hub's heartbeat interval unless configured.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// The shortest heartbeat interval a hub grants unless configured.
pub const DEFAULT_HEARTBEAT_MIN: Duration = Duration::from_secs(2);

/// What the two sides agreed on for one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub version: u32,
    pub capabilities: BTreeSet<String>,
    pub mode: AgentMode,
    /// The stream's heartbeat interval: each side sends a Heartbeat after
    /// this long without sending, and ends the stream after three without
    /// receiving.
    pub heartbeat: Duration,
}

impl Negotiated {
    pub fn has(&self, capability: &str) -> bool {
        self.capabilities.contains(capability)
    }
}

/// Why a handshake failed. The messages are meant for the operator reading
/// the agent's log or the hub's event, and say what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NegotiationError {
    #[error("malformed handshake: {0}")]
    Malformed(String),
    #[error("agent speaks protocol {agent}, hub supports {hub}: upgrade the agent")]
    AgentTooOld {
        agent: ProtocolRange,
        hub: ProtocolRange,
    },
    #[error("agent speaks protocol {agent}, hub supports {hub}: upgrade the hub")]
    AgentTooNew {
        agent: ProtocolRange,
        hub: ProtocolRange,
    },
    #[error(
        "agent runs in {} mode, which this hub does not serve (it serves: {}): change the agent's mode or the hub's configuration",
        mode_name(*.mode),
        .accepted.iter().map(|m| mode_name(*m)).collect::<Vec<_>>().join(", ")
    )]
    ModeNotServed {
        mode: AgentMode,
        accepted: Vec<AgentMode>,
    },
    #[error(
        "hub chose protocol {chosen}, outside the agent's {agent}: the hub does not follow the protocol"
    )]
    WelcomeOutOfRange { chosen: u32, agent: ProtocolRange },
    #[error(
        "hub enabled capability {0:?}, which the agent did not offer: the hub does not follow the protocol"
    )]
    CapabilityNotOffered(String),
}

impl From<NegotiationError> for tonic::Status {
    fn from(e: NegotiationError) -> Self {
        match e {
            NegotiationError::Malformed(_) => tonic::Status::invalid_argument(e.to_string()),
            _ => tonic::Status::failed_precondition(e.to_string()),
        }
    }
}

/// The name of a mode as operators write it.
pub fn mode_name(mode: AgentMode) -> &'static str {
    match mode {
        AgentMode::Unspecified => "unspecified",
        AgentMode::Managed => "managed",
        AgentMode::Autonomous => "autonomous",
    }
}

/// The Hello an agent of this release sends.
pub fn hello(mode: AgentMode, agent_version: &str) -> Hello {
    Hello {
        min_protocol_version: ProtocolRange::SUPPORTED.min(),
        max_protocol_version: ProtocolRange::SUPPORTED.max(),
        capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
        mode: mode as i32,
        agent_version: agent_version.to_string(),
        heartbeat_interval_seconds: 0,
    }
}

/// The hub's side: checks an agent's Hello against what the hub offers and
/// picks the highest common version and the common capabilities.
pub fn negotiate(hub: &HubOffer, hello: &Hello) -> Result<Negotiated, NegotiationError> {
    let agent = ProtocolRange::new(hello.min_protocol_version, hello.max_protocol_version)
        .map_err(|e| prefixed("Hello", e))?;
    let mode = mode_of(hello.mode)?;
    let offered = capabilities(&hello.capabilities)?;

    if agent.max < hub.range.min {
        return Err(NegotiationError::AgentTooOld {
            agent,
            hub: hub.range,
        });
    }
    if agent.min > hub.range.max {
        return Err(NegotiationError::AgentTooNew {
            agent,
            hub: hub.range,
        });
    }
    if !hub.modes.contains(&mode) {
        return Err(NegotiationError::ModeNotServed {
            mode,
            accepted: hub.modes.clone(),
        });
    }
    Ok(Negotiated {
        version: agent.max.min(hub.range.max),
        capabilities: offered.intersection(&hub.capabilities).cloned().collect(),
        mode,
        heartbeat: heartbeat(hello.heartbeat_interval_seconds, hub),
    })
}

/// The heartbeat interval of a stream whose agent asked for `asked`
/// seconds (0: nothing asked): the hub's, or the shorter one asked for,
/// but never below the hub's floor. An agent cannot make the hub wait
/// longer for a dead stream than the hub's own interval allows, nor have
/// it send more often than the floor.
pub fn heartbeat(asked: u32, hub: &HubOffer) -> Duration {
    let own = hub.heartbeat.max(Duration::from_secs(1));
    if asked == 0 {
        return own;
    }
    Duration::from_secs(u64::from(asked))
        .max(hub.heartbeat_min)
        .min(own)
}

/// The agent's side: checks the hub's Welcome against the Hello the agent
/// sent, so a misbehaving hub is caught at once rather than by a confusing
/// failure later.
pub fn accept_welcome(sent: &Hello, welcome: &Welcome) -> Result<Negotiated, NegotiationError> {
    let agent = ProtocolRange::new(sent.min_protocol_version, sent.max_protocol_version)
        .map_err(|e| prefixed("Hello", e))?;
    if !agent.contains(welcome.protocol_version) {
        return Err(NegotiationError::WelcomeOutOfRange {
            chosen: welcome.protocol_version,
            agent,
        });
    }
    let enabled = capabilities(&welcome.capabilities)?;
    if let Some(extra) = enabled.iter().find(|c| !sent.capabilities.contains(c)) {
        return Err(NegotiationError::CapabilityNotOffered(extra.clone()));
    }
    if welcome.heartbeat_interval_seconds == 0 || welcome.max_message_bytes == 0 {
        return Err(NegotiationError::Malformed(
            "Welcome.heartbeat_interval_seconds and Welcome.max_message_bytes must be set".into(),
        ));
    }
    Ok(Negotiated {
        version: welcome.protocol_version,
        capabilities: enabled,
        mode: mode_of(sent.mode)?,
        heartbeat: Duration::from_secs(u64::from(welcome.heartbeat_interval_seconds)),
    })
}

fn prefixed(message: &str, e: NegotiationError) -> NegotiationError {
    match e {
        NegotiationError::Malformed(m) => NegotiationError::Malformed(format!("{message}: {m}")),
        other => other,
    }
}

fn mode_of(raw: i32) -> Result<AgentMode, NegotiationError> {
    match AgentMode::try_from(raw) {
        Ok(AgentMode::Unspecified) => Err(NegotiationError::Malformed(
            "Hello.mode is unspecified: the agent must say managed or autonomous".into(),
        )),
        Ok(mode) => Ok(mode),
        Err(_) => Err(NegotiationError::Malformed(format!(
            "Hello.mode {raw} is not a known agent mode"
        ))),
    }
}

/// Checks capability names and collects them (duplicates collapse).
fn capabilities(names: &[String]) -> Result<BTreeSet<String>, NegotiationError> {
    if names.len() > MAX_CAPABILITIES {
        return Err(NegotiationError::Malformed(format!(
            "{} capabilities, at most {MAX_CAPABILITIES} are allowed",
            names.len()
        )));
    }
    for name in names {
        let valid = !name.is_empty()
            && name.len() <= MAX_CAPABILITY_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !valid {
            return Err(NegotiationError::Malformed(format!(
                "capability {name:?} is not a valid name (1 to {MAX_CAPABILITY_LEN} of a-z 0-9 . -)"
            )));
        }
    }
    Ok(names.iter().cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(min: u32, max: u32) -> ProtocolRange {
        ProtocolRange::new(min, max).unwrap()
    }

    fn offer(min: u32, max: u32, caps: &[&str]) -> HubOffer {
        HubOffer {
            range: range(min, max),
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
            modes: vec![AgentMode::Managed, AgentMode::Autonomous],
            ..HubOffer::default()
        }
    }

    fn hello_with(min: u32, max: u32, caps: &[&str], mode: AgentMode) -> Hello {
        Hello {
            min_protocol_version: min,
            max_protocol_version: max,
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
            mode: mode as i32,
            agent_version: "test".into(),
            heartbeat_interval_seconds: 0,
        }
    }

    #[test]
    fn an_agent_shortens_the_heartbeat_down_to_the_floor_and_never_lengthens_it() {
        let hub = HubOffer::default();
        let secs = Duration::from_secs;
        for (asked, want) in [
            (0, 10),
            (5, 5),
            (2, 2),
            (1, 2),
            (10, 10),
            (30, 10),
            (u32::MAX, 10),
        ] {
            assert_eq!(heartbeat(asked, &hub), secs(want), "asked {asked}");
        }
        let hello = Hello {
            heartbeat_interval_seconds: 4,
            ..hello(AgentMode::Managed, "x")
        };
        assert_eq!(negotiate(&hub, &hello).unwrap().heartbeat, secs(4));
        let welcome = Welcome {
            protocol_version: PROTOCOL_VERSION,
            heartbeat_interval_seconds: 4,
            max_message_bytes: 1,
            ..Welcome::default()
        };
        assert_eq!(accept_welcome(&hello, &welcome).unwrap().heartbeat, secs(4));
    }

    #[test]
    fn supported_range_is_current_and_one_before() {
        assert_eq!(ProtocolRange::SUPPORTED.max(), PROTOCOL_VERSION);
        assert_eq!(
            ProtocolRange::SUPPORTED.min(),
            PROTOCOL_VERSION.saturating_sub(1).max(1)
        );
        // This release's own Hello is accepted by this release's hub.
        let n = negotiate(&HubOffer::default(), &hello(AgentMode::Managed, "x")).unwrap();
        assert_eq!(n.version, PROTOCOL_VERSION);
        assert!(n.has(CAPABILITY_TERMINATE_OPERATION));
    }

    #[test]
    fn version_negotiation() {
        use AgentMode::Managed;
        // hub range, agent range, expected version or error message
        type Case = ((u32, u32), (u32, u32), Result<u32, &'static str>);
        let cases: &[Case] = &[
            ((1, 1), (1, 1), Ok(1)),
            // hub at 2 (speaks 1..=2), agent one release behind
            ((1, 2), (1, 1), Ok(1)),
            // hub at 2, agent one release ahead (speaks 2..=3)
            ((1, 2), (2, 3), Ok(2)),
            // both at 2
            ((1, 2), (1, 2), Ok(2)),
            // two releases apart: no overlap
            (
                (1, 2),
                (3, 4),
                Err("agent speaks protocol 3..=4, hub supports 1..=2: upgrade the hub"),
            ),
            (
                (1, 2),
                (3, 3),
                Err("agent speaks protocol 3, hub supports 1..=2: upgrade the hub"),
            ),
            (
                (3, 4),
                (1, 2),
                Err("agent speaks protocol 1..=2, hub supports 3..=4: upgrade the agent"),
            ),
            (
                (1, 1),
                (0, 1),
                Err(
                    "malformed handshake: Hello: protocol range 0..=1 is empty or starts at 0 (versions start at 1)",
                ),
            ),
            (
                (1, 1),
                (2, 1),
                Err(
                    "malformed handshake: Hello: protocol range 2..=1 is empty or starts at 0 (versions start at 1)",
                ),
            ),
        ];
        for ((hmin, hmax), (amin, amax), want) in cases {
            let got = negotiate(
                &offer(*hmin, *hmax, &[]),
                &hello_with(*amin, *amax, &[], Managed),
            )
            .map(|n| n.version)
            .map_err(|e| e.to_string());
            assert_eq!(
                got,
                want.map_err(str::to_string),
                "hub {hmin}..={hmax}, agent {amin}..={amax}"
            );
        }
    }

    #[test]
    fn capabilities_are_intersected_and_unknown_ones_ignored() {
        let hub = offer(1, 1, &["a", "b", "c"]);
        let n = negotiate(
            &hub,
            &hello_with(1, 1, &["b", "c", "future-thing", "b"], AgentMode::Managed),
        )
        .unwrap();
        assert_eq!(
            n.capabilities.into_iter().collect::<Vec<_>>(),
            vec!["b".to_string(), "c".to_string()]
        );
    }

    #[test]
    fn malformed_hellos() {
        let hub = HubOffer::default();
        let too_many: Vec<String> = (0..=MAX_CAPABILITIES).map(|i| format!("c{i}")).collect();
        let long = "a".repeat(MAX_CAPABILITY_LEN + 1);
        let cases: Vec<(Hello, &str)> = vec![
            (
                hello_with(1, 1, &[], AgentMode::Unspecified),
                "malformed handshake: Hello.mode is unspecified: the agent must say managed or autonomous",
            ),
            (
                Hello {
                    mode: 7,
                    ..hello_with(1, 1, &[], AgentMode::Managed)
                },
                "malformed handshake: Hello.mode 7 is not a known agent mode",
            ),
            (
                hello_with(1, 1, &["Upper"], AgentMode::Managed),
                "malformed handshake: capability \"Upper\" is not a valid name (1 to 63 of a-z 0-9 . -)",
            ),
            (
                hello_with(1, 1, &[""], AgentMode::Managed),
                "malformed handshake: capability \"\" is not a valid name (1 to 63 of a-z 0-9 . -)",
            ),
            (
                hello_with(1, 1, &[long.as_str()], AgentMode::Managed),
                "is not a valid name",
            ),
            (
                Hello {
                    capabilities: too_many,
                    ..hello_with(1, 1, &[], AgentMode::Managed)
                },
                "malformed handshake: 65 capabilities, at most 64 are allowed",
            ),
        ];
        for (hello, want) in cases {
            let err = negotiate(&hub, &hello).unwrap_err();
            assert!(
                err.to_string().contains(want),
                "{err} does not contain {want}"
            );
            assert_eq!(
                tonic::Status::from(err).code(),
                tonic::Code::InvalidArgument
            );
        }
    }

    #[test]
    fn mode_the_hub_does_not_serve() {
        let hub = HubOffer {
            modes: vec![AgentMode::Managed],
            ..HubOffer::default()
        };
        let err = negotiate(&hub, &hello(AgentMode::Autonomous, "x")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent runs in autonomous mode, which this hub does not serve (it serves: managed): change the agent's mode or the hub's configuration"
        );
        assert_eq!(
            tonic::Status::from(err).code(),
            tonic::Code::FailedPrecondition
        );
    }

    #[test]
    fn version_mismatch_is_a_failed_precondition() {
        let err = negotiate(
            &offer(1, 1, &[]),
            &hello_with(2, 2, &[], AgentMode::Managed),
        )
        .unwrap_err();
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "agent speaks protocol 2, hub supports 1: upgrade the hub"
        );
    }

    fn welcome(version: u32, caps: &[&str]) -> Welcome {
        Welcome {
            protocol_version: version,
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
            hub_version: "test".into(),
            heartbeat_interval_seconds: 10,
            digest_interval_seconds: 300,
            max_message_bytes: 4 << 20,
        }
    }

    #[test]
    fn agent_checks_the_welcome() {
        let sent = hello_with(1, 2, &["a", "b"], AgentMode::Autonomous);
        let ok = accept_welcome(&sent, &welcome(2, &["b"])).unwrap();
        assert_eq!(ok.version, 2);
        assert_eq!(ok.mode, AgentMode::Autonomous);
        assert!(ok.has("b") && !ok.has("a"));

        let cases: &[(Welcome, &str)] = &[
            (
                welcome(3, &[]),
                "hub chose protocol 3, outside the agent's 1..=2: the hub does not follow the protocol",
            ),
            (
                welcome(1, &["c"]),
                "hub enabled capability \"c\", which the agent did not offer: the hub does not follow the protocol",
            ),
            (
                Welcome {
                    heartbeat_interval_seconds: 0,
                    ..welcome(1, &[])
                },
                "malformed handshake: Welcome.heartbeat_interval_seconds and Welcome.max_message_bytes must be set",
            ),
        ];
        for (w, want) in cases {
            assert_eq!(accept_welcome(&sent, w).unwrap_err().to_string(), *want);
        }
    }

    #[test]
    fn negotiated_welcome_is_accepted_by_the_agent() {
        // What the hub decides, the agent accepts: the two functions agree.
        for (hub_caps, agent_caps) in [
            (&["a", "b"][..], &["b", "c"][..]),
            (&[][..], &["a"][..]),
            (&["a"][..], &[][..]),
        ] {
            let sent = hello_with(1, 1, agent_caps, AgentMode::Managed);
            let n = negotiate(&offer(1, 1, hub_caps), &sent).unwrap();
            let caps: Vec<&str> = n.capabilities.iter().map(String::as_str).collect();
            assert_eq!(
                accept_welcome(&sent, &welcome(n.version, &caps)).unwrap(),
                n
            );
        }
    }
}
