//! Outbound side of a proxy: clusters, endpoints, listeners and routes of the imported hosts.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::google::protobuf::{BoolValue, Duration, UInt32Value};
use meshplane_crds::controlplane::OutboundTrafficMode;
use meshplane_crds::names::ports::VIRTUAL_OUTBOUND;
use meshplane_crds::networking::{CaptureMode, Resolution};

use super::envoy::{self, socket_address};
use super::registry::{
    outbound_cluster_name, split_locality, EndpointModel, Protocol, Registry, ServiceModel,
    ServicePort, ServiceSource,
};
use super::scope::{EgressScope, ProxyScope};
use super::{
    captures, Translated, BLACKHOLE_CLUSTER, PASSTHROUGH_CLUSTER, VIRTUAL_OUTBOUND_LISTENER,
};
use crate::model::ProxyNode;

/// Default bind address of listeners without capture.
pub const DEFAULT_BIND: &str = "127.0.0.1";

/// The services of one outbound listener port.
struct PortGroup<'a> {
    port: u32,
    egress: &'a EgressScope,
    services: Vec<(&'a ServiceModel, &'a ServicePort)>,
}

pub(super) fn translate_outbound(
    registry: &Registry,
    scope: &ProxyScope,
    node: &ProxyNode,
    out: &mut Translated,
) {
    // Hosts per egress listener; the union gets clusters.
    let per_egress: Vec<(&EgressScope, Vec<&ServiceModel>)> = scope
        .egress
        .iter()
        .map(|e| (e, scope.imported(registry, e)))
        .collect();
    let mut all: BTreeMap<&str, &ServiceModel> = BTreeMap::new();
    for (_, services) in &per_egress {
        for svc in services {
            all.entry(svc.hostname.as_str()).or_insert(svc);
        }
    }
    for svc in all.values() {
        for sp in &svc.ports {
            let name = outbound_cluster_name(sp.port, &svc.hostname);
            out.clusters.push(outbound_cluster(&name, svc, sp));
            if svc.uses_eds() {
                let eps = registry
                    .endpoints
                    .get(&name)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                out.endpoints.push(envoy::load_assignment(&name, eps));
            }
        }
    }
    out.clusters
        .push(envoy::original_dst_cluster(PASSTHROUGH_CLUSTER));
    out.clusters
        .push(envoy::cluster(BLACKHOLE_CLUSTER, DiscoveryType::Static));

    let fallback = match scope.outbound_policy {
        OutboundTrafficMode::AllowAny => PASSTHROUGH_CLUSTER,
        OutboundTrafficMode::RegistryOnly => BLACKHOLE_CLUSTER,
    };
    for group in port_groups(&per_egress) {
        let bound = !captures(node) || group.egress.capture_mode == CaptureMode::None;
        listener_for_group(&group, bound, scope, node, fallback, out);
    }
    if captures(node) {
        out.listeners.push(Listener {
            name: VIRTUAL_OUTBOUND_LISTENER.to_string(),
            address: Some(socket_address("0.0.0.0", u32::from(VIRTUAL_OUTBOUND))),
            use_original_dst: Some(BoolValue { value: true }),
            filter_chains: vec![envoy::filter_chain(
                fallback,
                envoy::tcp_proxy_filter(fallback, fallback),
            )],
            ..Default::default()
        });
    }
}

/// Groups the imported service ports by listener port: an egress listener with a port owns it,
/// the catch-all listener takes every other port.
fn port_groups<'a>(
    per_egress: &'a [(&'a EgressScope, Vec<&'a ServiceModel>)],
) -> Vec<PortGroup<'a>> {
    let claimed: BTreeSet<u32> = per_egress
        .iter()
        .filter_map(|(e, _)| e.port.as_ref().map(|p| p.number))
        .collect();
    let mut groups: BTreeMap<u32, PortGroup<'a>> = BTreeMap::new();
    // (port, hostname) already grouped: a host appears once per listener port.
    let mut grouped: HashSet<(u32, &str)> = HashSet::new();
    for (egress, services) in per_egress {
        for svc in services {
            for sp in &svc.ports {
                let owned = match &egress.port {
                    Some(p) => p.number == sp.port,
                    None => !claimed.contains(&sp.port),
                };
                if !owned {
                    continue;
                }
                let group = groups.entry(sp.port).or_insert_with(|| PortGroup {
                    port: sp.port,
                    egress,
                    services: Vec::new(),
                });
                if grouped.insert((sp.port, svc.hostname.as_str())) {
                    group.services.push((svc, sp));
                }
            }
        }
    }
    // An egress listener with a port gets a listener even when it imports nothing yet.
    for (egress, _) in per_egress {
        if let Some(p) = &egress.port {
            groups.entry(p.number).or_insert_with(|| PortGroup {
                port: p.number,
                egress,
                services: Vec::new(),
            });
        }
    }
    groups.into_values().collect()
}

