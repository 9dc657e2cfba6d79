//! `drover-sim cluster`: a simulated Kubernetes API server, for trying Drover without a real
//! cluster (real kube-apiserver and K3s binaries cannot be had here).

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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DROVER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in a journal or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
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
