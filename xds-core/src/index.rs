//! The tenant index: the in-memory state of one tenant, folded from [`SourceEvent`]s, and the
//! rendering of each proxy's configuration from it.
//!
//! Pure: no I/O. A Service, EndpointSlice or Pod event updates the [`Registry`] that translation
//! reads per key ([`keyed`]): only the hosts it concerns, with the endpoints of their clusters
//! recomputed. Other events (membership, mesh config, Sidecars, EnvoyFilters, ServiceEntries,
//! relists) rebuild the registry and compare it with the previous one. Either way [`Change`]
//! says exactly what a proxy could see differently: nothing, endpoints only (with the EDS
//! clusters concerned), or configuration.
//!
//! Rendered configurations are cached by the proxy's scope (namespace, capture mode, Sidecar,
//! applicable EnvoyFilters, own ports): proxies of the same scope share one [`ProxyConfig`].
//! An endpoint-only change keeps the cached configurations and swaps in the re-encoded
//! assignments of the changed EDS clusters: clusters, listeners and routes are not re-rendered.
//! A Service change keeps the configurations that cannot see it, splices it into those it can
//! ([`splice`]) and drops the rest; any other configuration change drops every cached
//! configuration. An endpoint change finds the assignments to re-encode through each cached
//! configuration's positions of them, one index shared by the configurations that hold the
//! same assignments (the same interned `Arc`s, as every unscoped namespace's). Encoded
//! resources are interned by content ([`interner`]), so an identical resource is one
//! `Arc<Resource>` across proxies and across re-renders, and its version (hex SHA-256 of the
//! encoding) is stable across restarts.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Pod;
use meshplane_crds::membership::{self, ControlPlaneFacts, NamespaceFacts, TagFacts};
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::security::WorkloadMtls;
use meshplane_crds::{AuthorizationPolicy, EnvoyFilter, MeshConfig, PeerAuthentication, Sidecar};

mod interner;
mod keyed;
mod route_encoding;
mod splice;

use interner::Interner;
use route_encoding::RouteParts;

use crate::config_events::{self, ConfigEvent, EventSink};
use crate::credentials::{Access, CredentialDecider};
use crate::envoyfilter;
use crate::generator::ConfigGenerator;
pub use crate::generator::{Change, ChangeKind};
use crate::model::{
    list_key, same_resources, type_url, Kind, ListKey, Object, ObjectKey, ProxyConfig, ProxyKind,
    ProxyNode, Resource, SourceEvent, VhdsRoutes,
};
use crate::translate::endpoints::{AssignmentKey, AssignmentScope};
use crate::translate::registry::{self, ServiceModel};
use crate::translate::{self, InboundPort, Registry, Translated};

/// Everything a rendered configuration depends on besides the registry: proxies with equal
/// keys get the same configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ScopeKey {
    namespace: String,
    captures: bool,
    sidecar: Option<(String, String)>,
    envoy_filters: Vec<String>,
    inbound: Vec<InboundPort>,
    loopback: Option<String>,
    /// Whether the proxy has its SDS secrets, and the PeerAuthentication modes of its workload.
    sds: bool,
    peer_mtls: WorkloadMtls,
    /// The AuthorizationPolicies of its workload (namespace/name; their specs are part of the
    /// registry, whose changes empty the cache).
    authz: Vec<(Option<String>, Option<String>)>,
    /// What else of the proxy its traffic config depends on (kind, gateway selection,
    /// `sourceLabels` conditions).
    traffic: translate::TrafficKey,
}

/// Most rendered configurations kept; the oldest goes first. The key is built only from the
/// tenant's own objects and the proxy's verified namespace (node metadata `LOOPBACK_ADDR`
/// counts only where the operator of the instance allowed it), so real tenants stay far below.
pub const MAX_CACHED_SCOPES: usize = 16_384;

/// A rendered configuration, with where its EDS resources sit.
struct CachedConfig {
    config: Arc<ProxyConfig>,
    /// The proxy it was rendered for (one of the scope's: they render alike).
    node: ProxyNode,
    /// What each of `config.routes` was assembled from, in the same order.
    routes: Vec<RouteParts>,
    /// Positions in `config.endpoints` by the cluster whose endpoint change re-encodes them:
    /// a cluster's own assignment, and those of its subset clusters (`outbound|port|subset|host`,
    /// built from the same endpoints). An endpoint change finds what to patch here instead of
    /// looking at every assignment of every configuration.
    eds_at: Arc<EdsIndex>,
}

/// Positions of assignments by the cluster whose endpoint change re-encodes them.
type EdsIndex = HashMap<String, Vec<usize>>;

impl CachedConfig {
    fn new(config: Arc<ProxyConfig>, node: ProxyNode, routes: Vec<RouteParts>) -> Self {
        Self::indexed(config, node, routes, &mut EdsIndexMemo::default())
    }

