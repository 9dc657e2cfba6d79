//! Moving a plan's files to and from the hub (`downloads` before the files and instructions,
//! `uploads` after them), over the current session's control channel. A download is written
//! whole (a temporary file, synced, renamed into place) only once its checksum matches; an
//! upload counts once the hub answers with the checksum the agent computed.

use std::path::{Component, Path, PathBuf};

use futures::StreamExt as _;
use proto::{
    files::Arrival,
    plan::v1::{Download, DownloadRequest, Upload, plans_client::PlansClient, valid_file_name},
};
use tokio::{io::AsyncWriteExt, sync::watch};
use tunnel::Channel;

/// The current session with the hub: its id and control channel.
pub type Current = Option<(String, Channel)>;

/// How long a transfer waits for a session before it counts as a failed attempt.
const CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The hub as plans reach it: the control channel of the session there is now, if any.
#[derive(Debug, Clone)]
pub struct Hub {
    channel: watch::Receiver<Current>,
}

impl Hub {
    /// A handle following `channel` (the agent sets it on every new session, and clears it when
    /// that session ends).
    pub fn new(channel: watch::Receiver<Current>) -> Hub {
        Hub { channel }
    }

    /// A client on the current session, waiting a while for one (a hub restarting is not a
    /// reason to fail a plan).
    async fn client(&self) -> Result<PlansClient<Channel>, String> {
        let mut channel = self.channel.clone();
        let found = tokio::time::timeout(CONNECT_WAIT, channel.wait_for(Option::is_some)).await;
        match found {
            Ok(Ok(current)) => Ok(PlansClient::new(
                current
                    .as_ref()
                    .map(|(_, c)| c.clone())
                    .ok_or("no session")?,
            )),
            _ => Err(format!(
                "not connected to the hub for {} s",
                CONNECT_WAIT.as_secs()
            )),
        }
    }
}

fn check_path(what: &str, path: &str) -> Result<(), String> {
    let p = Path::new(path);
    if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) || p.parent().is_none()
    {
        return Err(format!(
            "{what} {path:?}: the path must be absolute and free of '..'"
        ));
    }
    Ok(())
}

/// Checks a plan's transfers before anything is done; the message names the bad entry.
pub fn check(downloads: &[Download], uploads: &[Upload]) -> Result<(), String> {
    for d in downloads {
        check_path("download", &d.path)?;
        if !valid_file_name(&d.name) {
            return Err(format!("download {:?}: not a name the hub keeps", d.name));
        }
        mode(d).map_err(|e| format!("download {:?}: {e}", d.name))?;
    }
    for u in uploads {
        check_path("upload", &u.path)?;
        if !valid_file_name(&u.name) {
            return Err(format!("upload {:?}: not a name the hub keeps", u.name));
        }
        let file = u.path.rsplit('/').next().unwrap_or_default();
        if u.path.contains('*') && (!file.ends_with('*') || file[..file.len() - 1].contains('*')) {
            return Err(format!(
                "upload {:?}: only the last part of the path may end in '*'",
                u.path
            ));
        }
    }
    Ok(())
}

/// Fetches `download` from the hub into its path.
pub async fn download(hub: &Hub, download: &Download) -> Result<(), String> {
    let fail = |e: String| format!("download {:?}: {e}", download.name);
    let mut client = hub.client().await.map_err(fail)?;
    let mut chunks = client
        .download(DownloadRequest {
            name: download.name.clone(),
        })
        .await
        .map_err(|e| fail(e.message().to_owned()))?
        .into_inner();
    let path = Path::new(&download.path);
    let io = |e: std::io::Error| fail(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(io)?;
    }
    let tmp = path.with_extension("drover-download");
    let mut file = tokio::fs::File::create(&tmp).await.map_err(io)?;
    let mut arrival = Arrival::new(&download.name);
    let outcome = loop {
        match chunks.message().await {
            Ok(Some(chunk)) => {
                let whole = match arrival.take(&chunk) {
                    Ok(whole) => whole,
                    Err(e) => break Err(fail(e)),
                };
                file.write_all(&chunk.data).await.map_err(io)?;
                if whole.is_some() {
                    break Ok(());
                }
            }
            Ok(None) => break Err(fail("the hub ended it before its last chunk".into())),
            Err(e) => break Err(fail(e.message().to_owned())),
        }
    };
    if let Err(e) = outcome {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
    }
    file.sync_all().await.map_err(io)?;
    let mode = mode(download).map_err(fail)?;
    use std::os::unix::fs::PermissionsExt as _;
    tokio::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .await
        .map_err(io)?;
    tokio::fs::rename(&tmp, path).await.map_err(io)?;
    // The rename itself on disk, as for a plan's files.
    if let Some(dir) = path.parent()
        && let Ok(dir) = tokio::fs::File::open(dir).await
    {
        let _ = dir.sync_all().await;
    }
    Ok(())
}

