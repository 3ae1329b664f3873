//! The rendered-config cache: configurations by the proxy's scope (namespace, capture mode,
//! Sidecar, applicable EnvoyFilters, own ports, …), so that proxies of the same scope share
//! one [`ProxyConfig`]; what the tenant state's [`Invalidation`]s do to it.
//!
//! An endpoint-only change keeps the cached configurations and swaps in the re-encoded
//! assignments of the changed EDS clusters: clusters, listeners and routes are not re-rendered.
//! A Service change keeps the configurations that cannot see it, splices it into those it can
//! ([`splice`]) and drops the rest; any other configuration change drops every cached
//! configuration. An endpoint change finds the assignments to re-encode through each cached
//! configuration's positions of them, one index shared by the configurations that hold the
//! same assignments (the same interned `Arc`s, as every unscoped namespace's). Encoded
//! resources are interned by content ([`super::interner`]), so an identical resource is one
//! `Arc<Resource>` across proxies and across re-renders, and its version (hex SHA-256 of the
//! encoding) is stable across restarts.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use meshplane_crds::networking::CaptureMode;
use meshplane_crds::security::WorkloadMtls;

mod splice;

use super::interner::Interner;
use super::route_encoding::{self, RouteParts};
use super::state::Invalidation;
use crate::envoyfilter;
use crate::model::{
    list_key, same_resources, type_url, ListKey, ProxyConfig, ProxyKind, ProxyNode, Resource,
    VhdsRoutes,
};
use crate::translate::cluster_id::{HostPort, OutboundCluster};
use crate::translate::endpoints::{AssignmentKey, AssignmentScope};
use crate::translate::registry::ServiceModel;
use crate::translate::{self, InboundPort, Registry, Translated};

/// Everything a rendered configuration depends on besides the registry: proxies with equal
/// keys get the same configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ScopeKey {
    pub(super) namespace: String,
    pub(super) captures: bool,
    pub(super) sidecar: Option<(String, String)>,
    pub(super) envoy_filters: Vec<String>,
    pub(super) inbound: Vec<InboundPort>,
    pub(super) loopback: Option<String>,
    /// Whether the proxy has its SDS secrets, and the PeerAuthentication modes of its workload.
    pub(super) sds: bool,
    pub(super) peer_mtls: WorkloadMtls,
    /// The AuthorizationPolicies of its workload (namespace/name; their specs are part of the
    /// registry, whose changes empty the cache).
    pub(super) authz: Vec<(Option<String>, Option<String>)>,
    /// What else of the proxy its traffic config depends on (kind, gateway selection,
    /// `sourceLabels` conditions).
    pub(super) traffic: translate::TrafficKey,
    /// The Telemetries of its workload and the workload's name (a label of its metrics).
    pub(super) telemetry: translate::telemetry::TelemetryKey,
}

/// Most rendered configurations kept; the oldest goes first. The key is built only from the
/// tenant's own objects and the proxy's verified namespace (node metadata `LOOPBACK_ADDR`
/// counts only where the operator of the instance allowed it), so real tenants stay far below.
pub const MAX_CACHED_SCOPES: usize = 16_384;

/// A rendered configuration, with where its EDS resources sit.
pub(super) struct CachedConfig {
    pub(super) config: Arc<ProxyConfig>,
    /// The proxy it was rendered for (one of the scope's: they render alike).
    pub(super) node: ProxyNode,
    /// What each of `config.routes` was assembled from, in the same order.
    pub(super) routes: Vec<RouteParts>,
    /// Positions in `config.endpoints` by the host's port whose endpoint change re-encodes
    /// them: the assignment of its own cluster, and those of its subsets' clusters (built from
    /// the same endpoints). An endpoint change finds what to patch here instead of looking at
    /// every assignment of every configuration.
    pub(super) eds_at: Arc<EdsIndex>,
}

/// Positions of assignments, with the subset each is of (empty: the port's own cluster), by
/// the host's port whose endpoint change re-encodes them.
pub(super) type EdsIndex = HashMap<HostPort, Vec<(usize, String)>>;

