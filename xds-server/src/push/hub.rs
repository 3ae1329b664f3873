//! The hub: connected proxies with their snapshot channels, readiness and metrics. Shared by
//! the ADS streams, the push loop and the admin server; it holds no generator, so nothing here
//! waits for a render. What admission and the webhooks read of the tenant (members, the
//! EnvoyFilter policy, credential names, verdicts) comes from the index's watch channels
//! ([`crate::outputs::IndexWatch`]), attached when the push loop takes the generator.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use tokio::sync::{watch, Notify};

use crate::ads::protocol::status::{Publishes, SyncState};
use crate::ads::protocol::Protocol;
use crate::ads::snapshot::Snapshot;
use crate::metrics::Metrics;
use crate::model::ProxyNode;
use crate::outputs::IndexWatch;
use meshplane_crds::envoyfilter_policy::EnvoyFilterPolicy;

pub(super) struct ProxyEntry {
    pub(super) node: Arc<ProxyNode>,
    pub(super) protocol: Protocol,
    pub(super) snapshot: watch::Sender<Arc<Snapshot>>,
    pub(super) status: Arc<Mutex<Vec<SyncState>>>,
}

/// A proxy as the push loop sees it: who it is and where its snapshots go.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) node: Arc<ProxyNode>,
    pub(super) snapshot: watch::Sender<Arc<Snapshot>>,
}

