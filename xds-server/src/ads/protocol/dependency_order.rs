//! Property test of what a proxy sees on the wire: random config changes, ACKs, NACKs,
//! subscription changes and reconnects against one [`StreamState`], with a simulated proxy
//! that keeps only what it accepted and, like Envoy, holds its CDS ACK while new or changed
//! clusters warm (until an EDS response carries their endpoints). On every response the server
//! emits:
//!
//! - every cluster a listener, route or virtual host names is one the proxy already accepted
//!   (the CDS response carrying it was sent and ACKed);
//! - every ClusterLoadAssignment names a cluster already sent on the stream;
//!
//! when the proxy applies a CDS response, no listener or route it runs names a cluster that
//! response removes; a warming cluster is never left without endpoints the server has. At the
//! end, with changes and NACKs stopped, the proxy converges to the desired config.
//!
//! The model is the proxy, not the planner: it reads the references out of the resource bytes
//! and checks them against its own accepted state; it never calls the tracker's planning.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::{Outgoing, Protocol, StreamState};
use crate::ads::snapshot::{Snapshot, TYPE_COUNT, VHDS};
use crate::model::{type_url, ProxyConfig, Resource, VhdsRoutes};
use meshplane_xds_core::test_choices::{for_choices, Choices};
use meshplane_xds_core::testing::mk_resource;

const CDS: usize = 0;
const EDS: usize = 1;
const LDS: usize = 2;
const RDS: usize = 3;
const CLUSTERS: [&str; 6] = ["c0", "c1", "c2", "c3", "c4", "c5"];

/// A resource whose bytes carry the clusters it names: `name#generation>c1,c3`.
fn resource(type_index: usize, name: &str, generation: u64, names: &[&str]) -> Arc<Resource> {
    let body = format!("{name}#{generation}>{}", names.join(","));
    mk_resource(type_url::ORDER[type_index], name, body)
}

/// The clusters a resource names, read from its bytes.
fn named_clusters(encoded: &[u8]) -> BTreeSet<String> {
    let text = String::from_utf8_lossy(encoded);
    let refs = text.split_once('>').map(|(_, r)| r).unwrap_or_default();
    refs.split(',')
        .filter(|r| !r.is_empty())
        .map(str::to_string)
        .collect()
}

/// A consistent config: endpoints, listeners and routes name only clusters it has. `full`:
/// every resource present, with generations never used before (a change of every type).
fn random_config(rng: &mut Choices, full: bool) -> Snapshot {
    let generations: Vec<u64> = (0..16)
        .map(|_| if full { 1000 } else { rng.below(3) })
        .collect();
    let likely = |rng: &mut Choices, percent: u64| full || rng.chance(percent);
    let present: Vec<&str> = CLUSTERS
        .iter()
        .copied()
        .filter(|_| likely(rng, 60))
        .collect();
    let pick = |rng: &mut Choices| -> Vec<&str> {
        present.iter().copied().filter(|_| rng.chance(40)).collect()
    };
    let clusters = present
        .iter()
        .enumerate()
        .map(|(i, c)| resource(CDS, c, generations[i], &[]))
        .collect();
    let endpoints = present
        .iter()
        .enumerate()
        .filter(|_| likely(rng, 70))
        .map(|(i, c)| resource(EDS, c, generations[6 + i % 6], &[c]))
        .collect();
    let named = |t: usize, prefix: &str, rng: &mut Choices| -> Vec<Arc<Resource>> {
        let mut out = Vec::new();
        for i in 0..3 {
            if likely(rng, 70) {
                let refs = pick(rng);
                out.push(resource(
                    t,
                    &format!("{prefix}{i}"),
                    generations[12 + i],
                    &refs,
                ));
            }
        }
        out
    };
    let listeners = named(LDS, "l", rng);
    let routes = named(RDS, "r", rng);
    // VHDS: each route's stub names nothing; its virtual hosts name the clusters.
    let stubs = routes
        .iter()
        .map(|r| {
            let generation = if full { 1000 } else { rng.below(2) };
            resource(RDS, &r.name, generation, &[])
        })
        .collect();
    let mut virtual_hosts = Vec::new();
    for r in &routes {
        for v in 0..2 {
            if likely(rng, 70) {
                let refs = pick(rng);
                let generation = if full { 1000 } else { rng.below(3) };
                let name = format!("{}/v{v}", r.name);
                virtual_hosts.push(resource(VHDS, &name, generation, &refs));
            }
        }
    }
    Snapshot::new(
        &ProxyConfig {
            clusters,
            endpoints,
            listeners,
            routes,
            vhds: Some(VhdsRoutes {
                routes: stubs,
                virtual_hosts,
            }),
        },
        Instant::now(),
    )
}

