//! Commands on a machine over SSH, with OpenSSH's own client (`ssh`, as docker-machine's
//! "external" SSH does): key authentication only, and the machine's host key pinned. At first
//! contact the key the machine presents is recorded and returned, for the caller to keep; from
//! then on only that key is accepted, and a machine that presents another is refused
//! ([`SshError::HostKeyChanged`]), never trusted.
//!
//! The private key and the pinned key go to files of their own (owner-only, in a directory
//! made for the one call and removed after it); nothing from the user's or the system's SSH
//! configuration is read.

use std::{
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::io::AsyncWriteExt;

use crate::{BoxFuture, CreateRequest, Driver, DriverError, Machine, MachineState};

/// Where and as whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub address: String,
    pub port: u16,
    pub user: String,
}

impl Target {
    /// How OpenSSH names the host in `known_hosts`: `ADDR` on port 22, else `[ADDR]:PORT`.
    fn known_hosts_name(&self) -> String {
        if self.port == 22 {
            self.address.clone()
        } else {
            format!("[{}]:{}", self.address, self.port)
        }
    }
}

/// A private key (OpenSSH or PEM text). Never printed.
#[derive(Clone)]
pub struct PrivateKey(String);

impl PrivateKey {
    pub fn new(text: impl Into<String>) -> Self {
        let mut text = text.into();
        // OpenSSH refuses a key file without its final newline.
        if !text.ends_with('\n') {
            text.push('\n');
        }
        PrivateKey(text)
    }
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrivateKey(…)")
    }
}

/// What a command did, and the host key the machine presented (`TYPE BASE64`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub host_key: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SshError {
    #[error(
        "{address}: the machine's host key is not the one recorded for it ({expected}); refusing to trust it. If the machine was rebuilt on purpose, remove the recorded key"
    )]
    HostKeyChanged { address: String, expected: String },
    #[error("{0}: the machine refused the key (check the user and the machine's authorized_keys)")]
    AuthRefused(String),
    #[error("{0}: cannot connect: {1}")]
    Unreachable(String, String),
    #[error("{0}: no answer within {1:?}")]
    Timeout(String, Duration),
    #[error("{0}")]
    Local(String),
}

/// A recorded host key as `TYPE BASE64` (what follows the host names in a `known_hosts` line,
/// or a `.pub` file without its comment); `None` if `text` is not one.
pub fn host_key_of(text: &str) -> Option<String> {
    let mut words = text.split_whitespace();
    let (kind, key) = (words.next()?, words.next()?);
    let known = kind.starts_with("ssh-") || kind.starts_with("ecdsa-") || kind.starts_with("sk-");
    (known
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b)))
    .then(|| format!("{kind} {key}"))
}

/// docker-machine's "generic" driver as a [`Driver`]: a pool of existing machines. Making one
/// takes the first address no other machine holds; destroying one gives its address back (the
/// caller undoes its bootstrap over SSH first, with [`run`]). Existing machines carry no tags,
/// so the caller's records are the only list of what is in use.
#[derive(Debug, Clone)]
pub struct Pool {
    pub addresses: Vec<String>,
    pub user: String,
    pub port: u16,
    /// The addresses other machines hold.
    pub held: Vec<String>,
}

impl Pool {
    fn machine(&self, address: &str) -> Machine {
        Machine {
            id: format!("ssh://{}@{address}:{}", self.user, self.port),
            addresses: vec![address.to_owned()],
            state: MachineState::Running,
        }
    }
}

