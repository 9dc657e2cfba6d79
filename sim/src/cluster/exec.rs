//! `pods/exec` and `pods/attach` over WebSocket, as kube-apiserver serves kubectl 1.32:
//! subprotocol `v5.channel.k8s.io` (or `v4`), each binary message one channel's bytes after a
//! channel byte (0 stdin, 1 stdout, 2 stderr, 3 the closing Status, 4 terminal size, 255 a
//! stream's close in v5). What runs is the stand-in shell (`shell.rs`); attach shows the
//! container's stand-in log as it is written and echoes what it is sent.
//!
//! Over SPDY/3.1 too (`v4.channel.k8s.io`, one SPDY stream a channel), as kubectl before 1.31
//! speaks it and kubectl 1.32 with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`: `spdy.rs` turns
//! the streams into the same channel messages, so a session runs one way whatever carries it.

mod spdy;

use std::{
    collections::BTreeMap,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
};

use axum::{extract::Request, http::StatusCode, response::Response};
use futures::{SinkExt, Stream, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{
    Message,
    protocol::{CloseFrame, frame::coding::CloseCode},
};

use super::{
    Sim,
    request::Target,
    server::status,
    shell::{self, Context},
    store::StoreError,
    upgrade,
    verbs::{LOG_EVERY, container_of, log_line},
};

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5: `[255, channel]` says the peer has closed that stream (stdin's end).
const CLOSE: u8 = 255;
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// Where a session writes its channel messages, and where it reads the client's, whatever
/// carries them (WebSocket or SPDY): a task of the carrier's writes them out.
type Tx = futures::channel::mpsc::Sender<Message>;
type Rx = Pin<Box<dyn Stream<Item = Message> + Send>>;
/// How many of a session's messages may wait to be written.
const WAITING: usize = 16;
/// How long a container's process takes to start before it can write anything: on a real
/// node the kubelet and the runtime take milliseconds to start an exec. The stand-in waits
/// as long because kubectl 1.32 (client-go's WebSocket executor) reads the socket before it
/// has registered its streams and drops what arrives on a stream not yet registered ("Unknown
/// stream id 1, discarding message"): answering in the instant of the upgrade lost an exec's
/// whole output about once in 200 runs on a loaded machine.
const PROCESS_START: std::time::Duration = std::time::Duration::from_millis(100);

/// What the session runs.
#[derive(Debug)]
enum Job {
    Exec { argv: Vec<String> },
    Attach,
}

#[derive(Debug)]
struct Session {
    sim: Arc<Sim>,
    pod: String,
    namespace: String,
    container: String,
    env: Vec<(String, String)>,
    stdin: bool,
    tty: bool,
    job: Job,
}

/// Answers an exec or attach request: checks it as kube-apiserver does, then switches to
/// WebSocket and runs the session on its own task.
pub(super) fn stream(sim: &Arc<Sim>, target: &Target, request: Request) -> Response {
    let Some(pod) = sim.store.get("pods", &target.key()) else {
        return super::server::store_error(target, StoreError::NotFound);
    };
    let name = target.name.clone().unwrap_or_default();
    let pairs: Vec<(String, String)> =
        form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let single: BTreeMap<String, String> = pairs.iter().cloned().collect();
    let flag = |key: &str| matches!(single.get(key).map(String::as_str), Some("true" | "1"));
    let container = match container_of(&pod, &name, &single) {
        Ok(container) => container,
        Err(response) => return *response,
    };
    let job = if target.sub.as_deref() == Some("attach") {
        Job::Attach
    } else {
        let argv: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        if argv.is_empty() {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "you must specify at least 1 command",
            );
        }
        Job::Exec { argv }
    };
    if !flag("stdin") && !flag("stdout") && !flag("stderr") {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "you must specify at least 1 of stdin, stdout, stderr",
        );
    }
    let env = environment(&pod, &container, &name);
    let session = Arc::new(Session {
        sim: sim.clone(),
        pod: name,
        namespace: target.namespace.clone().unwrap_or_default(),
        container,
        env,
        stdin: flag("stdin"),
        tty: flag("tty"),
        job,
    });
    if spdy::asked(&request) {
        let expected = spdy::Expected {
            stdin: flag("stdin"),
            stdout: flag("stdout"),
            stderr: flag("stderr"),
            tty: flag("tty"),
        };
        return spdy::switch(request, expected, move |tx, rx| session.run(tx, rx, true));
    }
    upgrade::switch(
        request,
        &PROTOCOLS,
        "the simulated cluster streams exec and attach over WebSocket (v5.channel.k8s.io or v4.channel.k8s.io) or SPDY/3.1 (v4.channel.k8s.io)",
        move |socket, protocol| {
            let (sink, rx) = socket.split();
            let (tx, out) = futures::channel::mpsc::channel(WAITING);
            tokio::spawn(out.map(Ok).forward(sink));
            // A socket's error ends its messages, as its end does.
            let rx: Rx = Box::pin(
                rx.take_while(|m| std::future::ready(m.is_ok()))
                    .filter_map(|m| std::future::ready(m.ok())),
            );
            session.run(tx, rx, protocol == PROTOCOLS[0])
        },
    )
}

