//! Pure translation of the tenant registry into the Envoy resources of one proxy, Istio-style.
//!
//! - Clusters `outbound|<port>||<host>` for every port of every host the proxy imports: EDS
//!   (over ADS) for Kubernetes Services and ServiceEntries with a workload selector; `STATIC`,
//!   `STRICT_DNS` (`DNS`), `LOGICAL_DNS` (`DNS_ROUND_ROBIN`) or `ORIGINAL_DST` (`NONE`) for
//!   ServiceEntries; plus `PassthroughCluster`, `BlackHoleCluster` and, with capture,
//!   `InboundPassthroughCluster`.
//! - Outbound listeners: with capture, `virtualOutbound` on 15001 (original destination) and one
//!   `0.0.0.0_<port>` per service port (not bound); without capture (`captureMode: NONE` on the
//!   node or the Sidecar egress listener), real listeners `<bind>_<port>` (default bind
//!   127.0.0.1; unknown hosts are refused there, as their original destination is the listener
//!   itself). HTTP ports use RDS with the route configuration named by the port; TCP ports
//!   proxy to the service matched by destination address (or the only service of the port).
//! - Inbound: `inbound|<port>||` clusters to the workload's own ports (services selecting its
//!   labels, or its Sidecar's `ingress`), the `virtualInbound` listener on 15006 with capture,
//!   bound ingress listeners without.
//! - Scoping: only hosts visible to the proxy (`exportTo`) and imported by its Sidecar appear.
//! - Mutual TLS ([`mtls`], contract 11): inbound chains per PeerAuthentication mode (STRICT,
//!   PERMISSIVE, DISABLE; PERMISSIVE by default), the client identity forwarded in
//!   `x-forwarded-client-cert`; outbound EDS clusters originate mutual TLS to endpoints with a
//!   sidecar of the tenant. Only proxies with the node agent's SDS secrets get TLS contexts.
//! - Authorization ([`authz`]): the workload's AuthorizationPolicies as RBAC filters on every
//!   inbound chain (HTTP filters before the router, network filters before the TCP proxy),
//!   AUDIT then DENY then ALLOW, failing closed where a chain cannot know an attribute.
//! - End-user authentication ([`jwt`]): the workload's RequestAuthentications as one
//!   `jwt_authn` filter before the RBAC filters, with key sets the instance fetched.
//! - Telemetry ([`telemetry`]): access logs, tracing and request and TCP metrics as the
//!   workload's Telemetries and the revision's defaults (`meshConfig.accessLogging`,
//!   `defaultProviders`, `defaultConfig.tracing`) ask; the clusters of its collectors are
//!   added when the proxy's scope left them out.
//! - External authorization ([`ext_authz`]): CUSTOM policies send the requests their rules
//!   match to the tenant's ext_authz provider (a shadow RBAC filter selects them, then
//!   `envoy.filters.http.ext_authz`), before DENY and ALLOW; the authorizer's cluster is added
//!   when the proxy's scope left it out. Dry-run policies (`istio.io/dry-run`) are shadow rules.
//!
//! EnvoyFilters are applied afterwards by [`crate::envoyfilter`].

pub mod authz;
pub mod authz_diagnostics;
pub mod cluster_id;
pub mod diagnostics;
pub mod endpoints;
pub mod envoy;
pub mod ext_authz;
mod finding;
pub mod gamma;
pub mod gateway;
pub mod gateway_api_gateways;
pub mod gateway_listeners;
pub mod grpc;
mod inbound;
pub mod jwt;
pub mod mtls;
mod outbound;
pub mod policy;
pub mod protojson;
pub mod registry;
pub mod routes;
pub mod scope;
pub mod telemetry;
pub mod traffic;
pub mod vhds;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::security::WorkloadMtls;

use crate::model::{ProxyKind, ProxyNode};
pub use inbound::{inbound_ports, InboundPort};
pub use outbound::{claimable_domains, claims_any, host_outbound, virtual_host_name, HostOutbound};
pub use registry::Registry;
use scope::ProxyScope;

