//! What the stand-in's `k3s`/`rke2` command does after installation, as far as the hub's day-2
//! plans use it: `etcd-snapshot save|ls|delete`, `server --cluster-reset
//! --cluster-reset-restore-path=FILE` and `certificate rotate`; and a `systemctl` for the
//! stand-in's own units, because a network namespace in a test has no systemd. The snapshot
//! of the simulated cluster is its whole object store, read from the running node service
//! (as `etcd-snapshot save` asks the running etcd), so a restore brings back exactly the
//! objects that existed when it was taken.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Distribution, read_installed, start_service, stop_service, write_private};

/// The node service's loopback endpoint that hands out its datastore (the stand-in's etcd).
pub(super) const STATE_PATH: &str = "/drover-sim/state";

/// The service (systemd unit) names of a distribution: (server, agent).
pub fn units(dist: Distribution) -> (&'static str, &'static str) {
    match dist {
        Distribution::K3s => ("k3s", "k3s-agent"),
        Distribution::Rke2 => ("rke2-server", "rke2-agent"),
    }
}

impl Distribution {
    /// Where `etcd-snapshot save` puts snapshots by default.
    pub fn snapshot_dir(self) -> PathBuf {
        self.data_dir().join("server/db/snapshots")
    }
}

/// `k3s …` / `rke2 …`: the subcommands the hub's plans run.
pub fn command(dist: Distribution, args: &[String]) -> Result<String, String> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["etcd-snapshot", "save", rest @ ..] => save(dist, rest),
        ["etcd-snapshot", "ls" | "list", rest @ ..] => list(dist, rest),
        ["etcd-snapshot", "delete" | "rm", rest @ ..] => delete(dist, rest),
        ["server", rest @ ..] => reset(dist, rest),
        ["certificate", "rotate", ..] => rotate(dist),
        _ => Err(format!(
            "stand-in {}: supported are `etcd-snapshot save|ls|delete`, `server --cluster-reset \
             --cluster-reset-restore-path=FILE` and `certificate rotate` (got {args:?})",
            dist.name()
        )),
    }
}

/// The value of `--flag=value` or `--flag value` in `args`.
fn flag<'a>(args: &[&'a str], name: &str) -> Option<&'a str> {
    let long = format!("--{name}");
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if *arg == long {
            return it.next().copied();
        }
        if let Some(value) = arg.strip_prefix(&long).and_then(|r| r.strip_prefix('=')) {
            return Some(value);
        }
    }
    None
}

fn snapshot_dir(dist: Distribution, args: &[&str]) -> PathBuf {
    flag(args, "etcd-snapshot-dir").map_or_else(|| dist.snapshot_dir(), super::rooted)
}

/// `etcd-snapshot save [--name N] [--etcd-snapshot-dir D]`: `<D>/<N>-<node>-<unix time>`, as
/// K3s names it; the running server is asked for its datastore.
fn save(dist: Distribution, args: &[&str]) -> Result<String, String> {
    let installed = read_installed(dist)?;
    if !installed.server {
        return Err("etcd-snapshot: this node is an agent; take snapshots on a server".into());
    }
    let state = running_state()?;
    let name = flag(args, "name").unwrap_or("on-demand");
    let node = super::NodeConfig::read(dist)?.node_name();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let path = snapshot_dir(dist, args).join(format!("{name}-{node}-{now}"));
    write_private(&path, &state)?;
    Ok(format!("Snapshot {} saved.", path.display()))
}

