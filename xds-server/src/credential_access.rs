//! Which gateway proxies may get which TLS credentials: a Gateway server's `credentialName`
//! Secret (its private key included) goes only to a gateway proxy whose ServiceAccount, as its
//! token was verified by TokenReview, may `get` that Secret, as a SubjectAccessReview
//! (`authorization.k8s.io/v1`) answers (Istio asks the same question before it serves a
//! gateway credential). Labels and node ids are the proxy's claims; RBAC is the Secret
//! owner's.
//!
//! The index asks [`CredentialAccess::decide`] while it renders a gateway (no I/O there): a
//! known answer is used, an unknown one counts as refused and is queued. [`run`] sends the
//! queued SubjectAccessReviews one at a time, remembers each answer ([`ALLOWED_TTL`],
//! [`DENIED_TTL`]; at most [`CAPACITY`] answers) and, when an answer is new or differs,
//! sends [`SourceEvent::CredentialAccess`] so the push loop renders the gateways again. An
//! expired answer stays in force until its review is answered again, for gateways of that
//! ServiceAccount still connected; the others' answers are forgotten. A gateway proxy that
//! connects waits (at most [`PREFETCH_WAIT`]) for the answers about the tenant's credentials
//! before its first config ([`CredentialAccess::prefetch`]), so a gateway reconnecting to a new
//! instance never gets a first config without its TLS servers.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use tokio::sync::{mpsc, watch, Notify};

use crate::model::SourceEvent;
use crate::push::Hub;

/// How long an answer that allows is used before it is asked again.
pub const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// How long a refusal is used before it is asked again (short: a Role granted after a
/// gateway started takes effect soon).
pub const DENIED_TTL: Duration = Duration::from_secs(10);
/// Most answers remembered (and reviews queued).
pub const CAPACITY: usize = 4096;
/// A review the API server did not answer is asked again after this long.
const RETRY: Duration = Duration::from_secs(5);
/// Longest wait for one review.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait of a connecting gateway for the answers about its credentials.
pub const PREFETCH_WAIT: Duration = Duration::from_secs(3);

/// A ServiceAccount reading a Secret of its own namespace (a gateway reads credentials of the
/// namespace it runs in).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CredentialKey {
    pub namespace: String,
    pub service_account: String,
    pub secret: String,
}

/// What is known of a [`CredentialKey`] (the core's, which the index asks through
/// [`CredentialDecider`]).
pub use meshplane_xds_core::credentials::{Access, CredentialDecider};

#[derive(Clone, Copy, Debug)]
struct Answer {
    allowed: bool,
    expires: Instant,
}

/// The answers and the reviews to send: pure, the clock passed in.
#[derive(Debug)]
pub struct AccessCache {
    answers: HashMap<CredentialKey, Answer>,
    pending: BTreeSet<CredentialKey>,
    capacity: usize,
}

impl AccessCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            answers: HashMap::new(),
            pending: BTreeSet::new(),
            capacity: capacity.max(1),
        }
    }

    /// The answer in force for `key`; queues a review when there is none or it expired.
    pub fn decide(&mut self, key: &CredentialKey, now: Instant) -> Access {
        match self.answers.get(key).copied() {
            Some(a) => {
                if a.expires <= now {
                    self.queue(key);
                }
                if a.allowed {
                    Access::Allowed
                } else {
                    Access::Denied
                }
            }
            None => {
                self.queue(key);
                Access::Unknown
            }
        }
    }

    /// Whether `key` has an answer, without asking.
    pub fn is_known(&self, key: &CredentialKey) -> bool {
        self.answers.contains_key(key)
    }

    fn queue(&mut self, key: &CredentialKey) {
        if self.pending.len() < self.capacity {
            self.pending.insert(key.clone());
        }
    }

    /// The reviews to send, taken.
    pub fn take_pending(&mut self) -> Vec<CredentialKey> {
        std::mem::take(&mut self.pending).into_iter().collect()
    }

    /// Whether reviews wait to be sent.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Records an answer; returns whether it changes what `key` gets (a first answer does).
    pub fn record(&mut self, key: CredentialKey, allowed: bool, now: Instant) -> bool {
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        if !self.answers.contains_key(&key) && self.answers.len() >= self.capacity {
            // Full: the answer closest to expiry goes (it would be asked again first anyway).
            if let Some(oldest) = self
                .answers
                .iter()
                .min_by_key(|(_, a)| a.expires)
                .map(|(k, _)| k.clone())
            {
                self.answers.remove(&oldest);
            }
        }
        let before = self.answers.insert(
            key,
            Answer {
                allowed,
                expires: now + ttl,
            },
        );
        before.is_none_or(|b| b.allowed != allowed)
    }

    /// Handles the answers expired at `now`: those of ServiceAccounts `live` says still have a
    /// connected gateway are queued for review (and stay in force until answered), the others
    /// forgotten.
    pub fn expire(&mut self, now: Instant, live: impl Fn(&str, &str) -> bool) {
        let expired: Vec<CredentialKey> = self
            .answers
            .iter()
            .filter(|(_, a)| a.expires <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            if live(&key.namespace, &key.service_account) {
                self.queue(&key);
            } else {
                self.answers.remove(&key);
            }
        }
    }

    /// Keeps the answer of `key` (if any) in force until `until`: a review that failed is not
    /// asked again at once.
    pub fn postpone(&mut self, key: &CredentialKey, until: Instant) {
        if let Some(a) = self.answers.get_mut(key) {
            a.expires = a.expires.max(until);
        }
    }

    /// When the next answer expires.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.answers.values().map(|a| a.expires).min()
    }

    /// Answers in force that refuse.
    pub fn refused(&self) -> usize {
        self.answers.values().filter(|a| !a.allowed).count()
    }

    /// Answers remembered.
    pub fn len(&self) -> usize {
        self.answers.len()
    }

    /// Whether no answer is remembered.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }
}

