//! The push loop: the one owner of the generator. It folds source events, debounces, renders
//! and hands snapshots to the proxies' `watch` channels; it also renders the first config of
//! every proxy that connects.
//!
//! A push replaces a proxy's snapshot only when its content changed (the stream diffs per
//! type). Proxies sharing a scope share one rendered config and one snapshot per push, and
//! scopes holding the same resources of a type share one type snapshot, its map and hash
//! ([`TypeMemo`]). An
//! endpoint-only change touches only the proxies holding a changed EDS cluster, and only their
//! EDS: the other types of their snapshot are kept as they are.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::hub::{Hub, Target};
use super::{Change, ChangeKind, ConfigGenerator};
use crate::ads::snapshot::{Snapshot, TypeMemo, TypeSnapshot};
use crate::model::{ProxyConfig, ProxyNode, SourceEvent};
use crate::translate::cluster_id::HostPort;
use crate::translate::endpoints::AssignmentScope;

/// Position of EDS in [`crate::model::type_url::ORDER`].
const EDS: usize = 1;

/// Debounce settings: push after `quiet` without changes, at the latest `max` after the first;
/// a change that comes while pushes are rare (none for `quiet`) waits only `isolated_quiet`.
///
/// One pair cannot serve both kinds of load: changes that come alone (S1's endpoint changes,
/// 100 ms apart) want the shortest wait, while a stream of changes closer than `quiet` (S3's,
/// 33 ms apart) wants batching up to `max`, each push costing a fan-out. A change that finds
/// the last push at least `quiet` ago opens a batch with the short wait; one that comes sooner
/// after a push opens a batch with the long one, so a steady stream keeps being batched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebounceConfig {
    pub quiet: Duration,
    pub max: Duration,
    pub isolated_quiet: Duration,
}

/// The shipped settings (the flags' defaults): a push re-renders only what changed and the
/// loop never overlaps pushes, so under load batches grow instead of queueing.
impl Default for DebounceConfig {
    fn default() -> Self {
        Self {
            quiet: Duration::from_millis(50),
            max: Duration::from_millis(300),
            isolated_quiet: Duration::from_millis(20),
        }
    }
}

/// Pure debounce state: when the pending batch of changes is due.
#[derive(Clone, Debug)]
pub struct Debouncer {
    config: DebounceConfig,
    first: Option<Instant>,
    last: Option<Instant>,
    /// When the last batch was taken.
    pushed: Option<Instant>,
}

