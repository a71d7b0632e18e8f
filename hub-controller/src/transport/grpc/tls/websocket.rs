//! The hub's end of the WebSocket handshake on the gRPC port: a
//! connection that does not start with a TLS ClientHello is read as one
//! HTTP/1.1 request. Only `GET` [`PATH`] with a valid WebSocket upgrade is
//! answered `101`; anything else gets a short `400` or `404` and is closed.
//! Deciding is [`decide`] (no I/O); [`accept`] reads and answers.

use argocd_pull_runtime::websocket::{ByteStream, MAX_HEAD, PATH, derive_accept_key};
use base64::Engine;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Why a request gets no upgrade: the status it is answered with, and
/// what was wrong (for the hub's debug log; the client gets the status
/// line only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: &'static str,
}

impl Refusal {
    fn bad(reason: &'static str) -> Self {
        Self {
            status: 400,
            reason,
        }
    }

    /// The whole answer: a status line, no body, and the connection
    /// closed.
    pub fn response(&self) -> String {
        let text = match self.status {
            404 => "Not Found",
            _ => "Bad Request",
        };
        format!(
            "HTTP/1.1 {} {text}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.status
        )
    }
}

/// The `101` answer to a request whose `Sec-WebSocket-Key` was `key`.
pub fn switching(key: &str) -> String {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
        derive_accept_key(key.as_bytes())
    )
}

/// Whether the header list `value` (comma-separated) holds `token`,
/// compared without case.
fn has_token(value: &[u8], token: &str) -> bool {
    String::from_utf8_lossy(value)
        .split(',')
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// What to answer the request `head` (up to its blank line): the
/// client's `Sec-WebSocket-Key` when it is an upgrade to the wire, else
/// the refusal.
pub fn decide(head: &[u8]) -> Result<String, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(Refusal::bad("not an HTTP/1.1 request")),
    }
    let path = request.path.unwrap_or_default();
    if path.split('?').next() != Some(PATH) {
        return Err(Refusal {
            status: 404,
            reason: "not the WebSocket path",
        });
    }
    if request.method != Some("GET") || request.version != Some(1) {
        return Err(Refusal::bad("not GET over HTTP/1.1"));
    }
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    if !header("upgrade").is_some_and(|v| has_token(v, "websocket"))
        || !header("connection").is_some_and(|v| has_token(v, "upgrade"))
    {
        return Err(Refusal::bad("no WebSocket upgrade asked for"));
    }
    if header("sec-websocket-version") != Some(b"13".as_slice()) {
        return Err(Refusal::bad("not WebSocket version 13"));
    }
    let key = header("sec-websocket-key")
        .and_then(|k| std::str::from_utf8(k).ok())
        .map(str::trim)
        .filter(|k| {
            base64::engine::general_purpose::STANDARD
                .decode(k)
                .is_ok_and(|raw| raw.len() == 16)
        })
        .ok_or(Refusal::bad("no valid Sec-WebSocket-Key"))?;
    Ok(key.to_string())
}

/// Reads one request from `tcp` (at most [`MAX_HEAD`] bytes) and answers
/// it: the WebSocket on success, else the refusal it was sent.
pub async fn accept(mut tcp: TcpStream) -> std::io::Result<Result<ByteStream<TcpStream>, Refusal>> {
    let decided = match argocd_pull_runtime::net::read_head(&mut tcp, MAX_HEAD).await {
        Ok(head) => decide(&head),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            Err(Refusal::bad("a request head too long"))
        }
        Err(e) => return Err(e),
    };
    match decided {
        Ok(key) => {
            tcp.write_all(switching(&key).as_bytes()).await?;
            Ok(Ok(ByteStream::server(tcp).await))
        }
        Err(refusal) => {
            tcp.write_all(refusal.response().as_bytes()).await?;
            let _ = tcp.shutdown().await;
            Ok(Err(refusal))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

    fn request(method: &str, path: &str, extra: &str) -> Vec<u8> {
        format!("{method} {path} HTTP/1.1\r\nHost: hub:8443\r\n{extra}\r\n").into_bytes()
    }

    fn upgrade_headers() -> String {
        format!(
            "Upgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n"
        )
    }

    #[test]
    fn an_upgrade_to_the_path_is_switched_with_the_accept_key_of_rfc_6455() {
        assert_eq!(
            decide(&request("GET", PATH, &upgrade_headers())),
            Ok(KEY.into())
        );
        let answer = switching(KEY);
        assert!(answer.starts_with("HTTP/1.1 101 Switching Protocols\r\n"));
        assert!(answer.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
    }

    #[test]
    fn other_paths_are_not_found_and_everything_else_is_a_bad_request() {
        let status = |head: Vec<u8>| decide(&head).unwrap_err().status;
        assert_eq!(status(request("GET", "/", &upgrade_headers())), 404);
        assert_eq!(
            status(request("GET", "/argocd-pull/v1/wsx", &upgrade_headers())),
            404
        );
        assert_eq!(status(request("POST", PATH, &upgrade_headers())), 400);
        assert_eq!(status(request("GET", PATH, "")), 400);
        let no_key = upgrade_headers().replace(KEY, "short");
        assert_eq!(status(request("GET", PATH, &no_key)), 400);
        let old = upgrade_headers().replace("Version: 13", "Version: 8");
        assert_eq!(status(request("GET", PATH, &old)), 400);
        assert_eq!(status(b"\x16\x03\x01garbage\r\n\r\n".to_vec()), 400);
        let http10 = String::from_utf8(request("GET", PATH, &upgrade_headers()))
            .unwrap()
            .replace("HTTP/1.1", "HTTP/1.0");
        assert_eq!(status(http10.into_bytes()), 400);
    }

    #[test]
    fn a_refusal_is_a_status_line_and_a_closed_connection() {
        let r = Refusal::bad("x").response();
        assert_eq!(
            r,
            "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }
}
