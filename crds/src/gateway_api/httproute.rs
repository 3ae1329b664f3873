//! `HTTPRoute` (`gateway.networking.k8s.io/v1`): HTTP routing for a Gateway listener or, with
//! a Service parent, for the mesh (GAMMA).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::*;

/// HTTP routing rules attached to Gateways or Services.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "HTTPRoute",
    plural = "httproutes",
    doc = "HTTP routing rules attached to Gateways (north-south) or Services (mesh, GAMMA) (Kubernetes Gateway API).",
    namespaced,
    status = "RouteStatus",
    category = "gateway-api",
    printcolumn = r#"{"name":"Hostnames","type":"string","jsonPath":".spec.hostnames"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteSpec {
    /// What the route attaches to: Gateways (and listeners) or Services.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": PARENT_REFS_SECTION_RULE, "message": PARENT_REFS_SECTION_MESSAGE},
        {"rule": PARENT_REFS_UNIQUE_RULE, "message": PARENT_REFS_UNIQUE_MESSAGE}
    ]))]
    pub parent_refs: Vec<ParentReference>,
    /// Hostnames (Host header) the route serves; a leading `*.` label is a wildcard. Empty:
    /// every hostname of the parent. Ignored for Service parents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253), regex(pattern = HOSTNAME_PATTERN)))]
    pub hostnames: Vec<String>,
    /// The rules; default: one rule matching every path (`PathPrefix /`).
    #[serde(default = "default_rules")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.map(r, has(r.matches) ? r.matches.size() : 0).sum() <= 128", "message": "a route has at most 128 matches over all its rules"}
    ]))]
    pub rules: Vec<HTTPRouteRule>,
}

fn default_rules() -> Vec<HTTPRouteRule> {
    vec![HTTPRouteRule {
        matches: default_matches(),
        ..HTTPRouteRule::default()
    }]
}

fn default_matches() -> Vec<HTTPRouteMatch> {
    vec![HTTPRouteMatch::default()]
}

/// One rule: requests matching any of `matches` get the `filters` and go to `backendRefs`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!(has(self.backendRefs) && size(self.backendRefs) > 0 && has(self.filters) && self.filters.exists(f, f.type == 'RequestRedirect'))", "message": "a rule with a RequestRedirect filter has no backendRefs"},
    {"rule": "!(has(self.filters) && self.filters.exists(f, f.type == 'RequestRedirect' && has(f.requestRedirect.path) && f.requestRedirect.path.type == 'ReplacePrefixMatch')) || (has(self.matches) && self.matches.size() == 1 && has(self.matches[0].path) && self.matches[0].path.type == 'PathPrefix')", "message": "a RequestRedirect with path type ReplacePrefixMatch needs exactly one match, of path type PathPrefix"},
    {"rule": "!(has(self.filters) && self.filters.exists(f, f.type == 'URLRewrite' && has(f.urlRewrite.path) && f.urlRewrite.path.type == 'ReplacePrefixMatch')) || (has(self.matches) && self.matches.size() == 1 && has(self.matches[0].path) && self.matches[0].path.type == 'PathPrefix')", "message": "a URLRewrite with path type ReplacePrefixMatch needs exactly one match, of path type PathPrefix"}
]))]
pub struct HTTPRouteRule {
    /// Conditions (any may match); default: every path (`PathPrefix /`).
    #[serde(default = "default_matches")]
    #[schemars(length(max = 64))]
    pub matches: Vec<HTTPRouteMatch>,
    /// Changes applied to matching requests, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "!(self.exists(f, f.type == 'RequestRedirect') && self.exists(f, f.type == 'URLRewrite'))", "message": "RequestRedirect and URLRewrite filters cannot be used together"},
        {"rule": "self.filter(f, f.type == 'RequestHeaderModifier').size() <= 1", "message": "RequestHeaderModifier filter cannot be repeated"},
        {"rule": "self.filter(f, f.type == 'ResponseHeaderModifier').size() <= 1", "message": "ResponseHeaderModifier filter cannot be repeated"},
        {"rule": "self.filter(f, f.type == 'RequestRedirect').size() <= 1", "message": "RequestRedirect filter cannot be repeated"},
        {"rule": "self.filter(f, f.type == 'URLRewrite').size() <= 1", "message": "URLRewrite filter cannot be repeated"}
    ]))]
    pub filters: Vec<HTTPRouteFilter>,
    /// Weighted backends; none (and no redirect): requests get a 500.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub backend_refs: Vec<HTTPBackendRef>,
    /// Timeouts of the request and of each try to a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<HTTPRouteTimeouts>,
    /// Retries (experimental channel of the specification).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<HTTPRouteRetry>,
}

