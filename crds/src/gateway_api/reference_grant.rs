//! `ReferenceGrant` (`gateway.networking.k8s.io/v1beta1`): lets objects of other namespaces
//! refer to objects of this one.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::*;

/// Which kinds in which namespaces may refer to which objects of this namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1beta1",
    kind = "ReferenceGrant",
    plural = "referencegrants",
    doc = "Allows objects of other namespaces to refer to objects of this namespace (Kubernetes Gateway API).",
    namespaced,
    shortname = "refgrant",
    category = "gateway-api",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    /// Who may refer: kinds in namespaces.
    #[schemars(length(min = 1, max = 16))]
    pub from: Vec<ReferenceGrantFrom>,
    /// What may be referred to in this namespace: kinds, optionally one object by name.
    #[schemars(length(min = 1, max = 16))]
    pub to: Vec<ReferenceGrantTo>,
}

/// Objects of one kind in one namespace that may refer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantFrom {
    /// API group of the referring kind (`gateway.networking.k8s.io`).
    #[schemars(length(max = 253), regex(pattern = GROUP_PATTERN))]
    pub group: String,
    /// The referring kind (`HTTPRoute`, `GRPCRoute`, `Gateway`, ...).
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: String,
    /// Namespace of the referring objects.
    #[schemars(length(min = 1, max = 63), regex(pattern = NAMESPACE_PATTERN))]
    pub namespace: String,
}

/// Objects of this namespace that may be referred to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantTo {
    /// API group (`""` for Services and Secrets).
    #[schemars(length(max = 253), regex(pattern = GROUP_PATTERN))]
    pub group: String,
    /// Kind (`Service`, `Secret`).
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: String,
    /// One object by name; absent: every object of the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,
}

impl ReferenceGrantSpec {
    /// Whether this grant (in the target's namespace) lets an object of `from_group`/
    /// `from_kind` in `from_namespace` refer to the object `to_group`/`to_kind`/`to_name`.
    pub fn permits(
        &self,
        from_group: &str,
        from_kind: &str,
        from_namespace: &str,
        to_group: &str,
        to_kind: &str,
        to_name: &str,
    ) -> bool {
        self.from
            .iter()
            .any(|f| f.group == from_group && f.kind == from_kind && f.namespace == from_namespace)
            && self.to.iter().any(|t| {
                t.group == to_group
                    && t.kind == to_kind
                    && t.name.as_deref().is_none_or(|n| n == to_name)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_permits_only_what_it_names() {
        let grant = ReferenceGrantSpec {
            from: vec![ReferenceGrantFrom {
                group: super::super::GROUP.into(),
                kind: "HTTPRoute".into(),
                namespace: "shop".into(),
            }],
            to: vec![ReferenceGrantTo {
                group: String::new(),
                kind: "Service".into(),
                name: Some("pay".into()),
            }],
        };
        let g = super::super::GROUP;
        assert!(grant.permits(g, "HTTPRoute", "shop", "", "Service", "pay"));
        assert!(!grant.permits(g, "HTTPRoute", "shop", "", "Service", "other"));
        assert!(!grant.permits(g, "GRPCRoute", "shop", "", "Service", "pay"));
        assert!(!grant.permits(g, "HTTPRoute", "web", "", "Service", "pay"));
        assert!(!grant.permits(g, "HTTPRoute", "shop", "", "Secret", "pay"));
        let any_service = ReferenceGrantSpec {
            to: vec![ReferenceGrantTo {
                name: None,
                ..grant.to[0].clone()
            }],
            ..grant
        };
        assert!(any_service.permits(g, "HTTPRoute", "shop", "", "Service", "other"));
    }
}
