//! The machine controller's decisions for one cluster, apart from their effects: from its pools,
//! machines and hosts, which machines to make, which to remove, and the next step of each.
//! Nothing here reads or writes the store or calls a machine.

use std::{collections::BTreeMap, time::Duration};

use serde_json::Value;
use time::OffsetDateTime;

use crate::{
    model::{MachinePool, Status, parse_time, phase},
    store::Object,
};

/// What one pass asks for, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// A new Machine object for `pool` (from its template), before anything is made for it.
    Create { pool: String, template: String },
    /// Remove `machine` (scale down, a pool gone, an old template): its host is uninstalled,
    /// then it goes.
    Remove { machine: String },
    /// Replace `machine`, unhealthy (`why`): it is destroyed at its driver first (its host
    /// cannot uninstall), then its host goes; a new machine takes its place.
    Replace { machine: String, why: String },
    /// Get the machine from its driver (an SSH machine: an address of the template's).
    Provision { machine: String },
    /// Install the system-agent on it with the host command for its pool's roles.
    Bootstrap { machine: String },
    /// Its host registered: the machine is that host.
    Link { machine: String, host: String },
    /// A machine being removed: delete its host (uninstalled by the planner), and once the
    /// host is gone, release the machine at its driver and let the object go.
    Release {
        machine: String,
        host: Option<String>,
    },
}

impl Action {
    /// The machine a step of an existing machine is for.
    pub(crate) fn machine(&self) -> Option<&str> {
        match self {
            Action::Create { .. } => None,
            Action::Remove { machine }
            | Action::Replace { machine, .. }
            | Action::Provision { machine }
            | Action::Bootstrap { machine }
            | Action::Link { machine, .. }
            | Action::Release { machine, .. } => Some(machine),
        }
    }
}

/// What the controller read about one cluster.
pub(crate) struct View<'a> {
    pub pools: &'a [MachinePool],
    /// The cluster's machines, oldest first.
    pub machines: &'a [&'a Object],
    /// The cluster's hosts.
    pub hosts: &'a [&'a Object],
    /// The host that initialised the cluster (its etcd's first member).
    pub init_host: Option<&'a str>,
    /// Each template's version with its credential's (`"<template rv>/<credential rv>"`): a
    /// change of either is a change a refused step may be tried again for.
    pub versions: &'a BTreeMap<String, String>,
    /// Machines whose instance the provider no longer has, and why that is known.
    pub gone: &'a BTreeMap<String, String>,
    pub now: OffsetDateTime,
}

/// The first retry of a failed step comes this long after it; each further one twice as long
/// after the last, up to [`RETRY_CAP`].
const RETRY_BASE: Duration = Duration::from_secs(10);
const RETRY_CAP: Duration = Duration::from_secs(300);

/// How long after its `failures`-th failure in a row a step is tried again.
pub(crate) fn retry_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    RETRY_BASE.saturating_mul(1 << doublings).min(RETRY_CAP)
}

/// What a machine's steps are made of, as a string that changes whenever its pool's settings
/// (its quantity aside), its template or the template's credential does: a failure recorded
/// for another fingerprint is a failure of settings that are no longer asked for.
pub(crate) fn fingerprint(machine: &Object, view: &View<'_>) -> String {
    let pool = view
        .pools
        .iter()
        .find(|p| p.name == text(machine, "/pool"))
        .map(|p| {
            let mut p = p.clone();
            p.quantity = 0;
            serde_json::to_string(&p).unwrap_or_default()
        })
        .unwrap_or_default();
    let template = text(machine, "/template");
    let version = view.versions.get(template).map_or("", String::as_str);
    format!("{pool}|{template}@{version}")
}

/// Whether `machine`'s last step failed for settings still asked for and is not to be tried
/// yet: refused (until they change), or before its `nextAttempt`.
fn backing_off(machine: &Object, view: &View<'_>) -> bool {
    let status = Status::of(machine);
    let Some(failed_for) = status.extra.get(FAILED_FOR).and_then(Value::as_str) else {
        return false;
    };
    if failed_for != fingerprint(machine, view) {
        return false;
    }
    if status.extra.get(REFUSED) == Some(&Value::Bool(true)) {
        return true;
    }
    status
        .extra
        .get(NEXT_ATTEMPT)
        .and_then(Value::as_str)
        .and_then(parse_time)
        .is_some_and(|next| view.now < next)
}

