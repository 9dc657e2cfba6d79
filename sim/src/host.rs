//! `drover-sim host`: one simulated machine on this one, for trying provisioning with no spare
//! machines and no root privileges. It is the real system-agent, registering with the hub
//! with a custom cluster's registration token as the host command's would, but everything its
//! plans write lands in the host's own root directory (and is confined there), and what the
//! distribution serves on 127.0.0.1 it serves on a loopback address of the host's own, so
//! several hosts share the machine. The distribution it installs is the one the hub's plans
//! name; with the stand-in's artifacts in the hub's artifacts directory (`drover-sim
//! artifacts`, and the hub's `install-source` setting `hub`) that is `sim`'s stand-in.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use tokio_util::sync::CancellationToken;
use tunnel::Secret;

use crate::standin::{Distribution, units};

/// One simulated host.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub server: String,
    pub token: Secret,
    pub ca_checksum: String,
    /// The node's name.
    pub name: String,
    pub roles: system_agent::Roles,
    /// Its own loopback address (127.x.y.z): its node address and where its services listen.
    pub address: Ipv4Addr,
    /// Its directory: the agent's state in `agent/`, its filesystem in `root/`.
    pub dir: PathBuf,
}

impl HostConfig {
    /// The system-agent's configuration for this host.
    pub fn agent(&self) -> system_agent::Config {
        let state = self.dir.join("agent");
        system_agent::Config {
            hub: Some(system_agent::HubSettings {
                server: self.server.clone(),
                token: self.token.clone(),
                ca_checksum: self.ca_checksum.clone(),
                state_dir: state.clone(),
                local_address: None,
                proxy: Default::default(),
            }),
            dir: state,
            host: system_agent::HostSpec {
                roles: self.roles,
                node_name: self.name.clone(),
                address: self.address.to_string(),
                ..system_agent::HostSpec::default()
            },
            local_plans: None,
            root: self.root(),
            // Hosts on one machine would all show its load: each shows one of its own.
            machine: agentkit::Sampler::new().map(|m| m.simulated(u32::from(self.address))),
            retry: system_agent::Retry::default(),
        }
    }

    pub fn root(&self) -> system_agent::Root {
        system_agent::Root {
            dir: Some(self.dir.join("root")),
            loopback: Some(self.address),
        }
    }
}

/// Runs the host until `shutdown`: starts the distribution's service if an earlier run
/// installed it (as a machine's boot would), runs the agent, and stops the service at the end
/// (as powering the machine off would), so nothing of the host outlives it.
pub async fn run(config: HostConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    if !config.address.is_loopback() {
        anyhow::bail!(
            "--address {}: give a loopback address of the host's own (127.0.0.2 and up); \
             every host on this machine needs its own",
            config.address
        );
    }
    let root = config.root();
    if let Some(dir) = &root.dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("the host's root {}: {e}", dir.display()))?;
    }
    service(&root, "start").await;
    let agent = system_agent::Agent::start(config.agent(), shutdown.clone()).await?;
    agent.wait().await;
    service(&root, "stop").await;
    Ok(())
}

/// `systemctl VERB` (the stand-in's) for each distribution service installed under the root,
/// confined to the root as the plan's instructions are.
pub async fn service(root: &system_agent::Root, verb: &str) {
    let (root, verb) = (root.clone(), verb.to_owned());
    let done = tokio::task::spawn_blocking(move || {
        let Some(dir) = &root.dir else { return };
        for dist in [Distribution::K3s, Distribution::Rke2] {
            let data = dir.join(format!("var/lib/rancher/{}", dist.name()));
            let Ok(installed) = std::fs::read_to_string(data.join("installed")) else {
                continue;
            };
            let (server, agent) = units(dist);
            let unit = if installed.lines().nth(1) == Some("server") {
                server
            } else {
                agent
            };
            if let Err(e) = root.confined(|| systemctl(dir, root.loopback, &verb, unit)) {
                tracing::warn!(unit, verb, error = %e, "the host's service did not {verb}");
            }
        }
    });
    if let Err(e) = done.await {
        tracing::warn!(error = %e, "the host's services");
    }
}

fn systemctl(dir: &Path, loopback: Option<Ipv4Addr>, verb: &str, unit: &str) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = std::process::Command::new(exe);
    command
        .args(["systemctl", verb, unit])
        .env("DROVER_ROOT", dir)
        .current_dir(dir)
        .stdin(std::process::Stdio::null());
    if let Some(address) = loopback {
        command.env("DROVER_LOOPBACK", address.to_string());
    }
    let out = command.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(())
}
