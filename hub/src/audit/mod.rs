//! The audit log: who did what, when, from where, and what came of it. Every API write, login
//! (refused ones too), token creation and revocation and every request through the
//! authentication proxy is one JSON line in `<data dir>/audit/audit.log`, rotated by size.
//! Records carry no query string or header, and a request's body only at level `request`, with
//! every password, token, key and Secret value replaced by `<redacted>`.

use std::{
    borrow::Cow,
    cell::RefCell,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use axum::{
    extract::Request,
    http::{HeaderValue, Method},
    response::Response,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::auth::Principal;

mod describe;
mod file;
mod redact;

use describe::{audited, describe};
use file::Appender;
pub use file::{AuditQuery, files, read};
use redact::body_of;
pub use redact::redact;

/// Where the log goes and how much of it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// The file (`None`: no audit log).
    pub path: Option<PathBuf>,
    /// The size at which the file is rotated.
    pub max_bytes: u64,
    /// Rotated files kept (`audit.log.1` the newest).
    pub keep: usize,
    /// How much of a request is recorded.
    pub level: Level,
}

/// How much of a request a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Level {
    /// Who, what, where and the answer's code.
    #[default]
    Metadata,
    /// Also a write's JSON body (up to 256 KiB), redacted.
    Request,
}

/// The largest body recorded; a bigger one (or one of unknown length) is noted, not kept.
const BODY_LIMIT: u64 = 256 * 1024;

/// What stands in for a secret value.
const REDACTED: &str = "<redacted>";

impl AuditConfig {
    /// The default: `<data dir>/audit/audit.log`, 100 MiB a file, 5 kept.
    pub fn in_data_dir(data_dir: &Path) -> Self {
        Self {
            path: Some(data_dir.join("audit").join("audit.log")),
            max_bytes: 100 * 1024 * 1024,
            keep: 5,
            level: Level::Metadata,
        }
    }
}

/// One audited request. Written from borrowed parts of the request (each record is one more
/// allocation, not one per field); read back owned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record<'a> {
    /// RFC 3339, with microseconds.
    pub time: Cow<'a, str>,
    /// Also sent back as the answer's `Audit-Id` header.
    pub request_id: Cow<'a, str>,
    /// The user (for a login, the name that tried); empty if unknown.
    pub user: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "no_groups")]
    pub groups: Cow<'a, [String]>,
    /// Where the user comes from: `local` for the hub's own users.
    #[serde(default, skip_serializing_if = "empty")]
    pub provider: Cow<'a, str>,
    pub source: Cow<'a, str>,
    /// `create`, `update`, `patch`, `delete`, `login`, `logout`, or for proxied requests the
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, …).
    pub verb: Cow<'a, str>,
    pub method: Cow<'a, str>,
    /// The path, without its query.
    pub path: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "empty")]
    pub cluster: Cow<'a, str>,
    /// The kind (API plural) and name the path points at, if it does.
    #[serde(default, skip_serializing_if = "empty")]
    pub resource: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "empty")]
    pub name: Cow<'a, str>,
    pub code: u16,
    /// The request's body, redacted (level `request`, JSON writes), or why it is not here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_object: Option<serde_json::Value>,
}

// serde hands `skip_serializing_if` a reference to the field as it is.
#[allow(clippy::ptr_arg)]
fn empty(text: &Cow<'_, str>) -> bool {
    text.is_empty()
}

#[allow(clippy::ptr_arg)]
fn no_groups(groups: &Cow<'_, [String]>) -> bool {
    groups.is_empty()
}

/// Who made a request, as authentication found out while answering it: the caller as
/// authenticated (shared, not copied: every proxied request notes one), or as a login named
/// them.
#[derive(Debug, Clone, Default)]
struct Who {
    principal: Option<Arc<Principal>>,
    user: String,
    groups: Vec<String>,
    provider: String,
}

impl Who {
    /// User, groups and provider.
    fn parts(&self) -> (&str, &[String], &str) {
        match &self.principal {
            Some(p) => (&p.user, &p.groups, &p.provider),
            None => (&self.user, &self.groups, &self.provider),
        }
    }
}

tokio::task_local! {
    static WHO: RefCell<Who>;
}

/// Notes the caller of the request being answered (authentication calls it).
pub fn note_caller(user: &str, groups: &[String], provider: &str) {
    let _ = WHO.try_with(|who| {
        *who.borrow_mut() = Who {
            principal: None,
            user: user.to_owned(),
            groups: groups.to_vec(),
            provider: provider.to_owned(),
        };
    });
}

