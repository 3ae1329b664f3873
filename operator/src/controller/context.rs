//! What every reconcile shares: the client, the applier, Events, metrics, settings, the clock,
//! the per-object failure counts and, once the controllers run, their caches.

use std::sync::{Arc, OnceLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::Client;
use time::OffsetDateTime;
use tracing::warn;

use super::backoff::Failures;
use super::caches::{self, ClusterCaches, Snapshot};
use super::settings::Settings;
use super::Error;
use crate::apply::Applier;
use crate::metrics::Metrics;
use meshplane_events::EventRecorder;

/// The clock; injected so tests and rotation logic can control time.
pub type Clock = Arc<dyn Fn() -> OffsetDateTime + Send + Sync>;

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub applier: Applier,
    pub recorder: EventRecorder,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub clock: Clock,
    /// Consecutive failures per object, for the error backoff.
    pub(super) failures: Failures,
    /// Recent results of the revisions' webhook probes (`WebhooksReady`).
    pub probes: crate::webhook_probe::WebhookProbes,
    /// The controllers' caches, once [`super::run`] started them; before that (tests, tools)
    /// reconciles list from the API server.
    pub(super) caches: OnceLock<ClusterCaches>,
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, settings: Settings, clock: Clock) -> Self {
        let recorder = EventRecorder::new(
            client.clone(),
            "meshplane-operator",
            std::env::var("POD_NAME").ok(),
        );
        Self {
            applier: Applier::new(client.clone(), metrics.clone()),
            client,
            recorder,
            metrics,
            settings,
            clock,
            failures: Failures::default(),
            probes: Default::default(),
            caches: OnceLock::new(),
        }
    }

    /// Membership and the objects it was computed from: from the caches when the controllers
    /// run (no API reads), else listed from the API server.
    pub async fn cluster_snapshot(&self) -> Result<Snapshot, Error> {
        match self.caches.get() {
            Some(caches) => caches.snapshot().await,
            None => caches::snapshot(&self.client).await,
        }
    }

    /// `now` as a Kubernetes timestamp.
    pub fn now(&self) -> Time {
        let now = (self.clock)();
        Time(Timestamp::from_second(now.unix_timestamp()).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    /// Publishes an Event (once per occurrence: [`EventRecorder`]); a failure is logged,
    /// never fatal (Events are best effort).
    pub async fn event(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        match self
            .recorder
            .publish(reference, type_, reason, &note, "Reconcile")
            .await
        {
            Ok(()) => self.metrics.record_write("Event", "create"),
            Err(e) => warn!(error = %e, reason, "publishing event failed"),
        }
    }

    /// A reconcile of `key` (`controller/name`) succeeded: its next failure backs off from
    /// the start again.
    pub(super) fn succeeded(&self, key: &str) {
        self.failures.succeeded(key);
    }
}
