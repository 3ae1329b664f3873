//! Types shared by the Gateway API kinds: references to parents and backends, header and
//! mirror filters used by HTTP and gRPC routes, route status, and the condition types and
//! reasons the specification defines.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::GROUP;

/// An RFC 1123 subdomain, what Gateway API calls a `PreciseHostname` or an object name.
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A hostname, optionally with a leading `*.` wildcard label.
pub const HOSTNAME_PATTERN: &str =
    r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// An API group: empty (the core group) or a DNS subdomain.
pub const GROUP_PATTERN: &str =
    r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A kind name.
pub const KIND_PATTERN: &str = r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$";
/// A namespace name (RFC 1123 label).
pub const NAMESPACE_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// An HTTP header (or query parameter) name: RFC 7230 token characters.
pub const HEADER_NAME_PATTERN: &str = r"^[A-Za-z0-9!#$%&'*+\-.^_\x60|~]+$";
/// A Gateway API duration (GEP-2257): up to four `<number><unit>` parts, units `h`, `m`,
/// `s`, `ms`.
pub const DURATION_PATTERN: &str = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$";
/// A controller name: a domain-prefixed path.
pub const CONTROLLER_NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$";

pub(crate) fn gateway_group() -> String {
    GROUP.to_string()
}

pub(crate) fn gateway_kind() -> String {
    "Gateway".to_string()
}

pub(crate) fn service_kind() -> String {
    "Service".to_string()
}

pub(crate) fn default_weight() -> i32 {
    1
}

/// A reference from a route to the object it attaches to: a Gateway (the default, optionally
/// one listener by `sectionName` or `port`) or, for mesh routes (GAMMA), a Service (group
/// `""`, kind `Service`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    /// API group of the parent: `gateway.networking.k8s.io` (default) or `""` for a Service.
    #[serde(default = "gateway_group")]
    #[schemars(length(max = 253), regex(pattern = GROUP_PATTERN))]
    pub group: String,
    /// Kind of the parent: `Gateway` (default) or `Service`.
    #[serde(default = "gateway_kind")]
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: String,
    /// Namespace of the parent; absent: the route's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = NAMESPACE_PATTERN))]
    pub namespace: Option<String>,
    /// Name of the parent.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// A section of the parent: a Gateway listener's name, or a Service port's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub section_name: Option<String>,
    /// A port of the parent: the Gateway listeners on that port, or the Service port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

impl ParentReference {
    /// Whether the parent is a Service (a mesh route, GAMMA).
    pub fn is_service(&self) -> bool {
        self.group.is_empty() && self.kind == "Service"
    }

    /// Whether the parent is a Gateway.
    pub fn is_gateway(&self) -> bool {
        self.group == GROUP && self.kind == "Gateway"
    }

    /// The parent's namespace, the route's own when absent.
    pub fn namespace_or<'a>(&'a self, route_namespace: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(route_namespace)
    }
}

/// CEL rule on a route's `parentRefs`: when two references name the same parent, both give a
/// `sectionName` (the specification's rule; `namespace` is escaped in CEL).
pub(crate) const PARENT_REFS_SECTION_RULE: &str = "self.all(a, self.all(b, !(a.group == b.group && a.kind == b.kind && a.name == b.name && (has(a.__namespace__) ? a.__namespace__ : '') == (has(b.__namespace__) ? b.__namespace__ : '')) || (has(a.sectionName) && a.sectionName != '') == (has(b.sectionName) && b.sectionName != '')))";
/// Message of [`PARENT_REFS_SECTION_RULE`].
pub(crate) const PARENT_REFS_SECTION_MESSAGE: &str =
    "sectionName must be given on every parentRef when several name the same parent";
/// CEL rule on a route's `parentRefs`: no parent (with its section) is named twice.
pub(crate) const PARENT_REFS_UNIQUE_RULE: &str = "self.all(a, self.exists_one(b, a.group == b.group && a.kind == b.kind && a.name == b.name && (has(a.__namespace__) ? a.__namespace__ : '') == (has(b.__namespace__) ? b.__namespace__ : '') && (has(a.sectionName) ? a.sectionName : '') == (has(b.sectionName) ? b.sectionName : '')))";
/// Message of [`PARENT_REFS_UNIQUE_RULE`].
pub(crate) const PARENT_REFS_UNIQUE_MESSAGE: &str =
    "each parentRef (with its sectionName) must be unique";

