//! Inbound side of a proxy: the workload's own ports, each with the filter chains its
//! PeerAuthentication mode asks for ([`mtls::inbound_chain_plan`]), each with the RBAC filters of
//! the workload's AuthorizationPolicies ([`authz`]), after the `jwt_authn` filter of its
//! RequestAuthentications ([`super::jwt`]) on HTTP chains.

use envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::security::{AuthorizationPolicy, MtlsMode, WorkloadMtls};

use super::authz;
use super::envoy::{self, socket_address};
use super::mtls::{self, InboundPeer};
use super::registry::{
    inbound_cluster_name, EndpointModel, Protocol, Registry, ServiceSource, TargetPort,
};
use super::scope::ProxyScope;
use super::{captures, Translated, INBOUND_PASSTHROUGH_CLUSTER, VIRTUAL_INBOUND_LISTENER};
use crate::model::ProxyNode;
use meshplane_crds::names::ports::VIRTUAL_INBOUND;

/// One port the proxy's workload serves.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InboundPort {
    /// Service (or Sidecar ingress) port: names the inbound cluster.
    pub port: u32,
    /// Where the application listens.
    pub target_address: String,
    pub target_port: u32,
    pub protocol: Protocol,
    /// Address of a bound ingress listener (Sidecar ingress with `captureMode: NONE`, or a
    /// proxy without capture).
    pub bind: Option<String>,
}

/// The workload's ports: its Sidecar's `ingress` when it has one, else the ports of the
/// Services of its namespace selecting its labels.
pub fn inbound_ports(
    registry: &Registry,
    node: &ProxyNode,
    scope: &ProxyScope,
) -> Vec<InboundPort> {
    let mut ports: Vec<InboundPort> = Vec::new();
    if !scope.ingress.is_empty() {
        for l in &scope.ingress {
            let (target_address, target_port) = l
                .default_endpoint
                .parse::<std::net::SocketAddr>()
                .map(|a| (node.local_address(&a.ip().to_string()), u32::from(a.port())))
                .unwrap_or_else(|_| {
                    (
                        node.local_address("127.0.0.1"),
                        l.port.target_port.unwrap_or(l.port.number),
                    )
                });
            let bound = l.capture_mode == CaptureMode::None || !captures(node);
            ports.push(InboundPort {
                port: l.port.number,
                target_address,
                target_port,
                protocol: Protocol::detect(Some(&l.port.protocol), &l.port.name),
                bind: bound.then(|| {
                    if l.bind.is_empty() {
                        node.local_address("0.0.0.0")
                    } else {
                        node.local_address(&l.bind)
                    }
                }),
            });
        }
    } else {
        let named = node
            .pod_name
            .as_ref()
            .and_then(|p| registry.pod_ports.get(&(node.namespace.clone(), p.clone())));
        for svc in registry
            .services
            .iter()
            .filter(|s| s.namespace == node.namespace)
        {
            let ServiceSource::Kubernetes { selector } = &svc.source else {
                continue;
            };
            if selector.is_empty() || !selector.iter().all(|(k, v)| node.labels.get(k) == Some(v)) {
                continue;
            }
            for sp in &svc.ports {
                let target_port = match &sp.target_port {
                    TargetPort::Number(n) => *n,
                    TargetPort::Named(name) => match named.and_then(|m| m.get(name)) {
                        Some(n) => *n,
                        None => continue,
                    },
                };
                ports.push(InboundPort {
                    port: sp.port,
                    target_address: node.local_address("127.0.0.1"),
                    target_port,
                    protocol: sp.protocol,
                    bind: None,
                });
            }
        }
    }
    ports.sort();
    // One cluster per port number and one filter chain per target port.
    let mut seen_ports = std::collections::BTreeSet::new();
    let mut seen_targets = std::collections::BTreeSet::new();
    ports.retain(|p| seen_ports.insert(p.port) && seen_targets.insert(p.target_port));
    ports
}

