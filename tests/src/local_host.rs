//! `drover-sim host` processes: real system-agents, each in a root directory and on a loopback
//! address of its own, that need no root privileges and no network namespace.

use std::{path::Path, process::Stdio};

use serde_json::json;

use crate::{HubProcess, api, binary};

/// One `drover-sim host` process; stopped (as Ctrl-C would: its services with it) when dropped.
#[derive(Debug)]
pub struct LocalHost {
    child: std::process::Child,
}

impl LocalHost {
    /// Host `name` on `address`, registering with `hub` by `token`; its files under
    /// `dir/<name>`, its log in `dir/<name>.log`.
    pub fn start(hub: &HubProcess, token: &str, name: &str, address: &str, dir: &Path) -> Self {
        Self::start_with(hub, token, name, address, dir, &[])
    }

    /// As [`LocalHost::start`], with `env` added (the stand-in's `DROVER_SIM_INSTALL_SECONDS`).
    pub fn start_with(
        hub: &HubProcess,
        token: &str,
        name: &str,
        address: &str,
        dir: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let child = std::process::Command::new(binary("drover-sim"))
            .args(["host", name, "--server", &hub.url(), "--ca-checksum"])
            .arg(&hub.ca_checksum)
            .args(["--address", address, "--all-roles", "--dir"])
            .arg(dir.join(name))
            .env("DROVER_TOKEN", token)
            .env("DROVER_RETRY_SECONDS", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Self { child }
    }

    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &self.child.id().to_string()])
                .status();
        }
        let _ = self.child.wait();
    }
}

impl Drop for LocalHost {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sets the hub's setting `setting` to `value` as `admin`.
pub async fn set(hub: &HubProcess, admin: &str, setting: &str, value: &str) {
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/settings",
        Some(admin),
        Some(json!({"metadata": {"name": setting}, "spec": {"value": value}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
}

/// Makes `hub` (its data in `dir/hub`) install the stand-in distribution from its artifacts.
pub async fn installs_the_standin(hub: &HubProcess, admin: &str, dir: &Path) {
    set(hub, admin, "install-source", "hub").await;
    sim::standin::artifacts::write(
        &dir.join("hub/artifacts"),
        "v1.33.4+k3s1",
        &binary("drover-sim"),
    )
    .unwrap();
}
