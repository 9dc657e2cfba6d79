//! `drover-sim cluster`: a simulated Kubernetes API server, for trying Drover without a real
//! cluster (real kube-apiserver and K3s binaries cannot be had here); the stand-in installer's
//! commands; and `drover-sim fleet`, many real agents in one process for capacity planning.

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "drover-sim",
    version,
    about = "Simulated clusters and hosts for Drover"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve a simulated Kubernetes API over HTTPS and print a kubeconfig for it.
    Cluster {
        /// Address to listen on
        #[arg(long, default_value = "127.0.0.1:6443")]
        listen: std::net::SocketAddr,
        /// Nodes to create
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Pods to create, spread over the nodes in namespaces load-0..load-9
        #[arg(long, default_value_t = 0)]
        pods: usize,
        /// Write the admin kubeconfig here (else to stdout)
        #[arg(long)]
        kubeconfig: Option<std::path::PathBuf>,
    },
    /// Stand-in for the K3s/RKE2 installer (`curl -sfL https://get.k3s.io | sh -`): reads
    /// INSTALL_K3S_VERSION / INSTALL_K3S_EXEC (INSTALL_RKE2_VERSION / INSTALL_RKE2_TYPE) and
    /// /etc/rancher/<dist>/config.yaml, then (re)starts the node service in the background.
    Install {
        distribution: sim::standin::Distribution,
    },
    /// Stand-in for the distribution's uninstall script.
    Uninstall {
        distribution: sim::standin::Distribution,
    },
    /// Stand-in for the `k3s` binary's day-2 commands: `etcd-snapshot save|ls|delete`,
    /// `server --cluster-reset --cluster-reset-restore-path=FILE`, `certificate rotate`.
    K3s {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Stand-in for the `rke2` binary's day-2 commands (as for `k3s`).
    Rke2 {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// `systemctl start|stop|restart|is-active` for the stand-in's units (a test's network
    /// namespace has no systemd).
    Systemctl {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The stand-in node service the installer starts (not run by hand).
    ServeNode {
        distribution: sim::standin::Distribution,
    },
    /// One simulated host on this machine, for trying provisioning with no root privileges:
    /// the real system-agent registering with the hub as the host command's would, with
    /// everything its plans write in DIR/root (and confined there) and its services on
    /// its own loopback address. The registration token is read from DROVER_TOKEN (or --token).
    /// Runs until Ctrl-C, which stops the host's services too, as powering it off would;
    /// starting it again starts them.
    Host(HostArgs),
    /// Write the stand-in distribution's air-gap artifacts for VERSION into a hub's artifacts
    /// directory (DATA-DIR/artifacts), so that hosts of a hub whose `install-source` setting is
    /// `hub` install the stand-in (`drover-sim host`, the tests' hosts).
    Artifacts {
        /// The hub's artifacts directory, `<data dir>/artifacts`
        dir: std::path::PathBuf,
        /// The K3s or RKE2 versions, as a cluster's spec.version names them
        #[arg(required = true)]
        versions: Vec<String>,
    },
    /// Run N agents in this process, each the real agent code with its own tunnel session to
    /// the hub, for capacity planning; prints a JSON line of progress every 5 s until Ctrl-C.
    Fleet(FleetArgs),
    /// The hub (as `drover-hub serve` runs it) with N simulated imported clusters (demo-1…)
    /// and 3 simulated hosts in this process, to see a populated dashboard; any further
    /// arguments are `drover-hub serve` flags (for example `--data-dir DIR`; the default is
    /// ./drover-demo). Logs warnings only unless DROVER_LOG says otherwise.
    Demo {
        /// Simulated clusters, 1 to 20
        #[arg(value_parser = clap::value_parser!(u16).range(1..=20))]
        clusters: u16,
        /// `drover-hub serve` flags
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        serve: Vec<String>,
    },
}

#[derive(clap::Args, Debug)]
struct HostArgs {
    /// The node's name
    name: String,
    /// The hub's URL, as the cluster's registration command names it
    #[arg(long)]
    server: String,
    /// The cluster's registration token (drr_…) [default: $DROVER_TOKEN]
    #[arg(long)]
    token: Option<String>,
    /// The hub's CA checksum, as the registration command names it
    #[arg(long)]
    ca_checksum: String,
    /// The host's own loopback address (127.0.0.2 and up; each host on this machine needs its
    /// own): its node address, where its services listen
    #[arg(long)]
    address: std::net::Ipv4Addr,
    #[arg(long)]
    etcd: bool,
    #[arg(long)]
    controlplane: bool,
    #[arg(long)]
    worker: bool,
    /// etcd, control plane and worker
    #[arg(long)]
    all_roles: bool,
    /// The host's directory [default: ./drover-hosts/NAME]
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

fn host(args: HostArgs) -> anyhow::Result<()> {
    let token = match args.token {
        Some(token) => token,
        None => std::env::var("DROVER_TOKEN").map_err(|_| {
            anyhow::anyhow!(
                "give the cluster's registration token (drr_…) with --token, or in DROVER_TOKEN"
            )
        })?,
    };
    let roles = system_agent::Roles {
        etcd: args.etcd || args.all_roles,
        control_plane: args.controlplane || args.all_roles,
        worker: args.worker || args.all_roles,
    };
    if !(roles.etcd || roles.control_plane || roles.worker) {
        anyhow::bail!("give the host's roles: --etcd, --controlplane, --worker or --all-roles");
    }
    let dir = args
        .dir
        .unwrap_or_else(|| std::path::Path::new("drover-hosts").join(&args.name));
    // Absolute: the plans' instructions run in the root, and are told where it is.
    let dir = std::path::absolute(&dir)?;
    let config = sim::host::HostConfig {
        server: args.server,
        token: tunnel::Secret::new(token),
        ca_checksum: args.ca_checksum,
        name: args.name,
        roles,
        address: args.address,
        dir,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = tunnel::shutdown_on_signal();
        sim::host::run(config, shutdown).await
    })
}

#[derive(clap::Args, Debug)]
struct FleetArgs {
    /// The hub's URL, or its replicas' URLs comma-separated
    #[arg(long)]
    hub: String,
    /// The hub's CA checksum, as `drover-hub serve` prints it
    #[arg(long)]
    ca_checksum: String,
    /// How many agents
    #[arg(long, default_value_t = 100)]
    agents: usize,
    /// system: system-agents of simulated hosts; cluster: imported clusters with their
    /// cluster-agents, all on one simulated API server in this process
    #[arg(long, value_enum, default_value = "system")]
    kind: sim::fleet::FleetKind,
    /// Names are PREFIX-0, PREFIX-1, …; give each fleet process its own
    #[arg(long, default_value = "fleet")]
    prefix: String,
    /// Where the agents keep their state [default: /dev/shm/drover-fleet-PREFIX, or the temp
    /// directory without /dev/shm]
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Agents registering at once
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
}

fn fleet(args: FleetArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = tunnel::shutdown_on_signal();
        let dir = args.dir.unwrap_or_else(|| {
            let shm = std::path::Path::new("/dev/shm");
            let base = if shm.is_dir() { shm.to_owned() } else { std::env::temp_dir() };
            base.join(format!("drover-fleet-{}", args.prefix))
        });
        // From the environment, not the command line, where every user's `ps` would see it.
        let token = std::env::var("DROVER_TOKEN").map_err(|_| {
            anyhow::anyhow!(
                "set DROVER_TOKEN: a custom cluster's registration token (drr_…) for --kind system, \
                 an API token that may create clusters for --kind cluster"
            )
        })?;
        let config = sim::fleet::FleetConfig {
            hub: args.hub,
            ca_checksum: args.ca_checksum,
            token,
            agents: args.agents,
            kind: args.kind,
            prefix: args.prefix,
            dir,
            concurrency: args.concurrency,
        };
        let started = std::time::Instant::now();
        let fleet = sim::fleet::start(config, shutdown.clone()).await?;
        let mut ticks = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticks.tick() => {
                    let line = serde_json::json!({
                        "elapsed_s": started.elapsed().as_secs(),
                        "agents": fleet.names.len(),
                        "connected": match args.kind {
                            sim::fleet::FleetKind::System => serde_json::json!(fleet.connected()),
                            sim::fleet::FleetKind::Cluster => serde_json::Value::Null,
                        },
                    });
                    #[allow(clippy::print_stdout)]
                    {
                        println!("{line}");
                    }
                }
            }
        }
        fleet.wait().await;
        anyhow::Ok(())
    })
}

