//! What the API, the dashboard and the metrics read of the health held in memory.

use std::collections::HashMap;

use proto::health::v1::{Disk, HostFacts, Usage};
use serde_json::{Value, json};

use super::{Agent, ClusterSummary, Health, MISSED, history, rfc3339, time_text, unix_now};
use crate::identity;

impl Health {
    /// Node-agents' nodes of `cluster`, as the API shows them.
    pub fn nodes(&self, cluster: &str) -> Vec<Value> {
        let agents = self.lock();
        let mut nodes: Vec<Value> = agents
            .values()
            .filter(|a| a.kind == identity::NODE_AGENT && a.subject.cluster == cluster)
            .map(|a| self.present(a))
            .collect();
        nodes.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        nodes
    }

    /// One node-agent's node, or one system-agent's host, with its usage history.
    pub async fn usage(&self, peer_id: &str) -> Option<Value> {
        let now = unix_now();
        let (mut out, open) = {
            let agents = self.lock();
            let agent = agents.get(peer_id)?;
            let open = agent.history.as_ref().and_then(|h| h.open_point(now));
            (self.present(agent), open)
        };
        let points: Vec<Value> = self
            .day_of(peer_id, now, open)
            .await
            .into_iter()
            .map(|p| {
                let mut v = serde_json::to_value(p).unwrap_or_default();
                v["time"] = json!(rfc3339(u64::from(p.minute) * 60));
                v
            })
            .collect();
        out["resolutionSeconds"] = json!(60);
        out["windowSeconds"] = json!(history::MINUTES * 60);
        out["points"] = json!(points);
        Some(out)
    }

    /// Each cluster's agents connected now and its machines' usage summed, in one pass over
    /// the agents (a page lists every cluster). Machines are the node-agents' nodes and the
    /// system-agents' hosts that have reported usage.
    pub fn cluster_summaries(&self) -> HashMap<String, ClusterSummary> {
        let agents = self.lock();
        let mut sums: HashMap<String, ClusterSummary> = HashMap::new();
        for agent in agents.values() {
            let sum = sums.entry(agent.subject.cluster.clone()).or_default();
            if agent.connected && !agent.missed {
                sum.agents += 1;
            }
            if let (Some(usage), true) = (&agent.usage, agent.connected) {
                let n = f64::from(agent.facts.as_ref().map_or(1, |f| f.cpus.max(1)));
                sum.cpu_weighted += f64::from(usage.cpu_percent) * n;
                sum.cpus += n;
                sum.memory_used += usage.memory_used_bytes;
                sum.memory_total += usage.memory_total_bytes;
            }
        }
        sums
    }

    /// One machine's CPU over the last hour (points with `cpu_percent` only, oldest first) and
    /// its latest usage, from memory: for the rows of a list of machines.
    pub fn last_hour(&self, peer_id: &str) -> Option<(Vec<history::Point>, Option<Usage>)> {
        let agents = self.lock();
        let agent = agents.get(peer_id)?;
        let points = agent
            .history
            .as_ref()
            .map(|h| h.last_hour_cpu(unix_now()))
            .unwrap_or_default();
        Some((points, agent.usage))
    }

    /// A machine's closed minutes of the 24 hours before `now`, read from the charts' file on
    /// a blocking thread (a day is 1,440 lookups), then `open`, the minute being filled when
    /// the caller looked (unless it closed meanwhile and is among them).
    async fn day_of(
        &self,
        peer_id: &str,
        now: u64,
        open: Option<history::Point>,
    ) -> Vec<history::Point> {
        let (charts, peer) = (self.charts.clone(), peer_id.to_owned());
        let mut points = tokio::task::spawn_blocking(move || charts.points(&peer, now))
            .await
            .unwrap_or_default();
        let newest = points.last().map(|p| p.minute);
        points.extend(open.filter(|o| newest.is_none_or(|n| o.minute > n)));
        points
    }

    /// One machine's points of the last 24 h (oldest first) and its latest usage, for charts.
    pub async fn history(&self, peer_id: &str) -> Option<(Vec<history::Point>, Option<Usage>)> {
        let now = unix_now();
        let (open, usage) = {
            let agents = self.lock();
            let agent = agents.get(peer_id)?;
            let open = agent.history.as_ref().and_then(|h| h.open_point(now));
            (open, agent.usage)
        };
        Some((self.day_of(peer_id, now, open).await, usage))
    }

