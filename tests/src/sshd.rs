//! A real OpenSSH server (Debian's `openssh-server`) in a network-namespace host, key
//! authentication only, for the machine drivers' tests. Needs root.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{
    hosts::{Host, address},
    sh,
};

/// A key pair made with `ssh-keygen` (ed25519): the private key's text and the public line.
#[derive(Debug)]
pub struct KeyPair {
    pub private: String,
    pub public: String,
}

impl KeyPair {
    pub fn new(dir: &Path, name: &str) -> KeyPair {
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(path.with_extension("pub"));
        sh(&format!(
            "ssh-keygen -q -t ed25519 -N '' -C {name} -f {}",
            path.display()
        ));
        KeyPair {
            private: std::fs::read_to_string(&path).unwrap(),
            public: std::fs::read_to_string(format!("{}.pub", path.display())).unwrap(),
        }
    }
}

/// sshd on host `host` (port 22 at its address), with its own host key and `authorized` as
/// the only key it lets in.
#[derive(Debug)]
pub struct Sshd {
    pub address: String,
    pub host_key: KeyPair,
    dir: PathBuf,
    host_index: usize,
    /// Run before sshd in the host's mount namespace (its sessions see what it mounts).
    before: String,
}

impl Sshd {
    pub fn start(host: &Host, authorized: &KeyPair) -> Sshd {
        Self::start_after(host, authorized, "true")
    }

    /// As [`Sshd::start`], running `before` first in the host's mount namespace.
    pub fn start_after(host: &Host, authorized: &KeyPair, before: &str) -> Sshd {
        let dir = host.dir.join("sshd");
        std::fs::create_dir_all(&dir).unwrap();
        let host_key = KeyPair::new(&dir, "host_key");
        std::fs::write(dir.join("authorized_keys"), &authorized.public).unwrap();
        let address = address(host.i);
        std::fs::write(
            dir.join("sshd_config"),
            format!(
                "Port 22\nListenAddress {address}\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
                 PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile {d}/sshd.pid\n",
                d = dir.display()
            ),
        )
        .unwrap();
        std::fs::create_dir_all("/run/sshd").unwrap();
        let sshd = Sshd {
            address,
            host_key,
            dir,
            host_index: host.i,
            before: before.to_owned(),
        };
        sshd.spawn(host);
        sshd
    }

    fn spawn(&self, host: &Host) {
        host.spawn(&format!(
            "{} && exec /usr/sbin/sshd -D -e -f {}/sshd_config",
            self.before,
            self.dir.display()
        ));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect((self.address.as_str(), 22)).is_err() {
            assert!(
                Instant::now() < deadline,
                "sshd did not listen on {}:22",
                self.address
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The host key as the driver records it: `TYPE BASE64`.
    pub fn recorded_key(&self) -> String {
        let mut words = self.host_key.public.split_whitespace();
        format!("{} {}", words.next().unwrap(), words.next().unwrap())
    }

    /// The machine is rebuilt: sshd comes back with a new host key.
    pub fn rebuild(&mut self, host: &Host) {
        self.stop();
        self.host_key = KeyPair::new(&self.dir, "host_key");
        self.spawn(host);
    }

    pub fn stop(&self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("sshd.pid")) {
            crate::quiet(&format!("kill {}", pid.trim()));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect((self.address.as_str(), 22)).is_ok() {
            assert!(
                Instant::now() < deadline,
                "sshd on host {} did not stop",
                self.host_index
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
