//! The agent's `kube-api` service between a hub's tunnel stream and an API server: what the API
//! server receives, what comes back, and how streams end. A test hub (`tunnel::testing`) holds
//! the agent's session; a stand-in API server over TLS says what it received.

// A fixture that cannot be set up means the machine is broken: panicking says so plainly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use agentkit::{kube::KubeTarget, kube_api};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tunnel::{AcceptorConfig, Connector, Services, TunnelStream, testing::*};

/// A stand-in API server: every answer says what the request was (method, path and query,
/// `Authorization`, `Host`, body) and which of its connections (1, 2, …) carried it. `/close`
/// is answered with `Connection: close`; a request with `Upgrade` gets 101 and its bytes
/// echoed.
struct ApiServer {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl ApiServer {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let leaf = ca().issue_server(&["127.0.0.1".into()]).unwrap();
        let tls =
            tunnel::tls::server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| answer(request, n));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Self { port, connections }
    }

    /// The agent's view of this server: a kubeconfig with its address, CA and the agent's token.
    fn target(&self) -> KubeTarget {
        target_at(self.port)
    }
}

fn target_at(port: u16) -> KubeTarget {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem());
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    token: agent-token\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    );
    KubeTarget::from_kubeconfig_text(&kubeconfig, "test").unwrap()
}

async fn answer(
    mut request: Request<Incoming>,
    connection: usize,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.headers().contains_key("upgrade") {
        let upgraded = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            let mut io = TokioIo::new(upgraded.await.unwrap());
            let mut buf = [0; 1024];
            while let Ok(n @ 1..) = io.read(&mut buf).await {
                io.write_all(&buf[..n]).await.unwrap();
            }
        });
        let response = Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "echo")
            .body(Full::default())
            .unwrap();
        return Ok(response);
    }
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let header = |name: &str| {
        parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect::<Vec<_>>()
            .join(",")
    };
    let text = format!(
        "{} {} auth={} host={} connection={connection} body={}",
        parts.method,
        parts.uri,
        header("authorization"),
        header("host"),
        String::from_utf8_lossy(&body)
    );
    let mut response = Response::new(Full::new(Bytes::from(text)));
    if parts.uri.path() == "/close" {
        response
            .headers_mut()
            .insert("connection", "close".parse().unwrap());
    }
    Ok(response)
}

/// A test hub and an agent connected to it serving `kube-api` for `target`.
async fn agent_serving(target: KubeTarget) -> (TestHub, tunnel::Session) {
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let mut config = agent_config(&hub, "cluster-agent");
    let upstream = kube_api::Upstream::new(target);
    config.services = Services::default().add(proto::KUBE_API_SERVICE, move |stream| {
        kube_api::serve(stream, upstream.clone())
    });
    let agent = Connector::new(config).unwrap().connect().await.unwrap();
    // The agent's side lives as long as the test.
    std::mem::forget(agent);
    let session = hub.session("cluster-agent").await;
    (hub, session)
}

async fn stream(session: &tunnel::Session) -> TunnelStream {
    session.open_service(proto::KUBE_API_SERVICE).await.unwrap()
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// An HTTP/1 client on `stream`, and the task that drives it (it ends when the stream does).
async fn http1(stream: TunnelStream) -> (Sender, tokio::task::JoinHandle<()>) {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    (sender, driver)
}

/// Status and body of `method path` sent on `sender` with `body`.
async fn call(sender: &mut Sender, method: &str, path: &str, body: &str) -> (u16, String) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "hub.example")
        .header("authorization", "Bearer the-users-own-token")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Reads from `stream` until what has arrived holds `until`.
async fn read_until(stream: &mut TunnelStream, until: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0; 4096];
    tokio::time::timeout(Duration::from_secs(10), async {
        while !String::from_utf8_lossy(&seen).contains(until) {
            let n = stream.read(&mut buf).await.unwrap();
            assert_ne!(
                n,
                0,
                "the stream ended; it held: {}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {until:?} in: {}", String::from_utf8_lossy(&seen)));
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_on_with_the_agents_credential_and_answers_come_back_on_one_connection() {
    let api = ApiServer::start().await;
    let (_hub, session) = agent_serving(api.target()).await;
    let (mut sender, driver) = http1(stream(&session).await).await;
    let agent = format!("auth=Bearer agent-token host=127.0.0.1:{}", api.port);

    let (status, body) = call(&mut sender, "GET", "/api/v1/pods?limit=1", "").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        format!("GET /api/v1/pods?limit=1 {agent} connection=1 body=")
    );
    let manifest = "{\"kind\":\"ConfigMap\"}".repeat(2000);
    let (status, body) = call(&mut sender, "POST", "/api/v1/configmaps", &manifest).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        format!("POST /api/v1/configmaps {agent} connection=1 body={manifest}")
    );

    // A chunked body, and a request sent behind it before its answer: both framed apart.
    let mut raw = stream(&session).await;
    raw.write_all(
        b"PATCH /apis/apps/v1/deployments/web HTTP/1.1\r\nhost: hub\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\nGET /version HTTP/1.1\r\nhost: hub\r\n\r\n",
    )
    .await
    .unwrap();
    let seen = read_until(&mut raw, "GET /version").await;
    assert!(
        seen.contains(&format!(
            "PATCH /apis/apps/v1/deployments/web {agent} connection=2 body=hello world"
        )),
        "{seen}"
    );
    assert!(
        seen.contains(&format!("GET /version {agent} connection=2 body=")),
        "{seen}"
    );
    assert_eq!(api.connections.load(Ordering::SeqCst), 2);

    // The API server closes its connection: the stream ends with it.
    let (status, _) = call(&mut sender, "GET", "/close", "").await;
    assert_eq!(status, 200);
    tokio::time::timeout(Duration::from_secs(10), driver)
        .await
        .expect("the stream closes when the API server closes its connection")
        .unwrap();
    assert!(sender.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_becomes_a_byte_stream_both_ways() {
    let api = ApiServer::start().await;
    let (_hub, session) = agent_serving(api.target()).await;
    let mut raw = stream(&session).await;
    raw.write_all(b"GET /api/v1/namespaces/default/pods/web-0/exec?command=sh HTTP/1.1\r\nhost: hub\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n")
        .await
        .unwrap();
    read_until(&mut raw, "\r\n\r\n").await;
    raw.write_all(b"ping through the upgraded stream")
        .await
        .unwrap();
    read_until(&mut raw, "ping through the upgraded stream").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_out_of_reach_or_a_malformed_request_is_answered_with_why() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let (_hub, session) = agent_serving(target_at(port)).await;
    let (mut sender, _) = http1(stream(&session).await).await;
    let (status, body) = call(&mut sender, "GET", "/api", "").await;
    assert_eq!(status, 502);
    assert!(
        body.contains(&format!(
            "the cluster-agent cannot reach its API server at https://127.0.0.1:{port}"
        )),
        "{body}"
    );

    let mut raw = stream(&session).await;
    raw.write_all(b"GET /api HTTP/1.1\r\nthis is no header\r\n\r\n")
        .await
        .unwrap();
    let seen = read_until(&mut raw, "cannot be read").await;
    assert!(seen.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{seen}");
}
