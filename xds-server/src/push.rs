//! From source events to proxies: the config generator behind a lock, the registry of
//! connected proxies, the debouncer, and the fan-out of re-rendered snapshots.
//!
//! Each connected proxy owns a `watch` channel of its [`Snapshot`]; a push re-renders every
//! proxy and replaces the snapshot only when its content changed, so an endpoint-only change
//! reaches only the proxies whose endpoints changed, and only as EDS (the stream diffs per type).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::ads::snapshot::{short_name, Snapshot};
use crate::ads::tracker::{Nack, Protocol, StreamState};
use crate::metrics::Metrics;
use crate::model::{ProxyConfig, ProxyNode, SourceEvent};

/// What the ADS server needs from the tenant's state: fold source events, render a proxy.
pub trait ConfigGenerator: Send + 'static {
    /// Folds one event; returns whether rendered configs may have changed.
    fn apply(&mut self, event: SourceEvent) -> bool;
    /// The full configuration of one proxy.
    fn render(&self, node: &ProxyNode) -> ProxyConfig;
    /// Whether `namespace` is a member namespace of this tenant.
    fn is_member(&self, namespace: &str) -> bool;
}

/// Debounce settings: push after `quiet` without changes, at the latest `max` after the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebounceConfig {
    pub quiet: Duration,
    pub max: Duration,
}

impl Default for DebounceConfig {
    fn default() -> Self {
        Self {
            quiet: Duration::from_millis(100),
            max: Duration::from_secs(1),
        }
    }
}

/// Pure debounce state: when the pending batch of changes is due.
#[derive(Clone, Debug)]
pub struct Debouncer {
    config: DebounceConfig,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Debouncer {
    pub fn new(config: DebounceConfig) -> Self {
        Self {
            config,
            first: None,
            last: None,
        }
    }
    /// Records a change seen at `now`.
    pub fn on_change(&mut self, now: Instant) {
        self.first.get_or_insert(now);
        self.last = Some(now);
    }
    /// When the pending batch must be pushed, if there is one.
    pub fn deadline(&self) -> Option<Instant> {
        let (first, last) = (self.first?, self.last?);
        Some((last + self.config.quiet).min(first + self.config.max))
    }
    /// Takes the batch: returns when its first change was seen.
    pub fn take(&mut self) -> Option<Instant> {
        self.last = None;
        self.first.take()
    }
}

/// Per-type sync state of a proxy, for the debug endpoint.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TypeStatus {
    #[serde(rename = "type")]
    pub type_name: &'static str,
    pub subscribed: bool,
    pub sent_version: Option<String>,
    pub acked_version: Option<String>,
    pub awaiting_ack: bool,
    pub last_nack: Option<Nack>,
    /// Name → version of what the proxy holds.
    pub resources: Vec<(String, String)>,
}

/// A connected proxy as the debug endpoints show it.
#[derive(Clone, Debug, Serialize)]
pub struct ProxyStatus {
    pub id: String,
    pub namespace: String,
    pub pod_name: Option<String>,
    pub protocol: &'static str,
    pub config_bytes: usize,
    pub types: Vec<TypeStatus>,
}

struct ProxyEntry {
    node: ProxyNode,
    protocol: Protocol,
    snapshot: watch::Sender<Arc<Snapshot>>,
    status: Arc<Mutex<Vec<TypeStatus>>>,
}