/// The cache shared by the index (which decides) and [`run`] (which asks).
#[derive(Debug)]
pub struct CredentialAccess {
    cache: Mutex<AccessCache>,
    wake: Notify,
    /// Counts the reviews answered or failed (prefetches wait on it).
    answered: watch::Sender<u64>,
}

impl Default for CredentialAccess {
    fn default() -> Self {
        Self {
            cache: Mutex::new(AccessCache::new(CAPACITY)),
            wake: Notify::new(),
            answered: watch::Sender::new(0),
        }
    }
}

impl CredentialDecider for CredentialAccess {
    fn decide(&self, namespace: &str, service_account: &str, secret: &str) -> Access {
        CredentialAccess::decide(self, namespace, service_account, secret)
    }
}

impl CredentialAccess {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, AccessCache> {
        // Answers hold no invariant a panicking holder could break.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the ServiceAccount `service_account` of `namespace` may get the Secret `secret`
    /// there, as far as is known now; asks when it is not known or too old.
    pub fn decide(&self, namespace: &str, service_account: &str, secret: &str) -> Access {
        let key = CredentialKey {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
            secret: secret.to_string(),
        };
        let mut cache = self.lock();
        let access = cache.decide(&key, Instant::now());
        if cache.has_pending() {
            self.wake.notify_one();
        }
        access
    }

    /// Records an answer (tests; [`run`] records what the API server says); returns whether
    /// it changes what the key gets.
    pub fn record(&self, key: CredentialKey, allowed: bool) -> bool {
        let changed = self.lock().record(key, allowed, Instant::now());
        self.answered.send_modify(|n| *n += 1);
        changed
    }

    /// Asks about every Secret of `secrets` for the ServiceAccount `service_account` of
    /// `namespace` and waits, at most `wait`, until each has an answer.
    pub async fn prefetch(
        &self,
        namespace: &str,
        service_account: &str,
        secrets: &BTreeSet<String>,
        wait: Duration,
    ) {
        let mut answered = self.answered.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        let keys: Vec<CredentialKey> = secrets
            .iter()
            .map(|secret| CredentialKey {
                namespace: namespace.to_string(),
                service_account: service_account.to_string(),
                secret: secret.clone(),
            })
            .collect();
        for key in &keys {
            self.decide(&key.namespace, &key.service_account, &key.secret);
        }
        loop {
            if keys.iter().all(|k| self.lock().is_known(k)) {
                return;
            }
            match tokio::time::timeout_at(deadline, answered.changed()).await {
                Ok(Ok(())) => {}
                // Out of time (the server then goes unserved until the answer comes).
                _ => return,
            }
        }
    }

