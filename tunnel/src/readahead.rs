//! Read-ahead beneath TLS. rustls reads the socket 4 KiB at a time; at tunnel speeds that is a
//! system call per 4 KiB. This reads up to 64 KiB per call instead, and gives the buffer back
//! whenever it is empty and the socket has nothing more, so an idle session holds no buffer.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const CHUNK: usize = 64 * 1024;

/// `T` with reads served from a lazily allocated 64 KiB buffer; writes pass straight through.
#[derive(Debug)]
pub(crate) struct ReadAhead<T> {
    io: T,
    buf: BytesMut,
}

impl<T> ReadAhead<T> {
    pub(crate) fn new(io: T) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.buf.is_empty() {
            // A large read needs no buffer of ours.
            if out.remaining() >= CHUNK {
                return Pin::new(&mut this.io).poll_read(cx, out);
            }
            this.buf.reserve(CHUNK);
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.io), cx, &mut this.buf) {
                Poll::Pending => {
                    this.buf = BytesMut::new();
                    return Poll::Pending;
                }
                Poll::Ready(result) => {
                    result?;
                }
            }
        }
        let n = out.remaining().min(this.buf.len());
        out.put_slice(&this.buf[..n]);
        this.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn small_reads_see_every_byte_in_order() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        tokio::spawn(async move {
            b.write_all(&sent).await.unwrap();
        });
        let mut reader = ReadAhead::new(a);
        let mut got = Vec::new();
        let mut small = [0u8; 4096];
        while got.len() < data.len() {
            let n = reader.read(&mut small).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got, data);
    }
}