/// Notes the authenticated caller of the request being answered.
pub fn note_principal(principal: &Arc<Principal>) {
    let _ = WHO.try_with(|who| {
        *who.borrow_mut() = Who {
            principal: Some(principal.clone()),
            ..Who::default()
        };
    });
}

/// Notes the user a login tried, whether or not it succeeded; a name no user can have is
/// recorded as such, not as typed (people type passwords into the name field). A directory's
/// login names (`Bob.Builder`, `CORP\bob`, `bob@corp.example`) are not the hub's user names:
/// one that looks like a password (spaces, control characters, longer than a name) is not kept.
pub fn note_login(user: &str, provider: &str) {
    let plausible = if provider == crate::model::LOCAL {
        crate::model::validate_name(crate::model::Kind::User, user).is_ok()
    } else {
        !user.is_empty()
            && user.len() <= 128
            && !user.chars().any(|c| c.is_whitespace() || c.is_control())
    };
    note_caller(
        if plausible { user } else { NOT_A_USER_NAME },
        &[],
        provider,
    );
}

/// What a login with a name no user can have is recorded as.
const NOT_A_USER_NAME: &str = "<not a user name>";

/// The name of the thread that writes the log.
pub const WRITER_THREAD: &str = "audit-log";

/// The log's writer: records go to a thread that appends them, so no request waits on the disk.
#[derive(Debug, Clone)]
pub struct Audit {
    tx: Option<mpsc::Sender<Message>>,
    path: Option<PathBuf>,
    level: Level,
}

/// What the writer is sent.
#[derive(Debug)]
enum Message {
    /// A record, serialised: one JSON line.
    Line(Vec<u8>),
    /// Answered once everything sent before it is in the file: a reader then sees it all.
    Flush(tokio::sync::oneshot::Sender<()>),
}

impl Audit {
    /// No audit log.
    pub fn off() -> Self {
        Self {
            tx: None,
            path: None,
            level: Level::Metadata,
        }
    }

    /// Opens (creates) the log and starts its writer.
    pub fn start(config: &AuditConfig) -> std::io::Result<Self> {
        let Some(path) = config.path.clone() else {
            return Ok(Self::off());
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
            crate::fsutil::owner_only_dir(dir)?;
        }
        let mut file = Appender::open(&path, config.max_bytes, config.keep)?;
        let (tx, mut rx) = mpsc::channel::<Message>(4096);
        std::thread::Builder::new()
            .name(WRITER_THREAD.into())
            .spawn(move || {
                while let Some(first) = rx.blocking_recv() {
                    // A record is not written at once: those that come in the next moment
                    // join it. Waking this thread for every record (a futex wake on the
                    // request's path, a context switch here) cost the proxy more than the
                    // writing. A flush is answered at once.
                    if matches!(first, Message::Line(_)) {
                        std::thread::sleep(GATHER);
                    }
                    // Whatever has queued meanwhile goes in one write.
                    let mut batch: Vec<u8> = Vec::new();
                    let mut waiting = Vec::new();
                    let mut next = Some(first);
                    while let Some(message) = next.take().or_else(|| rx.try_recv().ok()) {
                        match message {
                            Message::Line(line) => batch.extend_from_slice(&line),
                            Message::Flush(done) => waiting.push(done),
                        }
                    }
                    if !batch.is_empty()
                        && let Err(e) = file.append(&batch)
                    {
                        tracing::error!(error = %e, records = batch.len(), "cannot write the audit log");
                    }
                    for done in waiting {
                        let _ = done.send(());
                    }
                }
            })?;
        Ok(Self {
            tx: Some(tx),
            path: Some(path),
            level: config.level,
        })
    }

    /// The log file, if there is one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    async fn record(&self, record: &Record<'_>) {
        let Some(tx) = &self.tx else {
            return;
        };
        // Serialised here, into one buffer: the writer thread then only appends, and the
        // request's parts stay borrowed.
        let mut line = Vec::with_capacity(512);
        if let Err(e) = serde_json::to_writer(&mut line, record) {
            tracing::error!(error = %e, "cannot write an audit record");
            return;
        }
        line.push(b'\n');
        // Waits only if the writer is 4,096 records behind.
        let _ = tx.send(Message::Line(line)).await;
    }

    /// Returns once every record sent so far is in the file.
    pub async fn flushed(&self) {
        if let Some(tx) = &self.tx {
            let (done, wait) = tokio::sync::oneshot::channel();
            if tx.send(Message::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        }
    }
}