    fn failed(&self) {
        self.answered.send_modify(|n| *n += 1);
    }
}

/// The SubjectAccessReview asking whether `key`'s ServiceAccount may get its Secret, as the
/// API server sees that account (its user name and groups).
pub fn review_of(key: &CredentialKey) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!(
                "system:serviceaccount:{}:{}",
                key.namespace, key.service_account
            )),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", key.namespace),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(key.namespace.clone()),
                verb: Some("get".into()),
                group: Some(String::new()),
                version: Some("v1".into()),
                resource: Some("secrets".into()),
                name: Some(key.secret.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn review(client: &kube::Client, key: &CredentialKey) -> Result<bool, String> {
    let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
    let answer = tokio::time::timeout(
        REVIEW_TIMEOUT,
        api.create(&PostParams::default(), &review_of(key)),
    )
    .await
    .map_err(|_| format!("no answer within {REVIEW_TIMEOUT:?}"))?
    .map_err(|e| crate::bounds::echo(&e.to_string()))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Sends the reviews [`CredentialAccess::decide`] queues, records the answers and tells the
/// push loop (through `events`) when one changes what a gateway gets; refreshes the answers of
/// gateways still connected to `hub` as they expire. Ends with `shutdown`.
pub async fn run(
    access: Arc<CredentialAccess>,
    client: kube::Client,
    hub: Arc<Hub>,
    events: mpsc::Sender<SourceEvent>,
    mut shutdown: watch::Receiver<bool>,
) {
    let metrics = Arc::clone(hub.metrics());
    loop {
        let next = access.lock().next_expiry();
        tokio::select! {
            () = crate::ads::stream::shutting_down(&mut shutdown) => return,
            () = access.wake.notified() => {}
            () = crate::timer::sleep_until_opt(next) => {}
        }
        let accounts = hub.gateway_accounts();
        let keys = {
            let mut cache = access.lock();
            cache.expire(Instant::now(), |ns, sa| {
                accounts.contains(&(ns.to_string(), sa.to_string()))
            });
            cache.take_pending()
        };
        let mut changed = false;
        let mut failed = Vec::new();
        for key in keys {
            match review(&client, &key).await {
                Ok(allowed) => {
                    metrics.credential_review(if allowed { "allowed" } else { "denied" });
                    let news = access.record(key.clone(), allowed);
                    if news {
                        log_answer(&key, allowed);
                    }
                    changed |= news;
                }
                Err(e) => {
                    metrics.credential_review("failed");
                    tracing::warn!(namespace = %key.namespace, service_account = %key.service_account, secret = %key.secret, error = %e, "SubjectAccessReview for a gateway credential failed; asked again in {RETRY:?}");
                    access.lock().postpone(&key, Instant::now() + RETRY);
                    failed.push(key);
                    access.failed();
                }
            }
        }
        metrics.credentials_refused(access.lock().refused());
        if changed && events.send(SourceEvent::CredentialAccess).await.is_err() {
            return;
        }
        if !failed.is_empty() {
            let access = Arc::clone(&access);
            tokio::spawn(async move {
                tokio::time::sleep(RETRY).await;
                let mut cache = access.lock();
                for key in &failed {
                    cache.queue(key);
                }
                drop(cache);
                access.wake.notify_one();
            });
        }
    }
}

fn log_answer(key: &CredentialKey, allowed: bool) {
    if allowed {
        tracing::info!(namespace = %key.namespace, service_account = %key.service_account, secret = %key.secret, "gateway credential served: the ServiceAccount may get the Secret");
    } else {
        tracing::warn!(namespace = %key.namespace, service_account = %key.service_account, secret = %key.secret, "gateway credential refused: the ServiceAccount may not get the Secret (SubjectAccessReview); its gateway proxies do not get the Gateway servers naming it (grant get on the Secret to the gateway's ServiceAccount)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sa: &str, secret: &str) -> CredentialKey {
        CredentialKey {
            namespace: "edge".into(),
            service_account: sa.into(),
            secret: secret.into(),
        }
    }

    #[test]
    fn unknown_counts_as_refused_and_is_asked_once() {
        let mut c = AccessCache::new(16);
        let now = Instant::now();
        assert_eq!(c.decide(&key("gw", "cert"), now), Access::Unknown);
        assert_eq!(c.decide(&key("gw", "cert"), now), Access::Unknown);
        assert_eq!(c.take_pending(), vec![key("gw", "cert")]);
        assert!(c.take_pending().is_empty());
        assert!(
            c.record(key("gw", "cert"), true, now),
            "a first answer changes"
        );
        assert_eq!(c.decide(&key("gw", "cert"), now), Access::Allowed);
        assert!(!c.has_pending(), "a fresh answer is not asked again");
    }

    #[test]
    fn answers_are_cached_positive_and_negative_with_their_ttls() {
        let mut c = AccessCache::new(16);
        let t0 = Instant::now();
        c.record(key("gw", "cert"), true, t0);
        c.record(key("thief", "cert"), false, t0);
        let later = t0 + DENIED_TTL;
        assert_eq!(c.decide(&key("thief", "cert"), later), Access::Denied);
        assert_eq!(c.decide(&key("gw", "cert"), later), Access::Allowed);
        assert_eq!(
            c.take_pending(),
            vec![key("thief", "cert")],
            "only the refusal is due after {DENIED_TTL:?}"
        );
        let expired = t0 + ALLOWED_TTL;
        // An expired answer stays in force until the review answers again.
        assert_eq!(c.decide(&key("gw", "cert"), expired), Access::Allowed);
        assert_eq!(c.take_pending(), vec![key("gw", "cert")]);
        assert!(
            c.record(key("gw", "cert"), false, expired),
            "a revoked grant changes"
        );
        assert!(
            !c.record(key("gw", "cert"), false, expired),
            "the same answer does not"
        );
        assert_eq!(c.decide(&key("gw", "cert"), expired), Access::Denied);
        assert_eq!(c.refused(), 2);
    }

    #[test]
    fn expired_answers_are_refreshed_while_their_gateway_is_connected_else_forgotten() {
        let mut c = AccessCache::new(16);
        let t0 = Instant::now();
        c.record(key("gw", "cert"), true, t0);
        c.record(key("gone", "cert"), true, t0);
        assert_eq!(c.next_expiry(), Some(t0 + ALLOWED_TTL));
        c.expire(t0 + ALLOWED_TTL, |ns, sa| ns == "edge" && sa == "gw");
        assert_eq!(c.take_pending(), vec![key("gw", "cert")]);
        assert_eq!(c.len(), 1, "the departed gateway's answer is forgotten");
        assert_eq!(
            c.decide(&key("gw", "cert"), t0 + ALLOWED_TTL),
            Access::Allowed
        );
    }

    #[test]
    fn a_failed_refresh_keeps_the_answer_and_is_not_asked_again_at_once() {
        let mut c = AccessCache::new(16);
        let t0 = Instant::now();
        c.record(key("gw", "cert"), true, t0);
        let expired = t0 + ALLOWED_TTL;
        c.expire(expired, |_, _| true);
        assert_eq!(c.take_pending(), vec![key("gw", "cert")]);
        c.postpone(&key("gw", "cert"), expired + RETRY);
        assert_eq!(c.next_expiry(), Some(expired + RETRY));
        c.expire(expired, |_, _| true);
        assert!(!c.has_pending(), "not before the retry");
        assert_eq!(c.decide(&key("gw", "cert"), expired), Access::Allowed);
    }

    #[test]
    fn the_cache_and_the_queue_are_bounded() {
        let mut c = AccessCache::new(4);
        let t0 = Instant::now();
        for i in 0..10 {
            c.decide(&key("gw", &format!("s{i}")), t0);
        }
        assert_eq!(
            c.take_pending().len(),
            4,
            "the queue holds at most the capacity"
        );
        for i in 0..10u64 {
            c.record(
                key("gw", &format!("s{i}")),
                true,
                t0 + Duration::from_secs(i),
            );
        }
        assert_eq!(c.len(), 4);
        // The newest answers stay; the oldest went first.
        assert_eq!(
            c.decide(&key("gw", "s9"), t0 + Duration::from_secs(9)),
            Access::Allowed
        );
        assert_eq!(
            c.decide(&key("gw", "s0"), t0 + Duration::from_secs(9)),
            Access::Unknown
        );
    }

    #[test]
    fn the_review_asks_for_get_on_the_one_secret_as_the_service_account() {
        let r = review_of(&key("gw", "shop-cert"));
        assert_eq!(
            r.spec.user.as_deref(),
            Some("system:serviceaccount:edge:gw")
        );
        assert!(r
            .spec
            .groups
            .as_ref()
            .is_some_and(|g| g.contains(&"system:serviceaccounts:edge".to_string())));
        let attrs = r.spec.resource_attributes.expect("resource attributes");
        assert_eq!(
            (
                attrs.namespace.as_deref(),
                attrs.verb.as_deref(),
                attrs.resource.as_deref(),
                attrs.name.as_deref()
            ),
            (
                Some("edge"),
                Some("get"),
                Some("secrets"),
                Some("shop-cert")
            )
        );
    }
}
