//! The analyzer codes. A code is stable: once released it keeps its meaning; new checks get
//! new codes. Ranges: `MP01xx` control planes, `MP02xx` tags, `MP03xx` namespaces, `MP04xx`
//! config that cannot apply, `MP05xx` the tenant boundary, `MP06xx` pods, `MP07xx` proxies.

use serde::Serialize;

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Severity {
    /// Something does not work as written.
    Error,
    /// Something works, but probably not as meant.
    Warning,
    /// Worth knowing.
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "Error",
            Severity::Warning => "Warning",
            Severity::Info => "Info",
        }
    }
}

/// One analyzer code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Code {
    /// `MPnnnn`.
    pub id: &'static str,
    /// `PascalCase` name.
    pub name: &'static str,
    pub severity: Severity,
    /// What it means and what to do.
    pub summary: &'static str,
}

macro_rules! codes {
    ($($konst:ident = $id:literal $name:literal $sev:ident $summary:literal;)*) => {
        $(pub const $konst: Code = Code { id: $id, name: $name, severity: Severity::$sev, summary: $summary };)*
        /// Every code, in code order.
        pub const ALL: &[Code] = &[$($konst),*];
    };
}

codes! {
    DUPLICATE_REVISION = "MP0101" "DuplicateRevision" Error
        "Two MeshControlPlanes claim one revision name; the younger one runs nothing until renamed or deleted.";
    INVALID_SELECTOR = "MP0102" "InvalidSelector" Error
        "A MeshControlPlane's namespaceSelector does not parse; the revision attaches no namespace.";
    CONTROL_NAMESPACE_MISMATCH = "MP0103" "ControlNamespaceMismatch" Error
        "A revision names another control namespace than its tenant's other revisions; it is inactive.";
    CONTROL_NAMESPACE_TAKEN = "MP0104" "ControlNamespaceTaken" Error
        "A revision's control namespace belongs to another tenant; it is inactive.";
    CONTROL_NAMESPACE_NOT_OWNED = "MP0105" "ControlNamespaceNotOwned" Error
        "A revision's control namespace exists and no control plane of the tenant recorded creating it (`status.controlNamespaceUID`) nor was it handed over (`meshplane.io/adopt-control-namespace`); the revision takes nothing and is inactive.";
    TRUST_DOMAIN_MISMATCH = "MP0106" "TrustDomainMismatch" Error
        "A revision names another trust domain than its tenant's other revisions; it is inactive.";
    TRUST_DOMAIN_TAKEN = "MP0107" "TrustDomainTaken" Error
        "A revision's trust domain belongs to another tenant (tenants under one organisation root would accept each other's workloads); it is inactive.";
    TAG_NAMED_LIKE_REVISION = "MP0201" "TagNamedLikeRevision" Error
        "A MeshRevisionTag has the name of a revision; tags and revisions share the meshplane.io/rev label.";
    TAG_MOVED_ACROSS_TENANTS = "MP0202" "TagMovedAcrossTenants" Error
        "A tag points at a revision of another tenant than its own; it keeps resolving to its last revision.";
    TAG_REVISION_NOT_FOUND = "MP0203" "TagRevisionNotFound" Warning
        "A tag points at no active revision; namespaces labelled with it are rejected.";
    TAG_UNUSED = "MP0204" "TagUnused" Info
        "No namespace carries the tag.";
    NAMESPACE_OUTSIDE_SELECTOR = "MP0301" "NamespaceOutsideSelector" Error
        "A namespace is labelled for a revision whose namespaceSelector does not admit it; it is rejected, not joined.";
    NAMESPACE_UNKNOWN_REVISION = "MP0302" "NamespaceUnknownRevision" Error
        "A namespace's meshplane.io/rev label names neither a revision nor a tag.";
    NAMESPACE_REVISION_CONFLICTED = "MP0303" "NamespaceRevisionConflicted" Error
        "A namespace is labelled for a revision or tag that is in conflict.";
    NAMESPACE_IS_OTHER_CONTROL_NAMESPACE = "MP0304" "NamespaceIsOtherControlNamespace" Error
        "A namespace labelled to join a tenant is the control namespace of another tenant.";
    INVALID_CONFIG = "MP0401" "InvalidConfig" Error
        "Config that does not decode or breaks a validation rule; the mesh skips it.";
    ENVOY_FILTER_PATCH_NOT_APPLIED = "MP0402" "EnvoyFilterPatchNotApplied" Error
        "An EnvoyFilter patch cannot be applied to the configuration of proxies it selects.";
    CONFIG_OUTSIDE_MESH = "MP0403" "ConfigOutsideMesh" Warning
        "Mesh config in a namespace that belongs to no tenant; nothing reads it.";
    UNSUPPORTED_PROXY_SELECTION = "MP0404" "UnsupportedProxySelection" Error
        "An EnvoyFilter selects proxies by a field meshplane does not support (targetRefs, match.proxy).";
    CONFLICTING_SIDECARS = "MP0405" "ConflictingSidecars" Warning
        "Several Sidecars apply to the same workloads; only the oldest takes effect.";
    ENVOY_FILTER_BEYOND_POLICY = "MP0406" "EnvoyFilterBeyondPolicy" Error
        "An EnvoyFilter does what its tenant's EnvoyFilter policy (spec.meshConfig.envoyFilterPolicy) does not allow; it is refused at admission and never applied.";
    CROSS_TENANT_REFERENCE = "MP0501" "CrossTenantReference" Error
        "Config names a namespace outside its tenant (exportTo, Sidecar egress hosts, patch matches); the reference is never honoured.";
    POD_REVISION_MISMATCH = "MP0601" "PodRevisionMismatch" Warning
        "A pod runs the sidecar of another revision of its tenant than its namespace's; restart it to move it.";
    POD_OUTSIDE_TENANT = "MP0602" "PodOutsideTenant" Error
        "A pod's sidecar was injected by a revision of a tenant its namespace no longer belongs to; its proxy is refused.";
    POD_WITHOUT_SIDECAR = "MP0603" "PodWithoutSidecar" Warning
        "A pod of a member namespace has no sidecar (created before the namespace joined); restart it.";
    POD_REVISION_NOT_FOUND = "MP0604" "PodRevisionNotFound" Error
        "A pod's sidecar was injected by a revision that no longer exists; its proxy gets no configuration.";
    PROXY_NACKED = "MP0701" "ProxyNacked" Error
        "A proxy rejected the configuration its instance sent (NACK); it keeps its previous configuration.";
    PROXY_NOT_CONNECTED = "MP0702" "ProxyNotConnected" Warning
        "A running pod with a sidecar has no proxy connected to any instance of its tenant.";
}

/// The code with this id.
pub fn by_id(id: &str) -> Option<Code> {
    ALL.iter().copied().find(|c| c.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_sorted_and_well_formed() {
        let ids: Vec<&str> = ALL.iter().map(|c| c.id).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(ids, sorted, "codes are listed once each, in order");
        for c in ALL {
            assert!(
                c.id.len() == 6
                    && c.id.starts_with("MP")
                    && c.id[2..].chars().all(|d| d.is_ascii_digit()),
                "{}",
                c.id
            );
            assert!(c.name.chars().next().is_some_and(char::is_uppercase));
        }
    }
}