impl Debouncer {
    pub fn new(config: DebounceConfig) -> Self {
        Self {
            config,
            first: None,
            last: None,
            pushed: None,
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
        let isolated = self
            .pushed
            .is_none_or(|p| first.saturating_duration_since(p) >= self.config.quiet);
        let quiet = if isolated {
            self.config.isolated_quiet.min(self.config.quiet)
        } else {
            self.config.quiet
        };
        Some((last + quiet).min(first + self.config.max))
    }
    /// Takes the batch at `now`: returns when its first change was seen.
    pub fn take(&mut self, now: Instant) -> Option<Instant> {
        self.last = None;
        let first = self.first.take();
        if first.is_some() {
            self.pushed = Some(now);
        }
        first
    }
}

/// Per-push memo of what proxies of the same scope share, keyed by their config's address
/// (the `Arc` is kept alongside, so an address cannot be reused within the push).
type Shared<T> = HashMap<usize, (Arc<ProxyConfig>, T)>;

/// The push side of the server: owns the generator, applies events, renders and fans out.
pub struct Pusher {
    hub: Arc<Hub>,
    generator: Box<dyn ConfigGenerator>,
    /// Count of configuration changes applied. A snapshot rendered at the current epoch
    /// differs from a fresh render at most in EDS.
    epoch: u64,
    /// The snapshots of the last push (or first renders since), by config: a proxy that
    /// connects later shares its scope's types instead of building its own.
    latest: Shared<Arc<Snapshot>>,
    /// When the current push started: a proxy's queue time runs from here to its snapshot.
    push_started: Instant,
}

impl Pusher {
    /// A pusher for `hub` over `generator`; the hub reads the generator's outputs from now on.
    pub fn new(hub: Arc<Hub>, generator: Box<dyn ConfigGenerator>) -> Self {
        hub.attach(generator.watch());
        Pusher {
            hub,
            generator,
            epoch: 0,
            latest: Shared::new(),
            push_started: Instant::now(),
        }
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Folds a source event; returns how far it reaches. `Ready` marks the hub ready and
    /// renders the proxies that connected before.
    pub fn apply(&mut self, event: SourceEvent) -> Change {
        let ready = matches!(event, SourceEvent::Ready);
        let reason = trigger_reason(&event);
        let change = self.generator.apply(event);
        if let (false, Some(reason)) = (change.is_empty(), reason) {
            self.hub.metrics().push_triggered(&reason);
        }
        if change.kind == ChangeKind::Config {
            self.epoch += 1;
        }
        if ready && !self.hub.is_ready() {
            self.hub.mark_ready();
            self.serve_waiting();
        }
        change
    }

    /// Renders the first config of every proxy that connected since the last call (once the
    /// sources synced; before, they keep waiting).
    pub fn serve_waiting(&mut self) {
        if !self.hub.is_ready() {
            return;
        }
        let now = Instant::now();
        let mut shared = std::mem::take(&mut self.latest);
        // Proxies of one scope get one snapshot, as after a push (endpoint pushes group by it).
        let mut retimed: HashMap<usize, (Arc<Snapshot>, Arc<Snapshot>)> = HashMap::new();
        let mut types = TypeMemo::default();
        for (target, connected_at) in self.hub.take_waiting() {
            let rendered = self.render(&target, None, now, &mut shared, &mut types);
            let next = match retimed.get(&(Arc::as_ptr(&rendered) as usize)) {
                Some((_, next)) => Arc::clone(next),
                None => {
                    let next = Arc::new(rendered.retimed(now));
                    retimed.insert(
                        Arc::as_ptr(&rendered) as usize,
                        (rendered, Arc::clone(&next)),
                    );
                    next
                }
            };
            self.hub
                .metrics()
                .proxy_config_bytes
                .observe(next.bytes as f64);
            // Always delivered: the stream waits for its first rendered snapshot.
            target.snapshot.send_replace(next);
            self.hub.metrics().queued(connected_at.elapsed());
        }
        self.latest = shared;
    }

    /// Pushes a debounced batch of changes: see [`Pusher::push_endpoints`] and
    /// [`Pusher::push_all`].
    pub fn push(&mut self, changed_at: Instant, change: &Change) {
        self.push_started = Instant::now();
        match change.kind {
            ChangeKind::None => {}
            ChangeKind::Endpoints => self.push_endpoints(changed_at, &change.clusters),
            ChangeKind::Config => self.push_all(changed_at),
        }
        self.hub.count_push();
    }

    /// Renders `target`, sharing the snapshot with the proxies of the same config in `shared`
    /// and reusing the unchanged types of `current`.
    fn render(
        &self,
        target: &Target,
        current: Option<&Snapshot>,
        changed_at: Instant,
        shared: &mut Shared<Arc<Snapshot>>,
        types: &mut TypeMemo,
    ) -> Arc<Snapshot> {
        let config = self.generator.render(&target.node);
        let key = Arc::as_ptr(&config) as usize;
        if let Some((_, snapshot)) = shared.get(&key) {
            return Arc::clone(snapshot);
        }
        let mut snapshot = Snapshot::reusing_in(&config, changed_at, current, types);
        snapshot.epoch = Some(self.epoch);
        let snapshot = Arc::new(snapshot);
        shared.insert(key, (config, Arc::clone(&snapshot)));
        snapshot
    }

    /// Hands `next` to a proxy's stream if its content differs from what the stream has.
    fn offer(&self, target: &Target, next: Arc<Snapshot>) -> bool {
        let metrics = self.hub.metrics();
        metrics.proxy_config_bytes.observe(next.bytes as f64);
        metrics.queued(self.push_started.elapsed());
        target.snapshot.send_if_modified(|current| {
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

    /// Re-renders every connected proxy and hands changed snapshots to their streams.
    pub fn push_all(&mut self, changed_at: Instant) {
        let mut shared = Shared::new();
        let mut types = TypeMemo::default();
        let mut pushed = 0usize;
        for target in self.hub.targets() {
            let current = Arc::clone(&target.snapshot.borrow());
            if current.epoch.is_none() {
                // Not served yet: its first config comes from `serve_waiting`.
                continue;
            }
            let next = self.render(&target, Some(&current), changed_at, &mut shared, &mut types);
            pushed += usize::from(self.offer(&target, next));
        }
        self.latest = shared;
        tracing::debug!(proxies = pushed, "pushed changed configs");
    }

    /// Pushes a change of the endpoints of `clusters` only: proxies holding none of them are
    /// left alone; the others get their EDS re-rendered, the rest of their snapshot kept.
    /// Proxies holding the same snapshot (one scope's render) of the same [`AssignmentScope`]
    /// form one [`EndpointGroup`]: the first of them is rendered and the others share its
    /// result, so the cost grows with the scopes, not with the proxies. A proxy whose snapshot
    /// predates the last configuration change is fully re-rendered.
    pub fn push_endpoints(&mut self, changed_at: Instant, clusters: &BTreeSet<HostPort>) {
        // Cached configs holding these clusters were patched: their snapshots are stale.
        self.latest.clear();
        // Snapshots hold resources by the names Envoy knows them by.
        let clusters: Vec<String> = clusters.iter().map(HostPort::cluster_name).collect();
        let mut full = Shared::new();
        let mut types = TypeMemo::default();
        let mut eds: Shared<Arc<TypeSnapshot>> = Shared::new();
        let mut groups: HashMap<usize, EndpointGroup> = HashMap::new();
        let (mut pushed, mut rendered) = (0usize, 0usize);
        for target in self.hub.targets() {
            let current = Arc::clone(&target.snapshot.borrow());
            let next = match current.epoch {
                None => continue,
                Some(e) if e != self.epoch => {
                    self.render(&target, Some(&current), changed_at, &mut full, &mut types)
                }
                Some(_) => {
                    let key = Arc::as_ptr(&current) as usize;
                    let next = match groups.get(&key) {
                        Some(group) if group.holds(&target.node, &current) => group.next.clone(),
                        _ => {
                            rendered += 1;
                            let next = self.patch_eds(
                                &target, &current, &clusters, changed_at, &mut eds, &mut types,
                            );
                            groups.insert(
                                key,
                                EndpointGroup {
                                    current: Arc::clone(&current),
                                    scope: AssignmentScope::of(&target.node),
                                    next: next.clone(),
                                },
                            );
                            next
                        }
                    };
                    match next {
                        Some(next) => next,
                        None => continue,
                    }
                }
            };
            pushed += usize::from(self.offer(&target, next));
        }
        tracing::debug!(
            proxies = pushed,
            rendered,
            clusters = clusters.len(),
            "pushed changed endpoints"
        );
    }

    /// `current` with the EDS of a fresh render of `target` (shared through `eds` by the
    /// proxies of one config, through `types` by configs with the same assignments), or `None`
    /// when `current` holds none of `clusters`.
    fn patch_eds(
        &self,
        target: &Target,
        current: &Snapshot,
        clusters: &[String],
        changed_at: Instant,
        eds: &mut Shared<Arc<TypeSnapshot>>,
        types: &mut TypeMemo,
    ) -> Option<Arc<Snapshot>> {
        if !clusters
            .iter()
            .any(|c| current.types[EDS].resources.contains_key(c))
        {
            return None;
        }
        let config = self.generator.render(&target.node);
        let key = Arc::as_ptr(&config) as usize;
        let endpoints = match eds.get(&key) {
            Some((_, t)) => Arc::clone(t),
            None => {
                let t = types.snapshot(&config.endpoints, Some(&current.types[EDS]));
                eds.insert(key, (config, Arc::clone(&t)));
                t
            }
        };
        Some(Arc::new(current.with_endpoints(endpoints, changed_at)))
    }
}

/// Proxies that get the same EDS from an endpoint-only push: they hold the same snapshot, which
/// one scope's render produced (the stream keeps the `Arc` it is handed), and are of the same
/// [`AssignmentScope`] (what an assignment depends on besides the registry).
struct EndpointGroup {
    /// The snapshot its proxies hold; kept so that its address is not reused within the push.
    current: Arc<Snapshot>,
    /// The assignment scope of the proxy that was rendered for the group.
    scope: AssignmentScope,
    /// What its proxies get (`None`: the change does not touch them).
    next: Option<Arc<Snapshot>>,
}

impl EndpointGroup {
    /// Whether a proxy of `node` holding `current` belongs to the group.
    fn holds(&self, node: &ProxyNode, current: &Arc<Snapshot>) -> bool {
        Arc::ptr_eq(&self.current, current) && self.scope.holds(node)
    }
}

/// Applies source events and pushes debounced changes until the source channel closes or
/// `shutdown` flips to true; renders the first config of each proxy as it connects.
pub async fn run_push_loop(
    mut pusher: Pusher,
    mut events: mpsc::Receiver<SourceEvent>,
    debounce: DebounceConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let hub = Arc::clone(pusher.hub());
    let mut debouncer = Debouncer::new(debounce);
    // What the pending batch changed, merged: endpoint-only batches take the short path.
    let mut pending = Change::default();
    loop {
        let deadline = debouncer.deadline();
        tokio::select! {
            // New streams first, then a due push, then more events: a flood of events can
            // neither starve connecting proxies nor postpone a push past its deadline.
            biased;
            () = shutting_down(&mut shutdown) => break,
            () = hub.connects.notified() => pusher.serve_waiting(),
            _ = crate::timer::sleep_until_opt(deadline) => {
                let change = std::mem::take(&mut pending);
                if let Some(first) = debouncer.take(Instant::now()) {
                    hub.metrics().debounced(first.elapsed());
                    if hub.is_ready() {
                        pusher.push(first, &change);
                    }
                }
            }
            event = events.recv() => {
                let Some(event) = event else { break };
                let change = pusher.apply(event);
                if !change.is_empty() {
                    debouncer.on_change(Instant::now());
                    pending.merge(change);
                }
            }
        }
    }
}

/// What a source event changed, as the `reason` of `meshplane_xds_push_triggers_total`: the
/// object's kind in lowercase (as `kubectl get` names it), `members`, `meshconfig`, `gateways`
/// (the operator's list of the tenant's ingress gateways), `tags` (the tags pointing at the
/// revision), `jwks` (key sets fetched for RequestAuthentications) or `resync`. `Resync` and `Ready` change nothing by themselves.
fn trigger_reason(event: &SourceEvent) -> Option<String> {
    let kind = |k: &crate::model::Kind| format!("{k:?}").to_ascii_lowercase();
    match event {
        SourceEvent::Upsert(object) => Some(kind(&object.key().kind)),
        SourceEvent::Delete(key) => Some(kind(&key.kind)),
        SourceEvent::Members(_) => Some("members".into()),
        SourceEvent::MeshConfig(_) => Some("meshconfig".into()),
        SourceEvent::GatewayDeployments(_) => Some("gateways".into()),
        SourceEvent::Tags(_) => Some("tags".into()),
        SourceEvent::Synced => Some("resync".into()),
        SourceEvent::CredentialAccess => Some("credentials".into()),
        SourceEvent::Jwks(_) => Some("jwks".into()),
        SourceEvent::Resync { .. } | SourceEvent::Ready => None,
    }
}

/// Resolves when the server starts shutting down (or its shutdown sender is gone).
pub(crate) async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::protocol::Protocol;
    use crate::index::TenantIndex;
    use crate::metrics::Metrics;
    use crate::model::{type_url, ProxyNode};
    use crate::outputs::IndexWatch;
    use crate::push::ProxyHandle;
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
spec: {clusterIP: 198.19.0.10, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: pay}
spec: {clusterIP: 198.19.0.20, ports: [{name: http, port: 80}]}
";

    fn event(yaml: &str) -> SourceEvent {
        SourceEvent::Upsert(objects_from_yaml("t.yaml", yaml).remove(0))
    }

    fn web_endpoints(ip: &str) -> SourceEvent {
        event(&format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 80}}]\nendpoints: [{{addresses: [{ip}]}}]\n"))
    }

    fn node(ns: &str, pod: &str) -> ProxyNode {
        ProxyNode {
            id: format!("sidecar~198.18.0.1~{pod}.{ns}~{ns}.svc.cluster.local"),
            kind: crate::model::ProxyKind::Sidecar,
            namespace: ns.into(),
            pod_name: Some(pod.into()),
            ip: None,
            labels: Default::default(),
            capture_mode: CaptureMode::Default,
            loopback: None,
            sds: false,
            service_account: None,
            readable_credentials: None,
        }
    }

    fn current(h: &mut ProxyHandle) -> Arc<Snapshot> {
        Arc::clone(&h.snapshot.borrow_and_update())
    }

    fn pusher(extra: &[SourceEvent]) -> Pusher {
        let mut index = TenantIndex::new("acme", "blue", "meshplane-acme", Default::default());
        for obj in objects_from_yaml("mesh.yaml", MESH) {
            index.apply(SourceEvent::Upsert(obj));
        }
        for e in extra {
            index.apply(e.clone());
        }
        let hub = Hub::new("acme", "blue", "meshplane-acme", Arc::new(Metrics::new()));
        Pusher::new(hub, Box::new(index))
    }

    #[test]
    fn first_configs_wait_for_ready_and_come_from_the_loop() {
        let mut p = pusher(&[]);
        assert!(
            p.hub().admits_namespace("shop"),
            "members published at once"
        );
        assert!(!p.hub().admits_namespace("elsewhere"));
        let hub = Arc::clone(p.hub());
        let mut early = hub.connect(node("shop", "a"), Protocol::Sotw);
        p.serve_waiting();
        assert!(current(&mut early).epoch.is_none(), "nothing before ready");
        p.apply(SourceEvent::Ready);
        assert!(hub.is_ready());
        assert!(early.snapshot.has_changed().expect("open"));
        let first = current(&mut early);
        assert_eq!(first.epoch, Some(0));
        assert!(first.types[0]
            .resources
            .contains_key("outbound|80||web.shop.svc.cluster.local"));
        // A later proxy of the same scope shares the types of the snapshot.
        let mut late = hub.connect(node("shop", "b"), Protocol::Delta);
        p.serve_waiting();
        let later = current(&mut late);
        assert!((0..4).all(|i| Arc::ptr_eq(&first.types[i], &later.types[i])));
    }

    #[test]
    fn endpoint_only_pushes_touch_only_eds_of_importing_proxies() {
        let mut p = pusher(&[]);
        p.apply(web_endpoints("198.18.1.1"));
        p.apply(SourceEvent::Ready);
        let hub = Arc::clone(p.hub());
        let mut shop =
            [node("shop", "a"), node("shop", "b")].map(|n| hub.connect(n, Protocol::Sotw));
        let mut pay = hub.connect(node("pay", "c"), Protocol::Delta);
        p.serve_waiting();
        let before = [current(&mut shop[0]), current(&mut shop[1])];
        let pay_before = current(&mut pay);
        // One render per scope: its proxies share the types of one snapshot.
        let shares =
            |a: &Snapshot, b: &Snapshot| (0..4).all(|i| Arc::ptr_eq(&a.types[i], &b.types[i]));
        assert!(shares(&before[0], &before[1]));
        assert!(!shares(&before[0], &pay_before));

        let change = p.apply(web_endpoints("198.18.1.2"));
        assert_eq!(change.kind, ChangeKind::Endpoints);
        p.push(Instant::now(), &change);
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
        let mut fresh = pusher(&[web_endpoints("198.18.1.2")]);
        fresh.apply(SourceEvent::Ready);
        let mut reference = fresh.hub().connect(node("shop", "a"), Protocol::Sotw);
        fresh.serve_waiting();
        assert!(current(&mut reference).same_content(&after[0]));

        // A snapshot older than a configuration change is rendered in full.
        let added = p.apply(event("apiVersion: v1\nkind: Service\nmetadata: {name: new, namespace: shop}\nspec: {clusterIP: 198.19.0.12, ports: [{name: http, port: 81}]}\n"));
        assert_eq!(added.kind, ChangeKind::Config);
        let change = p.apply(web_endpoints("198.18.1.3"));
        p.push(Instant::now(), &change);
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

    /// A tenant index that counts its renders.
    struct Counting {
        index: TenantIndex,
        renders: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl ConfigGenerator for Counting {
        fn apply(&mut self, event: SourceEvent) -> Change {
            self.index.apply(event)
        }
        fn render(&self, node: &ProxyNode) -> Arc<ProxyConfig> {
            self.renders
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.index.render(node)
        }
        fn watch(&self) -> IndexWatch {
            self.index.watch()
        }
    }

    /// Two member namespaces whose DestinationRules give subset `v1` of web different labels,
    /// and web pods with a sidecar (their endpoints are marked for mutual TLS, except for gRPC;
    /// both run under one account, so endpoints leaving change no identity).
    const SUBSETS: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: pay, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 198.19.0.10, selector: {app: web}, ports: [{name: http, port: 80}]}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: web, namespace: shop, creationTimestamp: \"2026-01-01T00:00:00Z\"}
spec: {host: web.shop.svc.cluster.local, subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: web, namespace: pay, creationTimestamp: \"2026-01-01T00:00:00Z\"}
spec: {host: web.shop.svc.cluster.local, subsets: [{name: v1, labels: {version: v2}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-a, namespace: shop, labels: {app: web, version: v1}, annotations: {sidecar.meshplane.io/revision: blue}}
status: {podIP: 198.18.1.1}
";

    fn web_pod_b(version: &str) -> SourceEvent {
        event(&format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: web-b, namespace: shop, labels: {{app: web, version: {version}}}, annotations: {{sidecar.meshplane.io/revision: blue}}}}\nstatus: {{podIP: 198.18.1.2}}\n"))
    }

    fn web_slice(addresses: &[(&str, &str)]) -> SourceEvent {
        let endpoints: Vec<String> = addresses
            .iter()
            .map(|(ip, pod)| {
                format!(
                    "{{addresses: [{ip}], targetRef: {{kind: Pod, name: {pod}, namespace: shop}}}}"
                )
            })
            .collect();
        event(&format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 80}}]\nendpoints: [{}]\n", endpoints.join(", ")))
    }

    /// Endpoint-only pushes render one proxy per group (snapshot, namespace, kind), not every
    /// proxy, and still leave every proxy with exactly what a fresh index renders for it:
    /// subsets per namespace, no mutual TLS marks for proxyless gRPC.
    #[test]
    fn endpoint_pushes_render_once_per_group_and_equal_a_full_render() {
        let grpc = |ns: &str, pod: &str| ProxyNode {
            kind: crate::model::ProxyKind::Grpc,
            ..node(ns, pod)
        };
        // Four groups: shop's and pay's sidecars, pay's and shop's gRPC clients.
        let nodes = [
            node("shop", "s1"),
            node("shop", "s2"),
            node("shop", "s3"),
            node("pay", "p1"),
            node("pay", "p2"),
            grpc("pay", "g1"),
            grpc("shop", "g2"),
            grpc("shop", "g3"),
        ];
        let setup = [
            web_pod_b("v2"),
            web_slice(&[("198.18.1.1", "web-a"), ("198.18.1.2", "web-b")]),
        ];
        // Endpoint-only changes: a pod moving between subsets, endpoints leaving and coming.
        let changes = [
            web_pod_b("v1"),
            web_slice(&[("198.18.1.2", "web-b")]),
            web_slice(&[("198.18.1.1", "web-a")]),
            web_slice(&[("198.18.1.1", "web-a"), ("198.18.1.2", "web-b")]),
            web_pod_b("v2"),
        ];
        let index_of = |events: &[SourceEvent]| {
            let mut index = TenantIndex::new("acme", "blue", "meshplane-acme", Default::default());
            for obj in objects_from_yaml("subsets.yaml", SUBSETS) {
                index.apply(SourceEvent::Upsert(obj));
            }
            for e in events {
                index.apply(e.clone());
            }
            index
        };
        let renders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let generator = Counting {
            index: index_of(&setup),
            renders: Arc::clone(&renders),
        };
        let hub = Hub::new("acme", "blue", "meshplane-acme", Arc::new(Metrics::new()));
        let mut p = Pusher::new(Arc::clone(&hub), Box::new(generator));
        p.apply(SourceEvent::Ready);
        let mut handles: Vec<ProxyHandle> = nodes
            .iter()
            .map(|n| hub.connect(n.clone(), Protocol::Sotw))
            .collect();
        p.serve_waiting();
        let mut applied = setup.to_vec();
        for (step, change_event) in changes.iter().enumerate() {
            applied.push(change_event.clone());
            let change = p.apply(change_event.clone());
            assert_eq!(change.kind, ChangeKind::Endpoints, "step {step}");
            let before = renders.load(std::sync::atomic::Ordering::Relaxed);
            p.push(Instant::now(), &change);
            assert_eq!(
                renders.load(std::sync::atomic::Ordering::Relaxed) - before,
                4,
                "step {step}: one render per group"
            );
            // Every proxy holds what a fresh index renders for it, byte for byte.
            let reference = index_of(&applied);
            for (n, h) in nodes.iter().zip(&mut handles) {
                let got = current(h);
                let want = Snapshot::new(&reference.render_checked(n).0, Instant::now());
                let bytes = |s: &Snapshot| -> Vec<(String, bytes::Bytes)> {
                    s.types[EDS]
                        .resources
                        .values()
                        .map(|r| (r.name.clone(), r.encoded.clone()))
                        .collect()
                };
                assert_eq!(bytes(&got), bytes(&want), "step {step}: EDS of {}", n.id);
                assert!(got.same_content(&want), "step {step}: {}", n.id);
            }
        }
        // The subsets differ between the namespaces, and gRPC gets no mutual TLS marks.
        let eds = |h: &mut ProxyHandle, name: &str| -> bytes::Bytes {
            current(h).types[EDS].resources[name].encoded.clone()
        };
        let v1 = "outbound|80|v1|web.shop.svc.cluster.local";
        let all = "outbound|80||web.shop.svc.cluster.local";
        assert_ne!(eds(&mut handles[0], v1), eds(&mut handles[3], v1));
        assert_ne!(eds(&mut handles[3], all), eds(&mut handles[5], all));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn debouncer_waits_for_quiet_but_not_longer_than_max() {
        let cfg = DebounceConfig {
            quiet: ms(100),
            max: ms(1000),
            isolated_quiet: ms(100),
        };
        let t0 = Instant::now();
        let mut d = Debouncer::new(cfg);
        assert_eq!(d.deadline(), None);
        d.on_change(t0);
        assert_eq!(d.deadline(), Some(t0 + ms(100)));
        d.on_change(t0 + ms(50));
        assert_eq!(d.deadline(), Some(t0 + ms(150)));
        // A steady trickle of changes is cut off at max.
        d.on_change(t0 + ms(950));
        assert_eq!(d.deadline(), Some(t0 + ms(1000)));
        assert_eq!(d.take(t0 + ms(1000)), Some(t0));
        assert_eq!(d.deadline(), None);
    }

    #[test]
    fn a_change_alone_waits_less_than_a_stream_of_changes() {
        let cfg = DebounceConfig {
            quiet: ms(50),
            max: ms(300),
            isolated_quiet: ms(20),
        };
        let t0 = Instant::now();
        let mut d = Debouncer::new(cfg);
        // The first change ever, and one 80 ms after the last push: short waits.
        d.on_change(t0);
        assert_eq!(d.deadline(), Some(t0 + ms(20)));
        assert_eq!(d.take(t0 + ms(20)), Some(t0));
        d.on_change(t0 + ms(100));
        assert_eq!(d.deadline(), Some(t0 + ms(120)));
        // A change within the short wait extends it, up to max.
        d.on_change(t0 + ms(110));
        assert_eq!(d.deadline(), Some(t0 + ms(130)));
        assert_eq!(d.take(t0 + ms(130)), Some(t0 + ms(100)));
        // Changes 33 ms apart: the first comes 3 ms after that push, so the batch waits for
        // the long quiet, which the stream never leaves: it is cut off at max.
        let mut at = 133;
        d.on_change(t0 + ms(at));
        assert_eq!(d.deadline(), Some(t0 + ms(at + 50)));
        while at + 33 < 133 + 300 {
            at += 33;
            d.on_change(t0 + ms(at));
        }
        assert_eq!(d.deadline(), Some(t0 + ms(133 + 300)));
        assert_eq!(d.take(t0 + ms(433)), Some(t0 + ms(133)));
        // The stream goes on: the next batch opens 32 ms after the push, batched again.
        d.on_change(t0 + ms(465));
        assert_eq!(d.deadline(), Some(t0 + ms(515)));
    }

    /// The value of the sample `line_start` (name and labels) in `text`, if present.
    fn sample(text: &str, line_start: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
    }

    #[test]
    fn pushes_count_their_triggers_by_reason_and_time_the_queue() {
        let mut p = pusher(&[]);
        p.apply(SourceEvent::Ready);
        let hub = Arc::clone(p.hub());
        let _a = hub.connect(node("shop", "a"), Protocol::Sotw);
        p.serve_waiting();
        let metrics = || hub.metrics().encode().expect("encodes");
        assert_eq!(
            sample(&metrics(), "meshplane_xds_proxy_queue_seconds_count"),
            Some(1.0),
            "a first config counts its wait since the connection"
        );
        let change = p.apply(web_endpoints("198.18.1.9"));
        p.push(Instant::now(), &change);
        p.apply(event(
            "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: default, namespace: shop}\nspec: {egress: [{hosts: [\"./*\"]}]}\n",
        ));
        // Outside the tenant: no proxy receives it, so it triggers nothing.
        p.apply(event(
            "apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: elsewhere}\nspec: {clusterIP: 198.19.0.99, ports: [{port: 80}]}\n",
        ));
        let text = metrics();
        let triggers = |reason: &str| {
            sample(
                &text,
                &format!("meshplane_xds_push_triggers_total{{reason=\"{reason}\"}}"),
            )
        };
        assert_eq!(triggers("endpointslice"), Some(1.0), "{text}");
        assert_eq!(triggers("sidecar"), Some(1.0), "{text}");
        assert_eq!(triggers("service"), Some(0.0), "{text}");
        assert_eq!(
            sample(&text, "meshplane_xds_proxy_queue_seconds_count"),
            Some(2.0),
            "the endpoint push handed shop's proxy a snapshot: {text}"
        );
    }
}