/// Name of the cluster forwarding unknown outbound traffic to its original destination.
pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
/// Name of the cluster that drops unknown outbound traffic.
pub const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";
/// Name of the cluster forwarding unknown inbound traffic to its original destination.
pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";
/// Name of the capture listener for outbound traffic.
pub const VIRTUAL_OUTBOUND_LISTENER: &str = "virtualOutbound";
/// Name of the capture listener for inbound traffic.
pub const VIRTUAL_INBOUND_LISTENER: &str = "virtualInbound";

/// The Envoy resources of one proxy, before encoding.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Translated {
    pub clusters: Vec<Cluster>,
    pub endpoints: Vec<ClusterLoadAssignment>,
    pub listeners: Vec<Listener>,
    pub routes: Vec<RouteConfiguration>,
}

impl Translated {
    /// Sorts every resource list by name (the order ADS and golden files rely on).
    pub fn sort(&mut self) {
        self.clusters.sort_by(|a, b| a.name.cmp(&b.name));
        self.endpoints
            .sort_by(|a, b| a.cluster_name.cmp(&b.cluster_name));
        self.listeners.sort_by(|a, b| a.name.cmp(&b.name));
        self.routes.sort_by(|a, b| a.name.cmp(&b.name));
    }
}

/// Whether the proxy relies on traffic capture (iptables) rather than bound listeners.
pub fn captures(node: &ProxyNode) -> bool {
    node.capture_mode != CaptureMode::None
}

/// The PeerAuthentication modes in force on the proxy's workload.
pub fn peer_mtls(registry: &Registry, node: &ProxyNode) -> WorkloadMtls {
    meshplane_crds::security::effective_mtls(
        &registry.peer_authentications,
        &registry.control_namespace,
        &node.namespace,
        &node.labels,
    )
}

/// The AuthorizationPolicies that apply to the proxy's workload (namespace, tenant-wide,
/// selector), in a stable order.
pub fn authorization_policies<'a>(
    registry: &'a Registry,
    node: &ProxyNode,
) -> Vec<&'a meshplane_crds::AuthorizationPolicy> {
    meshplane_crds::security::authorization::applicable_policies(
        &registry.authorization_policies,
        &registry.control_namespace,
        &node.namespace,
        &node.labels,
    )
}

/// The RequestAuthentications that apply to the proxy's workload (namespace, tenant-wide,
/// selector), in a stable order.
pub fn request_authentications<'a>(
    registry: &'a Registry,
    node: &ProxyNode,
) -> Vec<&'a meshplane_crds::RequestAuthentication> {
    meshplane_crds::security::request_authentication::applicable_request_authentications(
        &registry.request_authentications,
        &registry.control_namespace,
        &node.namespace,
        &node.labels,
    )
}