/// Conditions on a request, all of which must hold.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteMatch {
    /// The path; default `PathPrefix /`.
    #[serde(default = "default_path_match")]
    pub path: Option<HTTPPathMatch>,
    /// Request headers that must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub headers: Vec<HTTPHeaderMatch>,
    /// Query parameters that must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub query_params: Vec<HTTPQueryParamMatch>,
    /// The request's method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<HTTPMethod>,
}

impl Default for HTTPRouteMatch {
    fn default() -> Self {
        Self {
            path: default_path_match(),
            headers: Vec::new(),
            query_params: Vec::new(),
            method: None,
        }
    }
}

fn default_path_match() -> Option<HTTPPathMatch> {
    Some(HTTPPathMatch::default())
}

/// How a path is matched.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.type == 'RegularExpression' || self.value.startsWith('/')", "message": "an Exact or PathPrefix path starts with '/'"},
    {"rule": "self.type == 'RegularExpression' || !(self.value.contains('//') || self.value.contains('/./') || self.value.contains('/../') || self.value.contains('%2f') || self.value.contains('%2F') || self.value.contains('#') || self.value.endsWith('/..') || self.value.endsWith('/.'))", "message": "an Exact or PathPrefix path has no '//', '/./', '/../', encoded '/', '#', and does not end in '/.' or '/..'"},
    {"rule": "self.type == 'RegularExpression' || self.value.matches(r\"\"\"^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$\"\"\")", "message": "an Exact or PathPrefix path has only valid path characters"}
]))]
pub struct HTTPPathMatch {
    /// `Exact`, `PathPrefix` (default; whole segments) or `RegularExpression`.
    #[serde(rename = "type", default)]
    pub type_: PathMatchType,
    /// The path or expression; default `/`.
    #[serde(default = "root_path")]
    #[schemars(length(max = 1024))]
    pub value: String,
}

impl Default for HTTPPathMatch {
    fn default() -> Self {
        Self {
            type_: PathMatchType::PathPrefix,
            value: root_path(),
        }
    }
}

fn root_path() -> String {
    "/".to_string()
}

/// Kind of path match.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
pub enum PathMatchType {
    /// The whole path, case-sensitive.
    Exact,
    /// A prefix of whole path segments (`/api` matches `/api` and `/api/x`, not `/apix`).
    #[default]
    PathPrefix,
    /// A regular expression matching the whole path.
    RegularExpression,
}

/// Kind of header, query parameter or gRPC method match.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
pub enum StringMatchType {
    /// The whole value.
    #[default]
    Exact,
    /// A regular expression matching the whole value.
    RegularExpression,
}

/// A header condition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HTTPHeaderMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(rename = "type", default)]
    pub type_: StringMatchType,
    /// Header name (case-insensitive).
    #[schemars(length(min = 1, max = 256), regex(pattern = HEADER_NAME_PATTERN))]
    pub name: String,
    /// Value or expression.
    #[schemars(length(min = 1, max = 4096))]
    pub value: String,
}

/// A query parameter condition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HTTPQueryParamMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(rename = "type", default)]
    pub type_: StringMatchType,
    /// Parameter name (case-sensitive).
    #[schemars(length(min = 1, max = 256), regex(pattern = HEADER_NAME_PATTERN))]
    pub name: String,
    /// Value or expression.
    #[schemars(length(min = 1, max = 1024))]
    pub value: String,
}

/// HTTP methods a route may match.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum HTTPMethod {
    /// `GET`.
    Get,
    /// `HEAD`.
    Head,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
    /// `DELETE`.
    Delete,
    /// `CONNECT`.
    Connect,
    /// `OPTIONS`.
    Options,
    /// `TRACE`.
    Trace,
    /// `PATCH`.
    Patch,
}

impl HTTPMethod {
    /// The method as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            HTTPMethod::Get => "GET",
            HTTPMethod::Head => "HEAD",
            HTTPMethod::Post => "POST",
            HTTPMethod::Put => "PUT",
            HTTPMethod::Delete => "DELETE",
            HTTPMethod::Connect => "CONNECT",
            HTTPMethod::Options => "OPTIONS",
            HTTPMethod::Trace => "TRACE",
            HTTPMethod::Patch => "PATCH",
        }
    }
}

