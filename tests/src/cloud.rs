//! A cloud for the `amazonec2` driver's tests: `moto`'s server (from PyPI, pinned in
//! `tests/moto/requirements.txt`) speaking the real EC2 Query API over TLS, with IAM
//! authentication on, so every request must carry a valid Signature Version 4; and a
//! stand-in hypervisor ([`Hypervisor`]), since moto's instances are records, not machines:
//! for each instance moto says is running it starts a network-namespace host at the
//! instance's private address and runs the instance's user data in it, as cloud-init would at
//! first boot, and powers the host off when the instance is terminated.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::Engine;
use drivers::{
    aws::{Client, Credentials},
    xml::Element,
};

use crate::{
    free_port,
    hosts::{Host, plug, unplug},
};

/// The VPC and subnet the test's instances get their addresses from: the hosts' bridge's.
pub const SUBNET_CIDR: &str = "10.213.0.0/24";
pub const REGION: &str = "us-east-1";

/// moto's server on a free loopback port, with an IAM user allowed `ec2:*`, `eks:*` and
/// `sts:*`.
#[derive(Debug)]
pub struct Moto {
    pub endpoint: String,
    /// The CA of moto's serving certificate (the template's `endpointCA`).
    pub ca_pem: String,
    /// The IAM user's access key: valid signatures with it are accepted, nothing else.
    pub credentials: Credentials,
    pub subnet_id: String,
    pub ami: String,
    child: Child,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// moto's server: its Python, with `tests/moto/serve.py` mending its signature check of
/// bodiless REST requests (EKS's GETs and DELETEs; see that file).
fn moto_server() -> (PathBuf, PathBuf) {
    let moto = Path::new(env!("CARGO_MANIFEST_DIR")).join("moto");
    let python = moto.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test --deps-only (it installs moto from tests/moto/requirements.txt)",
        python.display()
    );
    (python, moto.join("serve.py"))
}

