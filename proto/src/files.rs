//! How a plan's file moves as `FileChunk`s, written once for both ends: whole chunks of
//! [`FILE_CHUNK`] bytes, every one naming the file, the last (short, perhaps empty) carrying the
//! sha256 of the whole file; the receiver keeps the file only if that matches what arrived.

use futures::Stream;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::plan::v1::FileChunk;

/// Files move in chunks of this size (well under gRPC's 4 MiB message limit).
pub const FILE_CHUNK: usize = 256 * 1024;

pub(crate) fn hex(digest: ring::digest::Digest) -> String {
    // Every request with a token hashes it: one allocation, not one per byte.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(digest.as_ref().len() * 2);
    for &b in digest.as_ref() {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// `reader`'s bytes as the chunks of file `name`.
pub fn chunks<R>(
    reader: R,
    name: String,
) -> impl Stream<Item = std::io::Result<FileChunk>> + Send + 'static
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let hash = ring::digest::Context::new(&ring::digest::SHA256);
    futures::stream::unfold(Some((reader, hash, name)), |state| async move {
        let (mut reader, mut hash, name) = state?;
        let mut data = vec![0u8; FILE_CHUNK];
        let mut filled = 0;
        // A whole chunk (or the end), so that only the last chunk is short.
        while filled < FILE_CHUNK {
            match reader.read(&mut data[filled..]).await {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => return Some((Err(e), None)),
            }
        }
        data.truncate(filled);
        hash.update(&data);
        if filled < FILE_CHUNK {
            let last = FileChunk {
                name,
                data,
                sha256: hex(hash.finish()),
                last: true,
            };
            return Some((Ok(last), None));
        }
        let chunk = FileChunk {
            name: name.clone(),
            data,
            ..FileChunk::default()
        };
        Some((Ok(chunk), Some((reader, hash, name))))
    })
}

/// Checks chunks as they arrive: all of one file, and the file whole.
#[derive(Clone)]
pub struct Arrival {
    name: String,
    hash: ring::digest::Context,
    size: u64,
}

impl std::fmt::Debug for Arrival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arrival")
            .field("name", &self.name)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Arrival {
    /// Expects the chunks of file `name`.
    pub fn new(name: &str) -> Arrival {
        Arrival {
            name: name.to_owned(),
            hash: ring::digest::Context::new(&ring::digest::SHA256),
            size: 0,
        }
    }

    /// Takes one chunk (its data is the caller's to write). `Ok(Some((sha256, size)))` after
    /// the last chunk, if the file arrived whole; an error names what went wrong.
    pub fn take(&mut self, chunk: &FileChunk) -> Result<Option<(String, u64)>, String> {
        if chunk.name != self.name {
            return Err(format!(
                "a chunk of {:?} among those of {:?}",
                chunk.name, self.name
            ));
        }
        self.hash.update(&chunk.data);
        self.size += chunk.data.len() as u64;
        if !chunk.last {
            return Ok(None);
        }
        let sum = hex(self.hash.clone().finish());
        if chunk.sha256.eq_ignore_ascii_case(&sum) {
            Ok(Some((sum, self.size)))
        } else {
            Err(format!(
                "{:?} arrived with sha256 {sum}, not {}; send it again",
                self.name, chunk.sha256
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn a_file_goes_in_whole_chunks_and_arrives_checked() {
        for size in [0, 1, FILE_CHUNK - 1, FILE_CHUNK, 2 * FILE_CHUNK + 7] {
            let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let sent: Vec<FileChunk> = chunks(std::io::Cursor::new(bytes.clone()), "f".into())
                .map(Result::unwrap)
                .collect()
                .await;
            assert!(
                sent.iter()
                    .rev()
                    .skip(1)
                    .all(|c| c.data.len() == FILE_CHUNK && !c.last)
            );
            assert!(sent.last().unwrap().last, "{size}");
            let mut arrival = Arrival::new("f");
            let mut got = Vec::new();
            let mut done = None;
            for chunk in &sent {
                got.extend_from_slice(&chunk.data);
                done = arrival.take(chunk).unwrap();
            }
            assert_eq!(got, bytes);
            assert_eq!(done.unwrap().1, size as u64);
        }
        // A changed byte, or another file's chunk, is caught.
        let mut sent: Vec<FileChunk> = chunks(std::io::Cursor::new(vec![7u8; 10]), "f".into())
            .map(Result::unwrap)
            .collect()
            .await;
        sent[0].data[3] = 8;
        assert!(Arrival::new("f").take(&sent[0]).is_err());
        assert!(Arrival::new("g").take(&sent[0]).is_err());
    }
}
