//! A machine's facts and usage, read with `sysinfo`, and the heartbeat loop every agent runs
//! on its tunnel's control channel (the node-agent and the system-agent send the machine's
//! facts and usage with their beats; the cluster-agent beats without them, as it speaks for a
//! cluster, not a machine).

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use prost::Message as _;
use proto::{
    health::v1::{BeatReply, Disk, Heartbeat, HostFacts, Usage, health_client::HealthClient},
    plan::v1::{PlanDelivery, PlanStatus, StatusAck, WatchPlan},
    session::v1::{AgentMessage, HubMessage, agent_message, hub_message},
};
use sysinfo::{Disks, Networks, System};
use tunnel::AgentSession;

/// Until the hub says otherwise.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// Reads the machine; keeps what `sysinfo` needs between samples (CPU usage is a difference).
/// Cheap to clone: clones share one reader, and a reading less than a second old is given
/// again rather than read anew, so the agents of a fleet simulator, all on one machine, read it
/// once however many of them beat.
#[derive(Debug, Clone)]
pub struct Sampler {
    machine: Arc<Mutex<Machine>>,
    /// For a simulated machine: the load it reports instead of this machine's.
    profile: Option<Profile>,
}

/// A simulated machine's load: CPU swinging slowly about its own level, memory at its own
/// share, so that the stand-in hosts and nodes of a demo, all on one machine, differ as a
/// fleet's machines would.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Profile {
    cpu_level: f32,
    cpu_swing: f32,
    period_seconds: f32,
    phase: f32,
    memory_share: f32,
}

impl Profile {
    /// The profile of simulated machine `seed`: levels spread by small primes, so that
    /// neighbouring seeds differ.
    fn of(seed: u32) -> Self {
        let spread = |prime: u32, range: u32| (seed.wrapping_mul(prime) % range) as f32;
        Self {
            cpu_level: 8.0 + spread(37, 60),
            cpu_swing: 3.0 + spread(7, 10),
            period_seconds: 300.0 + spread(53, 600),
            phase: spread(13, 628) / 100.0,
            memory_share: 0.2 + spread(29, 60) / 100.0,
        }
    }

    /// `real` as this machine would show it `seconds` into the epoch.
    fn apply(&self, mut real: Usage, seconds: f64) -> Usage {
        let angle = std::f64::consts::TAU * seconds / f64::from(self.period_seconds)
            + f64::from(self.phase);
        let cpu = f64::from(self.cpu_level) + f64::from(self.cpu_swing) * angle.sin();
        real.cpu_percent = cpu.clamp(1.0, 99.0) as f32;
        real.memory_used_bytes =
            (real.memory_total_bytes as f64 * f64::from(self.memory_share)) as u64;
        real
    }
}

#[derive(Debug)]
struct Machine {
    system: System,
    disks: Disks,
    networks: Networks,
    facts: Option<(Instant, HostFacts)>,
    usage: Option<(Instant, Usage)>,
}

/// How long a reading is given again to other clones.
const FRESH: Duration = Duration::from_secs(1);

impl Sampler {
    /// `None` where the platform gives `sysinfo` nothing to read.
    pub fn new() -> Option<Self> {
        let mut system = System::new().ok()?;
        system.refresh_cpu_usage();
        let machine = Machine {
            system,
            disks: Disks::new_with_refreshed_list().ok()?,
            networks: Networks::new_with_refreshed_list().ok()?,
            facts: None,
            usage: None,
        };
        Some(Self {
            machine: Arc::new(Mutex::new(machine)),
            profile: None,
        })
    }

