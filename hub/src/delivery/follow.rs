//! The agent's side of delivery, on the hub: a cluster's deployments as a stream
//! (`WatchBundles`), the chunks of their content (`GetChunk`, only those of this cluster's
//! deployments), and the reports that become each deployment's status (`ReportBundle`).

use std::{pin::Pin, sync::Arc, time::Duration};

use futures::Stream;
use proto::cluster::v1::{BundleReport, BundleSnapshot};
use serde_json::{Value, json};

use super::index::Index;
use crate::{
    model::{BundleDeploymentSpec, CHUNK_KIND, Kind, OBJECT_STATES},
    store::{Modifier, Object, Op, Store, StoreError},
};

/// Snapshots for one cluster: the current one, then each that differs.
pub type Snapshots = Pin<Box<dyn Stream<Item = Result<BundleSnapshot, tonic::Status>> + Send>>;

fn of_cluster(object: &Object, cluster: &str) -> Option<BundleDeploymentSpec> {
    let spec: BundleDeploymentSpec = serde_json::from_value(object.spec.clone()).ok()?;
    (spec.cluster == cluster).then_some(spec)
}

/// The least time between two snapshots to one cluster: a commit's changes reach a cluster
/// over a whole controller pass, and each snapshot carries all of its deployments, so a burst
/// goes as a few snapshots, not one per change.
const BETWEEN_SNAPSHOTS: Duration = Duration::from_millis(250);

/// Follows `cluster`'s deployments for as long as the stream is read: the current ones once
/// the index is loaded, then each change of them.
pub fn follow(index: Arc<Index>, cluster: String) -> Snapshots {
    let changes = index.subscribe(&cluster);
    let state = (index, cluster, changes, None::<BundleSnapshot>);
    Box::pin(futures::stream::unfold(
        state,
        |(index, cluster, mut changes, last)| async move {
            if last.is_none() {
                index.loaded().await;
            } else {
                tokio::time::sleep(BETWEEN_SNAPSHOTS).await;
            }
            loop {
                changes.borrow_and_update();
                let now = index.snapshot(&cluster);
                if last.as_ref() != Some(&now) {
                    return Some((Ok(now.clone()), (index, cluster, changes, Some(now))));
                }
                changes.changed().await.ok()?;
            }
        },
    ))
}

/// The chunk `digest`, if one of `cluster`'s deployments names it; any other is "not found",
/// exactly as one that does not exist.
pub async fn chunk(
    store: &dyn Store,
    index: &Index,
    cluster: &str,
    digest: &str,
) -> Result<String, tonic::Status> {
    let missing = || tonic::Status::not_found(format!("no chunk {digest} for this cluster"));
    index.loaded().await;
    if !index.names_chunk(cluster, digest) {
        return Err(missing());
    }
    match store.get(CHUNK_KIND, digest).await {
        Ok(chunk) => Ok(chunk.spec["data"].as_str().unwrap_or_default().to_owned()),
        Err(StoreError::NotFound { .. }) => Err(missing()),
        Err(e) => Err(tonic::Status::unavailable(e.to_string())),
    }
}

/// The most objects a deployment's status lists by name.
const LISTED: usize = 20;

/// The status a report makes: the revision applied, how many objects stand in each state,
/// the first [`LISTED`] that are not Ready, and the worst as the deployment's state and message.
pub fn status_of(report: &BundleReport) -> Value {
    let rank = |s: &str| OBJECT_STATES.iter().position(|x| *x == s).unwrap_or(0);
    let worst = report.objects.iter().min_by_key(|o| rank(&o.state));
    let (state, message) = match (report.error.is_empty(), worst) {
        (false, _) => ("ErrApplied".to_owned(), report.error.clone()),
        (true, Some(o)) if o.state != "Ready" => (
            o.state.clone(),
            format!("{} {}: {}", o.kind, object_name(o), o.message),
        ),
        (true, _) => ("Ready".to_owned(), String::new()),
    };
    let counts: serde_json::Map<String, Value> = OBJECT_STATES
        .iter()
        .map(|s| {
            let n = report.objects.iter().filter(|o| o.state == *s).count();
            ((*s).to_owned(), json!(n))
        })
        .filter(|(_, n)| n != &json!(0))
        .collect();
    json!({
        "revision": report.revision,
        "state": state,
        "message": message,
        "error": if report.error.is_empty() { Value::Null } else { json!(report.error) },
        "counts": counts,
        // Only what is not Ready, and not all of that: a healthy cluster's status is the same
        // size however many objects the bundle has (the counts say how many there are).
        "objects": report.objects.iter().filter(|o| o.state != "Ready").take(LISTED).map(|o| json!({
            "apiVersion": o.api_version, "kind": o.kind, "namespace": o.namespace,
            "name": o.name, "state": o.state, "message": o.message,
        })).collect::<Vec<_>>(),
    })
}

fn object_name(o: &proto::cluster::v1::ObjectState) -> String {
    if o.namespace.is_empty() {
        o.name.clone()
    } else {
        format!("{}/{}", o.namespace, o.name)
    }
}

/// Writes `report` as the status of `cluster`'s deployment it names (another cluster's is
/// "not found").
pub async fn report(
    store: &dyn Store,
    cluster: &str,
    report: BundleReport,
) -> Result<(), tonic::Status> {
    let missing = || tonic::Status::not_found(format!("no bundle deployment {}", report.name));
    let found = match store.get(Kind::BundleDeployment.name(), &report.name).await {
        Ok(found) => found,
        Err(StoreError::NotFound { .. }) => return Err(missing()),
        Err(e) => return Err(tonic::Status::unavailable(e.to_string())),
    };
    if of_cluster(&found, cluster).is_none() {
        return Err(missing());
    }
    let status = status_of(&report);
    let op = Op::Modify {
        kind: Kind::BundleDeployment.name().into(),
        name: report.name.clone(),
        change: Modifier::new(move |o| o.status = status.clone()),
    };
    match store.transact(vec![op]).await {
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => Err(missing()),
        Err(e) => Err(tonic::Status::unavailable(e.to_string())),
    }
}
