//! A real etcd (Debian's `etcd-server`, or `$DROVER_ETCD`) started on loopback for the tests
//! and benchmarks of the hub's HA store: a one-member cluster (or several members, started
//! together) with its own data directory and free ports, killed and its data removed when
//! dropped. Nothing is simulated here; this only
//! spares each test the same dozen flags.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A running etcd member.
#[derive(Debug)]
pub struct LocalEtcd {
    child: Option<Child>,
    dir: PathBuf,
    client: SocketAddr,
    peer: SocketAddr,
    /// The member's name, and the cluster it starts in (`--initial-cluster`); `None`: alone.
    member: Option<(String, String)>,
}

fn free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()
}

/// The etcd binary: `$DROVER_ETCD`, or `etcd` on the PATH.
fn binary() -> String {
    std::env::var("DROVER_ETCD").unwrap_or_else(|_| "etcd".to_owned())
}

impl LocalEtcd {
    /// Starts a member whose data lives in a new directory under `parent`, and waits until it
    /// answers its health check.
    pub fn start(parent: &Path) -> std::io::Result<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("etcd-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut etcd = Self {
            child: None,
            dir,
            client: free_port()?,
            peer: free_port()?,
            member: None,
        };
        // A port found free may be taken before etcd binds it (tests start many at once):
        // then again on other ports.
        let mut tries = 3;
        loop {
            match etcd.restart() {
                Ok(()) => return Ok(etcd),
                Err(e) if tries == 1 => return Err(e),
                Err(_) => {
                    tries -= 1;
                    etcd.kill();
                    let _ = std::fs::remove_dir_all(etcd.dir.join("data"));
                    etcd.client = free_port()?;
                    etcd.peer = free_port()?;
                }
            }
        }
    }

    /// A cluster of `n` members, started together (a member is healthy only once a quorum of
    /// the cluster is up), each with its own data directory under `parent`.
    pub fn start_cluster(parent: &Path, n: usize) -> std::io::Result<Vec<Self>> {
        // Ports found free may be taken before etcd binds them (tests start many at once):
        // then the whole cluster again on other ports (a failed try's members are killed as
        // they drop).
        let mut tries = 3;
        loop {
            match Self::try_cluster(parent, n) {
                Ok(members) => return Ok(members),
                Err(e) if tries == 1 => return Err(e),
                Err(_) => tries -= 1,
            }
        }
    }

    fn try_cluster(parent: &Path, n: usize) -> std::io::Result<Vec<Self>> {
        let dir = parent.join(format!("etcd-cluster-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut members = Vec::new();
        for i in 0..n {
            let dir = dir.join(format!("member-{i}"));
            std::fs::create_dir_all(&dir)?;
            members.push(Self {
                child: None,
                dir,
                client: free_port()?,
                peer: free_port()?,
                member: None,
            });
        }
        let cluster = members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("drover-test-{i}=http://{}", m.peer))
            .collect::<Vec<_>>()
            .join(",");
        for (i, member) in members.iter_mut().enumerate() {
            member.member = Some((format!("drover-test-{i}"), cluster.clone()));
            member.spawn()?;
        }
        for member in &mut members {
            member.wait_healthy()?;
        }
        Ok(members)
    }

    /// The hub's `--store` value for every member of `cluster`.
    pub fn cluster_url(cluster: &[Self]) -> String {
        let hosts: Vec<String> = cluster.iter().map(|m| m.client.to_string()).collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// (Re)starts the member on the same ports and data, e.g. after [`LocalEtcd::kill`].
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.spawn()?;
        self.wait_healthy()
    }

    /// Starts the member's process (killing a running one first).
    fn spawn(&mut self) -> std::io::Result<()> {
        self.kill();
        let (client, peer) = (
            format!("http://{}", self.client),
            format!("http://{}", self.peer),
        );
        let (name, cluster) = self
            .member
            .clone()
            .unwrap_or_else(|| ("drover-test".to_owned(), format!("drover-test={peer}")));
        let log = std::fs::File::create(self.dir.join("etcd.log"))?;
        let child = Command::new(binary())
            .args(["--name", &name])
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &cluster])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot start {:?} ({e}): install Debian's etcd-server (or set DROVER_ETCD to an etcd binary)",
                        binary()
                    ),
                )
            })?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the member answers its health check, and is still running a moment later.
    fn wait_healthy(&mut self) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.healthy() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                return Err(std::io::Error::other(format!(
                    "etcd exited ({status}): {tail:?}"
                )));
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(
                    "etcd did not become healthy within 30 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // A member that could not bind its port exits at once, but the health check may have
        // reached whoever holds the port: healthy only if it is still running a moment later.
        std::thread::sleep(Duration::from_millis(200));
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            return Err(std::io::Error::other(format!(
                "etcd exited ({status}) after starting"
            )));
        }
        Ok(())
    }

    /// etcd's own health check: `GET /health` on the client port answers `"health":"true"`.
    fn healthy(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect_timeout(&self.client, Duration::from_secs(1))
        else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        if stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    /// The hub's `--store` value for this member.
    pub fn store_url(&self) -> String {
        format!("etcd://{}", self.client)
    }

    /// Where the member serves its clients.
    pub fn client_addr(&self) -> std::net::SocketAddr {
        self.client
    }

    /// Kills the member (SIGKILL), keeping its data.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
