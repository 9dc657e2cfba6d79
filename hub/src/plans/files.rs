//! Files that move between hosts and the hub for plans: a host uploads what its current plan or
//! task names in `uploads` (an etcd snapshot kept off the host), and downloads what it names in
//! `downloads` (that snapshot, for a restore). Only names the host's own current plans declare
//! are accepted, so an agent can neither fill the hub's disk with files of its choosing nor read
//! another host's. Kept under `<data dir>/files/<name>`, written whole (a temporary file, synced,
//! renamed into place) and only when the checksum the agent sent matches.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use futures::{Stream, StreamExt};
use proto::{
    files::Arrival,
    plan::v1::{FileChunk, UploadAck, valid_file_name},
};
use tokio::io::AsyncWriteExt;

/// Where the hub keeps plan files, under its data directory.
pub const DIR: &str = "files";

/// The path of file `name` under `root`, or why `name` is not acceptable.
pub(super) fn path_of(root: &Path, name: &str) -> Result<PathBuf, tonic::Status> {
    if !valid_file_name(name) {
        return Err(tonic::Status::invalid_argument(format!(
            "{name:?} is not a file name the hub keeps (lowercase parts joined by '/')"
        )));
    }
    Ok(root.join(name))
}

/// Unique temporary names for uploads in flight.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Receives `first` and the rest of `chunks` (all naming `name`) into `path`.
pub(super) async fn receive(
    path: &Path,
    name: &str,
    first: FileChunk,
    mut chunks: tonic::Streaming<FileChunk>,
) -> Result<UploadAck, tonic::Status> {
    let io = |e: std::io::Error| tonic::Status::internal(format!("keeping the file: {e}"));
    let dir = path
        .parent()
        .ok_or_else(|| tonic::Status::internal("a file without a directory"))?;
    tokio::fs::create_dir_all(dir).await.map_err(io)?;
    let tmp = path.with_extension(format!(
        "partial-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let result = async {
        let mut file = tokio::fs::File::create(&tmp).await.map_err(io)?;
        let mut arrival = Arrival::new(name);
        let mut chunk = first;
        loop {
            let whole = arrival.take(&chunk).map_err(tonic::Status::data_loss)?;
            file.write_all(&chunk.data).await.map_err(io)?;
            if let Some((sha256, size)) = whole {
                file.sync_all().await.map_err(io)?;
                return Ok(UploadAck { sha256, size });
            }
            chunk = match chunks.next().await {
                Some(Ok(c)) => c,
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(tonic::Status::aborted(
                        "the upload ended before its last chunk",
                    ));
                }
            };
        }
    }
    .await;
    match result {
        Ok(ack) => {
            tokio::fs::rename(&tmp, path).await.map_err(io)?;
            if let Ok(d) = tokio::fs::File::open(dir).await {
                let _ = d.sync_all().await;
            }
            Ok(ack)
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            Err(e)
        }
    }
}

/// The chunks of file `path`, kept as `name`.
pub(super) async fn send(
    path: PathBuf,
    name: String,
) -> Result<impl Stream<Item = Result<FileChunk, tonic::Status>> + Send, tonic::Status> {
    let file = tokio::fs::File::open(&path).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            tonic::Status::not_found(format!("the hub has no file {name:?}"))
        } else {
            tonic::Status::internal(format!("reading {name:?}: {e}"))
        }
    })?;
    Ok(proto::files::chunks(file, name)
        .map(|c| c.map_err(|e| tonic::Status::internal(format!("reading: {e}")))))
}
