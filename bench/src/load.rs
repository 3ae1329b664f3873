//! ADS load generator: many proxy-like streams against one xds-server.
//!
//! Each stream identifies itself like a meshplane sidecar (node id and metadata of contract 7),
//! subscribes like Envoy (CDS and LDS wildcard first, EDS once clusters arrived, RDS once
//! listeners arrived; the server accepts wildcard for all four, so EDS/RDS ask for `*` instead
//! of decoding names) and ACKs every response without decoding the resources: it reads responses
//! as [`crate::ads_view`] views (each resource's bytes a slice of the received frame), counts
//! bytes and keeps nonces and versions. Optionally it NACKs every EDS response after the first.
//!
//! Streams identify as Envoy (`Node.user_agent_name`), so the server serves delta streams Virtual
//! Host Discovery: route configurations arrive as stubs pointing to VHDS over ADS. Like Envoy, a
//! delta stream then reads just the `vhds` field of each route configuration, subscribes to the
//! virtual hosts of those that have it (VHDS resource names `<route config>/<vhost>`, subscribed
//! by namespace: the route configuration's name) on the same stream, and counts as synced only
//! once the server answered every such subscription (Envoy's listeners wait for it too).
//!
//! Convergence is measured against [`ChangeLog`]: the driver registers each mutation (with
//! byte patterns that appear, or disappear, on the wire once the server applied it) just
//! before renaming the file; every affected stream records when it ACKed a response that
//! satisfies all of the change's conditions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Struct, Value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshplane_ca::grpc::instance_http2;
use prost::Message;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::ads_view::{AdsClient, DeltaResponseView, Received};

/// Type URLs in ADS push order.
pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const TYPES: [&str; 4] = [CDS, EDS, LDS, RDS];
pub const TYPE_NAMES: [&str; 4] = ["cds", "eds", "lds", "rds"];
/// Virtual hosts (VHDS), which delta streams request for route configurations that point to
/// VHDS. Not in [`TYPES`]: reports count them under RDS (see [`stat_index`]).
pub const VHDS: &str = "type.googleapis.com/envoy.config.route.v3.VirtualHost";

/// Largest response the client accepts (big unscoped tenants send megabytes of CDS/EDS).
const MAX_MESSAGE: usize = 512 * 1024 * 1024;

fn type_index(type_url: &str) -> Option<usize> {
    TYPES.iter().position(|t| *t == type_url)
}

/// Slot of a response type in the per-type report arrays ([`StreamReport::responses`], ...) and
/// in [`Condition::type_index`]: VHDS responses count under RDS (3), as the rest of the route
/// configuration, so the per-type tables keep their four columns whichever way routes arrive.
fn stat_index(type_url: &str) -> Option<usize> {
    type_index(type_url).or((type_url == VHDS).then_some(3))
}

/// The part of a `RouteConfiguration` a VHDS client reads: decoding only these fields skips the
/// (possibly inline, possibly large) virtual hosts without allocating them.
#[derive(Clone, PartialEq, prost::Message)]
struct RouteConfigurationHead {
    #[prost(message, optional, tag = "9")]
    vhds: Option<envoy_types::pb::envoy::config::route::v3::Vhds>,
}

/// The name of an encoded xDS resource: field 1 of clusters, listeners, route configurations
/// and assignments (`cluster_name`) alike.
#[derive(Clone, PartialEq, prost::Message)]
struct Named {
    #[prost(string, tag = "1")]
    name: String,
}

/// The length-delimited fields numbered `tag` of an encoded message, as slices of it, in order;
/// the walk ends at the first malformed field. Read without decoding into messages: a name check
/// then allocates nothing (decoding 100 virtual host names per response into `String`s was
/// most of what the check cost).
fn fields(mut buf: &[u8], tag: u32) -> impl Iterator<Item = &[u8]> {
    use prost::encoding::{decode_key, decode_varint, WireType};
    std::iter::from_fn(move || {
        while !buf.is_empty() {
            let (number, wire_type) = decode_key(&mut buf).ok()?;
            let len = match wire_type {
                WireType::Varint => {
                    decode_varint(&mut buf).ok()?;
                    continue;
                }
                WireType::SixtyFourBit => 8,
                WireType::ThirtyTwoBit => 4,
                WireType::LengthDelimited => usize::try_from(decode_varint(&mut buf).ok()?).ok()?,
                WireType::StartGroup | WireType::EndGroup => return None,
            };
            let (payload, rest) = buf.split_at_checked(len)?;
            buf = rest;
            if number == tag && wire_type == WireType::LengthDelimited {
                return Some(payload);
            }
        }
        None
    })
}

fn resource_name(encoded: &[u8]) -> String {
    Named::decode(encoded).map(|n| n.name).unwrap_or_default()
}

/// Whether an encoded `RouteConfiguration` points to VHDS (undecodable: no).
fn has_vhds(encoded: &[u8]) -> bool {
    RouteConfigurationHead::decode(encoded).is_ok_and(|rc| rc.vhds.is_some())
}

/// ADS variant of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Sotw,
    Delta,
}

/// Which namespaces' services a stream sees (to decide which changes affect it).
#[derive(Clone, Debug)]
pub enum Visibility {
    All,
    Namespaces(Vec<String>),
}

impl Visibility {
    fn sees(&self, namespace: &str) -> bool {
        match self {
            Visibility::All => true,
            Visibility::Namespaces(list) => list.iter().any(|n| n == namespace),
        }
    }
}

/// One simulated proxy.
#[derive(Clone, Debug)]
pub struct StreamSpec {
    pub namespace: String,
    pub pod: String,
    pub ip: String,
    pub protocol: Protocol,
    /// NACK every EDS response after the first.
    pub nack: bool,
    pub visibility: Visibility,
    /// Keep the last full (SotW) response of each type, for offline encode-cost measurement.
    pub capture: bool,
}

/// Settings shared by all streams of one load run.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// `host:port` of the ADS server.
    pub addr: String,
    pub tenant: String,
    pub revision: String,
    /// Streams multiplexed on one HTTP/2 connection (1 = one connection per proxy, like Envoy).
    pub streams_per_connection: usize,
    /// Connection attempts in flight at once during the connect storm.
    pub connect_concurrency: usize,
    /// Whether the simulated proxies accept zstd-compressed responses, as the node agent
    /// that carries a meshed pod's ADS does (Envoy talking to the instance directly does not).
    pub accept_zstd: bool,
}

/// What must hold on the wire for a change to count as applied.
#[derive(Clone, Debug)]
pub struct Condition {
    /// Index in [`TYPES`]; 3 (RDS) also matches VHDS responses.
    pub type_index: usize,
    pub pattern: Vec<u8>,
    /// True: some resource contains `pattern`. False: no resource contains it any more (SotW),
    /// or a removed resource name contains it (delta).
    pub present: bool,
    /// Which part of a resource must contain `pattern`.
    pub within: Within,
}

/// Which part of a resource a [`Condition`] searches. Searching names rather than whole
/// encodings keeps the generator's work per response at the size of the names: a state-of-the-
/// world push resends every cluster and virtual host, and scanning those bytes for every
/// pending change was a fifth of the generator's CPU in S1's fan-out to every proxy, CPU the
/// server under test shares the machine with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Within {
    /// Anywhere in its encoding.
    #[default]
    Encoding,
    /// Its name (field 1 of every xDS resource type).
    Name,
    /// A virtual host's name: those inline in a `RouteConfiguration`, or a VHDS virtual host's.
    VirtualHostName,
}

/// A mutation the driver made, with what streams must see.
#[derive(Debug)]
pub struct Change {
    pub id: usize,
    /// Scenario-defined kind (`endpoint`, `service-add`, ...), for grouping results.
    pub kind: &'static str,
    pub namespace: String,
    pub conditions: Vec<Condition>,
    /// A searcher per condition's pattern, built once for every stream that checks it.
    finders: Vec<memchr::memmem::Finder<'static>>,
    /// Just before the file rename.
    pub at: Instant,
}