/// Where the demo keeps its state unless told otherwise: not the hub's own default, so a
/// demo and a hub of one's own started in the same directory never share an admin or a CA.
const DEMO_DATA_DIR: &str = "./drover-demo";

fn demo(clusters: u16, serve: Vec<String>) -> anyhow::Result<()> {
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    let told = env.contains_key("DROVER_DATA_DIR")
        || serve
            .iter()
            .any(|a| a == "--data-dir" || a.starts_with("--data-dir="));
    let own = if told {
        Vec::new()
    } else {
        vec!["--data-dir".to_owned(), DEMO_DATA_DIR.to_owned()]
    };
    let args = ["drover-hub".to_owned(), "serve".to_owned()]
        .into_iter()
        .chain(own)
        .chain(serve);
    let config = match hub::args::parse(args, &env) {
        Ok(hub::Command::Serve(config)) => config,
        Ok(_) => anyhow::bail!("drover-sim demo takes `drover-hub serve` flags only"),
        // Help and usage errors print as `drover-hub serve` would print them.
        Err(hub::ConfigError::Usage(e)) => e.exit(),
        Err(e) => anyhow::bail!("{e}"),
    };
    let runtime = hub::commands::runtime()?;
    runtime.block_on(sim::demo::serve(config, usize::from(clusters)))
}

