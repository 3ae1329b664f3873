//! The tenant index: the tenant's state ([`state`]) and the configurations rendered from it
//! ([`render_cache`]), behind one facade the push loop drives through [`ConfigGenerator`].
//!
//! Pure: no I/O. [`TenantIndex::apply`] folds one [`SourceEvent`] into the state, which says
//! what proxies could see differently ([`Change`]: nothing, endpoints only with the EDS
//! clusters concerned, or configuration) and which rendered configurations that invalidates;
//! the cache then patches, splices or drops them, and the index publishes what else changed
//! (members, verdicts, the EnvoyFilter policy, credential names) on its watch channels
//! ([`crate::outputs`]). Two ways to render: [`TenantIndex::render`], the cached configuration
//! every proxy of the scope shares, and [`TenantIndex::render_checked`], a fresh render with
//! the EnvoyFilter patches that did not apply (meshctl, tests and benchmarks).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use meshplane_crds::MeshConfig;

mod interner;
mod keyed;
mod render_cache;
mod route_encoding;
mod state;

pub use render_cache::MAX_CACHED_SCOPES;
use render_cache::{CachedConfig, RenderCache};
use route_encoding::RouteParts;
pub use state::{config_in_revision, Applied, Invalidation, TenantState};

use crate::config_events::{self, ConfigEvent, EventSink};
use crate::credentials::{Access, CredentialDecider};
use crate::envoyfilter;
use crate::generator::ConfigGenerator;
pub use crate::generator::{Change, ChangeKind};
use crate::model::{ProxyConfig, ProxyKind, ProxyNode, SourceEvent};
use crate::outputs::{IndexWatch, Outputs};
use crate::translate::{self, Registry};

