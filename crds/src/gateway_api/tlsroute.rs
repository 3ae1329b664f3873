//! `TLSRoute` (`gateway.networking.k8s.io/v1alpha2`, experimental channel): routes TLS
//! connections by SNI without terminating them.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::*;

/// TLS connections routed by SNI hostname.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1alpha2",
    kind = "TLSRoute",
    plural = "tlsroutes",
    doc = "TLS connections routed by SNI to backends, unterminated (Kubernetes Gateway API, experimental).",
    namespaced,
    status = "RouteStatus",
    category = "gateway-api",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TLSRouteSpec {
    /// What the route attaches to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": PARENT_REFS_SECTION_RULE, "message": PARENT_REFS_SECTION_MESSAGE},
        {"rule": PARENT_REFS_UNIQUE_RULE, "message": PARENT_REFS_UNIQUE_MESSAGE}
    ]))]
    pub parent_refs: Vec<ParentReference>,
    /// SNI hostnames the route serves; a leading `*.` label is a wildcard.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253), regex(pattern = HOSTNAME_PATTERN)))]
    pub hostnames: Vec<String>,
    /// The rules (one or more).
    #[schemars(length(min = 1, max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(a, !has(a.name) || self.exists_one(b, has(b.name) && a.name == b.name))", "message": "rule names must be unique"}
    ]))]
    pub rules: Vec<L4RouteRule>,
}

/// A rule of a TLS or TCP route: where connections go.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct L4RouteRule {
    /// Name of the rule (unique in the route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: Option<String>,
    /// Weighted backends.
    #[schemars(length(min = 1, max = 16))]
    pub backend_refs: Vec<BackendRef>,
}