/// Kind of an HTTP filter.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum HTTPRouteFilterType {
    /// Change request headers.
    RequestHeaderModifier,
    /// Change response headers.
    ResponseHeaderModifier,
    /// Copy requests to another backend.
    RequestMirror,
    /// Answer with a redirect.
    RequestRedirect,
    /// Rewrite the path or host before forwarding.
    #[serde(rename = "URLRewrite")]
    UrlRewrite,
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
    {"rule": "has(self.requestRedirect) == (self.type == 'RequestRedirect')", "message": "requestRedirect is set exactly when type is RequestRedirect"},
    {"rule": "has(self.urlRewrite) == (self.type == 'URLRewrite')", "message": "urlRewrite is set exactly when type is URLRewrite"},
    {"rule": "has(self.extensionRef) == (self.type == 'ExtensionRef')", "message": "extensionRef is set exactly when type is ExtensionRef"}
]))]
pub struct HTTPRouteFilter {
    /// Which filter this is.
    #[serde(rename = "type")]
    pub type_: HTTPRouteFilterType,
    /// For `RequestHeaderModifier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HttpHeaderFilter>,
    /// For `ResponseHeaderModifier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HttpHeaderFilter>,
    /// For `RequestMirror`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<HttpRequestMirrorFilter>,
    /// For `RequestRedirect`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<HTTPRequestRedirectFilter>,
    /// For `URLRewrite`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<HTTPURLRewriteFilter>,
    /// For `ExtensionRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_ref: Option<LocalObjectReference>,
}

/// Scheme of a redirect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RedirectScheme {
    /// `http`.
    Http,
    /// `https`.
    Https,
}

/// Answers matching requests with a redirect; unset parts keep the request's.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRequestRedirectFilter {
    /// Scheme of the new location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<RedirectScheme>,
    /// Host of the new location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub hostname: Option<String>,
    /// Path of the new location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HTTPPathModifier>,
    /// Port of the new location; absent: the scheme's well-known port when the scheme
    /// changes, else the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// `301` or `302` (default).
    #[serde(default = "default_redirect_code")]
    #[schemars(extend("enum" = [301, 302]))]
    pub status_code: i32,
}

fn default_redirect_code() -> i32 {
    302
}

/// Rewrites the path or Host of a request before it is forwarded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HTTPURLRewriteFilter {
    /// New Host header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub hostname: Option<String>,
    /// New path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HTTPPathModifier>,
}

/// Kind of path change.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HTTPPathModifierType {
    /// Replace the whole path.
    ReplaceFullPath,
    /// Replace the part the rule's `PathPrefix` match matched.
    ReplacePrefixMatch,
}

/// A path change: the whole path or the matched prefix.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.replaceFullPath) == (self.type == 'ReplaceFullPath')", "message": "replaceFullPath is set exactly when type is ReplaceFullPath"},
    {"rule": "has(self.replacePrefixMatch) == (self.type == 'ReplacePrefixMatch')", "message": "replacePrefixMatch is set exactly when type is ReplacePrefixMatch"}
]))]
pub struct HTTPPathModifier {
    /// Which change.
    #[serde(rename = "type")]
    pub type_: HTTPPathModifierType,
    /// For `ReplaceFullPath`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub replace_full_path: Option<String>,
    /// For `ReplacePrefixMatch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub replace_prefix_match: Option<String>,
}

/// A weighted backend of an HTTP rule, with filters of its own.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(size(self.group) == 0 && self.kind == 'Service') ? has(self.port) : true", "message": "Must have port for Service reference"}
]))]
pub struct HTTPBackendRef {
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
    /// Filters applied only to requests sent to this backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "!(self.exists(f, f.type == 'RequestRedirect') && self.exists(f, f.type == 'URLRewrite'))", "message": "RequestRedirect and URLRewrite filters cannot be used together"},
        {"rule": "self.filter(f, f.type == 'RequestHeaderModifier').size() <= 1", "message": "RequestHeaderModifier filter cannot be repeated"},
        {"rule": "self.filter(f, f.type == 'ResponseHeaderModifier').size() <= 1", "message": "ResponseHeaderModifier filter cannot be repeated"},
        {"rule": "self.filter(f, f.type == 'RequestRedirect').size() <= 1", "message": "RequestRedirect filter cannot be repeated"},
        {"rule": "self.filter(f, f.type == 'URLRewrite').size() <= 1", "message": "URLRewrite filter cannot be repeated"}
    ]))]
    pub filters: Vec<HTTPRouteFilter>,
}

impl HTTPBackendRef {
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

/// Timeouts of a rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!(has(self.request) && has(self.backendRequest) && duration(self.request) != duration('0s') && duration(self.backendRequest) > duration(self.request))", "message": "backendRequest must not be longer than request"}
]))]
pub struct HTTPRouteTimeouts {
    /// Time from the request's start to the end of the response, retries included; `0s`:
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub request: Option<String>,
    /// Time for one try to a backend; `0s`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub backend_request: Option<String>,
}

/// Retries of a rule (experimental channel).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteRetry {
    /// Response codes that are retried (400-599); connection failures are always retried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(range(min = 400, max = 599)))]
    pub codes: Vec<i32>,
    /// Most retries (after the first try); `0`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub attempts: Option<i32>,
    /// Base interval between tries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub backoff: Option<String>,
}
