//! The machine controller when the cloud says no (issue 57), against moto's EC2 with a
//! stand-in in front of it ([`Ec2Front`]) that counts calls, keeps EC2's client-token promise
//! and fails or loses answers on request. No host boots here (no root needed): the machine
//! stays made and waiting for its host, which is all these steps need.
//!
//! - A cloud that cannot serve is retried with backoff, the Machine saying when it tries next;
//!   its bootstrap token (and so its user data) stays the same across attempts.
//! - A request the cloud refuses (a subnet that does not exist) is not retried until the
//!   template changes.
//! - An answer lost after the instance was made, the listing not showing it yet, and the
//!   retry sent with other parameters (EC2: `IdempotentParameterMismatch`): resolved by
//!   listing, one instance in the end.
//! - The machine removed before its host registered: its instance terminated and its
//!   registration token deleted.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{HubProcess, api, cloud::Moto, ec2_front::Ec2Front, login, temp_dir, until};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster's machines.
async fn machines(hub: &HubProcess, admin: &str) -> Vec<Value> {
    let (code, list) = api(hub.addr, "GET", "/v1/machines", Some(admin), None).await;
    assert_eq!(code, 200, "{list}");
    list["items"].as_array().unwrap().clone()
}

/// The machine made from template `template`, once there is one.
async fn machine(hub: &HubProcess, admin: &str, template: &str) -> Option<Value> {
    machines(hub, admin)
        .await
        .into_iter()
        .find(|m| m["spec"]["template"] == template && m["metadata"]["deletionTimestamp"].is_null())
}

/// That machine's status field `field`.
async fn status(hub: &HubProcess, admin: &str, template: &str, field: &str) -> Value {
    machine(hub, admin, template)
        .await
        .map_or(Value::Null, |m| m["status"][field].clone())
}

/// `PATCH /v1/clusters/edge` setting its one pool (of workers: an etcd machine would wait
/// for its successor to be ready before it left) to `template` and node `labels`.
async fn set_pool(hub: &HubProcess, admin: &str, quantity: u32, template: &str, labels: Value) {
    let (code, body) = api(
        hub.addr,
        "PATCH",
        "/v1/clusters/edge",
        Some(admin),
        Some(
            json!({"spec": {"machinePools": [{"name": "main", "quantity": quantity,
            "template": template, "roles": {"worker": true}, "labels": labels}]}}),
        ),
    )
    .await;
    assert_eq!(code, 200, "{body}");
}