/// Prints what a stand-in script did, as the real scripts print their progress.
fn say(result: Result<String, String>) -> anyhow::Result<()> {
    let line = result.map_err(anyhow::Error::msg)?;
    #[allow(clippy::print_stdout)]
    {
        println!("{line}");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        // The demo is for a person at a terminal: the password and URL it prints are not to
        // scroll away under every simulated agent's connection (`DROVER_LOG=info` shows them).
        Command::Demo { .. } => hub::commands::init_logging_at("warn"),
        _ => hub::commands::init_logging(),
    }
    let (listen, nodes, pods, kubeconfig) = match cli.command {
        Command::Cluster {
            listen,
            nodes,
            pods,
            kubeconfig,
        } => (listen, nodes, pods, kubeconfig),
        Command::Install { distribution } => return say(sim::standin::install(distribution)),
        Command::Uninstall { distribution } => return say(sim::standin::uninstall(distribution)),
        Command::K3s { args } => {
            return say(sim::standin::command(
                sim::standin::Distribution::K3s,
                &args,
            ));
        }
        Command::Rke2 { args } => {
            return say(sim::standin::command(
                sim::standin::Distribution::Rke2,
                &args,
            ));
        }
        Command::Systemctl { args } => return say(sim::standin::systemctl(&args)),
        Command::Fleet(args) => return fleet(args),
        Command::Host(args) => return host(args),
        Command::Artifacts { dir, versions } => {
            let exe = std::env::current_exe()?;
            for version in &versions {
                let written = sim::standin::artifacts::write(&dir, version, &exe)
                    .map_err(anyhow::Error::msg)?;
                say(Ok(format!(
                    "{version}: {} files of the stand-in distribution in {}",
                    written.len(),
                    dir.display()
                )))?;
            }
            return Ok(());
        }
        Command::Demo { clusters, serve } => return demo(clusters, serve),
        Command::ServeNode { distribution } => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            return runtime.block_on(async {
                let shutdown = tunnel::shutdown_on_signal();
                sim::standin::serve_node(distribution, shutdown)
                    .await
                    .map_err(anyhow::Error::msg)
            });
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let config = sim::cluster::SimConfig { listen, nodes, pods, version: None };
        let cluster = sim::cluster::SimCluster::start(config, shutdown.clone()).await?;
        let text = cluster.kubeconfig(sim::cluster::ADMIN_TOKEN);
        match kubeconfig {
            Some(path) => {
                std::fs::write(&path, text)?;
                tracing::info!(url = %cluster.url(), kubeconfig = %path.display(), "simulated cluster is up");
            }
            None => {
                #[allow(clippy::print_stdout)]
                {
                    print!("{text}");
                }
                tracing::info!(url = %cluster.url(), "simulated cluster is up; the kubeconfig is on stdout");
            }
        }
        let _ = tokio::signal::ctrl_c().await;
        shutdown.cancel();
        cluster.wait().await;
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Command};

    #[test]
    fn the_demo_takes_one_to_twenty_clusters_and_serve_flags() {
        let cli = Cli::try_parse_from(["drover-sim", "demo", "3", "--data-dir", "d"]).unwrap();
        match cli.command {
            Command::Demo { clusters, serve } => {
                assert_eq!(clusters, 3);
                assert_eq!(serve, ["--data-dir", "d"]);
            }
            other => panic!("{other:?}"),
        }
        for bad in ["0", "21", "many"] {
            let err = Cli::try_parse_from(["drover-sim", "demo", bad]).unwrap_err();
            assert!(err.to_string().contains("<CLUSTERS>"), "{bad}: {err}");
        }
    }
}
