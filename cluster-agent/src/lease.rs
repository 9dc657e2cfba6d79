//! Leader election between the agent's replicas with a `coordination.k8s.io/v1` Lease, the way
//! client-go's leader election does it: the holder renews the lease every `retry`; another
//! replica takes it over once the record has not changed for a whole lease duration on *its
//! own* clock (so clocks need not agree); every write is a compare-and-swap on the lease's
//! resourceVersion, so two replicas never both win.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio_util::sync::CancellationToken;

/// The lease's place and timing.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a holder that stops renewing keeps the lease.
    pub duration: Duration,
}

impl LeaseConfig {
    /// How often the holder renews and the others look.
    fn retry(&self) -> Duration {
        self.duration / 5
    }

    /// A holder that has not renewed for this long steps down, before anyone may take over.
    fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }
}

/// One replica's view of the lease.
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The last record seen (holder, renew time) and when this replica first saw it.
    observed: Option<(Option<String>, Option<MicroTime>, Instant)>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Elector {
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        }
    }

    /// Waits until this replica holds the lease (`true`) or `stop` fires (`false`).
    pub async fn acquire(&mut self, stop: &CancellationToken) -> bool {
        let mut said_standby = false;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return true,
                Ok(false) => {
                    if !said_standby {
                        let holder = self.observed.as_ref().and_then(|o| o.0.clone());
                        tracing::info!(lease = %self.config.name, holder = ?holder, "standing by: another replica leads");
                        said_standby = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %self.config.name, error = %e, "cannot read or write the lease")
                }
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(self.config.retry()) => {}
            }
        }
    }

    /// Renews the lease until `leading` is cancelled, and cancels it if the lease cannot be
    /// renewed within the renew deadline (another replica may take it soon after).
    pub async fn keep(&mut self, leading: CancellationToken) {
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                () = leading.cancelled() => return,
                () = tokio::time::sleep(self.config.retry()) => {}
            }
            // A request that hangs (a cut network) must not outlast the renew deadline.
            let attempt =
                tokio::time::timeout(self.config.retry(), self.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(true)) => renewed = Instant::now(),
                Ok(Ok(false)) => {
                    tracing::warn!(lease = %self.config.name, "another replica took the lease; stepping down");
                    leading.cancel();
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.config.name, error = %e, "cannot renew the lease")
                }
                Err(_) => {
                    tracing::warn!(lease = %self.config.name, "renewing the lease timed out")
                }
            }
            if renewed.elapsed() >= self.config.renew_deadline() {
                tracing::warn!(lease = %self.config.name, "the lease was not renewed in time; stepping down");
                leading.cancel();
                return;
            }
        }
    }

    /// Gives the lease up at shutdown, so another replica need not wait for it to expire.
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.config.name, "lease released"),
            Err(e) => {
                tracing::warn!(lease = %self.config.name, error = %e, "cannot release the lease")
            }
        }
    }

    /// One round: `Ok(true)` if this replica holds the lease after it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let seconds = i32::try_from(self.config.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record = (holder.clone(), spec.renew_time.clone());
        let observed_at = match &self.observed {
            Some((h, r, at)) if (h, r) == (&record.0, &record.1) => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((record.0, record.1, at));
                at
            }
        };
        let mine = holder.as_deref() == Some(self.config.identity.as_str());
        let held_for = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(0),
        );
        if holder.is_some() && !mine && observed_at.elapsed() < held_for {
            return Ok(false);
        }
        if !mine {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.config.identity.clone());
        spec.lease_duration_seconds = Some(seconds);
        spec.renew_time = Some(now);
        // The resourceVersion read above makes this a compare-and-swap.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                let spec = written.spec.unwrap_or_default();
                self.observed = Some((spec.holder_identity, spec.renew_time, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}
