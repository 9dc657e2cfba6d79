//! The agent's side of delivery, on the hub: a cluster's deployments as a stream
//! (`WatchBundles`), the chunks of their content (`GetChunk`, only those of this cluster's
//! deployments), and the reports that become each deployment's status (`ReportBundle`).

use std::{pin::Pin, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use proto::cluster::v1::{BundleDeployment, BundleReport, BundleSnapshot};
use serde_json::{Value, json};

use super::CLUSTER_LABEL;
use crate::{
    model::{BundleDeploymentSpec, CHUNK_KIND, Kind, OBJECT_STATES},
    store::{LabelSelector, Modifier, Object, Op, Store, StoreError, WatchStream},
};

/// Snapshots for one cluster: the current one, then each that differs.
pub type Snapshots = Pin<Box<dyn Stream<Item = Result<BundleSnapshot, tonic::Status>> + Send>>;

fn of_cluster(object: &Object, cluster: &str) -> Option<BundleDeploymentSpec> {
    let spec: BundleDeploymentSpec = serde_json::from_value(object.spec.clone()).ok()?;
    (spec.cluster == cluster).then_some(spec)
}

fn message(name: &str, spec: BundleDeploymentSpec) -> BundleDeployment {
    BundleDeployment {
        name: name.to_owned(),
        bundle: spec.bundle,
        content: spec.content.digest,
        chunks: spec.content.chunks,
        default_namespace: spec.default_namespace,
        namespace: spec.namespace,
        labels: spec.labels,
        images: spec.images,
        vars: spec.vars,
        correct_drift: spec.correct_drift,
        revision: spec.revision,
    }
}

/// The deployments of `cluster` as they are stored now.
pub async fn snapshot(store: &dyn Store, cluster: &str) -> Result<BundleSnapshot, StoreError> {
    let selector = LabelSelector::parse(&format!("{CLUSTER_LABEL}={cluster}"))
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    let (all, _) = store.list(Kind::BundleDeployment.name(), &selector).await?;
    let deployments = all
        .iter()
        .filter_map(|o| Some(message(&o.metadata.name, of_cluster(o, cluster)?)))
        .collect();
    Ok(BundleSnapshot { deployments })
}

/// Follows `cluster`'s deployments for as long as the stream is read.
pub fn follow(store: Arc<dyn Store>, cluster: String) -> Snapshots {
    struct State {
        store: Arc<dyn Store>,
        cluster: String,
        last: Option<BundleSnapshot>,
        changes: Option<WatchStream>,
        following: crate::store::Following,
    }
    impl State {
        /// Whether `event` can change what this cluster is sent: one of its deployments
        /// came, went, or changed its revision (a report changes only the status).
        fn news(&self, event: &crate::store::WatchEvent) -> bool {
            let Some(spec) = of_cluster(&event.object, &self.cluster) else {
                return false;
            };
            let sent = self.last.as_ref().and_then(|last| {
                last.deployments
                    .iter()
                    .find(|d| d.name == event.object.metadata.name)
            });
            event.kind != crate::store::EventType::Modified
                || sent.is_none_or(|d| d.revision != spec.revision)
        }
    }
    let state = State {
        store,
        cluster,
        last: None,
        changes: None,
        following: crate::store::Following::new("a cluster's bundles (for its agent)"),
    };
    Box::pin(futures::stream::unfold(state, |mut s| async move {
        loop {
            match &mut s.changes {
                None => {
                    let watch = async {
                        let from = s.store.revision().await?;
                        let changes = s
                            .store
                            .watch(Some(Kind::BundleDeployment.name()), Some(from))
                            .await?;
                        Ok::<_, StoreError>((from, changes))
                    };
                    match watch.await {
                        Ok((from, changes)) => {
                            s.following.resumed(from);
                            s.changes = Some(changes);
                        }
                        Err(e) => {
                            s.following.broke(Some(&e));
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                    }
                }
                Some(changes) => match changes.next().await {
                    // Only what concerns this cluster wakes it, and a status is no news to it.
                    Some(Ok(event)) if !s.news(&event) => continue,
                    Some(Ok(_)) => {}
                    end => {
                        s.following.broke(end.and_then(Result::err).as_ref());
                        s.changes = None;
                        continue;
                    }
                },
            }
            match snapshot(s.store.as_ref(), &s.cluster).await {
                Ok(now) if s.last.as_ref() != Some(&now) => {
                    s.last = Some(now.clone());
                    return Some((Ok(now), s));
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(cluster = %s.cluster, error = %e, "cannot read the cluster's bundles");
                    s.changes = None;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }))
}

/// The chunk `digest`, if one of `cluster`'s deployments names it; any other is "not found",
/// exactly as one that does not exist.
pub async fn chunk(
    store: &dyn Store,
    cluster: &str,
    digest: &str,
) -> Result<String, tonic::Status> {
    let missing = || tonic::Status::not_found(format!("no chunk {digest} for this cluster"));
    let internal = |e: StoreError| tonic::Status::unavailable(e.to_string());
    let mine = snapshot(store, cluster).await.map_err(internal)?;
    if !mine
        .deployments
        .iter()
        .any(|d| d.chunks.iter().any(|c| c == digest))
    {
        return Err(missing());
    }
    match store.get(CHUNK_KIND, digest).await {
        Ok(chunk) => Ok(chunk.spec["data"].as_str().unwrap_or_default().to_owned()),
        Err(StoreError::NotFound { .. }) => Err(missing()),
        Err(e) => Err(internal(e)),
    }
}

/// The status a report makes: the revision applied, every object's state, and the worst of
/// them as the deployment's state and message.
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
        "objects": report.objects.iter().map(|o| json!({
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