fn outbound_cluster(name: &str, svc: &ServiceModel, sp: &ServicePort) -> Cluster {
    let cluster = match &svc.source {
        ServiceSource::Kubernetes { .. } => envoy::eds_cluster(name),
        ServiceSource::Entry {
            resolution,
            endpoints,
            workload_selector,
            ..
        } => {
            let target = |ep: &meshplane_crds::networking::WorkloadEntry| {
                ep.ports
                    .get(&sp.name)
                    .copied()
                    .unwrap_or(match &sp.target_port {
                        super::registry::TargetPort::Number(n) => *n,
                        super::registry::TargetPort::Named(_) => sp.port,
                    })
            };
            let models = |eps: &[meshplane_crds::networking::WorkloadEntry]| -> Vec<EndpointModel> {
                eps.iter()
                    .map(|ep| {
                        let (region, zone, subzone) = split_locality(&ep.locality);
                        EndpointModel {
                            address: ep.address.clone(),
                            port: target(ep),
                            region,
                            zone,
                            subzone,
                            weight: ep.weight,
                        }
                    })
                    .collect()
            };
            match resolution {
                Resolution::None => envoy::original_dst_cluster(name),
                Resolution::Static if workload_selector.is_some() => envoy::eds_cluster(name),
                Resolution::Static => Cluster {
                    load_assignment: Some(envoy::load_assignment(name, &models(endpoints))),
                    ..envoy::cluster(name, DiscoveryType::Static)
                },
                Resolution::Dns | Resolution::DnsRoundRobin => {
                    // Without endpoints the host itself is resolved.
                    let eps = if endpoints.is_empty() {
                        vec![EndpointModel {
                            address: svc.hostname.clone(),
                            port: target(&Default::default()),
                            region: String::new(),
                            zone: String::new(),
                            subzone: String::new(),
                            weight: None,
                        }]
                    } else {
                        models(endpoints)
                    };
                    let ty = if *resolution == Resolution::Dns {
                        DiscoveryType::StrictDns
                    } else {
                        DiscoveryType::LogicalDns
                    };
                    Cluster {
                        load_assignment: Some(envoy::load_assignment(name, &eps)),
                        ..envoy::cluster(name, ty)
                    }
                }
            }
        }
    };
    if sp.protocol == Protocol::Http2 {
        envoy::with_http2(cluster)
    } else {
        cluster
    }
}

