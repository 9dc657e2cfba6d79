use serde_json::json;
use tunnel::Peer;

use super::*;
use crate::{
    model::Status,
    store::{Object, before_writes::BeforeWrites, sqlite::SqliteStore},
};

/// A store with cluster `c` and host `h-one` of it, in a temp directory removed on drop.
struct Fixture {
    health: Arc<Health>,
    dir: std::path::PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn fixture(interval: Duration) -> Fixture {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("drover-health-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("state.db")).unwrap());
    store
        .create(Object::new("Cluster", "c", json!({"type": "custom"})))
        .await
        .unwrap();
    store
        .create(Object::new("Host", "h-one", json!({"cluster": "c"})))
        .await
        .unwrap();
    let charts = Charts::open(&dir.join(charts::FILE)).unwrap();
    Fixture {
        health: Arc::new(Health::with_charts(store, interval, charts)),
        dir,
    }
}

#[tokio::test]
async fn a_stopping_hub_writes_its_charts_minutes_for_the_next() {
    let f = fixture(Duration::from_secs(10)).await;
    let minute = u32::try_from(unix_now() / 60 - 1).unwrap();
    let kept = history::Kept::of(&history::Point {
        minute,
        cpu_percent: 42.0,
        memory_used_bytes: 0,
        disk_used_bytes: 0,
        load1: 0.0,
        net_rx_rate: 0.0,
        net_tx_rate: 0.0,
    });
    // Closed just now: the next flush is seconds away when the hub stops.
    f.health.charts.keep("host/h-one", kept);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(f.health.clone().run(shutdown.clone()));
    shutdown.cancel();
    running.await.unwrap();
    let next = Charts::open(&f.dir.join(charts::FILE)).unwrap();
    let points = next.points("host/h-one", unix_now());
    assert_eq!(points.len(), 1, "{points:?}");
    assert_eq!(points[0].cpu_percent, 42.0);
}

fn session(id: u64, kind: &str, peer: &str) -> SessionInfo {
    SessionInfo {
        id,
        peer: Peer {
            id: peer.into(),
            kind: kind.into(),
        },
        credential: None,
        remote_addr: None,
        connected_at: SystemTime::now(),
    }
}

fn beat_with_facts() -> Heartbeat {
    Heartbeat {
        seq: 1,
        facts: Some(HostFacts {
            hostname: "one".into(),
            cpus: 4,
            memory_bytes: 8 << 30,
            ..HostFacts::default()
        }),
        usage: Some(Usage {
            cpu_percent: 12.5,
            memory_used_bytes: 1 << 30,
            memory_total_bytes: 8 << 30,
            ..Usage::default()
        }),
    }
}

fn connected_condition(object: &Object) -> (String, String) {
    let status = Status::of(object);
    let c = status
        .conditions
        .iter()
        .find(|c| c.kind == "Connected")
        .unwrap();
    (c.status.clone(), c.reason.clone())
}

#[tokio::test]
async fn a_host_that_stops_beating_is_disconnected_until_it_beats_again() {
    let f = fixture(Duration::from_millis(50)).await;
    let info = session(7, identity::SYSTEM_AGENT, "host/h-one");
    f.health.connected(&info).await;
    let before = Instant::now();
    let reply = f.health.beat(&info, beat_with_facts()).await;
    let after = Instant::now();
    assert_eq!(reply.interval_millis, 50);
    assert!(!reply.send_facts);
    // The facts reach the Host; the usage starts its chart.
    let host = f.health.store().get("Host", "h-one").await.unwrap();
    assert_eq!(host.status["facts"]["cpus"], 4);
    let usage = f.health.usage("host/h-one").await.unwrap();
    assert_eq!(usage["points"].as_array().unwrap().len(), 1);
    assert_eq!(usage["state"], "active");

    // Checked as of later instants: three beats' time (150 ms) after the beat is the limit.
    assert!(
        f.health
            .check_at(before + Duration::from_millis(140))
            .await
            .is_empty(),
        "marked before it missed"
    );
    let missed = after + Duration::from_millis(200);
    assert_eq!(
        f.health.check_at(missed).await,
        vec!["host/h-one".to_owned()]
    );
    // Marked once, not on every check.
    assert!(f.health.check_at(missed).await.is_empty());
    let host = f.health.store().get("Host", "h-one").await.unwrap();
    assert_eq!(
        connected_condition(&host),
        ("False".into(), "HeartbeatsMissed".into())
    );
    assert_eq!(
        crate::model::derive_state(Kind::Host, &host.metadata, &Status::of(&host), &host.spec)
            .state,
        "disconnected"
    );
    assert_eq!(
        f.health.usage("host/h-one").await.unwrap()["state"],
        "disconnected"
    );

    f.health.beat(&info, Heartbeat::default()).await;
    let host = f.health.store().get("Host", "h-one").await.unwrap();
    assert_eq!(connected_condition(&host).0, "True");
    let reasons: Vec<&str> = f
        .health
        .events
        .query(0, |e| e.host == "h-one")
        .iter()
        .map(|e| e.reason)
        .collect();
    assert_eq!(
        reasons,
        ["AgentConnected", "HeartbeatsMissed", "HeartbeatsResumed"]
    );
}

#[tokio::test]
async fn a_restarted_hub_takes_a_hosts_facts_from_its_host_and_writes_only_new_ones() {
    let f = fixture(Duration::from_secs(10)).await;
    let first = session(1, identity::SYSTEM_AGENT, "host/h-one");
    f.health.connected(&first).await;
    let mut facts = beat_with_facts();
    if let Some(sent) = facts.facts.as_mut() {
        sent.os = "Debian GNU/Linux 13 (trixie)".into();
        sent.boot_time = 1_764_000_000;
        sent.disks = vec![proto::health::v1::Disk {
            mount_point: "/".into(),
            file_system: "ext4".into(),
            total_bytes: 64 << 30,
        }];
        sent.agent_version = "0.1.0".into();
    }
    f.health.beat(&first, facts.clone()).await;

    // The hub restarts on the same store; the agent's first beat on its new session brings
    // its facts again, as every first beat does. The store counts the transactions asked of
    // it (a write that changes nothing is still one: its object is read and compared under
    // the store's write lock).
    let transactions = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = transactions.clone();
    let store: Arc<dyn Store> =
        Arc::new(BeforeWrites::new(f.health.store().clone(), move |_, _| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }));
    let restarted = Health::new(store.clone(), Duration::from_secs(10));
    let again = session(2, identity::SYSTEM_AGENT, "host/h-one");
    restarted.connected(&again).await;
    let reply = restarted.beat(&again, facts.clone()).await;
    assert!(!reply.send_facts);
    let transactions = || transactions.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(transactions(), 0, "the same facts written again");
    let shown = restarted.usage("host/h-one").await.unwrap();
    assert_eq!(
        shown["facts"],
        views::facts_json(facts.facts.as_ref().unwrap())
    );

    // Facts that changed while the hub was away are written.
    let mut changed = facts;
    if let Some(sent) = changed.facts.as_mut() {
        sent.kernel = "6.12.48".into();
    }
    let third = session(3, identity::SYSTEM_AGENT, "host/h-one");
    let other = Health::new(store.clone(), Duration::from_secs(10));
    other.beat(&third, changed).await;
    assert_eq!(transactions(), 1);
    let host = store.get("Host", "h-one").await.unwrap();
    assert_eq!(host.status["facts"]["kernel"], "6.12.48");
    assert_eq!(host.status["facts"]["disks"][0]["fileSystem"], "ext4");
}

#[tokio::test]
async fn a_hub_without_facts_asks_for_them() {
    let f = fixture(Duration::from_secs(10)).await;
    let info = session(1, identity::NODE_AGENT, "node/c/n1");
    let reply = f
        .health
        .beat(
            &info,
            Heartbeat {
                seq: 9,
                facts: None,
                usage: Some(Usage::default()),
            },
        )
        .await;
    assert!(reply.send_facts);
    // A cluster-agent speaks for no machine: nothing to ask.
    let agent = session(2, identity::CLUSTER_AGENT, "cluster/c/pod");
    assert!(!f.health.beat(&agent, Heartbeat::default()).await.send_facts);
}

#[tokio::test]
async fn node_agents_show_as_their_clusters_nodes() {
    let f = fixture(Duration::from_secs(10)).await;
    for (id, node) in [(1, "n2"), (2, "n1")] {
        let info = session(id, identity::NODE_AGENT, &format!("node/c/{node}"));
        f.health.connected(&info).await;
        f.health.beat(&info, beat_with_facts()).await;
    }
    let other = session(3, identity::NODE_AGENT, "node/other/n9");
    f.health.connected(&other).await;
    let nodes = f.health.nodes("c");
    let names: Vec<&str> = nodes.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["n1", "n2"]);
    assert_eq!(nodes[0]["facts"]["memoryBytes"], 8u64 << 30);
    assert_eq!(nodes[0]["usage"]["cpuPercent"], 12.5);

