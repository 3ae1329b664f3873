//! `networking.meshplane.io/v1alpha1`: Istio's networking API as meshplane supports it.
//!
//! Field names and JSON shapes follow Istio's `networking.istio.io/v1` so a manifest ports by
//! changing `apiVersion`. Supported fields:
//!
//! | kind | fields |
//! |---|---|
//! | `ServiceEntry` | `hosts`, `addresses`, `ports[].{number,protocol,name,targetPort}`, `location`, `resolution` (`NONE`, `STATIC`, `DNS`, `DNS_ROUND_ROBIN`), `endpoints[].{address,ports,labels,network,locality,weight}`, `workloadSelector.labels`, `exportTo`, `subjectAltNames` |
//! | `Sidecar` | `workloadSelector.labels`, `ingress[].{port,bind,captureMode,defaultEndpoint}`, `egress[].{port,bind,captureMode,hosts}`, `outboundTrafficPolicy.mode` |
//! | `EnvoyFilter` | `workloadSelector.labels`, `priority`, `configPatches[].{applyTo,match,patch}`; `match.{context,listener,routeConfiguration,cluster}`; `patch.{operation,value}` |
//! | `VirtualService` | `hosts`, `gateways`, `exportTo`; `http[].{name,match,route,redirect,directResponse,rewrite,timeout,retries,fault,mirror,mirrorPercentage,mirrors,corsPolicy,headers}`; `match[].{name,uri,scheme,method,authority,headers,port,sourceLabels,gateways,queryParams,ignoreUriCase,withoutHeaders,sourceNamespace,statPrefix}`; `tls[].{match.{sniHosts,destinationSubnets,port,sourceLabels,gateways,sourceNamespace},route}`; `tcp[].{match.{destinationSubnets,port,sourceLabels,gateways,sourceNamespace},route}` |
//! | `DestinationRule` | `host`, `exportTo`, `subsets[].{name,labels,trafficPolicy}`, `trafficPolicy.{loadBalancer,connectionPool,outlierDetection,tls,portLevelSettings}`; `loadBalancer.{simple,consistentHash,warmupDurationSecs}`; `connectionPool.{tcp,http}`; `tls.mode` `DISABLE`/`SIMPLE`/`MUTUAL`/`ISTIO_MUTUAL` |
//! | `Gateway` | `selector`, `servers[].{port,bind,hosts,tls,name}`; `tls.{httpsRedirect,mode,serverCertificate,privateKey,caCertificates,credentialName,subjectAltNames,minProtocolVersion,maxProtocolVersion,cipherSuites}` |
//!
//! Not supported (rejected by the schema as unknown fields): `Sidecar.inboundConnectionPool`;
//! `EnvoyFilter.targetRefs`, `match.proxy`; `ServiceEntry.workloadSelector` selecting
//! WorkloadEntries; `VirtualService` `http[].delegate` and the deprecated `mirrorPercent`;
//! `DestinationRule` `workloadSelector`, `trafficPolicy.{tunnel,proxyProtocol}` and
//! `loadBalancer.localityLbSetting`; `Gateway.servers[].defaultEndpoint`. Values the schema
//! accepts but meshplane cannot apply (`AUTO_PASSTHROUGH`, `ISTIO_MUTUAL` before the tenant's
//! identity exists, `credentialName` outside gateways) are refused by the validating webhook.

pub mod destination_rule;
pub mod gateway;
pub mod status;
pub mod virtual_service;

pub use destination_rule::{DestinationRule, DestinationRuleSpec};
pub use gateway::{Gateway, GatewaySpec};
pub use status::ConfigStatus;
pub use virtual_service::{VirtualService, VirtualServiceSpec};

/// DNS suffix of Kubernetes Service hosts.
pub const DOMAIN_SUFFIX: &str = "svc.cluster.local";

/// Resolves a host of networking config written in `namespace`: a short name (no dot, not a
/// wildcard) is `<name>.<namespace>.svc.cluster.local`, as Istio reads it; anything else is
/// kept (lowercased).
pub fn resolve_host(host: &str, namespace: &str) -> String {
    let host = host.to_ascii_lowercase();
    if host.contains('.') || host.contains('*') || host.is_empty() {
        host
    } else {
        format!("{host}.{namespace}.{DOMAIN_SUFFIX}")
    }
}

/// The namespace of a Kubernetes Service host `<name>.<namespace>.svc.cluster.local`.
pub fn service_host_namespace(host: &str) -> Option<&str> {
    let rest = host.strip_suffix(DOMAIN_SUFFIX)?.strip_suffix('.')?;
    let (_, namespace) = rest.rsplit_once('.')?;
    (!namespace.is_empty() && !namespace.contains('*')).then_some(namespace)
}

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Selects workloads (pods) by labels in the resource's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Pod labels that must all match.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A port of a service or listener.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// Port number (1-65535).
    #[schemars(range(min = 1, max = 65535))]
    pub number: u32,
    /// `HTTP`, `HTTP2`, `GRPC`, `TCP`, `TLS`, `HTTPS` (case-insensitive). Empty means TCP.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// Port name; protocol may also be given as a `<protocol>-` prefix of the name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Port on the endpoints when different from `number`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub target_port: Option<u32>,
}

