//! The tenant as the validating webhook sees it: its name, its control namespace and its
//! member namespaces (from the members ConfigMap of contract 2, kept by the xds-server).

use std::collections::BTreeSet;

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
        }
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
}
