//! The tenant as the validating webhook sees it: its name, its control namespace and its
//! member namespaces (from the members ConfigMap of contract 2, kept by the xds-server).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use meshplane_crds::envoyfilter_policy::EnvoyFilterPolicy;

/// Read access to the tenant's current membership.
pub trait TenantView: Send + Sync {
    /// The tenant name.
    fn tenant(&self) -> &str;
    /// The tenant's control ("root") namespace.
    fn control_namespace(&self) -> &str;
    /// Whether `namespace` is currently a member namespace of the tenant.
    fn is_member(&self, namespace: &str) -> bool;

    /// Whether `namespace` belongs to the tenant: a member or the control namespace.
    fn contains(&self, namespace: &str) -> bool {
        namespace == self.control_namespace() || self.is_member(namespace)
    }

    /// What the tenant's EnvoyFilters may do (`spec.meshConfig.envoyFilterPolicy` of the
    /// revision); the safe defaults until the instance has read it.
    fn envoy_filter_policy(&self) -> EnvoyFilterPolicy {
        EnvoyFilterPolicy::default()
    }

    /// The tenant's trust domain, when known (principals are then checked against it).
    fn trust_domain(&self) -> Option<&str> {
        None
    }

    /// The cluster's pod address ranges, when known. A ServiceEntry endpoint address inside
    /// them must be the address of a pod of the tenant; empty turns that check off.
    fn pod_networks(&self) -> Vec<IpNet> {
        Vec::new()
    }

    /// Whether `address` is held now by a pod in one of the tenant's namespaces.
    fn is_tenant_pod_address(&self, _address: IpAddr) -> bool {
        false
    }
}

/// A fixed membership: for tests and for the standalone (directory) mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticTenant {
    /// The tenant name.
    pub tenant: String,
    /// The control namespace.
    pub control_namespace: String,
    /// The member namespaces.
    pub members: BTreeSet<String>,
    /// What the tenant's EnvoyFilters may do.
    pub envoy_filter_policy: EnvoyFilterPolicy,
    /// The tenant's trust domain, when known.
    pub trust_domain: Option<String>,
    /// The cluster's pod address ranges.
    pub pod_networks: Vec<IpNet>,
    /// Addresses of the tenant's pods.
    pub pod_addresses: BTreeSet<IpAddr>,
}

impl StaticTenant {
    /// A tenant with the given members.
    pub fn new(
        tenant: impl Into<String>,
        control_namespace: impl Into<String>,
        members: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        StaticTenant {
            tenant: tenant.into(),
            control_namespace: control_namespace.into(),
            members: members.into_iter().map(Into::into).collect(),
            envoy_filter_policy: EnvoyFilterPolicy::default(),
            trust_domain: None,
            pod_networks: Vec::new(),
            pod_addresses: BTreeSet::new(),
        }
    }

    /// The same tenant in a cluster whose pods take addresses from `networks`, with its own
    /// pods at `addresses`.
    pub fn with_pods(
        mut self,
        networks: impl IntoIterator<Item = IpNet>,
        addresses: impl IntoIterator<Item = IpAddr>,
    ) -> Self {
        self.pod_networks = networks.into_iter().collect();
        self.pod_addresses = addresses.into_iter().collect();
        self
    }

    /// The same tenant with another EnvoyFilter policy.
    pub fn with_envoy_filter_policy(mut self, policy: EnvoyFilterPolicy) -> Self {
        self.envoy_filter_policy = policy;
        self
    }

    /// The same tenant with a trust domain.
    pub fn with_trust_domain(mut self, trust_domain: impl Into<String>) -> Self {
        self.trust_domain = Some(trust_domain.into());
        self
    }
}

impl TenantView for StaticTenant {
    fn tenant(&self) -> &str {
        &self.tenant
    }

    fn control_namespace(&self) -> &str {
        &self.control_namespace
    }

    fn is_member(&self, namespace: &str) -> bool {
        self.members.contains(namespace)
    }

    fn envoy_filter_policy(&self) -> EnvoyFilterPolicy {
        self.envoy_filter_policy.clone()
    }

    fn trust_domain(&self) -> Option<&str> {
        self.trust_domain.as_deref()
    }

    fn pod_networks(&self) -> Vec<IpNet> {
        self.pod_networks.clone()
    }

    fn is_tenant_pod_address(&self, address: IpAddr) -> bool {
        self.pod_addresses.contains(&address)
    }
}
