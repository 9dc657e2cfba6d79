//! The typed header that starts every stream, and the reply that acknowledges it.
//!
//! Both are protobuf messages prefixed by their varint length. They are read a byte at a time
//! up to the length so nothing after them (the stream's payload) is consumed, and under a
//! timeout, so a peer that opens a stream and goes quiet cannot hold a task forever.

use std::time::Duration;

use prost::Message;
use proto::tunnel::v1::{StreamError, StreamHeader, StreamReply, stream_error::Kind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest header or reply accepted; real ones are a few dozen bytes.
const MAX_HEADER_LEN: usize = 4096;

/// How long either side waits for the other's header or reply.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub(crate) enum HeaderError {
    #[error("stream closed before its header arrived")]
    Closed,
    #[error("header of {0} bytes exceeds the {MAX_HEADER_LEN}-byte limit")]
    TooLong(usize),
    #[error("header is not valid protobuf: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("no header within {HEADER_TIMEOUT:?}")]
    TimedOut,
    #[error("stream I/O: {0}")]
    Io(#[from] std::io::Error),
}

pub(crate) async fn write<M: Message, W: AsyncWrite + Unpin>(
    io: &mut W,
    message: &M,
) -> std::io::Result<()> {
    write_with(io, message, &[]).await
}

/// Writes `message` and the `payload` after it in one write (one yamux frame when small).
pub(crate) async fn write_with<M: Message, W: AsyncWrite + Unpin>(
    io: &mut W,
    message: &M,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut bytes = message.encode_length_delimited_to_vec();
    bytes.extend_from_slice(payload);
    io.write_all(&bytes).await?;
    io.flush().await
}

pub(crate) async fn read<M: Message + Default, R: AsyncRead + Unpin>(
    io: &mut R,
) -> Result<M, HeaderError> {
    tokio::time::timeout(HEADER_TIMEOUT, read_unbounded(io))
        .await
        .map_err(|_| HeaderError::TimedOut)?
}

/// As [`read`], with no time limit: for a reply that waits on work (a call's acknowledgement
/// comes with its response); the session's keepalive still ends it if the peer dies.
pub(crate) async fn read_unbounded<M: Message + Default, R: AsyncRead + Unpin>(
    io: &mut R,
) -> Result<M, HeaderError> {
    let mut len: usize = 0;
    for shift in (0..35).step_by(7) {
        let byte = match io.read_u8().await {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(HeaderError::Closed);
            }
            Err(e) => return Err(e.into()),
        };
        len |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    if len > MAX_HEADER_LEN {
        return Err(HeaderError::TooLong(len));
    }
    let mut buf = vec![0u8; len];
    io.read_exact(&mut buf).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => HeaderError::Closed,
        _ => HeaderError::Io(e),
    })?;
    Ok(M::decode(buf.as_slice())?)
}

/// Decodes a raw header, for callers (and fuzzers) holding the bytes already.
pub fn decode_header(bytes: &[u8]) -> Result<StreamHeader, prost::DecodeError> {
    StreamHeader::decode_length_delimited(bytes)
}

pub(crate) fn accepted() -> StreamReply {
    StreamReply { error: None }
}

pub(crate) fn refused(kind: Kind, message: impl Into<String>) -> StreamReply {
    StreamReply {
        error: Some(StreamError {
            kind: kind.into(),
            message: message.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::tunnel::v1::{Dial, stream_header};

    #[tokio::test]
    async fn a_header_round_trips_and_leaves_the_payload_unread() {
        let header = StreamHeader {
            kind: Some(stream_header::Kind::Dial(Dial {
                network: "tcp".into(),
                address: "127.0.0.1:6443".into(),
            })),
        };
        let mut wire = header.encode_length_delimited_to_vec();
        wire.extend_from_slice(b"payload");
        let mut reader = wire.as_slice();
        let got: StreamHeader = read(&mut reader).await.unwrap();
        assert_eq!(got, header);
        assert_eq!(reader, b"payload");
    }

    #[tokio::test]
    async fn an_oversized_length_is_refused_before_allocating() {
        let mut wire = Vec::new();
        prost::encoding::encode_varint(1 << 30, &mut wire);
        let err = read::<StreamHeader, _>(&mut wire.as_slice())
            .await
            .unwrap_err();
        assert!(matches!(err, HeaderError::TooLong(_)), "{err}");
    }

    #[tokio::test]
    async fn a_truncated_header_is_reported_as_closed() {
        let wire = [10u8, 1, 2];
        let err = read::<StreamHeader, _>(&mut wire.as_slice())
            .await
            .unwrap_err();
        assert!(matches!(err, HeaderError::Closed), "{err}");
    }
}
