//! The machine controller's decisions for one cluster, apart from their effects: from its pools,
//! machines and hosts, which machines to make, which to remove, and the next step of each.
//! Nothing here reads or writes the store or calls a machine.

use serde_json::Value;

use crate::{
    model::{MachinePool, Status, phase},
    store::Object,
};

/// What one pass asks for, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// A new Machine object for `pool` (from its template), before anything is made for it.
    Create { pool: String, template: String },
    /// Remove `machine` (scale down, a pool gone): its host is uninstalled, then it goes.
    Remove { machine: String },
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

/// What the controller read about one cluster.
pub(crate) struct View<'a> {
    pub pools: &'a [MachinePool],
    /// The cluster's machines, oldest first.
    pub machines: &'a [&'a Object],
    /// The cluster's hosts.
    pub hosts: &'a [&'a Object],
    /// The host that initialised the cluster (its etcd's first member).
    pub init_host: Option<&'a str>,
}

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

pub(crate) fn decide(view: &View<'_>) -> Vec<Action> {
    let mut actions = Vec::new();
    let (deleting, live): (Vec<&Object>, Vec<&Object>) = view
        .machines
        .iter()
        .copied()
        .partition(|m| m.metadata.deletion_timestamp.is_some());
    let mut removing: Vec<String> = Vec::new();
    // Pools: as many live machines as asked; machines of pools that are gone go.
    for machine in &live {
        if !view.pools.iter().any(|p| p.name == text(machine, "/pool")) {
            removing.push(machine.metadata.name.clone());
        }
    }
    for pool in view.pools {
        let mine: Vec<&Object> = live
            .iter()
            .copied()
            .filter(|m| text(m, "/pool") == pool.name)
            .collect();
        let want = pool.quantity as usize;
        for _ in mine.len()..want {
            actions.push(Action::Create {
                pool: pool.name.clone(),
                template: pool.template.clone(),
            });
        }
        if mine.len() > want {
            // Newest first; the machine that initialised the cluster last of all, as its etcd
            // holds the cluster's first member.
            let mut order: Vec<&Object> = mine.clone();
            order.sort_by(|a, b| {
                let init = |m: &Object| {
                    host_of(m, view.hosts)
                        .is_some_and(|h| Some(h.metadata.name.as_str()) == view.init_host)
                };
                (init(a), &b.metadata.creation_timestamp, &b.metadata.name).cmp(&(
                    init(b),
                    &a.metadata.creation_timestamp,
                    &a.metadata.name,
                ))
            });
            removing.extend(
                order
                    .into_iter()
                    .take(mine.len() - want)
                    .map(|m| m.metadata.name.clone()),
            );
        }
    }
    for name in &removing {
        actions.push(Action::Remove {
            machine: name.clone(),
        });
    }
    for machine in &live {
        let name = machine.metadata.name.clone();
        if removing.contains(&name) {
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

    fn host(name: &str, node: &str) -> Object {
        Object::new("Host", name, json!({"cluster": "edge", "nodeName": node}))
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
        });
        assert_eq!(
            actions,
            [Action::Release {
                machine: "edge-w-a".into(),
                host: None
            }]
        );
    }
}