    /// Like [`CachedConfig::new`], taking the index of its assignments from `memo` when a
    /// configuration updated before it holds the same ones.
    fn indexed(
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
struct EdsIndexMemo {
    /// By the number of assignments and the addresses of the first and last; the candidates
    /// are then compared in full. The configurations are held, so no address is reused.
    built: HashMap<ListKey, Vec<IndexedConfig>>,
}

/// A configuration and the index of its assignments.
type IndexedConfig = (Arc<ProxyConfig>, Arc<EdsIndex>);

impl EdsIndexMemo {
    fn index(&mut self, config: &Arc<ProxyConfig>) -> Arc<EdsIndex> {
        let list = &config.endpoints;
        let candidates = self.built.entry(list_key(list)).or_default();
        if let Some((_, index)) = candidates
            .iter()
            .find(|(c, _)| same_resources(c.endpoints.iter(), list))
        {
            return Arc::clone(index);
        }
        let mut index = EdsIndex::new();
        for (at, r) in list.iter().enumerate() {
            let parent = registry::parse_outbound_cluster_name(&r.name)
                .filter(|(_, subset, _)| !subset.is_empty())
                .map(|(port, _, host)| registry::outbound_cluster_name(port, host));
            index
                .entry(parent.unwrap_or_else(|| r.name.clone()))
                .or_default()
                .push(at);
        }
        let index = Arc::new(index);
        candidates.push((Arc::clone(config), Arc::clone(&index)));
        index
    }
}

#[derive(Default)]
struct RenderCache {
    configs: HashMap<ScopeKey, CachedConfig>,
    /// Keys of `configs` in insertion order, for eviction.
    order: std::collections::VecDeque<ScopeKey>,
    interner: Interner,
    /// Configurations updated by splicing a Service change in (tests and debugging).
    spliced: u64,
}

impl RenderCache {
    /// Drops every rendered configuration (their eviction order too, which would otherwise
    /// keep naming them and, once as long as the limit, evict live ones).
    fn clear_configs(&mut self) {
        self.configs.clear();
        self.order.clear();
    }
}

/// A relist in progress: objects of these kinds in this namespace not seen again before
/// `Synced` are deleted.
struct PendingResync {
    namespace: Option<String>,
    kinds: Vec<Kind>,
    seen: BTreeSet<ObjectKey>,
}

/// The in-memory state of one tenant, as one revision's instance sees it.
pub struct TenantIndex {
    tenant: String,
    revision: String,
    control_namespace: String,
    mesh_config: MeshConfig,
    /// Tags pointing at this revision: given on the command line (directory mode), or told by
    /// the source (Kubernetes mode, [`SourceEvent::Tags`]).
    tags: BTreeSet<String>,
    /// Gateways the operator runs for the tenant, as told by the source (Kubernetes mode);
    /// none: from the tenant's MeshControlPlanes (directory mode).
    gateway_deployments: Option<Vec<meshplane_crds::controlplane::GatewayDeployment>>,
    /// Members as told by the source (Kubernetes mode); none: derived from Namespaces.
    explicit_members: Option<BTreeSet<String>>,
    objects: BTreeMap<ObjectKey, Object>,
    resync: Vec<PendingResync>,
    members: BTreeSet<String>,
    registry: Arc<Registry>,
    /// What per-key updates of the registry need beside it.
    keys: keyed::Keys,
    /// The verdict on the traffic config of `registry`.
    diagnostics: Arc<translate::diagnostics::Diagnostics>,
    cache: Mutex<RenderCache>,
    /// Most configurations `cache` keeps ([`MAX_CACHED_SCOPES`]).
    cache_limit: usize,
    /// Where findings about config objects that are not applied go (Kubernetes mode: Events).
    events: EventSink,
    /// Which gateway proxies may get which credential Secrets (Kubernetes mode); none: every
    /// gateway of the namespace gets them (directory mode has no API server to ask).
    credential_access: Option<Arc<dyn CredentialDecider>>,
}

impl TenantIndex {
    /// An empty index of revision `revision` of `tenant`.
    pub fn new(
        tenant: &str,
        revision: &str,
        control_namespace: &str,
        mesh_config: MeshConfig,
    ) -> Self {
        let registry = Registry {
            control_namespace: control_namespace.to_string(),
            mesh_config: MeshConfig {
                trust_domain: Some(mesh_config.trust_domain_of(tenant)),
                ..mesh_config.clone()
            },
            ..Registry::default()
        };
        Self {
            tenant: tenant.to_string(),
            revision: revision.to_string(),
            control_namespace: control_namespace.to_string(),
            mesh_config,
            tags: BTreeSet::new(),
            gateway_deployments: None,
            explicit_members: None,
            objects: BTreeMap::new(),
            resync: Vec::new(),
            members: BTreeSet::new(),
            registry: Arc::new(registry),
            keys: keyed::Keys::default(),
            diagnostics: Arc::default(),
            cache: Mutex::new(RenderCache::default()),
            cache_limit: MAX_CACHED_SCOPES,
            events: EventSink::default(),
            credential_access: None,
        }
    }

    /// Serves a Gateway server's credential to a gateway proxy only when `access` says its
    /// ServiceAccount may `get` the Secret (SubjectAccessReview).
    pub fn with_credential_access<D: CredentialDecider + 'static>(
        mut self,
        access: Arc<D>,
    ) -> Self {
        let access: Arc<dyn CredentialDecider> = access;
        self.credential_access = Some(access);
        self
    }

    /// Reports config objects that are not applied (invalid, beyond the EnvoyFilter policy,
    /// patches that cannot apply) to `sink`, once per object generation.
    pub fn with_events(mut self, sink: EventSink) -> Self {
        self.events = sink;
        self
    }

    /// Keeps at most `limit` rendered configurations (at least one).
    pub fn with_cache_limit(mut self, limit: usize) -> Self {
        self.cache_limit = limit.max(1);
        self
    }

    /// The verdict on the tenant's VirtualServices, DestinationRules and Gateways.
    pub fn diagnostics(&self) -> Arc<translate::diagnostics::Diagnostics> {
        Arc::clone(&self.diagnostics)
    }

    /// Adds tags that resolve to this revision (directory mode's `--tags`).
    pub fn with_tags(mut self, tags: impl IntoIterator<Item = String>) -> Self {
        self.tags.extend(tags);
        self
    }

    /// The tenant's member namespaces.
    pub fn members(&self) -> &BTreeSet<String> {
        &self.members
    }

    /// Whether proxies of `namespace` belong to this tenant.
    pub fn is_member(&self, namespace: &str) -> bool {
        self.members.contains(namespace)
    }

    /// The tenant's control namespace.
    pub fn control_namespace(&self) -> &str {
        &self.control_namespace
    }

    /// Labels of a Pod of the tenant (for proxies whose node metadata carries none).
    pub fn pod_labels(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, String>> {
        let key = ObjectKey {
            kind: Kind::Pod,
            namespace: Some(namespace.to_string()),
            name: name.to_string(),
        };
        match self.objects.get(&key) {
            Some(Object::Pod(pod)) if self.in_tenant(&key) => {
                Some(pod.metadata.labels.clone().unwrap_or_default())
            }
            _ => None,
        }
    }

    /// The registry translation currently reads.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Folds one source event into the state.
    pub fn apply(&mut self, ev: SourceEvent) -> Change {
        let mut touched = BTreeSet::new();
        match ev {
            SourceEvent::Upsert(obj) => {
                let key = obj.key();
                if let Some(ns) = &key.namespace {
                    touched.insert(ns.clone());
                }
                if let Err(why) = obj.validate() {
                    // Admitted without the validating webhook (created before its namespace
                    // joined, or while the webhook was down): skipped as the directory source
                    // skips it. Its previous version goes too (what is applied is never older
                    // than what the user wrote), and a relist does not count it as seen.
                    self.report_invalid(&obj, &why);
                    if self.objects.remove(&key).is_none() {
                        return Change::default();
                    }
                    if !self.resync.is_empty() {
                        return Change::default();
                    }
                    return self.rebuild_touched(touched);
                }
                for r in self.resync.iter_mut() {
                    r.seen.insert(key.clone());
                }
                let old = self.objects.insert(key.clone(), obj);
                if self.resync.is_empty() && keyed::KINDS.contains(&key.kind) {
                    return self.apply_keyed(&key, old.as_ref());
                }
            }
            SourceEvent::Delete(key) => {
                if let Some(ns) = &key.namespace {
                    touched.insert(ns.clone());
                }
                let old = self.objects.remove(&key);
                if self.resync.is_empty() && keyed::KINDS.contains(&key.kind) {
                    return self.apply_keyed(&key, old.as_ref());
                }
            }
            SourceEvent::Members(members) => {
                // Objects outside the tenant are dropped, not only hidden.
                let control = self.control_namespace.clone();
                self.objects.retain(|k, _| {
                    k.namespace
                        .as_ref()
                        .is_none_or(|ns| *ns == control || members.contains(ns))
                });
                self.explicit_members = Some(members);
            }
            SourceEvent::MeshConfig(mesh_config) => {
                self.mesh_config = *mesh_config;
            }
            SourceEvent::GatewayDeployments(mut gateways) => {
                gateways.sort();
                self.gateway_deployments = Some(gateways);
            }
            SourceEvent::Tags(tags) => {
                self.tags = tags;
            }
            // Nothing of the registry changed: gateways' scope keys carry what they may read,
            // so their renders follow the new answers.
            SourceEvent::CredentialAccess => return Change::config(),
            SourceEvent::Resync { namespace, kinds } => {
                self.resync.push(PendingResync {
                    namespace,
                    kinds,
                    seen: BTreeSet::new(),
                });
                // The registry is rebuilt once, at Synced.
                return Change::default();
            }
            // Readiness is the push loop's business.
            SourceEvent::Ready => return Change::default(),
            SourceEvent::Synced => {
                for r in std::mem::take(&mut self.resync) {
                    self.objects.retain(|k, _| {
                        let in_scope = r.kinds.contains(&k.kind)
                            && (r.namespace.is_none() || r.namespace == k.namespace);
                        !in_scope || r.seen.contains(k)
                    });
                }
            }
        }
        if !self.resync.is_empty() {
            return Change::default();
        }
        self.rebuild_touched(touched)
    }

    fn rebuild_touched(&mut self, touched: BTreeSet<String>) -> Change {
        let mut change = self.rebuild();
        if change.kind != ChangeKind::None {
            change.namespaces.extend(touched);
        }
        change
    }

    /// Reports an object of the tenant, used by this revision, that breaks validation.
    fn report_invalid(&self, obj: &Object, why: &meshplane_crds::validation::ValidationErrors) {
        let key = obj.key();
        let names = self.revision_names();
        if !self.in_tenant(&key) || !config_in_revision(obj, &names) {
            return;
        }
        let note = format!("not applied to the tenant's proxies: {why}");
        if let Some(ev) = ConfigEvent::about(obj, config_events::INVALID_CONFIG, note) {
            self.events.report(ev);
        }
    }

    /// Folds the change of one Service, EndpointSlice or Pod (`before` is what it was) into the
    /// registry without rebuilding it.
    fn apply_keyed(&mut self, key: &ObjectKey, before: Option<&Object>) -> Change {
        if !self.in_tenant(key) {
            return Change::default();
        }
        let namespace = key.namespace.clone().unwrap_or_default();
        let after = self.objects.get(key);
        let reg = Arc::make_mut(&mut self.registry);
        let mut config = false;
        // Addresses whose sidecar status changed: their endpoints are marked anew.
        let mut meshed: BTreeSet<String> = BTreeSet::new();
        // A Service's model before and after the event.
        let mut service_models: Option<Vec<ServiceModel>> = None;
        let hosts = match key.kind {
            Kind::Service => {
                let model = match after {
                    Some(Object::Service(svc)) => registry::service_model(svc),
                    _ => None,
                };
                let Some(models) = self.keys.set_service(reg, &namespace, &key.name, model) else {
                    return Change::default();
                };
                config = true;
                let hosts = models.iter().map(|m| m.hostname.clone()).collect();
                service_models = Some(models);
                hosts
            }
            Kind::EndpointSlice => self.keys.set_slice(&namespace, &key.name, before, after),
            Kind::Pod => {
                let ports = match after {
                    Some(Object::Pod(pod)) => registry::pod_named_ports(pod),
                    _ => BTreeMap::new(),
                };
                meshed = meshed_address_change(reg, before, after);
                let id = (namespace.clone(), key.name.clone());
                if ports.is_empty() {
                    config = reg.pod_ports.remove(&id).is_some();
                } else if reg.pod_ports.get(&id) != Some(&ports) {
                    reg.pod_ports.insert(id, ports);
                    config = true;
                }
                let mut hosts = self.keys.pod_selecting_hosts(reg, &namespace);
                // Slice endpoints carry their pod's labels (what subsets select): a pod whose
                // labels or addresses changed moves between the subsets of its namespace's
                // Services.
                if keyed::labels_or_addresses_changed(before, after) {
                    hosts.extend(self.keys.hosts_with_pod(
                        &self.objects,
                        &namespace,
                        before,
                        after,
                    ));
                }
                hosts
            }
            _ => BTreeSet::new(),
        };
        let mut clusters = self.keys.recompute_endpoints(reg, &self.objects, &hosts);
        if !meshed.is_empty() {
            clusters.extend(
                reg.endpoints
                    .iter()
                    .filter(|(_, eps)| eps.iter().any(|ep| meshed.contains(&ep.address)))
                    .map(|(name, _)| name.clone()),
            );
        }
        // The identities a host's clusters verify follow the accounts behind its endpoints:
        // when that set changes, the clusters change (contract 11), not only their endpoints.
        let touched_hosts: BTreeSet<String> = clusters
            .iter()
            .filter_map(|c| registry::parse_outbound_cluster_name(c).map(|(_, _, h)| h.to_string()))
            .chain(hosts.iter().map(|h| h.to_string()))
            .collect();
        if registry::refresh_service_accounts(reg, touched_hosts) {
            config = true;
        }
        let mut change = Change {
            namespaces: BTreeSet::from([namespace]),
            ..Change::default()
        };
        if config {
            change.kind = ChangeKind::Config;
            // Which hosts exist decides verdicts (HostNotFound).
            self.diagnostics = Arc::new(translate::diagnostics::diagnose(reg));
            // A Service change re-renders only the scopes that may see it.
            let kept = service_models.is_some_and(|models| self.update_seeing(&models));
            if kept {
                self.patch_endpoints(&clusters);
            } else {
                self.lock_cache().clear_configs();
            }
        } else if !clusters.is_empty() {
            change.kind = ChangeKind::Endpoints;
            self.patch_endpoints(&clusters);
            change.clusters = clusters;
        } else {
            return Change::default();
        }
        change
    }

    /// Recomputes membership and the registry, and says what differs.
    fn rebuild(&mut self) -> Change {
        let members = self.compute_members();
        let members_changed = members != self.members;
        self.members = members;
        let (next, keys) = self.build_registry();
        self.keys = keys;
        let prev = &self.registry;
        let config_changed = prev.mesh_config != next.mesh_config
            || prev.services != next.services
            || !same_objects(&prev.sidecars, &next.sidecars, |a: &Sidecar, b| {
                a.spec == b.spec
            })
            || !same_objects(
                &prev.envoy_filters,
                &next.envoy_filters,
                |a: &EnvoyFilter, b| a.spec == b.spec,
            )
            || prev.pod_ports != next.pod_ports
            || prev.meshed_addresses != next.meshed_addresses
            || prev.service_accounts != next.service_accounts
            || !same_objects_list(&prev.peer_authentications, &next.peer_authentications)
            || !same_policies(&prev.authorization_policies, &next.authorization_policies)
            || !prev.same_traffic_config(&next);
        let mut change = Change {
            members_changed,
            ..Change::default()
        };
        if config_changed || members_changed {
            change.kind = ChangeKind::Config;
        } else if prev.endpoints != next.endpoints {
            change.kind = ChangeKind::Endpoints;
            let names: BTreeSet<&String> =
                prev.endpoints.keys().chain(next.endpoints.keys()).collect();
            change.clusters = names
                .into_iter()
                .filter(|n| prev.endpoints.get(*n) != next.endpoints.get(*n))
                .cloned()
                .collect();
        }
        match change.kind {
            ChangeKind::None => {}
            ChangeKind::Endpoints => {
                self.registry = Arc::new(next);
                self.patch_endpoints(&change.clusters);
            }
            ChangeKind::Config => {
                self.diagnostics = Arc::new(translate::diagnostics::diagnose(&next));
                self.registry = Arc::new(next);
                self.lock_cache().clear_configs();
            }
        }
        change
    }

    fn compute_members(&self) -> BTreeSet<String> {
        if let Some(m) = &self.explicit_members {
            return m.clone();
        }
        // Directory mode: the same rules as the operator (`meshplane_crds::membership`), over
        // the Namespaces, MeshControlPlanes and MeshRevisionTags of the directory. This
        // revision exists even when the directory does not declare it; `--tags` point at it.
        let mut namespaces = Vec::new();
        let mut control_planes: Vec<ControlPlaneFacts> = Vec::new();
        let mut tags: Vec<TagFacts> = Vec::new();
        for obj in self.objects.values() {
            match obj {
                Object::Namespace(ns) => namespaces.push(NamespaceFacts::of(&ns.metadata)),
                Object::MeshControlPlane(mcp) => {
                    control_planes.push(ControlPlaneFacts::from(mcp.as_ref()))
                }
                Object::MeshRevisionTag(tag) => tags.push(TagFacts::from(tag.as_ref())),
                _ => {}
            }
        }
        if !control_planes.iter().any(|cp| cp.revision == self.revision) {
            control_planes.push(ControlPlaneFacts {
                name: self.revision.clone(),
                created: None,
                tenant: self.tenant.clone(),
                revision: self.revision.clone(),
                control_namespace: self.control_namespace.clone(),
                trust_domain: self.mesh_config.trust_domain_of(&self.tenant),
                namespace_selector: None,
                control_namespace_uid: None,
                handed_namespace_uid: None,
                legacy_claim: false,
            });
        }
        for tag in &self.tags {
            if !tags.iter().any(|t| t.name == *tag) {
                tags.push(TagFacts {
                    name: tag.clone(),
                    target: self.revision.clone(),
                    recorded_tenant: None,
                    recorded_revision: None,
                });
            }
        }
        membership::compute(&namespaces, &control_planes, &tags).tenant_members(&self.tenant)
    }

    /// The names that select this revision: its own and its tags' (directory mode: also the
    /// directory's tags that point at it).
    fn revision_names(&self) -> BTreeSet<&str> {
        let mut names: BTreeSet<&str> = self.tags.iter().map(String::as_str).collect();
        names.insert(&self.revision);
        for obj in self.objects.values() {
            if let Object::MeshRevisionTag(tag) = obj {
                if tag.spec.revision == self.revision {
                    if let Some(name) = tag.metadata.name.as_deref() {
                        names.insert(name);
                    }
                }
            }
        }
        names
    }

    fn in_tenant(&self, key: &ObjectKey) -> bool {
        key.namespace
            .as_ref()
            .is_some_and(|ns| *ns == self.control_namespace || self.members.contains(ns))
    }

    /// The mesh settings: those of this revision's MeshControlPlane when the source delivers
    /// it (directory mode), else the ones given at start.
    fn effective_mesh_config(&self) -> MeshConfig {
        let config = self
            .objects
            .values()
            .find_map(|obj| match obj {
                Object::MeshControlPlane(mcp)
                    if mcp.spec.tenant == self.tenant && mcp.revision() == self.revision =>
                {
                    Some(mcp.spec.mesh_config.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| self.mesh_config.clone());
        // Translation binds identities to the tenant's trust domain, so it is always resolved.
        let trust_domain = config.trust_domain_of(&self.tenant);
        MeshConfig {
            trust_domain: Some(trust_domain),
            ..config
        }
    }

    /// The tenant's gateways: from the operator (Kubernetes mode), else from the tenant's
    /// MeshControlPlanes in the directory.
    fn effective_gateway_deployments(
        &self,
    ) -> Vec<meshplane_crds::controlplane::GatewayDeployment> {
        if let Some(told) = &self.gateway_deployments {
            return told.clone();
        }
        let mut out: Vec<_> = self
            .objects
            .values()
            .filter_map(|obj| match obj {
                Object::MeshControlPlane(mcp) if mcp.spec.tenant == self.tenant => {
                    mcp.gateway_deployment()
                }
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    /// The registry from every object, with what per-key updates need beside it.
    fn build_registry(&self) -> (Registry, keyed::Keys) {
        let mut reg = Registry {
            control_namespace: self.control_namespace.clone(),
            mesh_config: self.effective_mesh_config(),
            ..Registry::default()
        };
        let mut keys = keyed::Keys::default();
        let mut models: Vec<(keyed::Origin, ServiceModel)> = Vec::new();
        let mut pods: Vec<&Pod> = Vec::new();
        let names = self.revision_names();
        for (key, obj) in self
            .objects
            .iter()
            .filter(|(k, o)| self.in_tenant(k) && config_in_revision(o, &names))
        {
            let ns = key.namespace.clone().unwrap_or_default();
            match obj {
                Object::Service(svc) => {
                    if let Some(model) = registry::service_model(svc) {
                        keys.services.insert((ns, key.name.clone()), model);
                    }
                }
                Object::ServiceEntry(se) => {
                    for (i, m) in registry::service_entry_models(se).into_iter().enumerate() {
                        models.push((keyed::Origin::entry(&m, &key.name, i), m));
                    }
                }
                Object::EndpointSlice(slice) => {
                    if let Some(svc) = slice
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("kubernetes.io/service-name"))
                    {
                        keys.slices
                            .entry((ns, svc.clone()))
                            .or_default()
                            .insert(key.name.clone());
                    }
                }
                Object::Sidecar(s) => reg.sidecars.entry(ns).or_default().push((**s).clone()),
                Object::EnvoyFilter(f) => {
                    // The policy holds again here: an EnvoyFilter admitted before the policy
                    // narrowed, while the webhook was down, or read from a directory.
                    let violations = meshplane_crds::envoyfilter_policy::check(
                        &reg.mesh_config.envoy_filter_policy,
                        &ns,
                        &self.control_namespace,
                        &f.spec,
                    );
                    if violations.is_empty() {
                        reg.envoy_filters.entry(ns).or_default().push((**f).clone())
                    } else {
                        let why: Vec<String> = violations.iter().map(ToString::to_string).collect();
                        tracing::warn!(
                            envoyfilter = %format!("{ns}/{}", key.name),
                            violations = %why.join("; "),
                            "EnvoyFilter not applied: the tenant's EnvoyFilter policy does not allow it"
                        );
                        if let Some(r) = config_events::Regarding::envoy_filter(f) {
                            self.events.report(ConfigEvent::regarding(
                                r,
                                config_events::ENVOY_FILTER_BEYOND_POLICY,
                                format!("not applied to the tenant's proxies: {}", why.join("; ")),
                            ));
                        }
                    }
                }
                Object::PeerAuthentication(pa) => reg.peer_authentications.push((**pa).clone()),
                Object::AuthorizationPolicy(ap) => reg.authorization_policies.push((**ap).clone()),
                Object::VirtualService(v) => reg.virtual_services.push((**v).clone()),
                Object::DestinationRule(d) => reg.destination_rules.push((**d).clone()),
                Object::Gateway(g) => reg.gateways.push((**g).clone()),
                Object::Secret(secret) => {
                    if let Some(tls) = registry::tls_secret(secret) {
                        reg.tls_secrets.insert((ns, key.name.clone()), tls);
                    }
                }
                Object::Pod(p) => {
                    if let Some(ip) = registry::meshed_pod_address(p) {
                        if let Some(account) = registry::meshed_pod_account(p) {
                            reg.meshed_accounts.insert(ip.clone(), account);
                        }
                        reg.meshed_addresses.insert(ip);
                    }
                    let ports = registry::pod_named_ports(p);
                    if !ports.is_empty() {
                        reg.pod_ports.insert((ns, key.name.clone()), ports);
                    }
                    pods.push(p);
                }
                _ => {}
            }
        }
        let pod_labels = registry::PodLabels::new(pods.iter().copied());
        for obj in self
            .objects
            .iter()
            .filter(|(k, _)| self.in_tenant(k))
            .map(|(_, o)| o)
        {
            if let Object::EndpointSlice(slice) = obj {
                registry::add_slice_endpoints(
                    slice,
                    &keys.services,
                    &pod_labels,
                    &mut reg.endpoints,
                );
            }
        }
        for (_, svc) in &models {
            registry::add_entry_pod_endpoints(svc, pods.iter().copied(), &mut reg.endpoints);
        }
        for ((_, name), m) in &keys.services {
            models.push((keyed::Origin::service(m, name), m.clone()));
        }
        reg.services = keys.order(models);
        keys.index_clusters(&reg.endpoints);
        let hosts: BTreeSet<String> = reg.services.iter().map(|s| s.hostname.clone()).collect();
        registry::refresh_service_accounts(&mut reg, hosts);
        registry::sort_oldest_first(&mut reg.virtual_services);
        registry::sort_oldest_first(&mut reg.destination_rules);
        registry::sort_oldest_first(&mut reg.gateways);
        reg.gateway_deployments = self.effective_gateway_deployments();
        for list in reg.sidecars.values_mut() {
            list.sort_by(|a, b| {
                (&a.metadata.creation_timestamp, &a.metadata.name)
                    .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
            });
        }
        (reg, keys)
    }

    fn lock_cache(&self) -> MutexGuard<'_, RenderCache> {
        // The cache holds no invariant a panicking holder could break: recover it.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn scope_key(&self, node: &ProxyNode) -> ScopeKey {
        let scope = translate::scope::proxy_scope(&self.registry, &node.namespace, &node.labels);
        ScopeKey {
            namespace: node.namespace.clone(),
            captures: node.capture_mode != CaptureMode::None,
            envoy_filters: envoyfilter::applicable(&self.registry, node)
                .into_iter()
                .map(envoyfilter::filter_id)
                .collect(),
            inbound: translate::inbound_ports(&self.registry, node, &scope),
            sidecar: scope.sidecar,
            loopback: node.loopback.clone(),
            sds: node.sds,
            peer_mtls: translate::peer_mtls(&self.registry, node),
            authz: translate::authorization_policies(&self.registry, node)
                .into_iter()
                .map(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()))
                .collect(),
            traffic: translate::traffic_key(&self.registry, node),
        }
    }

    /// Re-encodes the assignments of `clusters` from the current registry into every cached
    /// configuration holding them. EDS is the only output that reads endpoints (EnvoyFilters
    /// cannot patch it), and each assignment is built as the full render builds it for the
    /// scope (subsets from its namespace's DestinationRule; mutual TLS marks for every proxy
    /// but proxyless gRPC), so the result equals a full render.
    fn patch_endpoints(&self, clusters: &BTreeSet<String>) {
        let registry = Arc::clone(&self.registry);
        let mut cache = self.lock_cache();
        let RenderCache {
            configs, interner, ..
        } = &mut *cache;
        // Scopes with the same assignment of a cluster share it: encoded once.
        let mut fresh: HashMap<AssignmentKey, Arc<Resource>> = HashMap::new();
        for (key, cached) in configs.iter_mut() {
            let positions: Vec<usize> = clusters
                .iter()
                .filter_map(|c| cached.eds_at.get(c))
                .flatten()
                .copied()
                .collect();
            if positions.is_empty() {
                continue;
            }
            let scope = AssignmentScope::new(&key.namespace, key.traffic.kind());
            let mut next = ProxyConfig::clone(&cached.config);
            for at in positions {
                let Some(r) = next.endpoints.get_mut(at) else {
                    continue;
                };
                let memo = scope.key(&r.name);
                *r = match fresh.get(&memo) {
                    Some(f) => Arc::clone(f),
                    None => {
                        let cla = scope.load_assignment(&registry, &r.name);
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
    fn update_seeing(&self, models: &[ServiceModel]) -> bool {
        let registry = &self.registry;
        let hostnames: BTreeSet<&str> = models.iter().map(|m| m.hostname.as_str()).collect();
        if registry.virtual_services.iter().any(|vs| {
            hostnames
                .iter()
                .any(|h| translate::traffic::vs_names_host(vs, h))
        }) {
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
        let mut cache = self.lock_cache();
        let RenderCache {
            configs,
            order,
            interner,
            spliced,
        } = &mut *cache;
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

    /// The full configuration of one proxy: translation, then its EnvoyFilters, encoded.
    pub fn render_proxy(&self, node: &ProxyNode) -> ProxyConfig {
        ProxyConfig::clone(&self.render_proxy_shared(node))
    }

    /// The proxy as translation sees it: with its Pod's labels as the API server has them when
    /// the index knows the Pod (what the proxy claims in `LABELS` only otherwise), so that its
    /// Services' inbound ports, Sidecar and EnvoyFilter selectors follow the real workload; a
    /// gateway with the credentials its verified ServiceAccount may read.
    fn workload_node<'a>(&self, node: &'a ProxyNode) -> std::borrow::Cow<'a, ProxyNode> {
        let labels = node
            .pod_name
            .as_deref()
            .and_then(|pod| self.pod_labels(&node.namespace, pod));
        let mut node = match labels {
            Some(labels) if labels != node.labels => {
                let mut node = node.clone();
                node.labels = labels;
                std::borrow::Cow::Owned(node)
            }
            _ => std::borrow::Cow::Borrowed(node),
        };
        if let (ProxyKind::Router, Some(access)) = (node.kind, &self.credential_access) {
            let readable = self.readable_credentials(access.as_ref(), &node);
            node.to_mut().readable_credentials = Some(readable);
        }
        node
    }

    /// The credentials of the Gateways selecting gateway `node` that its ServiceAccount may
    /// `get`, as far as is known now (an unknown answer is asked for and counts as refused).
    /// A proxy without a verified ServiceAccount reads none.
    fn readable_credentials(
        &self,
        access: &dyn CredentialDecider,
        node: &ProxyNode,
    ) -> BTreeSet<String> {
        let Some(account) = node.service_account.as_deref() else {
            return BTreeSet::new();
        };
        translate::gateway::credential_names(&self.registry, node)
            .into_iter()
            .filter(|secret| access.decide(&node.namespace, account, secret) == Access::Allowed)
            .collect()
    }

    /// Like [`TenantIndex::render_proxy`], as the one `Arc` every proxy of the scope shares
    /// until the next change.
    pub fn render_proxy_shared(&self, node: &ProxyNode) -> Arc<ProxyConfig> {
        let node = &*self.workload_node(node);
        let key = self.scope_key(node);
        if let Some(cached) = self.lock_cache().configs.get(&key) {
            return Arc::clone(&cached.config);
        }
        let (config, routes, errors) = self.render_encoded(node);
        self.report_patch_errors(node, &errors);
        let config = Arc::new(config);
        let cached = CachedConfig::new(Arc::clone(&config), node.clone(), routes);
        let mut cache = self.lock_cache();
        if cache.configs.insert(key.clone(), cached).is_none() {
            cache.order.push_back(key);
            while cache.order.len() > self.cache_limit {
                if let Some(oldest) = cache.order.pop_front() {
                    cache.configs.remove(&oldest);
                }
            }
        }
        config
    }

    /// How many rendered configurations are cached.
    pub fn cached_scopes(&self) -> usize {
        self.lock_cache().configs.len()
    }

    /// Renders a proxy's configuration without the scope cache (benchmarks, debugging).
    pub fn render_proxy_uncached(&self, node: &ProxyNode) -> ProxyConfig {
        let (config, errors) = self.render_proxy_checked(node);
        self.report_patch_errors(node, &errors);
        config
    }

    /// Reports the patches that could not be applied for `node`, one finding per EnvoyFilter
    /// naming each of its failed patches (once per generation of the filter).
    fn report_patch_errors(&self, node: &ProxyNode, errors: &[envoyfilter::PatchError]) {
        for e in errors {
            tracing::debug!(proxy = %node.id, error = %e, "EnvoyFilter patch not applied");
        }
        let mut by_filter: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for e in errors {
            by_filter
                .entry(e.filter.as_str())
                .or_default()
                .push(format!("spec.configPatches[{}]: {}", e.index, e.reason));
        }
        for (id, patches) in by_filter {
            let Some((ns, name)) = id.split_once('/') else {
                continue;
            };
            let filter = self
                .registry
                .envoy_filters
                .get(ns)
                .into_iter()
                .flatten()
                .find(|f| f.metadata.name.as_deref() == Some(name));
            let Some(regarding) = filter.and_then(config_events::Regarding::envoy_filter) else {
                continue;
            };
            let note = format!(
                "{}; not applied to proxy {} (the filter's other patches are)",
                patches.join("; "),
                node.id
            );
            self.events.report(ConfigEvent::regarding(
                regarding,
                config_events::ENVOY_FILTER_PATCH_NOT_APPLIED,
                note,
            ));
        }
    }

    /// Renders a proxy's configuration without the scope cache, with the EnvoyFilter patches
    /// that could not be applied (what `meshctl translate` and `meshctl analyze` report).
    pub fn render_proxy_checked(
        &self,
        node: &ProxyNode,
    ) -> (ProxyConfig, Vec<envoyfilter::PatchError>) {
        let (config, _, errors) = self.render_encoded(&self.workload_node(node));
        (config, errors)
    }

    /// Translates, patches and encodes the configuration of `node` (a workload node).
    fn render_encoded(
        &self,
        node: &ProxyNode,
    ) -> (ProxyConfig, Vec<RouteParts>, Vec<envoyfilter::PatchError>) {
        let mut translated = translate::translate(&self.registry, node);
        let filters = envoyfilter::applicable(&self.registry, node);
        let errors = envoyfilter::apply(&filters, &mut translated);
        // Proxyless gRPC clients speak state of the world: VHDS is for Envoys only.
        let vhds = node.kind != ProxyKind::Grpc;
        let (config, routes) = encode(&mut self.lock_cache().interner, translated, vhds);
        (config, routes, errors)
    }

    /// Whether a proxy receives any of these EDS clusters (for endpoint-only pushes).
    pub fn imports_any_cluster(&self, node: &ProxyNode, clusters: &BTreeSet<String>) -> bool {
        self.render_proxy_shared(node)
            .endpoints
            .iter()
            .any(|r| clusters.contains(&r.name))
    }
}

impl ConfigGenerator for TenantIndex {
    fn apply(&mut self, event: SourceEvent) -> Change {
        TenantIndex::apply(self, event)
    }
    fn render(&self, node: &ProxyNode) -> Arc<ProxyConfig> {
        self.render_proxy_shared(node)
    }
    fn members(&self) -> BTreeSet<String> {
        self.members.clone()
    }
    fn diagnostics(&self) -> Arc<translate::diagnostics::Diagnostics> {
        TenantIndex::diagnostics(self)
    }
    fn envoy_filter_policy(&self) -> meshplane_crds::envoyfilter_policy::EnvoyFilterPolicy {
        self.registry.mesh_config.envoy_filter_policy.clone()
    }
    fn credential_names(&self) -> BTreeSet<String> {
        translate::gateway::all_credential_names(&self.registry)
    }
}

/// Revision-scoped config, as Istio's `istio.io/rev` label on config: networking and security
/// config labelled `meshplane.io/rev` is used only by the revision it names, directly or
/// through a tag (`names`: the revision's own name and its tags'); unlabelled config is every
/// revision's of the tenant. This is how config meant for a canary reaches only the canary.
/// Other objects (Services, Pods, …) are facts, never scoped.
pub fn config_in_revision(obj: &Object, names: &BTreeSet<&str>) -> bool {
    let is_config = matches!(
        obj,
        Object::ServiceEntry(_)
            | Object::Sidecar(_)
            | Object::EnvoyFilter(_)
            | Object::PeerAuthentication(_)
            | Object::VirtualService(_)
            | Object::DestinationRule(_)
            | Object::Gateway(_)
    );
    if !is_config {
        return true;
    }
    obj.metadata()
        .labels
        .as_ref()
        .and_then(|l| l.get(meshplane_crds::names::REV_LABEL))
        .is_none_or(|rev| names.contains(rev.as_str()))
}

/// Whether two lists of PeerAuthentications are the same policies (key and spec, in order).
fn same_objects_list(a: &[PeerAuthentication], b: &[PeerAuthentication]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.metadata.namespace == y.metadata.namespace
                && x.metadata.name == y.metadata.name
                && x.metadata.creation_timestamp == y.metadata.creation_timestamp
                && x.spec == y.spec
        })
}

/// Whether two lists of AuthorizationPolicies are the same policies (key and spec, in order).
fn same_policies(a: &[AuthorizationPolicy], b: &[AuthorizationPolicy]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.metadata.namespace == y.metadata.namespace
                && x.metadata.name == y.metadata.name
                && x.spec == y.spec
        })
}

/// Folds a Pod change into [`Registry::meshed_addresses`]; returns the addresses whose sidecar
/// status changed.
fn meshed_address_change(
    reg: &mut Registry,
    before: Option<&Object>,
    after: Option<&Object>,
) -> BTreeSet<String> {
    let address = |o: Option<&Object>| match o {
        Some(Object::Pod(p)) => registry::meshed_pod_address(p),
        _ => None,
    };
    let account = |o: Option<&Object>| match o {
        Some(Object::Pod(p)) => registry::meshed_pod_account(p),
        _ => None,
    };
    let (old, new) = (address(before), address(after));
    if old == new && account(before) == account(after) {
        return BTreeSet::new();
    }
    let mut changed = BTreeSet::new();
    if let Some(old) = old {
        reg.meshed_addresses.remove(&old);
        reg.meshed_accounts.remove(&old);
        changed.insert(old);
    }
    if let Some(new) = new {
        reg.meshed_addresses.insert(new.clone());
        if let Some(account) = account(after) {
            reg.meshed_accounts.insert(new.clone(), account);
        }
        changed.insert(new);
    }
    changed
}

fn same_objects<T>(
    a: &BTreeMap<String, Vec<T>>,
    b: &BTreeMap<String, Vec<T>>,
    same_spec: impl Fn(&T, &T) -> bool,
) -> bool
where
    T: kube_core::Resource,
{
    let flat = |m: &BTreeMap<String, Vec<T>>| -> usize { m.values().map(Vec::len).sum() };
    flat(a) == flat(b)
        && a.iter().all(|(ns, xs)| {
            b.get(ns).is_some_and(|ys| {
                xs.len() == ys.len()
                    && xs.iter().zip(ys).all(|(x, y)| {
                        x.meta().name == y.meta().name
                            && x.meta().creation_timestamp == y.meta().creation_timestamp
                            && same_spec(x, y)
                    })
            })
        })
}

/// A rendered configuration, encoded: route configurations from their virtual hosts'
/// encodings ([`route_encoding`]); `vhds`: with their VHDS form too.
fn encode(interner: &mut Interner, t: Translated, vhds: bool) -> (ProxyConfig, Vec<RouteParts>) {
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

#[cfg(test)]
mod keyed_tests;

#[cfg(test)]
mod validation_tests;