/// Whether `addr` lies in `cidr` (an IP or `IP/len`).
pub fn subnet_contains(cidr: &str, addr: std::net::IpAddr) -> bool {
    let (net, len) = match cidr.split_once('/') {
        Some((n, l)) => (n, l.parse::<u32>().ok()),
        None => (cidr, None),
    };
    let Ok(net) = net.parse::<std::net::IpAddr>() else {
        return false;
    };
    match (net, addr) {
        (std::net::IpAddr::V4(n), std::net::IpAddr::V4(a)) => {
            let len = len.unwrap_or(32).min(32);
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(n) & mask == u32::from(a) & mask
        }
        (std::net::IpAddr::V6(n), std::net::IpAddr::V6(a)) => {
            let len = len.unwrap_or(128).min(128);
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// What a proxy's configuration depends on besides its namespace, Sidecar, EnvoyFilters and
/// ports: its kind, for gateways their labels (which Gateways select them) and the credentials
/// they may read, and for everyone which `sourceLabels` conditions of the tenant's
/// VirtualServices it satisfies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TrafficKey {
    kind: ProxyKind,
    gateway_labels: Option<std::collections::BTreeMap<String, String>>,
    gateway_credentials: Option<std::collections::BTreeSet<String>>,
    source_label_matches: Vec<bool>,
}

impl TrafficKey {
    /// The kind of proxy the key is of.
    pub fn kind(&self) -> ProxyKind {
        self.kind
    }
}

/// The [`TrafficKey`] of a proxy.
pub fn traffic_key(registry: &Registry, node: &ProxyNode) -> TrafficKey {
    let mut matches = Vec::new();
    let mut check = |selector: &std::collections::BTreeMap<String, String>| {
        if !selector.is_empty() {
            matches.push(traffic::labels_match(selector, &node.labels));
        }
    };
    for vs in &registry.virtual_services {
        for m in vs.spec.http.iter().flat_map(|r| r.match_.iter()) {
            check(&m.source_labels);
        }
        for m in vs.spec.tcp.iter().flat_map(|r| r.match_.iter()) {
            check(&m.source_labels);
        }
        for m in vs.spec.tls.iter().flat_map(|r| r.match_.iter()) {
            check(&m.source_labels);
        }
    }
    TrafficKey {
        kind: node.kind,
        gateway_labels: (node.kind == ProxyKind::Router).then(|| node.labels.clone()),
        gateway_credentials: node
            .readable_credentials
            .clone()
            .filter(|_| node.kind == ProxyKind::Router),
        source_label_matches: matches,
    }
}

/// Adds the clusters of the external authorizers the proxy calls when its outbound scope
/// (a Sidecar's imports, `exportTo`) left them out.
fn authorizer_clusters(
    registry: &Registry,
    node: &ProxyNode,
    custom: &ext_authz::CustomProviders<'_>,
    out: &mut Translated,
) {
    for provider in custom.resolved() {
        required_clusters(registry, node, &provider.cluster(), provider.service, out);
    }
}

/// Adds the clusters of `service` (one of them `cluster`) when the proxy's outbound scope left
/// them out: what a provider the proxy calls (an authorizer, a tracing collector) needs.
fn required_clusters(
    registry: &Registry,
    node: &ProxyNode,
    cluster: &str,
    service: &registry::ServiceModel,
    out: &mut Translated,
) {
    {
        if out.clusters.iter().any(|c| c.name == cluster) {
            return;
        }
        let mut extra = Translated::default();
        outbound::outbound_clusters(registry, &node.namespace, node.sds, service, &mut extra);
        for cluster in extra.clusters {
            if !out.clusters.iter().any(|c| c.name == cluster.name) {
                out.clusters.push(cluster);
            }
        }
        for endpoints in extra.endpoints {
            if !out
                .endpoints
                .iter()
                .any(|e| e.cluster_name == endpoints.cluster_name)
            {
                out.endpoints.push(endpoints);
            }
        }
    }
}

/// Translates the registry for one proxy (without EnvoyFilter patches).
pub fn translate(registry: &Registry, node: &ProxyNode) -> Translated {
    let mut out = Translated::default();
    match node.kind {
        ProxyKind::Sidecar => {
            let scope: ProxyScope = scope::proxy_scope(registry, &node.namespace, &node.labels);
            outbound::translate_outbound(registry, &scope, node, &mut out);
            let inbound = inbound_ports(registry, node, &scope);
            let peer_mtls = peer_mtls(registry, node);
            let policies = authorization_policies(registry, node);
            let authentications = request_authentications(registry, node);
            let custom = ext_authz::CustomProviders::of(registry, &policies);
            inbound::translate_inbound(
                &inbound,
                node,
                &peer_mtls,
                &inbound::InboundAuthz {
                    policies: &policies,
                    trust_domain: registry.trust_domain(),
                    jwt: jwt::http_filter(&authentications, &registry.jwks),
                    custom: &custom,
                },
                &mut out,
            );
            authorizer_clusters(registry, node, &custom, &mut out);
        }
        ProxyKind::Router => gateway::translate_router(registry, node, &mut out),
        ProxyKind::Grpc => grpc::translate_proxyless(registry, node, &mut out),
    }
    if node.kind != ProxyKind::Grpc {
        // The telemetry collectors' clusters (tracing, OpenTelemetry access logs), whatever
        // the outbound scope.
        for (cluster, service) in telemetry::collectors(registry, node) {
            required_clusters(registry, node, &cluster, service, &mut out);
        }
        // Sidecars and gateways originate mutual TLS to meshed endpoints (auto-mTLS).
        mtls::apply(registry, node, &mut out);
        telemetry::apply(registry, node, &mut out);
    }
    out.sort();
    out
}
