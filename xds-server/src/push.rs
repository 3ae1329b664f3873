//! From source events to proxies: the config generator behind a lock, the registry of
//! connected proxies, the debouncer, and the fan-out of re-rendered snapshots.
//!
//! Each connected proxy owns a `watch` channel of its [`Snapshot`]; a push replaces the
//! snapshot only when its content changed (the stream diffs per type). Proxies sharing a scope
//! share one rendered config and one snapshot per push. An endpoint-only change touches only
//! the proxies holding a changed EDS cluster, and only their EDS: the other types of their
//! snapshot are kept as they are.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::ads::snapshot::{short_name, ResourceMap, Snapshot, TypeSnapshot};
use crate::ads::tracker::{Nack, Protocol, StreamState};
use crate::index::{Change, ChangeKind};
use crate::metrics::Metrics;
use crate::model::{ProxyConfig, ProxyNode, SourceEvent};

/// Position of EDS in [`crate::model::type_url::ORDER`].
const EDS: usize = 1;

/// What the ADS server needs from the tenant's state: fold source events, render a proxy.
pub trait ConfigGenerator: Send + 'static {
    /// Folds one event; returns whether rendered configs may have changed.
    fn apply(&mut self, event: SourceEvent) -> bool;
    /// The full configuration of one proxy.
    fn render(&self, node: &ProxyNode) -> ProxyConfig;
    /// Whether `namespace` is a member namespace of this tenant.
    fn is_member(&self, namespace: &str) -> bool;
    /// Folds one event and says how far it reaches. By default any change is configuration.
    fn apply_change(&mut self, event: SourceEvent) -> Change {
        if self.apply(event) {
            Change {
                kind: ChangeKind::Config,
                ..Change::default()
            }
        } else {
            Change::default()
        }
    }
    /// [`ConfigGenerator::render`], returning the same `Arc` for proxies that get the same
    /// config (pushes then build one snapshot for all of them).
    fn render_shared(&self, node: &ProxyNode) -> Arc<ProxyConfig> {
        Arc::new(self.render(node))
    }
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

/// What a stream last published about one type: cheap to take at every message (the held
/// resources are shared, not copied); turned into a [`TypeStatus`] only when asked.
#[derive(Clone, Debug)]
struct TypeState {
    subscribed: bool,
    sent_version: Option<String>,
    acked_version: Option<String>,
    awaiting_ack: bool,
    last_nack: Option<Nack>,
    held: Arc<ResourceMap>,
}

impl TypeState {
    fn status(&self, index: usize, with_resources: bool) -> TypeStatus {
        TypeStatus {
            type_name: short_name(index),
            subscribed: self.subscribed,
            sent_version: self.sent_version.clone(),
            acked_version: self.acked_version.clone(),
            awaiting_ack: self.awaiting_ack,
            last_nack: self.last_nack.clone(),
            resources: if with_resources {
                self.held
                    .iter()
                    .map(|(n, r)| (n.clone(), r.version.clone()))
                    .collect()
            } else {
                Vec::new()
            },
        }
    }
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
    status: Arc<Mutex<Vec<TypeState>>>,
}

/// The generator and its configuration epoch: the count of configuration changes applied.
/// A snapshot rendered at the current epoch differs from a fresh render at most in EDS.
struct Generator {
    inner: Box<dyn ConfigGenerator>,
    epoch: u64,
}

/// Per-push memo of what proxies of the same scope share, keyed by their config's address
/// (the `Arc` is kept alongside, so an address cannot be reused within the push).
type Shared<T> = HashMap<*const ProxyConfig, (Arc<ProxyConfig>, T)>;

/// Shared state of the server: generator, connected proxies, readiness, metrics.
pub struct Hub {
    tenant: String,
    revision: String,
    control_namespace: String,
    generator: Mutex<Generator>,
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
            generator: Mutex::new(Generator {
                inner: generator,
                epoch: 0,
            }),
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

    /// Folds a source event into the generator; returns how far it reaches.
    pub fn apply(&self, event: SourceEvent) -> Change {
        let mut generator = lock(&self.generator);
        let change = generator.inner.apply_change(event);
        if change.kind == ChangeKind::Config {
            generator.epoch += 1;
        }
        change
    }