impl Moto {
    pub async fn start(dir: &Path) -> Moto {
        let ca = tunnel::tls::CertificateAuthority::generate("test cloud CA").unwrap();
        let serving = ca.issue_server(&["127.0.0.1".to_owned()]).unwrap();
        std::fs::write(dir.join("moto.crt"), &serving.cert_pem).unwrap();
        std::fs::write(dir.join("moto.key"), &serving.key_pem).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("moto.log")).unwrap();
        let (python, serve) = moto_server();
        let child = Command::new(python)
            .arg(serve)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .arg("-c")
            .arg(dir.join("moto.crt"))
            .arg("-k")
            .arg(dir.join("moto.key"))
            // The first four requests (the IAM user's making, below) are not checked; every
            // later one must be signed by a key of that user.
            .env("INITIAL_NO_AUTH_ACTION_COUNT", "4")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let endpoint = format!("https://127.0.0.1:{port}");
        let ca_pem = ca.pem().cert_pem.clone();
        let anyone = Credentials {
            access_key_id: "AKIDSETUP".into(),
            secret_access_key: "setup".into(),
        };
        let iam = Client::new(
            &endpoint,
            REGION,
            "iam",
            "2010-05-08",
            anyone,
            Some(&ca_pem),
        )
        .unwrap();
        // Up once it answers (moto has no readiness signal of its own).
        crate::until(
            "moto's server answers",
            Duration::from_secs(60),
            async || {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            },
        )
        .await;
        let p = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        // moto takes connections a moment before its TLS answers on them (a handshake then
        // ends at once): the first call is made again until one gets through.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match iam.call("CreateUser", &p(&[("UserName", "drover")])).await {
                Ok(_) => break,
                Err(drivers::aws::AwsError::Unreachable(..))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("making the cloud's user: {e:?}"),
            }
        }
        let key = iam
            .call("CreateAccessKey", &p(&[("UserName", "drover")]))
            .await
            .unwrap();
        let key = key.descendant("AccessKey").unwrap();
        let credentials = Credentials {
            access_key_id: key.text_of("AccessKeyId").to_owned(),
            secret_access_key: key.text_of("SecretAccessKey").to_owned(),
        };
        let policy = iam
            .call(
                "CreatePolicy",
                &p(&[
                    ("PolicyName", "ec2"),
                    (
                        "PolicyDocument",
                        r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["ec2:*","eks:*","sts:*"],"Resource":"*"}]}"#,
                    ),
                ]),
            )
            .await
            .unwrap();
        let arn = policy.descendant("Arn").unwrap().text.clone();
        iam.call(
            "AttachUserPolicy",
            &p(&[("UserName", "drover"), ("PolicyArn", &arn)]),
        )
        .await
        .unwrap();
        let mut moto = Moto {
            endpoint,
            ca_pem,
            credentials,
            subnet_id: String::new(),
            ami: String::new(),
            child,
        };
        let ec2 = moto.ec2();
        let vpc = ec2
            .call("CreateVpc", &p(&[("CidrBlock", "10.213.0.0/16")]))
            .await
            .unwrap();
        let vpc = vpc.descendant("vpcId").unwrap().text.clone();
        let subnet = ec2
            .call(
                "CreateSubnet",
                &p(&[("VpcId", &vpc), ("CidrBlock", SUBNET_CIDR)]),
            )
            .await
            .unwrap();
        moto.subnet_id = subnet.descendant("subnetId").unwrap().text.clone();
        let images = ec2
            .call("DescribeImages", &p(&[("Owner.1", "amazon")]))
            .await
            .unwrap();
        moto.ami = images
            .descendant("imagesSet")
            .and_then(|s| s.find("item"))
            .map(|i| i.text_of("imageId").to_owned())
            .unwrap();
        moto
    }

    /// The `amazonec2` driver on moto (a small instance of moto's image in the test's subnet),
    /// signing with `credentials`.
    pub fn driver(&self, credentials: Credentials) -> drivers::ec2::Ec2 {
        let settings = drivers::ec2::Settings {
            ami: self.ami.clone(),
            instance_type: "t3.small".into(),
            subnet_id: self.subnet_id.clone(),
            root_size_gb: 20,
            ..drivers::ec2::Settings::default()
        };
        drivers::ec2::Ec2::new(
            &self.endpoint,
            REGION,
            credentials,
            Some(&self.ca_pem),
            settings,
        )
        .unwrap()
    }

    /// The EKS driver on moto, signing with `credentials`.
    pub fn eks(&self, credentials: Credentials) -> drivers::eks::Eks {
        drivers::eks::Eks::new(&self.endpoint, REGION, credentials, Some(&self.ca_pem)).unwrap()
    }

    /// A client of moto's EC2 with the IAM user's key.
    pub fn ec2(&self) -> Client {
        Client::new(
            &self.endpoint,
            REGION,
            "ec2",
            "2016-11-15",
            self.credentials.clone(),
            Some(&self.ca_pem),
        )
        .unwrap()
    }

    /// Every instance moto holds: (id, state, private address, tags).
    /// Every instance moto holds, terminated ones too, every page of them (moto answers 100
    /// at a time).
    pub async fn instances(&self) -> Vec<Instance> {
        let ec2 = self.ec2();
        let mut all = Vec::new();
        let mut next = String::new();
        loop {
            let page = if next.is_empty() {
                Vec::new()
            } else {
                vec![("NextToken".to_owned(), next.clone())]
            };
            let answer = ec2.call("DescribeInstances", &page).await.unwrap();
            for reservation in answer
                .find("reservationSet")
                .map(|r| r.all("item").collect::<Vec<_>>())
                .unwrap_or_default()
            {
                for item in reservation
                    .find("instancesSet")
                    .map(|r| r.all("item").collect::<Vec<_>>())
                    .unwrap_or_default()
                {
                    all.push(Instance::of(item));
                }
            }
            next = answer.text_of("nextToken").to_owned();
            if next.is_empty() {
                return all;
            }
        }
    }
}

/// An instance as moto describes it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub id: String,
    pub state: String,
    pub address: String,
    pub tags: BTreeMap<String, String>,
}

