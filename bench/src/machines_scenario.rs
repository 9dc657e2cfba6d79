//! Scenario `machines`: the machine controller making and destroying N EC2 machines against
//! `moto`'s server (EC2's Query API over TLS, signatures checked), beside a floor measured in
//! the same run: the `amazonec2` driver alone making and destroying N instances one after
//! another, as the controller does.
//!
//! The hub runs as its own process (its CPU read from `/proc`). moto's instances are records,
//! so this process "boots" each one as far as the hub can tell: it reads the instance's user
//! data and starts an in-process system-agent with its registration token and node name (no
//! distribution is installed: the pool has workers only, and a machine is `Running` once its
//! host has registered). Two times, then: to every instance made (the controller's own work,
//! set against the driver alone) and to every machine `Running`. EC2 calls are counted from
//! moto's request log.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use drivers::{CreateRequest, Driver, ec2::NAME_TAG};
use serde_json::{Value, json};
use tests::cloud::Moto;

use crate::{
    health_scenario::{cpu_seconds, prepare, round, start_hub_on},
    proxy_scenario::Target,
};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Machines in the pool.
    #[arg(long, default_value_t = 10)]
    machines: u32,
}

/// Requests moto has answered so far (its request log, one line each).
fn moto_requests(dir: &Path) -> anyhow::Result<usize> {
    let log = std::fs::read_to_string(dir.join("moto.log"))?;
    Ok(log.lines().filter(|l| l.contains("\"POST /")).count())
}

/// The value after `flag` in a host command, as the hub quotes it (`--token 'drr_…'`).
fn flag_value(command: &str, flag: &str) -> Option<String> {
    let start = command.find(&format!("{flag} '"))? + flag.len() + 2;
    let end = command[start..].find('\'')? + start;
    Some(command[start..end].to_owned())
}

/// Boots moto's instances as registering system-agents (in this process) while `watching`
/// (moto's log counts every request, the bench's own too: none are made outside the window of
/// the boots), keeping them running until `stop`.
fn boot_instances(
    moto: std::sync::Arc<Moto>,
    dir: std::path::PathBuf,
    watching: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: tokio_util::sync::CancellationToken,
) {
    tokio::spawn(async move {
        let ec2 = moto.ec2();
        let mut booted = std::collections::BTreeSet::new();
        let mut agents = Vec::new();
        while !stop.is_cancelled() {
            if !watching.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            for instance in moto.instances().await {
                if !instance.live()
                    || !instance.tags.contains_key(NAME_TAG)
                    || booted.contains(&instance.id)
                {
                    continue;
                }
                let Ok(answer) = ec2
                    .call(
                        "DescribeInstanceAttribute",
                        &[
                            ("InstanceId".to_owned(), instance.id.clone()),
                            ("Attribute".to_owned(), "userData".to_owned()),
                        ],
                    )
                    .await
                else {
                    continue;
                };
                let encoded = answer
                    .descendant("userData")
                    .map(|u| u.text_of("value").to_owned());
                let Some(command) = encoded
                    .and_then(|e| {
                        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, e.trim())
                            .ok()
                    })
                    .and_then(|b| String::from_utf8(b).ok())
                else {
                    continue;
                };
                let (Some(server), Some(token), Some(checksum), Some(node)) = (
                    flag_value(&command, "--server"),
                    flag_value(&command, "--token"),
                    flag_value(&command, "--ca-checksum"),
                    flag_value(&command, "--node-name"),
                ) else {
                    continue;
                };
                booted.insert(instance.id.clone());
                let state = dir.join(&node);
                let config = system_agent::Config {
                    hub: Some(system_agent::HubSettings {
                        server,
                        token: tunnel::Secret::new(token),
                        ca_checksum: checksum,
                        state_dir: state.clone(),
                        local_address: None,
                        proxy: Default::default(),
                    }),
                    dir: state,
                    host: system_agent::HostSpec {
                        roles: system_agent::Roles {
                            worker: true,
                            ..system_agent::Roles::default()
                        },
                        node_name: node,
                        ..system_agent::HostSpec::default()
                    },
                    local_plans: None,
                    root: system_agent::Root::default(),
                    retry: system_agent::Retry::default(),
                    machine: None,
                };
                if let Ok(agent) = system_agent::Agent::start(config, stop.child_token()).await {
                    agents.push(agent);
                }
            }
            // Once a second: moto answers DescribeInstances slower the more instances it holds,
            // and polling it hard slowed the hub's own requests (N = 100 did not finish).
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        drop(agents);
    });
}

