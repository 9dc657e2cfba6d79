//! Machine drivers against the real things. The `ssh` driver (docker-machine's "generic"):
//! OpenSSH's client to a real `sshd` (Debian's openssh-server) in a network-namespace host, key
//! authentication only: a command runs and its host key is recorded at first contact; from then
//! on only that key is accepted, so a rebuilt machine (new host key) is refused, not trusted; a
//! key the machine does not authorise and a machine not listening fail with errors that say so.
//! Needs root (CI runs as root); skipped, saying so, otherwise.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use drivers::{
    CreateRequest, Driver, DriverError,
    ec2::NAME_TAG,
    ssh::{PrivateKey, SshError, Target, run},
};
use serde_json::{Value, json};
use tests::{
    api, api_text,
    cloud::{Hypervisor, Instance, Moto},
    hosts::{Host, Network, Site, cluster, skip_without_root},
    hub_cli,
    imported::kubectl_ok,
    sshd::{KeyPair, Sshd},
    temp_dir, until,
};

const VERSION: &str = "v1.33.4+k3s1";

const TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn ssh_runs_commands_with_the_host_key_pinned_and_refuses_a_changed_one() {
    if skip_without_root("sshd in a network namespace needs root") {
        return;
    }
    let dir = temp_dir("machines-ssh");
    let _net = Network::new(1);
    let host = Host::new(&dir, 1);
    let client = KeyPair::new(&dir, "client");
    let mut sshd = Sshd::start(&host, &client);
    let target = Target {
        address: sshd.address.clone(),
        port: 22,
        user: "root".into(),
    };
    let key = PrivateKey::new(client.private.clone());

    // First contact: the command runs (in the host's own network namespace), its input and
    // exit code come back, and the key the machine presented is recorded.
    let first = run(
        &target,
        &key,
        None,
        "read line; echo \"got $line\"; ip -4 -o addr show | grep -c 10.213.0.11; exit 3",
        b"hello\n",
        TIMEOUT,
    )
    .await
    .unwrap();
    assert_eq!(first.stdout, "got hello\n1\n");
    assert_eq!(first.exit_code, 3);
    assert_eq!(first.host_key, sshd.recorded_key());

    // Pinned: the same key is accepted.
    let again = run(
        &target,
        &key,
        Some(&first.host_key),
        "echo ok",
        b"",
        TIMEOUT,
    )
    .await
    .unwrap();
    assert_eq!((again.stdout.as_str(), again.exit_code), ("ok\n", 0));

    // A key the machine does not authorise.
    let stranger = PrivateKey::new(KeyPair::new(&dir, "stranger").private);
    let refused = run(
        &target,
        &stranger,
        Some(&first.host_key),
        "echo no",
        b"",
        TIMEOUT,
    )
    .await;
    assert_eq!(refused, Err(SshError::AuthRefused(target.address.clone())));

    // The machine comes back with another host key: refused, nothing run.
    sshd.rebuild(&host);
    assert_ne!(sshd.recorded_key(), first.host_key);
    let changed = run(
        &target,
        &key,
        Some(&first.host_key),
        "touch /tmp/ran",
        b"",
        TIMEOUT,
    )
    .await;
    assert!(
        matches!(&changed, Err(SshError::HostKeyChanged { .. })),
        "{changed:?}"
    );
    assert!(
        changed
            .unwrap_err()
            .to_string()
            .contains("not the one recorded")
    );

    // Nothing listening.
    sshd.stop();
    let down = run(&target, &key, Some(&first.host_key), "true", b"", TIMEOUT).await;
    assert!(
        matches!(&down, Err(SshError::Unreachable(_, why)) if why.contains("refused")),
        "{down:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where each host's install root is mounted in its own mount namespace: the template's
/// install flags name one path for every machine.
const HOST_ROOT: &str = "/run/drover-host-root";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_ssh_machines_becomes_a_cluster_and_scales_down() {
    if skip_without_root("provisioning in network namespaces needs root") {
        return;
    }
    let dir = temp_dir("machines-pool");
    let _net = Network::new(2);
    std::fs::create_dir_all(HOST_ROOT).unwrap();
    let client = KeyPair::new(&dir, "client");
    let hosts: Vec<Host> = (1..=2).map(|i| Host::new(&dir, i)).collect();
    let sshds: Vec<Sshd> = hosts
        .iter()
        .map(|h| {
            Sshd::start_after(
                h,
                &client,
                &format!("mount --bind {}/root {HOST_ROOT}", h.dir.display()),
            )
        })
        .collect();
    let pools = |workers: u32| {
        json!({"machinePools": [
            {"name": "main", "quantity": 1, "template": "lab",
             "roles": {"etcd": true, "controlPlane": true, "worker": true}},
            {"name": "workers", "quantity": workers, "template": "lab",
             "roles": {"worker": true}, "labels": {"tier": "batch"}},
        ]})
    };
    let site = Site::start(&dir, &[VERSION], pools(1), &[]).await;
    let (hub, admin) = (&site.hub, site.admin.as_str());
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/cloudcredentials",
        Some(admin),
        Some(json!({"metadata": {"name": "lab-key"},
                    "spec": {"driver": "ssh", "ssh": {"privateKey": client.private}}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/machinetemplates",
        Some(admin),
        Some(json!({"metadata": {"name": "lab"},
                    "spec": {"driver": "ssh", "credential": "lab-key",
                             "ssh": {"addresses": [sshds[0].address, sshds[1].address],
                                     "installFlags": ["--no-systemd", "--root", HOST_ROOT]}}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");

    // Both machines made, bootstrapped over SSH, registered and provisioned.
    let machines = async || -> Vec<Value> {
        api(hub.addr, "GET", "/v1/machines", Some(admin), None)
            .await
            .1["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let started = Instant::now();
    until(
        "two machines running in an active cluster",
        Duration::from_secs(240),
        async || {
            let all = machines().await;
            let c = cluster(hub, admin).await;
            all.len() == 2
                && all.iter().all(|m| m["status"]["phase"] == "Running")
                && c["state"]["state"] == "active"
                && c["status"]["hosts"] == json!({"ready": 2, "total": 2})
        },
    )
    .await;
    eprintln!("2 machines running in {:?}", started.elapsed());
    let all = machines().await;
    for sshd in &sshds {
        let m = all
            .iter()
            .find(|m| m["status"]["addresses"][0] == sshd.address.as_str())
            .unwrap_or_else(|| panic!("no machine at {}: {all:#?}", sshd.address));
        // The key the machine presented at first contact is the one kept.
        assert_eq!(m["status"]["hostKey"], sshd.recorded_key().as_str());
        assert_eq!(
            m["status"]["providerId"],
            format!("ssh://root@{}:22", sshd.address).as_str()
        );
        let (_, host) = api(
            hub.addr,
            "GET",
            &format!("/v1/hosts/{}", m["status"]["host"].as_str().unwrap()),
            Some(admin),
            None,
        )
        .await;
        assert_eq!(host["spec"]["nodeName"], m["metadata"]["name"]);
    }
    // Each bootstrap had a registration token of its own, short-lived (the only ones that
    // expire), deleted once its host registered.
    assert!(
        all.iter()
            .all(|m| m["status"]["registrationToken"].is_null()),
        "{all:#?}"
    );
    let (_, tokens) = api(hub.addr, "GET", "/v1/registrationtokens", Some(admin), None).await;
    let lingering: Vec<&Value> = tokens["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| !t["spec"]["expiresAt"].is_null())
        .collect();
    assert!(lingering.is_empty(), "{lingering:#?}");
    let worker = all
        .iter()
        .find(|m| m["spec"]["pool"] == "workers")
        .unwrap()
        .clone();
    let (_, worker_host) = api(
        hub.addr,
        "GET",
        &format!("/v1/hosts/{}", worker["status"]["host"].as_str().unwrap()),
        Some(admin),
        None,
    )
    .await;
    assert_eq!(
        worker_host["spec"]["roles"],
        json!({"etcd": false, "controlPlane": false, "worker": true})
    );
    assert_eq!(worker_host["spec"]["nodeLabels"]["tier"], "batch");
    // kubectl through the hub sees both nodes, named after the machines.
    let (code, kubeconfig) = api_text(
        hub.addr,
        "POST",
        "/v1/clusters/edge/kubeconfig",
        Some(admin),
    )
    .await;
    assert_eq!(code, 201, "{kubeconfig}");
    let path = dir.join("edge.kubeconfig");
    std::fs::write(&path, kubeconfig).unwrap();
    let mut nodes: Vec<String> = kubectl_ok(&path, &["get", "nodes", "-o", "name"])
        .await
        .lines()
        .map(|l| l.trim_start_matches("node/").to_owned())
        .collect();
    nodes.sort();
    let mut names: Vec<String> = all
        .iter()
        .map(|m| m["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    assert_eq!(nodes, names);

    // Scale the workers to 0: the worker's host is uninstalled, its machine goes, its address
    // is free again.
    // ... with the CLI, as an operator would; it lists the machines as they are.
    let config = dir.join("cli.json");
    let login = hub_cli(
        &config,
        &[
            "login",
            "--server",
            &site.hub_url,
            "--password-stdin",
            "--ca-checksum",
            &hub.ca_checksum,
        ],
        &format!("{}\n", site.admin_password),
    );
    assert_eq!(login.code, 0, "{}", login.stderr);
    let listed = hub_cli(&config, &["machine", "list", "edge"], "");
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert!(
        listed
            .stdout
            .contains(worker["metadata"]["name"].as_str().unwrap())
            && listed.stdout.contains("Running"),
        "{}",
        listed.stdout
    );
    let wrong = hub_cli(&config, &["pool", "scale", "edge", "gpus", "2"], "");
    assert_eq!(wrong.code, 1, "{}", wrong.stdout);
    assert!(
        wrong.stderr.contains("its pools: main, workers"),
        "{}",
        wrong.stderr
    );
    let scaled = hub_cli(&config, &["pool", "scale", "edge", "workers", "0"], "");
    assert_eq!(scaled.code, 0, "{}", scaled.stderr);
    let (_, now) = api(hub.addr, "GET", "/v1/clusters/edge", Some(admin), None).await;
    let quantities: Vec<(&str, u64)> = now["spec"]["machinePools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["quantity"].as_u64().unwrap()))
        .collect();
    assert_eq!(quantities, [("main", 1), ("workers", 0)]);
    let worker_index = if worker["status"]["addresses"][0] == sshds[0].address.as_str() {
        0
    } else {
        1
    };
    until("the worker removed", Duration::from_secs(120), async || {
        let all = machines().await;
        let (_, hosts_now) = api(hub.addr, "GET", "/v1/hosts", Some(admin), None).await;
        all.len() == 1
            && all[0]["spec"]["pool"] == "main"
            && hosts_now["items"].as_array().map_or(0, Vec::len) == 1
    })
    .await;
    // The stand-in's uninstall script ran on the worker's machine: its distribution is gone.
    assert!(
        !hosts[worker_index]
            .file("/var/lib/rancher/k3s/installed")
            .exists(),
        "the worker's distribution is still installed"
    );

    // Back to one worker, and the hub killed while the machine is being bootstrapped over
    // SSH: once the hub is back, the same machine goes on (no second machine, no second host),
    // on the address that was freed.
    let scaled = hub_cli(&config, &["pool", "scale", "edge", "workers", "1"], "");
    assert_eq!(scaled.code, 0, "{}", scaled.stderr);
    until(
        "the new worker being bootstrapped",
        Duration::from_secs(60),
        async || {
            machines().await.iter().any(|m| {
                m["spec"]["pool"] == "workers"
                    && m["status"]["message"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("bootstrap: installing over SSH"))
            })
        },
    )
    .await;
    let site = {
        let mut site = site;
        site.crash_hub().await;
        site
    };
    let (hub, admin) = (&site.hub, site.admin.as_str());
    let machines = async || -> Vec<Value> {
        api(hub.addr, "GET", "/v1/machines", Some(admin), None)
            .await
            .1["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    until(
        "the worker running again after the crash",
        Duration::from_secs(180),
        async || {
            let all = machines().await;
            all.len() == 2 && all.iter().all(|m| m["status"]["phase"] == "Running")
        },
    )
    .await;
    let all = machines().await;
    let (_, hosts_now) = api(hub.addr, "GET", "/v1/hosts", Some(admin), None).await;
    assert_eq!(
        hosts_now["items"].as_array().unwrap().len(),
        2,
        "{hosts_now:#}"
    );
    let new_worker = all.iter().find(|m| m["spec"]["pool"] == "workers").unwrap();
    assert_ne!(new_worker["metadata"]["name"], worker["metadata"]["name"]);
    assert_eq!(
        new_worker["status"]["addresses"][0], worker["status"]["addresses"][0],
        "the freed address is used again"
    );
    assert_eq!(
        new_worker["status"]["hostKey"],
        sshds[worker_index].recorded_key().as_str()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `amazonec2` driver against moto's EC2 (TLS, IAM authentication on: every request's
/// signature is checked), with the stand-in hypervisor booting each instance as a
/// network-namespace host that runs its user data, as cloud-init would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_ec2_machines_boots_from_user_data_and_leaves_nothing_behind() {
    if skip_without_root("instances as network-namespace hosts need root") {
        return;
    }
    let dir = temp_dir("machines-ec2");
    let _net = Network::new(0);
    std::fs::create_dir_all(HOST_ROOT).unwrap();
    let moto = Arc::new(Moto::start(&dir).await);

    // The driver alone. A name made twice is one instance: it is found by its tag (moto, like
    // EC2 once a ClientToken has expired, would make a second). A wrong secret is refused by
    // the cloud's signature check, and said so.
    let ec2 = moto.driver(moto.credentials.clone());
    let tags = BTreeMap::new();
    let request = CreateRequest {
        name: "probe",
        tags: &tags,
        user_data: "#!/bin/sh\ntrue\n",
        client_token: "",
    };
    let first = ec2.create(&request).await.unwrap();
    let again = ec2.create(&request).await.unwrap();
    assert_eq!(first.id, again.id);
    assert_eq!(ec2.list(NAME_TAG, "probe").await.unwrap().len(), 1);
    ec2.delete(&first.id).await.unwrap();
    assert!(ec2.list(NAME_TAG, "probe").await.unwrap().is_empty());
    let forged = moto.driver(drivers::aws::Credentials {
        access_key_id: moto.credentials.access_key_id.clone(),
        secret_access_key: "not-the-secret".into(),
    });
    let refused = forged.create(&request).await.unwrap_err();
    assert!(
        matches!(&refused, DriverError::Refused(why) if why.contains("AuthFailure")),
        "{refused:?}"
    );

    let hypervisor = Hypervisor::start(moto.clone(), &dir, |h| {
        format!("mount --bind {}/root {HOST_ROOT}", h.dir.display())
    });
    let pools = json!({"machinePools": [
        {"name": "main", "quantity": 3, "template": "cloud",
         "roles": {"etcd": true, "controlPlane": true, "worker": true}},
        {"name": "workers", "quantity": 1, "template": "cloud", "roles": {"worker": true},
         "drainBeforeDelete": true},
    ]});
    let mut site = Site::start(&dir, &[VERSION], pools, &[]).await;
    let (code, body) = api(
        site.hub.addr,
        "POST",
        "/v1/cloudcredentials",
        Some(&site.admin),
        Some(json!({"metadata": {"name": "aws"},
                    "spec": {"driver": "amazonec2",
                             "amazonec2": {"accessKeyId": moto.credentials.access_key_id,
                                           "secretAccessKey": moto.credentials.secret_access_key}}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    tests::note_secret(&moto.credentials.secret_access_key);
    assert!(
        body["spec"]["amazonec2"]["secretAccessKey"].is_null(),
        "{body}"
    );
    let (code, body) = api(
        site.hub.addr,
        "POST",
        "/v1/machinetemplates",
        Some(&site.admin),
        Some(json!({"metadata": {"name": "cloud"},
                    "spec": {"driver": "amazonec2", "credential": "aws",
                             "amazonec2": {"region": "us-east-1", "endpoint": moto.endpoint,
                                           "endpointCA": moto.ca_pem, "ami": moto.ami,
                                           "instanceType": "t3.small", "subnetId": moto.subnet_id,
                                           "tags": {"team": "edge"},
                                           "installFlags": ["--no-systemd", "--root", HOST_ROOT]}}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");

    let machines = async |site: &Site| -> Vec<Value> {
        let (code, list) = match tests::try_api(
            site.hub.addr,
            "GET",
            "/v1/machines",
            Some(&site.admin),
            None,
        )
        .await
        {
            Ok(x) => x,
            Err(e) => panic!(
                "the hub does not answer: {e}; its log:\n{}",
                site.hub.log.lock().unwrap().join("\n")
            ),
        };
        assert_eq!(code, 200, "{list}");
        list["items"].as_array().unwrap().clone()
    };
    let live = async || -> Vec<Instance> {
        moto.instances()
            .await
            .into_iter()
            .filter(Instance::live)
            .collect()
    };
    // The workers pool's `field` set to `value`, as an operator's read-modify-write.
    let set_workers = async |site: &Site, field: &str, value: Value| {
        let (_, mut c) = site.get("/v1/clusters/edge").await;
        c["spec"]["machinePools"][1][field] = value;
        let (code, body) = api(
            site.hub.addr,
            "PUT",
            "/v1/clusters/edge",
            Some(&site.admin),
            Some(c),
        )
        .await;
        assert_eq!(code, 200, "{body}");
    };
    let all_running = async |site: &Site, n: usize| {
        let all = machines(site).await;
        let c = cluster(&site.hub, &site.admin).await;
        all.len() == n
            && all.iter().all(|m| m["status"]["phase"] == "Running")
            && c["state"]["state"] == "active"
            && c["status"]["hosts"] == json!({"ready": n, "total": n})
    };
    // Each machine is its pool's: instances and machines one to one, by the name's tag.
    let one_to_one = async |site: &Site| {
        let all = machines(site).await;
        let instances = live().await;
        let mut by_tag: Vec<String> = instances.iter().map(|i| i.tags[NAME_TAG].clone()).collect();
        by_tag.sort_unstable();
        let mut names: Vec<String> = all
            .iter()
            .map(|m| m["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort_unstable();
        assert_eq!(by_tag, names, "{instances:#?}");
        (all, instances)
    };

    // Three machines of all roles and a worker: the cluster comes up.
    let started = Instant::now();
    until(
        "4 machines running in an active cluster",
        Duration::from_secs(240),
        async || all_running(&site, 4).await,
    )
    .await;
    eprintln!("4 EC2 machines running in {:?}", started.elapsed());
    let (all, instances) = one_to_one(&site).await;
    for machine in &all {
        let instance = instances
            .iter()
            .find(|i| machine["status"]["providerId"] == i.id.as_str())
            .unwrap();
        assert_eq!(machine["status"]["addresses"][0], instance.address.as_str());
        assert_eq!(instance.tags["drover.io/cluster"], "edge");
        assert_eq!(instance.tags["team"], "edge");
        // What booted it: the host command for its pool's roles, as user data.
        let booted = hypervisor.booted.lock().unwrap()[&instance.id].1.clone();
        assert!(booted.starts_with("#!/bin/sh\n"), "{booted}");
        let roles = if machine["spec"]["pool"] == "main" {
            "--etcd --controlplane --worker"
        } else {
            "--worker --node-name"
        };
        assert!(booted.contains(roles), "{booted}");
    }

    // Workers 1 → 3, the hub killed as soon as a new one is recorded: once it is back,
    // exactly the machines' instances exist (each found by its tag, never made twice), and
    // all join.
    set_workers(&site, "quantity", json!(3)).await;
    until(
        "a new worker machine recorded",
        Duration::from_secs(60),
        async || machines(&site).await.len() > 4,
    )
    .await;
    site.crash_hub().await;
    until(
        "6 machines running after the crash",
        Duration::from_secs(240),
        async || all_running(&site, 6).await,
    )
    .await;
    let (before, _) = one_to_one(&site).await;

    // Workers 3 → 1: the two newest go — drained, their hosts uninstalled, their instances
    // terminated. The drain comes first: a pod on each worker's node under a budget that
    // allows no eviction holds the removal (nodes cordoned, every instance still there) until
    // the budget is lifted.
    let kubeconfig_path = dir.join("edge.kubeconfig");
    site.kubeconfig(&kubeconfig_path).await;
    let (_, hosts) = site.get("/v1/hosts").await;
    let worker_nodes: Vec<String> = hosts["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| {
            h["spec"]["roles"]["etcd"] != true && h["spec"]["roles"]["controlPlane"] != true
        })
        .map(|h| h["spec"]["nodeName"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(worker_nodes.len(), 3, "{hosts:#}");
    let mut pods = String::new();
    for (i, node) in worker_nodes.iter().enumerate() {
        pods.push_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web-{i}, namespace: default, labels: {{app: web}}}}\n\
             spec: {{nodeName: {node}, containers: [{{name: web, image: nginx}}]}}\n---\n"
        ));
    }
    pods.push_str(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: default}\n\
         spec: {minAvailable: 3, selector: {matchLabels: {app: web}}}\n",
    );
    let pods_path = dir.join("pods.yaml");
    std::fs::write(&pods_path, pods).unwrap();
    kubectl_ok(
        &kubeconfig_path,
        &["apply", "-f", pods_path.to_str().unwrap()],
    )
    .await;
    set_workers(&site, "quantity", json!(1)).await;
    let cordoned = async || {
        let flags = kubectl_ok(
            &kubeconfig_path,
            &[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].spec.unschedulable}",
            ],
        )
        .await;
        flags.split_whitespace().filter(|f| *f == "true").count()
    };
    until("a worker cordoned for its drain", TIMEOUT, async || {
        cordoned().await > 0
    })
    .await;
    // Held: the budget refuses every eviction, so nothing may go (a span, since what is
    // checked is that nothing happens).
    let held_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < held_until {
        assert_eq!(
            live().await.len(),
            6,
            "an instance went before its node was drained"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let left = kubectl_ok(
        &kubeconfig_path,
        &["get", "pods", "-n", "default", "-o", "name"],
    )
    .await;
    for i in 0..worker_nodes.len() {
        let pod = format!("pod/web-{i}");
        assert!(
            left.lines().any(|l| l == pod),
            "the budget holds {pod}: {left}"
        );
    }
    kubectl_ok(&kubeconfig_path, &["delete", "pdb", "web", "-n", "default"]).await;
    until("4 machines again", Duration::from_secs(240), async || {
        all_running(&site, 4).await
    })
    .await;
    let (all, _) = one_to_one(&site).await;
    let gone: Vec<&Value> = before
        .iter()
        .filter(|m| {
            !all.iter()
                .any(|a| a["metadata"]["name"] == m["metadata"]["name"])
        })
        .collect();
    assert_eq!(gone.len(), 2);
    for machine in gone {
        assert_eq!(machine["spec"]["pool"], "workers");
        let id = machine["status"]["providerId"].as_str().unwrap();
        let index = hypervisor.booted.lock().unwrap()[id].0;
        // The stand-in's uninstall ran on it before the instance went.
        assert!(
            !dir.join(format!("host-{index}/root/var/lib/rancher/k3s/installed"))
                .exists(),
            "{id}'s distribution is still installed"
        );
    }

    // The worker rolls to a new template (another instance type): never more than quantity +
    // maxSurge (2) workers, never none running, until it is new and the old instance is
    // terminated.
    let (code, body) = api(
        site.hub.addr,
        "POST",
        "/v1/machinetemplates",
        Some(&site.admin),
        Some(json!({"metadata": {"name": "cloud-v2"},
                    "spec": {"driver": "amazonec2", "credential": "aws",
                             "amazonec2": {"region": "us-east-1", "endpoint": moto.endpoint,
                                           "endpointCA": moto.ca_pem, "ami": moto.ami,
                                           "instanceType": "t3.medium", "subnetId": moto.subnet_id,
                                           "installFlags": ["--no-systemd", "--root", HOST_ROOT]}}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let old_workers: Vec<String> = all
        .iter()
        .filter(|m| m["spec"]["pool"] == "workers")
        .map(|m| m["status"]["providerId"].as_str().unwrap().to_owned())
        .collect();
    set_workers(&site, "template", json!("cloud-v2")).await;
    let (most, fewest_running) = (std::cell::Cell::new(0), std::cell::Cell::new(usize::MAX));
    until(
        "the workers rolled to cloud-v2",
        Duration::from_secs(240),
        async || {
            let workers: Vec<Value> = machines(&site)
                .await
                .into_iter()
                .filter(|m| m["spec"]["pool"] == "workers")
                .collect();
            let live: Vec<&Value> = workers
                .iter()
                .filter(|m| {
                    m["metadata"]["deletionTimestamp"].is_null()
                        && m["status"]["phase"] != "Deleting"
                })
                .collect();
            most.set(most.get().max(workers.len()));
            fewest_running.set(
                fewest_running.get().min(
                    live.iter()
                        .filter(|m| m["status"]["phase"] == "Running")
                        .count(),
                ),
            );
            workers.len() == 1
                && workers.iter().all(|m| {
                    m["spec"]["template"] == "cloud-v2" && m["status"]["phase"] == "Running"
                })
        },
    )
    .await;
    let (most, fewest_running) = (most.get(), fewest_running.get());
    assert!(
        most <= 2,
        "{most} workers at once (quantity 1 + maxSurge 1)"
    );
    assert!(fewest_running >= 1, "no worker running during the roll");
    let instances = live().await;
    for old in &old_workers {
        assert!(!instances.iter().any(|i| &i.id == old), "{old} still runs");
    }

    // A worker's machine dies (its host halted, the instance left running): with
    // unhealthyAfter 5s, it is destroyed at the cloud and replaced, its host removed without
    // an uninstall that could never run.
    set_workers(&site, "unhealthyAfter", json!("5s")).await;
    let victim = machines(&site)
        .await
        .into_iter()
        .find(|m| m["spec"]["pool"] == "workers")
        .unwrap();
    let victim_id = victim["status"]["providerId"].as_str().unwrap().to_owned();
    let index = hypervisor.booted.lock().unwrap()[&victim_id].0;
    tests::hosts::halt(index);
    until(
        "the dead worker replaced",
        Duration::from_secs(240),
        async || {
            let all = machines(&site).await;
            let c = cluster(&site.hub, &site.admin).await;
            all.len() == 4
                && !all
                    .iter()
                    .any(|m| m["metadata"]["name"] == victim["metadata"]["name"])
                && all.iter().all(|m| m["status"]["phase"] == "Running")
                && c["status"]["hosts"] == json!({"ready": 4, "total": 4})
        },
    )
    .await;
    assert!(
        !live().await.iter().any(|i| i.id == victim_id),
        "the dead worker's instance was not terminated"
    );
    let (_, hosts_now) = site.get("/v1/hosts").await;
    assert!(
        !hosts_now["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["metadata"]["name"] == victim["status"]["host"]),
        "{hosts_now:#}"
    );

    // The cluster deleted: its hosts uninstalled, every instance terminated, every machine
    // gone — nothing left running in the cloud.
    let (code, body) = api(
        site.hub.addr,
        "DELETE",
        "/v1/clusters/edge",
        Some(&site.admin),
        None,
    )
    .await;
    assert!(code == 200 || code == 202, "{code} {body}");
    until(
        "every machine released",
        Duration::from_secs(240),
        async || machines(&site).await.is_empty(),
    )
    .await;
    let left = live().await;
    assert!(
        left.is_empty(),
        "instances leaked: {left:#?}\n{}",
        site.hub.log.lock().unwrap().join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