impl Instance {
    fn of(item: &Element) -> Instance {
        let tags = item
            .find("tagSet")
            .map(|t| {
                t.all("item")
                    .map(|i| (i.text_of("key").to_owned(), i.text_of("value").to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        Instance {
            id: item.text_of("instanceId").to_owned(),
            state: item
                .find("instanceState")
                .map(|s| s.text_of("name").to_owned())
                .unwrap_or_default(),
            address: item.text_of("privateIpAddress").to_owned(),
            tags,
        }
    }

    pub fn live(&self) -> bool {
        !matches!(self.state.as_str(), "terminated" | "shutting-down")
    }
}

/// The stand-in hypervisor: boots moto's instances as network-namespace hosts.
#[derive(Debug)]
pub struct Hypervisor {
    stop: tokio_util::sync::CancellationToken,
    /// Instance id → the host it runs as; the user data each ran.
    pub booted: Arc<Mutex<BTreeMap<String, (usize, String)>>>,
}

impl Drop for Hypervisor {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Hypervisor {
    /// Boots every running instance of `moto` as host `drv-hN` (N from 1) under `dir`, with
    /// `before` run first in its mount namespace; powers it off once terminated. The test holds
    /// a [`crate::hosts::Network`] (the bridge) meanwhile.
    pub fn start(
        moto: Arc<Moto>,
        dir: &Path,
        before: impl Fn(&Host) -> String + Send + 'static,
    ) -> Hypervisor {
        let stop = tokio_util::sync::CancellationToken::new();
        let booted: Arc<Mutex<BTreeMap<String, (usize, String)>>> = Arc::default();
        let (dir, token, record) = (dir.to_owned(), stop.clone(), booted.clone());
        tokio::spawn(async move {
            let mut hosts: BTreeMap<String, Host> = BTreeMap::new();
            let mut next = 1;
            let ec2 = moto.ec2();
            loop {
                for instance in moto.instances().await {
                    let known = hosts.contains_key(&instance.id);
                    if instance.live() && !known && !instance.address.is_empty() {
                        let attribute = ec2
                            .call(
                                "DescribeInstanceAttribute",
                                &[
                                    ("InstanceId".to_owned(), instance.id.clone()),
                                    ("Attribute".to_owned(), "userData".to_owned()),
                                ],
                            )
                            .await
                            .unwrap();
                        let encoded = attribute
                            .descendant("userData")
                            .map(|u| u.text_of("value").to_owned())
                            .unwrap_or_default();
                        let user_data = String::from_utf8(
                            base64::engine::general_purpose::STANDARD
                                .decode(encoded.trim())
                                .unwrap(),
                        )
                        .unwrap();
                        plug(next, &instance.address);
                        let host = Host::new(&dir, next);
                        let script = host.dir.join("user-data");
                        std::fs::write(&script, &user_data).unwrap();
                        host.spawn(&format!("{} && sh {}", before(&host), script.display()));
                        record
                            .lock()
                            .unwrap()
                            .insert(instance.id.clone(), (next, user_data));
                        hosts.insert(instance.id.clone(), host);
                        next += 1;
                    } else if !instance.live()
                        && let Some(host) = hosts.remove(&instance.id)
                    {
                        unplug(host.i);
                    }
                }
                // moto has no event stream: look again shortly, as a hypervisor's poll would.
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(300)) => {}
                }
            }
        });
        Hypervisor { stop, booted }
    }
}

/// How a stand-in in front of moto reaches it: moto's address, and a TLS connector trusting
/// moto's CA.
#[derive(Clone)]
pub struct Upstream {
    addr: std::net::SocketAddr,
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Upstream({})", self.addr)
    }
}

impl Upstream {
    /// Sends a request on to moto untouched (its signature covers what it forwards): the
    /// answer's status, headers and body.
    pub async fn send(
        &self,
        parts: hyper::http::request::Parts,
        body: bytes::Bytes,
    ) -> (hyper::StatusCode, hyper::HeaderMap, bytes::Bytes) {
        use http_body_util::BodyExt;
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let tls = self
            .connector
            .connect("127.0.0.1".try_into().unwrap(), tcp)
            .await
            .unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        let forwarded = hyper::Request::from_parts(parts, http_body_util::Full::new(body));
        let response = sender.send_request(forwarded).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, body)
    }
}

/// A stand-in in front of `moto`: a TLS server at its own loopback port, with the serving
/// certificate moto's start left in `dir`, whose every request `answer` takes (with `state`,
/// and how to reach moto). Returns its endpoint, and the task that serves until aborted.
pub async fn front<S, F, Fut>(
    moto: &Moto,
    dir: &Path,
    state: Arc<S>,
    answer: F,
) -> (String, tokio::task::JoinHandle<()>)
where
    S: Send + Sync + 'static,
    F: Fn(hyper::Request<hyper::body::Incoming>, Upstream, Arc<S>) -> Fut
        + Clone
        + Send
        + Sync
        + 'static,
    Fut: std::future::Future<Output = hyper::Response<http_body_util::Full<bytes::Bytes>>>
        + Send
        + 'static,
{
    let cert = std::fs::read(dir.join("moto.crt")).unwrap();
    let key = std::fs::read(dir.join("moto.key")).unwrap();
    let acceptor =
        tokio_rustls::TlsAcceptor::from(tunnel::tls::server_config(&cert, &key).unwrap());
    let roots = tunnel::tls::roots_from_pem(moto.ca_pem.as_bytes()).unwrap();
    let upstream = Upstream {
        addr: moto
            .endpoint
            .trim_start_matches("https://")
            .parse()
            .unwrap(),
        connector: tokio_rustls::TlsConnector::from(tunnel::tls::client_config(roots)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("https://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, upstream, state, answer) = (
                acceptor.clone(),
                upstream.clone(),
                state.clone(),
                answer.clone(),
            );
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |request| {
                    let answered = answer(request, upstream.clone(), state.clone());
                    async move { Ok::<_, std::convert::Infallible>(answered.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (endpoint, task)
}
