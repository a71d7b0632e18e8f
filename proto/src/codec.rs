//! The codec of the wire contract: prost's encoding, with smaller buffers
//! than tonic's defaults (8 KiB to start, 32 KiB before a chunk is handed
//! to HTTP/2). A hub holds one stream per cluster, thousands of them, and
//! the buffers of an idle stream stay allocated: a heap profile of the
//! fleet benchmark (1,000 agents, docs/grpc.md) found about 50 KiB per
//! connection there, all from the defaults:
//!
//! - the encoding buffer, allocated at its starting size (8 KiB);
//! - the decoding buffer, grown to hold a whole HTTP/2 DATA frame and
//!   never shrunk (35 KiB). Its size follows the frames the peer sends,
//!   and the peer sends frames as large as the chunks its encoder yields:
//!   a burst of status reports went out as 32 KiB chunks, 16 KiB frames;
//! - HTTP/2's frame reader, grown the same way to hold a 16 KiB frame.
//!
//! Yielding a chunk once 1 KiB is encoded keeps both sides' frames about
//! one message large (a status report or a delivered copy is one to two
//! KiB), so the readers grow only to about two messages: with 4 KiB chunks
//! the decoding buffer still grew to 13 KiB and the encoding buffer to
//! 8 KiB per connection (a profile at 1,000 agents, docs/grpc.md). A
//! message larger than a chunk still goes whole (a chunk holds at least
//! one message), and tonic grows its buffers for it as before. HTTP/2
//! gathers the small frames into one write, so the socket sees no more
//! writes than before.

use std::marker::PhantomData;

use tonic::codec::BufferSettings;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Starting size of the encoding and decoding buffers of a stream.
pub const BUFFER_BYTES: usize = 1024;
/// A chunk is handed to HTTP/2 once this much is encoded.
pub const CHUNK_BYTES: usize = 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, CHUNK_BYTES)
}

/// Prost's codec with [`BUFFER_BYTES`] and [`CHUNK_BYTES`]; the generated
/// client and server use it (`proto/gen`'s `codec_path`).
#[derive(Debug, Clone)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{
        AgentMessage, ObjectKey, ObservedApplication, StatusReport, agent_message, status_report,
    };
    use http_body_util::{BodyExt, StreamBody};
    use tonic::codec::{Codec as _, EncodeBody, Streaming};

    /// A status report about as large as the fleet benchmark's (1.5 KiB).
    fn report(i: u64) -> AgentMessage {
        AgentMessage {
            kind: Some(agent_message::Kind::Status(StatusReport {
                key: Some(ObjectKey {
                    namespace: "argocd".into(),
                    name: format!("app-{i}"),
                }),
                seq: i,
                state: Some(status_report::State::Observed(ObservedApplication {
                    status_json: format!("{{\"health\":\"{}\"}}", "x".repeat(1500)).into_bytes(),
                    ..Default::default()
                })),
                trace_parent: String::new(),
            })),
        }
    }

    #[tokio::test]
    async fn a_burst_goes_out_in_chunks_of_about_one_message_and_comes_back_whole() {
        let sent: Vec<AgentMessage> = (0..40).map(report).collect();
        // A message on the wire: five bytes of gRPC framing, then its bytes.
        let framed = |m: &AgentMessage| prost::Message::encoded_len(m) + 5;
        let one = sent.iter().map(framed).max().unwrap_or(0);
        let mut codec = Codec::<AgentMessage, AgentMessage>::default();
        let body = EncodeBody::new_client(
            codec.encoder(),
            futures::stream::iter(sent.clone().into_iter().map(Ok)),
            None,
            None,
        );
        let frames: Vec<_> = body.collect().await.expect("encodes").to_bytes().into();
        assert_eq!(
            frames.len(),
            sent.iter().map(framed).sum::<usize>(),
            "every message, framed"
        );

        // The chunks as HTTP/2 would get them, and what a reader buffers.
        let mut body = std::pin::pin!(EncodeBody::new_client(
            codec.encoder(),
            futures::stream::iter(sent.clone().into_iter().map(Ok)),
            None,
            None,
        ));
        let mut chunks = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.expect("encodes").into_data() {
                chunks.push(data);
            }
        }
        let largest = chunks.iter().map(|c| c.len()).max().unwrap_or(0);
        assert!(
            chunks.len() >= sent.len() / 2,
            "{} chunks for {} messages",
            chunks.len(),
            sent.len()
        );
        assert!(
            largest <= CHUNK_BYTES + one,
            "a chunk of {largest} bytes: more than {CHUNK_BYTES} plus one message ({one})"
        );

        let frames = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, tonic::Status>(http_body::Frame::data(c))),
        );
        let mut received =
            Streaming::new_request(codec.decoder(), StreamBody::new(frames), None, None);
        let mut got = Vec::new();
        while let Some(m) = received.message().await.expect("decodes") {
            got.push(m);
        }
        assert_eq!(got, sent);
    }
}
