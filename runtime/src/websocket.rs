//! The WebSocket wire as a byte pipe: binary messages carry the bytes of
//! the TLS connection (and the HTTP/2 and gRPC inside it) that the agent
//! and the hub otherwise speak over TCP, so that an HTTP/1.1-only proxy
//! between them passes the connection as a WebSocket. Both ends use
//! [`ByteStream`]; the handshakes are the agent's (client) and the hub's
//! (server) business.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Bytes, Message};

pub use tokio_tungstenite::tungstenite::Error;
pub use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// The path the hub serves the WebSocket wire on, on its gRPC port.
pub const PATH: &str = "/argocd-pull/v1/ws";
/// The largest frame (and message) either end sends or takes: HTTP/2
/// above cuts its frames to 16 KiB and TLS its records likewise, so a
/// larger one comes from no peer of ours.
pub const MAX_FRAME: usize = 64 * 1024;
/// The longest HTTP head (request or answer) either end reads.
pub const MAX_HEAD: usize = 8 * 1024;

/// Frames and messages of at most [`MAX_FRAME`], written when flushed.
pub fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_frame_size(Some(MAX_FRAME))
        .max_message_size(Some(MAX_FRAME))
}

/// A WebSocket whose binary messages are read and written as a byte
/// stream. Pings are answered (by tungstenite, at the next read or
/// flush), a Close or the end of the connection reads as the end of the
/// stream, a text message is an error, and shutting the stream down sends
/// a Close.
pub struct ByteStream<S> {
    ws: WebSocketStream<S>,
    /// What the last message held and was not read yet.
    pending: Bytes,
    ended: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> ByteStream<S> {
    /// Wraps a WebSocket whose handshake is done.
    pub fn new(ws: WebSocketStream<S>) -> Self {
        Self {
            ws,
            pending: Bytes::new(),
            ended: false,
        }
    }

    /// The server's end of `stream`, after its `101` was sent.
    pub async fn server(stream: S) -> Self {
        Self::new(WebSocketStream::from_raw_socket(stream, Role::Server, Some(config())).await)
    }

    /// The stream the WebSocket runs on.
    pub fn get_ref(&self) -> &S {
        self.ws.get_ref()
    }
}

/// A WebSocket error as the I/O error the layers above understand.
fn io_error(e: Error) -> io::Error {
    match e {
        Error::Io(e) => e,
        Error::ConnectionClosed | Error::AlreadyClosed => io::ErrorKind::BrokenPipe.into(),
        e => io::Error::new(io::ErrorKind::InvalidData, e),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for ByteStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                let part = self.pending.split_to(n);
                buf.put_slice(&part);
                return Poll::Ready(Ok(()));
            }
            if self.ended {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => self.pending = data,
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Close(_))) | None => self.ended = true,
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a text message on the WebSocket wire, which carries binary ones only",
                    )));
                }
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ByteStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(io_error)?;
        let n = buf.len().min(MAX_FRAME);
        Pin::new(&mut self.ws)
            .start_send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
            .map_err(io_error)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(io_error)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.ws).poll_close(cx)) {
            Ok(()) | Err(Error::ConnectionClosed | Error::AlreadyClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Two ends of a WebSocket over an in-memory pipe.
    async fn pair() -> (
        ByteStream<tokio::io::DuplexStream>,
        WebSocketStream<tokio::io::DuplexStream>,
    ) {
        let (a, b) = tokio::io::duplex(1 << 20);
        let server = ByteStream::server(a).await;
        let client = WebSocketStream::from_raw_socket(b, Role::Client, Some(config())).await;
        (server, client)
    }

    #[tokio::test]
    async fn bytes_cross_as_binary_messages_of_at_most_a_frame() {
        use futures::StreamExt;
        let (mut server, mut client) = pair().await;
        let big = vec![7u8; MAX_FRAME + 10];
        server.write_all(&big).await.unwrap();
        server.flush().await.unwrap();
        let mut sizes = Vec::new();
        while sizes.iter().sum::<usize>() < big.len() {
            match client.next().await.unwrap().unwrap() {
                Message::Binary(b) => sizes.push(b.len()),
                m => panic!("{m:?}"),
            }
        }
        assert_eq!(sizes, vec![MAX_FRAME, 10]);
    }

    #[tokio::test]
    async fn pings_are_answered_and_a_close_ends_the_stream() {
        use futures::{SinkExt, StreamExt};
        let (mut server, mut client) = pair().await;
        client
            .send(Message::Ping(Bytes::from_static(b"hi")))
            .await
            .unwrap();
        client
            .send(Message::Binary(Bytes::from_static(b"abc")))
            .await
            .unwrap();
        let mut got = [0u8; 3];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abc");
        server.flush().await.unwrap();
        match client.next().await.unwrap().unwrap() {
            Message::Pong(p) => assert_eq!(&p[..], b"hi"),
            m => panic!("{m:?}"),
        }
        client.close(None).await.unwrap();
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn a_text_message_is_refused() {
        use futures::SinkExt;
        let (mut server, mut client) = pair().await;
        client.send(Message::text("hello")).await.unwrap();
        let e = server.read_u8().await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