/// Shared state of the server: connected proxies, readiness, metrics, and the index's outputs.
pub struct Hub {
    tenant: String,
    revision: String,
    control_namespace: String,
    pub(super) proxies: Mutex<HashMap<u64, ProxyEntry>>,
    /// Connected proxies per namespace (locked after `proxies`, never alone).
    per_namespace: Mutex<HashMap<String, usize>>,
    next_id: AtomicU64,
    /// Proxies registered since the push loop last rendered first configs, with when.
    waiting: Mutex<Vec<(u64, Instant)>>,
    pub(super) connects: Notify,
    ready: watch::Sender<bool>,
    /// The outputs of the generator the push loop drives (detached, empty, until it attaches).
    index: RwLock<IndexWatch>,
    connected: watch::Sender<usize>,
    pushes: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

pub(super) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the control plane down with it: the data stays usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Hub {
    pub fn new(
        tenant: impl Into<String>,
        revision: impl Into<String>,
        control_namespace: impl Into<String>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            tenant: tenant.into(),
            revision: revision.into(),
            control_namespace: control_namespace.into(),
            proxies: Mutex::new(HashMap::new()),
            per_namespace: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            waiting: Mutex::new(Vec::new()),
            connects: Notify::new(),
            ready: watch::Sender::new(false),
            index: RwLock::new(IndexWatch::detached()),
            connected: watch::Sender::new(0),
            pushes: watch::Sender::new(0),
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

    /// Reads the outputs of the generator the push loop drives (called by `Pusher::new`).
    pub(super) fn attach(&self, index: IndexWatch) {
        *self.index.write().unwrap_or_else(|e| e.into_inner()) = index;
    }

    fn index(&self) -> IndexWatch {
        self.index.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether proxies of `namespace` may connect.
    pub fn admits_namespace(&self, namespace: &str) -> bool {
        namespace == self.control_namespace
            || self
                .index
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .members
                .borrow()
                .contains(namespace)
    }

    /// Resolves once proxies of `namespace` are no longer admitted: it left the tenant (a
    /// members ConfigMap that lists fewer namespaces; an unreadable or deleted one keeps the
    /// last known members, see `source_kube::MembersFollower`).
    pub async fn namespace_left(&self, namespace: &str) {
        if namespace == self.control_namespace {
            return std::future::pending().await;
        }
        let mut members = self.index().members;
        // A generator that is gone publishes nothing more: its members stay as they were.
        if members.wait_for(|m| !m.contains(namespace)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// What the tenant's EnvoyFilters may do now (the validating webhook checks against it).
    pub fn envoy_filter_policy(&self) -> Arc<EnvoyFilterPolicy> {
        Arc::clone(&self.index().envoy_filter_policy.borrow())
    }

    /// The cluster's pod address ranges (`meshConfig.podNetworks`), empty when not set.
    pub fn pod_networks(&self) -> Arc<Vec<ipnet::IpNet>> {
        Arc::clone(&self.index().pod_networks.borrow())
    }

    /// Whether a pod of the tenant holds `address` now.
    pub fn is_tenant_pod_address(&self, address: std::net::IpAddr) -> bool {
        self.index().pod_addresses.borrow().contains(&address)
    }

    /// The `credentialName`s the tenant's Gateways name (a connecting gateway's access to them
    /// is asked before its first config).
    pub fn credential_names(&self) -> Arc<BTreeSet<String>> {
        Arc::clone(&self.index().credential_names.borrow())
    }

    /// The verdict on the tenant's traffic config, as it changes (the status writer's input;
    /// ask after the push loop attached its generator).
    pub fn diagnostics(&self) -> watch::Receiver<Arc<crate::translate::diagnostics::Diagnostics>> {
        self.index().diagnostics
    }

    /// The key sets to fetch for the tenant's RequestAuthentications, as they change (the key
    /// fetcher's input; ask after the push loop attached its generator).
    pub fn jwks_plan(&self) -> watch::Receiver<Arc<crate::translate::jwt::JwksPlan>> {
        self.index().jwks_plan
    }

    /// Marks the sources synced: streams start answering.
    pub(super) fn mark_ready(&self) {
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

    /// Count of debounced pushes done so far (tests await a push with it).
    pub fn pushes(&self) -> watch::Receiver<u64> {
        self.pushes.subscribe()
    }

    pub(super) fn count_push(&self) {
        self.pushes.send_modify(|n| *n += 1);
    }

    /// The ServiceAccounts (namespace, name) of the connected gateway proxies, as their
    /// tokens were verified: whose credential answers are kept fresh.
    pub fn gateway_accounts(&self) -> BTreeSet<(String, String)> {
        lock(&self.proxies)
            .values()
            .filter(|e| e.node.kind == crate::model::ProxyKind::Router)
            .filter_map(|e| {
                let account = e.node.service_account.clone()?;
                Some((e.node.namespace.clone(), account))
            })
            .collect()
    }

    /// Every connected proxy.
    pub(super) fn targets(&self) -> Vec<Target> {
        lock(&self.proxies)
            .values()
            .map(|e| Target {
                node: Arc::clone(&e.node),
                snapshot: e.snapshot.clone(),
            })
            .collect()
    }

    /// Proxies that connected since the last call and are still connected, with when they
    /// connected.
    pub(super) fn take_waiting(&self) -> Vec<(Target, Instant)> {
        let ids = std::mem::take(&mut *lock(&self.waiting));
        let proxies = lock(&self.proxies);
        ids.iter()
            .filter_map(|(id, at)| Some((proxies.get(id)?, *at)))
            .map(|(e, at)| {
                let target = Target {
                    node: Arc::clone(&e.node),
                    snapshot: e.snapshot.clone(),
                };
                (target, at)
            })
            .collect()
    }

    /// Registers a proxy; the push loop sends its first snapshot. The returned guard
    /// deregisters it when dropped.
    pub fn connect(self: &Arc<Self>, node: ProxyNode, protocol: Protocol) -> ProxyHandle {
        match self.try_connect(node, protocol, usize::MAX) {
            Ok(handle) => handle,
            // No namespace can hold usize::MAX proxies: the count would overflow memory first.
            Err(_) => unreachable!("a namespace with usize::MAX proxies"),
        }
    }

    /// Registers a proxy unless its namespace already has `max_per_namespace` connected; then
    /// the node is handed back.
    pub fn try_connect(
        self: &Arc<Self>,
        node: ProxyNode,
        protocol: Protocol,
        max_per_namespace: usize,
    ) -> Result<ProxyHandle, Box<ProxyNode>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(Arc::new(Snapshot::empty()));
        let status = Arc::new(Mutex::new(Vec::new()));
        let (count, node) = {
            let mut proxies = lock(&self.proxies);
            let mut per_namespace = lock(&self.per_namespace);
            let in_namespace = per_namespace.entry(node.namespace.clone()).or_default();
            if *in_namespace >= max_per_namespace {
                return Err(Box::new(node));
            }
            *in_namespace += 1;
            drop(per_namespace);
            let node = Arc::new(node);
            proxies.insert(
                id,
                ProxyEntry {
                    node: Arc::clone(&node),
                    protocol,
                    snapshot: tx,
                    status: Arc::clone(&status),
                },
            );
            (proxies.len(), node)
        };
        lock(&self.waiting).push((id, Instant::now()));
        self.connects.notify_one();
        self.metrics
            .proxy_connected(&self.revision, protocol.as_str(), 1);
        self.connected.send_replace(count);
        Ok(ProxyHandle {
            hub: Arc::clone(self),
            id,
            node,
            snapshot: rx,
            status,
        })
    }

    fn disconnect(&self, id: u64) {
        let (removed, count) = {
            let mut proxies = lock(&self.proxies);
            let removed = proxies.remove(&id);
            if let Some(entry) = &removed {
                let mut per_namespace = lock(&self.per_namespace);
                if let Some(n) = per_namespace.get_mut(&entry.node.namespace) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        per_namespace.remove(&entry.node.namespace);
                    }
                }
            }
            (removed, proxies.len())
        };
        if let Some(entry) = removed {
            self.metrics
                .proxy_connected(&self.revision, entry.protocol.as_str(), -1);
            self.connected.send_replace(count);
        }
    }
}

/// A connected proxy's end of the hub.
pub struct ProxyHandle {
    hub: Arc<Hub>,
    id: u64,
    node: Arc<ProxyNode>,
    /// The proxy's current snapshot: unrendered (`epoch: None`) until the push loop renders
    /// it, then it changes when a push changed the proxy's config.
    pub snapshot: watch::Receiver<Arc<Snapshot>>,
    status: Arc<Mutex<Vec<SyncState>>>,
}

impl ProxyHandle {
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// The proxy's identity.
    pub fn node(&self) -> &ProxyNode {
        &self.node
    }

    /// Publishes the stream's sync state for the debug endpoints (shared references and
    /// versions; the lists are built when an endpoint asks).
    pub fn publish(&self, state: &impl Publishes) {
        state.publish_into(&mut lock(&self.status));
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.hub.disconnect(self.id);
    }
}