/// What the simulated proxy holds of one type: name → (version, bytes).
type Held = BTreeMap<String, (String, Bytes)>;

/// An Envoy-like client: CDS and LDS wildcard first, EDS after its first clusters (wildcard,
/// or by the names of the clusters it holds), RDS after its first listeners; with VHDS, the
/// virtual hosts of the route configurations it holds (by namespace).
struct Proxy {
    protocol: Protocol,
    vhds: bool,
    /// What the proxy runs with: only what it accepted.
    held: [Held; TYPE_COUNT],
    /// SotW: `version_info` of the last accepted response per type.
    accepted_version: [String; TYPE_COUNT],
    /// Nonce of the last response processed per type.
    last_nonce: [String; TYPE_COUNT],
    subscribed: [bool; TYPE_COUNT],
    /// Named subscriptions (None: wildcard) of EDS and RDS.
    names: [Option<BTreeSet<String>>; TYPE_COUNT],
    eds_by_name: bool,
    /// Responses sent by the server, not processed yet.
    inbox: VecDeque<Outgoing>,
    /// A SotW stream was reconnected: the server cannot know what the proxy holds (only a
    /// version), so removals are no longer checked.
    resumed_sotw: bool,
    /// Clusters of the last CDS response the proxy ACKed.
    acked_cds: BTreeSet<String>,
    /// CDS responses processed (the first one does not warm: Envoy's initial fetch).
    cds_seen: usize,
    /// A CDS response applied whose ACK waits for the endpoints of its new clusters.
    warming: Option<Warming>,
    /// The last EDS response was rejected (the server then holds that content back).
    eds_rejected: bool,
}

struct Warming {
    nonce: String,
    waiting: BTreeSet<String>,
    /// The proxy rejected an EDS response meanwhile (then waiting is legitimate).
    eds_rejected: bool,
}

impl Proxy {
    fn new(protocol: Protocol, eds_by_name: bool, vhds: bool) -> Self {
        Proxy {
            protocol,
            vhds,
            held: Default::default(),
            accepted_version: Default::default(),
            last_nonce: Default::default(),
            subscribed: [false; TYPE_COUNT],
            names: Default::default(),
            eds_by_name,
            inbox: VecDeque::new(),
            resumed_sotw: false,
            acked_cds: BTreeSet::new(),
            cds_seen: 0,
            warming: None,
            eds_rejected: false,
        }
    }

