//! Leader election on a `coordination.k8s.io` Lease, with optimistic concurrency: every write
//! carries the `resourceVersion` it read, so two replicas can never both win a round.
//!
//! [`decide`] is the pure rule; [`LeaderElector`] performs it against the API.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;
use tracing::{info, warn};

/// What to do with the Lease as observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Its holder stopped renewing (or released it): take it over.
    TakeOver,
    /// Someone else holds a live Lease.
    Wait,
}

/// The election rule.
pub fn decide(lease: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == identity {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::TakeOver;
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    match &spec.renew_time {
        Some(MicroTime(renewed)) if renewed.saturating_add(duration).is_ok_and(|exp| exp > now) => {
            Decision::Wait
        }
        _ => Decision::TakeOver,
    }
}

/// One replica's participation in the election.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
}

impl LeaderElector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration,
        }
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.lease_duration.as_secs()).unwrap_or(15),
            ),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One election round: `Ok(true)` when we hold the Lease afterwards. A lost race
    /// (409 Conflict/AlreadyExists) is `Ok(false)`.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let result = match decide(spec, &self.identity, now) {
            Decision::Wait => return Ok(false),
            Decision::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(now, None, 0)),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            decision => {
                let Some(mut lease) = current.clone() else {
                    return Ok(false);
                };
                let old = lease.spec.clone().unwrap_or_default();
                lease.spec = Some(if decision == Decision::Renew {
                    self.spec(now, old.acquire_time, old.lease_transitions.unwrap_or(0))
                } else {
                    self.spec(
                        now,
                        None,
                        old.lease_transitions.unwrap_or(0).saturating_add(1),
                    )
                });
                // `lease.metadata.resourceVersion` is the one we read: replace fails if it moved.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica leads.
    pub async fn acquire(&self) {
        let retry = self.lease_duration / 5;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    info!(identity = %self.identity, lease = %self.name, "became leader");
                    return;
                }
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election round failed"),
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Renews until a renewal has failed for a whole lease duration; returns when leadership
    /// is lost (the caller must then stop reconciling).
    pub async fn hold(&self) {
        let period = self.lease_duration / 3;
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(period).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    warn!("lost the lease to another replica");
                    return;
                }
                Err(e) => warn!(error = %e, "renewing the lease failed"),
            }
            if last_ok.elapsed() >= self.lease_duration {
                warn!("could not renew the lease in time");
                return;
            }
        }
    }

    /// Gives the Lease up on shutdown so the other replica takes over without waiting.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await {
            if lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(self.identity.as_str())
            {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = None;
                }
                if let Err(e) = self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    warn!(error = %e, "releasing the lease failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn election_rule() {
        let now = Timestamp::from_second(1_000).unwrap();
        assert_eq!(decide(None, "a", now), Decision::Create);
        assert_eq!(
            decide(Some(&lease(Some("a"), 990)), "a", now),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), 990)), "a", now),
            Decision::Wait
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), 980)), "a", now),
            Decision::TakeOver
        );
        assert_eq!(
            decide(Some(&lease(None, 999)), "a", now),
            Decision::TakeOver
        );
    }
}
