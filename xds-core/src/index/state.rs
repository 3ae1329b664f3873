//! The tenant's state: its objects as the sources delivered them, relists in progress,
//! membership, and the [`Registry`] translation reads. Applying one [`SourceEvent`] says what
//! changed for proxies ([`Change`]) and which rendered configurations that invalidates
//! ([`Invalidation`]); the render cache ([`super::render_cache`]) acts on the latter.
//!
//! A Service, EndpointSlice or Pod event updates the registry per key ([`super::keyed`]): only
//! the hosts it concerns, with the endpoints of their clusters recomputed. Other events
//! (membership, mesh config, Sidecars, EnvoyFilters, ServiceEntries, relists) rebuild the
//! registry and compare it with the previous one ([`Registry::same_config`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use meshplane_crds::membership::{self, ControlPlaneFacts, NamespaceFacts, TagFacts};
use meshplane_crds::MeshConfig;

use super::keyed;
use crate::config_events::{self, ConfigEvent, EventSink};
use crate::generator::{Change, ChangeKind};
use crate::model::{Kind, Object, ObjectKey, SourceEvent};
use crate::translate::cluster_id::HostPort;
use crate::translate::diagnostics::{ConfigKind as DiagnosedKind, ConfigRef, Finding};
use crate::translate::registry::{self, ServiceModel};
use crate::translate::{self, Registry};

/// What applying one event did.
#[derive(Debug, Default)]
pub struct Applied {
    /// What proxies could see differently.
    pub change: Change,
    /// Which rendered configurations no longer hold.
    pub invalidation: Invalidation,
}

/// Which rendered configurations an applied event invalidates.
#[derive(Debug, Default, PartialEq)]
pub enum Invalidation {
    /// None (nothing changed, or what changed is part of each proxy's scope key).
    #[default]
    None,
    /// The assignments of the EDS clusters of these hosts' ports (and of their subsets).
    Endpoints(BTreeSet<HostPort>),
    /// A Kubernetes Service changed (`models`: what it was and what it is), and the endpoints
    /// of `clusters`: configurations that may see the Service are updated, the others keep
    /// everything but those assignments.
    Service {
        models: Vec<ServiceModel>,
        clusters: BTreeSet<HostPort>,
    },
    /// Every rendered configuration.
    All,
}

/// A relist in progress: objects of these kinds in this namespace not seen again before
/// `Synced` are deleted.
struct PendingResync {
    namespace: Option<String>,
    kinds: Vec<Kind>,
    seen: BTreeSet<ObjectKey>,
}

/// The in-memory state of one tenant, as one revision's instance sees it.
pub struct TenantState {
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
    pub(super) keys: keyed::Keys,
    /// The verdict on the traffic config of `registry`.
    diagnostics: Arc<translate::diagnostics::Diagnostics>,
    /// Where findings about config objects that are not applied go (Kubernetes mode: Events).
    pub(super) events: EventSink,
    /// The key sets fetched for the tenant's RequestAuthentications, by `jwksUri`.
    jwks: BTreeMap<String, translate::jwt::FetchedKeys>,
}