    fn present(&self, agent: &Agent) -> Value {
        let (state, message) = if !agent.connected {
            let (why, since) = agent.gone.clone().unwrap_or_default();
            (
                "disconnected",
                format!("{} since {since}: {why}", agent.kind),
            )
        } else if agent.missed {
            (
                "disconnected",
                format!(
                    "{} missed {MISSED} heartbeats; the last at {}",
                    agent.kind,
                    agent.last_beat_at.map(time_text).unwrap_or_default()
                ),
            )
        } else {
            ("active", String::new())
        };
        let name = if agent.subject.node.is_empty() {
            &agent.subject.host
        } else {
            &agent.subject.node
        };
        json!({
            "name": name,
            "cluster": agent.subject.cluster,
            "agent": agent.kind,
            "state": state,
            "message": message,
            "lastHeartbeat": agent.last_beat_at.map(time_text).unwrap_or_default(),
            "facts": agent.facts.as_ref().map(facts_json),
            "usage": agent.usage.as_ref().map(usage_json),
        })
    }

    /// Agents by kind and state (`active`, `disconnected`), for `/metrics`.
    pub fn agent_states(&self) -> Vec<((String, &'static str), u64)> {
        let mut counts: HashMap<(String, &'static str), u64> = HashMap::new();
        for agent in self.lock().values() {
            let state = if agent.connected && !agent.missed {
                "active"
            } else {
                "disconnected"
            };
            *counts.entry((agent.kind.clone(), state)).or_default() += 1;
        }
        let mut counts: Vec<_> = counts.into_iter().collect();
        counts.sort();
        counts
    }
}

pub fn facts_json(f: &HostFacts) -> Value {
    json!({
        "hostname": f.hostname,
        "os": f.os,
        "kernel": f.kernel,
        "arch": f.arch,
        "cpus": f.cpus,
        "memoryBytes": f.memory_bytes,
        "disks": f.disks.iter().map(|d| json!({
            "mountPoint": d.mount_point,
            "fileSystem": d.file_system,
            "totalBytes": d.total_bytes,
        })).collect::<Vec<_>>(),
        "bootTime": rfc3339(f.boot_time),
        "agentVersion": f.agent_version,
    })
}

/// Facts as [`facts_json`] wrote them into a Host's status, read back; `None` for any other
/// shape. A restarted hub takes a host's facts from its Host, so that the same facts sent
/// again by the reconnecting agent are not written again.
pub(super) fn facts_from_json(v: &Value) -> Option<HostFacts> {
    let text = |v: &Value, key: &str| v.get(key)?.as_str().map(str::to_owned);
    let boot = v.get("bootTime")?.as_str()?;
    let boot = crate::model::parse_time(boot)?.unix_timestamp();
    let disks = v
        .get("disks")?
        .as_array()?
        .iter()
        .map(|d| {
            Some(Disk {
                mount_point: text(d, "mountPoint")?,
                file_system: text(d, "fileSystem")?,
                total_bytes: d.get("totalBytes")?.as_u64()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(HostFacts {
        hostname: text(v, "hostname")?,
        os: text(v, "os")?,
        kernel: text(v, "kernel")?,
        arch: text(v, "arch")?,
        cpus: u32::try_from(v.get("cpus")?.as_u64()?).ok()?,
        memory_bytes: v.get("memoryBytes")?.as_u64()?,
        disks,
        boot_time: u64::try_from(boot).ok()?,
        agent_version: text(v, "agentVersion")?,
    })
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "cpuPercent": u.cpu_percent,
        "memoryUsedBytes": u.memory_used_bytes,
        "memoryTotalBytes": u.memory_total_bytes,
        "diskUsedBytes": u.disk_used_bytes,
        "diskTotalBytes": u.disk_total_bytes,
        "load1": u.load1,
        "load5": u.load5,
        "load15": u.load15,
        "netRxBytes": u.net_rx_bytes,
        "netTxBytes": u.net_tx_bytes,
    })
}
