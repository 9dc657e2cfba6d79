//! What the workload controllers would have made of the workloads stored, once caught up: a
//! ReplicaSet for each Deployment, the pods of every ReplicaSet, StatefulSet and DaemonSet,
//! and for each CronJob its last Job, finished, with its pod. The simulator runs no
//! controllers; the demo asks for this once, so that its clusters hold the chains of owners
//! a real cluster shows (Deployment → ReplicaSet → Pod).

use serde_json::{Value, json};

use super::{Sim, name_suffix, pod_spec_defaults, pod_status, store};

/// A stable `len`-letter suffix for `seed` (a hash of what the name is for), so that settling
/// again names the same objects and makes none twice.
fn suffix(seed: &str, len: usize) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    name_suffix(h, len)
}

/// An owner reference to `owner`, as its controller writes it.
fn owned_by(owner: &Value) -> Value {
    json!([{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        "controller": true, "blockOwnerDeletion": true,
    }])
}

/// A pod of `owner` from its pod template, on `node`, in `phase`, the `n`th pod's address.
fn pod(owner: &Value, template: &Value, name: &str, node: &str, phase: &str, n: u64) -> Value {
    let mut spec = template["spec"].clone();
    pod_spec_defaults(&mut spec);
    spec["nodeName"] = json!(node);
    let status = pod_status(&spec, phase, n);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": owner["metadata"]["namespace"],
            "labels": template["metadata"]["labels"].clone(),
            "ownerReferences": owned_by(owner),
        },
        "spec": spec,
        "status": status,
    })
}

/// Creates what the controllers would have, leaving alone what exists; returns how many
/// objects it made.
pub(crate) fn settle(sim: &Sim) -> usize {
    let nodes: Vec<String> = sim
        .store
        .list("nodes", None)
        .0
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    if nodes.is_empty() {
        return 0;
    }
    let mut made = 0;
    // What exists already is left as it is.
    let create =
        |resource: &str, object: Value| usize::from(sim.store.create(resource, object).is_ok());
    // Round the nodes, as the scheduler would spread them; addresses from the cluster's own
    // counter, as every other pod's.
    let mut placed = 0usize;
    let mut next_node = || {
        placed += 1;
        (nodes[placed % nodes.len()].clone(), sim.next())
    };
    for deployment in sim.store.list("apps/deployments", None).0 {
        let template = &deployment["spec"]["template"];
        let hash = suffix(&template.to_string(), 10);
        let mut labels = template["metadata"]["labels"].clone();
        labels["pod-template-hash"] = json!(hash);
        let mut replica_set = json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {
                "name": format!("{}-{hash}", deployment["metadata"]["name"].as_str().unwrap_or_default()),
                "namespace": deployment["metadata"]["namespace"],
                "labels": labels.clone(),
                "ownerReferences": owned_by(&deployment),
            },
            "spec": {
                "replicas": deployment["spec"]["replicas"].clone(),
                "selector": {"matchLabels": labels.clone()},
                "template": {"metadata": {"labels": labels}, "spec": template["spec"].clone()},
            },
        });
        super::deployment_status(&mut replica_set);
        made += create("apps/replicasets", replica_set);
    }
    for replica_set in sim.store.list("apps/replicasets", None).0 {
        let name = replica_set["metadata"]["name"].as_str().unwrap_or_default();
        let replicas = replica_set["spec"]["replicas"].as_u64().unwrap_or(1);
        for i in 0..replicas {
            let (node, n) = next_node();
            let pod_name = format!("{name}-{}", suffix(&format!("{name}/{i}"), 5));
            let template = &replica_set["spec"]["template"];
            made += create(
                "pods",
                pod(&replica_set, template, &pod_name, &node, "Running", n),
            );
        }
    }
    for stateful_set in sim.store.list("apps/statefulsets", None).0 {
        let name = stateful_set["metadata"]["name"]
            .as_str()
            .unwrap_or_default();
        let replicas = stateful_set["spec"]["replicas"].as_u64().unwrap_or(1);
        for i in 0..replicas {
            let (node, n) = next_node();
            let template = &stateful_set["spec"]["template"];
            let mut one = pod(
                &stateful_set,
                template,
                &format!("{name}-{i}"),
                &node,
                "Running",
                n,
            );
            one["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] =
                json!(format!("{name}-{i}"));
            one["spec"]["hostname"] = json!(format!("{name}-{i}"));
            made += create("pods", one);
        }
    }
    for daemon_set in sim.store.list("apps/daemonsets", None).0 {
        let name = daemon_set["metadata"]["name"].as_str().unwrap_or_default();
        for node in &nodes {
            let (_, n) = next_node();
            let pod_name = format!("{name}-{}", suffix(&format!("{name}/{node}"), 5));
            let template = &daemon_set["spec"]["template"];
            made += create(
                "pods",
                pod(&daemon_set, template, &pod_name, node, "Running", n),
            );
        }
    }
    for cron_job in sim.store.list("batch/cronjobs", None).0 {
        let name = cron_job["metadata"]["name"].as_str().unwrap_or_default();
        // The job of the last run, named by its scheduled minute as the controller names it.
        let job_name = format!("{name}-29413560");
        let template = &cron_job["spec"]["jobTemplate"];
        let mut job = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {
                "name": job_name, "namespace": cron_job["metadata"]["namespace"],
                "labels": template["metadata"]["labels"].clone(),
                "ownerReferences": owned_by(&cron_job),
            },
            "spec": template["spec"].clone(),
            "status": {
                "startTime": "2026-11-01T02:00:00Z", "completionTime": "2026-11-01T02:00:41Z",
                "succeeded": 1, "active": 0,
                "conditions": [{"type": "Complete", "status": "True"}],
            },
        });
        pod_spec_defaults(&mut job["spec"]["template"]["spec"]);
        let Ok(job) = sim.store.create("batch/jobs", job) else {
            continue;
        };
        made += 1;
        let _ = sim.store.update(
            "batch/cronjobs",
            &store::key_of(&cron_job),
            None,
            |current| {
                let mut next = current.clone();
                next["status"] = json!({"lastScheduleTime": "2026-11-01T02:00:00Z", "lastSuccessfulTime": "2026-11-01T02:00:41Z"});
                next
            },
        );
        let (node, n) = next_node();
        let pod_name = format!("{job_name}-{}", suffix(&job_name, 5));
        made += create(
            "pods",
            pod(
                &job,
                &job["spec"]["template"],
                &pod_name,
                &node,
                "Succeeded",
                n,
            ),
        );
    }
    made
}