/// Shared state of the server: generator, connected proxies, readiness, metrics.
pub struct Hub {
    tenant: String,
    revision: String,
    control_namespace: String,
    generator: Mutex<Box<dyn ConfigGenerator>>,
    proxies: Mutex<HashMap<u64, ProxyEntry>>,
    next_id: AtomicU64,
    ready: watch::Sender<bool>,
    connected: watch::Sender<usize>,
    metrics: Arc<Metrics>,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the control plane down with it: the data stays usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Hub {
    pub fn new(
        tenant: impl Into<String>,
        revision: impl Into<String>,
        control_namespace: impl Into<String>,
        generator: Box<dyn ConfigGenerator>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            tenant: tenant.into(),
            revision: revision.into(),
            control_namespace: control_namespace.into(),
            generator: Mutex::new(generator),
            proxies: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            ready: watch::Sender::new(false),
            connected: watch::Sender::new(0),
            metrics,
        })
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }
    pub fn revision(&self) -> &str {
        &self.revision
    }
    pub fn control_namespace(&self) -> &str {
        &self.control_namespace
    }
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Folds a source event into the generator.
    pub fn apply(&self, event: SourceEvent) -> bool {
        lock(&self.generator).apply(event)
    }

    /// Whether proxies of `namespace` may connect.
    pub fn admits_namespace(&self, namespace: &str) -> bool {
        namespace == self.control_namespace || lock(&self.generator).is_member(namespace)
    }

    /// Marks the sources synced: streams start answering.
    pub fn mark_ready(&self) {
        self.ready.send_if_modified(|r| !std::mem::replace(r, true));
    }
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }
    /// Resolves once the sources synced.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Connected proxy count, as it changes.
    pub fn connected_count(&self) -> watch::Receiver<usize> {
        self.connected.subscribe()
    }

    fn render(&self, node: &ProxyNode, changed_at: Instant) -> Arc<Snapshot> {
        let config = lock(&self.generator).render(node);
        let snapshot = Snapshot::new(&config, changed_at);
        self.metrics
            .proxy_config_bytes
            .observe(snapshot.bytes as f64);
        Arc::new(snapshot)
    }

    /// Registers a proxy; the returned guard deregisters it when dropped.
    pub fn connect(self: &Arc<Self>, node: ProxyNode, protocol: Protocol) -> ProxyHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(Arc::new(Snapshot::empty()));
        let status = Arc::new(Mutex::new(Vec::new()));
        let count = {
            let mut proxies = lock(&self.proxies);
            proxies.insert(
                id,
                ProxyEntry {
                    node: node.clone(),
                    protocol,
                    snapshot: tx.clone(),
                    status: Arc::clone(&status),
                },
            );
            proxies.len()
        };
        self.metrics
            .proxy_connected(&self.revision, protocol.as_str(), 1);
        self.connected.send_replace(count);
        ProxyHandle {
            hub: Arc::clone(self),
            id,
            node,
            sender: tx,
            snapshot: rx,
            status,
        }
    }

    fn disconnect(&self, id: u64) {
        let (removed, count) = {
            let mut proxies = lock(&self.proxies);
            let removed = proxies.remove(&id);
            (removed, proxies.len())
        };
        if let Some(entry) = removed {
            self.metrics
                .proxy_connected(&self.revision, entry.protocol.as_str(), -1);
            self.connected.send_replace(count);
        }
    }

    /// Re-renders every connected proxy and hands changed snapshots to their streams.
    pub fn push_all(&self, changed_at: Instant) {
        let targets: Vec<(ProxyNode, watch::Sender<Arc<Snapshot>>)> = lock(&self.proxies)
            .values()
            .map(|e| (e.node.clone(), e.snapshot.clone()))
            .collect();
        let mut pushed = 0usize;
        for (node, tx) in targets {
            let next = self.render(&node, changed_at);
            let changed = tx.send_if_modified(|current| {
                if current.same_content(&next) {
                    false
                } else {
                    *current = Arc::clone(&next);
                    true
                }
            });
            pushed += usize::from(changed);
        }
        tracing::debug!(proxies = pushed, "pushed changed configs");
    }

    /// Every connected proxy with its sync state.
    pub fn proxy_statuses(&self) -> Vec<ProxyStatus> {
        let proxies = lock(&self.proxies);
        let mut out: Vec<ProxyStatus> = proxies
            .values()
            .map(|e| ProxyStatus {
                id: e.node.id.clone(),
                namespace: e.node.namespace.clone(),
                pod_name: e.node.pod_name.clone(),
                protocol: e.protocol.as_str(),
                config_bytes: e.snapshot.borrow().bytes,
                types: lock(&e.status).clone(),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

/// A connected proxy's end of the hub.
pub struct ProxyHandle {
    hub: Arc<Hub>,
    id: u64,
    node: ProxyNode,
    sender: watch::Sender<Arc<Snapshot>>,
    /// The proxy's current snapshot; changes when a push changed its config.
    pub snapshot: watch::Receiver<Arc<Snapshot>>,
    status: Arc<Mutex<Vec<TypeStatus>>>,
}

impl ProxyHandle {
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// The proxy's identity.
    pub fn node(&self) -> &ProxyNode {
        &self.node
    }

    /// Renders the proxy's config now and returns it (first response once the sources synced;
    /// a push racing with this renders the same state).
    pub fn refresh(&mut self) -> Arc<Snapshot> {
        let next = self.hub.render(&self.node, Instant::now());
        self.sender.send_replace(Arc::clone(&next));
        self.snapshot.mark_unchanged();
        next
    }

    /// Publishes the stream's protocol state for the debug endpoints.
    pub fn publish(&self, state: &StreamState) {
        let types = state
            .types()
            .enumerate()
            .map(|(i, (_, t))| TypeStatus {
                type_name: short_name(i),
                subscribed: t.subscribed(),
                sent_version: t.sent_version().map(str::to_string),
                acked_version: t.acked_version().map(str::to_string),
                awaiting_ack: t.awaiting_ack(),
                last_nack: t.last_nack().cloned(),
                resources: t
                    .held()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            })
            .collect();
        *lock(&self.status) = types;
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.hub.disconnect(self.id);
    }
}

/// Source-side readiness policy of the push loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadyOn {
    /// The first `Synced` event (directory source).
    FirstSynced,
    /// Someone else calls [`Hub::mark_ready`] (Kubernetes source: all initial watches listed).
    External,
}

/// Applies source events and pushes debounced changes until the source channel closes or
/// `shutdown` flips to true.
pub async fn run_push_loop(
    hub: Arc<Hub>,
    mut events: mpsc::Receiver<SourceEvent>,
    debounce: DebounceConfig,
    ready_on: ReadyOn,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut debouncer = Debouncer::new(debounce);
    loop {
        let deadline = debouncer.deadline();
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { break };
                let synced = matches!(event, SourceEvent::Synced);
                if hub.apply(event) {
                    debouncer.on_change(Instant::now());
                }
                if synced && ready_on == ReadyOn::FirstSynced && !hub.is_ready() {
                    hub.mark_ready();
                    // Proxies that connected before the sync get their config now.
                    hub.push_all(Instant::now());
                }
            }
            _ = sleep_until_opt(deadline) => {
                if let Some(first) = debouncer.take() {
                    if hub.is_ready() {
                        hub.push_all(first);
                    }
                }
            }
            () = crate::ads::stream::shutting_down(&mut shutdown) => break,
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

impl ConfigGenerator for crate::index::TenantIndex {
    fn apply(&mut self, event: SourceEvent) -> bool {
        !crate::index::TenantIndex::apply(self, event).is_empty()
    }
    fn render(&self, node: &ProxyNode) -> ProxyConfig {
        self.render_proxy(node)
    }
    fn is_member(&self, namespace: &str) -> bool {
        crate::index::TenantIndex::is_member(self, namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debouncer_waits_for_quiet_but_not_longer_than_max() {
        let cfg = DebounceConfig {
            quiet: Duration::from_millis(100),
            max: Duration::from_millis(1000),
        };
        let t0 = Instant::now();
        let mut d = Debouncer::new(cfg);
        assert_eq!(d.deadline(), None);
        d.on_change(t0);
        assert_eq!(d.deadline(), Some(t0 + Duration::from_millis(100)));
        d.on_change(t0 + Duration::from_millis(50));
        assert_eq!(d.deadline(), Some(t0 + Duration::from_millis(150)));
        // A steady trickle of changes is cut off at max.
        d.on_change(t0 + Duration::from_millis(950));
        assert_eq!(d.deadline(), Some(t0 + Duration::from_millis(1000)));
        assert_eq!(d.take(), Some(t0));
        assert_eq!(d.deadline(), None);
    }
}
