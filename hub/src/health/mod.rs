//! Health: agents' heartbeats, the machines' facts and usage they carry, and the events that
//! tell people what changed.
//!
//! Every agent beats at the interval the hub sets (`--heartbeat-seconds`); one that misses 3
//! beats while its tunnel still stands is shown disconnected (reason `HeartbeatsMissed`) until
//! it beats again, so a hung agent shows as surely as a dead one. Heartbeats are held in
//! memory and never written to the store: only what people act on reaches it (the `Connected`
//! condition, a host's facts when they change), so a thousand beats a second cost no writes.
//! Node-agents' nodes live here only (they are the imported cluster's machines, not objects
//! the hub manages); a restarted hub learns them again as the agents reconnect.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use prost::Message as _;
use proto::{
    health::v1::{BeatReply, Heartbeat, HostFacts, Usage},
    session::v1::{HubMessage, hub_message::Body},
};
use tokio_util::sync::CancellationToken;
use tunnel::{Messenger, SessionInfo};

use crate::{
    identity::{self, Belongs},
    model::{self, Kind},
    store::Store,
};

pub mod api;
mod changes;
pub mod charts;
pub mod events;
pub mod history;
mod views;

use charts::Charts;
pub use events::{Event, Events, Subject};
use history::History;
pub use views::facts_json;

/// Beats missed before an agent is shown disconnected.
pub const MISSED: u32 = 3;

/// How often closed minutes of usage go to the charts' file.
const CHARTS_FLUSH: Duration = Duration::from_secs(15);

/// How long a gone agent's node and chart stay visible.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// One agent identity (one per node for node-agents, per host for system-agents).
#[derive(Debug)]
struct Agent {
    kind: String,
    /// Whether the agent speaks for a machine (`machine(kind)`), kept beside what a beat
    /// touches: the session's own copy of the kind is one more cold read per beat.
    machine: bool,
    subject: Subject,
    /// The session the last beat came on.
    session: u64,
    connected: bool,
    /// Why it is not connected, and since when (RFC 3339).
    gone: Option<(String, String)>,
    gone_at: Option<Instant>,
    last_beat: Option<Instant>,
    /// When the last beat came, for people (formatted only when shown: beats are the hot path).
    last_beat_at: Option<SystemTime>,
    missed: bool,
    /// The session last told the interval and whether to send facts, by an answer to a beat
    /// sent as a message (an answer to one is empty unless the answer changed).
    answered: u64,
    facts: Option<HostFacts>,
    usage: Option<Usage>,
    history: Option<History>,
}

/// A cluster's agents and machines, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClusterSummary {
    /// Agents connected (and beating) now.
    pub agents: usize,
    pub(crate) cpu_weighted: f64,
    pub(crate) cpus: f64,
    pub memory_used: u64,
    pub memory_total: u64,
}

impl ClusterSummary {
    /// CPU % over all the machines' CPUs, if any machine reported usage.
    pub fn cpu_percent(&self) -> Option<f64> {
        (self.cpus > 0.0).then(|| self.cpu_weighted / self.cpus)
    }
}

/// A beat recorded: the answer, whether it differs from the last one this session was given,
/// and what is left to do.
struct Recorded {
    reply: BeatReply,
    news: bool,
    after: After,
}

/// What the store says of an agent the hub has not met since it started.
#[derive(Debug, Default)]
struct Met {
    subject: Subject,
    /// A host's facts as last stored.
    facts: Option<HostFacts>,
}

/// What a beat leaves to do after it is recorded (see `Health::after_beat`).
struct After {
    subject: Subject,
    resumed: bool,
    new_facts: Option<HostFacts>,
}

impl After {
    fn is_some(&self) -> bool {
        self.resumed || self.new_facts.is_some()
    }
}

/// Whether an agent kind speaks for a machine (and so sends facts and usage).
fn machine(kind: &str) -> bool {
    kind == identity::NODE_AGENT || kind == identity::SYSTEM_AGENT
}

/// The hub's view of its agents' health.
#[derive(Debug)]
pub struct Health {
    interval: Duration,
    store: Arc<dyn Store>,
    pub events: Events,
    /// Boxed: an agent is 720 bytes, and a map's spare slots (up to half of them, as it
    /// grows by doubling) would each cost as much inline.
    agents: Mutex<HashMap<String, Box<Agent>>>,
    /// The machines' closed minutes of usage.
    charts: Arc<Charts>,
    /// True while the state-change events follow the store (their watch is open).
    following: tokio::sync::watch::Sender<bool>,
}

impl Health {
    /// With charts kept in memory (see [`Health::with_charts`]).
    pub fn new(store: Arc<dyn Store>, interval: Duration) -> Self {
        Self::with_charts(store, interval, Charts::in_memory())
    }

