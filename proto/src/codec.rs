//! The gRPC codec of Drover's own services: prost, with 1 KiB message buffers instead of
//! tonic's 8 KiB. Every long-lived stream (a host's plan and task watches, heartbeats) holds
//! one such buffer at each end for as long as the agent is connected; Drover's messages are
//! small, and a large one (a plan with files) grows its buffer as it needs.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Bytes a stream's buffer starts with.
const BUFFER: usize = 1024;
/// tonic's default: how much is encoded before the stream yields to the transport.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with small buffers; the generated stubs name it (`codec_path`).
#[derive(Debug)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BUFFER, YIELD_THRESHOLD))
    }
}
