//! The user's side of the hub's web terminal: a WebSocket client of the
//! live endpoint's exec, as client-go's WebSocket executor (what
//! argocd-server's terminal uses) opens it.

use std::sync::Arc;

use futures::StreamExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

use super::TIMEOUT;

/// The user's WebSocket.
pub type Ws = WebSocketStream<TlsStream<TcpStream>>;

/// Opens `path` of cluster `cluster` on the endpoint at `addr` as
/// client-go's WebSocket executor does (`method` GET, the subprotocols it
/// offers), presenting `token`: the WebSocket, or the refusal's code and
/// body.
pub async fn open(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    token: &str,
    cluster: &str,
    path: &str,
) -> Result<Ws, (u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let mut request = format!("wss://{addr}/clusters/{cluster}{path}")
        .into_client_request()
        .unwrap();
    let h = request.headers_mut();
    h.insert("authorization", format!("Bearer {token}").parse().unwrap());
    h.insert(
        "sec-websocket-protocol",
        "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap(),
    );
    match tokio_tungstenite::client_async(request, tls).await {
        Ok((ws, response)) => {
            assert_eq!(
                response.headers()["sec-websocket-protocol"],
                "v5.channel.k8s.io"
            );
            Ok(ws)
        }
        Err(tungstenite::Error::Http(response)) => {
            let body = response.body().clone().unwrap_or_default();
            Err((
                response.status().as_u16(),
                String::from_utf8_lossy(&body).into_owned(),
            ))
        }
        Err(e) => panic!("the handshake failed: {e}"),
    }
}

/// The next binary message of the user's WebSocket.
pub async fn next_frame(ws: &mut Ws) -> Vec<u8> {
    loop {
        match tokio::time::timeout(TIMEOUT, ws.next())
            .await
            .expect("a frame in time")
        {
            Some(Ok(Message::Binary(b))) => return b.to_vec(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("not a frame: {other:?}"),
        }
    }
}

/// The reason of the Close the user's WebSocket ends with.
pub async fn closed_with(ws: &mut Ws) -> String {
    loop {
        match tokio::time::timeout(TIMEOUT, ws.next())
            .await
            .expect("a close in time")
        {
            Some(Ok(Message::Close(Some(c)))) => return c.reason.to_string(),
            Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("not a Close: {other:?}"),
        }
    }
}