/// The registration tokens named `name` (0 or 1).
async fn tokens_named(hub: &HubProcess, admin: &str, name: &Value) -> usize {
    let (_, tokens) = api(hub.addr, "GET", "/v1/registrationtokens", Some(admin), None).await;
    tokens["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["metadata"]["name"] == *name)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_the_cloud_fails_is_retried_gently_and_leaves_no_token_behind() {
    let dir = temp_dir("machine-failures");
    let moto = Moto::start(&dir).await;
    let front = Ec2Front::start(&moto, &dir).await;
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let post = async |path: &str, body: Value| {
        let (code, answer) = api(hub.addr, "POST", path, Some(&admin), Some(body)).await;
        assert_eq!(code, 201, "{answer}");
    };
    post(
        "/v1/cloudcredentials",
        json!({"metadata": {"name": "aws"}, "spec": {"driver": "amazonec2",
               "amazonec2": {"accessKeyId": moto.credentials.access_key_id,
                             "secretAccessKey": moto.credentials.secret_access_key}}}),
    )
    .await;
    tests::note_secret(&moto.credentials.secret_access_key);
    for (name, subnet) in [
        ("cloud", moto.subnet_id.as_str()),
        ("bad", "subnet-00000000"),
    ] {
        post(
            "/v1/machinetemplates",
            json!({"metadata": {"name": name}, "spec": {"driver": "amazonec2", "credential": "aws",
                   "amazonec2": {"region": "us-east-1", "endpoint": front.endpoint,
                                 "endpointCA": moto.ca_pem, "ami": moto.ami,
                                 "instanceType": "t3.small", "subnetId": subnet}}}),
        )
        .await;
    }
    let no_labels = json!({});

    // 1. The cloud cannot serve RunInstances: tried, then again after 10 s, 20 s, … — not
    //    at once — with the Machine saying when.
    front.fail(Some("RunInstances"));
    post(
        "/v1/clusters",
        json!({"metadata": {"name": "edge"}, "spec": {"type": "custom", "distribution": "k3s",
               "version": "v1.33.4+k3s1", "machinePools": [{"name": "main", "quantity": 1,
               "template": "cloud", "roles": {"worker": true}}]}}),
    )
    .await;
    until("the first attempt failed", TIMEOUT, async || {
        status(&hub, &admin, "cloud", "failures").await == 1
    })
    .await;
    let first = machine(&hub, &admin, "cloud").await.unwrap();
    let message = first["status"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("Unavailable") && message.contains("next attempt at"),
        "{message}"
    );
    let ready = first["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("False"), &json!("RetryBackoff"))
    );
    assert!(
        first["status"].get("bootstrapTokenSecret").is_none(),
        "{first}"
    );
    let token = first["status"]["registrationToken"].clone();
    // A span: what is checked is that little happens in it.
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(25)).await;
    let runs = front.count("RunInstances");
    eprintln!(
        "{runs} RunInstances in the {}s after the cloud first failed ({} DescribeInstances)",
        started.elapsed().as_secs(),
        front.count("DescribeInstances")
    );
    // Tried at 0 s, ~10 s, ~30 s: at most three (with no backoff, hundreds).
    assert!(runs <= 3, "{runs} RunInstances in 25 s");
    let failures = status(&hub, &admin, "cloud", "failures").await;
    assert!(failures.as_u64().unwrap() >= 2, "{failures}");
    // One bootstrap token for every attempt: the same user data each time.
    assert_eq!(
        status(&hub, &admin, "cloud", "registrationToken").await,
        token
    );
    assert_eq!(tokens_named(&hub, &admin, &token).await, 1);

    // 2. The pool rolled to a template whose subnet does not exist: the old machine goes
    //    (nothing was made for it) and takes its registration token with it; the new one is
    //    refused, and not asked again while nothing changes.
    front.fail(None);
    let before = front.count("RunInstances");
    set_pool(&hub, &admin, 1, "bad", no_labels.clone()).await;
    until("the refusal recorded", TIMEOUT, async || {
        status(&hub, &admin, "bad", "refused").await == true
            && machines(&hub, &admin).await.len() == 1
    })
    .await;
    assert_eq!(tokens_named(&hub, &admin, &token).await, 0);
    let refused = status(&hub, &admin, "bad", "message").await;
    let refused = refused.as_str().unwrap();
    assert!(
        refused.contains("InvalidSubnetID") && refused.contains("not tried again until"),
        "{refused}"
    );
    let after_refusal = front.count("RunInstances");
    assert_eq!(after_refusal, before + 1);
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        front.count("RunInstances"),
        after_refusal,
        "a refusal retried"
    );

    // 3. Back to the good template. Its machine's instance is made but the answer lost, and
    //    listings do not show it yet. Then the pool's labels change before the retry, so the
    //    retry carries other user data under the same client token: EC2 answers
    //    IdempotentParameterMismatch. The controller lists (still hidden), moves to a new
    //    client token, and on its next attempt finds the instance by its tag: one instance,
    //    whose user data's token still works.
    front.lose_next_run(2);
    set_pool(&hub, &admin, 1, "cloud", no_labels.clone()).await;
    until("the lost answer recorded", TIMEOUT, async || {
        status(&hub, &admin, "cloud", "message")
            .await
            .as_str()
            .is_some_and(|m| m.contains("lost"))
    })
    .await;
    let token = status(&hub, &admin, "cloud", "registrationToken").await;
    set_pool(&hub, &admin, 1, "cloud", json!({"tier": "edge"})).await;
    until("the mismatch resolved", TIMEOUT, async || {
        status(&hub, &admin, "cloud", "phase").await == "Bootstrapping"
    })
    .await;
    let made = machine(&hub, &admin, "cloud").await.unwrap();
    let name = made["metadata"]["name"].as_str().unwrap().to_owned();
    let live: Vec<_> = moto
        .instances()
        .await
        .into_iter()
        .filter(|i| i.state != "terminated" && i.tags.get(drivers::ec2::NAME_TAG) == Some(&name))
        .collect();
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_eq!(made["status"]["providerId"], live[0].id.as_str());
    assert_eq!(made["status"]["clientKey"], 1, "{made}");
    assert_eq!(made["status"]["registrationToken"], token);
    assert_eq!(tokens_named(&hub, &admin, &token).await, 1);
    assert!(made["status"].get("failures").is_none(), "{made}");

    // 4. Its instance terminated at the provider (not through the hub): once a listing of
    //    the pool has shown the instance, the next one that does not show it replaces the
    //    machine — no `unhealthyAfter` needed — and its token goes with it.
    let listings = front.count_naming("DescribeInstances", "tag:drover.io/pool");
    until("the pool's instances listed", TIMEOUT, async || {
        front.count_naming("DescribeInstances", "tag:drover.io/pool") > listings
    })
    .await;
    let ec2 = moto.ec2();
    ec2.call(
        "TerminateInstances",
        &[("InstanceId.1".to_owned(), live[0].id.clone())],
    )
    .await
    .unwrap();
    let terminated = Instant::now();
    until("the machine replaced", TIMEOUT, async || {
        let all = machines(&hub, &admin).await;
        all.len() == 1
            && all[0]["metadata"]["name"] != name.as_str()
            && all[0]["status"]["phase"] == "Bootstrapping"
    })
    .await;
    eprintln!(
        "a machine whose instance was terminated replaced in {:?}",
        terminated.elapsed()
    );
    assert_eq!(tokens_named(&hub, &admin, &token).await, 0);
    let token = status(&hub, &admin, "cloud", "registrationToken").await;

    // 5. Removed before its host registered: the instance terminated, the machine gone, its
    //    registration token deleted.
    set_pool(&hub, &admin, 0, "cloud", no_labels).await;
    until("the machine released", TIMEOUT, async || {
        machines(&hub, &admin).await.is_empty()
    })
    .await;
    assert_eq!(tokens_named(&hub, &admin, &token).await, 0);
    let left: Vec<_> = moto
        .instances()
        .await
        .into_iter()
        .filter(|i| i.state == "running" || i.state == "pending")
        .collect();
    assert!(left.is_empty(), "{left:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}