/// On a Machine's status, after a failed step: the fingerprint it failed for ...
pub(crate) const FAILED_FOR: &str = "failedFor";
/// ... how many times in a row ...
pub(crate) const FAILURES: &str = "failures";
/// ... when it is tried next (RFC 3339) ...
pub(crate) const NEXT_ATTEMPT: &str = "nextAttempt";
/// ... or that the provider refused it as asked: not until the settings change.
pub(crate) const REFUSED: &str = "refused";

/// A spec field at `pointer`, or "".
pub(super) fn text<'a>(object: &'a Object, pointer: &str) -> &'a str {
    object
        .spec
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn status_text(object: &Object, field: &str) -> String {
    Status::of(object)
        .extra
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The host a machine became: the one recorded, or the cluster's host named after it.
fn host_of<'a>(machine: &Object, hosts: &'a [&'a Object]) -> Option<&'a Object> {
    let recorded = status_text(machine, "host");
    hosts
        .iter()
        .copied()
        .find(|h| h.metadata.name == recorded || text(h, "/nodeName") == machine.metadata.name)
}

/// Since when a host's agent has been disconnected, if it is.
fn disconnected_since(host: &Object) -> Option<OffsetDateTime> {
    let status = Status::of(host);
    let connected = status.conditions.iter().find(|c| c.kind == "Connected")?;
    (connected.status == "False")
        .then(|| parse_time(&connected.last_transition_time))
        .flatten()
}

/// Whether a machine counts as available: running, its host's agent connected.
fn ready(machine: &Object, hosts: &[&Object]) -> bool {
    status_text(machine, "phase") == phase::RUNNING
        && host_of(machine, hosts).is_some_and(|h| disconnected_since(h).is_none())
}

/// Why `machine` should be replaced, if it should: its host disconnected for longer than
/// `limit`, or no host registered within `limit` of its making.
fn unhealthy(machine: &Object, view: &View<'_>, limit: Duration) -> Option<String> {
    let since = match host_of(machine, view.hosts) {
        Some(host) => disconnected_since(host)?,
        None => parse_time(&machine.metadata.creation_timestamp)?,
    };
    let limit_secs = i64::try_from(limit.as_secs()).unwrap_or(i64::MAX);
    if (view.now - since).whole_seconds() < limit_secs {
        return None;
    }
    Some(match host_of(machine, view.hosts) {
        Some(host) => format!(
            "its host {} has been disconnected for more than {}s",
            host.metadata.name,
            limit.as_secs()
        ),
        None => format!(
            "no host registered within {}s of its making",
            limit.as_secs()
        ),
    })
}

pub(crate) fn decide(view: &View<'_>) -> Vec<Action> {
    let mut actions = Vec::new();
    let (deleting, live): (Vec<&Object>, Vec<&Object>) = view
        .machines
        .iter()
        .copied()
        .partition(|m| m.metadata.deletion_timestamp.is_some());
    let pool_of = |m: &Object| view.pools.iter().find(|p| p.name == text(m, "/pool"));
    let is_init = |m: &Object| {
        host_of(m, view.hosts).is_some_and(|h| Some(h.metadata.name.as_str()) == view.init_host)
    };
    let mut removing: Vec<String> = Vec::new();
    // Machines of pools that are gone go, all of them (the cluster itself may be going).
    for machine in &live {
        if pool_of(machine).is_none() {
            removing.push(machine.metadata.name.clone());
        }
    }
    // etcd machines: one leaves at a time, and only while the members that stay and are ready
    // keep a quorum of the members that stay.
    let etcd_pools: Vec<&str> = view
        .pools
        .iter()
        .filter(|p| p.roles.etcd)
        .map(|p| p.name.as_str())
        .collect();
    let etcd = |m: &Object| etcd_pools.contains(&text(m, "/pool"));
    let mut etcd_leaving = deleting.iter().filter(|m| etcd(m)).count();
    let mut etcd_members: Vec<&Object> = live.iter().copied().filter(|m| etcd(m)).collect();
    let mut may_leave = |m: &Object, members: &mut Vec<&Object>| -> bool {
        if !etcd(m) {
            return true;
        }
        let staying: Vec<&Object> = members
            .iter()
            .copied()
            .filter(|o| o.metadata.name != m.metadata.name)
            .collect();
        let ready_staying = staying.iter().filter(|o| ready(o, view.hosts)).count();
        if etcd_leaving > 0 || staying.is_empty() || ready_staying < staying.len() / 2 + 1 {
            return false;
        }
        etcd_leaving += 1;
        *members = staying;
        true
    };
    let mut replacing: Vec<String> = Vec::new();
    for pool in view.pools {
        let all: Vec<&Object> = live
            .iter()
            .copied()
            .filter(|m| text(m, "/pool") == pool.name)
            .collect();
        // Unhealthy machines are replaced: they leave, and the count below makes another. A
        // machine whose instance is gone is, whatever `unhealthyAfter` says.
        let limit = crate::model::parse_duration(&pool.unhealthy_after);
        for machine in &all {
            let why = view
                .gone
                .get(&machine.metadata.name)
                .cloned()
                .or_else(|| limit.and_then(|limit| unhealthy(machine, view, limit)));
            if let Some(why) = why {
                replacing.push(machine.metadata.name.clone());
                actions.push(Action::Replace {
                    machine: machine.metadata.name.clone(),
                    why,
                });
            }
        }
        let mine: Vec<&Object> = all
            .into_iter()
            .filter(|m| !replacing.contains(&m.metadata.name))
            .collect();
        let want = pool.quantity as usize;
        let (current, outdated): (Vec<&Object>, Vec<&Object>) = mine
            .iter()
            .copied()
            .partition(|m| text(m, "/template") == pool.template);
        // Newest first; the machine that initialised the cluster last of all, as its etcd
        // holds the cluster's first member.
        let newest_first = |list: &mut Vec<&Object>| {
            list.sort_by(|a, b| {
                (is_init(a), &b.metadata.creation_timestamp, &b.metadata.name).cmp(&(
                    is_init(b),
                    &a.metadata.creation_timestamp,
                    &a.metadata.name,
                ))
            });
        };
        if outdated.is_empty() {
            for _ in mine.len()..want {
                actions.push(Action::Create {
                    pool: pool.name.clone(),
                    template: pool.template.clone(),
                });
            }
            let mut order = mine.clone();
            newest_first(&mut order);
            for machine in order.into_iter().take(mine.len().saturating_sub(want)) {
                if may_leave(machine, &mut etcd_members) {
                    removing.push(machine.metadata.name.clone());
                }
            }
            continue;
        }
        // Rolling to a new template, as a Cluster API MachineDeployment does: new machines up
        // to `quantity + maxSurge` in all, old ones removed while `quantity - maxUnavailable`
        // stay available (unready old ones first: they are not available anyway).
        // Machines still being removed count: they exist (and cost) until they are gone.
        let going = deleting
            .iter()
            .filter(|m| text(m, "/pool") == pool.name)
            .count();
        let room = (want + pool.max_surge as usize).saturating_sub(mine.len() + going);
        for _ in 0..want.saturating_sub(current.len()).min(room) {
            actions.push(Action::Create {
                pool: pool.name.clone(),
                template: pool.template.clone(),
            });
        }
        let available = mine.iter().filter(|m| ready(m, view.hosts)).count();
        let mut budget =
            available.saturating_sub(want.saturating_sub(pool.max_unavailable as usize));
        // Enough new machines ready already: every old one may go (as a scale down).
        let enough = current.iter().filter(|m| ready(m, view.hosts)).count() >= want;
        if enough {
            budget = outdated.len();
        }
        let mut old = outdated.clone();
        newest_first(&mut old);
        old.sort_by_key(|m| ready(m, view.hosts));
        for machine in old {
            let free = !ready(machine, view.hosts) || enough;
            if !free && budget == 0 {
                continue;
            }
            if may_leave(machine, &mut etcd_members) {
                removing.push(machine.metadata.name.clone());
                if !free {
                    budget -= 1;
                }
            }
        }
    }
    for name in &removing {
        actions.push(Action::Remove {
            machine: name.clone(),
        });
    }
    for machine in &live {
        let name = machine.metadata.name.clone();
        if removing.contains(&name) || replacing.contains(&name) {
            continue;
        }
        let status = status_text(machine, "phase");
        match status.as_str() {
            "" | phase::PENDING => actions.push(Action::Provision { machine: name }),
            phase::PROVISIONING => actions.push(Action::Bootstrap { machine: name }),
            phase::BOOTSTRAPPING | phase::RUNNING => match host_of(machine, view.hosts) {
                Some(host) if status_text(machine, "host") != host.metadata.name => {
                    actions.push(Action::Link {
                        machine: name,
                        host: host.metadata.name.clone(),
                    });
                }
                _ => {}
            },
            _ => {}
        }
    }
    for machine in deleting {
        actions.push(Action::Release {
            machine: machine.metadata.name.clone(),
            host: host_of(machine, view.hosts).map(|h| h.metadata.name.clone()),
        });
    }
    // A step that calls the driver waits out its machine's backoff.
    actions.retain(|action| {
        let machine = match action {
            Action::Provision { machine }
            | Action::Bootstrap { machine }
            | Action::Release {
                machine,
                host: None,
            } => machine,
            _ => return true,
        };
        !view
            .machines
            .iter()
            .any(|m| &m.metadata.name == machine && backing_off(m, view))
    });
    actions
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn pool(name: &str, quantity: u32) -> MachinePool {
        serde_json::from_value(json!({"name": name, "quantity": quantity,
            "roles": {"worker": true}, "template": "lab-v1"}))
        .unwrap()
    }

    fn machine(name: &str, pool: &str, created: &str, phase: &str, host: &str) -> Object {
        let mut m = Object::new(
            "Machine",
            name,
            json!({"cluster": "edge", "pool": pool, "template": "lab-v1"}),
        );
        m.metadata.creation_timestamp = created.into();
        m.status = json!({"phase": phase, "host": host});
        m
    }

    fn now() -> OffsetDateTime {
        time::macros::datetime!(2026-11-26 12:00:00 UTC)
    }

    fn host(name: &str, node: &str) -> Object {
        Object::new("Host", name, json!({"cluster": "edge", "nodeName": node}))
    }

    /// A machine whose instance is gone is replaced at once, `unhealthyAfter` set or not;
    /// the others take their next step.
    #[test]
    fn a_machine_whose_instance_is_gone_is_replaced_without_unhealthy_after() {
        let m = [
            machine(
                "edge-w-a",
                "w",
                "2026-11-26T11:59:00Z",
                phase::BOOTSTRAPPING,
                "",
            ),
            machine(
                "edge-w-b",
                "w",
                "2026-11-26T11:59:00Z",
                phase::RUNNING,
                "h-b",
            ),
        ];
        let machines: Vec<&Object> = m.iter().collect();
        let hosts = [host("h-b", "edge-w-b")];
        let hosts: Vec<&Object> = hosts.iter().collect();
        let gone = BTreeMap::from([("edge-w-a".to_owned(), "its instance i-1 is gone".to_owned())]);
        for unhealthy_after in ["", "1h"] {
            let mut pools = [pool("w", 2)];
            pools[0].unhealthy_after = unhealthy_after.into();
            let actions = decide(&View {
                pools: &pools,
                machines: &machines,
                hosts: &hosts,
                init_host: None,
                versions: &BTreeMap::new(),
                gone: &gone,
                now: now(),
            });
            assert_eq!(
                actions,
                vec![
                    Action::Replace {
                        machine: "edge-w-a".into(),
                        why: "its instance i-1 is gone".into()
                    },
                    Action::Create {
                        pool: "w".into(),
                        template: "lab-v1".into()
                    },
                ],
                "{unhealthy_after:?}"
            );
        }
    }

    #[test]
    fn retries_wait_twice_as_long_each_time_up_to_five_minutes() {
        let table = [
            (0, 10),
            (1, 10),
            (2, 20),
            (3, 40),
            (4, 80),
            (5, 160),
            (6, 300),
            (7, 300),
            (40, 300),
        ];
        for (failures, secs) in table {
            assert_eq!(
                retry_delay(failures),
                Duration::from_secs(secs),
                "{failures}"
            );
        }
    }

    /// A failed step waits out its backoff (refused: until its settings change); a change of
    /// the pool, the template or its credential lets it go at once.
    #[test]
    fn a_failed_step_waits_its_turn_and_a_refused_one_a_change() {
        let pools = [pool("w", 1)];
        let versions = BTreeMap::from([("lab-v1".to_owned(), "7/3".to_owned())]);
        let view_of = |machines: &[&Object], versions: &BTreeMap<String, String>| -> Vec<Action> {
            decide(&View {
                pools: &pools,
                machines,
                hosts: &[],
                init_host: None,
                versions,
                gone: &BTreeMap::new(),
                now: now(),
            })
        };
        let provision = vec![Action::Provision {
            machine: "edge-w-a".into(),
        }];
        let fresh = machine("edge-w-a", "w", "2026-11-26T11:59:00Z", phase::PENDING, "");
        let settings = fingerprint(
            &fresh,
            &View {
                pools: &pools,
                machines: &[],
                hosts: &[],
                init_host: None,
                versions: &versions,
                gone: &BTreeMap::new(),
                now: now(),
            },
        );
        let failed = |next: &str, refused: bool, failed_for: &str| {
            let mut m = fresh.clone();
            m.status = json!({"phase": phase::PENDING, "failures": 3, "nextAttempt": next,
                              "refused": refused, "failedFor": failed_for});
            m
        };
        // (next attempt, refused, failed for these settings?, versions, provisioned now?)
        let other_versions = BTreeMap::from([("lab-v1".to_owned(), "8/3".to_owned())]);
        let cases = [
            ("2026-11-26T12:00:30Z", false, true, &versions, false),
            ("2026-11-26T12:00:00Z", false, true, &versions, true),
            ("2026-11-26T11:59:59Z", false, true, &versions, true),
            ("", true, true, &versions, false),
            ("2026-11-26T11:00:00Z", true, true, &versions, false),
            ("", true, true, &other_versions, true),
            ("2026-11-26T12:00:30Z", false, false, &versions, true),
        ];
        for (next, refused, same, versions, goes) in cases {
            let m = failed(next, refused, if same { &settings } else { "before" });
            let actions = view_of(&[&m], versions);
            assert_eq!(
                actions == provision,
                goes,
                "{next} refused={refused} same={same}: {actions:?}"
            );
        }
        // A pool's quantity is not one of the settings; its roles are.
        let mut grown = pools.clone();
        grown[0].quantity = 5;
        let mut other_roles = pools.clone();
        other_roles[0].roles.etcd = true;
        let view = |pools: &[MachinePool]| {
            fingerprint(
                &fresh,
                &View {
                    pools,
                    machines: &[],
                    hosts: &[],
                    init_host: None,
                    versions: &versions,
                    gone: &BTreeMap::new(),
                    now: now(),
                },
            )
        };
        assert_eq!(view(&grown), settings);
        assert_ne!(view(&other_roles), settings);
    }

    #[test]
    fn a_pool_gets_its_machines_and_each_takes_its_next_step() {
        let m = [
            machine("edge-w-a", "w", "2026-11-26T10:00:00Z", "", ""),
            machine(
                "edge-w-b",
                "w",
                "2026-11-26T10:00:01Z",
                phase::PROVISIONING,
                "",
            ),
            machine(
                "edge-w-c",
                "w",
                "2026-11-26T10:00:02Z",
                phase::BOOTSTRAPPING,
                "",
            ),
        ];
        let hosts = [host("h-1", "edge-w-c")];
        let machines: Vec<&Object> = m.iter().collect();
        let hosts: Vec<&Object> = hosts.iter().collect();
        let actions = decide(&View {
            pools: &[pool("w", 4)],
            machines: &machines,
            hosts: &hosts,
            init_host: None,
            versions: &BTreeMap::new(),
            gone: &BTreeMap::new(),
            now: now(),
        });
        assert_eq!(
            actions,
            [
                Action::Create {
                    pool: "w".into(),
                    template: "lab-v1".into()
                },
                Action::Provision {
                    machine: "edge-w-a".into()
                },
                Action::Bootstrap {
                    machine: "edge-w-b".into()
                },
                Action::Link {
                    machine: "edge-w-c".into(),
                    host: "h-1".into()
                },
            ]
        );
    }

    #[test]
    fn scaling_down_removes_the_newest_but_never_the_init_host_first() {
        let m = [
            machine(
                "edge-s-a",
                "s",
                "2026-11-26T10:00:00Z",
                phase::RUNNING,
                "h-a",
            ),
            machine(
                "edge-s-b",
                "s",
                "2026-11-26T10:00:01Z",
                phase::RUNNING,
                "h-b",
            ),
            machine(
                "edge-s-c",
                "s",
                "2026-11-26T10:00:02Z",
                phase::RUNNING,
                "h-c",
            ),
        ];
        let hosts = [
            host("h-a", "edge-s-a"),
            host("h-b", "edge-s-b"),
            host("h-c", "edge-s-c"),
        ];
        let machines: Vec<&Object> = m.iter().collect();
        let hosts: Vec<&Object> = hosts.iter().collect();
        let removed = |quantity: u32, init: Option<&str>| -> Vec<String> {
            decide(&View {
                pools: &[pool("s", quantity)],
                machines: &machines,
                hosts: &hosts,
                init_host: init,
                versions: &BTreeMap::new(),
                gone: &BTreeMap::new(),
                now: now(),
            })
            .into_iter()
            .filter_map(|a| match a {
                Action::Remove { machine } => Some(machine),
                _ => None,
            })
            .collect()
        };
        assert_eq!(removed(1, None), ["edge-s-c", "edge-s-b"]);
        // The newest initialised the cluster: it goes last.
        assert_eq!(removed(2, Some("h-c")), ["edge-s-b"]);
        assert_eq!(
            removed(0, Some("h-c")),
            ["edge-s-b", "edge-s-a", "edge-s-c"]
        );
        // A pool that is gone takes its machines with it.
        let gone = decide(&View {
            pools: &[],
            machines: &machines,
            hosts: &hosts,
            init_host: None,
            versions: &BTreeMap::new(),
            gone: &BTreeMap::new(),
            now: now(),
        });
        assert_eq!(gone.len(), 3);
    }

    #[test]
    fn a_machine_being_removed_releases_its_host_first() {
        let mut going = machine(
            "edge-w-a",
            "w",
            "2026-11-26T10:00:00Z",
            phase::RUNNING,
            "h-1",
        );
        going.metadata.deletion_timestamp = Some("2026-11-26T11:00:00Z".into());
        let hosts = [host("h-1", "edge-w-a")];
        let hosts: Vec<&Object> = hosts.iter().collect();
        let actions = decide(&View {
            pools: &[pool("w", 0)],
            machines: &[&going],
            hosts: &hosts,
            init_host: None,
            versions: &BTreeMap::new(),
            gone: &BTreeMap::new(),
            now: now(),
        });
        assert_eq!(
            actions,
            [Action::Release {
                machine: "edge-w-a".into(),
                host: Some("h-1".into())
            }]
        );
        let actions = decide(&View {
            pools: &[pool("w", 0)],
            machines: &[&going],
            hosts: &[],
            init_host: None,
            versions: &BTreeMap::new(),
            gone: &BTreeMap::new(),
            now: now(),
        });
        assert_eq!(
            actions,
            [Action::Release {
                machine: "edge-w-a".into(),
                host: None
            }]
        );
    }

    fn connected(name: &str, node: &str, since: Option<&str>) -> Object {
        let mut h = host(name, node);
        h.status = match since {
            None => json!({"conditions": [{"type": "Connected", "status": "True"}]}),
            Some(at) => json!({"conditions": [{"type": "Connected", "status": "False",
                                              "lastTransitionTime": at}]}),
        };
        h
    }

    fn rolling(
        name: &str,
        template: &str,
        quantity: u32,
        surge: u32,
        unavailable: u32,
    ) -> MachinePool {
        serde_json::from_value(json!({"name": name, "quantity": quantity,
            "roles": {"worker": true}, "template": template,
            "maxSurge": surge, "maxUnavailable": unavailable}))
        .unwrap()
    }

    fn of_template(name: &str, template: &str, created: &str, host: &str) -> Object {
        let mut m = machine(name, "w", created, phase::RUNNING, host);
        m.spec["template"] = json!(template);
        m
    }

    fn counts(actions: &[Action]) -> (usize, Vec<String>) {
        let created = actions
            .iter()
            .filter(|a| matches!(a, Action::Create { .. }))
            .count();
        let removed = actions
            .iter()
            .filter_map(|a| match a {
                Action::Remove { machine } => Some(machine.clone()),
                _ => None,
            })
            .collect();
        (created, removed)
    }

    #[test]
    fn a_new_template_rolls_in_within_max_surge_and_max_unavailable() {
        let old = [
            of_template("edge-w-a", "lab-v1", "2026-11-26T10:00:00Z", "h-a"),
            of_template("edge-w-b", "lab-v1", "2026-11-26T10:00:01Z", "h-b"),
            of_template("edge-w-c", "lab-v1", "2026-11-26T10:00:02Z", "h-c"),
        ];
        let hosts = [
            connected("h-a", "edge-w-a", None),
            connected("h-b", "edge-w-b", None),
            connected("h-c", "edge-w-c", None),
        ];
        let hosts: Vec<&Object> = hosts.iter().collect();
        let machines: Vec<&Object> = old.iter().collect();
        let pass = |pool: MachinePool, machines: &[&Object]| {
            counts(&decide(&View {
                pools: &[pool],
                machines,
                hosts: &hosts,
                init_host: None,
                versions: &BTreeMap::new(),
                gone: &BTreeMap::new(),
                now: now(),
            }))
        };
        // Surge 1, none unavailable: one new machine first, no old one goes yet.
        assert_eq!(
            pass(rolling("w", "lab-v2", 3, 1, 0), &machines),
            (1, vec![])
        );
        // Surge 0, one unavailable: an old one goes first (the newest), nothing is made.
        assert_eq!(
            pass(rolling("w", "lab-v2", 3, 0, 1), &machines),
            (0, vec!["edge-w-c".to_owned()])
        );
        // Mid-roll (surge 1): the new machine is made but not ready; nothing more happens.
        let fresh = {
            let mut m = of_template("edge-w-d", "lab-v2", "2026-11-26T11:00:00Z", "");
            m.status = json!({"phase": phase::BOOTSTRAPPING});
            m
        };
        let mid: Vec<&Object> = old.iter().chain([&fresh]).collect();
        assert_eq!(pass(rolling("w", "lab-v2", 3, 1, 0), &mid), (0, vec![]));
        // Once it is ready (running, its host connected), one old machine may go.
        let ready_new = of_template("edge-w-d", "lab-v2", "2026-11-26T11:00:00Z", "h-d");
        let hosts_d = [
            connected("h-a", "edge-w-a", None),
            connected("h-b", "edge-w-b", None),
            connected("h-c", "edge-w-c", None),
            connected("h-d", "edge-w-d", None),
        ];
        let hosts_d: Vec<&Object> = hosts_d.iter().collect();
        let after: Vec<&Object> = old.iter().chain([&ready_new]).collect();
        let actions = decide(&View {
            pools: &[rolling("w", "lab-v2", 3, 1, 0)],
            machines: &after,
            hosts: &hosts_d,
            init_host: None,
            versions: &BTreeMap::new(),
            gone: &BTreeMap::new(),
            now: now(),
        });
        assert_eq!(counts(&actions), (0, vec!["edge-w-c".to_owned()]));
    }

    #[test]
    fn an_etcd_member_leaves_only_one_at_a_time_and_never_below_quorum() {
        let etcd_pool: MachinePool = serde_json::from_value(json!({"name": "e", "quantity": 1,
            "roles": {"etcd": true}, "template": "lab-v1"}))
        .unwrap();
        let members = [
            machine(
                "edge-e-a",
                "e",
                "2026-11-26T10:00:00Z",
                phase::RUNNING,
                "h-a",
            ),
            machine(
                "edge-e-b",
                "e",
                "2026-11-26T10:00:01Z",
                phase::RUNNING,
                "h-b",
            ),
            machine(
                "edge-e-c",
                "e",
                "2026-11-26T10:00:02Z",
                phase::RUNNING,
                "h-c",
            ),
        ];
        let machines: Vec<&Object> = members.iter().collect();
        let removed = |hosts: &[Object]| {
            let hosts: Vec<&Object> = hosts.iter().collect();
            counts(&decide(&View {
                pools: std::slice::from_ref(&etcd_pool),
                machines: &machines,
                hosts: &hosts,
                init_host: Some("h-a"),
                versions: &BTreeMap::new(),
                gone: &BTreeMap::new(),
                now: now(),
            }))
            .1
        };
        // 3 → 1: one leaves (the newest), not two at once.
        let healthy = [
            connected("h-a", "edge-e-a", None),
            connected("h-b", "edge-e-b", None),
            connected("h-c", "edge-e-c", None),
        ];
        assert_eq!(removed(&healthy), ["edge-e-c"]);
        // With b disconnected, c leaving would leave one ready member of two (no quorum): b
        // leaves instead, which keeps both ready members.
        let one_down = [
            connected("h-a", "edge-e-a", None),
            connected("h-b", "edge-e-b", Some("2026-11-26T11:59:00Z")),
            connected("h-c", "edge-e-c", None),
        ];
        assert_eq!(removed(&one_down), ["edge-e-b"]);
        // With both others disconnected, nobody may leave.
        let two_down = [
            connected("h-a", "edge-e-a", None),
            connected("h-b", "edge-e-b", Some("2026-11-26T11:59:00Z")),
            connected("h-c", "edge-e-c", Some("2026-11-26T11:59:00Z")),
        ];
        assert!(removed(&two_down).is_empty());
        // One already leaving: the next waits for it.
        let mut leaving = members[2].clone();
        leaving.metadata.deletion_timestamp = Some("2026-11-26T11:00:00Z".into());
        let with_leaving: Vec<&Object> = vec![&members[0], &members[1], &leaving];
        let hosts: Vec<&Object> = healthy.iter().collect();
        let actions = decide(&View {
            pools: std::slice::from_ref(&etcd_pool),
            machines: &with_leaving,
            hosts: &hosts,
            init_host: Some("h-a"),
            versions: &BTreeMap::new(),
            gone: &BTreeMap::new(),
            now: now(),
        });
        assert!(counts(&actions).1.is_empty(), "{actions:?}");
    }

    #[test]
    fn a_machine_disconnected_longer_than_unhealthy_after_is_replaced() {
        let pool: MachinePool = serde_json::from_value(json!({"name": "w", "quantity": 2,
            "roles": {"worker": true}, "template": "lab-v1", "unhealthyAfter": "5m"}))
        .unwrap();
        let m = [
            machine(
                "edge-w-a",
                "w",
                "2026-11-26T10:00:00Z",
                phase::RUNNING,
                "h-a",
            ),
            machine(
                "edge-w-b",
                "w",
                "2026-11-26T10:00:01Z",
                phase::RUNNING,
                "h-b",
            ),
            // Made an hour ago and never registered.
            machine(
                "edge-w-c",
                "w",
                "2026-11-26T11:00:00Z",
                phase::BOOTSTRAPPING,
                "",
            ),
        ];
        let machines: Vec<&Object> = m[..2].iter().collect();
        let run = |hosts: &[Object], machines: &[&Object]| {
            let hosts: Vec<&Object> = hosts.iter().collect();
            decide(&View {
                pools: std::slice::from_ref(&pool),
                machines,
                hosts: &hosts,
                init_host: None,
                versions: &BTreeMap::new(),
                gone: &BTreeMap::new(),
                now: now(),
            })
        };
        // Disconnected 4 minutes: not yet.
        let recent = [
            connected("h-a", "edge-w-a", None),
            connected("h-b", "edge-w-b", Some("2026-11-26T11:56:00Z")),
        ];
        assert!(
            run(&recent, &machines)
                .iter()
                .all(|a| !matches!(a, Action::Replace { .. }))
        );
        // Disconnected 6 minutes: replaced, and a new machine made in the same pass.
        let long = [
            connected("h-a", "edge-w-a", None),
            connected("h-b", "edge-w-b", Some("2026-11-26T11:54:00Z")),
        ];
        let actions = run(&long, &machines);
        assert!(
            matches!(&actions[0], Action::Replace { machine, why }
                if machine == "edge-w-b" && why.contains("h-b has been disconnected")),
            "{actions:?}"
        );
        assert_eq!(counts(&actions).0, 1);
        // A machine whose host never registered within the limit is replaced too.
        let never: Vec<&Object> = vec![&m[0], &m[2]];
        let actions = run(&recent[..1], &never);
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Replace { machine, why }
                if machine == "edge-w-c" && why.contains("no host registered"))),
            "{actions:?}"
        );
    }
}
