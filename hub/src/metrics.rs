//! `GET /metrics` in Prometheus' text format: agents connected by kind, tunnel streams and
//! bytes, API requests by route and status code, and store operation latency. Counters are
//! process-wide atomics; connected agents are read from the registry at scrape time.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tunnel::Registry;

/// A histogram with fixed bucket bounds (seconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: [AtomicU64; 12],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

const STORE_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

impl Histogram {
    const fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: [const { AtomicU64::new(0) }; 12],
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(
            out,
            "{name}_sum {sum}\n{name}_count {}",
            self.count.load(Ordering::Relaxed)
        );
    }
}

/// How late heartbeats arrive: the time between two beats of one session beyond the interval.
pub static HEARTBEAT_LAG_SECONDS: Histogram = Histogram::new(LAG_BOUNDS);

const LAG_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Heartbeats taken since start.
pub static HEARTBEATS: AtomicU64 = AtomicU64::new(0);

/// Time spent in each store operation.
pub static STORE_SECONDS: Histogram = Histogram::new(STORE_BOUNDS);

/// API requests by route, then status code.
static API_REQUESTS: Mutex<BTreeMap<String, BTreeMap<u16, u64>>> = Mutex::new(BTreeMap::new());

/// Counts a request by its route template (never the raw path, which would put object names
/// into metric labels) and the status code it was answered with.
pub fn count(route: Option<&str>, code: u16) {
    let route = route.unwrap_or("unmatched");
    let mut counts = API_REQUESTS.lock().unwrap_or_else(|p| p.into_inner());
    // Every request passes here: a route's name is copied the first time only.
    let by_code = match counts.get_mut(route) {
        Some(by_code) => by_code,
        None => counts.entry(route.to_owned()).or_default(),
    };
    *by_code.entry(code).or_insert(0) += 1;
}

/// What the exposition reads at scrape time besides the process-wide counters.
#[derive(Debug)]
pub struct Scrape<'a> {
    pub registry: &'a Registry,
    /// Agents by (kind, state).
    pub agent_states: Vec<((String, &'static str), u64)>,
    /// Host plans by state (`in-progress`, `applied`, `failed`, `pending`).
    pub plan_states: BTreeMap<String, u64>,
    /// Whether this replica leads (runs the planner and controllers).
    pub leader: bool,
}

/// The whole exposition.
pub fn render(scrape: &Scrape<'_>) -> String {
    let registry = scrape.registry;
    let mut out = String::new();
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for kind in proto::register::AgentKind::ALL.map(proto::register::AgentKind::as_str) {
        by_kind.insert(kind.to_owned(), 0);
    }
    for session in registry.sessions() {
        *by_kind.entry(session.info().peer.kind.clone()).or_insert(0) += 1;
    }
    out.push_str("# HELP drover_tunnel_sessions Agents connected now, by kind.\n# TYPE drover_tunnel_sessions gauge\n");
    for (kind, n) in &by_kind {
        let _ = writeln!(out, "drover_tunnel_sessions{{kind=\"{kind}\"}} {n}");
    }
    out.push_str("# HELP drover_agents Agents the hub has heard from, by kind and state (active, disconnected).\n# TYPE drover_agents gauge\n");
    for ((kind, state), n) in &scrape.agent_states {
        let _ = writeln!(
            out,
            "drover_agents{{kind=\"{kind}\",state=\"{state}\"}} {n}"
        );
    }
    let _ = write!(
        out,
        "# HELP drover_replica_leader 1 if this hub replica leads (runs the planner and controllers), else 0.\n# TYPE drover_replica_leader gauge\ndrover_replica_leader {}\n",
        u8::from(scrape.leader)
    );
    let _ = write!(
        out,
        "# HELP drover_heartbeats_total Heartbeats taken since start.\n# TYPE drover_heartbeats_total counter\ndrover_heartbeats_total {}\n",
        HEARTBEATS.load(Ordering::Relaxed)
    );
    HEARTBEAT_LAG_SECONDS.render(
        "drover_heartbeat_lag_seconds",
        "How much later than the interval each heartbeat came.",
        &mut out,
    );
    out.push_str("# HELP drover_plans Host plans by state.\n# TYPE drover_plans gauge\n");
    for (state, n) in &scrape.plan_states {
        let _ = writeln!(out, "drover_plans{{state=\"{state}\"}} {n}");
    }
    let t = tunnel::metrics::counters();
    let _ = write!(
        out,
        "# HELP drover_tunnel_streams_open Tunnel streams open now.\n# TYPE drover_tunnel_streams_open gauge\n\
         drover_tunnel_streams_open {}\n\
         # HELP drover_tunnel_streams_opened_total Tunnel streams opened since start.\n# TYPE drover_tunnel_streams_opened_total counter\n\
         drover_tunnel_streams_opened_total {}\n\
         # HELP drover_tunnel_bytes_total Bytes through tunnel connections since start.\n# TYPE drover_tunnel_bytes_total counter\n\
         drover_tunnel_bytes_total{{direction=\"sent\"}} {}\ndrover_tunnel_bytes_total{{direction=\"received\"}} {}\n",
        t.streams_open, t.streams_opened, t.bytes_sent, t.bytes_received
    );
    out.push_str("# HELP drover_api_requests_total API requests by route and status code.\n# TYPE drover_api_requests_total counter\n");
    for (route, code, n) in API_REQUESTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .flat_map(|(route, codes)| codes.iter().map(move |(code, n)| (route, code, n)))
    {
        let route = route.replace('\\', "\\\\").replace('"', "\\\"");
        let _ = writeln!(
            out,
            "drover_api_requests_total{{route=\"{route}\",code=\"{code}\"}} {n}"
        );
    }
    STORE_SECONDS.render(
        "drover_store_operation_seconds",
        "Time spent in store operations.",
        &mut out,
    );
    out
}