impl CachedConfig {
    pub(super) fn new(config: Arc<ProxyConfig>, node: ProxyNode, routes: Vec<RouteParts>) -> Self {
        Self::indexed(config, node, routes, &mut EdsIndexMemo::default())
    }

    /// Like [`CachedConfig::new`], taking the index of its assignments from `memo` when a
    /// configuration updated before it holds the same ones.
    pub(super) fn indexed(
        config: Arc<ProxyConfig>,
        node: ProxyNode,
        routes: Vec<RouteParts>,
        memo: &mut EdsIndexMemo,
    ) -> Self {
        CachedConfig {
            eds_at: memo.index(&config),
            config,
            node,
            routes,
        }
    }
}

/// The [`EdsIndex`]es built during one update, by the assignments they index: configurations
/// holding the same assignments (interned to the same `Arc`s, as every unscoped namespace's
/// are) share one instead of each parsing and hashing every name again.
#[derive(Default)]
pub(super) struct EdsIndexMemo {
    /// By the number of assignments and the addresses of the first and last; the candidates
    /// are then compared in full. The configurations are held, so no address is reused.
    built: HashMap<ListKey, Vec<IndexedConfig>>,
}

/// A configuration and the index of its assignments.
type IndexedConfig = (Arc<ProxyConfig>, Arc<EdsIndex>);

impl EdsIndexMemo {
    pub(super) fn index(&mut self, config: &Arc<ProxyConfig>) -> Arc<EdsIndex> {
        let list = &config.endpoints;
        let candidates = self.built.entry(list_key(list)).or_default();
        if let Some((_, index)) = candidates
            .iter()
            .find(|(c, _)| same_resources(c.endpoints.iter(), list))
        {
            return Arc::clone(index);
        }
        let mut index = EdsIndex::new();
        // Every assignment translation renders is an outbound cluster's; the names are read
        // back once per distinct list, here, and the index carries the typed keys.
        for (at, r) in list.iter().enumerate() {
            if let Some(cluster) = OutboundCluster::parse(&r.name) {
                index
                    .entry(cluster.service)
                    .or_default()
                    .push((at, cluster.subset));
            }
        }
        let index = Arc::new(index);
        candidates.push((Arc::clone(config), Arc::clone(&index)));
        index
    }
}

/// An assignment to patch: its position, the host's port it takes endpoints from, its subset.
type OutboundPosition<'a> = (usize, &'a HostPort, &'a String);

/// Rendered configurations by scope, with the interner their resources come from.
pub(super) struct RenderCache {
    configs: HashMap<ScopeKey, CachedConfig>,
    /// Keys of `configs` in insertion order, for eviction.
    order: VecDeque<ScopeKey>,
    /// Most configurations kept ([`MAX_CACHED_SCOPES`]); the oldest goes first.
    limit: usize,
    pub(super) interner: Interner,
    /// Configurations updated by splicing a Service change in (tests and debugging).
    pub(super) spliced: u64,
}

impl Default for RenderCache {
    fn default() -> Self {
        RenderCache {
            configs: HashMap::new(),
            order: VecDeque::new(),
            limit: MAX_CACHED_SCOPES,
            interner: Interner::default(),
            spliced: 0,
        }
    }
}

