//! `bench SCENARIO [--json]`: runs one measured scenario and prints one JSON object. Every
//! figure sits next to a baseline measured in the same run, because these machines are noisy.

use clap::{Parser, Subcommand};

mod audit_scenario;
mod charts_scenario;
mod delivery_scenario;
mod endpoint_scenario;
mod explorer_scenario;
mod fleet_scenario;
mod floor;
mod ha_scenario;
mod health_scenario;
mod hub_scenario;
mod load;
mod login_scenario;
mod machines_scenario;
mod pages_scenario;
mod planner_scenario;
mod plans_scenario;
mod proxy_scenario;
mod rbac_scenario;
mod recording_scenario;
mod stages;
mod tunnel_scenario;

#[derive(Parser, Debug)]
#[command(
    name = "bench",
    about = "Drover's measured scenarios; each prints one JSON object"
)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
    /// Print the JSON object on one line (the default is indented).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Scenario {
    /// The tunnel against raw rustls over TCP: throughput both ways, round trips, 100 streams.
    Tunnel(tunnel_scenario::Args),
    /// `drover-hub serve`: time from exec to /readyz, idle memory (needs the release hub binary).
    Hub(hub_scenario::Args),
    /// Kubernetes requests through the hub's proxy against straight to the (simulated) API
    /// server: latency, 64-client throughput, and a 30,000-pod list from the agent's cache.
    Proxy(proxy_scenario::Args),
    /// A plan written for every one of N hosts (real hub, tunnel and system-agent code in one
    /// process): time until all applied it, and how far the hub's view trails.
    Plans(plans_scenario::Args),
    /// The planner's own writes: one pass writing every worker's install plan, then every
    /// worker's upgrade, for N hosts (the planner on its store alone, nothing delivered).
    Planner(planner_scenario::Args),
    /// Heartbeats: the hub's CPU per 1,000 beats/s (hub as its own process), and the
    /// node-agent's and system-agent's RSS while reporting (needs the release binaries).
    Health(health_scenario::Args),
    /// N idle agents on one hub (hub as its own process): time to connect them all, the hub's
    /// memory per agent and idle CPU, and the time until all are back after a hub restart.
    Fleet(fleet_scenario::Args),
    /// RBAC sync at scale: U users' roles on a cluster of N namespaces in P projects written
    /// into the cluster's RBAC by the real cluster-agent: objects, time to converge, and the
    /// writes made afterwards while nothing changes.
    Rbac(rbac_scenario::Args),
    /// The cluster explorer in headless Chromium against kubectl, with 30,000 pods: the pods
    /// list's first page (and the hub's CPU per view), a followed log's delay, a shell's round
    /// trip.
    Explorer(explorer_scenario::Args),
    /// Three hub replicas on a three-member etcd, each member killed in turn for longer than a
    /// replica's lease while clients write, read and run kubectl through every replica:
    /// requests failed and time without a leader per member lost, beside a window where
    /// nothing fails.
    Ha(ha_scenario::Args),
    /// The audit log's cost to the proxy: 64 clients through the hub with the log on and off,
    /// alternating hubs in one run.
    Audit(audit_scenario::Args),
    /// Signing in with a company directory: LDAP logins per second and their latency beside
    /// the hub's own users', and the OpenID callback's handling time (slapd and npm's
    /// oidc-provider; the hub's release binary).
    Login(login_scenario::Args),
    /// The authorized cluster endpoint: a GET straight to the API server against through the
    /// hub, and what an uncached token review costs.
    Endpoint(endpoint_scenario::Args),
    /// Machine pools: the machine controller making and destroying N EC2 machines against
    /// moto's EC2 server, beside the amazonec2 driver alone (the floor).
    Machines(machines_scenario::Args),
    /// Usage charts on disk: a day of minutes for N machines written as the hub writes them,
    /// beside the same minutes in memory as the hub kept them before.
    Charts(charts_scenario::Args),
    /// Continuous delivery to N simulated clusters (the real cluster-agent each, in processes
    /// of this binary; the hub its own process) of a GitRepo of B paths: time from a commit until
    /// every cluster holds it and until the hub reports all ready, the hub's CPU, memory and
    /// store bytes per BundleDeployment.
    Delivery(delivery_scenario::Args),
    /// A share of `delivery`'s simulated clusters and their agents (started by `delivery`
    /// itself).
    #[command(hide = true)]
    DeliveryClusters(delivery_scenario::SharesArgs),
    /// The floor `fleet` measures against: a minimal TLS + WebSocket server (started by
    /// `fleet` itself).
    #[command(hide = true)]
    FloorServer(floor::ServerArgs),
    /// The dashboard's clusters and hosts pages with N of each registered (hub as its own
    /// process): first page, a filter, a deep page of a sorted view, beside the API's whole
    /// list of the same objects.
    Pages(pages_scenario::Args),
    /// Shell sessions recorded or not, alternating in one run: `kubectl exec -i` line round
    /// trips through the hub.
    Recording(recording_scenario::Args),
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in a journal or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = match cli.scenario {
        // A task on the runtime's workers, like every other end of the paths it measures: run
        // by `block_on`, the measuring end was a third busy thread beside the two workers on a
        // 2-core machine, which the OS time-sliced against the tunnel's tasks but not against
        // the direct path's single server task.
        Scenario::Tunnel(args) => runtime.block_on(runtime.spawn(tunnel_scenario::run(args)))??,
        Scenario::Hub(args) => runtime.block_on(hub_scenario::run(args))?,
        Scenario::Proxy(args) => runtime.block_on(proxy_scenario::run(args))?,
        Scenario::Plans(args) => runtime.block_on(plans_scenario::run(args))?,
        Scenario::Planner(args) => runtime.block_on(planner_scenario::run(args))?,
        Scenario::Health(args) => runtime.block_on(health_scenario::run(args))?,
        Scenario::Fleet(args) => runtime.block_on(fleet_scenario::run(args))?,
        Scenario::Rbac(args) => runtime.block_on(rbac_scenario::run(args))?,
        Scenario::Explorer(args) => runtime.block_on(explorer_scenario::run(args))?,
        Scenario::Ha(args) => runtime.block_on(ha_scenario::run(args))?,
        Scenario::Audit(args) => runtime.block_on(audit_scenario::run(args))?,
        Scenario::Login(args) => runtime.block_on(login_scenario::run(args))?,
        Scenario::Endpoint(args) => runtime.block_on(endpoint_scenario::run(args))?,
        Scenario::Machines(args) => runtime.block_on(machines_scenario::run(args))?,
        Scenario::Charts(args) => runtime.block_on(charts_scenario::run(args))?,
        Scenario::Delivery(args) => runtime.block_on(delivery_scenario::run(args))?,
        Scenario::DeliveryClusters(args) => runtime.block_on(delivery_scenario::run_share(args))?,
        Scenario::FloorServer(args) => runtime.block_on(floor::serve(args))?,
        Scenario::Pages(args) => runtime.block_on(pages_scenario::run(args))?,
        Scenario::Recording(args) => runtime.block_on(recording_scenario::run(args))?,
    };
    let text = if cli.json {
        serde_json::to_string(&report)?
    } else {
        serde_json::to_string_pretty(&report)?
    };
    #[allow(clippy::print_stdout)] // the report is this program's output
    {
        println!("{text}");
    }
    Ok(())
}
