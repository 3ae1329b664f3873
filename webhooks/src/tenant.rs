//! The tenant as the validating webhook sees it: its name, its control namespace and its
//! member namespaces (from the members ConfigMap of contract 2, kept by the xds-server).

use std::collections::BTreeSet;

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
        }
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
}
