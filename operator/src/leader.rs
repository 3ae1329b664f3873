//! Leader election on a `coordination.k8s.io` Lease, with optimistic concurrency: every write
//! carries the `resourceVersion` it read, so two replicas can never both win a round.
//!
//! Two replicas can still both *act* as leader if the holder keeps reconciling after another
//! replica took the Lease over. Two rules prevent it, neither relying on the replicas' clocks
//! agreeing:
//! - a replica that does not hold the Lease judges it expired only once the Lease has stayed
//!   unchanged for a whole lease duration by its own monotonic clock ([`Observer`]), never by
//!   comparing the `renewTime` written by another machine with its own wall clock;
//! - the holder stops leading once it has not renewed for [`renew_deadline`] (shorter than the
//!   lease), counted from when its last successful renewal was *sent*, and every renewal
//!   round is cut off at that deadline, so a request that hangs cannot keep it leading.
//!
//! A challenger starts counting only after it sees the holder's last write, which the holder
//! sent before its own count started; so the holder steps down at least a third of a lease
//! duration before anyone may take over.
//!
//! [`decide`] and [`Observer`] are the pure rules; [`LeaderElector`] performs them against the
//! API.

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;
use tokio::time::Instant;
use tracing::{info, warn};

/// Lease duration assumed when a Lease does not say.
const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// How long the holder may go without a successful renewal before it stops leading: two
/// thirds of the lease duration (client-go's default ratio, 10 s of 15 s).
pub fn renew_deadline(lease_duration: Duration) -> Duration {
    lease_duration * 2 / 3
}

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

/// The election rule. `unchanged_for` is how long, by this replica's own clock, the Lease has
/// been exactly as it is now ([`Observer`]).
pub fn decide(lease: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Decision {
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
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_LEASE, Duration::from_secs);
    if unchanged_for >= duration {
        Decision::TakeOver
    } else {
        Decision::Wait
    }
}

/// The parts of a Lease whose change shows its holder is alive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    resource_version: Option<String>,
    holder: Option<String>,
    renew_time: Option<Timestamp>,
}

impl Record {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Record {
            resource_version: lease.metadata.resource_version.clone(),
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
        }
    }
}

/// When this replica first saw the Lease as it is now, by its own monotonic clock.
#[derive(Debug, Default)]
pub struct Observer {
    seen: Option<(Record, Instant)>,
}

impl Observer {
    /// Notes the Lease as read at `now`; returns how long it has been unchanged.
    fn unchanged_for(&mut self, lease: Option<&Lease>, now: Instant) -> Duration {
        let Some(lease) = lease else {
            self.seen = None;
            return Duration::ZERO;
        };
        let record = Record::of(lease);
        match &self.seen {
            Some((seen, since)) if *seen == record => now.saturating_duration_since(*since),
            _ => {
                self.seen = Some((record, now));
                Duration::ZERO
            }
        }
    }
}