impl Driver for Pool {
    fn create<'a>(
        &'a self,
        _request: &'a CreateRequest<'a>,
    ) -> BoxFuture<'a, Result<Machine, DriverError>> {
        let free = self.addresses.iter().find(|a| !self.held.contains(a));
        let made = free.map(|a| self.machine(a)).ok_or_else(|| {
            DriverError::Exhausted(format!(
                "all {} addresses are in use; add addresses with a new template",
                self.addresses.len()
            ))
        });
        Box::pin(async move { made })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Machine>, DriverError>> {
        let found = self
            .addresses
            .iter()
            .map(|a| self.machine(a))
            .find(|m| m.id == id);
        Box::pin(async move { Ok(found) })
    }

    fn delete<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async { Ok(()) })
    }

    fn list<'a>(
        &'a self,
        _key: &'a str,
        _value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Machine>, DriverError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn boots_user_data(&self) -> bool {
        false
    }
}

/// A directory for one call's files, owner-only, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Self, SshError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "drover-ssh-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| SshError::Local(format!("{}: {e}", dir.display())))?;
        Ok(Scratch(dir))
    }

    fn write(&self, name: &str, text: &str) -> Result<PathBuf, SshError> {
        use std::io::Write;
        let path = self.0.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| SshError::Local(format!("{}: {e}", path.display())))?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `command` on the machine (through its login shell, as `ssh` does), feeding it
/// `stdin`. With `pinned`, only that host key is accepted; without, this is the first contact
/// and the key presented is recorded. The command's own failure is an [`Outcome`] with its
/// exit code; failing to get there (refused key, changed host key, no route) is an error.
pub async fn run(
    target: &Target,
    key: &PrivateKey,
    pinned: Option<&str>,
    command: &str,
    stdin: &[u8],
    timeout: Duration,
) -> Result<Outcome, SshError> {
    let scratch = Scratch::new()?;
    let identity = scratch.write("id", &key.0)?;
    let host = target.known_hosts_name();
    let known = match pinned {
        Some(pinned) => {
            let pinned = host_key_of(pinned).ok_or_else(|| {
                SshError::Local(format!("{pinned:?} is not an SSH host key (TYPE BASE64)"))
            })?;
            scratch.write("known_hosts", &format!("{host} {pinned}\n"))?
        }
        None => scratch.write("known_hosts", "")?,
    };
    let mut child = tokio::process::Command::new("ssh")
        .args(options(target, &identity, &known, pinned.is_some()))
        .arg("--")
        .arg(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| SshError::Local(format!("cannot run OpenSSH's ssh client: {e}")))?;
    let mut input = child.stdin.take();
    let feed = async {
        if let Some(input) = &mut input {
            let _ = input.write_all(stdin).await;
        }
        drop(input);
    };
    let (_, output) = match tokio::time::timeout(timeout, async {
        tokio::join!(feed, child.wait_with_output())
    })
    .await
    {
        Ok(done) => done,
        Err(_) => return Err(SshError::Timeout(target.address.clone(), timeout)),
    };
    let output = output.map_err(|e| SshError::Local(format!("ssh: {e}")))?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let exit_code = output.status.code().unwrap_or(-1);
    // 255 is ssh's own failure; anything else is the remote command's.
    if exit_code == 255 {
        return Err(failure(target, pinned, &stderr));
    }
    let recorded = std::fs::read_to_string(&known).unwrap_or_default();
    let host_key = recorded
        .lines()
        .find_map(|line| {
            let (names, rest) = line.split_once(' ')?;
            (names == host).then(|| host_key_of(rest)).flatten()
        })
        .ok_or_else(|| SshError::Local(format!("{host}: ssh recorded no host key")))?;
    Ok(Outcome {
        exit_code,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr,
        host_key,
    })
}