impl RenderCache {
    /// Keeps at most `limit` configurations (at least one).
    pub(super) fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
    }

    pub(super) fn len(&self) -> usize {
        self.configs.len()
    }

    pub(super) fn get(&self, key: &ScopeKey) -> Option<&CachedConfig> {
        self.configs.get(key)
    }

    /// Caches a configuration, evicting the oldest beyond the limit.
    pub(super) fn insert(&mut self, key: ScopeKey, cached: CachedConfig) {
        if self.configs.insert(key.clone(), cached).is_none() {
            self.order.push_back(key);
            while self.order.len() > self.limit {
                if let Some(oldest) = self.order.pop_front() {
                    self.configs.remove(&oldest);
                }
            }
        }
    }

    /// Brings the cache in line with `registry` after an event that invalidated `what`.
    pub(super) fn invalidate(&mut self, registry: &Registry, what: Invalidation) {
        match what {
            Invalidation::None => {}
            Invalidation::Endpoints(clusters) => self.patch_endpoints(registry, &clusters),
            Invalidation::Service { models, clusters } => {
                if self.update_seeing(registry, &models) {
                    self.patch_endpoints(registry, &clusters);
                } else {
                    self.clear_configs();
                }
            }
            Invalidation::All => self.clear_configs(),
        }
    }

    /// Drops every rendered configuration (their eviction order too, which would otherwise
    /// keep naming them and, once as long as the limit, evict live ones).
    fn clear_configs(&mut self) {
        self.configs.clear();
        self.order.clear();
    }

    /// Encodes a translated configuration with this cache's interner.
    pub(super) fn encode(&mut self, t: Translated, vhds: bool) -> (ProxyConfig, Vec<RouteParts>) {
        encode(&mut self.interner, t, vhds)
    }

    /// Re-encodes the assignments of `clusters` from the current registry into every cached
    /// configuration holding them. EDS is the only output that reads endpoints (EnvoyFilters
    /// cannot patch it), and each assignment is built as the full render builds it for the
    /// scope (subsets from its namespace's DestinationRule; mutual TLS marks for every proxy
    /// but proxyless gRPC), so the result equals a full render.
    pub(super) fn patch_endpoints(&mut self, registry: &Registry, clusters: &BTreeSet<HostPort>) {
        let RenderCache {
            configs, interner, ..
        } = self;
        // Scopes with the same assignment of a cluster share it: encoded once.
        let mut fresh: HashMap<AssignmentKey, Arc<Resource>> = HashMap::new();
        for (key, cached) in configs.iter_mut() {
            let positions: Vec<OutboundPosition> = clusters
                .iter()
                .filter_map(|c| Some((c, cached.eds_at.get(c)?)))
                .flat_map(|(c, at)| at.iter().map(move |(at, subset)| (*at, c, subset)))
                .collect();
            if positions.is_empty() {
                continue;
            }
            let scope = AssignmentScope::new(&key.namespace, key.traffic.kind());
            let mut next = ProxyConfig::clone(&cached.config);
            for (at, service, subset) in positions {
                let Some(r) = next.endpoints.get_mut(at) else {
                    continue;
                };
                let memo = scope.key(OutboundCluster::new(service.clone(), subset));
                *r = match fresh.get(&memo) {
                    Some(f) => Arc::clone(f),
                    None => {
                        let cla = scope.load_assignment(registry, memo.cluster());
                        let f = interner.intern(type_url::ENDPOINT, r.name.clone(), &cla);
                        fresh.insert(memo, Arc::clone(&f));
                        f
                    }
                };
            }
            // Same names at the same positions: `eds_at` stays true.
            cached.config = Arc::new(next);
        }
    }

    /// Updates the cached configurations that may see a change of a Kubernetes Service
    /// (`models`: what it was and what it is): those of gateways and proxyless clients, those
    /// of its namespace (inbound ports come from the Services selecting the workload), and
    /// those whose egress listeners import its hostname (any declaration of the hostname
    /// counts, whatever its `exportTo`). The others' translation reads nothing the change
    /// touched. Each is spliced where [`splice`] can, else dropped. Returns false, dropping
    /// nothing, when that cannot be told per scope: a VirtualService names the hostname (as a
    /// host, by wildcard, or as a destination), so any scope it is visible to may route to it.
    /// Gateways need no such care: only gateway proxies read them, and their configurations
    /// are always dropped.
    pub(super) fn update_seeing(&mut self, registry: &Registry, models: &[ServiceModel]) -> bool {
        let hostnames: BTreeSet<&str> = models.iter().map(|m| m.hostname.as_str()).collect();
        if registry
            .virtual_services
            .iter()
            .chain(&registry.gateway_api.mesh.virtual_services)
            .any(|vs| {
                hostnames
                    .iter()
                    .any(|h| translate::traffic::vs_names_host(vs, h))
            })
        {
            return false;
        }
        let candidates: Vec<&ServiceModel> = models
            .iter()
            .chain(hostnames.iter().flat_map(|h| registry.services_named(h)))
            .collect();
        let sees = |key: &ScopeKey| {
            if key.traffic.kind() != ProxyKind::Sidecar
                || candidates.iter().any(|m| m.namespace == key.namespace)
            {
                return true;
            }
            let sidecar = key
                .sidecar
                .as_ref()
                .and_then(|k| translate::scope::sidecar_by_key(registry, k));
            translate::scope::egress_scopes(sidecar)
                .iter()
                .any(|e| candidates.iter().any(|m| e.imports(m, &key.namespace)))
        };
        // Told once, when a configuration first needs it (none are cached while the initial
        // state loads: telling costs a look at every host).
        let mut change: Option<Option<splice::HostChange>> = None;
        let RenderCache {
            configs,
            order,
            interner,
            spliced,
            ..
        } = self;
        let mut dropped = Vec::new();
        let mut indexes = EdsIndexMemo::default();
        for (key, cached) in configs.iter_mut() {
            if !sees(key) {
                continue;
            }
            let next = change
                .get_or_insert_with(|| splice::HostChange::new(registry, models))
                .as_ref()
                .and_then(|c| splice::splice(registry, key, cached, c, interner, &mut indexes));
            match next {
                Some(next) => {
                    *cached = next;
                    *spliced += 1;
                }
                None => dropped.push(key.clone()),
            }
        }
        if !dropped.is_empty() {
            for key in &dropped {
                configs.remove(key);
            }
            order.retain(|k| configs.contains_key(k));
        }
        true
    }
}