async fn until_true<F: AsyncFn() -> anyhow::Result<bool>>(
    what: &str,
    within: Duration,
    check: F,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while !check().await? {
        anyhow::ensure!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let n = args.machines as usize;
    let exe = tests::binary("drover-hub");
    let data = std::env::temp_dir().join(format!("drover-bench-machines-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data)?;
    let moto = std::sync::Arc::new(Moto::start(&data).await);

    // The floor: the driver alone, one instance after another.
    let driver = moto.driver(moto.credentials.clone());
    let tags = BTreeMap::new();
    let names: Vec<String> = (0..n).map(|i| format!("floor-{i}")).collect();
    let calls_before = moto_requests(&data)?;
    let started = Instant::now();
    let mut made = Vec::new();
    for name in &names {
        let request = CreateRequest {
            name,
            tags: &tags,
            user_data: "#!/bin/sh\ntrue\n",
            client_token: "",
        };
        made.push(driver.create(&request).await?.id);
    }
    let floor_create_s = started.elapsed().as_secs_f64();
    let floor_create_calls = moto_requests(&data)? - calls_before;
    let calls_before = moto_requests(&data)?;
    let started = Instant::now();
    for id in &made {
        driver.delete(id).await?;
    }
    let floor_delete_s = started.elapsed().as_secs_f64();
    let floor_delete_calls = moto_requests(&data)? - calls_before;

    // The controller: a pool of N, then of 0.
    let prepared = prepare(&data.join("hub")).await?;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let (hub, _url) = start_hub_on(&exe, &data.join("hub"), "10", addr).await?;
    let pid = hub.id().context("hub pid")?;
    let api = Target {
        addr,
        token: prepared.api_token.clone(),
    };
    api.call(
        "POST",
        "/v1/cloudcredentials",
        Some(json!({"metadata": {"name": "aws"},
                    "spec": {"driver": "amazonec2",
                             "amazonec2": {"accessKeyId": moto.credentials.access_key_id,
                                           "secretAccessKey": moto.credentials.secret_access_key}}})),
        201,
    )
    .await?;
    api.call(
        "POST",
        "/v1/machinetemplates",
        Some(json!({"metadata": {"name": "cloud"},
                    "spec": {"driver": "amazonec2", "credential": "aws",
                             "amazonec2": {"region": "us-east-1", "endpoint": moto.endpoint,
                                           "endpointCA": moto.ca_pem, "ami": moto.ami,
                                           "instanceType": "t3.small", "subnetId": moto.subnet_id}}})),
        201,
    )
    .await?;
    let pool = |quantity: usize| {
        json!({"spec": {"machinePools": [{"name": "workers", "quantity": quantity,
                "template": "cloud", "roles": {"worker": true}}]}})
    };
    api.call(
        "POST",
        "/v1/clusters",
        Some(json!({"metadata": {"name": "pool"},
                    "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1"}})),
        201,
    )
    .await?;
    let machines = async || -> anyhow::Result<Vec<Value>> {
        let list = api.call("GET", "/v1/machines", None, 200).await?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let booting = tokio_util::sync::CancellationToken::new();
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    boot_instances(
        moto.clone(),
        data.join("agents"),
        watching.clone(),
        booting.clone(),
    );
    let (cpu_before, calls_before) = (cpu_seconds(pid)?, moto_requests(&data)?);
    let started = Instant::now();
    api.call("PATCH", "/v1/clusters/pool", Some(pool(n)), 200)
        .await?;
    until_true("N machines made", Duration::from_secs(900), async || {
        let all = machines().await?;
        Ok(all.len() == n
            && all.iter().all(|m| {
                m["status"]["providerId"]
                    .as_str()
                    .is_some_and(|p| !p.is_empty())
            }))
    })
    .await?;
    let create_s = started.elapsed().as_secs_f64();
    let create_cpu = cpu_seconds(pid)? - cpu_before;
    let create_calls = moto_requests(&data)? - calls_before;
    watching.store(true, std::sync::atomic::Ordering::Relaxed);
    until_true("N machines running", Duration::from_secs(900), async || {
        let all = machines().await?;
        Ok(all.len() == n && all.iter().all(|m| m["status"]["phase"] == "Running"))
    })
    .await?;
    let running_s = started.elapsed().as_secs_f64();
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let instances = moto
        .instances()
        .await
        .into_iter()
        .filter(|i| i.live() && i.tags.contains_key(NAME_TAG))
        .count();
    anyhow::ensure!(instances == n, "{instances} instances for {n} machines");

    let (cpu_before, calls_before) = (cpu_seconds(pid)?, moto_requests(&data)?);
    let started = Instant::now();
    api.call("PATCH", "/v1/clusters/pool", Some(pool(0)), 200)
        .await?;
    until_true("every machine gone", Duration::from_secs(900), async || {
        Ok(machines().await?.is_empty())
    })
    .await?;
    let delete_s = started.elapsed().as_secs_f64();
    let delete_cpu = cpu_seconds(pid)? - cpu_before;
    let delete_calls = moto_requests(&data)? - calls_before;
    let left = moto
        .instances()
        .await
        .into_iter()
        .filter(|i| i.live())
        .count();
    anyhow::ensure!(left == 0, "{left} instances left running");
    booting.cancel();
    drop(hub);
    let _ = std::fs::remove_dir_all(&data);
    let per = |x: f64| round(x / n as f64, 2);
    Ok(json!({
        "scenario": "machines",
        "machines": n,
        "what": "a pool of N EC2 machines made (create_s), registered (running_s: each instance's user data read and an in-process system-agent registered with it, no distribution installed), then scaled to 0 (delete_s), by the hub's machine controller against moto's EC2 server, beside the amazonec2 driver alone making and destroying N instances one after another (the floor; overhead = the controller's time to every instance made less the floor's, per machine)",
        "floor_driver_alone": {
            "create_s": round(floor_create_s, 2),
            "delete_s": round(floor_delete_s, 2),
            "ec2_calls_per_create": per(floor_create_calls as f64),
            "ec2_calls_per_delete": per(floor_delete_calls as f64),
        },
        "controller": {
            "create_s": round(create_s, 2),
            "running_s": round(running_s, 2),
            "delete_s": round(delete_s, 2),
            "create_vs_floor": round(create_s / floor_create_s, 2),
            "overhead_ms_per_machine": round((create_s - floor_create_s) * 1000.0 / n as f64, 1),
            "delete_vs_floor": round(delete_s / floor_delete_s, 2),
            "ec2_calls_per_create": per(create_calls as f64),
            "ec2_calls_per_delete": per(delete_calls as f64),
            "hub_cpu_ms_per_create": per(create_cpu * 1000.0),
            "hub_cpu_ms_per_delete": per(delete_cpu * 1000.0),
        },
    }))
}