fn listener_for_group(
    group: &PortGroup<'_>,
    bound: bool,
    scope: &ProxyScope,
    node: &ProxyNode,
    fallback: &str,
    out: &mut Translated,
) {
    let port = group.port;
    // Without capture the original destination is this listener itself: passing unknown
    // traffic through would loop back into Envoy, so it is refused instead.
    let fallback = if bound { BLACKHOLE_CLUSTER } else { fallback };
    let address = if !bound {
        "0.0.0.0".to_string()
    } else if group.egress.bind.is_empty() {
        node.local_address(DEFAULT_BIND)
    } else {
        node.local_address(&group.egress.bind)
    };
    let route_name = port.to_string();
    let http: Vec<_> = group
        .services
        .iter()
        .filter(|(_, sp)| sp.protocol.is_http())
        .collect();
    let tcp: Vec<_> = group
        .services
        .iter()
        .filter(|(_, sp)| !sp.protocol.is_http())
        .collect();
    let mut chains: Vec<FilterChain> = Vec::new();
    let mut used_addresses = HashSet::new();
    if !bound {
        // Captured TCP services are told apart by their destination address.
        for (svc, sp) in &tcp {
            let ranges: Vec<CidrRange> = svc
                .addresses
                .iter()
                .filter(|a| used_addresses.insert((*a).clone()))
                .map(|a| CidrRange {
                    address_prefix: a.clone(),
                    prefix_len: Some(UInt32Value {
                        value: if a.contains(':') { 128 } else { 32 },
                    }),
                })
                .collect();
            if ranges.is_empty() {
                continue;
            }
            let cluster = outbound_cluster_name(sp.port, &svc.hostname);
            let mut chain =
                envoy::filter_chain(&cluster, envoy::tcp_proxy_filter(&cluster, &cluster));
            chain.filter_chain_match = Some(FilterChainMatch {
                prefix_ranges: ranges,
                ..Default::default()
            });
            chains.push(chain);
        }
    }
    let declared_http = group
        .egress
        .port
        .as_ref()
        .is_some_and(|p| Protocol::detect(Some(&p.protocol), &p.name).is_http());
    let default_chain = if !http.is_empty() || (tcp.is_empty() && declared_http) {
        out.routes
            .push(route_config(&route_name, port, &http, scope, fallback));
        envoy::filter_chain(
            &route_name,
            envoy::http_connection_manager(
                &format!("outbound_{route_name}"),
                envoy::rds(&route_name),
            ),
        )
    } else {
        // A TCP port: the service without an address (or, bound, the first one) takes the rest.
        let only = tcp
            .iter()
            .find(|(svc, _)| bound || svc.addresses.is_empty())
            .map(|(svc, sp)| outbound_cluster_name(sp.port, &svc.hostname));
        let cluster = only.as_deref().unwrap_or(fallback);
        envoy::filter_chain(cluster, envoy::tcp_proxy_filter(cluster, cluster))
    };
    chains.push(default_chain);
    out.listeners.push(Listener {
        name: format!("{address}_{port}"),
        address: Some(socket_address(&address, port)),
        bind_to_port: (!bound).then_some(BoolValue { value: false }),
        filter_chains: chains,
        ..Default::default()
    });
}

/// Domains under which a host's port is reachable from a proxy in `proxy_namespace`.
fn domains(svc: &ServiceModel, port: u32, proxy_namespace: &str) -> Vec<String> {
    let mut names = vec![svc.hostname.clone()];
    if let Some(short) = &svc.short_name {
        // The bare short name resolves only inside the service's own namespace.
        if svc.namespace == proxy_namespace {
            names.push(short.clone());
        }
        names.push(format!("{short}.{}", svc.namespace));
    }
    names.extend(svc.addresses.iter().cloned());
    names
        .into_iter()
        .flat_map(|n| [format!("{n}:{port}"), n])
        .collect()
}

fn route_config(
    name: &str,
    port: u32,
    services: &[&(&ServiceModel, &ServicePort)],
    scope: &ProxyScope,
    fallback: &str,
) -> RouteConfiguration {
    let mut used = HashSet::new();
    let mut virtual_hosts: Vec<VirtualHost> = Vec::new();
    for (svc, sp) in services {
        let domains: Vec<String> = domains(svc, port, &scope.namespace)
            .into_iter()
            .filter(|d| used.insert(d.clone()))
            .collect();
        if domains.is_empty() {
            continue;
        }
        let cluster = outbound_cluster_name(sp.port, &svc.hostname);
        virtual_hosts.push(VirtualHost {
            name: format!("{}:{port}", svc.hostname),
            domains,
            routes: vec![Route {
                r#match: Some(prefix_match()),
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
        });
    }
    let fallback_host = if fallback == PASSTHROUGH_CLUSTER {
        VirtualHost {
            name: "allow_any".to_string(),
            domains: vec!["*".to_string()],
            routes: vec![Route {
                r#match: Some(prefix_match()),
                action: Some(Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::Cluster(
                        PASSTHROUGH_CLUSTER.to_string(),
                    )),
                    timeout: Some(Duration {
                        seconds: 0,
                        nanos: 0,
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }
    } else {
        VirtualHost {
            name: "block_all".to_string(),
            domains: vec!["*".to_string()],
            routes: vec![Route {
                r#match: Some(prefix_match()),
                action: Some(Action::DirectResponse(DirectResponseAction {
                    status: 502,
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }
    };
    virtual_hosts.push(fallback_host);
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

fn prefix_match() -> RouteMatch {
    RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix("/".to_string())),
        ..Default::default()
    }
}