/// One replica's participation in the election.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    observer: Mutex<Observer>,
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
            observer: Mutex::new(Observer::default()),
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

    fn unchanged_for(&self, lease: Option<&Lease>) -> Duration {
        match self.observer.lock() {
            Ok(mut observer) => observer.unchanged_for(lease, Instant::now()),
            // A poisoned observer starts over: at worst this replica waits a lease longer.
            Err(poisoned) => {
                let mut observer = poisoned.into_inner();
                *observer = Observer::default();
                observer.unchanged_for(lease, Instant::now())
            }
        }
    }

    /// One election round: `Ok(true)` when we hold the Lease afterwards. A lost race
    /// (409 Conflict/AlreadyExists) is `Ok(false)`. The times written are informational (for
    /// `kubectl` and other tools); no replica's decision depends on them.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let unchanged_for = self.unchanged_for(current.as_ref());
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let result = match decide(spec, &self.identity, unchanged_for) {
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

    /// Waits until this replica leads; returns when the winning round was sent, from which
    /// [`hold`](Self::hold) counts its renew deadline. A round that does not answer within
    /// the retry period is abandoned.
    pub async fn acquire(&self) -> Instant {
        let retry = self.lease_duration / 5;
        loop {
            let started = Instant::now();
            match tokio::time::timeout(retry, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {
                    info!(identity = %self.identity, lease = %self.name, "became leader");
                    return started;
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => warn!(error = %e, "leader election round failed"),
                Err(_) => warn!("leader election round did not answer in time"),
            }
            tokio::time::sleep_until(started + retry).await;
        }
    }

    /// Renews until leadership is lost, then returns (the caller must stop reconciling at
    /// once): another replica took the Lease, or no renewal succeeded within the renew
    /// deadline counted from when the last successful one was sent (`renewed`, first the
    /// time [`acquire`](Self::acquire) returned). A renewal that hangs is cut off at the
    /// deadline.
    pub async fn hold(&self, renewed: Instant) {
        let deadline = renew_deadline(self.lease_duration);
        let period = self.lease_duration / 5;
        let mut renewed = renewed;
        loop {
            tokio::time::sleep_until((renewed + period).max(Instant::now())).await;
            let started = Instant::now();
            let left = (renewed + deadline).saturating_duration_since(started);
            if left.is_zero() {
                warn!("could not renew the lease in time; no longer leading");
                return;
            }
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => renewed = started,
                Ok(Ok(false)) => {
                    warn!("lost the lease to another replica");
                    return;
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "renewing the lease failed");
                    // Try again soon, within the deadline.
                    tokio::time::sleep(period.min(left)).await;
                }
                Err(_) => {
                    warn!("renewing the lease did not answer in time; no longer leading");
                    return;
                }
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
    use http::{Request, Response};
    use kube::client::Body;

    fn lease(holder: Option<&str>, version: &str, renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("meshplane-operator".into()),
                namespace: Some("meshplane-system".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(
                    Timestamp::from_second(renewed).expect("valid time"),
                )),
                ..Default::default()
            }),
        }
    }

    const LEASE: Duration = Duration::from_secs(15);

    #[test]
    fn election_rule() {
        let spec = |holder| lease(holder, "1", 0).spec;
        assert_eq!(decide(None, "a", Duration::ZERO), Decision::Create);
        assert_eq!(
            decide(spec(Some("a")).as_ref(), "a", Duration::ZERO),
            Decision::Renew
        );
        assert_eq!(
            decide(
                spec(Some("b")).as_ref(),
                "a",
                LEASE - Duration::from_millis(1)
            ),
            Decision::Wait
        );
        assert_eq!(
            decide(spec(Some("b")).as_ref(), "a", LEASE),
            Decision::TakeOver
        );
        assert_eq!(
            decide(spec(None).as_ref(), "a", Duration::ZERO),
            Decision::TakeOver
        );
    }

    /// The times in the Lease come from another machine's clock: a challenger whose clock is
    /// hours ahead of the holder's (or behind) decides the same, by how long it has itself
    /// seen the Lease unchanged.
    #[test]
    fn expiry_is_judged_by_the_observers_own_clock_not_the_renew_time() {
        let t0 = Instant::now();
        let mut observer = Observer::default();
        // Renewed "in 1970" by the holder's clock: not expired on sight.
        let stale_looking = lease(Some("b"), "7", 0);
        assert_eq!(
            observer.unchanged_for(Some(&stale_looking), t0),
            Duration::ZERO
        );
        assert_eq!(
            decide(stale_looking.spec.as_ref(), "a", Duration::ZERO),
            Decision::Wait
        );
        // The holder renews (a new resourceVersion): the count starts again.
        let renewed = lease(Some("b"), "8", 5);
        let t1 = t0 + Duration::from_secs(14);
        assert_eq!(observer.unchanged_for(Some(&renewed), t1), Duration::ZERO);
        // Renewed "far in the future" by a clock ahead of ours: still expires on our count.
        let ahead = lease(Some("b"), "9", 4_000_000_000);
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(observer.unchanged_for(Some(&ahead), t2), Duration::ZERO);
        let later = t2 + LEASE;
        let unchanged = observer.unchanged_for(Some(&ahead), later);
        assert_eq!(unchanged, LEASE);
        assert_eq!(
            decide(ahead.spec.as_ref(), "a", unchanged),
            Decision::TakeOver
        );
        // Gone: the next Lease seen starts a new count.
        assert_eq!(observer.unchanged_for(None, later), Duration::ZERO);
    }

    #[test]
    fn the_holder_gives_up_before_any_challenger_may_take_over() {
        assert!(renew_deadline(LEASE) < LEASE);
        assert_eq!(renew_deadline(LEASE), Duration::from_secs(10));
    }

    fn respond(json: serde_json::Value, status: u16) -> Response<Body> {
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&json).expect("json")))
            .expect("response")
    }

    /// A renewal that never answers (a partitioned API server, a hung connection) used to keep
    /// the holder leading for as long as it hung. Now the holder stops at the renew deadline,
    /// before a challenger that saw its last write may take over.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_ends_leadership_at_the_renew_deadline() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let elector = LeaderElector::new(
            Client::new(mock, "default"),
            "meshplane-system",
            "meshplane-operator",
            "a",
            LEASE,
        );
        let api = tokio::spawn(async move {
            // The first round: no Lease, then the create.
            let (request, send) = handle.next_request().await.expect("get");
            assert_eq!(request.method(), http::Method::GET);
            send.send_response(respond(
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "reason": "NotFound", "code": 404, "metadata": {}}),
                404,
            ));
            let (request, send) = handle.next_request().await.expect("create");
            assert_eq!(request.method(), http::Method::POST);
            let created =
                serde_json::to_value(lease(Some("a"), "1", 1_800_000_000)).expect("lease json");
            send.send_response(respond(created, 201));
            // Every later request hangs: held, never answered.
            let mut hung = Vec::new();
            while let Some(pending) = handle.next_request().await {
                hung.push(pending);
            }
        });
        let acquired = elector.acquire().await;
        elector.hold(acquired).await;
        let led_for = acquired.elapsed();
        assert!(
            led_for <= renew_deadline(LEASE),
            "led for {led_for:?} without renewing"
        );
        assert!(led_for >= renew_deadline(LEASE) - LEASE / 5, "{led_for:?}");
        drop(elector);
        api.abort();
    }
}
