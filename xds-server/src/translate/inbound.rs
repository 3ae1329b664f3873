//! Inbound side of a proxy: the workload's own ports.

use envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType;
use envoy_types::pb::envoy::config::listener::v3::{FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use meshplane_crds::networking::CaptureMode;

use super::envoy::{self, socket_address};
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

fn inbound_filter(port: &InboundPort) -> envoy_types::pb::envoy::config::listener::v3::Filter {
    let cluster = inbound_cluster_name(port.port);
    if port.protocol.is_http() {
        envoy::http_connection_manager(&cluster, RouteSpecifier::RouteConfig(inbound_route(port)))
    } else {
        envoy::tcp_proxy_filter(&cluster, &cluster)
    }
}

pub(super) fn translate_inbound(ports: &[InboundPort], node: &ProxyNode, out: &mut Translated) {
    for port in ports {
        let name = inbound_cluster_name(port.port);
        let mut cluster = envoy::cluster(&name, DiscoveryType::Static);
        cluster.load_assignment = Some(envoy::load_assignment(
            &name,
            &[EndpointModel {
                address: port.target_address.clone(),
                port: port.target_port,
                region: String::new(),
                zone: String::new(),
                subzone: String::new(),
                weight: None,
            }],
        ));
        if port.protocol == Protocol::Http2 {
            cluster = envoy::with_http2(cluster);
        }
        out.clusters.push(cluster);
        if let Some(bind) = &port.bind {
            out.listeners.push(Listener {
                name: format!("{bind}_{}", port.port),
                address: Some(socket_address(bind, port.port)),
                filter_chains: vec![envoy::filter_chain(&name, inbound_filter(port))],
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
        .map(|p| {
            let mut chain = envoy::filter_chain(&inbound_cluster_name(p.port), inbound_filter(p));
            chain.filter_chain_match = Some(FilterChainMatch {
                destination_port: Some(UInt32Value {
                    value: p.target_port,
                }),
                ..Default::default()
            });
            chain
        })
        .collect();
    chains.push(envoy::filter_chain(
        INBOUND_PASSTHROUGH_CLUSTER,
        envoy::tcp_proxy_filter(INBOUND_PASSTHROUGH_CLUSTER, INBOUND_PASSTHROUGH_CLUSTER),
    ));
    out.listeners.push(Listener {
        name: VIRTUAL_INBOUND_LISTENER.to_string(),
        address: Some(socket_address("0.0.0.0", u32::from(VIRTUAL_INBOUND))),
        listener_filters: vec![envoy::original_dst_listener_filter()],
        filter_chains: chains,
        ..Default::default()
    });
}