/// A reference to a backend object: a Service (the default) in the route's namespace or, with
/// a ReferenceGrant, another one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(size(self.group) == 0 && self.kind == 'Service') ? has(self.port) : true", "message": "Must have port for Service reference"}
]))]
pub struct BackendObjectReference {
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
    /// Namespace of the backend; absent: the route's namespace. Another namespace needs a
    /// ReferenceGrant there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = NAMESPACE_PATTERN))]
    pub namespace: Option<String>,
    /// Port of the backend; required for a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

impl BackendObjectReference {
    /// Whether the backend is a core Service.
    pub fn is_service(&self) -> bool {
        self.group.is_empty() && self.kind == "Service"
    }

    /// The backend's namespace, the route's own when absent.
    pub fn namespace_or<'a>(&'a self, route_namespace: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(route_namespace)
    }
}

/// A weighted backend of a TLS or TCP route.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(size(self.group) == 0 && self.kind == 'Service') ? has(self.port) : true", "message": "Must have port for Service reference"}
]))]
pub struct BackendRef {
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
}

impl BackendRef {
    /// The referenced object without the weight.
    pub fn object(&self) -> BackendObjectReference {
        BackendObjectReference {
            group: self.group.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            port: self.port,
        }
    }
}

/// A reference to an object in the same namespace (filter extensions).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// API group of the object.
    #[schemars(length(max = 253), regex(pattern = GROUP_PATTERN))]
    pub group: String,
    /// Kind of the object.
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: String,
    /// Name of the object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A reference to a Secret (the default kind) holding a certificate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretObjectReference {
    /// API group; `""` (default) is the core group.
    #[serde(default)]
    #[schemars(length(max = 253), regex(pattern = GROUP_PATTERN))]
    pub group: String,
    /// Kind: `Secret` (default).
    #[serde(default = "secret_kind")]
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: String,
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace; absent: the referring object's. Another namespace needs a ReferenceGrant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = NAMESPACE_PATTERN))]
    pub namespace: Option<String>,
}

fn secret_kind() -> String {
    "Secret".to_string()
}

/// One header set or added by a header modifier.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// Header name (case-insensitive).
    #[schemars(length(min = 1, max = 256), regex(pattern = HEADER_NAME_PATTERN))]
    pub name: String,
    /// Header value.
    #[schemars(length(min = 1, max = 4096))]
    pub value: String,
}

/// Changes to request or response headers: `set` replaces, `add` appends, `remove` drops.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeaderFilter {
    /// Headers to set (replacing any value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub set: Vec<HttpHeader>,
    /// Headers to add (appending to any value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub add: Vec<HttpHeader>,
    /// Header names to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub remove: Vec<String>,
}

/// Sends a copy of each request to another backend; its responses are dropped.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestMirrorFilter {
    /// The backend receiving the copies.
    pub backend_ref: BackendObjectReference,
}

/// Gateway API conditions and reasons, by the specification's names.
pub mod conditions {
    /// Route (per parent) and Gateway/GatewayClass condition: the object is valid and
    /// attached.
    pub const ACCEPTED: &str = "Accepted";
    /// Route condition (per parent): every reference of the route could be resolved.
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    /// Gateway and listener condition: the configuration reached the data plane.
    pub const PROGRAMMED: &str = "Programmed";

