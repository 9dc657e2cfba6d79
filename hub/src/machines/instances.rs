//! What the provider still has: each pass lists a cloud pool's instances (by tag, at most
//! every few seconds) and names the machines whose instance is gone, to be replaced.

use std::{collections::BTreeMap, time::Duration};

use serde_json::Value;

use super::{Controller, decide};
use crate::{
    model::{MachinePool, Status},
    store::{Object, StoreError},
};

/// The tag a pool's instances carry (with the cluster's and the machine's name).
pub(super) const POOL_TAG: &str = "drover.io/pool";
/// A pool's instances are listed at most this often: passes come on every change, and every
/// 10 s regardless, each of those listing afresh.
const LIST_EVERY: Duration = Duration::from_secs(5);

/// What the controller knows of its machines' instances from one pass to the next.
#[derive(Debug, Default)]
pub(super) struct Instances {
    /// Instance ids a listing has shown: one missing from a later listing is gone. (Not those
    /// it made itself: a listing soon after the making may not show an instance yet.)
    seen: std::collections::HashSet<String>,
    /// By (cluster, pool): when last listed, and the ids listed.
    listed: std::collections::HashMap<
        (String, String),
        (std::time::Instant, std::collections::HashSet<String>),
    >,
}

impl Instances {
    /// Drops the last listing of `cluster`'s pool `pool`.
    pub(super) fn forget_listing(&mut self, cluster: &str, pool: &str) {
        self.listed
            .retain(|(c, p), _| !(c.as_str() == cluster && p.as_str() == pool));
    }
}

impl Controller {
    /// The machines of `cluster` whose instance the provider no longer has, and why that is
    /// known: one listing per cloud pool (by its tag, at most every [`LIST_EVERY`]) against
    /// the instance each made machine recorded. An instance not listed is gone once a listing
    /// had shown it, or once its machine's host had registered; a listing that fails tells
    /// nothing.
    pub(super) async fn gone_instances(
        &self,
        cluster: &str,
        pools: &[MachinePool],
        machines: &[&Object],
    ) -> Result<BTreeMap<String, String>, StoreError> {
        let mut gone = BTreeMap::new();
        for pool in pools {
            let made: Vec<(&Object, String, bool)> = machines
                .iter()
                .copied()
                .filter(|m| {
                    m.metadata.deletion_timestamp.is_none() && decide::text(m, "/pool") == pool.name
                })
                .filter_map(|m| {
                    let status = Status::of(m);
                    let phase = status.extra.get("phase").and_then(Value::as_str)?;
                    let running = phase == crate::model::phase::RUNNING;
                    let id = status.extra.get("providerId").and_then(Value::as_str)?;
                    (running || phase == crate::model::phase::BOOTSTRAPPING)
                        .then(|| (m, id.to_owned(), running))
                })
                .collect();
            let Some((first, _, _)) = made.first() else {
                continue;
            };
            let Ok((template, credential)) = self.template_of(first).await else {
                continue;
            };
            if template.amazonec2.is_none() {
                continue;
            }
            let key = (cluster.to_owned(), pool.name.clone());
            let cached = self
                .instances
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .listed
                .get(&key)
                .filter(|(at, _)| at.elapsed() < LIST_EVERY)
                .map(|(_, ids)| ids.clone());
            let ids = match cached {
                Some(ids) => ids,
                None => {
                    let Ok(driver) = self
                        .driver_for(&first.metadata.name, &template, &credential)
                        .await?
                    else {
                        continue;
                    };
                    match driver.list(POOL_TAG, &pool.name).await {
                        Ok(found) => {
                            let ids: std::collections::HashSet<String> =
                                found.into_iter().map(|m| m.id).collect();
                            self.instances
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .listed
                                .insert(key, (std::time::Instant::now(), ids.clone()));
                            ids
                        }
                        Err(e) => {
                            tracing::debug!(cluster, pool = %pool.name, error = %e, "listing a pool's instances failed; its machines are checked next time");
                            continue;
                        }
                    }
                }
            };
            let mut known = self.instances.lock().unwrap_or_else(|p| p.into_inner());
            for (machine, id, running) in made {
                if ids.contains(&id) {
                    known.seen.insert(id);
                } else if running || known.seen.contains(&id) {
                    gone.insert(
                        machine.metadata.name.clone(),
                        format!("its instance {id} is gone at the provider (terminated)"),
                    );
                }
            }
        }
        Ok(gone)
    }
}