/// A download's mode: its octal `permissions`, else 0600.
fn mode(download: &Download) -> Result<u32, String> {
    if download.permissions.is_empty() {
        return Ok(0o600);
    }
    u32::from_str_radix(download.permissions.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| {
            format!(
                "permissions {:?} must be octal, e.g. \"0600\"",
                download.permissions
            )
        })
}

/// The file an upload's path names: itself, or the newest match of its trailing `*`.
fn resolve(path: &str) -> Result<PathBuf, String> {
    let Some(prefix) = path.strip_suffix('*') else {
        return Ok(PathBuf::from(path));
    };
    let (dir, start) = prefix.rsplit_once('/').unwrap_or(("/", prefix));
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{dir}: {e}"))?;
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(start))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
        .ok_or_else(|| format!("nothing matches {path}"))
}

/// Sends `upload` to the hub; returns the file sent, its size and checksum.
pub async fn upload(hub: &Hub, upload: &Upload) -> Result<(PathBuf, u64, String), String> {
    let fail = |e: String| format!("upload {:?}: {e}", upload.name);
    let path = resolve(&upload.path).map_err(fail)?;
    let mut client = hub.client().await.map_err(fail)?;
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| fail(format!("{}: {e}", path.display())))?;
    // What was sent, to compare with what the hub says it kept.
    #[derive(Debug)]
    struct Sent {
        arrival: Arrival,
        whole: Option<(String, u64)>,
        read_error: Option<String>,
    }
    let sent = std::sync::Arc::new(std::sync::Mutex::new(Sent {
        arrival: Arrival::new(&upload.name),
        whole: None,
        read_error: None,
    }));
    let watched = sent.clone();
    let chunks = proto::files::chunks(file, upload.name.clone()).filter_map(move |chunk| {
        let mut sent = watched.lock().unwrap_or_else(|e| e.into_inner());
        let out = match chunk {
            Ok(chunk) => {
                if let Ok(Some(whole)) = sent.arrival.take(&chunk) {
                    sent.whole = Some(whole);
                }
                Some(chunk)
            }
            Err(e) => {
                // Ending the stream early makes the hub refuse the upload; say why here.
                sent.read_error = Some(e.to_string());
                None
            }
        };
        std::future::ready(out)
    });
    let answer = client.upload(chunks).await;
    let (whole, read_error) = {
        let mut sent = sent.lock().unwrap_or_else(|e| e.into_inner());
        (sent.whole.take(), sent.read_error.take())
    };
    if let Some(e) = read_error {
        return Err(fail(format!("{}: {e}", path.display())));
    }
    let ack = answer
        .map_err(|e| fail(e.message().to_owned()))?
        .into_inner();
    let (sum, size) = whole.ok_or_else(|| fail("the file was not sent whole".into()))?;
    if ack.sha256 != sum || ack.size != size {
        return Err(fail(format!(
            "the hub kept {} bytes with sha256 {}, not {size} with {sum}",
            ack.size, ack.sha256
        )));
    }
    Ok((path, size, sum))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_are_checked_before_anything_moves() {
        let ok = Upload {
            path: "/var/lib/rancher/k3s/server/db/snapshots/s1-*".into(),
            name: "etcd-snapshots/edge/s1".into(),
        };
        assert!(check(&[], std::slice::from_ref(&ok)).is_ok());
        for (path, name) in [
            ("relative/s1", "etcd-snapshots/edge/s1"),
            ("/a/../b", "etcd-snapshots/edge/s1"),
            ("/a/*/b", "etcd-snapshots/edge/s1"),
            ("/a/s1", "../../etc/passwd"),
            ("/a/s1", "Etcd/Edge"),
            ("/a/s1", "a/b/c/d/e"),
        ] {
            let bad = Upload {
                path: path.into(),
                name: name.into(),
            };
            assert!(check(&[], &[bad]).is_err(), "{path} {name}");
        }
    }

    #[test]
    fn a_trailing_star_means_the_newest_match() {
        let dir = crate::testing::tempdir();
        std::fs::write(dir.join("s1-node-1-100"), b"old").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(dir.join("s1-node-1-200"), b"new").unwrap();
        std::fs::write(dir.join("s2-node-1-300"), b"other").unwrap();
        let found = resolve(&format!("{}/s1-*", dir.display())).unwrap();
        assert_eq!(found, dir.join("s1-node-1-200"));
        assert!(resolve(&format!("{}/s3-*", dir.display())).is_err());
    }
}
