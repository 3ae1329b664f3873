//! `GRPCRoute` (`gateway.networking.k8s.io/v1`): gRPC routing by service and method for a
//! Gateway listener or, with a Service parent, for the mesh (GAMMA).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::httproute::{HTTPHeaderMatch, StringMatchType};
use super::shared::*;

/// gRPC routing rules attached to Gateways or Services.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "GRPCRoute",
    plural = "grpcroutes",
    doc = "gRPC routing rules by service and method, attached to Gateways or Services (mesh, GAMMA) (Kubernetes Gateway API).",
    namespaced,
    status = "RouteStatus",
    category = "gateway-api",
    printcolumn = r#"{"name":"Hostnames","type":"string","jsonPath":".spec.hostnames"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GRPCRouteSpec {
    /// What the route attaches to: Gateways (and listeners) or Services.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": PARENT_REFS_SECTION_RULE, "message": PARENT_REFS_SECTION_MESSAGE},
        {"rule": PARENT_REFS_UNIQUE_RULE, "message": PARENT_REFS_UNIQUE_MESSAGE}
    ]))]
    pub parent_refs: Vec<ParentReference>,
    /// Hostnames (`:authority`) the route serves; empty: every hostname of the parent.
    /// Ignored for Service parents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253), regex(pattern = HOSTNAME_PATTERN)))]
    pub hostnames: Vec<String>,
    /// The rules; none: every call goes nowhere (a route with no rules routes nothing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.map(r, has(r.matches) ? r.matches.size() : 0).sum() <= 128", "message": "a route has at most 128 matches over all its rules"}
    ]))]
    pub rules: Vec<GRPCRouteRule>,
}

/// One rule: calls matching any of `matches` (none: every call) go to `backendRefs`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GRPCRouteRule {
    /// Conditions (any may match); empty: every call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub matches: Vec<GRPCRouteMatch>,
    /// Changes applied to matching calls, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.filter(f, f.type == 'RequestHeaderModifier').size() <= 1", "message": "RequestHeaderModifier filter cannot be repeated"},
        {"rule": "self.filter(f, f.type == 'ResponseHeaderModifier').size() <= 1", "message": "ResponseHeaderModifier filter cannot be repeated"}
    ]))]
    pub filters: Vec<GRPCRouteFilter>,
    /// Weighted backends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub backend_refs: Vec<GRPCBackendRef>,
}

/// Conditions on a call, all of which must hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GRPCRouteMatch {
    /// The service and method called; absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<GRPCMethodMatch>,
    /// Request metadata (headers) that must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub headers: Vec<GRPCHeaderMatch>,
}

/// A metadata (header) condition of a gRPC call; the same shape as an HTTP header match.
pub type GRPCHeaderMatch = HTTPHeaderMatch;

/// Which service and method: `Exact` names (either may be absent: any), or regular
/// expressions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.service) || has(self.method)", "message": "a method match names a service, a method, or both"},
    {"rule": "(has(self.type) && self.type == 'RegularExpression') || !has(self.service) || self.service.matches(r\"\"\"^(?i)\\.?[a-z_][a-z_0-9]*(\\.[a-z_][a-z_0-9]*)*$\"\"\")", "message": "service must be a fully qualified gRPC service name"},
    {"rule": "(has(self.type) && self.type == 'RegularExpression') || !has(self.method) || self.method.matches(r\"\"\"^[A-Za-z_][A-Za-z_0-9]*$\"\"\")", "message": "method must be a gRPC method name"}
]))]
pub struct GRPCMethodMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(rename = "type", default)]
    pub type_: StringMatchType,
    /// Fully qualified service (`helloworld.Greeter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub service: Option<String>,
    /// Method of the service (`SayHello`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub method: Option<String>,
}

/// Kind of a gRPC filter.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum GRPCRouteFilterType {
    /// Change response metadata.
    ResponseHeaderModifier,
    /// Change request metadata.
    RequestHeaderModifier,
    /// Copy calls to another backend.
    RequestMirror,
    /// A filter of the implementation, by reference (not supported by meshplane).
    ExtensionRef,
}

/// One filter: `type` says which of the other fields is set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.requestHeaderModifier) == (self.type == 'RequestHeaderModifier')", "message": "requestHeaderModifier is set exactly when type is RequestHeaderModifier"},
    {"rule": "has(self.responseHeaderModifier) == (self.type == 'ResponseHeaderModifier')", "message": "responseHeaderModifier is set exactly when type is ResponseHeaderModifier"},
    {"rule": "has(self.requestMirror) == (self.type == 'RequestMirror')", "message": "requestMirror is set exactly when type is RequestMirror"},
    {"rule": "has(self.extensionRef) == (self.type == 'ExtensionRef')", "message": "extensionRef is set exactly when type is ExtensionRef"}
]))]
pub struct GRPCRouteFilter {
    /// Which filter this is.
    #[serde(rename = "type")]
    pub type_: GRPCRouteFilterType,
    /// For `RequestHeaderModifier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HttpHeaderFilter>,
    /// For `ResponseHeaderModifier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HttpHeaderFilter>,
    /// For `RequestMirror`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<HttpRequestMirrorFilter>,
    /// For `ExtensionRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_ref: Option<LocalObjectReference>,
}

/// A weighted backend of a gRPC rule, with filters of its own.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(size(self.group) == 0 && self.kind == 'Service') ? has(self.port) : true", "message": "Must have port for Service reference"}
]))]
pub struct GRPCBackendRef {
    /// API group of the backend; `""` (default) is the core group.
    #[serde(default)]
    #[schemars(length(max = 253), regex(pattern = GROUP_PATTERN))]
    pub group: String,
    /// Kind of the backend: `Service` (default).
    #[serde(default = "service_kind")]
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: String,
    /// Name of the backend.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the backend; absent: the route's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = NAMESPACE_PATTERN))]
    pub namespace: Option<String>,
    /// Port of the backend; required for a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// Share of the traffic, relative to the rule's other backends (default 1; 0: none).
    #[serde(default = "default_weight")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub weight: i32,
    /// Filters applied only to calls sent to this backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub filters: Vec<GRPCRouteFilter>,
}

impl GRPCBackendRef {
    /// The weighted reference without the filters.
    pub fn backend(&self) -> BackendRef {
        BackendRef {
            group: self.group.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            port: self.port,
            weight: self.weight,
        }
    }
}