/// The container's environment as its process sees it: the pod's literal `env` values and
/// what the kubelet and the image add.
fn environment(pod: &Value, container: &str, name: &str) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "PATH".to_owned(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        ),
        ("HOSTNAME".to_owned(), name.to_owned()),
        ("HOME".to_owned(), "/root".to_owned()),
        ("KUBERNETES_SERVICE_HOST".to_owned(), "10.43.0.1".to_owned()),
        ("KUBERNETES_SERVICE_PORT".to_owned(), "443".to_owned()),
    ];
    let declared = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == container)
        .flat_map(|c| c["env"].as_array().cloned().unwrap_or_default());
    for var in declared {
        if let (Some(k), Some(v)) = (var["name"].as_str(), var["value"].as_str()) {
            env.push((k.to_owned(), v.to_owned()));
        }
    }
    env
}

impl Session {
    /// Runs the session; `closes_stdin` when the client can say stdin has ended without
    /// going (WebSocket v5, SPDY).
    async fn run(self: Arc<Self>, tx: Tx, rx: Rx, closes_stdin: bool) {
        self.sim.streams.fetch_add(1, Ordering::Relaxed);
        self.session(tx, rx, closes_stdin).await;
        self.sim.streams.fetch_sub(1, Ordering::Relaxed);
    }

    async fn session(&self, mut tx: Tx, mut rx: Rx, closes_stdin: bool) {
        tokio::time::sleep(PROCESS_START).await;
        let code = match &self.job {
            Job::Attach => {
                self.attach(&mut tx, &mut rx).await;
                None
            }
            Job::Exec { argv } if self.stdin && shell::is_interactive(argv) => {
                Some(self.interactive(&mut tx, &mut rx).await)
            }
            Job::Exec { argv } => {
                let mut input = Vec::new();
                if self.stdin && shell::reads_stdin(argv) {
                    // Until stdin closes: v5's close signal, or the socket's end.
                    while let Some(message) = rx.next().await {
                        match Input::of(message) {
                            Input::Data(bytes) => input.extend(bytes),
                            Input::Closed if closes_stdin => break,
                            Input::End => break,
                            _ => {}
                        }
                    }
                }
                let outcome = self.with_files(None, |cx| shell::run(argv, &input, cx));
                let _ = send(&mut tx, STDOUT, &outcome.stdout).await;
                let _ = send(&mut tx, STDERR, &outcome.stderr).await;
                Some((outcome.code, argv.join(" ")))
            }
        };
        if let Some((code, command)) = code {
            let _ = send(&mut tx, ERROR, exit_status(code, &command).as_bytes()).await;
        }
        let _ = tx
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
        let _ = tx.flush().await;
    }

