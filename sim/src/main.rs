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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DROVER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let Command::Cluster { listen, nodes, pods, kubeconfig } = cli.command;
        let shutdown = CancellationToken::new();
        let config = sim::cluster::SimConfig { listen, nodes, pods };
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