/// The scope of `node` (a workload node): what its rendered configuration depends on besides
/// the registry.
pub(super) fn scope_key(registry: &Registry, node: &ProxyNode) -> ScopeKey {
    let scope = translate::scope::proxy_scope(registry, &node.namespace, &node.labels);
    ScopeKey {
        namespace: node.namespace.clone(),
        captures: node.capture_mode != CaptureMode::None,
        envoy_filters: envoyfilter::applicable(registry, node)
            .into_iter()
            .map(envoyfilter::filter_id)
            .collect(),
        inbound: translate::inbound_ports(registry, node, &scope),
        sidecar: scope.sidecar,
        loopback: node.loopback.clone(),
        sds: node.sds,
        peer_mtls: translate::peer_mtls(registry, node),
        authz: translate::authorization_policies(registry, node)
            .into_iter()
            .map(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()))
            .chain(
                translate::request_authentications(registry, node)
                    .into_iter()
                    .map(|p| (p.metadata.namespace.clone(), p.metadata.name.clone())),
            )
            .collect(),
        traffic: translate::traffic_key(registry, node),
        telemetry: translate::telemetry::key(registry, node),
    }
}

/// A rendered configuration, encoded: route configurations from their virtual hosts'
/// encodings ([`route_encoding`]); `vhds`: with their VHDS form too.
pub(super) fn encode(
    interner: &mut Interner,
    t: Translated,
    vhds: bool,
) -> (ProxyConfig, Vec<RouteParts>) {
    let mut routes = Vec::with_capacity(t.routes.len());
    let mut stubs = Vec::with_capacity(t.routes.len());
    let mut parts = Vec::with_capacity(t.routes.len());
    for rc in t.routes {
        let encoded = route_encoding::encode_route(interner, rc, vhds);
        routes.push(encoded.inline);
        stubs.extend(encoded.stub);
        parts.push(encoded.parts);
    }
    let vhds = vhds.then(|| {
        let mut virtual_hosts: Vec<Arc<Resource>> = parts
            .iter()
            .flat_map(|p| p.virtual_hosts.iter().cloned())
            .collect();
        virtual_hosts.sort_by(|a, b| a.name.cmp(&b.name));
        VhdsRoutes {
            routes: stubs,
            virtual_hosts,
        }
    });
    let config = ProxyConfig {
        clusters: t
            .clusters
            .iter()
            .map(|c| interner.intern(type_url::CLUSTER, c.name.clone(), c))
            .collect(),
        endpoints: t
            .endpoints
            .iter()
            .map(|e| interner.intern(type_url::ENDPOINT, e.cluster_name.clone(), e))
            .collect(),
        listeners: t
            .listeners
            .iter()
            .map(|l| interner.intern(type_url::LISTENER, l.name.clone(), l))
            .collect(),
        routes,
        vhds,
    };
    (config, parts)
}