    /// A simulated machine `seed` on this one: its facts are this machine's, its CPU and
    /// memory use its own ([`Profile`]), for stand-in hosts that should not all show the
    /// same load. Shares this sampler's reader.
    pub fn simulated(&self, seed: u32) -> Self {
        Self {
            machine: Arc::clone(&self.machine),
            profile: Some(Profile::of(seed)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Machine> {
        // A reading is replaced whole; a panic mid-read leaves nothing half-written.
        self.machine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What does not change while the machine runs (disks aside, read anew each time).
    pub fn facts(&self) -> HostFacts {
        let mut machine = self.lock();
        if let Some((at, facts)) = &machine.facts
            && at.elapsed() < FRESH
        {
            return facts.clone();
        }
        let facts = machine.read_facts();
        machine.facts = Some((Instant::now(), facts.clone()));
        facts
    }

    /// Usage now; CPU over the time since the previous reading.
    pub fn usage(&self) -> Usage {
        let usage = self.machine_usage();
        match &self.profile {
            Some(profile) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                profile.apply(usage, now.as_secs_f64())
            }
            None => usage,
        }
    }

    fn machine_usage(&self) -> Usage {
        let mut machine = self.lock();
        if let Some((at, usage)) = &machine.usage
            && at.elapsed() < FRESH
        {
            return *usage;
        }
        let usage = machine.read_usage();
        machine.usage = Some((Instant::now(), usage));
        usage
    }
}

impl Machine {
    fn read_facts(&mut self) -> HostFacts {
        self.system.refresh_memory();
        self.disks.refresh(true);
        HostFacts {
            hostname: System::host_name().unwrap_or_default(),
            os: System::long_os_version().unwrap_or_default(),
            kernel: System::kernel_version().unwrap_or_default(),
            arch: System::cpu_arch(),
            cpus: u32::try_from(self.system.cpus().len()).unwrap_or(u32::MAX),
            memory_bytes: self.system.total_memory(),
            disks: self
                .real_disks()
                .map(|d| Disk {
                    mount_point: d.mount_point().display().to_string(),
                    file_system: d.file_system().to_string_lossy().into_owned(),
                    total_bytes: d.total_space(),
                })
                .collect(),
            boot_time: System::boot_time().unwrap_or_default(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn read_usage(&mut self) -> Usage {
        self.system.refresh_cpu_usage();
        self.system.refresh_memory();
        self.disks.refresh(true);
        self.networks.refresh(true);
        let load = System::load_average().unwrap_or(sysinfo::LoadAvg {
            one: 0.0,
            five: 0.0,
            fifteen: 0.0,
        });
        let (mut disk_used, mut disk_total) = (0, 0);
        for disk in self.real_disks() {
            disk_total += disk.total_space();
            disk_used += disk.total_space().saturating_sub(disk.available_space());
        }
        let (mut rx, mut tx) = (0, 0);
        for (name, data) in self.networks.iter() {
            if name != "lo" {
                rx += data.total_received();
                tx += data.total_transmitted();
            }
        }
        Usage {
            cpu_percent: self.system.global_cpu_usage(),
            memory_used_bytes: self.system.used_memory(),
            memory_total_bytes: self.system.total_memory(),
            disk_used_bytes: disk_used,
            disk_total_bytes: disk_total,
            load1: load.one,
            load5: load.five,
            load15: load.fifteen,
            net_rx_bytes: rx,
            net_tx_bytes: tx,
        }
    }

    /// Each device once (bind mounts show the same device again), pseudo file systems left out.
    fn real_disks(&self) -> impl Iterator<Item = &sysinfo::Disk> {
        let mut seen = HashSet::new();
        self.disks.iter().filter(move |d| {
            let fs = d.file_system().to_string_lossy();
            d.total_space() > 0
                && !matches!(fs.as_ref(), "tmpfs" | "overlay" | "squashfs" | "devtmpfs")
                && seen.insert(d.name().to_owned())
        })
    }
}

/// Beats in this process so far; the first beat a hub sees from a process carries 1.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// Why the hub did not take a beat.
#[derive(Debug, thiserror::Error)]
pub enum BeatError {
    #[error("the hub refused the beat: {0}")]
    Call(#[from] tonic::Status),
    #[error(transparent)]
    Message(#[from] tunnel::NotSent),
}

/// Sends one heartbeat. Where the hub takes them as messages on the session itself (no
/// stream, call or task per beat on either end) it is not waited on: the hub answers each
/// (empty unless the answer changed: a session's first beat, or to ask for the facts), and
/// [`beat`] takes the answers as they come; `None` then. Else it is a gRPC call and its answer.
pub async fn send(
    session: &AgentSession,
    heartbeat: Heartbeat,
) -> Result<Option<BeatReply>, BeatError> {
    match &session.messages {
        Some(conversation) => {
            let message = AgentMessage {
                body: Some(agent_message::Body::Heartbeat(heartbeat)),
            };
            conversation.tell(message.encode_to_vec())?;
            Ok(None)
        }
        None => Ok(Some(
            HealthClient::new(session.channel.clone())
                .beat(heartbeat)
                .await?
                .into_inner(),
        )),
    }
}

/// Asks the hub to send this host's plan for `slot` ("" or "task") as session messages, the
/// current one and every change, for as long as the session lasts; they come to
/// [`beat_and_take_plans`]'s `on_plan`.
pub fn follow_plan(conversation: &tunnel::Conversation, slot: &str) -> Result<(), tunnel::NotSent> {
    let message = AgentMessage {
        body: Some(agent_message::Body::WatchPlan(WatchPlan {
            slot: slot.to_owned(),
        })),
    };
    conversation.tell(message.encode_to_vec())
}

/// Sends a plan slot's status to the hub as a session message; the hub's acknowledgement comes
/// to [`beat_and_take_plans`]'s `on_plan` once it is stored.
pub fn report(
    conversation: &tunnel::Conversation,
    status: PlanStatus,
) -> Result<(), tunnel::NotSent> {
    let message = AgentMessage {
        body: Some(agent_message::Body::Report(status)),
    };
    conversation.tell(message.encode_to_vec())
}

/// What the hub sends a system-agent about its plans, beside its answers to beats.
#[derive(Debug)]
pub enum PlanMessage {
    /// A slot's plan (see [`follow_plan`]).
    Delivery(PlanDelivery),
    /// A status stored (see [`report`]).
    ReportAck(StatusAck),
}

/// The hub's next answer to a beat sent as a message (`Some(None)`: an empty one, nothing
/// changed); never, where beats are calls. Its other messages (about plans) go to `on_plan`.
async fn next_answer(
    session: &AgentSession,
    on_plan: &mut impl FnMut(PlanMessage),
) -> Option<Option<BeatReply>> {
    let Some(conversation) = &session.messages else {
        return std::future::pending().await;
    };
    loop {
        let answer = conversation.answer().await?;
        match HubMessage::decode(answer.as_slice()) {
            Ok(HubMessage { body: None }) => return Some(None),
            Ok(HubMessage {
                body: Some(hub_message::Body::BeatReply(reply)),
            }) => return Some(Some(reply)),
            Ok(HubMessage {
                body: Some(hub_message::Body::Plan(delivery)),
            }) => on_plan(PlanMessage::Delivery(delivery)),
            Ok(HubMessage {
                body: Some(hub_message::Body::ReportAck(ack)),
            }) => on_plan(PlanMessage::ReportAck(ack)),
            Err(e) => tracing::warn!(error = %e, "a message from the hub that is not a HubMessage"),
        }
    }
}

/// What the hub asks of the beats that follow.
#[derive(Debug, Clone, Copy)]
struct Asked {
    interval: Duration,
    send_facts: bool,
}

impl Asked {
    fn take(&mut self, reply: BeatReply) {
        if reply.interval_millis > 0 {
            self.interval = Duration::from_millis(reply.interval_millis.into());
        }
        self.send_facts = reply.send_facts;
    }
}

/// Sends heartbeats on `session` until it ends, at the interval the hub asks for. With a
/// sampler each beat carries the machine's usage, and the session's first beat (and any the hub
/// asks for) its facts.
pub async fn beat(session: &AgentSession, sampler: Option<&Sampler>) {
    beat_and_take_plans(session, sampler, |message| {
        tracing::warn!(
            ?message,
            "the hub sent a plan message to an agent that has no plans"
        );
    })
    .await;
}

/// [`beat`], for the agent that follows and reports plans with messages on the same session
/// (the system-agent): the hub's plan deliveries and report acknowledgements, which come
/// between its answers, go to `on_plan`.
pub async fn beat_and_take_plans(
    session: &AgentSession,
    sampler: Option<&Sampler>,
    mut on_plan: impl FnMut(PlanMessage),
) {
    let mut asked = Asked {
        interval: DEFAULT_INTERVAL,
        send_facts: true,
    };
    loop {
        let heartbeat = Heartbeat {
            seq: SEQ.fetch_add(1, Ordering::Relaxed) + 1,
            facts: sampler.filter(|_| asked.send_facts).map(Sampler::facts),
            usage: sampler.map(Sampler::usage),
        };
        let sent = tokio::time::Instant::now();
        let mut retry = false;
        match send(session, heartbeat).await {
            Ok(Some(reply)) => asked.take(reply),
            // Taken as sent; the hub says if it wants the facts again.
            Ok(None) => asked.send_facts = false,
            Err(e) => {
                if session.session.is_ended() {
                    return;
                }
                tracing::warn!(error = %e, "the hub did not take a heartbeat");
                // Facts may have been lost with it.
                asked.send_facts = sampler.is_some();
                retry = true;
            }
        }
        loop {
            let pause = if retry {
                asked.interval.min(Duration::from_secs(1))
            } else {
                asked.interval
            };
            tokio::select! {
                _ = session.session.ended() => return,
                () = tokio::time::sleep_until(sent + pause) => break,
                Some(reply) = next_answer(session, &mut on_plan) => {
                    if let Some(reply) = reply {
                        asked.take(reply);
                    }
                    if asked.send_facts && sampler.is_some() {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_and_usage_describe_this_machine() {
        let sampler = Sampler::new().expect("sysinfo reads Linux");
        let facts = sampler.facts();
        assert!(facts.cpus >= 1, "{facts:?}");
        assert!(facts.memory_bytes > 0, "{facts:?}");
        assert!(!facts.kernel.is_empty(), "{facts:?}");
        assert!(facts.boot_time > 1_500_000_000, "{facts:?}");
        let usage = sampler.usage();
        assert_eq!(usage.memory_total_bytes, facts.memory_bytes);
        assert!(usage.memory_used_bytes <= usage.memory_total_bytes);
        assert!((0.0..=100.0).contains(&usage.cpu_percent), "{usage:?}");
        assert!(usage.disk_used_bytes <= usage.disk_total_bytes);
    }

    #[test]
    fn simulated_machines_show_loads_of_their_own_that_move() {
        let real = Usage {
            cpu_percent: 99.0,
            memory_used_bytes: 15 << 30,
            memory_total_bytes: 16 << 30,
            ..Usage::default()
        };
        // Neighbouring demo machines differ, in CPU and in memory, whatever this machine does.
        let at = |seed: u32, seconds: f64| Profile::of(seed).apply(real, seconds);
        let loads: Vec<(f32, u64)> = (0..5)
            .map(|seed| {
                let u = at(seed, 1_000_000.0);
                (u.cpu_percent, u.memory_used_bytes)
            })
            .collect();
        for (i, a) in loads.iter().enumerate() {
            assert!((1.0..=99.0).contains(&a.0), "{loads:?}");
            assert!(a.1 < real.memory_total_bytes, "{loads:?}");
            for b in &loads[i + 1..] {
                assert!(a.0 != b.0 && a.1 != b.1, "{loads:?}");
            }
        }
        // One machine's CPU moves over minutes, within its swing about its level.
        let profile = Profile::of(3);
        let cpu: Vec<f32> = (0..10)
            .map(|minute| {
                profile
                    .apply(real, 1_000_000.0 + 60.0 * f64::from(minute))
                    .cpu_percent
            })
            .collect();
        assert!(cpu.windows(2).all(|w| w[0] != w[1]), "{cpu:?}");
        assert!(
            cpu.iter()
                .all(|c| (c - profile.cpu_level).abs() <= profile.cpu_swing + 0.001),
            "{cpu:?}"
        );
        // Everything but CPU and memory is the machine's own reading.
        assert_eq!(at(1, 0.0).memory_total_bytes, real.memory_total_bytes);
    }
}