/// An external or additional service added to the tenant's registry.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "networking.meshplane.io",
    version = "v1alpha1",
    kind = "ServiceEntry",
    doc = "An external or additional service added to the tenant registry (Istio-compatible).",
    namespaced,
    status = "ConfigStatus",
    shortname = "se",
    printcolumn = r#"{"name":"Hosts","type":"string","jsonPath":".spec.hosts"}"#,
    printcolumn = r#"{"name":"Location","type":"string","jsonPath":".spec.location"}"#,
    printcolumn = r#"{"name":"Resolution","type":"string","jsonPath":".spec.resolution"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntrySpec {
    /// Hosts of the entry: FQDNs, optionally with a leading `*.` wildcard.
    #[schemars(length(min = 1))]
    pub hosts: Vec<String>,
    /// Virtual IPs or CIDRs of the service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Ports of the service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    /// Whether the service is inside the mesh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    /// How endpoints are found.
    #[serde(default)]
    pub resolution: Resolution,
    /// Endpoints for `STATIC` (IP addresses) and `DNS` (hostnames) resolution.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<WorkloadEntry>,
    /// Pods of the namespace backing this entry (endpoints from the pods' addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// Namespaces that see this entry: `*` (the tenant, default), `.` (own namespace), `~`
    /// (nobody) or namespace names of the same tenant. Never wider than the tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
    /// Identities allowed for the service's workloads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
}

/// Location of a ServiceEntry.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Location {
    /// Outside the mesh (no mTLS).
    MeshExternal,
    /// Part of the mesh.
    MeshInternal,
}

/// Endpoint resolution of a ServiceEntry.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    /// Pass traffic to the original destination address.
    #[default]
    None,
    /// Static IP endpoints (`STATIC` cluster).
    Static,
    /// DNS names resolved by the proxy, all addresses used (`STRICT_DNS` cluster).
    Dns,
    /// DNS names resolved by the proxy, one address at a time (`LOGICAL_DNS` cluster).
    DnsRoundRobin,
}

/// One endpoint of a ServiceEntry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadEntry {
    /// IP address (STATIC) or hostname (DNS).
    pub address: String,
    /// Port overrides by service port name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u32>,
    /// Labels of the endpoint.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Network of the endpoint.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    /// Locality `region/zone/subzone`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub locality: String,
    /// Load-balancing weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// Narrows what the selected workloads (or the whole namespace, or tenant-wide from the control
/// namespace) import, and how their proxies listen.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "networking.meshplane.io",
    version = "v1alpha1",
    kind = "Sidecar",
    doc = "Narrows what workloads import and how their proxies listen (Istio-compatible).",
    namespaced,
    status = "ConfigStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    /// Workloads this Sidecar applies to; absent: the namespace-wide default (or tenant-wide in
    /// the control namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// Inbound listeners of the workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<IstioIngressListener>,
    /// What the workload may reach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<IstioEgressListener>,
    /// Policy for hosts not imported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
}

/// Outbound traffic policy (Istio's `outboundTrafficPolicy`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct OutboundTrafficPolicy {
    /// `ALLOW_ANY` passes traffic to unknown hosts through; `REGISTRY_ONLY` blocks it.
    #[serde(default)]
    pub mode: OutboundTrafficMode,
}

/// Mode of an [`OutboundTrafficPolicy`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboundTrafficMode {
    /// Unknown destinations pass through to their original address.
    #[default]
    AllowAny,
    /// Unknown destinations are refused.
    RegistryOnly,
}

/// How a listener receives traffic.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CaptureMode {
    /// The proxy's default (iptables capture).
    #[default]
    Default,
    /// Traffic is redirected by iptables.
    Iptables,
    /// No capture: the listener binds `bind:port` and the application sends to it explicitly.
    None,
}

/// An inbound listener of a Sidecar.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioIngressListener {
    /// Port the listener accepts on.
    pub port: Port,
    /// Address to bind (with `captureMode: NONE`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bind: String,
    /// Capture mode.
    #[serde(default)]
    pub capture_mode: CaptureMode,
    /// Where to forward: `127.0.0.1:PORT`, `0.0.0.0:PORT` or `unix://...`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub default_endpoint: String,
}

/// An outbound listener and import list of a Sidecar.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioEgressListener {
    /// Port of the listener; absent: all ports (the capture listener).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,
    /// Address to bind (with `captureMode: NONE`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bind: String,
    /// Capture mode.
    #[serde(default)]
    pub capture_mode: CaptureMode,
    /// Imported hosts as `namespace/dnsName`: `./*`, `ns/*`, `*/host`, `~/*`.
    #[schemars(length(min = 1))]
    pub hosts: Vec<String>,
}