    pub fn with_charts(store: Arc<dyn Store>, interval: Duration, charts: Charts) -> Self {
        Self {
            interval,
            store,
            events: Events::default(),
            agents: Mutex::default(),
            charts: Arc::new(charts),
            following: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Returns once the state-change events follow the store: a change written from then on
    /// becomes an event.
    pub async fn following(&self) {
        let mut open = self.following.subscribe();
        let _ = open.wait_for(|open| *open).await;
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Box<Agent>>> {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cluster, host and node an agent identity is about; a host's cluster is read from
    /// its Host, and with it the facts its agent last sent (which the agent sends again on
    /// every new session: known, they are not written again).
    async fn subject(&self, peer_id: &str) -> Option<Met> {
        match identity::belongs(peer_id)? {
            Belongs::Cluster(cluster) => Some(Met {
                subject: Subject {
                    node: peer_id
                        .strip_prefix("node/")
                        .and_then(|rest| rest.split_once('/'))
                        .map(|(_, node)| node.to_owned())
                        .unwrap_or_default(),
                    cluster,
                    host: String::new(),
                },
                facts: None,
            }),
            Belongs::Host(host) => {
                let object = self.store.get(Kind::Host.name(), &host).await.ok()?;
                Some(Met {
                    subject: Subject {
                        cluster: object.spec["cluster"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        host,
                        node: String::new(),
                    },
                    facts: object.status.get("facts").and_then(views::facts_from_json),
                })
            }
        }
    }

    /// A session has started: the agent is connected, and its beats are due from now.
    pub async fn connected(&self, info: &SessionInfo) {
        // An agent's subject does not change: read only for one not yet in the map (or there
        // without one, its first read having failed).
        let known = self
            .lock()
            .get(&info.peer.id)
            .map(|a| a.subject.clone())
            .filter(|s| !s.cluster.is_empty());
        let Met { subject, facts } = match known {
            Some(subject) => Met {
                subject,
                facts: None,
            },
            None => match self.subject(&info.peer.id).await {
                Some(met) => met,
                None => return,
            },
        };
        {
            let mut agents = self.lock();
            let agent = agents
                .entry(info.peer.id.clone())
                .or_insert_with(|| Box::new(new_agent(&info.peer.kind, subject.clone())));
            agent.subject = subject.clone();
            if agent.facts.is_none() {
                agent.facts = facts;
            }
            agent.session = info.id;
            agent.connected = true;
            agent.gone = None;
            agent.gone_at = None;
            agent.missed = false;
            agent.last_beat = Some(Instant::now());
        }
        self.events.normal(
            "AgentConnected",
            &subject,
            format!("{} {} connected", info.peer.kind, info.peer.id),
        );
    }

    /// A session has ended; `still` when another session of the same agent remains.
    pub fn disconnected(&self, info: &SessionInfo, reason: &str, still: bool) {
        let subject = {
            let mut agents = self.lock();
            let Some(agent) = agents.get_mut(&info.peer.id) else {
                return;
            };
            if agent.session != info.id {
                // A newer session has replaced this one.
                return;
            }
            if !still {
                agent.connected = false;
                agent.gone = Some((reason.to_owned(), crate::store::now_rfc3339()));
                agent.gone_at = Some(Instant::now());
            }
            agent.subject.clone()
        };
        self.events.warning(
            "AgentDisconnected",
            &subject,
            format!("{} {} disconnected: {reason}", info.peer.kind, info.peer.id),
        );
    }

    /// Takes one heartbeat.
    pub async fn beat(&self, info: &SessionInfo, beat: Heartbeat) -> BeatReply {
        let recorded = match self.record(info, beat, None) {
            Ok(recorded) => recorded,
            Err(beat) => {
                let met = self.subject(&info.peer.id).await.unwrap_or_default();
                match self.record(info, *beat, Some(met)) {
                    Ok(recorded) => recorded,
                    Err(_) => unreachable!("a beat with its subject is always recorded"),
                }
            }
        };
        self.after_beat(info, recorded.after).await;
        recorded.reply
    }

    /// Takes a heartbeat sent as a message on the session itself (see `crate::messages`), on
    /// the task that drives the session: recorded in the map of agents and answered at once
    /// (an empty message unless the answer changed: a new session, facts wanted), with what the
    /// store or the events need done on a task of its own; a beat from an agent not yet in the
    /// map (its subject is read from the store) is taken on a task and answered through
    /// `messenger`.
    pub fn beat_message(
        self: &Arc<Self>,
        info: &SessionInfo,
        beat: Heartbeat,
        messenger: &Messenger,
    ) -> Option<HubMessage> {
        match self.record(info, beat, None) {
            Ok(Recorded { reply, news, after }) => {
                if after.is_some() {
                    let (this, info) = (self.clone(), info.clone());
                    tokio::spawn(async move { this.after_beat(&info, after).await });
                }
                // Every beat is answered, so that the agent hears from the hub once an
                // interval (its keepalive then has nothing to ask); an answer that has not
                // changed since the last is empty.
                Some(HubMessage {
                    body: news.then_some(Body::BeatReply(reply)),
                })
            }
            // The first beat of an agent the hub has not met: its subject is read first.
            Err(beat) => {
                let (this, info, messenger) = (self.clone(), info.clone(), messenger.clone());
                tokio::spawn(async move {
                    let reply = this.beat(&info, *beat).await;
                    let answer = HubMessage {
                        body: Some(Body::BeatReply(reply)),
                    };
                    // Not sent only if the session is ending: its agent beats again on the next.
                    let _ = messenger.send(answer.encode_to_vec());
                });
                None
            }
        }
    }

    /// Records a beat in the map of agents; `Err` gives the beat back if the agent is not in
    /// it and was not `met` (read from the store) to add it with.
    fn record(
        &self,
        info: &SessionInfo,
        beat: Heartbeat,
        met: Option<Met>,
    ) -> Result<Recorded, Box<Heartbeat>> {
        let now = Instant::now();
        let mut agents = self.lock();
        let agent = match (agents.get_mut(&info.peer.id), met) {
            (Some(agent), _) => agent,
            (None, Some(Met { subject, facts })) => {
                agents.entry(info.peer.id.clone()).or_insert_with(|| {
                    Box::new(Agent {
                        facts,
                        ..new_agent(&info.peer.kind, subject)
                    })
                })
            }
            (None, None) => return Err(Box::new(beat)),
        };
        if let Some(last) = agent.last_beat
            && agent.session == info.id
        {
            let late = now.duration_since(last).saturating_sub(self.interval);
            crate::metrics::HEARTBEAT_LAG_SECONDS.observe(late);
        }
        if agent.session != info.id {
            agent.session = info.id;
            agent.connected = true;
            agent.gone = None;
            agent.gone_at = None;
        }
        agent.last_beat = Some(now);
        agent.last_beat_at = Some(SystemTime::now());
        let resumed = std::mem::take(&mut agent.missed);
        let mut new_facts = None;
        if let Some(facts) = beat.facts
            && agent.facts.as_ref() != Some(&facts)
        {
            new_facts = Some(facts.clone());
            agent.facts = Some(facts);
        }
        if let Some(usage) = beat.usage {
            let closed = agent
                .history
                .get_or_insert_with(History::default)
                .record(unix_now(), &usage);
            if let Some(minute) = closed {
                self.charts.keep(&info.peer.id, minute);
            }
            agent.usage = Some(usage);
        }
        let reply = BeatReply {
            interval_millis: u32::try_from(self.interval.as_millis()).unwrap_or(u32::MAX),
            send_facts: agent.machine && agent.facts.is_none(),
        };
        // The interval is the hub's, fixed while it runs: only a new session needs telling,
        // and an agent whose facts the hub lacks.
        let news = agent.answered != info.id || reply.send_facts;
        agent.answered = info.id;
        let after = After {
            subject: if resumed || new_facts.is_some() {
                agent.subject.clone()
            } else {
                Subject::default()
            },
            resumed,
            new_facts,
        };
        drop(agents);
        crate::metrics::HEARTBEATS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Recorded { reply, news, after })
    }

    /// What a recorded beat leaves to do: an event and the `Connected` condition when beats
    /// resumed, a host's new facts to the store.
    async fn after_beat(&self, info: &SessionInfo, after: After) {
        let After {
            subject,
            resumed,
            new_facts,
        } = after;
        if resumed {
            self.events.normal(
                "HeartbeatsResumed",
                &subject,
                format!("{} {} is beating again", info.peer.kind, info.peer.id),
            );
            self.set_connected(
                &info.peer.kind,
                &info.peer.id,
                true,
                "AgentConnected",
                "heartbeats resumed",
            )
            .await;
        }
        if let (Some(facts), Some(Belongs::Host(host))) =
            (new_facts, identity::belongs(&info.peer.id))
            && info.peer.kind == identity::SYSTEM_AGENT
        {
            let facts = facts_json(&facts);
            if let Err(e) = model::update_status(self.store.as_ref(), Kind::Host, &host, move |s| {
                s.extra.insert("facts".into(), facts.clone());
            })
            .await
            {
                tracing::warn!(%host, error = %e, "cannot store the host's facts");
            }
        }
    }

    /// The `Connected` condition of what a cluster-agent or system-agent speaks for.
    async fn set_connected(
        &self,
        kind: &str,
        peer_id: &str,
        value: bool,
        reason: &str,
        message: &str,
    ) {
        let target = match (kind, identity::belongs(peer_id)) {
            (identity::CLUSTER_AGENT, Some(Belongs::Cluster(c))) => (Kind::Cluster, c),
            (identity::SYSTEM_AGENT, Some(Belongs::Host(h))) => (Kind::Host, h),
            _ => return,
        };
        let message = format!("{kind} {message}");
        if let Err(e) = model::set_condition(
            self.store.as_ref(),
            target.0,
            &target.1,
            "Connected",
            value,
            reason,
            &message,
        )
        .await
        {
            tracing::warn!(name = %target.1, error = %e, "cannot record the agent's heartbeats");
        }
    }

    /// Marks agents whose beats stopped (while their tunnel stands) and forgets long-gone
    /// ones. Returns what it marked, for tests.
    pub async fn check(&self) -> Vec<String> {
        self.check_at(Instant::now()).await
    }

    /// [`Health::check`] as of `now` (tests look ahead in time rather than wait for it).
    pub(crate) async fn check_at(&self, now: Instant) -> Vec<String> {
        let limit = self.interval * MISSED;
        let since = |t: Instant| now.saturating_duration_since(t);
        let mut marked = Vec::new();
        {
            // One pass: each agent's entry is a cold read (10,000 of them every quarter
            // interval on a large fleet's idle hub), so it is read once.
            self.lock().retain(|id, agent| {
                if agent.gone_at.is_some_and(|t| since(t) >= FORGET_AFTER) {
                    return false;
                }
                if agent.connected
                    && !agent.missed
                    && agent.last_beat.is_some_and(|t| since(t) > limit)
                {
                    agent.missed = true;
                    marked.push((
                        id.clone(),
                        agent.kind.clone(),
                        agent.subject.clone(),
                        agent.last_beat_at,
                    ));
                }
                true
            });
        }
        for (id, kind, subject, last) in &marked {
            let last = match last {
                None => "none since it connected".to_owned(),
                Some(at) => format!("the last at {}", time_text(*at)),
            };
            let message = format!(
                "missed {MISSED} heartbeats ({} s apart; {last})",
                self.interval.as_secs_f64()
            );
            self.events.warning(
                "HeartbeatsMissed",
                subject,
                format!("{kind} {id} {message}"),
            );
            self.set_connected(kind, id, false, "HeartbeatsMissed", &message)
                .await;
        }
        marked.into_iter().map(|m| m.0).collect()
    }

    /// Runs the missed-beat check, the state-change events and the charts' writes until
    /// `shutdown`, then writes the charts' last minutes.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let every = (self.interval / 4).max(Duration::from_millis(100));
        let checks = async {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                self.check().await;
            }
        };
        let charts = async {
            let mut flushes = tokio::time::interval(CHARTS_FLUSH);
            flushes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                flushes.tick().await;
                self.write_charts().await;
            }
        };
        tokio::select! {
            biased;
            () = shutdown.cancelled() => {}
            () = checks => {}
            () = charts => {}
            () = self.watch_states() => {}
        }
        // The minutes closed since the last flush are kept for the next hub.
        self.write_charts().await;
    }

    /// Writes the charts' closed minutes, and forgets those older than a day, on a blocking
    /// thread.
    async fn write_charts(&self) {
        let charts = self.charts.clone();
        let _ = tokio::task::spawn_blocking(move || charts.flush(unix_now())).await;
    }
}

fn new_agent(kind: &str, subject: Subject) -> Agent {
    Agent {
        kind: kind.to_owned(),
        machine: machine(kind),
        subject,
        session: 0,
        connected: true,
        gone: None,
        gone_at: None,
        last_beat: None,
        last_beat_at: None,
        missed: false,
        answered: 0,
        facts: None,
        usage: None,
        history: None,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// RFC 3339, to the second.
fn time_text(at: SystemTime) -> String {
    rfc3339(
        at.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    )
}

fn rfc3339(unix: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp(i64::try_from(unix).unwrap_or(0))
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// The gRPC service agents beat on (the tunnel's control channel).
#[derive(Debug, Clone)]
pub struct HealthService(pub Arc<Health>);

#[tonic::async_trait]
impl proto::health::v1::health_server::Health for HealthService {
    async fn beat(
        &self,
        request: tonic::Request<Heartbeat>,
    ) -> Result<tonic::Response<BeatReply>, tonic::Status> {
        let info = request
            .extensions()
            .get::<SessionInfo>()
            .cloned()
            .ok_or_else(|| tonic::Status::internal("a heartbeat outside a tunnel session"))?;
        Ok(tonic::Response::new(
            self.0.beat(&info, request.into_inner()).await,
        ))
    }
}

#[cfg(test)]
mod tests;