/// A new request's `Audit-Id`: this process's random prefix and a count, unique across
/// restarts and replicas without asking the system for randomness on every request (an id
/// names a request; it grants nothing).
fn next_request_id() -> String {
    static PREFIX: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(crate::auth::secret::random_text::<9>);
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n:x}", *PREFIX)
}

/// The `Audit-Id` of the request being served, for what notes it elsewhere (a shell session's
/// recording names the request that opened it).
#[derive(Debug, Clone)]
pub struct AuditId(pub String);

/// Runs `next` on `request` and, if it is audited, records it once its answer is known.
pub async fn around<F, A>(audit: &Audit, mut request: Request, next: F) -> Response
where
    F: FnOnce(Request) -> A,
    A: std::future::Future<Output = Response>,
{
    if audit.tx.is_none() || !audited(request.method(), request.uri().path()) {
        return next(request).await;
    }
    let method = request.method().clone();
    // A copy of the URI shares its bytes: the path is borrowed from it for the record.
    let uri = request.uri().clone();
    let source = request
        .extensions()
        .get::<tunnel::listener::RemoteAddr>()
        .map(|r| r.0.to_string())
        .or_else(|| {
            request
                .extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|c| c.0.to_string())
        })
        .unwrap_or_default();
    let request_id = next_request_id();
    request.extensions_mut().insert(AuditId(request_id.clone()));
    let time = now();
    let (request, request_object) = if audit.level == Level::Request
        && matches!(method, Method::POST | Method::PUT | Method::PATCH)
    {
        body_of(request).await
    } else {
        (request, None)
    };
    let (mut response, who) = WHO
        .scope(RefCell::new(Who::default()), async move {
            let response = next(request).await;
            (response, WHO.with(RefCell::take))
        })
        .await;
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        // A name given as a `&str` would be copied for every answer.
        const AUDIT_ID: axum::http::HeaderName = axum::http::HeaderName::from_static("audit-id");
        response.headers_mut().insert(AUDIT_ID, value);
    }
    let (verb, cluster, resource, name) =
        describe(&method, uri.path(), uri.query().unwrap_or_default());
    let (user, groups, provider) = who.parts();
    // A login's body names the user as typed: keep only what the login noted.
    let mut request_object = request_object;
    if verb == "login"
        && let Some(serde_json::Value::Object(body)) = &mut request_object
        && body.contains_key("username")
    {
        body.insert("username".into(), user.into());
    }
    audit
        .record(&Record {
            time: time.into(),
            request_id: request_id.into(),
            provider: provider.into(),
            user: user.into(),
            groups: groups.into(),
            source: source.into(),
            verb: verb.into(),
            method: method.as_str().into(),
            path: uri.path().into(),
            cluster: cluster.into(),
            resource: resource.into(),
            name: name.into(),
            code: response.status().as_u16(),
            request_object,
        })
        .await;
    response
}

/// The time in one width (microseconds, as Kubernetes' audit writes it), so
/// records' times sort as text too: RFC 3339 with trailing zeros trimmed does
/// not (`…49.1Z` sorts after `…49.15Z`).
fn now() -> String {
    stamp(time::OffsetDateTime::now_utc())
}

/// `at` in UTC as RFC 3339 with microseconds.
fn stamp(at: time::OffsetDateTime) -> String {
    use std::fmt::Write as _;
    const MICRO: &[time::format_description::BorrowedFormatItem<'_>] = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    );
    let at = at.to_offset(time::UtcOffset::UTC);
    // Written by hand: formatting by description cost more than the rest of the record on
    // the proxy's path. Years before 1 or past 9999 (never a clock's) are left to it.
    if !(1..=9999).contains(&at.year()) {
        return at.format(MICRO).unwrap_or_default();
    }
    let mut text = String::with_capacity(27);
    let _ = write!(
        text,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.microsecond()
    );
    text
}

/// How long the writer lets records gather before it writes them.
const GATHER: std::time::Duration = std::time::Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_one_width_so_they_sort_as_text() {
        let t = now();
        assert_eq!(t.len(), "2026-11-26T14:38:49.100000Z".len(), "{t}");
        time::OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339).unwrap();
        // Padded, in UTC whatever the offset given.
        let at = time::macros::datetime!(2026-03-04 05:06:07.000089 +02:00);
        assert_eq!(stamp(at), "2026-03-04T03:06:07.000089Z");
        let at = time::macros::datetime!(0999-12-31 23:59:59.999999 UTC);
        assert_eq!(stamp(at), "0999-12-31T23:59:59.999999Z");
    }
}
