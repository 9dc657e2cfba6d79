//! Shell sessions, recorded: every `exec` and `attach` through the hub's proxy (the
//! dashboard's shell and `kubectl exec` alike) is written as an asciicast v2 file beside a
//! description of it (who, their groups, the cluster, pod, container and command, when it began
//! and ended, the audit record of the request that opened it). Admins list and replay them.
//!
//! The hub splices the session's bytes through unchanged, as before; a copy of each chunk goes
//! over a channel to a task that reads the WebSocket messages in it and writes the recording,
//! so a slow disk delays the recording, never the shell. What is typed is recorded only when
//! the setting `session-recording-input` is `on` (a password typed at a prompt would be in it).
//!
//! Files live in `<data dir>/recordings/`, on the replica that served the session. The setting
//! `session-recording` (`on` by default) turns recording off altogether; changing it is a
//! write to the hub's API, in the audit log like any other.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::{io::AsyncWriteExt, sync::mpsc};

use crate::store::{Store, StoreError};

pub mod cast;
pub mod spdy;
pub mod ws;

/// How a session's bytes are framed: kubectl 1.31 and later and the dashboard speak
/// WebSocket; client-go's SPDY executor (older kubectls) SPDY/3.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    WebSocket,
    Spdy,
}

/// One session's bytes read into channel messages, as its carrier frames them.
#[derive(Debug)]
enum Framing {
    WebSocket {
        client: ws::Reader,
        server: ws::Reader,
    },
    Spdy(Box<spdy::Reader>),
}

impl Framing {
    fn new(carrier: Carrier) -> Self {
        match carrier {
            Carrier::WebSocket => Framing::WebSocket {
                client: ws::Reader::default(),
                server: ws::Reader::default(),
            },
            Carrier::Spdy => Framing::Spdy(Box::default()),
        }
    }

    /// The messages `bytes` complete, with their opcodes (a SPDY stream's bytes are binary,
    /// after their channel byte, as a WebSocket session's are).
    fn feed(&mut self, from_client: bool, bytes: &[u8]) -> Vec<(ws::Opcode, Vec<u8>)> {
        match self {
            Framing::WebSocket { client, server } => {
                if from_client { client } else { server }.feed(bytes)
            }
            Framing::Spdy(reader) => reader
                .feed(from_client, bytes)
                .into_iter()
                .map(|message| (ws::Opcode::Binary, message))
                .collect(),
        }
    }
}

/// The settings, their defaults and what each means.
pub const SETTINGS: [(&str, &str, &str); 4] = [
    (
        "session-recording",
        "on",
        "whether shell sessions are recorded: on or off",
    ),
    (
        "session-recording-input",
        "off",
        "whether what is typed in a shell is recorded: on or off",
    ),
    (
        "session-recording-max-size",
        "10Mi",
        "the most one recording takes, as 512Ki, 10Mi or 1Gi",
    ),
    (
        "session-recording-retention",
        "30d",
        "how long recordings are kept, in days, as 30d",
    ),
];

/// A recorded session, as listed and as kept beside its recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub id: String,
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
    pub cluster: String,
    pub namespace: String,
    pub pod: String,
    #[serde(default)]
    pub container: String,
    #[serde(default)]
    pub command: Vec<String>,
    /// `exec` or `attach`.
    pub subresource: String,
    /// The WebSocket subprotocol agreed (`v5.channel.k8s.io`, ...), or the upgrade's with the
    /// stream protocol agreed (`SPDY/3.1 v4.channel.k8s.io`).
    #[serde(default)]
    pub protocol: String,
    /// The audit record of the request that opened the session (its `Audit-Id`).
    #[serde(default)]
    pub audit_id: String,
    pub started_at: String,
    #[serde(default)]
    pub ended_at: Option<String>,
    /// The recording's size.
    #[serde(default)]
    pub bytes: u64,
    pub input_recorded: bool,
    /// The recording stopped at its size limit (the session went on).
    #[serde(default)]
    pub truncated: bool,
    /// Why nothing of the session's bytes is recorded, if so.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub not_recorded: String,
}

/// The settings in force for a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Whether sessions are recorded at all.
    pub record: bool,
    pub input: bool,
    pub max_bytes: u64,
    pub retention: Duration,
}

fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let wrong = || format!("{text:?} is not a size; write 512Ki, 10Mi or 1Gi");
    let (number, unit) = text.split_at(text.len().saturating_sub(2));
    let count: u64 = number.parse().map_err(|_| wrong())?;
    let bytes = match unit {
        "Ki" => count << 10,
        "Mi" => count << 20,
        "Gi" => count << 30,
        _ => return Err(wrong()),
    };
    if !(4 << 10..=16 << 30).contains(&bytes) {
        return Err(format!("{text:?} is out of range: from 4Ki to 16Gi"));
    }
    Ok(bytes)
}

