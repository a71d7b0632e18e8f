//! The exec of a terminal session on the cluster's API server: a WebSocket
//! of `v5.channel.k8s.io`, asked with the agent's own identity through its
//! Kubernetes client (as kube-rs's `ws` feature does it, on the
//! tokio-tungstenite the agent already has).

use argocd_pull_core::live::Refusal;
use argocd_pull_core::live::exec::PROTOCOL;
use argocd_pull_proto::v1::TerminalOpen;
use http::header;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// The exec's WebSocket.
pub type Exec = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// The path and query of `open`'s exec, as client-go asks it.
pub fn path(open: &TerminalOpen) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for word in &open.command {
        query.append_pair("command", word);
    }
    query.append_pair("container", &open.container);
    for (name, on) in [
        ("stdin", open.stdin),
        ("stdout", open.stdout),
        ("stderr", open.stderr),
        ("tty", open.tty),
    ] {
        if on {
            query.append_pair(name, "true");
        }
    }
    format!(
        "/api/v1/namespaces/{}/pods/{}/exec?{}",
        open.namespace,
        open.pod,
        query.finish()
    )
}

/// Opens `open`'s exec; or the cluster's refusal (its status and message).
pub async fn exec(client: &kube::Client, open: &TerminalOpen) -> Result<Exec, Refusal> {
    let key = generate_key();
    let request = http::Request::get(path(open))
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_KEY, &key)
        .header(header::SEC_WEBSOCKET_PROTOCOL, PROTOCOL)
        .body(kube::client::Body::empty())
        .expect("a valid request");
    let response = client
        .send(request)
        .await
        .map_err(|e| Refusal::new(502, format!("cannot reach the cluster's API server: {e}")))?;
    let status = response.status();
    if status != http::StatusCode::SWITCHING_PROTOCOLS {
        let body = response
            .into_body()
            .collect_bytes()
            .await
            .unwrap_or_default();
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("message")?.as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        let code = if status.is_client_error() || status.is_server_error() {
            status.as_u16()
        } else {
            502
        };
        return Err(Refusal::new(
            code,
            format!("the cluster's API server refused the exec: {message}"),
        ));
    }
    let accept = argocd_pull_runtime::websocket::derive_accept_key(key.as_bytes());
    let headers = response.headers();
    let accepted = headers
        .get(header::SEC_WEBSOCKET_ACCEPT)
        .map(|v| v.as_bytes())
        == Some(accept.as_bytes());
    let protocol = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .map(|v| v.as_bytes());
    if !accepted || protocol != Some(PROTOCOL.as_bytes()) {
        return Err(Refusal::new(
            502,
            format!(
                "the cluster's API server did not answer the exec as a WebSocket of {PROTOCOL}"
            ),
        ));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| Refusal::new(502, format!("the cluster's exec did not upgrade: {e}")))?;
    let config = argocd_pull_runtime::websocket::config();
    Ok(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, Some(config)).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exec_is_asked_as_client_go_asks_it() {
        let open = TerminalOpen {
            namespace: "gb".into(),
            pod: "web-1".into(),
            container: "main".into(),
            command: vec!["sh".into(), "-c".into(), "echo a b".into()],
            stdin: true,
            stdout: true,
            tty: true,
            ..Default::default()
        };
        assert_eq!(
            path(&open),
            "/api/v1/namespaces/gb/pods/web-1/exec?command=sh&command=-c&command=echo+a+b&container=main&stdin=true&stdout=true&tty=true"
        );
    }
}
