//! The audit log: who did what, when, from where, and what came of it. Every API write, login
//! (refused ones too), token creation and revocation and every request through the
//! authentication proxy is one JSON line in `<data dir>/audit/audit.log`, rotated by size.
//! Records carry no query string or header, and a request's body only at level `request`, with
//! every password, token, key and Secret value replaced by `<redacted>`.

use std::{
    cell::RefCell,
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use axum::{
    extract::Request,
    http::{HeaderValue, Method},
    response::Response,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

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

/// One audited request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// RFC 3339, with milliseconds.
    pub time: String,
    /// Also sent back as the answer's `Audit-Id` header.
    pub request_id: String,
    /// The user (for a login, the name that tried); empty if unknown.
    pub user: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Where the user comes from: `local` for the hub's own users.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    pub source: String,
    /// `create`, `update`, `patch`, `delete`, `login`, `logout`, or for proxied requests the
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, …).
    pub verb: String,
    pub method: String,
    /// The path, without its query.
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// The kind (API plural) and name the path points at, if it does.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub code: u16,
    /// The request's body, redacted (level `request`, JSON writes), or why it is not here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_object: Option<serde_json::Value>,
}

/// Whether a JSON key names something secret.
fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "privatekey",
        "credential",
        "passphrase",
    ]
    .iter()
    .any(|s| key.contains(s))
}

/// The hub's own kinds whose objects hold secrets (a project secret's data, a credential's
/// keys and passwords, a provider's bind password or client secret), by API plural.
const SECRET_KINDS: &[&str] = &["projectsecrets", "cloudcredentials", "authproviders"];

/// Whether a request to `path` carries a secret whatever its body looks like: a Secret
/// through the proxy, or one of the hub's secret-bearing kinds. Such a body is never recorded,
/// only a summary of it ([`summary`]): a patch of any type, YAML or protobuf, a body without
/// `kind`, or kubectl's `last-applied-configuration` would each slip past redaction by field.
fn secret_bearing(path: &str) -> bool {
    let path = as_v1(path);
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["k8s", "clusters", _, rest @ ..] => {
            let (resource, _) = kube_resource(rest);
            resource == "secrets" || resource.starts_with("secrets/")
        }
        ["v1", plural, ..] => SECRET_KINDS.contains(plural),
        _ => false,
    }
}

/// What is recorded of a secret-bearing request's body: which object it names and what kind
/// of change it is, never a value.
fn summary(body: &serde_json::Value) -> serde_json::Value {
    let mut kept = serde_json::Map::new();
    match body {
        serde_json::Value::Object(object) => {
            for field in ["apiVersion", "kind"] {
                if let Some(value) = object.get(field).filter(|v| v.is_string()) {
                    kept.insert(field.to_owned(), value.clone());
                }
            }
            let metadata = &object.get("metadata");
            let mut named = serde_json::Map::new();
            for field in ["name", "namespace"] {
                if let Some(value) = metadata
                    .and_then(|m| m.get(field))
                    .filter(|v| v.is_string())
                {
                    named.insert(field.to_owned(), value.clone());
                }
            }
            if !named.is_empty() {
                kept.insert("metadata".into(), named.into());
            }
        }
        serde_json::Value::Array(operations) => {
            kept.insert("operations".into(), operations.len().into());
        }
        _ => {}
    }
    kept.insert(
        "redacted".into(),
        "the body of a request to a secret-bearing resource is not recorded".into(),
    );
    kept.into()
}