/// The client's options: this call's files and nothing else, key authentication only, never a
/// prompt; a pinned key strictly, else the first key accepted and recorded.
fn options(target: &Target, identity: &Path, known: &Path, pinned: bool) -> Vec<String> {
    let o = |kv: String| ["-o".to_owned(), kv];
    let mut args = vec!["-F".to_owned(), "/dev/null".to_owned()];
    for kv in [
        format!("UserKnownHostsFile={}", known.display()),
        "GlobalKnownHostsFile=/dev/null".to_owned(),
        format!(
            "StrictHostKeyChecking={}",
            if pinned { "yes" } else { "accept-new" }
        ),
        "UpdateHostKeys=no".to_owned(),
        "HashKnownHosts=no".to_owned(),
        format!("IdentityFile={}", identity.display()),
        "IdentitiesOnly=yes".to_owned(),
        "IdentityAgent=none".to_owned(),
        "BatchMode=yes".to_owned(),
        "PasswordAuthentication=no".to_owned(),
        "KbdInteractiveAuthentication=no".to_owned(),
        "PubkeyAuthentication=yes".to_owned(),
        "ConnectTimeout=10".to_owned(),
        "ServerAliveInterval=15".to_owned(),
        "LogLevel=ERROR".to_owned(),
    ] {
        args.extend(o(kv));
    }
    args.extend([
        "-p".to_owned(),
        target.port.to_string(),
        "-l".to_owned(),
        target.user.clone(),
        target.address.clone(),
    ]);
    args
}

/// Why ssh itself failed, from what it printed.
fn failure(target: &Target, pinned: Option<&str>, stderr: &str) -> SshError {
    let address = target.address.clone();
    if stderr.contains("Host key verification failed")
        || stderr.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
    {
        return SshError::HostKeyChanged {
            address,
            expected: pinned.unwrap_or_default().to_owned(),
        };
    }
    if stderr.contains("Permission denied") {
        return SshError::AuthRefused(address);
    }
    let why = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("ssh failed")
        .trim()
        .to_owned();
    SshError::Unreachable(address, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_keys_read_from_known_hosts_and_pub_files() {
        assert_eq!(
            host_key_of("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB+x root@h1").as_deref(),
            Some("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB+x")
        );
        assert_eq!(
            host_key_of("ecdsa-sha2-nistp256 AAAAE2Vj=").as_deref(),
            Some("ecdsa-sha2-nistp256 AAAAE2Vj=")
        );
        assert_eq!(host_key_of("10.0.0.1 ssh-ed25519 AAAA"), None);
        assert_eq!(host_key_of("ssh-ed25519"), None);
        assert_eq!(host_key_of("ssh-ed25519 AA;rm -rf"), None);
    }

    #[test]
    fn the_client_reads_no_configuration_and_never_prompts() {
        let target = Target {
            address: "10.0.0.1".into(),
            port: 2222,
            user: "root".into(),
        };
        let args = options(&target, Path::new("/k/id"), Path::new("/k/known"), true);
        let text = args.join(" ");
        for wanted in [
            "-F /dev/null",
            "StrictHostKeyChecking=yes",
            "BatchMode=yes",
            "PasswordAuthentication=no",
            "IdentitiesOnly=yes",
            "UserKnownHostsFile=/k/known",
            "GlobalKnownHostsFile=/dev/null",
            "-p 2222 -l root 10.0.0.1",
        ] {
            assert!(text.contains(wanted), "{wanted}: {text}");
        }
        let first = options(&target, Path::new("/k/id"), Path::new("/k/known"), false).join(" ");
        assert!(first.contains("StrictHostKeyChecking=accept-new"));
        assert_eq!(target.known_hosts_name(), "[10.0.0.1]:2222");
    }

    #[test]
    fn ssh_failures_say_what_to_fix() {
        let target = Target {
            address: "h".into(),
            port: 22,
            user: "root".into(),
        };
        assert!(matches!(
            failure(
                &target,
                Some("ssh-ed25519 AAAA"),
                "@@@@\nWARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!\nHost key verification failed.\n"
            ),
            SshError::HostKeyChanged { .. }
        ));
        assert_eq!(
            failure(&target, None, "root@h: Permission denied (publickey).\n"),
            SshError::AuthRefused("h".into())
        );
        assert_eq!(
            failure(
                &target,
                None,
                "ssh: connect to host h port 22: Connection refused\n"
            ),
            SshError::Unreachable(
                "h".into(),
                "ssh: connect to host h port 22: Connection refused".into()
            )
        );
    }
}