/// The datastore of the node service running here, from its loopback endpoint.
fn running_state() -> Result<String, String> {
    use std::io::{Read, Write};
    let failed = |e: std::io::Error| {
        format!(
            "etcd-snapshot: the server is not running or not answering on {}:2381 ({e})",
            super::loopback()
        )
    };
    let mut stream = std::net::TcpStream::connect((super::loopback(), 2381)).map_err(failed)?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .map_err(failed)?;
    write!(
        stream,
        "GET {STATE_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .map_err(failed)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(failed)?;
    let text = String::from_utf8(answer).map_err(|e| e.to_string())?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("etcd-snapshot: a malformed answer from the server")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "etcd-snapshot: the server answered {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    serde_json::from_str::<Value>(body)
        .map_err(|e| format!("etcd-snapshot: the server's datastore does not parse: {e}"))?;
    Ok(body.to_owned())
}

/// `etcd-snapshot ls`: a table, as K3s prints it.
fn list(dist: Distribution, args: &[&str]) -> Result<String, String> {
    let dir = snapshot_dir(dist, args);
    let mut lines = vec!["Name\tLocation\tSize\tCreated".to_owned()];
    let mut entries: Vec<(String, PathBuf, u64)> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| {
                    let meta = e.metadata().ok()?;
                    Some((
                        e.file_name().to_string_lossy().into_owned(),
                        e.path(),
                        meta.len(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    for (name, path, size) in entries {
        let created = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .map(|t| time::OffsetDateTime::from(t).unix_timestamp())
            .unwrap_or_default();
        lines.push(format!(
            "{name}\tfile://{}\t{size}\t{created}",
            path.display()
        ));
    }
    Ok(lines.join("\n"))
}

/// `etcd-snapshot delete NAME…`: removes the named snapshots; a name that is not there is an
/// error, as it is for K3s.
fn delete(dist: Distribution, args: &[&str]) -> Result<String, String> {
    let dir = snapshot_dir(dist, args);
    let names: Vec<&str> = args
        .iter()
        .copied()
        .filter(|a| !a.starts_with("--") && flag(args, "etcd-snapshot-dir") != Some(*a))
        .collect();
    if names.is_empty() {
        return Err("etcd-snapshot delete: name the snapshots to delete".into());
    }
    for name in &names {
        if name.contains('/') {
            return Err(format!(
                "etcd-snapshot delete: {name:?} is not a snapshot name"
            ));
        }
        let path = dir.join(name);
        std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(format!("Removed {}", names.join(", ")))
}

/// `server --cluster-reset --cluster-reset-restore-path=FILE`: replaces the datastore with the
/// snapshot's and exits, as K3s does; the service must be stopped first.
fn reset(dist: Distribution, args: &[&str]) -> Result<String, String> {
    if !args.contains(&"--cluster-reset") {
        return Err(format!(
            "stand-in {} server: only --cluster-reset is supported (the service runs the server)",
            dist.name()
        ));
    }
    if super::service_running(dist) {
        return Err(format!(
            "cluster-reset: the {} service is running; stop it first (systemctl stop {})",
            dist.name(),
            units(dist).0
        ));
    }
    let db = dist.data_dir().join("server/db.json");
    let Some(from) = flag(args, "cluster-reset-restore-path") else {
        // A reset without a snapshot keeps the data and forgets the other members; the
        // stand-in's datastore has no members to forget.
        return Ok("Managed etcd cluster membership has been reset, restart without --cluster-reset flag now.".into());
    };
    let text = std::fs::read_to_string(super::rooted(from)).map_err(|e| format!("{from}: {e}"))?;
    serde_json::from_str::<Value>(&text)
        .map_err(|e| format!("{from}: not a snapshot this server can restore: {e}"))?;
    write_private(&db, &text)?;
    Ok(format!(
        "Managed etcd cluster membership has been reset, restart without --cluster-reset flag now. \
         Backup and delete ${{datadir}}/server/db on each peer etcd server and rejoin the nodes. \
         (restored from {from})"
    ))
}

/// The client certificate a server keeps (the file `certificate rotate` renews).
pub fn client_cert_path(dist: Distribution) -> PathBuf {
    dist.data_dir().join("server/tls/client-kube-apiserver.crt")
}

/// `certificate rotate`: new certificates, taken up on the next start; the service must be
/// stopped, as K3s asks.
fn rotate(dist: Distribution) -> Result<String, String> {
    if super::service_running(dist) {
        return Err(format!(
            "certificate rotate: the {} service is running; stop it first (systemctl stop {})",
            dist.name(),
            units(dist).0
        ));
    }
    let installed = read_installed(dist)?;
    if installed.server {
        super::write_client_cert(dist, true)?;
    }
    Ok(format!(
        "certificates rotated for {}; start the service to load them",
        dist.name()
    ))
}

/// `systemctl start|stop|restart|enable|disable|is-active UNIT`, for the stand-in's units only.
pub fn systemctl(args: &[String]) -> Result<String, String> {
    let words: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let [verb, unit] = words.as_slice() else {
        return Err(
            "stand-in systemctl: usage: systemctl start|stop|restart|enable|disable|is-active UNIT"
                .into(),
        );
    };
    let unit = unit.trim_end_matches(".service");
    let dist = [Distribution::K3s, Distribution::Rke2]
        .into_iter()
        .find(|d| {
            let (server, agent) = units(*d);
            unit == server || unit == agent
        })
        .ok_or_else(|| format!("stand-in systemctl: unit {unit:?} not found"))?;
    if !Path::new(&dist.data_dir().join("installed")).exists() {
        return Err(format!(
            "stand-in systemctl: unit {unit:?} is not installed"
        ));
    }
    match *verb {
        "stop" => {
            stop_service(dist);
            Ok(String::new())
        }
        "start" if super::service_running(dist) => Ok(String::new()),
        "start" | "restart" => {
            stop_service(dist);
            start_service(dist).map(|pid| format!("started {unit} (pid {pid})"))
        }
        // RKE2's install leaves enabling and starting its unit to the operator (the plan
        // runs `systemctl enable rke2-server`); nothing boots here, so enabling is a no-op.
        "enable" | "disable" => Ok(String::new()),
        "is-active" if super::service_running(dist) => Ok("active".into()),
        "is-active" => Err("inactive".into()),
        other => Err(format!("stand-in systemctl: {other:?} is not supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_read_in_both_spellings() {
        let args = [
            "--cluster-reset",
            "--cluster-reset-restore-path=/a/b",
            "--name",
            "x",
        ];
        assert_eq!(flag(&args, "cluster-reset-restore-path"), Some("/a/b"));
        assert_eq!(flag(&args, "name"), Some("x"));
        assert_eq!(flag(&args, "etcd-snapshot-dir"), None);
    }
}