fn inbound_route(port: &InboundPort) -> RouteConfiguration {
    let cluster = inbound_cluster_name(port.port);
    RouteConfiguration {
        name: cluster.clone(),
        virtual_hosts: vec![VirtualHost {
            name: "inbound|http".to_string(),
            domains: vec!["*".to_string()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix("/".to_string())),
                    ..Default::default()
                }),
                action: Some(Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::Cluster(cluster)),
                    timeout: Some(Duration {
                        seconds: 0,
                        nanos: 0,
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The workload's AuthorizationPolicies and the tenant's trust domain: what the inbound
/// chains' RBAC filters are made of ([`authz`]).
pub(super) struct InboundAuthz<'a> {
    pub policies: &'a [&'a AuthorizationPolicy],
    pub trust_domain: &'a str,
    /// The `jwt_authn` filter of the workload's RequestAuthentications ([`super::jwt`]), which
    /// goes before the RBAC filters of every HTTP chain.
    pub jwt: Option<HttpFilter>,
    /// The ext_authz providers of the workload's CUSTOM policies.
    pub custom: &'a authz::CustomProviders<'a>,
}

/// The network filters of one inbound chain of `port` for `peer`: the RBAC filters the
/// workload's policies ask for, then the HTTP connection manager (with its RBAC HTTP filters)
/// or the TCP proxy.
fn inbound_filters(port: &InboundPort, peer: InboundPeer, az: &InboundAuthz<'_>) -> Vec<Filter> {
    let cluster = inbound_cluster_name(port.port);
    // The application's own TLS is opaque: bytes in, bytes out.
    let http = port.protocol.is_http() && peer != InboundPeer::PassthroughTls;
    let facts = authz::ChainFacts {
        identity: peer == InboundPeer::Mtls,
        http,
        port: Some(port.target_port),
    };
    if http {
        let hcm = envoy::http_connection_manager(
            &cluster,
            RouteSpecifier::RouteConfig(inbound_route(port)),
        );
        let hcm = if peer == InboundPeer::Mtls {
            mtls::forward_client_identity(hcm)
        } else {
            hcm
        };
        let mut filters: Vec<HttpFilter> = az.jwt.iter().cloned().collect();
        filters.extend(authz::http_filters_with(
            az.policies,
            facts,
            az.trust_domain,
            az.custom,
        ));
        vec![authz::with_http_rbac(hcm, filters)]
    } else {
        let mut filters =
            authz::network_filters_with(az.policies, facts, az.trust_domain, az.custom);
        filters.push(envoy::tcp_proxy_filter(&cluster, &cluster));
        filters
    }
}

/// The filter chains of one inbound port in `mode`: one per kind of peer the mode accepts,
/// named `name` plus the peer's suffix, matching `destination_port` when given. A mode that
/// accepts nothing (STRICT without a certificate) gives none: the port is closed.
fn port_chains(
    name: &str,
    destination_port: Option<u32>,
    mode: MtlsMode,
    node: &ProxyNode,
    trust_domain: &str,
    filters: impl Fn(InboundPeer) -> Vec<Filter>,
) -> Vec<FilterChain> {
    mtls::inbound_chain_plan(mode, node.sds)
        .into_iter()
        .map(|plan| {
            let mut chain = FilterChain {
                name: format!("{name}{}", plan.peer.chain_suffix()),
                filters: filters(plan.peer),
                ..Default::default()
            };
            let mut m = FilterChainMatch {
                destination_port: destination_port.map(|value| UInt32Value { value }),
                ..Default::default()
            };
            plan.apply_to(&mut m);
            if m != FilterChainMatch::default() {
                chain.filter_chain_match = Some(m);
            }
            if plan.peer == InboundPeer::Mtls {
                chain.transport_socket = Some(mtls::inbound_mtls_transport_socket(trust_domain));
            }
            chain
        })
        .collect()
}

/// Whether any chain reads the TLS ClientHello (then the listener needs the TLS inspector).
fn inspects_tls(chains: &[FilterChain]) -> bool {
    chains.iter().any(|c| {
        c.filter_chain_match
            .as_ref()
            .is_some_and(|m| !m.transport_protocol.is_empty())
    })
}

pub(super) fn translate_inbound(
    ports: &[InboundPort],
    node: &ProxyNode,
    peer_mtls: &WorkloadMtls,
    az: &InboundAuthz<'_>,
    out: &mut Translated,
) {
    let trust_domain = az.trust_domain;
    for port in ports {
        let name = inbound_cluster_name(port.port);
        let mut cluster = envoy::cluster(&name, DiscoveryType::Static);
        cluster.load_assignment = Some(envoy::load_assignment(
            &name,
            &[EndpointModel {
                address: port.target_address.clone(),
                port: port.target_port,
                ..EndpointModel::default()
            }],
        ));
        if port.protocol == Protocol::Http2 {
            cluster = envoy::with_http2(cluster);
        }
        out.clusters.push(cluster);
        if let Some(bind) = &port.bind {
            let chains = port_chains(
                &name,
                None,
                peer_mtls.port_mode(port.target_port),
                node,
                trust_domain,
                |peer| inbound_filters(port, peer, az),
            );
            out.listeners.push(Listener {
                name: format!("{bind}_{}", port.port),
                address: Some(socket_address(bind, port.port)),
                listener_filters: if inspects_tls(&chains) {
                    vec![mtls::tls_inspector()]
                } else {
                    Vec::new()
                },
                filter_chains: chains,
                ..Default::default()
            });
        }
    }
    if !captures(node) {
        return;
    }
    out.clusters
        .push(envoy::original_dst_cluster(INBOUND_PASSTHROUGH_CLUSTER));
    let mut chains: Vec<_> = ports
        .iter()
        .filter(|p| p.bind.is_none())
        .flat_map(|p| {
            port_chains(
                &inbound_cluster_name(p.port),
                Some(p.target_port),
                peer_mtls.port_mode(p.target_port),
                node,
                trust_domain,
                |peer| inbound_filters(p, peer, az),
            )
        })
        .collect();
    // Ports no Service names follow the workload-wide mode, as in Istio.
    chains.extend(port_chains(
        INBOUND_PASSTHROUGH_CLUSTER,
        None,
        peer_mtls.mode,
        node,
        trust_domain,
        |peer| {
            let facts = authz::ChainFacts {
                identity: peer == InboundPeer::Mtls,
                http: false,
                port: None,
            };
            let mut filters =
                authz::network_filters_with(az.policies, facts, az.trust_domain, az.custom);
            filters.push(envoy::tcp_proxy_filter(
                INBOUND_PASSTHROUGH_CLUSTER,
                INBOUND_PASSTHROUGH_CLUSTER,
            ));
            filters
        },
    ));
    let mut listener_filters = vec![envoy::original_dst_listener_filter()];
    if inspects_tls(&chains) {
        listener_filters.push(mtls::tls_inspector());
    }
    out.listeners.push(Listener {
        name: VIRTUAL_INBOUND_LISTENER.to_string(),
        address: Some(socket_address("0.0.0.0", u32::from(VIRTUAL_INBOUND))),
        listener_filters,
        filter_chains: chains,
        ..Default::default()
    });
}
