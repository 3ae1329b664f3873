//! `TCPRoute` (`gateway.networking.k8s.io/v1alpha2`, experimental channel): forwards TCP
//! connections of a listener to backends.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::*;
use super::tlsroute::L4RouteRule;

/// TCP connections forwarded to backends.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1alpha2",
    kind = "TCPRoute",
    plural = "tcproutes",
    doc = "TCP connections forwarded to backends (Kubernetes Gateway API, experimental).",
    namespaced,
    status = "RouteStatus",
    category = "gateway-api",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TCPRouteSpec {
    /// What the route attaches to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": PARENT_REFS_SECTION_RULE, "message": PARENT_REFS_SECTION_MESSAGE},
        {"rule": PARENT_REFS_UNIQUE_RULE, "message": PARENT_REFS_UNIQUE_MESSAGE}
    ]))]
    pub parent_refs: Vec<ParentReference>,
    /// The rules (one or more).
    #[schemars(length(min = 1, max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(a, !has(a.name) || self.exists_one(b, has(b.name) && a.name == b.name))", "message": "rule names must be unique"}
    ]))]
    pub rules: Vec<L4RouteRule>,
}