    f.health.disconnected(
        &session(2, identity::NODE_AGENT, "node/c/n1"),
        "read: connection reset",
        false,
    );
    let n1 = f.health.usage("node/c/n1").await.unwrap();
    assert_eq!(n1["state"], "disconnected");
    assert!(
        n1["message"].as_str().unwrap().contains("connection reset"),
        "{n1}"
    );
    // An old session ending does not mark a node whose agent has reconnected.
    let again = session(4, identity::NODE_AGENT, "node/c/n2");
    f.health.connected(&again).await;
    f.health.disconnected(
        &session(1, identity::NODE_AGENT, "node/c/n2"),
        "replaced",
        false,
    );
    assert_eq!(
        f.health.usage("node/c/n2").await.unwrap()["state"],
        "active"
    );
    let states = f.health.agent_states();
    assert!(
        states.contains(&((identity::NODE_AGENT.into(), "active"), 2)),
        "{states:?}"
    );
    assert!(
        states.contains(&((identity::NODE_AGENT.into(), "disconnected"), 1)),
        "{states:?}"
    );
}

#[tokio::test]
async fn state_changes_and_plan_outcomes_become_events() {
    let f = fixture(Duration::from_secs(10)).await;
    let health = f.health.clone();
    let shutdown = CancellationToken::new();
    tokio::spawn(health.clone().run(shutdown.clone()));
    let store = f.health.store().clone();
    // The events follow the store (the current objects are taken in as they are).
    f.health.following().await;
    model::set_condition(
        store.as_ref(),
        Kind::Host,
        "h-one",
        "Connected",
        false,
        "Disconnected",
        "system-agent disconnected: gone",
    )
    .await
    .unwrap();
    let plan = Object::new(
        "Plan",
        "h-one",
        json!({"host": "h-one", "cluster": "c", "plan": {}}),
    );
    store.create(plan).await.unwrap();
    let mut object = store.get("Plan", "h-one").await.unwrap();
    object.status = json!({
        "appliedChecksum": "0123456789abcdef",
        "conditions": [{"type": "Provisioned", "status": "True", "reason": "Applied"}],
    });
    store.update(object).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let reasons = loop {
        let reasons: Vec<(&str, String)> = f
            .health
            .events
            .query(0, |e| e.cluster == "c")
            .into_iter()
            .map(|e| (e.reason, e.message))
            .collect();
        if reasons.len() >= 2 || Instant::now() > deadline {
            break reasons;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    shutdown.cancel();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert_eq!(reasons[0].0, "StateChanged");
    assert!(
        reasons[0]
            .1
            .contains("Host h-one is disconnected (was pending)"),
        "{reasons:?}"
    );
    assert_eq!(reasons[1].0, "PlanApplied");
    assert!(reasons[1].1.contains("0123456789ab"), "{reasons:?}");
}

#[tokio::test]
async fn a_beat_sent_as_a_message_is_answered_at_once_and_its_answer_is_empty_unless_it_changed() {
    use proto::session::v1::{HubMessage, hub_message::Body};
    let f = fixture(Duration::from_millis(50)).await;
    let messenger = tunnel::Messenger::detached();
    let reply_in = |message: HubMessage| match message.body {
        Some(Body::BeatReply(reply)) => reply,
        other => panic!("not a beat reply: {other:?}"),
    };
    let empty = Some(HubMessage { body: None });

    // An agent the hub has not met: its Host is read first, so the answer comes later.
    let first = session(7, identity::SYSTEM_AGENT, "host/h-one");
    let now = f.health.beat_message(&first, beat_with_facts(), &messenger);
    assert!(now.is_none());
    let sent = loop {
        let sent = messenger.take_sent();
        if !sent.is_empty() {
            break sent;
        }
        tokio::task::yield_now().await;
    };
    let reply = reply_in(HubMessage::decode(sent[0].as_slice()).unwrap());
    assert_eq!((reply.interval_millis, reply.send_facts), (50, false));
    let host = f.health.store().get("Host", "h-one").await.unwrap();
    assert_eq!(host.status["facts"]["cpus"], 4);

    // The next beat of the same session: answered at once, and with nothing new, empty.
    let usage_only = Heartbeat {
        seq: 2,
        facts: None,
        usage: beat_with_facts().usage,
    };
    let now = f
        .health
        .beat_message(&first, usage_only.clone(), &messenger);
    assert_eq!(now, empty);
    assert_eq!(
        f.health.usage("host/h-one").await.unwrap()["state"],
        "active"
    );

    // A new session of the same agent is told the interval again.
    let second = session(8, identity::SYSTEM_AGENT, "host/h-one");
    let reply = reply_in(
        f.health
            .beat_message(&second, usage_only.clone(), &messenger)
            .unwrap(),
    );
    assert_eq!(reply.interval_millis, 50);

    // A node-agent the hub has no facts for is asked for them on every beat until it sends them.
    let node = session(9, identity::NODE_AGENT, "node/c/n1");
    f.health.connected(&node).await;
    let reply = reply_in(
        f.health
            .beat_message(&node, usage_only.clone(), &messenger)
            .unwrap(),
    );
    assert!(reply.send_facts);
    let reply = reply_in(
        f.health
            .beat_message(&node, usage_only.clone(), &messenger)
            .unwrap(),
    );
    assert!(reply.send_facts, "asked again");
    let now = f.health.beat_message(&node, beat_with_facts(), &messenger);
    assert_eq!(now, empty, "facts taken: nothing new to say");
    assert!(messenger.take_sent().is_empty());
}