impl Change {
    pub fn new(
        id: usize,
        kind: &'static str,
        namespace: &str,
        conditions: Vec<Condition>,
        at: Instant,
    ) -> Self {
        let finders = conditions
            .iter()
            .map(|c| memchr::memmem::Finder::new(&c.pattern).into_owned())
            .collect();
        Change {
            id,
            kind,
            namespace: namespace.to_string(),
            conditions,
            finders,
            at,
        }
    }
}

/// Append-only log of changes, read by every stream.
///
/// It also counts the (stream, change) pairs that must converge: a change is owed by every
/// stream that was synced when it was registered and sees its namespace. Joining (at sync)
/// and registering take the same lock, so each pair is counted exactly once.
#[derive(Debug, Default)]
pub struct ChangeLog {
    inner: RwLock<LogInner>,
    expected_pairs: AtomicUsize,
    converged_pairs: AtomicUsize,
}

#[derive(Debug, Default)]
struct LogInner {
    changes: Vec<Arc<Change>>,
    /// What each synced stream sees.
    watchers: Vec<Visibility>,
}

impl ChangeLog {
    /// Registers a change made now; call right before making it.
    pub fn register(
        &self,
        kind: &'static str,
        namespace: &str,
        conditions: Vec<Condition>,
    ) -> usize {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let id = inner.changes.len();
        inner.changes.push(Arc::new(Change::new(
            id,
            kind,
            namespace,
            conditions,
            Instant::now(),
        )));
        let owed = inner.watchers.iter().filter(|v| v.sees(namespace)).count();
        self.expected_pairs.fetch_add(owed, Ordering::Relaxed);
        id
    }

    /// A stream synced: it owes every change registered from now on that it sees. Returns
    /// the id of the first such change.
    fn join(&self, visibility: &Visibility) -> usize {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.watchers.push(visibility.clone());
        inner.changes.len()
    }

    fn since(&self, from: usize) -> Vec<Arc<Change>> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner
            .changes
            .get(from..)
            .map(<[_]>::to_vec)
            .unwrap_or_default()
    }

    pub fn all(&self) -> Vec<Arc<Change>> {
        self.since(0)
    }

    /// How many (stream, change) pairs must converge.
    pub fn owed_pairs(&self) -> usize {
        self.expected_pairs.load(Ordering::Relaxed)
    }

    /// Whether every owed (stream, change) pair has converged.
    pub fn all_converged(&self) -> bool {
        self.converged_pairs.load(Ordering::Relaxed) >= self.expected_pairs.load(Ordering::Relaxed)
    }
}

/// What one stream saw.
#[derive(Clone, Debug, Default)]
pub struct StreamReport {
    pub index: usize,
    pub protocol: Option<Protocol>,
    pub nack: bool,
    /// From the start of the run to the ACK of the first response of every type (and, on a
    /// delta stream whose route configurations use VHDS, of the answer to every VHDS
    /// subscription).
    pub synced_after: Option<Duration>,
    /// Per type of [`TYPES`]; VHDS responses count under RDS (index 3).
    pub responses: [u64; 4],
    /// Per type of [`TYPES`]; VHDS responses count under RDS (index 3).
    pub bytes: [u64; 4],
    /// Bytes of the first response of each type (the initial config; a later SotW EDS
    /// response carries only what changed).
    pub first_bytes: [u64; 4],
    /// Responses after the stream's first of each type (the first VHDS response, too, is part
    /// of the initial state: only later ones count under RDS).
    pub responses_after_sync: [u64; 4],
    /// Bytes of the responses received once the stream was synced: what changes cost it, not
    /// its initial configuration (which, with VHDS, arrives in several responses of a slot).
    pub bytes_after_sync: [u64; 4],
    pub nacks_sent: u64,
    /// Changes this stream had to see (registered while it was synced).
    pub expected_changes: usize,
    /// The changes this stream saw applied, in the order they completed.
    pub converged: Vec<Converged>,
    /// Receive-to-ACK-sent time of every response (the client's own share of a push).
    pub ack_delay_max: Duration,
    pub error: Option<String>,
    /// With [`StreamSpec::capture`]: encoded resources of the last response of each type (of
    /// endpoints, every assignment held: SotW sends the changed ones).
    pub captured: [Vec<Vec<u8>>; 4],
}

/// One change one stream saw applied.
#[derive(Clone, Debug)]
pub struct Converged {
    /// The change's id in the [`ChangeLog`].
    pub change: usize,
    /// From the mutation to the ACK that completed it.
    pub after: Duration,
    /// From the mutation to the ACK of the response that met each of the change's conditions,
    /// in [`Change::conditions`] order (where a change's time goes: cluster, endpoints, route).
    pub conditions: Vec<Duration>,
}

/// Counters readable while the run goes on.
#[derive(Debug, Default)]
pub struct LiveCounters {
    pub connected: AtomicUsize,
    pub synced: AtomicUsize,
    pub failed: AtomicUsize,
    pub responses: AtomicU64,
    pub bytes: AtomicU64,
}

/// A running load; [`LoadHandle::stop`] ends it and returns the reports.
pub struct LoadHandle {
    pub live: Arc<LiveCounters>,
    pub changes: Arc<ChangeLog>,
    pub started: Instant,
    stop: watch::Sender<bool>,
    reports: Arc<Mutex<Vec<StreamReport>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    streams: usize,
}