    fn with_files<T>(
        &self,
        size: Option<(u16, u16)>,
        act: impl FnOnce(&mut Context<'_>) -> T,
    ) -> T {
        let mut containers = self
            .sim
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let files = containers
            .entry((
                self.namespace.clone(),
                self.pod.clone(),
                self.container.clone(),
            ))
            .or_insert_with(|| shell::Files::new(&self.pod));
        act(&mut Context {
            files,
            env: &self.env,
            size,
        })
    }

    /// A shell reading commands from stdin, one a line; with a terminal it echoes what is
    /// typed and prompts, as a shell on a tty does.
    async fn interactive(&self, tx: &mut Tx, rx: &mut Rx) -> (i32, String) {
        let newline = |bytes: Vec<u8>, tty: bool| -> Vec<u8> {
            if !tty {
                return bytes;
            }
            let mut out = Vec::with_capacity(bytes.len());
            for b in bytes {
                if b == b'\n' {
                    out.push(b'\r');
                }
                out.push(b);
            }
            out
        };
        let prompt = "/ # ";
        if self.tty {
            let _ = send(tx, STDOUT, prompt.as_bytes()).await;
        }
        let mut line = Vec::new();
        let mut code = 0;
        // What the client last said of its terminal (kubectl sends it first, then on resize).
        let mut size = None;
        while let Some(message) = rx.next().await {
            let bytes = match Input::of(message) {
                Input::Data(bytes) => bytes,
                Input::Resize(columns, rows) => {
                    size = Some((columns, rows));
                    continue;
                }
                Input::Closed | Input::End => break,
                Input::Other => continue,
            };
            for b in bytes {
                let end = b == b'\n' || b == b'\r';
                if self.tty {
                    let echo: &[u8] = match b {
                        b'\r' | b'\n' => b"\r\n",
                        0x7f | 0x08 => b"\x08 \x08",
                        _ => std::slice::from_ref(&b),
                    };
                    let _ = send(tx, STDOUT, echo).await;
                }
                if matches!(b, 0x7f | 0x08) {
                    line.pop();
                    continue;
                }
                if !end {
                    line.push(b);
                    continue;
                }
                let script = String::from_utf8_lossy(&std::mem::take(&mut line)).into_owned();
                let outcome = self.with_files(size.filter(|_| self.tty), |cx| {
                    shell::script_run(&script, &[], cx)
                });
                code = outcome.code;
                let (out, err) = (
                    newline(outcome.stdout, self.tty),
                    newline(outcome.stderr, self.tty),
                );
                let _ = send(tx, STDOUT, &out).await;
                // A terminal has one output stream.
                let _ = send(tx, if self.tty { STDOUT } else { STDERR }, &err).await;
                if outcome.exited {
                    return (code, "sh".into());
                }
                if self.tty {
                    let _ = send(tx, STDOUT, prompt.as_bytes()).await;
                }
            }
        }
        (code, "sh".into())
    }

    /// The container's output as it is written (its stand-in log lines), and what is typed
    /// on stdin echoed back, until the client goes.
    async fn attach(&self, tx: &mut Tx, rx: &mut Rx) {
        let every = std::time::Duration::from_millis(LOG_EVERY.whole_milliseconds() as u64);
        let mut tick = tokio::time::interval(every);
        let mut k = 0u64;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let line = log_line(&self.pod, &self.container, k);
                    k += 1;
                    if send(tx, STDOUT, line.as_bytes()).await.is_err() {
                        return;
                    }
                }
                message = rx.next() => match message.map(Input::of) {
                    Some(Input::Data(bytes)) if self.stdin => {
                        if send(tx, STDOUT, &bytes).await.is_err() {
                            return;
                        }
                    }
                    Some(Input::End) | None => return,
                    Some(_) => {}
                },
            }
        }
    }
}

/// One message from the client, by what it means to the session.
enum Input {
    /// Bytes on stdin.
    Data(Vec<u8>),
    /// v5: stdin closed.
    Closed,
    /// The terminal's new size (columns, rows).
    Resize(u16, u16),
    /// The socket is closing.
    End,
    /// Terminal size, pings, or a channel the session does not read.
    Other,
}

impl Input {
    fn of(message: Message) -> Self {
        match message {
            Message::Binary(bytes) => match bytes.split_first() {
                Some((&STDIN, rest)) => Input::Data(rest.to_vec()),
                Some((&CLOSE, [STDIN])) => Input::Closed,
                Some((&RESIZE, size)) => serde_json::from_slice::<Value>(size)
                    .ok()
                    .and_then(|v| {
                        let side = |k: &str| v[k].as_u64().and_then(|n| u16::try_from(n).ok());
                        Some(Input::Resize(side("Width")?, side("Height")?))
                    })
                    .unwrap_or(Input::Other),
                _ => Input::Other,
            },
            Message::Close(_) => Input::End,
            _ => Input::Other,
        }
    }
}

async fn send(
    tx: &mut Tx,
    channel: u8,
    bytes: &[u8],
) -> Result<(), futures::channel::mpsc::SendError> {
    if bytes.is_empty() {
        return Ok(());
    }
    let mut message = Vec::with_capacity(bytes.len() + 1);
    message.push(channel);
    message.extend_from_slice(bytes);
    tx.send(Message::Binary(message.into())).await
}

/// The Status on the error channel that ends an exec: success, or the exit code as kubectl
/// reads it (`command terminated with exit code N`).
fn exit_status(code: i32, command: &str) -> String {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"}).to_string();
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command [{command}], exit code {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
    .to_string()
}
