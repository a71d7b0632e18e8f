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
//! Yielding a chunk once 4 KiB are encoded keeps both sides' frames about
//! that small, so both readers stay at their starting size; a message
//! larger than that still goes whole (a chunk holds at least one message),
//! and tonic grows its buffers for it as before.

use std::marker::PhantomData;

use tonic::codec::BufferSettings;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Starting size of the encoding and decoding buffers of a stream.
pub const BUFFER_BYTES: usize = 1024;
/// A chunk is handed to HTTP/2 once this much is encoded.
pub const CHUNK_BYTES: usize = 4096;

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
