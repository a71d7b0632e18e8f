//! The name of each message kind, as both sides label their message
//! counters (`..._messages_total{kind}`), so the hub's and the agent's
//! series line up.

use crate::v1::{AgentMessage, HubMessage, agent_message, hub_message};

impl AgentMessage {
    pub fn kind_name(&self) -> &'static str {
        use agent_message::Kind;
        match &self.kind {
            None => "unknown",
            Some(Kind::Hello(_)) => "hello",
            Some(Kind::Status(_)) => "status",
            Some(Kind::ObjectAck(_)) => "object_ack",
            Some(Kind::OperationAck(_)) => "operation_ack",
            Some(Kind::Digest(_)) => "digest",
            Some(Kind::ResyncRequest(_)) => "resync_request",
            Some(Kind::Heartbeat(_)) => "heartbeat",
            Some(Kind::ProjectSetAck(_)) => "project_set_ack",
            Some(Kind::Tree(_)) => "tree",
            Some(Kind::LiveResponse(_)) => "live_response",
            Some(Kind::TerminalOpened(_)) => "terminal_opened",
            Some(Kind::TerminalData(_)) => "terminal_data",
            Some(Kind::TerminalCredit(_)) => "terminal_credit",
            Some(Kind::TerminalClose(_)) => "terminal_close",
        }
    }
}

impl HubMessage {
    pub fn kind_name(&self) -> &'static str {
        use hub_message::Kind;
        match &self.kind {
            None => "unknown",
            Some(Kind::Welcome(_)) => "welcome",
            Some(Kind::Upsert(_)) => "upsert",
            Some(Kind::Delete(_)) => "delete",
            Some(Kind::Operation(_)) => "operation",
            Some(Kind::ObjectAck(_)) => "object_ack",
            Some(Kind::Digest(_)) => "digest",
            Some(Kind::ResyncRequest(_)) => "resync_request",
            Some(Kind::Heartbeat(_)) => "heartbeat",
            Some(Kind::ProjectSet(_)) => "project_set",
            Some(Kind::LiveRequest(_)) => "live_request",
            Some(Kind::LiveCancel(_)) => "live_cancel",
            Some(Kind::LiveCredit(_)) => "live_credit",
            Some(Kind::TerminalOpen(_)) => "terminal_open",
            Some(Kind::TerminalData(_)) => "terminal_data",
            Some(Kind::TerminalCredit(_)) => "terminal_credit",
            Some(Kind::TerminalClose(_)) => "terminal_close",
        }
    }
}