/// One revision's view of a tenant: its state, the configurations rendered from it, and the
/// channels its outputs are published on.
pub struct TenantIndex {
    state: TenantState,
    cache: Mutex<RenderCache>,
    outputs: Outputs,
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
        let index = Self {
            state: TenantState::new(tenant, revision, control_namespace, mesh_config),
            cache: Mutex::new(RenderCache::default()),
            outputs: Outputs::default(),
            credential_access: None,
        };
        index.publish_config_outputs();
        index
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
        self.state = self.state.with_events(sink);
        self
    }

    /// Keeps at most `limit` rendered configurations (at least one).
    pub fn with_cache_limit(self, limit: usize) -> Self {
        self.lock_cache().set_limit(limit);
        self
    }

    /// Adds tags that resolve to this revision (directory mode's `--tags`).
    pub fn with_tags(mut self, tags: impl IntoIterator<Item = String>) -> Self {
        self.state = self.state.with_tags(tags);
        self
    }

    /// The tenant's state.
    pub fn state(&self) -> &TenantState {
        &self.state
    }

    /// The tenant's member namespaces.
    pub fn members(&self) -> &BTreeSet<String> {
        self.state.members()
    }

    /// The registry translation currently reads.
    pub fn registry(&self) -> &Arc<Registry> {
        self.state.registry()
    }

    /// The verdict on the tenant's VirtualServices, DestinationRules and Gateways.
    pub fn diagnostics(&self) -> Arc<translate::diagnostics::Diagnostics> {
        self.state.diagnostics()
    }

    /// Receivers of the index's outputs (members, verdicts, EnvoyFilter policy, credential
    /// names), updated by every applied event.
    pub fn watch(&self) -> IndexWatch {
        self.outputs.watch()
    }

    /// Folds one source event: the state changes, the cache follows, the outputs are
    /// published. Returns what proxies could see differently.
    pub fn apply(&mut self, ev: SourceEvent) -> Change {
        let pods_changed = self.may_change_pod_addresses(&ev);
        let Applied {
            change,
            invalidation,
        } = self.state.apply(ev);
        if pods_changed || change.members_changed {
            self.outputs
                .publish_pod_addresses(self.state.pod_addresses());
        }
        self.lock_cache()
            .invalidate(self.state.registry(), invalidation);
        if change.members_changed {
            self.outputs.publish_members(self.state.members().clone());
        }
        if change.kind == ChangeKind::Config {
            self.publish_config_outputs();
        }
        change
    }

    /// Whether `ev` may change the addresses the tenant's pods hold (besides a change of
    /// members): members told by the source, a relist, or a Pod whose addresses differ from
    /// what the state has (most Pod updates are status changes that keep them).
    fn may_change_pod_addresses(&self, ev: &SourceEvent) -> bool {
        match ev {
            SourceEvent::Upsert(obj @ crate::model::Object::Pod(pod)) => {
                translate::registry::held_pod_addresses(pod)
                    != self.state.pod_addresses_of(&obj.key())
            }
            SourceEvent::Delete(key) => {
                key.kind == crate::model::Kind::Pod && !self.state.pod_addresses_of(key).is_empty()
            }
            SourceEvent::Members(_) | SourceEvent::Synced => true,
            _ => false,
        }
    }

    fn publish_config_outputs(&self) {
        let registry = self.state.registry();
        self.outputs.publish_pod_networks(
            registry
                .mesh_config
                .pod_networks
                .iter()
                .filter_map(|n| n.parse().ok())
                .collect(),
        );
        self.outputs.publish_diagnostics(self.state.diagnostics());
        self.outputs
            .publish_envoy_filter_policy(registry.mesh_config.envoy_filter_policy.clone());
        self.outputs
            .publish_credential_names(translate::gateway::all_credential_names(registry));
        self.outputs
            .publish_jwks_plan(translate::jwt::jwks_plan(registry));
    }

    fn lock_cache(&self) -> MutexGuard<'_, RenderCache> {
        // The cache holds no invariant a panicking holder could break: recover it.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The full configuration of one proxy, translation then its EnvoyFilters, encoded: the
    /// one `Arc` every proxy of its scope shares until the next change. Patches that cannot
    /// apply are reported (once per filter generation).
    pub fn render(&self, node: &ProxyNode) -> Arc<ProxyConfig> {
        let node = &*self.workload_node(node);
        let key = render_cache::scope_key(self.state.registry(), node);
        if let Some(cached) = self.lock_cache().get(&key) {
            return Arc::clone(&cached.config);
        }
        let (config, routes, errors) = self.render_encoded(node);
        self.report_patch_errors(node, &errors);
        let config = Arc::new(config);
        let cached = CachedConfig::new(Arc::clone(&config), node.clone(), routes);
        self.lock_cache().insert(key, cached);
        config
    }

    /// Renders a proxy's configuration afresh, without the scope cache, with the EnvoyFilter
    /// patches that could not be applied (what `meshctl translate` and `meshctl analyze`
    /// report); nothing is reported or cached.
    pub fn render_checked(&self, node: &ProxyNode) -> (ProxyConfig, Vec<envoyfilter::PatchError>) {
        let (config, _, errors) = self.render_encoded(&self.workload_node(node));
        (config, errors)
    }

    /// How many rendered configurations are cached.
    pub fn cached_scopes(&self) -> usize {
        self.lock_cache().len()
    }

    /// The proxy as translation sees it: with its Pod's labels as the API server has them when
    /// the index knows the Pod (what the proxy claims in `LABELS` only otherwise), so that its
    /// Services' inbound ports, Sidecar and EnvoyFilter selectors follow the real workload; a
    /// gateway with the credentials its verified ServiceAccount may read.
    fn workload_node<'a>(&self, node: &'a ProxyNode) -> std::borrow::Cow<'a, ProxyNode> {
        let labels = node
            .pod_name
            .as_deref()
            .and_then(|pod| self.state.pod_labels(&node.namespace, pod));
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
        translate::gateway::credential_names(self.state.registry(), node)
            .into_iter()
            .filter(|secret| access.decide(&node.namespace, account, secret) == Access::Allowed)
            .collect()
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
                .state
                .registry()
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
            self.state.events.report(ConfigEvent::regarding(
                regarding,
                config_events::ENVOY_FILTER_PATCH_NOT_APPLIED,
                note,
            ));
        }
    }

    /// Translates, patches and encodes the configuration of `node` (a workload node).
    fn render_encoded(
        &self,
        node: &ProxyNode,
    ) -> (ProxyConfig, Vec<RouteParts>, Vec<envoyfilter::PatchError>) {
        let registry = self.state.registry();
        let mut translated = translate::translate(registry, node);
        let filters = envoyfilter::applicable(registry, node);
        let errors = envoyfilter::apply(&filters, node.kind, &mut translated);
        // Proxyless gRPC clients speak state of the world: VHDS is for Envoys only.
        let vhds = node.kind != ProxyKind::Grpc;
        let (config, routes) = self.lock_cache().encode(translated, vhds);
        (config, routes, errors)
    }
}

impl ConfigGenerator for TenantIndex {
    fn apply(&mut self, event: SourceEvent) -> Change {
        TenantIndex::apply(self, event)
    }
    fn render(&self, node: &ProxyNode) -> Arc<ProxyConfig> {
        TenantIndex::render(self, node)
    }
    fn watch(&self) -> IndexWatch {
        TenantIndex::watch(self)
    }
}

#[cfg(test)]
mod keyed_tests;

#[cfg(test)]
mod validation_tests;