impl TenantState {
    /// An empty state of revision `revision` of `tenant`.
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
            events: EventSink::default(),
            jwks: BTreeMap::new(),
        }
    }

    /// Reports config objects that are not applied (invalid, beyond the EnvoyFilter policy,
    /// patches that cannot apply) to `sink`, once per object generation.
    pub fn with_events(mut self, sink: EventSink) -> Self {
        self.events = sink;
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

    /// The addresses the tenant's pods hold now (members and the control namespace;
    /// [`registry::held_pod_addresses`]).
    pub fn pod_addresses(&self) -> BTreeSet<std::net::IpAddr> {
        let first = ObjectKey {
            kind: Kind::Pod,
            namespace: None,
            name: String::new(),
        };
        self.objects
            .range(first..)
            .take_while(|(k, _)| k.kind == Kind::Pod)
            .filter(|(k, _)| self.in_tenant(k))
            .flat_map(|(_, o)| match o {
                Object::Pod(p) => registry::held_pod_addresses(p),
                _ => BTreeSet::new(),
            })
            .collect()
    }

    /// The addresses the Pod `key` holds as the state has it (none when unknown).
    pub fn pod_addresses_of(&self, key: &ObjectKey) -> BTreeSet<std::net::IpAddr> {
        match self.objects.get(key) {
            Some(Object::Pod(p)) => registry::held_pod_addresses(p),
            _ => BTreeSet::new(),
        }
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
    pub fn apply(&mut self, ev: SourceEvent) -> Applied {
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
                        return Applied::default();
                    }
                    if !self.resync.is_empty() {
                        return Applied::default();
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
            SourceEvent::Jwks(jwks) => {
                self.jwks = jwks;
            }
            // Nothing of the registry changed: gateways' scope keys carry what they may read,
            // so their renders follow the new answers.
            SourceEvent::CredentialAccess => {
                return Applied {
                    change: Change::config(),
                    invalidation: Invalidation::None,
                }
            }
            SourceEvent::Resync { namespace, kinds } => {
                self.resync.push(PendingResync {
                    namespace,
                    kinds,
                    seen: BTreeSet::new(),
                });
                // The registry is rebuilt once, at Synced.
                return Applied::default();
            }
            // Readiness is the push loop's business.
            SourceEvent::Ready => return Applied::default(),
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
            return Applied::default();
        }
        self.rebuild_touched(touched)
    }

    fn rebuild_touched(&mut self, touched: BTreeSet<String>) -> Applied {
        let mut applied = self.rebuild();
        if applied.change.kind != ChangeKind::None {
            applied.change.namespaces.extend(touched);
        }
        applied
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
    fn apply_keyed(&mut self, key: &ObjectKey, before: Option<&Object>) -> Applied {
        if !self.in_tenant(key) {
            return Applied::default();
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
                    return Applied::default();
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
            .map(|c| c.host.clone())
            .chain(hosts.iter().map(|h| h.to_string()))
            .collect();
        if registry::refresh_service_accounts(reg, touched_hosts) {
            config = true;
        }
        let mut change = Change {
            namespaces: BTreeSet::from([namespace]),
            ..Change::default()
        };
        let invalidation = if config {
            change.kind = ChangeKind::Config;
            // Which hosts exist decides verdicts (HostNotFound).
            self.diagnostics = Arc::new(translate::diagnostics::diagnose(reg));
            match service_models {
                // A Service change re-renders only the scopes that may see it.
                Some(models) => Invalidation::Service { models, clusters },
                None => Invalidation::All,
            }
        } else if !clusters.is_empty() {
            change.kind = ChangeKind::Endpoints;
            change.clusters = clusters.clone();
            Invalidation::Endpoints(clusters)
        } else {
            return Applied::default();
        };
        Applied {
            change,
            invalidation,
        }
    }

    /// Recomputes membership and the registry, and says what differs.
    fn rebuild(&mut self) -> Applied {
        let members = self.compute_members();
        let members_changed = members != self.members;
        self.members = members;
        let (next, keys) = self.build_registry();
        self.keys = keys;
        let prev = &self.registry;
        let config_changed = !prev.same_config(&next);
        let mut change = Change {
            members_changed,
            ..Change::default()
        };
        if config_changed || members_changed {
            change.kind = ChangeKind::Config;
        } else if prev.endpoints != next.endpoints {
            change.kind = ChangeKind::Endpoints;
            let ports: BTreeSet<&HostPort> =
                prev.endpoints.keys().chain(next.endpoints.keys()).collect();
            change.clusters = ports
                .into_iter()
                .filter(|p| prev.endpoints.get(*p) != next.endpoints.get(*p))
                .cloned()
                .collect();
        }
        let invalidation = match change.kind {
            ChangeKind::None => Invalidation::None,
            ChangeKind::Endpoints => {
                self.registry = Arc::new(next);
                Invalidation::Endpoints(change.clusters.clone())
            }
            ChangeKind::Config => {
                self.diagnostics = Arc::new(translate::diagnostics::diagnose(&next));
                self.registry = Arc::new(next);
                Invalidation::All
            }
        };
        Applied {
            change,
            invalidation,
        }
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
    pub(super) fn build_registry(&self) -> (Registry, keyed::Keys) {
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
                    reg.judged.insert(
                        ConfigRef {
                            kind: DiagnosedKind::ServiceEntry,
                            namespace: ns.clone(),
                            name: key.name.clone(),
                        },
                        (se.metadata.generation, Vec::new()),
                    );
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
                        reg.judged.insert(
                            ConfigRef {
                                kind: DiagnosedKind::EnvoyFilter,
                                namespace: ns.clone(),
                                name: key.name.clone(),
                            },
                            (
                                f.metadata.generation,
                                vec![Finding {
                                    reason: config_events::ENVOY_FILTER_BEYOND_POLICY,
                                    message: format!(
                                        "not applied to the tenant's proxies: {}",
                                        why.join("; ")
                                    ),
                                }],
                            ),
                        );
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
                Object::Telemetry(t) => reg.telemetries.push((**t).clone()),
                Object::RequestAuthentication(ra) => {
                    reg.request_authentications.push((**ra).clone())
                }
                Object::VirtualService(v) => reg.virtual_services.push((**v).clone()),
                Object::DestinationRule(d) => reg.destination_rules.push((**d).clone()),
                Object::Gateway(g) => reg.gateways.push((**g).clone()),
                Object::HTTPRoute(r) => reg.gateway_api.http_routes.push((**r).clone()),
                Object::GRPCRoute(r) => reg.gateway_api.grpc_routes.push((**r).clone()),
                Object::TLSRoute(r) => reg.gateway_api.tls_routes.push((**r).clone()),
                Object::TCPRoute(r) => reg.gateway_api.tcp_routes.push((**r).clone()),
                Object::ReferenceGrant(g) => reg.gateway_api.reference_grants.push((**g).clone()),
                Object::KubernetesGateway(g) => reg.gateway_api.gateways.push((**g).clone()),
                Object::GatewayClass(c) => reg.gateway_api.gateway_classes.push((**c).clone()),
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
        let hosts: BTreeSet<String> = reg.services.iter().map(|s| s.hostname.clone()).collect();
        registry::refresh_service_accounts(&mut reg, hosts);
        registry::sort_oldest_first(&mut reg.virtual_services);
        registry::sort_oldest_first(&mut reg.destination_rules);
        registry::sort_oldest_first(&mut reg.gateways);
        reg.gateway_api.sort();
        reg.gateway_api.mesh = crate::translate::gamma::compile(&reg);
        reg.gateway_deployments = self.effective_gateway_deployments();
        // Only the key sets the tenant's rules name (the fetcher may still hold others).
        let uris: BTreeSet<String> = reg
            .request_authentications
            .iter()
            .flat_map(|ra| ra.spec.jwt_rules.iter())
            .filter_map(meshplane_crds::security::request_authentication::jwks_source)
            .collect();
        reg.jwks = self
            .jwks
            .iter()
            .filter(|(uri, _)| uris.contains(uri.as_str()))
            .map(|(u, k)| (u.clone(), k.clone()))
            .collect();
        for list in reg.sidecars.values_mut() {
            list.sort_by(|a, b| {
                (&a.metadata.creation_timestamp, &a.metadata.name)
                    .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
            });
        }
        (reg, keys)
    }
}

/// Revision-scoped config, as Istio's `istio.io/rev` label on config: networking and security
/// config labelled `meshplane.io/rev` is used only by the revision it names, directly or
/// through a tag (`names`: the revision's own name and its tags'); unlabelled config is every
/// revision's of the tenant. This is how config meant for a canary reaches only the canary.
/// Other objects (Services, Pods, …) are facts, never scoped.
/// Every kind that is not a fact is config, so a kind added later is scoped unless it is listed
/// here.
pub fn config_in_revision(obj: &Object, names: &BTreeSet<&str>) -> bool {
    let is_fact = matches!(
        obj,
        Object::Namespace(_)
            | Object::Service(_)
            | Object::EndpointSlice(_)
            | Object::Pod(_)
            | Object::Secret(_)
            | Object::MeshControlPlane(_)
            | Object::MeshRevisionTag(_)
    );
    if is_fact {
        return true;
    }
    obj.metadata()
        .labels
        .as_ref()
        .and_then(|l| l.get(meshplane_crds::names::REV_LABEL))
        .is_none_or(|rev| names.contains(rev.as_str()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(kind: &str, api_version: &str, rev: Option<&str>) -> Object {
        let mut metadata = json!({"name": "x", "namespace": "shop"});
        if let Some(rev) = rev {
            metadata["labels"] = json!({ meshplane_crds::names::REV_LABEL: rev });
        }
        let value =
            json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": {}});
        let typed = |v: serde_json::Value| -> Object {
            match kind {
                "AuthorizationPolicy" => Object::AuthorizationPolicy(Box::new(
                    serde_json::from_value(v).expect("AuthorizationPolicy"),
                )),
                "RequestAuthentication" => Object::RequestAuthentication(Box::new(
                    serde_json::from_value(v).expect("RequestAuthentication"),
                )),
                "Telemetry" => {
                    Object::Telemetry(Box::new(serde_json::from_value(v).expect("Telemetry")))
                }
                "Service" => Object::Service(Box::new(serde_json::from_value(v).expect("Service"))),
                _ => panic!("no such kind in this test: {kind}"),
            }
        };
        typed(value)
    }

    #[test]
    fn security_config_labelled_for_another_revision_is_not_this_revisions() {
        let names: BTreeSet<&str> = ["blue-v1", "stable"].into();
        for (kind, api_version) in [
            ("AuthorizationPolicy", "security.meshplane.io/v1alpha1"),
            ("RequestAuthentication", "security.meshplane.io/v1alpha1"),
            ("Telemetry", "telemetry.meshplane.io/v1alpha1"),
        ] {
            assert!(
                !config_in_revision(&object(kind, api_version, Some("blue-v2")), &names),
                "{kind} for blue-v2 is not blue-v1's"
            );
            assert!(
                config_in_revision(&object(kind, api_version, Some("stable")), &names),
                "{kind} for a tag of blue-v1 is blue-v1's"
            );
            assert!(
                config_in_revision(&object(kind, api_version, None), &names),
                "unlabelled {kind} is every revision's"
            );
        }
    }

    #[test]
    fn facts_are_never_scoped_by_revision() {
        let names: BTreeSet<&str> = ["blue-v1"].into();
        assert!(config_in_revision(
            &object("Service", "v1", Some("blue-v2")),
            &names
        ));
    }
}