/// The annotation in which `kubectl apply` keeps the whole object it applied, as a string.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// `value` with every secret replaced: fields whose names say secret, and the values of a
/// Secret's (or a project secret's) `data` and `stringData` and its `last-applied-configuration`.
pub fn redact(mut value: serde_json::Value) -> serde_json::Value {
    fn walk(value: &mut serde_json::Value, secret_data: bool) {
        match value {
            serde_json::Value::Object(map) => {
                let holds_data = secret_data
                    || map
                        .get("kind")
                        .and_then(serde_json::Value::as_str)
                        .is_some_and(|k| k == "Secret" || k == "ProjectSecret");
                for (key, field) in map.iter_mut() {
                    if secret_key(key) && !field.is_object() {
                        *field = REDACTED.into();
                    } else if key == LAST_APPLIED {
                        // The whole applied object, as text: redacted as the object would be.
                        if let Some(applied) = field
                            .as_str()
                            .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
                        {
                            *field = redact(applied).to_string().into();
                        } else {
                            *field = REDACTED.into();
                        }
                    } else if holds_data && (key == "data" || key == "stringData") {
                        if let serde_json::Value::Object(entries) = field {
                            for entry in entries.values_mut() {
                                *entry = REDACTED.into();
                            }
                        } else {
                            *field = REDACTED.into();
                        }
                    } else {
                        // A project secret's data sits in its spec.
                        walk(field, holds_data && key == "spec");
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, secret_data);
                }
            }
            // A URL's password (a proxy's, in a cluster's agentEnv), wherever it is.
            serde_json::Value::String(text) => {
                if let Some((shown, _)) = crate::model::agentconfig::split_url_password(text) {
                    *text = shown.replacen('@', &format!(":{REDACTED}@"), 1);
                }
            }
            _ => {}
        }
    }
    walk(&mut value, false);
    value
}

/// Who made a request, as authentication found out while answering it.
#[derive(Debug, Clone, Default)]
struct Who {
    user: String,
    groups: Vec<String>,
    provider: String,
}

tokio::task_local! {
    static WHO: RefCell<Who>;
}