    fn names_vec(&self, t: usize) -> Vec<String> {
        self.names[t]
            .as_ref()
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Subscribes a type for the first time on `state` (or again after a reconnect).
    fn subscribe(&mut self, state: &mut StreamState, t: usize, reconnect: bool) {
        self.subscribed[t] = true;
        let names = self.names_vec(t);
        match self.protocol {
            Protocol::Sotw => {
                let version = if reconnect {
                    self.accepted_version[t].clone()
                } else {
                    String::new()
                };
                state.on_sotw_request(type_url::ORDER[t], "", &version, &names, None);
            }
            Protocol::Delta => {
                let initial: HashMap<String, String> = if reconnect {
                    self.held[t]
                        .iter()
                        .map(|(n, (v, _))| (n.clone(), v.clone()))
                        .collect()
                } else {
                    HashMap::new()
                };
                state.on_delta_request(type_url::ORDER[t], "", &names, &[], &initial, None);
            }
        }
    }

    /// Processes the oldest response: accepts or rejects it, answers, and subscribes what a
    /// first response leads to.
    fn process(&mut self, state: &mut StreamState, reject: bool, context: &str) {
        let Some(out) = self.inbox.pop_front() else {
            return;
        };
        let t = crate::ads::snapshot::type_index(out.type_url).expect("served type");
        self.last_nonce[t] = out.nonce.clone();
        if t == EDS {
            self.eds_rejected = reject;
        }
        if !reject {
            if t == CDS && !self.resumed_sotw {
                let removed: Vec<String> = match self.protocol {
                    Protocol::Sotw => {
                        let kept: BTreeSet<&str> =
                            out.resources.iter().map(|r| r.name.as_str()).collect();
                        self.held[CDS]
                            .keys()
                            .filter(|n| !kept.contains(n.as_str()))
                            .cloned()
                            .collect()
                    }
                    Protocol::Delta => out.removed.clone(),
                };
                for gone in &removed {
                    for user in [LDS, RDS, VHDS] {
                        for (name, (_, bytes)) in &self.held[user] {
                            assert!(
                                !named_clusters(bytes).contains(gone),
                                "{context}: cluster {gone} removed while {} {name} still names it",
                                crate::ads::snapshot::short_name(user)
                            );
                        }
                    }
                }
            }
            let before: BTreeMap<String, String> = self.held[t]
                .iter()
                .map(|(n, (v, _))| (n.clone(), v.clone()))
                .collect();
            self.apply(t, &out);
            self.accepted_version[t] = out.version.clone();
            if t == CDS {
                self.cds_seen += 1;
                // New clusters warm, and so does every cluster that changed: Envoy
                // re-creates it. Each waits for an EDS response carrying its assignment (one
                // the proxy took before, for an older cluster or none, is not handed over).
                let waiting: BTreeSet<String> = self.held[CDS]
                    .iter()
                    .filter(|(n, (v, _))| before.get(*n) != Some(v))
                    .map(|(n, _)| n.clone())
                    .collect();
                if self.cds_seen > 1 && !waiting.is_empty() {
                    // Envoy pauses CDS while clusters warm: the ACK goes once they have
                    // endpoints.
                    self.warming = Some(Warming {
                        nonce: out.nonce.clone(),
                        waiting,
                        eds_rejected: self.eds_rejected,
                    });
                }
            }
            if t == EDS {
                if let Some(w) = &mut self.warming {
                    for r in &out.resources {
                        w.waiting.remove(&r.name);
                    }
                }
            }
        } else if t == EDS {
            if let Some(w) = &mut self.warming {
                w.eds_rejected = true;
            }
        }
        let error = reject.then_some("rejected by the simulated proxy");
        let warming_now = t == CDS && !reject && self.warming.is_some();
        if !warming_now {
            self.answer(state, t, &out.nonce, error);
        }
        if self.warming.as_ref().is_some_and(|w| w.waiting.is_empty()) {
            self.end_warming(state);
        }
        if t == CDS && !reject {
            if !self.subscribed[EDS] {
                // By name, Envoy asks for endpoints once it has an EDS cluster.
                if !self.eds_by_name {
                    self.subscribe(state, EDS, false);
                } else if !self.held[CDS].is_empty() {
                    self.names[EDS] = Some(self.held[CDS].keys().cloned().collect());
                    self.subscribe(state, EDS, false);
                }
            } else if self.eds_by_name {
                self.follow_clusters(state);
            }
        }
        if t == LDS && !reject && !self.subscribed[RDS] {
            if self.eds_by_name {
                self.names[RDS] = Some(["r0", "r1", "r2"].map(String::from).into());
            }
            self.subscribe(state, RDS, false);
        }
        if t == RDS && !reject && self.vhds {
            self.follow_routes(state);
        }
    }

    /// VHDS, as Envoy 1.40 does it: one subscription without names once it has route
    /// configurations pointing to VHDS; the virtual hosts of a configuration go with it.
    fn follow_routes(&mut self, state: &mut StreamState) {
        let routes: BTreeSet<String> = self.held[RDS].keys().cloned().collect();
        self.held[VHDS].retain(|n, _| in_route(&routes, n));
        if !self.subscribed[VHDS] && !routes.is_empty() {
            self.subscribe(state, VHDS, false);
        }
    }

    /// ACKs (or NACKs) the response `nonce` of type `t`.
    fn answer(&mut self, state: &mut StreamState, t: usize, nonce: &str, error: Option<&str>) {
        if t == CDS && error.is_none() {
            self.acked_cds = self.held[CDS].keys().cloned().collect();
        }
        let url = type_url::ORDER[t];
        match self.protocol {
            Protocol::Sotw => {
                let version = self.accepted_version[t].clone();
                let names = self.names_vec(t);
                state.on_sotw_request(url, nonce, &version, &names, error);
            }
            Protocol::Delta => {
                state.on_delta_request(url, nonce, &[], &[], &HashMap::new(), error);
            }
        }
    }

    /// The new clusters warmed (or their fetch timed out): the held CDS ACK goes.
    fn end_warming(&mut self, state: &mut StreamState) {
        if let Some(w) = self.warming.take() {
            self.answer(state, CDS, &w.nonce, None);
        }
    }

    /// A by-name EDS subscription follows the clusters the proxy holds, as Envoy's does.
    fn follow_clusters(&mut self, state: &mut StreamState) {
        let want: BTreeSet<String> = self.held[CDS].keys().cloned().collect();
        let have = self.names[EDS].clone().unwrap_or_default();
        if want == have {
            return;
        }
        self.names[EDS] = Some(want.clone());
        // The proxy forgets endpoints of clusters it no longer has.
        self.held[EDS].retain(|n, _| want.contains(n));
        let url = type_url::ORDER[EDS];
        match self.protocol {
            Protocol::Sotw => {
                let names: Vec<String> = want.into_iter().collect();
                let (nonce, version) = (&self.last_nonce[EDS], &self.accepted_version[EDS]);
                state.on_sotw_request(url, nonce, version, &names, None);
            }
            Protocol::Delta => {
                let sub: Vec<String> = want.difference(&have).cloned().collect();
                let unsub: Vec<String> = have.difference(&want).cloned().collect();
                state.on_delta_request(url, "", &sub, &unsub, &HashMap::new(), None);
            }
        }
    }

    fn apply(&mut self, t: usize, out: &Outgoing) {
        if t == VHDS {
            // Envoy hands a virtual host only to the watch of its route configuration: one it
            // has not processed yet has none, and the virtual host is lost.
            let routes: BTreeSet<String> = self.held[RDS].keys().cloned().collect();
            for r in &out.resources {
                assert!(
                    in_route(&routes, &r.name),
                    "virtual host {} sent before its route configuration was ACKed (held: {routes:?})",
                    r.name
                );
            }
        }
        let entry = |r: &Arc<Resource>| (r.name.clone(), (r.version.clone(), r.encoded.clone()));
        match self.protocol {
            Protocol::Sotw if t != EDS => self.held[t] = out.resources.iter().map(entry).collect(),
            // Endpoints: a SotW response carries what changed, as a delta one.
            Protocol::Sotw | Protocol::Delta => {
                for r in &out.resources {
                    let (n, v) = entry(r);
                    self.held[t].insert(n, v);
                }
                for n in &out.removed {
                    self.held[t].remove(n);
                }
            }
        }
    }

    /// The invariants on a response the server just emitted.
    fn check_emitted(&self, out: &Outgoing, context: &str) {
        let t = crate::ads::snapshot::type_index(out.type_url).expect("served type");
        match t {
            EDS => {
                // Sent on the stream: held, or in a CDS response ahead of this one.
                let mut known: BTreeSet<&str> = self.held[CDS].keys().map(String::as_str).collect();
                for o in self
                    .inbox
                    .iter()
                    .filter(|o| o.type_url == type_url::CLUSTER)
                {
                    known.extend(o.resources.iter().map(|r| r.name.as_str()));
                }
                for r in &out.resources {
                    assert!(
                        known.contains(r.name.as_str()),
                        "{context}: EDS names cluster {} not sent on the stream (known {known:?})",
                        r.name
                    );
                }
            }
            LDS | RDS | VHDS => {
                for r in &out.resources {
                    for c in named_clusters(&r.encoded) {
                        assert!(
                            self.acked_cds.contains(&c),
                            "{context}: {} {} names cluster {c} before the proxy ACKed it (ACKed: {:?})",
                            crate::ads::snapshot::short_name(t),
                            r.name,
                            self.acked_cds
                        );
                    }
                }
            }
            _ => {}
        }
    }

    /// Nothing on the wire and nothing due: a warming cluster waits only for endpoints the
    /// server does not have (or the proxy rejected); then the fetch times out and CDS is ACKed.
    fn idle(&mut self, state: &mut StreamState, snapshot: &Snapshot, context: &str) {
        let Some(w) = &self.warming else {
            return;
        };
        if !w.eds_rejected {
            for c in &w.waiting {
                let subscribed = self.names[EDS].as_ref().is_none_or(|n| n.contains(c));
                assert!(
                    !(subscribed && snapshot.types[EDS].resources.contains_key(c)),
                    "{context}: cluster {c} warms for endpoints the server holds back"
                );
            }
        }
        self.end_warming(state);
    }

    /// Whether the proxy holds exactly the subscribed part of `snapshot`.
    fn holds(&self, snapshot: &Snapshot) -> bool {
        (0..TYPE_COUNT).all(|t| {
            let routes: BTreeSet<String> = self.held[RDS].keys().cloned().collect();
            let subscribed = |n: &str| {
                if t == VHDS {
                    in_route(&routes, n)
                } else {
                    self.names[t].as_ref().is_none_or(|s| s.contains(n))
                }
            };
            if t == VHDS && !self.vhds {
                return self.held[t].is_empty();
            }
            let want: BTreeMap<&str, &str> = snapshot
                .desired(t, self.vhds)
                .resources
                .iter()
                .filter(|(n, _)| subscribed(n))
                .map(|(n, r)| (n.as_str(), r.version.as_str()))
                .collect();
            let have: BTreeMap<&str, &str> = self.held[t]
                .iter()
                .map(|(n, (v, _))| (n.as_str(), v.as_str()))
                .collect();
            want == have
        })
    }
}

/// Whether virtual host `name` belongs to one of `routes` (`<route>/<vhost>`).
fn in_route(routes: &BTreeSet<String>, name: &str) -> bool {
    name.rsplit_once('/')
        .is_some_and(|(route, _)| routes.contains(route))
}

fn emit(state: &mut StreamState, proxy: &mut Proxy, snapshot: &Snapshot, context: &str) {
    loop {
        for out in state.next_responses(snapshot) {
            proxy.check_emitted(&out, context);
            proxy.inbox.push_back(out);
        }
        if !proxy.inbox.is_empty() || proxy.warming.is_none() {
            return;
        }
        proxy.idle(state, snapshot, context);
    }
}

fn run(protocol: Protocol, vhds: bool, mut rng: Choices) {
    let mut proxy = Proxy::new(protocol, rng.chance(50), vhds);
    let new_state = || {
        let state = StreamState::new(protocol);
        if vhds {
            state.with_vhds()
        } else {
            state
        }
    };
    let mut state = new_state();
    let mut snapshot = random_config(&mut rng, false);
    proxy.subscribe(&mut state, CDS, false);
    proxy.subscribe(&mut state, LDS, false);
    for step in 0..80 {
        let context = format!("{protocol:?} vhds {vhds} step {step}");
        match rng.below(10) {
            // The config changes (any type, any resource, removals included).
            0 | 1 => snapshot = random_config(&mut rng, false),
            3 if rng.chance(20) => {
                // The stream drops: what was on the wire is lost, the proxy keeps what it
                // accepted and resubscribes on a new stream.
                proxy.inbox.clear();
                proxy.warming = None;
                proxy.acked_cds = proxy.held[CDS].keys().cloned().collect();
                proxy.resumed_sotw = protocol == Protocol::Sotw;
                state = new_state();
                for t in [CDS, LDS, EDS, RDS, VHDS] {
                    if proxy.subscribed[t] {
                        proxy.subscribe(&mut state, t, true);
                    }
                }
            }
            _ => {
                for _ in 0..=rng.below(3) {
                    let reject = rng.chance(15);
                    proxy.process(&mut state, reject, &context);
                    emit(&mut state, &mut proxy, &snapshot, &context);
                }
            }
        }
        emit(&mut state, &mut proxy, &snapshot, &context);
    }
    // Changes and rejections stop (after one last change of every type, so no type stays
    // blocked by a rejection of the final content): the proxy converges.
    snapshot = random_config(&mut rng, true);
    let context = format!("{protocol:?} vhds {vhds} drain");
    emit(&mut state, &mut proxy, &snapshot, &context);
    for _ in 0..64 {
        if proxy.inbox.is_empty() {
            break;
        }
        proxy.process(&mut state, false, &context);
        emit(&mut state, &mut proxy, &snapshot, &context);
    }
    assert!(proxy.inbox.is_empty(), "{context}: responses keep coming");
    assert!(
        proxy.holds(&snapshot),
        "{context}: the proxy did not converge: holds {:?}",
        proxy.held
    );
}

#[test]
fn sotw_never_names_a_cluster_before_its_ack() {
    for_choices(600, 4096, |rng| run(Protocol::Sotw, false, rng));
}

#[test]
fn delta_never_names_a_cluster_before_its_ack() {
    for_choices(600, 4096, |rng| run(Protocol::Delta, false, rng));
}

#[test]
fn vhds_never_names_a_cluster_before_its_ack() {
    for_choices(600, 4096, |rng| run(Protocol::Delta, true, rng));
}