/// Patches the Envoy configuration generated for the selected proxies.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "networking.meshplane.io",
    version = "v1alpha1",
    kind = "EnvoyFilter",
    doc = "Patches the Envoy configuration generated for selected proxies (Istio-compatible).",
    namespaced,
    status = "ConfigStatus",
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyFilterSpec {
    /// Proxies this filter applies to; absent: every proxy of the namespace (tenant-wide when the
    /// filter sits in the control namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// Order of application: lower first; ties by creation time, then name.
    #[serde(default)]
    pub priority: i32,
    /// Patches, applied in order.
    #[serde(default)]
    pub config_patches: Vec<EnvoyConfigObjectPatch>,
}

/// One patch of an EnvoyFilter.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigObjectPatch {
    /// Kind of object patched.
    pub apply_to: ApplyTo,
    /// Which objects.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<EnvoyConfigObjectMatch>,
    /// What to do.
    pub patch: Patch,
}

/// Kind of Envoy object an EnvoyFilter patch applies to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ApplyTo {
    /// Unset (invalid).
    #[default]
    Invalid,
    /// A listener.
    Listener,
    /// A filter chain of a listener.
    FilterChain,
    /// A network filter of a filter chain.
    NetworkFilter,
    /// An HTTP filter of the HTTP connection manager.
    HttpFilter,
    /// A route configuration (RDS).
    RouteConfiguration,
    /// A virtual host of a route configuration.
    VirtualHost,
    /// A cluster.
    Cluster,
    /// A route of a virtual host (`match.routeConfiguration.vhost.route`).
    HttpRoute,
}

/// Selects the objects a patch applies to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigObjectMatch {
    /// Traffic direction.
    #[serde(default)]
    pub context: PatchContext,
    /// Listener match (LISTENER, FILTER_CHAIN, NETWORK_FILTER, HTTP_FILTER).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<ListenerMatch>,
    /// Route configuration match (ROUTE_CONFIGURATION, VIRTUAL_HOST).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_configuration: Option<RouteConfigurationMatch>,
    /// Cluster match (CLUSTER).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterMatch>,
}

/// Direction a patch applies to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PatchContext {
    /// Inbound and outbound.
    #[default]
    Any,
    /// Inbound listeners and clusters of the sidecar.
    SidecarInbound,
    /// Outbound listeners, routes and clusters of the sidecar.
    SidecarOutbound,
    /// Gateways (meshplane runs none; matches nothing).
    Gateway,
}

/// Listener match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerMatch {
    /// Listener port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_number: Option<u32>,
    /// Listener name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Filter chain match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_chain: Option<FilterChainMatch>,
}

/// Filter chain match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilterChainMatch {
    /// Filter chain name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Filter match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterMatch>,
}

/// Network filter match, optionally down to an HTTP filter.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilterMatch {
    /// Network filter name, e.g. `envoy.filters.network.http_connection_manager`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// HTTP filter match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_filter: Option<SubFilterMatch>,
}

/// HTTP filter match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubFilterMatch {
    /// HTTP filter name, e.g. `envoy.filters.http.router`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// Route configuration match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteConfigurationMatch {
    /// Port of the route configuration (its name for outbound routes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_number: Option<u32>,
    /// Route configuration name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Virtual host match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<VirtualHostMatch>,
}

/// Virtual host match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualHostMatch {
    /// Virtual host name, e.g. `reviews.shop.svc.cluster.local:9080`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The routes of the virtual host an `HTTP_ROUTE` patch applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteMatch>,
}

/// Route match (`applyTo: HTTP_ROUTE`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteMatch {
    /// Route name: a VirtualService's `http[].name` (or `default` for the route of a host
    /// without one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// What the route does: `ANY` (default), `ROUTE`, `REDIRECT` or `DIRECT_RESPONSE`.
    #[serde(default)]
    pub action: RouteAction,
}

/// What a route does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RouteAction {
    /// Any route.
    #[default]
    Any,
    /// Forwards to a cluster.
    Route,
    /// Answers with a redirect.
    Redirect,
    /// Answers directly.
    DirectResponse,
}

/// Cluster match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterMatch {
    /// Service port of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_number: Option<u32>,
    /// Service FQDN of the cluster.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// Exact cluster name, e.g. `outbound|80||web.shop.svc.cluster.local`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// The change a patch makes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Patch {
    /// Operation.
    pub operation: PatchOperation,
    /// Envoy config in proto-JSON form (with `@type` for typed configs) for MERGE, ADD,
    /// INSERT_* and REPLACE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub value: Option<serde_json::Value>,
}

/// Patch operation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PatchOperation {
    /// Unset (invalid).
    #[default]
    Invalid,
    /// Merge `value` into the matched object.
    Merge,
    /// Add `value` (listeners, clusters, filter chains, network/HTTP filters at the end).
    Add,
    /// Remove the matched object.
    Remove,
    /// Insert before the matched filter.
    InsertBefore,
    /// Insert after the matched filter.
    InsertAfter,
    /// Insert first in the filter list.
    InsertFirst,
    /// Replace the matched object.
    Replace,
}

fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}