/// Notes the caller of the request being answered (authentication calls it).
pub fn note_caller(user: &str, groups: &[String], provider: &str) {
    let _ = WHO.try_with(|who| {
        *who.borrow_mut() = Who {
            user: user.to_owned(),
            groups: groups.to_vec(),
            provider: provider.to_owned(),
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

/// The hub's kinds as kubectl reaches them (`/apis/management.drover.io/v1/…`) are the same
/// API as `/v1/…`: audited, described and kept from secrets as it is.
fn as_v1(path: &str) -> std::borrow::Cow<'_, str> {
    match path.strip_prefix("/apis/management.drover.io/v1/") {
        Some(rest) => format!("/v1/{rest}").into(),
        None => path.into(),
    }
}

/// Whether a request is audited: writes to the API, logins and logouts, and everything
/// through the proxy. Reads of the hub's own objects, the dashboard's pages, the agents'
/// endpoints (their paths carry tokens) and health checks are not.
fn audited(method: &Method, path: &str) -> bool {
    let path = &*as_v1(path);
    if path.starts_with("/k8s/clusters/") {
        return true;
    }
    // A provider's callback (a GET) is where its users' logins end.
    let callback = path.starts_with("/v1/login/") && path.ends_with("/callback");
    // The login page's form, when its script did not run, and a command line's sign-in
    // confirmed (or denied) on its page.
    let form_login =
        (path == "/login" || path == "/login/device/confirm") && *method == Method::POST;
    // A command line asking whether it was confirmed: every two seconds, its body the device
    // code (a secret); the confirmation is what is recorded.
    let poll = path == "/v1/login/device/token";
    callback
        || form_login
        || (path.starts_with("/v1/")
            && !poll
            && !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS))
}

/// What a path says: the verb, cluster, resource and name.
fn describe(method: &Method, path: &str, query: &str) -> (String, String, String, String) {
    let path = as_v1(path);
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let ["k8s", "clusters", cluster, rest @ ..] = segments.as_slice() {
        let (resource, name) = kube_resource(rest);
        let watch = query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1");
        let verb = match *method {
            Method::GET if watch => "watch",
            Method::GET if name.is_empty() => "list",
            Method::GET | Method::HEAD => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "other",
        };
        return (verb.into(), (*cluster).to_owned(), resource, name);
    }
    let verb = match (method, segments.as_slice()) {
        (_, ["v1", "login"] | ["v1", "login", _, "callback"] | ["login"]) => "login",
        (_, ["v1", "login", _, "start" | "device"]) => "login-start",
        (_, ["login", "device", "confirm"]) => "login",
        (_, ["v1", "logout"]) => "logout",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        _ => "other",
    };
    let (cluster, resource, name) = match segments.as_slice() {
        ["v1", "clusters", cluster, action, ..] => (
            (*cluster).to_owned(),
            "clusters".to_owned(),
            format!("{cluster}/{action}"),
        ),
        ["v1", "clusters", name] => (
            (*name).to_owned(),
            "clusters".to_owned(),
            (*name).to_owned(),
        ),
        ["v1", plural, name, ..] => (String::new(), (*plural).to_owned(), (*name).to_owned()),
        ["v1", plural] => (String::new(), (*plural).to_owned(), String::new()),
        ["login"] => (String::new(), "login".to_owned(), String::new()),
        _ => Default::default(),
    };
    (verb.into(), cluster, resource, name)
}

/// The resource and object name of a Kubernetes API path (`api/v1/namespaces/x/pods/y`).
fn kube_resource(rest: &[&str]) -> (String, String) {
    let after_version = match rest {
        ["api", _, tail @ ..] => tail,
        ["apis", _, _, tail @ ..] => tail,
        _ => return (String::new(), String::new()),
    };
    let tail = match after_version {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    match tail {
        [resource] => ((*resource).to_owned(), String::new()),
        [resource, name, sub @ ..] => {
            let resource = match sub.first() {
                Some(sub) => format!("{resource}/{sub}"),
                None => (*resource).to_owned(),
            };
            (resource, (*name).to_owned())
        }
        _ => (String::new(), String::new()),
    }
}

/// The log's writer: records go to a task that appends them, so no request waits on the disk.
#[derive(Debug, Clone)]
pub struct Audit {
    tx: Option<mpsc::Sender<Message>>,
    path: Option<PathBuf>,
    level: Level,
}

/// What the writer is sent.
#[derive(Debug)]
enum Message {
    Record(Box<Record>),
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
            .name("audit-log".into())
            .spawn(move || {
                while let Some(first) = rx.blocking_recv() {
                    // A record is not written at once: those that come in the next moment
                    // join it. Waking this thread for every record (a futex wake on the
                    // request's path, a context switch here) cost the proxy more than the
                    // writing. A flush is answered at once.
                    if matches!(first, Message::Record(_)) {
                        std::thread::sleep(GATHER);
                    }
                    // Whatever has queued meanwhile goes in one write.
                    let mut batch = Vec::new();
                    let mut waiting = Vec::new();
                    let mut next = Some(first);
                    while let Some(message) = next.take().or_else(|| rx.try_recv().ok()) {
                        match message {
                            Message::Record(record) => batch.push(*record),
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

    async fn record(&self, record: Record) {
        if let Some(tx) = &self.tx {
            // Waits only if the writer is 4,096 records behind.
            let _ = tx.send(Message::Record(Box::new(record))).await;
        }
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

/// Appends JSON lines to a file, rotating it past a size.
struct Appender {
    path: PathBuf,
    file: std::fs::File,
    size: u64,
    max_bytes: u64,
    keep: usize,
}

impl Appender {
    fn open(path: &Path, max_bytes: u64, keep: usize) -> std::io::Result<Self> {
        let file = open_owner_only(path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path: path.to_owned(),
            file,
            size,
            max_bytes,
            keep,
        })
    }

    fn append(&mut self, records: &[Record]) -> std::io::Result<()> {
        let mut text = Vec::new();
        for record in records {
            serde_json::to_writer(&mut text, record)?;
            text.push(b'\n');
        }
        if self.size > 0 && self.size + text.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(&text)?;
        self.file.flush()?;
        self.size += text.len() as u64;
        Ok(())
    }

    /// `audit.log` becomes `audit.log.1`, `.1` becomes `.2`, …; the oldest beyond `keep` goes.
    fn rotate(&mut self) -> std::io::Result<()> {
        let numbered = |n: usize| PathBuf::from(format!("{}.{n}", self.path.display()));
        if self.keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            let _ = std::fs::remove_file(numbered(self.keep));
            for n in (1..self.keep).rev() {
                let _ = std::fs::rename(numbered(n), numbered(n + 1));
            }
            std::fs::rename(&self.path, numbered(1))?;
        }
        self.file = open_owner_only(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

fn open_owner_only(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// The files of the log, oldest first.
pub fn files(path: &Path, keep: usize) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (1..=keep.max(1))
        .rev()
        .map(|n| PathBuf::from(format!("{}.{n}", path.display())))
        .filter(|p| p.exists())
        .collect();
    if path.exists() {
        files.push(path.to_owned());
    }
    files
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
    let path = request.uri().path().to_owned();
    // Described now, from the request as received: its query need not be kept.
    let (verb, cluster, resource, name) =
        describe(&method, &path, request.uri().query().unwrap_or_default());
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
    // A login's body names the user as typed: keep only what the login noted.
    let mut request_object = request_object;
    if verb == "login"
        && let Some(serde_json::Value::Object(body)) = &mut request_object
        && body.contains_key("username")
    {
        body.insert("username".into(), who.user.clone().into());
    }
    audit
        .record(Record {
            time,
            request_id,
            provider: who.provider,
            user: who.user,
            groups: who.groups,
            source,
            verb,
            method: method.to_string(),
            path,
            cluster,
            resource,
            name,
            code: response.status().as_u16(),
            request_object,
        })
        .await;
    response
}

/// The request again (its body read, if it was), and what the record keeps of the body.
async fn body_of(request: Request) -> (Request, Option<serde_json::Value>) {
    // (Read before any await: a borrowed request is not `Send`, its body not being `Sync`.)
    let (kind, length) = {
        let header = |name| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (
            header(axum::http::header::CONTENT_TYPE).unwrap_or_default(),
            header(axum::http::header::CONTENT_LENGTH).and_then(|l| l.parse::<u64>().ok()),
        )
    };
    let json = kind.starts_with("application/json")
        || kind.starts_with("application/merge-patch+json")
        || kind.starts_with("application/strategic-merge-patch+json")
        || kind.starts_with("application/json-patch+json")
        || kind.starts_with("application/apply-patch+json");
    match length {
        Some(0) | None if kind.is_empty() => (request, None),
        Some(n) if n <= BODY_LIMIT && json => {
            let (parts, body) = request.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, BODY_LIMIT as usize).await else {
                // The client stopped sending: the handler sees the same.
                return (
                    Request::from_parts(parts, axum::body::Body::empty()),
                    Some("<not recorded: the body could not be read>".into()),
                );
            };
            let secret = secret_bearing(parts.uri.path());
            let kept = serde_json::from_slice::<serde_json::Value>(&bytes)
                .map(|body| if secret { summary(&body) } else { redact(body) })
                .unwrap_or_else(|_| "<not recorded: not JSON>".into());
            (
                Request::from_parts(parts, axum::body::Body::from(bytes)),
                Some(kept),
            )
        }
        _ => {
            let why = format!(
                "<not recorded: {} of {}>",
                length.map_or_else(|| "a streamed body".to_owned(), |n| format!("{n} bytes")),
                if kind.is_empty() {
                    "no stated type"
                } else {
                    kind.as_str()
                }
            );
            (request, Some(why.into()))
        }
    }
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

/// What `/v1/audit` is asked for.
#[derive(Debug, Default, Deserialize)]
pub struct AuditQuery {
    pub user: Option<String>,
    pub cluster: Option<String>,
    /// RFC 3339: records at or after it.
    pub since: Option<String>,
    /// At most this many (the newest), 1,000 by default.
    pub limit: Option<usize>,
}

/// The records `query` asks for, oldest first, from the log's files.
pub fn read(path: &Path, keep: usize, query: &AuditQuery) -> std::io::Result<Vec<Record>> {
    let since = query
        .since
        .as_deref()
        .map(|s| crate::model::parse_time(s).ok_or(()))
        .transpose()
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "since: an RFC 3339 time, as 2026-11-26T12:00:00Z",
            )
        })?;
    let limit = query.limit.unwrap_or(1000).clamp(1, 100_000);
    let mut out = std::collections::VecDeque::new();
    for file in files(path, keep) {
        let text = std::fs::read_to_string(&file)?;
        for line in text.lines() {
            let Ok(record) = serde_json::from_str::<Record>(line) else {
                continue;
            };
            let wanted = query.user.as_ref().is_none_or(|u| *u == record.user)
                && query.cluster.as_ref().is_none_or(|c| *c == record.cluster)
                && since
                    .is_none_or(|s| crate::model::parse_time(&record.time).is_some_and(|t| t >= s));
            if wanted {
                out.push_back(record);
                if out.len() > limit {
                    out.pop_front();
                }
            }
        }
    }
    Ok(out.into())
}

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

    #[test]
    fn paths_say_what_was_done_to_what() {
        let d = |m: Method, p: &str, q: &str| describe(&m, p, q);
        assert_eq!(
            d(
                Method::GET,
                "/k8s/clusters/prod/api/v1/namespaces/shop/pods",
                ""
            ),
            ("list".into(), "prod".into(), "pods".into(), String::new())
        );
        assert_eq!(
            d(
                Method::GET,
                "/k8s/clusters/prod/api/v1/pods",
                "watch=1&resourceVersion=5"
            )
            .0,
            "watch"
        );
        assert_eq!(
            d(
                Method::POST,
                "/k8s/clusters/prod/api/v1/namespaces/shop/pods/web-0/exec",
                "command=sh"
            ),
            (
                "create".into(),
                "prod".into(),
                "pods/exec".into(),
                "web-0".into()
            )
        );
        assert_eq!(
            d(
                Method::DELETE,
                "/k8s/clusters/prod/apis/apps/v1/namespaces/shop/deployments/web",
                ""
            ),
            (
                "delete".into(),
                "prod".into(),
                "deployments".into(),
                "web".into()
            )
        );
        assert_eq!(
            d(Method::GET, "/k8s/clusters/prod/api/v1/nodes/n1", ""),
            ("get".into(), "prod".into(), "nodes".into(), "n1".into())
        );
        assert_eq!(
            d(Method::POST, "/v1/login", ""),
            ("login".into(), String::new(), "login".into(), String::new())
        );
        assert_eq!(
            d(Method::DELETE, "/v1/tokens/drt_tabc", ""),
            (
                "delete".into(),
                String::new(),
                "tokens".into(),
                "drt_tabc".into()
            )
        );
        assert_eq!(
            d(Method::POST, "/v1/clusters/prod/kubeconfig", ""),
            (
                "create".into(),
                "prod".into(),
                "clusters".into(),
                "prod/kubeconfig".into()
            )
        );
        assert!(audited(&Method::GET, "/k8s/clusters/prod/api/v1/pods"));
        assert!(audited(&Method::POST, "/v1/users"));
        assert!(!audited(&Method::GET, "/v1/users"));
        // kubectl's writes to the hub's kinds, as the same API's.
        assert!(audited(
            &Method::PATCH,
            "/apis/management.drover.io/v1/clusters/edge"
        ));
        assert!(!audited(
            &Method::GET,
            "/apis/management.drover.io/v1/clusters"
        ));
        assert_eq!(
            describe(
                &Method::PATCH,
                "/apis/management.drover.io/v1/clusters/edge",
                ""
            ),
            (
                "patch".into(),
                "edge".into(),
                "clusters".into(),
                "edge".into()
            )
        );
        assert!(!audited(&Method::GET, "/v3/import/drr_secret.yaml"));
        assert!(!audited(&Method::POST, "/v3/register"));
    }

    fn record(user: &str, cluster: &str, time: &str) -> Record {
        Record {
            time: time.into(),
            request_id: "r".into(),
            user: user.into(),
            groups: Vec::new(),
            provider: "local".into(),
            source: "127.0.0.1:1".into(),
            verb: "get".into(),
            method: "GET".into(),
            path: "/k8s/clusters/x".into(),
            cluster: cluster.into(),
            resource: String::new(),
            name: String::new(),
            code: 200,
            request_object: None,
        }
    }

    #[test]
    fn requests_to_secret_bearing_resources_keep_only_what_they_name() {
        for path in [
            "/k8s/clusters/prod/api/v1/namespaces/default/secrets",
            "/k8s/clusters/prod/api/v1/namespaces/default/secrets/db",
            "/k8s/clusters/prod/api/v1/secrets",
            "/v1/projectsecrets",
            "/v1/projectsecrets/db",
            "/v1/cloudcredentials/corp-pull",
            "/v1/authproviders/corp",
            "/apis/management.drover.io/v1/cloudcredentials/corp-pull",
        ] {
            assert!(secret_bearing(path), "{path}");
        }
        for path in [
            "/k8s/clusters/prod/api/v1/namespaces/default/configmaps/secrets",
            "/k8s/clusters/prod/api/v1/namespaces/secrets/pods",
            "/v1/clusters/secrets",
            "/v1/users",
        ] {
            assert!(!secret_bearing(path), "{path}");
        }
        // Whatever the body's shape: an object without kind, a JSON patch, a merge patch.
        let object = summary(
            &serde_json::json!({"metadata": {"name": "db", "namespace": "x",
            "annotations": {"note": "hunter2"}}, "stringData": {"pw": "hunter2"}}),
        );
        assert_eq!(
            object["metadata"],
            serde_json::json!({"name": "db", "namespace": "x"})
        );
        assert!(!object.to_string().contains("hunter2"), "{object}");
        let patch = summary(&serde_json::json!([{"op": "replace", "path": "/data/pw",
            "value": "aHVudGVyMg=="}]));
        assert_eq!(patch["operations"], 1);
        assert!(!patch.to_string().contains("aHVudGVyMg"), "{patch}");
        let merge = summary(&serde_json::json!({"data": {"pw": "aHVudGVyMg=="}}));
        assert!(!merge.to_string().contains("aHVudGVyMg"), "{merge}");
    }

    #[test]
    fn a_secrets_last_applied_configuration_is_redacted_wherever_it_is() {
        let applied = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db"}, "stringData": {"pw": "hunter2-hunter2"}});
        let list = redact(
            serde_json::json!({"kind": "List", "items": [{"kind": "Secret",
            "metadata": {"name": "db", "annotations": {LAST_APPLIED: applied.to_string()}},
            "stringData": {"pw": "hunter2-hunter2"}}]}),
        );
        assert!(!list.to_string().contains("hunter2-hunter2"), "{list}");
        // Another kind's stays as it was.
        let config = serde_json::json!({"kind": "ConfigMap", "metadata": {"name": "c"},
            "data": {"k": "v"}});
        let kept = redact(
            serde_json::json!({"kind": "ConfigMap", "metadata": {"name": "c",
            "annotations": {LAST_APPLIED: config.to_string()}}}),
        );
        let text = kept["metadata"]["annotations"][LAST_APPLIED]
            .as_str()
            .unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(text).unwrap(),
            config
        );
    }

    #[test]
    fn secrets_in_bodies_are_redacted_and_the_rest_kept() {
        let body = serde_json::json!({
            "username": "pat", "password": "hunter2-hunter2",
            "spec": {"password": "p", "groups": ["ops"], "bindPassword": "b", "tokenTTL": 5,
                     "nested": [{"clientSecret": "c", "name": "x"}]},
        });
        let kept = redact(body);
        assert_eq!(kept["password"], REDACTED);
        assert_eq!(kept["username"], "pat");
        assert_eq!(kept["spec"]["password"], REDACTED);
        assert_eq!(kept["spec"]["bindPassword"], REDACTED);
        assert_eq!(kept["spec"]["groups"], serde_json::json!(["ops"]));
        assert_eq!(kept["spec"]["nested"][0]["clientSecret"], REDACTED);
        assert_eq!(kept["spec"]["nested"][0]["name"], "x");
        let secret = redact(
            serde_json::json!({"kind": "Secret", "metadata": {"name": "s"},
            "data": {"pw": "aHVudGVy"}, "stringData": {"pw": "hunter"}}),
        );
        assert_eq!(secret["data"]["pw"], REDACTED);
        assert_eq!(secret["stringData"]["pw"], REDACTED);
        assert_eq!(secret["metadata"]["name"], "s");
        let project = redact(serde_json::json!({"kind": "ProjectSecret",
            "spec": {"cluster": "prod", "data": {"k": "dg=="}}}));
        assert_eq!(project["spec"]["data"]["k"], REDACTED);
        assert_eq!(project["spec"]["cluster"], "prod");
        // A ConfigMap's data is not secret.
        let config = redact(serde_json::json!({"kind": "ConfigMap", "data": {"k": "v"}}));
        assert_eq!(config["data"]["k"], "v");
        // A proxy's password in a cluster's agentEnv.
        let cluster = redact(serde_json::json!({"spec": {"agentEnv": [
            {"name": "HTTPS_PROXY", "value": "http://drover:s3cret@proxy:3128"}]}}));
        assert_eq!(
            cluster["spec"]["agentEnv"][0]["value"],
            format!("http://drover:{REDACTED}@proxy:3128")
        );
    }

    #[test]
    fn the_log_rotates_by_size_and_is_read_back_in_order_across_its_files() {
        let dir = std::env::temp_dir().join(format!("drover-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let one = serde_json::to_vec(&record("ann", "prod", "2026-11-26T10:00:00.000Z"))
            .unwrap()
            .len() as u64
            + 1;
        // Room for two records a file, two rotated files kept.
        let mut log = Appender::open(&path, one * 2, 2).unwrap();
        for i in 0..7 {
            let user = if i % 2 == 0 { "ann" } else { "bob" };
            log.append(&[record(user, "prod", &format!("2026-11-26T10:00:0{i}.000Z"))])
                .unwrap();
        }
        assert_eq!(files(&path, 2).len(), 3);
        assert!(!PathBuf::from(format!("{}.3", path.display())).exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Seven written: 0-1, 2-3 and 4-5 filled a file each, 6 started the fourth; with two
        // rotated files kept, 0-1 are gone. Read oldest first.
        let all = read(&path, 2, &AuditQuery::default()).unwrap();
        let times: Vec<&str> = all.iter().map(|r| &r.time[17..19]).collect();
        assert_eq!(times, ["02", "03", "04", "05", "06"]);
        let bobs = read(
            &path,
            2,
            &AuditQuery {
                user: Some("bob".into()),
                since: Some("2026-11-26T10:00:04Z".into()),
                ..AuditQuery::default()
            },
        )
        .unwrap();
        assert_eq!(bobs.len(), 1);
        assert_eq!(bobs[0].time, "2026-11-26T10:00:05.000Z");
        let bad = read(
            &path,
            2,
            &AuditQuery {
                since: Some("yesterday".into()),
                ..AuditQuery::default()
            },
        );
        assert!(bad.is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