fn parse_days(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let days: u64 = text
        .strip_suffix('d')
        .and_then(|d| d.parse().ok())
        .filter(|d| (1..=3650).contains(d))
        .ok_or_else(|| format!("{text:?} is not a number of days from 1d to 3650d"))?;
    Ok(Duration::from_secs(days * 86_400))
}

fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?} is neither on nor off")),
    }
}

/// Checks a setting's value if it is one of these; other settings pass.
pub fn validate_setting(name: &str, spec: &Value) -> Result<(), String> {
    let Some((_, _, what)) = SETTINGS.iter().find(|(n, _, _)| *n == name) else {
        return Ok(());
    };
    let value = spec.get("value").and_then(Value::as_str).unwrap_or("");
    let checked = match name {
        "session-recording" | "session-recording-input" => parse_switch(value).map(drop),
        "session-recording-max-size" => parse_size(value).map(drop),
        _ => parse_days(value).map(drop),
    };
    checked.map_err(|e| format!("spec.value: {e} (setting {name}: {what})"))
}

/// The settings in force: each setting, or its default (one written before it was checked
/// is reported and the default used).
pub async fn settings(store: &dyn Store) -> Result<Settings, StoreError> {
    let mut values = Vec::with_capacity(SETTINGS.len());
    for (name, default, _) in SETTINGS {
        values.push(crate::model::setting(store, name, default.to_owned()).await?);
    }
    let warn = |name: &str, e: String| {
        tracing::warn!(setting = name, error = %e, "ignoring the setting; using its default");
    };
    Ok(Settings {
        record: parse_switch(&values[0]).unwrap_or_else(|e| {
            warn(SETTINGS[0].0, e);
            true
        }),
        input: parse_switch(&values[1]).unwrap_or_else(|e| {
            warn(SETTINGS[1].0, e);
            false
        }),
        max_bytes: parse_size(&values[2]).unwrap_or_else(|e| {
            warn(SETTINGS[2].0, e);
            10 << 20
        }),
        retention: parse_days(&values[3]).unwrap_or_else(|e| {
            warn(SETTINGS[3].0, e);
            Duration::from_secs(30 * 86_400)
        }),
    })
}

/// Where recordings are kept.
#[derive(Debug, Clone)]
pub struct Recordings {
    dir: Option<PathBuf>,
}