    /// Whether proxies of `namespace` may connect.
    pub fn admits_namespace(&self, namespace: &str) -> bool {
        namespace == self.control_namespace || lock(&self.generator).inner.is_member(namespace)
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

    /// Renders `node` (under the generator lock the caller holds), sharing the snapshot with
    /// the proxies of the same config in `shared` and reusing the unchanged types of `current`.
    fn render(
        generator: &Generator,
        node: &ProxyNode,
        current: &Snapshot,
        changed_at: Instant,
        shared: &mut Shared<Arc<Snapshot>>,
    ) -> Arc<Snapshot> {
        let config = generator.inner.render_shared(node);
        let key = Arc::as_ptr(&config);
        if let Some((_, snapshot)) = shared.get(&key) {
            return Arc::clone(snapshot);
        }
        let mut snapshot = Snapshot::reusing(&config, changed_at, Some(current));
        snapshot.epoch = Some(generator.epoch);
        let snapshot = Arc::new(snapshot);
        shared.insert(key, (config, Arc::clone(&snapshot)));
        snapshot
    }

    /// Hands `next` to a proxy's stream if its content differs from what the stream has.
    fn offer(&self, tx: &watch::Sender<Arc<Snapshot>>, next: Arc<Snapshot>) -> bool {
        self.metrics.proxy_config_bytes.observe(next.bytes as f64);
        tx.send_if_modified(|current| {
            if current.same_content(&next) {
                // Same content: no wake-up, but keep the newer epoch so the next
                // endpoint-only push can take the short path.
                if current.epoch != next.epoch {
                    *current = next;
                }
                false
            } else {
                *current = next;
                true
            }
        })
    }

    fn targets(&self) -> Vec<(ProxyNode, watch::Sender<Arc<Snapshot>>)> {
        lock(&self.proxies)
            .values()
            .map(|e| (e.node.clone(), e.snapshot.clone()))
            .collect()
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

    /// Pushes a debounced batch of changes: see [`Hub::push_endpoints`] and [`Hub::push_all`].
    pub fn push(&self, changed_at: Instant, change: &Change) {
        match change.kind {
            ChangeKind::None => {}
            ChangeKind::Endpoints => self.push_endpoints(changed_at, &change.clusters),
            ChangeKind::Config => self.push_all(changed_at),
        }
    }

    /// Re-renders every connected proxy and hands changed snapshots to their streams.
    pub fn push_all(&self, changed_at: Instant) {
        let mut shared = Shared::new();
        let mut pushed = 0usize;
        for (node, tx) in self.targets() {
            let next = {
                let generator = lock(&self.generator);
                let current = Arc::clone(&tx.borrow());
                Self::render(&generator, &node, &current, changed_at, &mut shared)
            };
            pushed += usize::from(self.offer(&tx, next));
        }
        tracing::debug!(proxies = pushed, "pushed changed configs");
    }

    /// Pushes a change of the endpoints of `clusters` only: proxies holding none of them are
    /// left alone; the others get their EDS re-rendered, the rest of their snapshot kept.
    /// A proxy whose snapshot predates the last configuration change is fully re-rendered.
    pub fn push_endpoints(&self, changed_at: Instant, clusters: &BTreeSet<String>) {
        let mut full = Shared::new();
        let mut eds: Shared<Arc<TypeSnapshot>> = Shared::new();
        let mut pushed = 0usize;
        for (node, tx) in self.targets() {
            let next = {
                let generator = lock(&self.generator);
                let current = Arc::clone(&tx.borrow());
                if current.epoch != Some(generator.epoch) {
                    Self::render(&generator, &node, &current, changed_at, &mut full)
                } else if clusters
                    .iter()
                    .any(|c| current.types[EDS].resources.contains_key(c))
                {
                    let config = generator.inner.render_shared(&node);
                    let key = Arc::as_ptr(&config);
                    let endpoints = match eds.get(&key) {
                        Some((_, t)) => Arc::clone(t),
                        None => {
                            let t = Arc::new(TypeSnapshot::new(&config.endpoints));
                            eds.insert(key, (config, Arc::clone(&t)));
                            t
                        }
                    };
                    let mut types = current.types.clone();
                    types[EDS] = endpoints;
                    Arc::new(Snapshot::from_types(types, changed_at, current.epoch))
                } else {
                    continue;
                }
            };
            pushed += usize::from(self.offer(&tx, next));
        }
        tracing::debug!(
            proxies = pushed,
            clusters = clusters.len(),
            "pushed changed endpoints"
        );
    }

    /// Every connected proxy with its sync state, including what each holds.
    pub fn proxy_statuses(&self) -> Vec<ProxyStatus> {
        self.statuses(None, true)
    }

    /// Every connected proxy with its sync state, without the held resources.
    pub fn proxy_overview(&self) -> Vec<ProxyStatus> {
        self.statuses(None, false)
    }

    /// One connected proxy with its sync state and what it holds.
    pub fn proxy_status(&self, id: &str) -> Option<ProxyStatus> {
        self.statuses(Some(id), true).pop()
    }

    fn statuses(&self, id: Option<&str>, with_resources: bool) -> Vec<ProxyStatus> {
        // Take the shared state under the lock; build the lists outside it.
        let taken: Vec<(ProxyNode, Protocol, usize, Vec<TypeState>)> = lock(&self.proxies)
            .values()
            .filter(|e| id.is_none_or(|id| e.node.id == id))
            .map(|e| {
                let bytes = e.snapshot.borrow().bytes;
                (e.node.clone(), e.protocol, bytes, lock(&e.status).clone())
            })
            .collect();
        let mut out: Vec<ProxyStatus> = taken
            .into_iter()
            .map(|(node, protocol, config_bytes, types)| ProxyStatus {
                id: node.id,
                namespace: node.namespace,
                pod_name: node.pod_name,
                protocol: protocol.as_str(),
                config_bytes,
                types: types
                    .iter()
                    .enumerate()
                    .map(|(i, t)| t.status(i, with_resources))
                    .collect(),
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
    status: Arc<Mutex<Vec<TypeState>>>,
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
        // Sent under the generator lock, so no change is applied between render and send: a
        // later push then starts from this snapshot.
        let generator = lock(&self.hub.generator);
        let current = Arc::clone(&self.sender.borrow());
        let next = Hub::render(
            &generator,
            &self.node,
            &current,
            Instant::now(),
            &mut Shared::new(),
        );
        self.hub
            .metrics
            .proxy_config_bytes
            .observe(next.bytes as f64);
        self.sender.send_replace(Arc::clone(&next));
        drop(generator);
        self.snapshot.mark_unchanged();
        next
    }

    /// Publishes the stream's protocol state for the debug endpoints (shared references and
    /// versions; the lists are built when an endpoint asks).
    pub fn publish(&self, state: &StreamState) {
        let types = state
            .types()
            .map(|(_, t)| TypeState {
                subscribed: t.subscribed(),
                sent_version: t.sent_version().map(str::to_string),
                acked_version: t.acked_version().map(str::to_string),
                awaiting_ack: t.awaiting_ack(),
                last_nack: t.last_nack().cloned(),
                held: Arc::clone(t.held_map()),
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
    // What the pending batch changed, merged: endpoint-only batches take the short path.
    let mut pending = Change::default();
    loop {
        let deadline = debouncer.deadline();
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { break };
                let synced = matches!(event, SourceEvent::Synced);
                let change = hub.apply(event);
                if !change.is_empty() {
                    debouncer.on_change(Instant::now());
                    pending.merge(change);
                }
                if synced && ready_on == ReadyOn::FirstSynced && !hub.is_ready() {
                    hub.mark_ready();
                    // Proxies that connected before the sync get their config now.
                    hub.push_all(Instant::now());
                }
            }
            _ = sleep_until_opt(deadline) => {
                let change = std::mem::take(&mut pending);
                if let Some(first) = debouncer.take() {
                    if hub.is_ready() {
                        hub.push(first, &change);
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
    fn apply_change(&mut self, event: SourceEvent) -> Change {
        crate::index::TenantIndex::apply(self, event)
    }
    fn render(&self, node: &ProxyNode) -> ProxyConfig {
        self.render_proxy(node)
    }
    fn render_shared(&self, node: &ProxyNode) -> Arc<ProxyConfig> {
        self.render_proxy_shared(node)
    }
    fn is_member(&self, namespace: &str) -> bool {
        crate::index::TenantIndex::is_member(self, namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::TenantIndex;
    use crate::model::type_url;
    use crate::source_dir::objects_from_yaml;
    use meshplane_crds::networking::CaptureMode;

    const MESH: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: pay, labels: {meshplane.io/rev: blue}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: Sidecar
metadata: {name: default, namespace: pay}
spec: {egress: [{hosts: [\"./*\"]}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.0.0.10, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: pay}
spec: {clusterIP: 10.0.0.20, ports: [{name: http, port: 80}]}
";

    fn event(yaml: &str) -> SourceEvent {
        SourceEvent::Upsert(objects_from_yaml("t.yaml", yaml).remove(0))
    }

    fn web_endpoints(ip: &str) -> SourceEvent {
        event(&format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 80}}]\nendpoints: [{{addresses: [{ip}]}}]\n"))
    }

    fn node(ns: &str, pod: &str) -> ProxyNode {
        ProxyNode {
            id: format!("sidecar~10.1.0.1~{pod}.{ns}~{ns}.svc.cluster.local"),
            namespace: ns.into(),
            pod_name: Some(pod.into()),
            ip: None,
            labels: Default::default(),
            capture_mode: CaptureMode::Default,
            loopback: None,
        }
    }

    fn current(h: &mut ProxyHandle) -> Arc<Snapshot> {
        Arc::clone(&h.snapshot.borrow_and_update())
    }

    #[test]
    fn endpoint_only_pushes_touch_only_eds_of_importing_proxies() {
        let mut index = TenantIndex::new("acme", "blue", "meshplane-acme", Default::default());
        for obj in objects_from_yaml("mesh.yaml", MESH) {
            index.apply(SourceEvent::Upsert(obj));
        }
        let hub = Hub::new(
            "acme",
            "blue",
            "meshplane-acme",
            Box::new(index),
            Arc::new(Metrics::new()),
        );
        hub.apply(web_endpoints("10.1.0.1"));
        hub.mark_ready();
        let mut shop =
            [node("shop", "a"), node("shop", "b")].map(|n| hub.connect(n, Protocol::Sotw));
        let mut pay = hub.connect(node("pay", "c"), Protocol::Delta);
        hub.push_all(Instant::now());
        let before = [current(&mut shop[0]), current(&mut shop[1])];
        let pay_before = current(&mut pay);
        // One render and one snapshot per scope.
        assert!(Arc::ptr_eq(&before[0], &before[1]));
        assert!(!Arc::ptr_eq(&before[0], &pay_before));

        let change = hub.apply(web_endpoints("10.1.0.2"));
        assert_eq!(change.kind, ChangeKind::Endpoints);
        hub.push(Instant::now(), &change);
        assert!(
            !pay.snapshot.has_changed().expect("open"),
            "pay does not import web"
        );
        let after = [current(&mut shop[0]), current(&mut shop[1])];
        for (b, a) in before.iter().zip(&after) {
            for i in [0, 2, 3] {
                assert!(Arc::ptr_eq(&b.types[i], &a.types[i]), "type {i} kept");
            }
            assert_ne!(b.types[EDS].version, a.types[EDS].version);
        }
        assert!(Arc::ptr_eq(&after[0].types[EDS], &after[1].types[EDS]));
        // Same content as a full render.
        let fresh = Hub::new(
            "acme",
            "blue",
            "meshplane-acme",
            Box::new({
                let mut index =
                    TenantIndex::new("acme", "blue", "meshplane-acme", Default::default());
                for obj in objects_from_yaml("mesh.yaml", MESH) {
                    index.apply(SourceEvent::Upsert(obj));
                }
                index.apply(web_endpoints("10.1.0.2"));
                index
            }),
            Arc::new(Metrics::new()),
        );
        fresh.mark_ready();
        let mut reference = fresh.connect(node("shop", "a"), Protocol::Sotw);
        assert!(reference.refresh().same_content(&after[0]));

        // A snapshot older than a configuration change is rendered in full.
        let added = hub.apply(event("apiVersion: v1\nkind: Service\nmetadata: {name: new, namespace: shop}\nspec: {clusterIP: 10.0.0.12, ports: [{name: http, port: 81}]}\n"));
        assert_eq!(added.kind, ChangeKind::Config);
        let change = hub.apply(web_endpoints("10.1.0.3"));
        hub.push(Instant::now(), &change);
        let latest = current(&mut shop[0]);
        assert!(latest.types[0]
            .resources
            .contains_key("outbound|81||new.shop.svc.cluster.local"));
        assert_eq!(latest.epoch, after[0].epoch.map(|e| e + 1));
        assert!(
            !pay.snapshot.has_changed().expect("open"),
            "same content: no wake-up"
        );
        assert_eq!(type_url::ORDER[EDS], type_url::ENDPOINT);
    }

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