impl LoadHandle {
    /// Waits until every stream synced (or failed), at most `timeout`. Returns the synced count.
    pub async fn wait_synced(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let synced = self.live.synced.load(Ordering::Relaxed);
            let failed = self.live.failed.load(Ordering::Relaxed);
            if synced + failed >= self.streams || Instant::now() >= deadline {
                return synced;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every stream has converged on every change it owes, at most `timeout`
    /// (streams that NACK or drop never do: the timeout bounds the wait). Returns whether all
    /// converged.
    pub async fn wait_converged(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.changes.all_converged() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ends every stream and collects the reports, sorted by stream index.
    pub async fn stop(self) -> Vec<StreamReport> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            // A panicking stream task loses only its own report.
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        let mut reports =
            std::mem::take(&mut *self.reports.lock().unwrap_or_else(|e| e.into_inner()));
        reports.sort_by_key(|r| r.index);
        reports
    }
}

/// Node of a stream, as meshplane's injector would set it (contract 7).
pub fn node_for(spec: &StreamSpec, tenant: &str, revision: &str) -> Node {
    let s = |v: &str| Value {
        kind: Some(ValueKind::StringValue(v.to_string())),
    };
    let labels = Struct {
        fields: [("app".to_string(), s("bench-client"))]
            .into_iter()
            .collect(),
    };
    let metadata = Struct {
        fields: [
            ("NAMESPACE", s(&spec.namespace)),
            ("POD_NAME", s(&spec.pod)),
            ("TENANT", s(tenant)),
            ("REVISION", s(revision)),
            ("CAPTURE_MODE", s("DEFAULT")),
            (
                "LABELS",
                Value {
                    kind: Some(ValueKind::StructValue(labels)),
                },
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    };
    Node {
        id: format!(
            "sidecar~{}~{}.{ns}~{ns}.svc.cluster.local",
            spec.ip,
            spec.pod,
            ns = spec.namespace
        ),
        cluster: format!("{}.{}", spec.pod, spec.namespace),
        metadata: Some(metadata),
        // The server serves VHDS to delta streams of Envoys only (SotW ones are unaffected).
        user_agent_name: "envoy".to_string(),
        ..Default::default()
    }
}

/// Starts every stream (connections are opened with bounded concurrency) and returns at once.
pub fn start(config: LoadConfig, specs: Vec<StreamSpec>) -> LoadHandle {
    let live = Arc::new(LiveCounters::default());
    let changes = Arc::new(ChangeLog::default());
    let reports = Arc::new(Mutex::new(Vec::with_capacity(specs.len())));
    let (stop, stop_rx) = watch::channel(false);
    let started = Instant::now();
    let permits = Arc::new(Semaphore::new(config.connect_concurrency.max(1)));
    let per_conn = config.streams_per_connection.max(1);
    let streams = specs.len();
    let config = Arc::new(config);
    let mut tasks = Vec::new();
    for (group_index, group) in specs.chunks(per_conn).enumerate() {
        let group: Vec<StreamSpec> = group.to_vec();
        let ctx = StreamCtx {
            config: Arc::clone(&config),
            live: Arc::clone(&live),
            changes: Arc::clone(&changes),
            reports: Arc::clone(&reports),
            stop: stop_rx.clone(),
            started,
        };
        let permits = Arc::clone(&permits);
        tasks.push(tokio::spawn(async move {
            let first = group_index * per_conn;
            let channel = {
                // Closed only when dropped, which never happens while we hold it.
                let _permit = permits.acquire().await;
                connect(&ctx.config.addr).await
            };
            let channel = match channel {
                Ok(c) => c,
                Err(e) => {
                    for (i, spec) in group.iter().enumerate() {
                        ctx.fail(first + i, spec, format!("connect: {e}"));
                    }
                    return;
                }
            };
            let runs = group.into_iter().enumerate().map(|(i, spec)| {
                let ctx = ctx.clone();
                let channel = channel.clone();
                async move { ctx.run(first + i, spec, channel).await }
            });
            futures::future::join_all(runs).await;
        }));
    }
    LoadHandle {
        live,
        changes,
        started,
        stop,
        reports,
        tasks,
        streams,
    }
}

async fn connect(addr: &str) -> Result<Channel, tonic::transport::Error> {
    let mut last = None;
    // The server may still be binding its port, or the accept queue may overflow in a storm.
    for attempt in 0..20u64 {
        // The node agent's HTTP/2 settings: they decide how the server writes large pushes.
        match instance_http2(Endpoint::from_shared(format!("http://{addr}"))?)
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .connect()
            .await
        {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
    }
    match last {
        Some(e) => Err(e),
        None => {
            instance_http2(Endpoint::from_shared(format!("http://{addr}"))?)
                .connect()
                .await
        }
    }
}

#[derive(Clone)]
struct StreamCtx {
    config: Arc<LoadConfig>,
    live: Arc<LiveCounters>,
    changes: Arc<ChangeLog>,
    reports: Arc<Mutex<Vec<StreamReport>>>,
    stop: watch::Receiver<bool>,
    started: Instant,
}

/// Per-change progress on one stream.
struct Watching {
    change: Arc<Change>,
    met: Vec<Option<Instant>>,
}

/// Protocol-independent per-stream bookkeeping.
struct Tracker {
    capture: bool,
    /// With `capture`: the assignments held, by name (a SotW EDS response carries what
    /// changed).
    captured_endpoints: BTreeMap<String, Vec<u8>>,
    report: StreamReport,
    visibility: Visibility,
    next_change: usize,
    watching: Vec<Watching>,
    acked_types: [bool; 4],
    /// VHDS subscriptions (route configuration names) not yet answered by an ACKed VHDS
    /// response; the stream is not synced while there are any. Kept up to date by `run_delta`.
    vhds_pending: usize,
    /// Whether a VHDS response arrived (the first one is not counted as after sync).
    vhds_seen: bool,
    synced: bool,
    /// Counted in `LiveCounters::connected` (from the first response on).
    connected: bool,
}

/// One response, seen through the lens of the conditions.
struct Seen<'a> {
    /// Report slot ([`stat_index`]).
    type_index: usize,
    /// A VHDS response (counted under RDS).
    vhds: bool,
    bytes: u64,
    /// Encoded resource values.
    values: Vec<&'a [u8]>,
    /// Delta: names the server removed.
    removed: &'a [String],
    delta: bool,
}

impl Tracker {
    fn new(index: usize, spec: &StreamSpec) -> Self {
        Tracker {
            capture: spec.capture,
            captured_endpoints: BTreeMap::new(),
            report: StreamReport {
                index,
                protocol: Some(spec.protocol),
                nack: spec.nack,
                ..Default::default()
            },
            visibility: spec.visibility.clone(),
            next_change: 0,
            watching: Vec::new(),
            acked_types: [false; 4],
            vhds_pending: 0,
            vhds_seen: false,
            synced: false,
            connected: false,
        }
    }

    /// Whether to NACK this response (NACKing clients reject every EDS response after the first).
    fn should_nack(&self, type_index: usize) -> bool {
        self.report.nack && type_index == 1 && self.report.responses[1] > 0
    }

    /// Folds a response; `acked_at` is when our answer went out.
    fn on_response(
        &mut self,
        seen: &Seen<'_>,
        received: Instant,
        acked_at: Instant,
        nacked: bool,
        ctx: &StreamCtx,
    ) {
        let (changes, live) = (&*ctx.changes, &*ctx.live);
        let t = seen.type_index;
        if !self.connected {
            self.connected = true;
            live.connected.fetch_add(1, Ordering::Relaxed);
        }
        let first = if seen.vhds {
            !std::mem::replace(&mut self.vhds_seen, true)
        } else {
            self.report.responses[t] == 0
        };
        if first && !seen.vhds {
            self.report.first_bytes[t] = seen.bytes;
        }
        if !first {
            self.report.responses_after_sync[t] += 1;
        }
        self.report.responses[t] += 1;
        self.report.bytes[t] += seen.bytes;
        if self.synced {
            self.report.bytes_after_sync[t] += seen.bytes;
        }
        live.responses.fetch_add(1, Ordering::Relaxed);
        live.bytes.fetch_add(seen.bytes, Ordering::Relaxed);
        self.report.ack_delay_max = self.report.ack_delay_max.max(acked_at - received);
        if self.capture && !seen.delta && t == 1 {
            for v in &seen.values {
                self.captured_endpoints.insert(resource_name(v), v.to_vec());
            }
            self.report.captured[t] = self.captured_endpoints.values().cloned().collect();
        } else if self.capture && !seen.delta {
            self.report.captured[t] = seen.values.iter().map(|v| v.to_vec()).collect();
        }
        if nacked {
            self.report.nacks_sent += 1;
        } else {
            self.acked_types[t] = true;
        }
        if !self.synced && self.acked_types.iter().all(|a| *a) && self.vhds_pending == 0 {
            self.synced = true;
            self.report.synced_after = Some(acked_at - ctx.started);
            live.synced.fetch_add(1, Ordering::Relaxed);
            // Changes made before we synced are part of the initial state, not ours to time.
            self.next_change = changes.join(&self.visibility);
        }
        if !self.synced {
            return;
        }
        for change in changes.since(self.next_change) {
            self.next_change = change.id + 1;
            if self.visibility.sees(&change.namespace) {
                self.report.expected_changes += 1;
                let met = vec![None; change.conditions.len()];
                self.watching.push(Watching { change, met });
            }
        }
        if nacked {
            return;
        }
        let mut done = Vec::new();
        for (wi, w) in self.watching.iter_mut().enumerate() {
            let change = &w.change;
            for (ci, (cond, finder)) in change.conditions.iter().zip(&change.finders).enumerate() {
                if w.met[ci].is_none() && cond.type_index == t && holds(cond, finder, seen) {
                    w.met[ci] = Some(acked_at);
                }
            }
            if w.met.iter().all(Option::is_some) {
                let conditions: Vec<Duration> = w
                    .met
                    .iter()
                    .flatten()
                    .map(|m| m.saturating_duration_since(w.change.at))
                    .collect();
                self.report.converged.push(Converged {
                    change: w.change.id,
                    after: conditions.iter().max().copied().unwrap_or_default(),
                    conditions,
                });
                changes.converged_pairs.fetch_add(1, Ordering::Relaxed);
                done.push(wi);
            }
        }
        for wi in done.into_iter().rev() {
            self.watching.swap_remove(wi);
        }
    }
}

/// Whether `seen` meets `cond`; `finder` searches for its pattern.
fn holds(cond: &Condition, finder: &memchr::memmem::Finder<'_>, seen: &Seen<'_>) -> bool {
    // Every xDS resource type, and a virtual host, holds its name in field 1.
    let named = |v: &[u8]| {
        fields(v, 1)
            .next()
            .is_some_and(|n| finder.find(n).is_some())
    };
    let contains = |v: &[u8]| match (cond.within, seen.vhds) {
        (Within::Encoding, _) => finder.find(v).is_some(),
        (Within::Name, _) | (Within::VirtualHostName, true) => named(v),
        // A route configuration's virtual hosts are its field 2.
        (Within::VirtualHostName, false) => fields(v, 2).any(named),
    };
    let found = seen.values.iter().any(|v| contains(v));
    match (cond.present, seen.delta) {
        (true, _) => found,
        (false, false) => !found,
        (false, true) => seen
            .removed
            .iter()
            .any(|n| finder.find(n.as_bytes()).is_some()),
    }
}

impl StreamCtx {
    fn fail(&self, index: usize, spec: &StreamSpec, error: String) {
        self.live.failed.fetch_add(1, Ordering::Relaxed);
        let mut t = Tracker::new(index, spec);
        t.report.error = Some(error);
        self.push_report(t.report);
    }

    fn push_report(&self, report: StreamReport) {
        self.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(report);
    }

    async fn run(self, index: usize, spec: StreamSpec, channel: Channel) {
        let client = AdsClient::new(channel, MAX_MESSAGE, self.config.accept_zstd);
        let node = node_for(&spec, &self.config.tenant, &self.config.revision);
        let mut tracker = Tracker::new(index, &spec);
        let result = match spec.protocol {
            Protocol::Sotw => self.run_sotw(client, node, &mut tracker).await,
            Protocol::Delta => self.run_delta(client, node, &mut tracker).await,
        };
        if let Err(e) = result {
            tracker.report.error = Some(e);
            if !tracker.synced {
                self.live.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if tracker.connected {
            self.live.connected.fetch_sub(1, Ordering::Relaxed);
        }
        self.push_report(tracker.report);
    }

    async fn run_sotw(
        &self,
        mut client: AdsClient,
        node: Node,
        tracker: &mut Tracker,
    ) -> Result<(), String> {
        let (tx, rx) = mpsc::channel::<DiscoveryRequest>(16);
        let subscribe = |type_url: &str, node: Option<Node>| DiscoveryRequest {
            node,
            type_url: type_url.to_string(),
            ..Default::default()
        };
        // Envoy opens with CDS and LDS (wildcard); node only on the first message.
        send(&tx, subscribe(CDS, Some(node))).await?;
        send(&tx, subscribe(LDS, None)).await?;
        let mut inbound = client
            .sotw(ReceiverStream::new(rx))
            .await
            .map_err(|s| format!("open: {s}"))?;
        let mut acked_version = [String::new(), String::new(), String::new(), String::new()];
        let mut subscribed = [true, false, true, false];
        let mut stop = self.stop.clone();
        loop {
            let Received {
                message: msg,
                wire_len,
            } = tokio::select! {
                m = inbound.message() => match m {
                    Ok(Some(m)) => m,
                    Ok(None) => return Err("server closed the stream".into()),
                    Err(s) => return Err(format!("stream: {s}")),
                },
                _ = stop.wait_for(|s| *s) => return Ok(()),
            };
            let received = Instant::now();
            let Some(t) = type_index(&msg.type_url) else {
                continue;
            };
            let nack = tracker.should_nack(t);
            let request = DiscoveryRequest {
                type_url: msg.type_url.clone(),
                response_nonce: msg.nonce.clone(),
                version_info: if nack {
                    acked_version[t].clone()
                } else {
                    msg.version_info.clone()
                },
                resource_names: if t == 1 || t == 3 {
                    vec!["*".into()]
                } else {
                    Vec::new()
                },
                error_detail: nack.then(|| RpcStatus {
                    code: tonic::Code::InvalidArgument as i32,
                    message: "meshplane-bench: rejected on purpose".into(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            send(&tx, request).await?;
            let acked_at = Instant::now();
            if !nack {
                acked_version[t] = msg.version_info.clone();
            }
            // First clusters → ask for endpoints; first listeners → ask for routes.
            for (from, to) in [(0usize, 1usize), (2, 3)] {
                if t == from && !subscribed[to] {
                    subscribed[to] = true;
                    let mut req = subscribe(TYPES[to], None);
                    req.resource_names = vec!["*".into()];
                    send(&tx, req).await?;
                }
            }
            let seen = Seen {
                type_index: t,
                vhds: false,
                bytes: wire_len as u64,
                values: msg.resources.iter().map(|a| &a.value[..]).collect(),
                removed: &[],
                delta: false,
            };
            tracker.on_response(&seen, received, acked_at, nack, self);
        }
    }

    async fn run_delta(
        &self,
        mut client: AdsClient,
        node: Node,
        tracker: &mut Tracker,
    ) -> Result<(), String> {
        let (tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(16);
        let subscribe =
            |type_url: &str, node: Option<Node>, names: Vec<String>| DeltaDiscoveryRequest {
                node,
                type_url: type_url.to_string(),
                resource_names_subscribe: names,
                ..Default::default()
            };
        send(&tx, subscribe(CDS, Some(node), Vec::new())).await?;
        send(&tx, subscribe(LDS, None, Vec::new())).await?;
        let mut inbound = client
            .delta(ReceiverStream::new(rx))
            .await
            .map_err(|s| format!("open: {s}"))?;
        let mut subscribed = [true, false, true, false];
        let mut vhds = VhdsState::default();
        let mut stop = self.stop.clone();
        loop {
            let Received {
                message: msg,
                wire_len,
            } = tokio::select! {
                m = inbound.message() => match m {
                    Ok(Some(m)) => m,
                    Ok(None) => return Err("server closed the stream".into()),
                    Err(s) => return Err(format!("stream: {s}")),
                },
                _ = stop.wait_for(|s| *s) => return Ok(()),
            };
            let received = Instant::now();
            let Some(t) = stat_index(&msg.type_url) else {
                continue;
            };
            let is_vhds = msg.type_url == VHDS;
            let nack = tracker.should_nack(t);
            let request = DeltaDiscoveryRequest {
                type_url: msg.type_url.clone(),
                response_nonce: msg.nonce.clone(),
                error_detail: nack.then(|| RpcStatus {
                    code: tonic::Code::InvalidArgument as i32,
                    message: "meshplane-bench: rejected on purpose".into(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            send(&tx, request).await?;
            let acked_at = Instant::now();
            for (from, to) in [(0usize, 1usize), (2, 3)] {
                if t == from && !subscribed[to] {
                    subscribed[to] = true;
                    send(&tx, subscribe(TYPES[to], None, vec!["*".into()])).await?;
                }
            }
            if !nack {
                if is_vhds {
                    vhds.answered(&msg);
                } else if t == 3 {
                    // Like Envoy: ACK the route configurations, then subscribe to (or drop) the
                    // virtual hosts of those that point to VHDS, all in one request.
                    let (names_subscribe, names_unsubscribe) = vhds.routes(&msg);
                    if !names_subscribe.is_empty() || !names_unsubscribe.is_empty() {
                        let request = DeltaDiscoveryRequest {
                            type_url: VHDS.to_string(),
                            resource_names_subscribe: names_subscribe,
                            resource_names_unsubscribe: names_unsubscribe,
                            ..Default::default()
                        };
                        send(&tx, request).await?;
                    }
                }
            }
            tracker.vhds_pending = vhds.pending.len();
            let seen = Seen {
                type_index: t,
                vhds: is_vhds,
                bytes: wire_len as u64,
                values: msg
                    .resources
                    .iter()
                    .filter_map(|r| r.resource.as_ref().map(|a| &a.value[..]))
                    .collect(),
                removed: &msg.removed_resources,
                delta: true,
            };
            tracker.on_response(&seen, received, acked_at, nack, self);
        }
    }
}

/// VHDS subscriptions of a delta stream.
#[derive(Debug, Default)]
struct VhdsState {
    /// Route configurations that point to VHDS: the VHDS namespaces subscribed. (A delta RDS
    /// resource is named after its route configuration, which is what Envoy subscribes.)
    subscribed: std::collections::HashSet<String>,
    /// Subscribed namespaces no ACKed VHDS response answered yet.
    pending: std::collections::HashSet<String>,
}

impl VhdsState {
    /// Folds an ACKed RDS response: returns the namespaces to subscribe (route configurations
    /// that now point to VHDS) and to unsubscribe (removed, or back with inline virtual hosts).
    fn routes(&mut self, msg: &DeltaResponseView) -> (Vec<String>, Vec<String>) {
        let (mut add, mut drop) = (Vec::new(), Vec::new());
        for r in &msg.resources {
            let Some(any) = &r.resource else { continue };
            if has_vhds(&any.value) {
                if self.subscribed.insert(r.name.clone()) {
                    self.pending.insert(r.name.clone());
                    add.push(r.name.clone());
                }
            } else if self.subscribed.remove(&r.name) {
                self.pending.remove(&r.name);
                drop.push(r.name.clone());
            }
        }
        for name in &msg.removed_resources {
            if self.subscribed.remove(name) {
                self.pending.remove(name);
                drop.push(name.clone());
            }
        }
        (add, drop)
    }

    /// Folds an ACKed VHDS response: it answers the namespaces of the virtual hosts it carries
    /// or removes (`<route config>/<vhost>`); an empty one is the server's answer to a
    /// subscription with no virtual hosts, so it answers every pending namespace.
    fn answered(&mut self, msg: &DeltaResponseView) {
        if msg.resources.is_empty() && msg.removed_resources.is_empty() {
            self.pending.clear();
            return;
        }
        let names = msg.resources.iter().map(|r| &r.name);
        for name in names.chain(&msg.removed_resources) {
            if let Some((namespace, _)) = name.rsplit_once('/') {
                self.pending.remove(namespace);
            }
        }
    }
}

async fn send<T>(tx: &mpsc::Sender<T>, msg: T) -> Result<(), String> {
    tx.send(msg)
        .await
        .map_err(|_| "request stream closed".to_string())
}

#[cfg(test)]
mod tests {
    //! The client against a tiny in-process ADS server: it serves a per-type list of opaque
    //! resources, pushes when they change, and counts ACKs and NACKs. To delta streams it also
    //! serves virtual hosts (VHDS) by namespace, once it has some for a subscribed namespace.

    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{
        config_source::ConfigSourceSpecifier, AggregatedConfigSource, ConfigSource,
    };
    use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, Vhds, VirtualHost};
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
        AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
    };
    use envoy_types::pb::envoy::service::discovery::v3::Resource as DeltaResource;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };
    use envoy_types::pb::google::protobuf::Any;
    use std::collections::{HashMap, HashSet};
    use tokio_stream::wrappers::TcpListenerStream;
    use tonic::{Request, Response, Status, Streaming};

    /// Per-type resources as (name, bytes); the version is the generation counter.
    #[derive(Clone, Debug, Default)]
    struct Config {
        generation: u64,
        types: [Vec<(String, Vec<u8>)>; 4],
        /// VirtualHost resources (`<route config>/<vhost>`), for delta VHDS subscribers.
        vhosts: Vec<(String, Vec<u8>)>,
    }

    /// (subscribe, unsubscribe) names of a VHDS request.
    type VhdsRequest = (Vec<String>, Vec<String>);

    /// The fake's type URLs: [`TYPES`], then VHDS (delta only).
    const FAKE_TYPES: [&str; 5] = [CDS, EDS, LDS, RDS, VHDS];

    fn fake_type(type_url: &str) -> Option<usize> {
        FAKE_TYPES.iter().position(|t| *t == type_url)
    }

    /// Namespace of a VirtualHost resource name: up to its last '/'.
    fn vhds_namespace(name: &str) -> Option<&str> {
        name.rsplit_once('/').map(|(ns, _)| ns)
    }

    #[derive(Clone)]
    struct TestAds {
        config: watch::Receiver<Config>,
        acks: Arc<AtomicU64>,
        nacks: Arc<AtomicU64>,
        first_nodes: Arc<Mutex<Vec<Node>>>,
        /// Every delta VHDS request that changes subscriptions.
        vhds_requests: Arc<Mutex<Vec<VhdsRequest>>>,
        vhds_acks: Arc<AtomicU64>,
        /// Type URLs SotW streams requested that the fake does not serve.
        sotw_unknown: Arc<Mutex<Vec<String>>>,
    }

    fn any(t: usize, value: &[u8]) -> Any {
        Any {
            type_url: FAKE_TYPES[t].to_string(),
            value: value.to_vec(),
        }
    }

    #[tonic::async_trait]
    impl AggregatedDiscoveryService for TestAds {
        type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
        type DeltaAggregatedResourcesStream =
            ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

        async fn stream_aggregated_resources(
            &self,
            request: Request<Streaming<DiscoveryRequest>>,
        ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
            let mut inbound = request.into_inner();
            let (tx, rx) = mpsc::channel(16);
            let this = self.clone();
            tokio::spawn(async move {
                let mut config = this.config.clone();
                let mut subscribed = [false; 4];
                let mut sent = [None::<u64>; 4];
                let mut nonce = 0u64;
                loop {
                    let current = config.borrow_and_update().clone();
                    for t in 0..4 {
                        if subscribed[t] && sent[t] != Some(current.generation) {
                            sent[t] = Some(current.generation);
                            nonce += 1;
                            let resp = DiscoveryResponse {
                                version_info: current.generation.to_string(),
                                type_url: TYPES[t].into(),
                                nonce: nonce.to_string(),
                                resources: current.types[t]
                                    .iter()
                                    .map(|(_, v)| any(t, v))
                                    .collect(),
                                ..Default::default()
                            };
                            if tx.send(Ok(resp)).await.is_err() {
                                return;
                            }
                        }
                    }
                    tokio::select! {
                        req = inbound.message() => {
                            let Ok(Some(req)) = req else { return };
                            if let Some(node) = req.node.clone() {
                                this.first_nodes.lock().expect("lock").push(node);
                            }
                            let Some(t) = type_index(&req.type_url) else {
                                this.sotw_unknown.lock().expect("lock").push(req.type_url);
                                continue;
                            };
                            if !req.response_nonce.is_empty() {
                                let counter = if req.error_detail.is_some() { &this.nacks } else { &this.acks };
                                counter.fetch_add(1, Ordering::Relaxed);
                            }
                            subscribed[t] = true;
                        }
                        changed = config.changed() => if changed.is_err() { return },
                    }
                }
            });
            Ok(Response::new(ReceiverStream::new(rx)))
        }

        async fn delta_aggregated_resources(
            &self,
            request: Request<Streaming<DeltaDiscoveryRequest>>,
        ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
            let mut inbound = request.into_inner();
            let (tx, rx) = mpsc::channel(16);
            let this = self.clone();
            tokio::spawn(async move {
                let mut config = this.config.clone();
                let mut subscribed = [false; 5];
                let mut held: [HashMap<String, Vec<u8>>; 5] = Default::default();
                let mut responded = [false; 5];
                // VHDS namespaces (route configuration names) subscribed.
                let mut namespaces = HashSet::<String>::new();
                let subscribed_ns = |namespaces: &HashSet<String>, name: &str| {
                    vhds_namespace(name).is_some_and(|ns| namespaces.contains(ns))
                };
                let mut nonce = 0u64;
                loop {
                    let current = config.borrow_and_update().clone();
                    for t in 0..5 {
                        if !subscribed[t] {
                            continue;
                        }
                        let want: HashMap<String, Vec<u8>> = if t == 4 {
                            current
                                .vhosts
                                .iter()
                                .filter(|(n, _)| subscribed_ns(&namespaces, n))
                                .cloned()
                                .collect()
                        } else {
                            current.types[t].iter().cloned().collect()
                        };
                        let upserts: Vec<DeltaResource> = want
                            .iter()
                            .filter(|(n, v)| held[t].get(*n) != Some(*v))
                            .map(|(n, v)| DeltaResource {
                                name: n.clone(),
                                version: current.generation.to_string(),
                                resource: Some(any(t, v)),
                                ..Default::default()
                            })
                            .collect();
                        // Virtual hosts of unsubscribed namespaces are dropped silently.
                        let removed: Vec<String> = held[t]
                            .keys()
                            .filter(|n| !want.contains_key(*n))
                            .filter(|n| t != 4 || subscribed_ns(&namespaces, n))
                            .cloned()
                            .collect();
                        let quiet = upserts.is_empty() && removed.is_empty();
                        held[t] = want;
                        // VHDS is answered only once there are virtual hosts to send (so a
                        // test decides when a subscription gets its answer).
                        if quiet && (responded[t] || t == 4) {
                            continue;
                        }
                        responded[t] = true;
                        nonce += 1;
                        let resp = DeltaDiscoveryResponse {
                            system_version_info: current.generation.to_string(),
                            type_url: FAKE_TYPES[t].into(),
                            nonce: nonce.to_string(),
                            resources: upserts,
                            removed_resources: removed,
                            ..Default::default()
                        };
                        if tx.send(Ok(resp)).await.is_err() {
                            return;
                        }
                    }
                    tokio::select! {
                        req = inbound.message() => {
                            let Ok(Some(req)) = req else { return };
                            if let Some(node) = req.node.clone() {
                                this.first_nodes.lock().expect("lock").push(node);
                            }
                            let Some(t) = fake_type(&req.type_url) else { continue };
                            if !req.response_nonce.is_empty() {
                                let counter = if req.error_detail.is_some() { &this.nacks } else { &this.acks };
                                counter.fetch_add(1, Ordering::Relaxed);
                                if t == 4 && req.error_detail.is_none() {
                                    this.vhds_acks.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            if t == 4 && !(req.resource_names_subscribe.is_empty() && req.resource_names_unsubscribe.is_empty()) {
                                this.vhds_requests.lock().expect("lock").push((
                                    req.resource_names_subscribe.clone(),
                                    req.resource_names_unsubscribe.clone(),
                                ));
                                namespaces.extend(req.resource_names_subscribe);
                                for ns in &req.resource_names_unsubscribe {
                                    namespaces.remove(ns);
                                }
                            }
                            subscribed[t] = true;
                        }
                        changed = config.changed() => if changed.is_err() { return },
                    }
                }
            });
            Ok(Response::new(ReceiverStream::new(rx)))
        }
    }

    struct Harness {
        addr: String,
        config: watch::Sender<Config>,
        ads: TestAds,
    }

    async fn serve(initial: Config) -> Harness {
        let (config, rx) = watch::channel(initial);
        let ads = TestAds {
            config: rx,
            acks: Arc::default(),
            nacks: Arc::default(),
            first_nodes: Arc::default(),
            vhds_requests: Arc::default(),
            vhds_acks: Arc::default(),
            sotw_unknown: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let svc = AggregatedDiscoveryServiceServer::new(ads.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Harness { addr, config, ads }
    }

    fn base_config() -> Config {
        let mut c = Config::default();
        c.types[0] = vec![(
            "outbound|80||a.ns.svc.cluster.local".into(),
            b"cluster a.ns.svc.cluster.local".to_vec(),
        )];
        c.types[1] = vec![("a".into(), b"\x0a198.18.0.1".to_vec())];
        c.types[2] = vec![("l".into(), b"listener".to_vec())];
        c.types[3] = vec![("80".into(), b"routes".to_vec())];
        c
    }

    fn spec(i: usize, protocol: Protocol, nack: bool) -> StreamSpec {
        StreamSpec {
            namespace: if i.is_multiple_of(2) {
                "ns".into()
            } else {
                "other".into()
            },
            pod: format!("p{i}"),
            ip: format!("198.19.128.{}", i + 1),
            protocol,
            nack,
            visibility: Visibility::Namespaces(vec![if i.is_multiple_of(2) {
                "ns".into()
            } else {
                "other".into()
            }]),
            capture: i == 0,
        }
    }

    fn config(addr: &str) -> LoadConfig {
        LoadConfig {
            addr: addr.to_string(),
            tenant: "t".into(),
            revision: "r".into(),
            streams_per_connection: 2,
            connect_concurrency: 4,
            accept_zstd: true,
        }
    }

    async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn sotw_and_delta_streams_sync_ack_and_converge() {
        let h = serve(base_config()).await;
        let specs = vec![
            spec(0, Protocol::Sotw, false),
            spec(1, Protocol::Sotw, false),
            spec(2, Protocol::Delta, false),
            spec(3, Protocol::Delta, false),
        ];
        let load = start(config(&h.addr), specs);
        assert_eq!(load.wait_synced(Duration::from_secs(10)).await, 4);

        // An endpoint change in `ns`: streams 0 and 2 see it, 1 and 3 do not.
        load.changes.register(
            "endpoint",
            "ns",
            vec![Condition {
                type_index: 1,
                pattern: b"\x0a198.18.0.2".to_vec(),
                present: true,
                within: Within::Encoding,
            }],
        );
        h.config.send_modify(|c| {
            c.generation += 1;
            c.types[1] = vec![("a".into(), b"\x0a198.18.0.2".to_vec())];
        });
        // Removal of the cluster: SotW sees it absent, delta sees it in removed_resources.
        wait_for("endpoint push", || {
            load.live.responses.load(Ordering::Relaxed) >= 4 * 4 + 4
        })
        .await;
        load.changes.register(
            "remove",
            "ns",
            vec![Condition {
                type_index: 0,
                pattern: b"a.ns.svc.cluster.local".to_vec(),
                present: false,
                within: Within::Encoding,
            }],
        );
        h.config.send_modify(|c| {
            c.generation += 1;
            c.types[0].clear();
        });
        wait_for("removal push", || {
            load.live.responses.load(Ordering::Relaxed) >= 4 * 4 + 4 + 4
        })
        .await;
        assert!(
            load.wait_converged(Duration::from_secs(10)).await,
            "streams 0 and 2 converge on both changes"
        );
        let owed = load.changes.owed_pairs();
        let reports = load.stop().await;
        assert_eq!(reports.len(), 4);
        assert_eq!(owed, 4, "2 changes owed by the 2 streams that see `ns`");
        assert_eq!(
            owed,
            reports.iter().map(|r| r.expected_changes).sum::<usize>(),
            "the log owes what the streams expected"
        );
        for r in &reports {
            assert!(
                r.error.is_none(),
                "stream {} failed: {:?}",
                r.index,
                r.error
            );
            assert!(r.synced_after.is_some());
            assert!(
                r.responses.iter().all(|n| *n >= 1),
                "every type answered: {:?}",
                r.responses
            );
            assert!(r.bytes.iter().all(|b| *b > 0));
            assert!(
                r.first_bytes
                    .iter()
                    .zip(&r.bytes)
                    .all(|(f, b)| *f > 0 && f <= b),
                "the initial config is the first response of each type: {:?} of {:?}",
                r.first_bytes,
                r.bytes
            );
            let sees = r.index % 2 == 0;
            assert_eq!(r.expected_changes, if sees { 2 } else { 0 });
            assert_eq!(r.converged.len(), r.expected_changes, "stream {}", r.index);
        }
        // The SotW stream 0 captured its last full config.
        assert_eq!(reports[0].captured[2], vec![b"listener".to_vec()]);
        // Every response was ACKed (node sent on the first request of each stream only).
        let responses: u64 = reports
            .iter()
            .map(|r| r.responses.iter().sum::<u64>())
            .sum();
        wait_for("acks", || h.ads.acks.load(Ordering::Relaxed) >= responses).await;
        assert_eq!(h.ads.nacks.load(Ordering::Relaxed), 0);
        let nodes = h.ads.first_nodes.lock().expect("lock").clone();
        assert_eq!(nodes.len(), 4);
        let n0 = nodes
            .iter()
            .find(|n| n.id.contains("~p0.ns~"))
            .expect("node of stream 0");
        assert_eq!(n0.id, "sidecar~198.19.128.1~p0.ns~ns.svc.cluster.local");
        let md = n0.metadata.as_ref().expect("metadata");
        for key in [
            "NAMESPACE",
            "POD_NAME",
            "TENANT",
            "REVISION",
            "CAPTURE_MODE",
            "LABELS",
        ] {
            assert!(md.fields.contains_key(key), "metadata {key}");
        }
    }

    #[tokio::test]
    async fn nacking_clients_reject_eds_updates_but_not_the_first() {
        let h = serve(base_config()).await;
        let load = start(
            config(&h.addr),
            vec![
                spec(0, Protocol::Sotw, true),
                spec(2, Protocol::Delta, true),
            ],
        );
        assert_eq!(load.wait_synced(Duration::from_secs(10)).await, 2);
        for g in 2..5u8 {
            h.config.send_modify(|c| {
                c.generation += 1;
                c.types[1] = vec![("a".into(), vec![8, b'x', g])];
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        wait_for("nacks", || h.ads.nacks.load(Ordering::Relaxed) >= 6).await;
        let reports = load.stop().await;
        for r in &reports {
            assert_eq!(r.nacks_sent, 3);
            assert_eq!(r.responses_after_sync[1], 3);
            assert!(r.synced_after.is_some());
        }
    }

    #[tokio::test]
    async fn unreachable_server_is_reported_per_stream() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let load = start(
            config(&format!("127.0.0.1:{port}")),
            vec![spec(0, Protocol::Sotw, false)],
        );
        assert_eq!(load.wait_synced(Duration::from_secs(30)).await, 0);
        let reports = load.stop().await;
        assert!(reports[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("connect")));
    }

    /// `cond` against one response holding `values` (of a VHDS response if `vhds`).
    fn holds_in(cond: &Condition, values: &[&[u8]], vhds: bool) -> bool {
        let finder = memchr::memmem::Finder::new(&cond.pattern);
        let seen = Seen {
            type_index: cond.type_index,
            vhds,
            bytes: 0,
            values: values.to_vec(),
            removed: &[],
            delta: false,
        };
        holds(cond, &finder, &seen)
    }

    #[test]
    fn a_condition_searches_only_the_part_it_names() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        let host = "b.ns.svc.cluster.local";
        let cond = |type_index, within| Condition {
            type_index,
            pattern: host.as_bytes().to_vec(),
            present: true,
            within,
        };
        // A cluster that only mentions the host (its EDS service name), and one named after it.
        let mentions = Cluster {
            name: "outbound|80||a.ns.svc.cluster.local".into(),
            alt_stat_name: host.into(),
            ..Default::default()
        }
        .encode_to_vec();
        let named = Cluster {
            name: format!("outbound|80||{host}"),
            ..Default::default()
        }
        .encode_to_vec();
        assert!(holds_in(&cond(0, Within::Encoding), &[&mentions], false));
        assert!(!holds_in(&cond(0, Within::Name), &[&mentions], false));
        assert!(holds_in(
            &cond(0, Within::Name),
            &[&mentions, &named],
            false
        ));

        // Virtual hosts: inline in a route configuration, or each its own VHDS resource; a
        // route that only names the host's cluster does not make the host routable.
        let vhost = |name: &str, cluster: &str| VirtualHost {
            name: name.into(),
            domains: vec![name.into()],
            routes: vec![envoy_types::pb::envoy::config::route::v3::Route {
                name: cluster.into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let routes = |hosts: Vec<VirtualHost>| {
            RouteConfiguration {
                name: "80".into(),
                virtual_hosts: hosts,
                ..Default::default()
            }
            .encode_to_vec()
        };
        let elsewhere = routes(vec![vhost("a.ns.svc.cluster.local:80", host)]);
        let inline = routes(vec![
            vhost("a.ns.svc.cluster.local:80", "a"),
            vhost(&format!("{host}:80"), "b"),
        ]);
        let rds = cond(3, Within::VirtualHostName);
        assert!(holds_in(&cond(3, Within::Encoding), &[&elsewhere], false));
        assert!(!holds_in(&rds, &[&elsewhere], false));
        assert!(holds_in(&rds, &[&inline], false));
        let own = vhost(&format!("80/{host}:80"), "b").encode_to_vec();
        let other = vhost("80/a.ns.svc.cluster.local:80", host).encode_to_vec();
        assert!(holds_in(&rds, &[&other, &own], true));
        assert!(!holds_in(&rds, &[&other], true));
    }

    #[test]
    fn fields_are_read_past_other_wire_types_and_stop_at_a_malformed_one() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use envoy_types::pb::google::protobuf::Duration as PbDuration;
        // Field 1 (name), 2 (type, a varint), 4 (connect_timeout, a message), 28 (alt_stat_name).
        let cluster = Cluster {
            name: "c1".into(),
            alt_stat_name: "alt".into(),
            connect_timeout: Some(PbDuration {
                seconds: 1,
                nanos: 0,
            }),
            cluster_discovery_type: Some(
                envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(3),
            ),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(fields(&cluster, 1).collect::<Vec<_>>(), [&b"c1"[..]]);
        assert_eq!(fields(&cluster, 28).collect::<Vec<_>>(), [&b"alt"[..]]);
        assert_eq!(fields(&cluster, 2).count(), 0, "a varint is not a payload");
        // Cut inside `alt_stat_name`: what came before it is read, it and the rest are not.
        let at = memchr::memmem::find(&cluster, b"alt").expect("encoded") + 1;
        let cut = &cluster[..at];
        assert_eq!(fields(cut, 1).collect::<Vec<_>>(), [&b"c1"[..]]);
        assert_eq!(fields(cut, 28).count(), 0);
        assert_eq!(fields(&[0xff], 1).count(), 0);
    }

    /// An encoded route configuration: a stub pointing to VHDS over ADS, or one with its
    /// virtual hosts inline.
    fn route_config(name: &str, vhds: bool) -> Vec<u8> {
        RouteConfiguration {
            name: name.into(),
            virtual_hosts: if vhds {
                Vec::new()
            } else {
                vec![VirtualHost {
                    name: "inline".into(),
                    domains: vec!["*".into()],
                    ..Default::default()
                }]
            },
            vhds: vhds.then(|| Vhds {
                config_source: Some(ConfigSource {
                    config_source_specifier: Some(ConfigSourceSpecifier::Ads(
                        AggregatedConfigSource {},
                    )),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn resource_names_are_read_from_field_one_of_every_type() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
        let cla = ClusterLoadAssignment {
            cluster_name: "outbound|80||a.ns.svc.cluster.local".into(),
            ..Default::default()
        };
        assert_eq!(
            resource_name(&cla.encode_to_vec()),
            "outbound|80||a.ns.svc.cluster.local"
        );
        let cluster = Cluster {
            name: "c1".into(),
            ..Default::default()
        };
        assert_eq!(resource_name(&cluster.encode_to_vec()), "c1");
        assert_eq!(resource_name(&route_config("80", false)), "80");
    }

    #[test]
    fn vhds_is_read_from_the_route_configuration() {
        assert!(has_vhds(&route_config("80", true)));
        assert!(!has_vhds(&route_config("80", false)));
        // `vhds` set without a config source still points to VHDS.
        let bare = RouteConfiguration {
            vhds: Some(Vhds::default()),
            ..Default::default()
        };
        assert!(has_vhds(&bare.encode_to_vec()));
        assert!(!has_vhds(b"routes"), "undecodable: no VHDS");
        assert_eq!(stat_index(VHDS), Some(3));
        assert_eq!(stat_index(RDS), Some(3));
        assert_eq!(stat_index(CDS), Some(0));
        assert_eq!(stat_index("type.googleapis.com/other"), None);
    }

    #[test]
    fn vhds_subscriptions_are_answered_per_namespace() {
        let rc = |name: &str, vhds: bool| DeltaResource {
            name: name.into(),
            resource: Some(any(3, &route_config(name, vhds))),
            ..Default::default()
        };
        let vhost = |name: &str| DeltaResource {
            name: name.into(),
            resource: Some(any(4, b"vhost")),
            ..Default::default()
        };
        // What the stream reads: the response's bytes, decoded as a view.
        let view = |r: DeltaDiscoveryResponse| {
            DeltaResponseView::decode(r.encode_to_vec().as_slice()).expect("decodes")
        };
        let mut state = VhdsState::default();
        let rds = view(DeltaDiscoveryResponse {
            resources: vec![rc("80", true), rc("8080", true), rc("9080", false)],
            ..Default::default()
        });
        let (mut add, drop) = state.routes(&rds);
        add.sort();
        assert_eq!((add, drop), (vec!["80".into(), "8080".into()], vec![]));
        // The same route configurations again: nothing new to subscribe.
        assert_eq!(state.routes(&rds), (vec![], vec![]));
        // An answer for 80 leaves 8080 pending; an empty answer answers the rest.
        state.answered(&view(DeltaDiscoveryResponse {
            resources: vec![vhost("80/a"), vhost("80/b")],
            ..Default::default()
        }));
        assert_eq!(state.pending, HashSet::from(["8080".to_string()]));
        state.answered(&view(DeltaDiscoveryResponse::default()));
        assert!(state.pending.is_empty());
        // 8080 back inline, 80 removed: both unsubscribed.
        let (add, mut drop) = state.routes(&view(DeltaDiscoveryResponse {
            resources: vec![rc("8080", false)],
            removed_resources: vec!["80".into()],
            ..Default::default()
        }));
        drop.sort();
        assert_eq!((add, drop), (vec![], vec!["80".into(), "8080".into()]));
        assert!(state.subscribed.is_empty());
    }

    #[tokio::test]
    async fn delta_streams_subscribe_vhds_and_sync_on_its_answer() {
        let mut initial = base_config();
        initial.types[3] = vec![
            ("80".into(), route_config("80", true)),
            ("9080".into(), route_config("9080", false)),
        ];
        let h = serve(initial).await;
        // Stream 1 (SotW) is in `other`, stream 2 (delta) in `ns`.
        let load = start(
            config(&h.addr),
            vec![
                spec(1, Protocol::Sotw, false),
                spec(2, Protocol::Delta, false),
            ],
        );
        // Four responses each (the fake has no virtual hosts yet, so VHDS goes unanswered),
        // and the delta stream's VHDS subscription.
        wait_for("first responses and the VHDS subscription", || {
            load.live.responses.load(Ordering::Relaxed) >= 8
                && !h.ads.vhds_requests.lock().expect("lock").is_empty()
        })
        .await;
        assert_eq!(
            *h.ads.vhds_requests.lock().expect("lock"),
            vec![(vec!["80".to_string()], Vec::<String>::new())],
            "exactly the route configuration that points to VHDS"
        );
        assert_eq!(
            load.live.synced.load(Ordering::Relaxed),
            1,
            "the SotW stream synced; the delta stream waits for VHDS"
        );

        // The server answers the subscription: only the subscribed namespace's virtual hosts.
        let answered = Instant::now();
        h.config.send_modify(|c| {
            c.generation += 1;
            c.vhosts = vec![
                ("80/a".into(), b"vhost a".to_vec()),
                ("80/b".into(), b"vhost b".to_vec()),
                ("9080/x".into(), b"vhost x".to_vec()),
            ];
        });
        assert_eq!(load.wait_synced(Duration::from_secs(10)).await, 2);
        wait_for("the VHDS ack", || {
            h.ads.vhds_acks.load(Ordering::Relaxed) >= 1
        })
        .await;

        // A change seen only in a virtual host converges through the RDS slot.
        load.changes.register(
            "vhost",
            "ns",
            vec![Condition {
                type_index: 3,
                pattern: b"vhost c".to_vec(),
                present: true,
                within: Within::Encoding,
            }],
        );
        h.config.send_modify(|c| {
            c.generation += 1;
            c.vhosts.push(("80/c".into(), b"vhost c".to_vec()));
        });
        assert!(
            load.wait_converged(Duration::from_secs(10)).await,
            "the delta stream converges on the VirtualHost push"
        );
        assert_eq!(load.changes.owed_pairs(), 1);

        // 80 back with inline virtual hosts, 9080 now on VHDS: one request for both.
        h.config.send_modify(|c| {
            c.generation += 1;
            c.types[3] = vec![
                ("80".into(), route_config("80", false)),
                ("9080".into(), route_config("9080", true)),
            ];
        });
        wait_for("the second VHDS request", || {
            h.ads.vhds_requests.lock().expect("lock").len() >= 2
        })
        .await;
        // The fake answers 9080 with its virtual host: wait for that ACK.
        wait_for("the 9080 VHDS ack", || {
            h.ads.vhds_acks.load(Ordering::Relaxed) >= 3
        })
        .await;
        // 9080 removed.
        h.config.send_modify(|c| {
            c.generation += 1;
            c.types[3].retain(|(n, _)| n != "9080");
        });
        wait_for("the third VHDS request", || {
            h.ads.vhds_requests.lock().expect("lock").len() >= 3
        })
        .await;
        assert_eq!(
            *h.ads.vhds_requests.lock().expect("lock"),
            vec![
                (vec!["80".to_string()], Vec::new()),
                (vec!["9080".to_string()], vec!["80".to_string()]),
                (Vec::new(), vec!["9080".to_string()]),
            ]
        );

        let started = load.started;
        let reports = load.stop().await;
        let (sotw, delta) = (&reports[0], &reports[1]);
        for r in &reports {
            assert!(r.error.is_none(), "stream {}: {:?}", r.index, r.error);
        }
        let synced_at = |r: &StreamReport| started + r.synced_after.expect("synced");
        // SotW: synced without VHDS (before the fake had virtual hosts), never asked for it.
        assert!(synced_at(sotw) < answered);
        assert!(h.ads.sotw_unknown.lock().expect("lock").is_empty());
        // Delta: RDS ×3 (initial, swap, removal) and VHDS ×3 (80/a+b, 80/c, 9080/x) under RDS;
        // the first VHDS response is part of the initial state.
        assert_eq!(delta.responses, [1, 1, 1, 6]);
        assert_eq!(delta.responses_after_sync, [0, 0, 0, 4]);
        // Bytes after sync: only the route slot's later responses, not the initial VHDS one.
        assert_eq!(delta.bytes_after_sync[..3], [0, 0, 0]);
        assert!(delta.bytes_after_sync[3] > 0 && delta.bytes_after_sync[3] < delta.bytes[3]);
        assert!(
            synced_at(delta) >= answered,
            "the delta stream synced only after the VHDS answer"
        );
        assert_eq!(delta.converged.len(), 1);
        // Every response (VHDS too) ACKed, none rejected; both streams identify as Envoy.
        let responses: u64 = reports
            .iter()
            .map(|r| r.responses.iter().sum::<u64>())
            .sum();
        wait_for("acks", || h.ads.acks.load(Ordering::Relaxed) >= responses).await;
        assert_eq!(h.ads.vhds_acks.load(Ordering::Relaxed), 3);
        assert_eq!(h.ads.nacks.load(Ordering::Relaxed), 0);
        let nodes = h.ads.first_nodes.lock().expect("lock").clone();
        assert_eq!(nodes.len(), 2);
        assert!(nodes.iter().all(|n| n.user_agent_name == "envoy"));
    }
}