/// Whether `id` is one this hub would give (so it names no other file).
pub fn well_formed_id(id: &str) -> bool {
    (8..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Where the bytes of a session go while it lasts: one chunk at a time, each way.
#[derive(Debug, Clone)]
pub struct Tap {
    tx: mpsc::UnboundedSender<(bool, Bytes, Instant)>,
}

impl Tap {
    /// Bytes the client sent (`from_client`) or the cluster did.
    pub fn saw(&self, from_client: bool, bytes: &[u8]) {
        let _ = self
            .tx
            .send((from_client, Bytes::copy_from_slice(bytes), Instant::now()));
    }
}

impl Recordings {
    /// Recordings under `<data dir>/recordings/`.
    pub fn in_data_dir(data_dir: &Path) -> Self {
        Self {
            dir: Some(data_dir.join("recordings")),
        }
    }

    /// No recordings (tests of other things).
    pub fn off() -> Self {
        Self { dir: None }
    }

    fn paths(&self, id: &str) -> Option<(PathBuf, PathBuf)> {
        let dir = self.dir.as_ref()?;
        well_formed_id(id).then(|| {
            (
                dir.join(format!("{id}.json")),
                dir.join(format!("{id}.cast")),
            )
        })
    }

    /// Begins recording `session`, whose bytes `carrier` frames (its description is written
    /// now, and again when it ends); returns where its bytes go. Recordings past
    /// `settings.retention` are removed first.
    pub async fn start(
        &self,
        mut session: Session,
        carrier: Carrier,
        settings: Settings,
    ) -> std::io::Result<Tap> {
        let (tx, mut rx) = mpsc::unbounded_channel::<(bool, Bytes, Instant)>();
        let tap = Tap { tx };
        let Some(dir) = self.dir.clone() else {
            return Ok(tap);
        };
        crate::fsutil::owner_only_dir(&dir)?;
        self.prune(settings.retention).await;
        let Some((meta_path, cast_path)) = self.paths(&session.id) else {
            return Ok(tap);
        };
        session.input_recorded = settings.input;
        write_meta(&meta_path, &session).await?;
        let mut file = tokio::io::BufWriter::new(tokio::fs::File::create(&cast_path).await?);
        let started = Instant::now();
        let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
        let title = format!(
            "{} in {}/{}/{} ({})",
            session.user,
            session.cluster,
            session.namespace,
            session.pod,
            session.command.join(" ")
        );
        let mut cast = cast::Cast::new(
            &session.protocol,
            settings.input,
            settings.max_bytes,
            timestamp,
            &title,
        );
        tokio::spawn(async move {
            let mut framing = Framing::new(carrier);
            let mut failed = None;
            while let Some((from_client, bytes, at)) = rx.recv().await {
                for (opcode, data) in framing.feed(from_client, &bytes) {
                    let seconds = at.duration_since(started).as_secs_f64();
                    let lines = cast.message(from_client, opcode, &data, seconds);
                    if failed.is_none()
                        && !lines.is_empty()
                        && let Err(e) = file.write_all(lines.as_bytes()).await
                    {
                        failed = Some(e);
                    }
                }
            }
            if let Err(e) = file.flush().await {
                failed.get_or_insert(e);
            }
            if let Some(e) = failed {
                tracing::warn!(recording = %session.id, error = %e, "writing the session's recording failed; what was written is kept");
            }
            session.ended_at = Some(crate::store::now_rfc3339());
            session.bytes = cast.written();
            session.truncated = cast.truncated;
            if let Err(e) = write_meta(&meta_path, &session).await {
                tracing::warn!(recording = %session.id, error = %e, "could not write the session's end");
            }
        });
        Ok(tap)
    }

    /// Notes a session whose bytes cannot be read here (an upgrade other than WebSocket or
    /// SPDY/3.1).
    pub async fn note_unrecorded(&self, session: &Session) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        crate::fsutil::owner_only_dir(dir)?;
        match self.paths(&session.id) {
            Some((meta, _)) => write_meta(&meta, session).await,
            None => Ok(()),
        }
    }

    /// Every recorded session, newest first.
    pub async fn list(&self) -> std::io::Result<Vec<Session>> {
        let Some(dir) = &self.dir else {
            return Ok(Vec::new());
        };
        let mut sessions = Vec::new();
        let mut entries = match tokio::fs::read_dir(dir).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(sessions),
            Err(e) => return Err(e),
        };
        while let Some(entry) = entries.next_entry().await? {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            if let Ok(text) = tokio::fs::read(&path).await
                && let Ok(session) = serde_json::from_slice::<Session>(&text)
            {
                sessions.push(session);
            }
        }
        sessions.sort_by(|a, b| b.started_at.cmp(&a.started_at).then(a.id.cmp(&b.id)));
        Ok(sessions)
    }

    /// One session's description, if there is such a recording.
    pub async fn get(&self, id: &str) -> std::io::Result<Option<Session>> {
        let Some((meta, _)) = self.paths(id) else {
            return Ok(None);
        };
        match tokio::fs::read(&meta).await {
            Ok(text) => Ok(serde_json::from_slice(&text).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One session's recording (asciicast v2), if there is one.
    pub async fn cast(&self, id: &str) -> std::io::Result<Option<Vec<u8>>> {
        let Some((_, cast)) = self.paths(id) else {
            return Ok(None);
        };
        match tokio::fs::read(&cast).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes the recordings older than `retention`.
    async fn prune(&self, retention: Duration) {
        let Some(dir) = &self.dir else {
            return;
        };
        let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
            return;
        };
        let now = SystemTime::now();
        while let Ok(Some(entry)) = entries.next_entry().await {
            let old = entry
                .metadata()
                .await
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| now.duration_since(modified).ok())
                .is_some_and(|age| age > retention);
            if old {
                let _ = tokio::fs::remove_file(entry.path()).await;
            }
        }
    }
}

/// Writes a session's description whole (a reader sees the old one or the new, never half).
async fn write_meta(path: &Path, session: &Session) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(session).map_err(std::io::Error::other)?;
    let partial = path.with_extension("json.partial");
    tokio::fs::write(&partial, text).await?;
    tokio::fs::rename(&partial, path).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_and_say_what_to_write() {
        let ok = [
            ("session-recording", "off"),
            ("session-recording-input", "on"),
            ("session-recording-input", "off"),
            ("session-recording-max-size", "512Ki"),
            ("session-recording-max-size", "10Mi"),
            ("session-recording-retention", "30d"),
            ("something-else", "anything"),
        ];
        for (name, value) in ok {
            assert!(
                validate_setting(name, &serde_json::json!({"value": value})).is_ok(),
                "{name}={value}"
            );
        }
        let bad = [
            ("session-recording-input", "yes", "neither on nor off"),
            (
                "session-recording-max-size",
                "10MB",
                "write 512Ki, 10Mi or 1Gi",
            ),
            ("session-recording-max-size", "1Ki", "from 4Ki to 16Gi"),
            ("session-recording-retention", "0d", "from 1d to 3650d"),
            ("session-recording-retention", "4w", "from 1d to 3650d"),
        ];
        for (name, value, says) in bad {
            let e = validate_setting(name, &serde_json::json!({"value": value})).unwrap_err();
            assert!(e.starts_with("spec.value: ") && e.contains(says), "{e}");
        }
    }

    #[test]
    fn only_ids_the_hub_gives_name_files() {
        for good in ["AbCdEfGh12_-xyz0", "20261203-abcdefgh"] {
            assert!(well_formed_id(good), "{good}");
        }
        for bad in ["../../etc/passwd", "short", "a.json", &"x".repeat(65)] {
            assert!(!well_formed_id(bad), "{bad}");
        }
    }
}
