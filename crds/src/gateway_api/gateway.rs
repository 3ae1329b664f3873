//! `Gateway` (`gateway.networking.k8s.io/v1`): listeners of a gateway proxy of a class, and
//! which routes may attach to them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::*;

/// A gateway proxy of a class: its listeners and addresses.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "Gateway",
    plural = "gateways",
    doc = "A gateway proxy of a GatewayClass: listeners, addresses, the routes it admits (Kubernetes Gateway API).",
    namespaced,
    shortname = "gtw",
    status = "GatewayStatus",
    category = "gateway-api",
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.gatewayClassName"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".status.addresses[*].value"}"#,
    printcolumn = r#"{"name":"Programmed","type":"string","jsonPath":".status.conditions[?(@.type==\"Programmed\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The GatewayClass of this Gateway.
    #[schemars(length(min = 1, max = 253))]
    pub gateway_class_name: String,
    /// The listeners (unique names; unique port, protocol and hostname).
    #[schemars(length(min = 1, max = 64))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
        "x-kubernetes-validations" = [
            {"rule": "self.all(l, l.protocol in ['HTTP', 'TCP', 'UDP'] ? !has(l.tls) : true)", "message": "tls must not be set for HTTP, TCP and UDP listeners"},
            {"rule": "self.all(l, (l.protocol == 'HTTPS' && has(l.tls)) ? (l.tls.mode == '' || l.tls.mode == 'Terminate') : true)", "message": "an HTTPS listener terminates TLS (tls.mode Terminate)"},
            {"rule": "self.all(l, l.protocol in ['TCP', 'UDP'] ? (!has(l.hostname) || l.hostname == '') : true)", "message": "hostname must not be set for TCP and UDP listeners"},
            {"rule": "self.all(a, self.exists_one(b, a.name == b.name))", "message": "listener names must be unique"},
            {"rule": "self.all(a, self.exists_one(b, a.port == b.port && a.protocol == b.protocol && (has(a.hostname) ? a.hostname : '') == (has(b.hostname) ? b.hostname : '')))", "message": "the combination of port, protocol and hostname must be unique for each listener"}
        ]
    ))]
    pub listeners: Vec<Listener>,
    /// Addresses requested for the Gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub addresses: Vec<GatewayAddress>,
    /// Labels, annotations and parameters of what the controller deploys for the Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure: Option<GatewayInfrastructure>,
}

/// One listener: a port, protocol and (optionally) hostname, its TLS, and which routes attach.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    /// Name of the listener (what a route's `sectionName` names).
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
    /// Hostname served (SNI and Host); a leading `*.` label is a wildcard; absent: every one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = HOSTNAME_PATTERN))]
    pub hostname: Option<String>,
    /// Port number.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP`, `UDP` or a domain-prefixed protocol.
    #[schemars(
        length(min = 1, max = 255),
        regex(
            pattern = r"^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[A-Za-z0-9]+$"
        )
    )]
    pub protocol: String,
    /// TLS of an `HTTPS` or `TLS` listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayTlsConfig>,
    /// Which routes may attach; default: routes of the Gateway's namespace.
    #[serde(default = "default_allowed_routes")]
    pub allowed_routes: Option<AllowedRoutes>,
}

fn default_allowed_routes() -> Option<AllowedRoutes> {
    Some(AllowedRoutes::default())
}

/// TLS of a listener.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.mode == 'Terminate' ? size(self.certificateRefs) > 0 || size(self.options) > 0 : true", "message": "certificateRefs or options must be specified when mode is Terminate"}
]))]
pub struct GatewayTlsConfig {
    /// `Terminate` (default) or `Passthrough`.
    #[serde(default)]
    pub mode: TlsModeType,
    /// Certificates (Secrets of type `kubernetes.io/tls`) of a terminating listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub certificate_refs: Vec<SecretObjectReference>,
    /// Options of the implementation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 4096)))]
    pub options: BTreeMap<String, String>,
}

/// TLS mode of a listener.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TlsModeType {
    /// Terminate TLS at the gateway.
    #[default]
    Terminate,
    /// Forward the TLS stream untouched (routed by SNI).
    Passthrough,
}

/// Routes that may attach to a listener.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    /// From which namespaces; default: the Gateway's own.
    #[serde(default = "default_route_namespaces")]
    pub namespaces: Option<RouteNamespaces>,
    /// Which route kinds; empty: those matching the protocol.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub kinds: Vec<RouteGroupKind>,
}

impl Default for AllowedRoutes {
    fn default() -> Self {
        Self {
            namespaces: default_route_namespaces(),
            kinds: Vec::new(),
        }
    }
}

fn default_route_namespaces() -> Option<RouteNamespaces> {
    Some(RouteNamespaces::default())
}

/// Namespaces whose routes may attach.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `Same` (default), `All` or `Selector`.
    #[serde(default)]
    pub from: FromNamespaces,
    /// Namespace labels, for `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// Where attached routes may come from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum FromNamespaces {
    /// Any namespace.
    All,
    /// Namespaces matching `selector`.
    Selector,
    /// The Gateway's namespace.
    #[default]
    Same,
}

/// A route kind.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    /// API group (default `gateway.networking.k8s.io`).
    #[serde(default = "gateway_group")]
    #[schemars(length(max = 253), regex(pattern = GROUP_PATTERN))]
    pub group: String,
    /// Kind (`HTTPRoute`, `GRPCRoute`, `TLSRoute`, `TCPRoute`).
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: String,
}

/// An address of a Gateway.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.type == 'Hostname' ? self.value.matches(r\"\"\"^(\\*\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$\"\"\"): true", "message": "Hostname value must only contain valid characters (matching ^(\\*\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$)"}
]))]
pub struct GatewayAddress {
    /// `IPAddress` (default), `Hostname`, `NamedAddress` or a domain-prefixed type.
    #[serde(rename = "type", default = "ip_address_type")]
    #[schemars(
        length(min = 1, max = 253),
        regex(
            pattern = r"^Hostname|IPAddress|NamedAddress|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$"
        )
    )]
    pub type_: String,
    /// The address.
    #[schemars(length(min = 1, max = 253))]
    pub value: String,
}

fn ip_address_type() -> String {
    "IPAddress".to_string()
}

/// What the controller deploys for the Gateway carries these labels and annotations, and may
/// take parameters.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayInfrastructure {
    /// Labels of the deployed objects.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 8), inner(length(max = 63)))]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the deployed objects.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 8), inner(length(max = 4096)))]
    pub annotations: BTreeMap<String, String>,
    /// Parameters of this Gateway, an object of its namespace the controller understands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_ref: Option<LocalObjectReference>,
}

/// Observed state of a Gateway, written by its class's controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// Addresses the Gateway is reachable at.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub addresses: Vec<GatewayAddress>,
    /// `Accepted` and `Programmed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Per listener: attached routes, supported kinds, conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub listeners: Vec<ListenerStatus>,
}

/// Observed state of one listener.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    /// The listener's name.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
    /// Route kinds the listener takes.
    #[schemars(length(max = 8))]
    pub supported_kinds: Vec<RouteGroupKind>,
    /// How many routes are attached (accepted).
    pub attached_routes: i32,
    /// `Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`.
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