    /// Reason of a true `Accepted` or `ResolvedRefs` condition.
    pub const REASON_ACCEPTED: &str = "Accepted";
    /// Reason of a true `ResolvedRefs`.
    pub const REASON_RESOLVED_REFS: &str = "ResolvedRefs";
    /// Reason of a true `Programmed`.
    pub const REASON_PROGRAMMED: &str = "Programmed";
    /// `Accepted` false: no listener of the parent allows the route.
    pub const REASON_NOT_ALLOWED_BY_LISTENERS: &str = "NotAllowedByListeners";
    /// `Accepted` false: no listener hostname intersects the route's hostnames.
    pub const REASON_NO_MATCHING_LISTENER_HOSTNAME: &str = "NoMatchingListenerHostname";
    /// `Accepted` false: the parent (or its section or port) does not exist.
    pub const REASON_NO_MATCHING_PARENT: &str = "NoMatchingParent";
    /// `Accepted` false: the route uses a feature the implementation does not support.
    pub const REASON_UNSUPPORTED_VALUE: &str = "UnsupportedValue";
    /// `Accepted` false: the route is waiting for a controller.
    pub const REASON_PENDING: &str = "Pending";
    /// `ResolvedRefs` false: a reference to another namespace has no ReferenceGrant.
    pub const REASON_REF_NOT_PERMITTED: &str = "RefNotPermitted";
    /// `ResolvedRefs` false: a reference names an unsupported group or kind.
    pub const REASON_INVALID_KIND: &str = "InvalidKind";
    /// `ResolvedRefs` false: a referenced backend does not exist.
    pub const REASON_BACKEND_NOT_FOUND: &str = "BackendNotFound";
    /// `ResolvedRefs` false: the backend speaks an application protocol the route cannot use.
    pub const REASON_UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    /// Gateway `Accepted` false: the Gateway is not valid.
    pub const REASON_INVALID: &str = "Invalid";
    /// Gateway `Programmed` false: the Gateway is valid but not yet serving.
    pub const REASON_INVALID_PARAMETERS: &str = "InvalidParameters";
}

/// Status of one parent of a route, written by the controller that owns the parent.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    /// The parent, as the route names it.
    pub parent_ref: ParentReference,
    /// The controller that wrote this entry (`meshplane.io/gateway-controller`).
    #[schemars(length(min = 1, max = 253), regex(pattern = CONTROLLER_NAME_PATTERN))]
    pub controller_name: String,
    /// `Accepted` and `ResolvedRefs` for this parent.
    #[schemars(length(min = 1, max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Status of a route: one entry per parent a controller handles.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// Per parent, the status its controller reports. Each controller writes only its own
    /// entries.
    #[schemars(length(max = 32))]
    #[serde(default)]
    pub parents: Vec<RouteParentStatus>,
}

/// Free-form extra fields some controllers accept, keyed by name (Gateway TLS `options`).
pub type AnnotationMap = BTreeMap<String, String>;

/// Parses a Gateway API duration (`1h30m`, `500ms`, `10s`); `None` when it does not follow
/// the grammar.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total = std::time::Duration::ZERO;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (std::time::Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (std::time::Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (std::time::Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (std::time::Duration::from_secs(1), 1)
        } else {
            return None;
        };
        rest = &rest[len..];
        total += unit.checked_mul(u32::try_from(n).ok()?)?;
        parts += 1;
        if parts > 4 {
            return None;
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_follow_the_gateway_api_grammar() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        assert_eq!(
            parse_duration("1m1s1ms1h"),
            Some(Duration::from_millis(3_661_001))
        );
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("1.5s"), None);
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("123456s"), None);
        assert_eq!(parse_duration("1s1s1s1s1s"), None);
        assert_eq!(parse_duration("5d"), None);
    }

    #[test]
    fn references_take_the_specification_defaults() {
        let parent: ParentReference = serde_json::from_str(r#"{"name":"web"}"#).unwrap();
        assert!(parent.is_gateway());
        assert_eq!(parent.namespace_or("shop"), "shop");
        let svc: ParentReference =
            serde_json::from_str(r#"{"group":"","kind":"Service","name":"web","port":80}"#)
                .unwrap();
        assert!(svc.is_service() && !svc.is_gateway());
        let backend: BackendRef = serde_json::from_str(r#"{"name":"v1","port":8080}"#).unwrap();
        assert!(backend.object().is_service());
        assert_eq!(backend.weight, 1);
    }
}
