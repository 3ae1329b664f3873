//! The push loop: the one owner of the generator. It folds source events, debounces, renders
//! and hands snapshots to the proxies' `watch` channels; it also renders the first config of
//! every proxy that connects.
//!
//! A push replaces a proxy's snapshot only when its content changed (the stream diffs per
//! type). Proxies sharing a scope share one rendered config and one snapshot per push. An
//! endpoint-only change touches only the proxies holding a changed EDS cluster, and only their
//! EDS: the other types of their snapshot are kept as they are.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::generator::{Change, ChangeKind, ConfigGenerator};
use super::hub::{Hub, Target};
use crate::ads::snapshot::{Snapshot, TypeSnapshot};
use crate::model::{ProxyConfig, SourceEvent};

/// Position of EDS in [`crate::model::type_url::ORDER`].
const EDS: usize = 1;

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
    /// A pusher for `hub` over `generator`; publishes the generator's members at once.
    pub fn new(hub: Arc<Hub>, generator: Box<dyn ConfigGenerator>) -> Self {
        hub.publish_members(generator.members());
        hub.publish_envoy_filter_policy(generator.envoy_filter_policy());
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
            self.hub.publish_diagnostics(self.generator.diagnostics());
            self.hub
                .publish_envoy_filter_policy(self.generator.envoy_filter_policy());
        }
        if change.members_changed {
            self.hub.publish_members(self.generator.members());
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
        for (target, connected_at) in self.hub.take_waiting() {
            let next = Arc::new(self.render(&target, None, now, &mut shared).retimed(now));
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
    ) -> Arc<Snapshot> {
        let config = self.generator.render(&target.node);
        let key = Arc::as_ptr(&config) as usize;
        if let Some((_, snapshot)) = shared.get(&key) {
            return Arc::clone(snapshot);
        }
        let mut snapshot = Snapshot::reusing(&config, changed_at, current);
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
        let mut pushed = 0usize;
        for target in self.hub.targets() {
            let current = Arc::clone(&target.snapshot.borrow());
            if current.epoch.is_none() {
                // Not served yet: its first config comes from `serve_waiting`.
                continue;
            }
            let next = self.render(&target, Some(&current), changed_at, &mut shared);
            pushed += usize::from(self.offer(&target, next));
        }
        self.latest = shared;
        tracing::debug!(proxies = pushed, "pushed changed configs");
    }

    /// Pushes a change of the endpoints of `clusters` only: proxies holding none of them are
    /// left alone; the others get their EDS re-rendered, the rest of their snapshot kept.
    /// A proxy whose snapshot predates the last configuration change is fully re-rendered.
    pub fn push_endpoints(&mut self, changed_at: Instant, clusters: &BTreeSet<String>) {
        // Cached configs holding these clusters were patched: their snapshots are stale.
        self.latest.clear();
        let mut full = Shared::new();
        let mut eds: Shared<Arc<TypeSnapshot>> = Shared::new();
        let mut pushed = 0usize;
        for target in self.hub.targets() {
            let current = Arc::clone(&target.snapshot.borrow());
            let next = match current.epoch {
                None => continue,
                Some(e) if e != self.epoch => {
                    self.render(&target, Some(&current), changed_at, &mut full)
                }
                Some(_)
                    if clusters
                        .iter()
                        .any(|c| current.types[EDS].resources.contains_key(c)) =>
                {
                    let config = self.generator.render(&target.node);
                    let key = Arc::as_ptr(&config) as usize;
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
                }
                Some(_) => continue,
            };
            pushed += usize::from(self.offer(&target, next));
        }
        tracing::debug!(
            proxies = pushed,
            clusters = clusters.len(),
            "pushed changed endpoints"
        );
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
            () = crate::ads::stream::shutting_down(&mut shutdown) => break,
            () = hub.connects.notified() => pusher.serve_waiting(),
            _ = sleep_until_opt(deadline) => {
                let change = std::mem::take(&mut pending);
                if let Some(first) = debouncer.take() {
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
/// revision) or `resync`. `Resync` and `Ready` change nothing by themselves.
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
        SourceEvent::Resync { .. } | SourceEvent::Ready => None,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::tracker::Protocol;
    use crate::index::TenantIndex;
    use crate::metrics::Metrics;
    use crate::model::{type_url, ProxyNode};
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
