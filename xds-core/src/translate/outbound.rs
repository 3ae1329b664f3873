//! Outbound side of a proxy: clusters, endpoints, listeners and routes of the imported hosts.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
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
use meshplane_crds::networking::virtual_service::{L4MatchAttributes, RouteDestination};
use meshplane_crds::networking::{CaptureMode, Resolution};
use meshplane_crds::VirtualService;

use super::cluster_id::{HostPort, OutboundCluster};
use super::endpoints::outbound_load_assignment;
use super::envoy::{self, socket_address};
use super::registry::{
    outbound_cluster_name, split_locality, EndpointModel, Protocol, Registry, ServiceModel,
    ServicePort, ServiceSource,
};
use super::routes::{self, destination_cluster, RouteContext};
use super::scope::{EgressScope, ProxyScope};
use super::traffic::{self, labels_match, resolve_gateways, GatewayRef};
use super::{
    captures, Translated, BLACKHOLE_CLUSTER, PASSTHROUGH_CLUSTER, VIRTUAL_OUTBOUND_LISTENER,
};
use super::{policy, subnet_contains};
use crate::model::ProxyNode;

/// The TCP idle timeout of the first destination's DestinationRule.
fn idle(
    registry: &Registry,
    proxy_namespace: &str,
    dests: &[(String, u32)],
) -> Option<std::time::Duration> {
    dests
        .first()
        .and_then(|(c, _)| super::endpoints::tcp_idle_timeout(registry, proxy_namespace, c))
}

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
        outbound_clusters(registry, &scope.namespace, node.sds, svc, out);
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
        listener_for_group(registry, &group, bound, scope, node, fallback, out);
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

/// The clusters (and EDS assignments) of every port of `svc`, with its subsets and the
/// DestinationRule policies that apply to proxies of `proxy_namespace`; `sds`: whether the
/// proxy holds a workload certificate (what `tls.mode: ISTIO_MUTUAL` needs).
pub(super) fn outbound_clusters(
    registry: &Registry,
    proxy_namespace: &str,
    sds: bool,
    svc: &ServiceModel,
    out: &mut Translated,
) {
    let mesh = sds.then_some(policy::MeshTls {
        trust_domain: registry.trust_domain(),
    });
    let rule = traffic::destination_rule(registry, proxy_namespace, &svc.hostname, &svc.namespace);
    for sp in &svc.ports {
        let service = HostPort::new(&svc.hostname, sp.port);
        let mut variants: Vec<(
            OutboundCluster,
            Option<&meshplane_crds::networking::destination_rule::Subset>,
        )> = vec![(OutboundCluster::from(service.clone()), None)];
        for subset in rule.iter().flat_map(|r| r.subsets.iter()) {
            variants.push((
                OutboundCluster::new(service.clone(), &subset.name),
                Some(subset),
            ));
        }
        for (id, subset) in variants {
            let mut cluster = outbound_cluster(&id.name(), svc, sp, subset.map(|s| &s.labels));
            let effective = rule
                .as_ref()
                .map(|r| traffic::effective_policy(r, sp.port, subset.map(|s| s.name.as_str())))
                .unwrap_or_default();
            if !effective.is_empty() {
                // The one issue (ISTIO_MUTUAL without a workload certificate) concerns proxies
                // without the node agent, which docs/traffic.md lists; the cluster stays
                // plaintext, which a STRICT server refuses.
                let _ = policy::apply(
                    &mut cluster,
                    &effective,
                    sp.protocol == Protocol::Http2,
                    mesh,
                );
            }
            let eds = matches!(
                cluster.cluster_discovery_type,
                Some(envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(t))
                    if t == DiscoveryType::Eds as i32
            );
            out.clusters.push(cluster);
            if eds {
                out.endpoints
                    .push(outbound_load_assignment(registry, proxy_namespace, &id));
            }
        }
    }
}

/// One outbound cluster of a host's port; `subset` narrows the endpoints of clusters that carry
/// them inline (STATIC and DNS ServiceEntries).
fn outbound_cluster(
    name: &str,
    svc: &ServiceModel,
    sp: &ServicePort,
    subset: Option<&BTreeMap<String, String>>,
) -> Cluster {
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
            let selected: Vec<&meshplane_crds::networking::WorkloadEntry> = endpoints
                .iter()
                .filter(|ep| subset.is_none_or(|labels| labels_match(labels, &ep.labels)))
                .collect();
            let models =
                |eps: &[&meshplane_crds::networking::WorkloadEntry]| -> Vec<EndpointModel> {
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
                                labels: ep.labels.clone(),
                                workload: None,
                            }
                        })
                        .collect()
                };
            match resolution {
                Resolution::None => envoy::original_dst_cluster(name),
                Resolution::Static if workload_selector.is_some() => envoy::eds_cluster(name),
                Resolution::Static => Cluster {
                    load_assignment: Some(envoy::load_assignment(name, &models(&selected))),
                    ..envoy::cluster(name, DiscoveryType::Static)
                },
                Resolution::Dns | Resolution::DnsRoundRobin => {
                    // Without endpoints the host itself is resolved.
                    let eps = if endpoints.is_empty() {
                        vec![EndpointModel {
                            address: svc.hostname.clone(),
                            port: target(&Default::default()),
                            ..EndpointModel::default()
                        }]
                    } else {
                        models(&selected)
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

/// The route context of a sidecar for one port.
fn sidecar_context<'a>(
    registry: &'a Registry,
    scope: &'a ProxyScope,
    node: &'a ProxyNode,
    port: u32,
) -> RouteContext<'a> {
    RouteContext {
        registry,
        proxy_namespace: &scope.namespace,
        proxy_labels: &node.labels,
        gateway: &GatewayRef::Mesh,
        port,
    }
}

/// Whether an L4 match block applies to a sidecar sending to `svc` on `port`.
fn l4_applies(
    m: &L4MatchAttributes,
    vs: &VirtualService,
    svc: &ServiceModel,
    port: u32,
    scope: &ProxyScope,
    node: &ProxyNode,
) -> bool {
    let ns = vs.metadata.namespace.as_deref().unwrap_or_default();
    m.port.is_none_or(|p| p == port)
        && labels_match(&m.source_labels, &node.labels)
        && (m.source_namespace.is_empty() || m.source_namespace == scope.namespace)
        && (m.gateways.is_empty() || resolve_gateways(&m.gateways, ns).contains(&GatewayRef::Mesh))
        && (m.destination_subnets.is_empty()
            || m.destination_subnets.iter().any(|net| {
                svc.addresses
                    .iter()
                    .filter_map(|a| a.parse::<IpAddr>().ok())
                    .any(|a| subnet_contains(net, a))
            }))
}

/// Weighted clusters of L4 route destinations.
pub(super) fn weighted_l4(
    registry: &Registry,
    route: &[RouteDestination],
    vs_namespace: &str,
    port: u32,
) -> Vec<(String, u32)> {
    let many = route.len() > 1;
    route
        .iter()
        .map(|d| {
            let w = if many {
                u32::try_from(d.weight.unwrap_or(0)).unwrap_or(0)
            } else {
                100
            };
            (
                destination_cluster(registry, &d.destination, vs_namespace, port),
                w,
            )
        })
        .filter(|(_, w)| *w > 0)
        .collect()
}

/// Where a sidecar sends TCP connections to `svc` on `port`: the first applying `tcp` rule of
/// its VirtualService, else the host's own cluster.
fn tcp_destinations(
    registry: &Registry,
    svc: &ServiceModel,
    sp: &ServicePort,
    scope: &ProxyScope,
    node: &ProxyNode,
) -> Vec<(String, u32)> {
    let own = vec![(outbound_cluster_name(sp.port, &svc.hostname), 100)];
    let Some(vs) = traffic::mesh_virtual_service(registry, &scope.namespace, &svc.hostname) else {
        return own;
    };
    let ns = vs.metadata.namespace.as_deref().unwrap_or_default();
    vs.spec
        .tcp
        .iter()
        .find(|r| {
            r.match_.is_empty()
                || r.match_
                    .iter()
                    .any(|m| l4_applies(m, vs, svc, sp.port, scope, node))
        })
        .map(|r| weighted_l4(registry, &r.route, ns, sp.port))
        .filter(|d| !d.is_empty())
        .unwrap_or(own)
}

/// SNI hosts and the weighted clusters connections with them go to.
type SniRoute = (Vec<String>, Vec<(String, u32)>);

/// The SNI-routed chains of a TLS service's VirtualService `tls` rules, in rule order.
fn tls_routes(
    registry: &Registry,
    svc: &ServiceModel,
    sp: &ServicePort,
    scope: &ProxyScope,
    node: &ProxyNode,
) -> Vec<SniRoute> {
    let Some(vs) = traffic::mesh_virtual_service(registry, &scope.namespace, &svc.hostname) else {
        return Vec::new();
    };
    let ns = vs.metadata.namespace.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    for rule in &vs.spec.tls {
        let dests = weighted_l4(registry, &rule.route, ns, sp.port);
        if dests.is_empty() {
            continue;
        }
        for m in &rule.match_ {
            let l4 = L4MatchAttributes {
                destination_subnets: m.destination_subnets.clone(),
                port: m.port,
                source_labels: m.source_labels.clone(),
                gateways: m.gateways.clone(),
                source_namespace: m.source_namespace.clone(),
            };
            if l4_applies(&l4, vs, svc, sp.port, scope, node) {
                out.push((m.sni_hosts.clone(), dests.clone()));
            }
        }
    }
    out
}

/// The routes of one host's port for a sidecar: its VirtualService's, or the default route.
fn service_routes(
    registry: &Registry,
    scope: &ProxyScope,
    node: &ProxyNode,
    svc: &ServiceModel,
    port: u32,
) -> Vec<Route> {
    let cluster = outbound_cluster_name(port, &svc.hostname);
    let ctx = sidecar_context(registry, scope, node, port);
    match traffic::mesh_virtual_service(registry, &scope.namespace, &svc.hostname) {
        Some(vs) if !vs.spec.http.is_empty() => {
            let r = routes::http_routes(vs, &ctx);
            // A VirtualService whose rules all target other ports leaves this one as it was.
            if r.is_empty() {
                vec![routes::default_route(&cluster)]
            } else {
                r
            }
        }
        _ => vec![routes::default_route(&cluster)],
    }
}

fn listener_for_group(
    registry: &Registry,
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
    let mut inspects_sni = false;
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
            if sp.protocol == Protocol::Tls {
                for (sni, dests) in tls_routes(registry, svc, sp, scope, node) {
                    inspects_sni = true;
                    let mut chain = envoy::filter_chain(
                        &format!("{cluster}|{}", sni.join(",")),
                        envoy::weighted_tcp_proxy_filter(
                            &cluster,
                            &dests,
                            idle(registry, &scope.namespace, &dests),
                        ),
                    );
                    chain.filter_chain_match = Some(FilterChainMatch {
                        prefix_ranges: ranges.clone(),
                        server_names: sni,
                        ..Default::default()
                    });
                    chains.push(chain);
                }
            }
            let dests = tcp_destinations(registry, svc, sp, scope, node);
            let mut chain = envoy::filter_chain(
                &cluster,
                envoy::weighted_tcp_proxy_filter(
                    &cluster,
                    &dests,
                    idle(registry, &scope.namespace, &dests),
                ),
            );
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
        out.routes.push(route_config(
            &route_name,
            port,
            &http,
            registry,
            scope,
            node,
            fallback,
        ));
        envoy::filter_chain(
            &route_name,
            envoy::http_connection_manager_with(
                &format!("outbound_{route_name}"),
                envoy::rds(&route_name),
                envoy::routing_http_filters(),
            ),
        )
    } else {
        // A TCP port: the service without an address (or, bound, the first one) takes the rest.
        let only = tcp
            .iter()
            .find(|(svc, _)| bound || svc.addresses.is_empty());
        match only {
            Some((svc, sp)) => {
                let cluster = outbound_cluster_name(sp.port, &svc.hostname);
                let dests = tcp_destinations(registry, svc, sp, scope, node);
                envoy::filter_chain(
                    &cluster,
                    envoy::weighted_tcp_proxy_filter(
                        &cluster,
                        &dests,
                        idle(registry, &scope.namespace, &dests),
                    ),
                )
            }
            None => envoy::filter_chain(fallback, envoy::tcp_proxy_filter(fallback, fallback)),
        }
    };
    chains.push(default_chain);
    out.listeners.push(Listener {
        name: format!("{address}_{port}"),
        address: Some(socket_address(&address, port)),
        bind_to_port: (!bound).then_some(BoolValue { value: false }),
        listener_filters: if inspects_sni {
            vec![envoy::tls_inspector_listener_filter()]
        } else {
            Vec::new()
        },
        filter_chains: chains,
        ..Default::default()
    });
}

/// Domains under which a host's port is reachable from a proxy in `proxy_namespace`.
fn domains(svc: &ServiceModel, port: u32, proxy_namespace: &str) -> Vec<String> {
    // The bare short name resolves only inside the service's own namespace.
    host_names(svc, svc.namespace == proxy_namespace)
        .into_iter()
        .flat_map(|n| [format!("{n}:{port}"), n])
        .collect()
}

/// The names of a host: its hostname, short names (the bare one with `bare_short`) and
/// addresses.
fn host_names(svc: &ServiceModel, bare_short: bool) -> Vec<String> {
    let mut names = Vec::new();
    any_host_name(svc, bare_short, |n| {
        names.push(n.to_string());
        false
    });
    names
}

/// Whether `f` holds for one of the names of [`host_names`], asked in their order.
fn any_host_name(svc: &ServiceModel, bare_short: bool, mut f: impl FnMut(&str) -> bool) -> bool {
    if f(&svc.hostname) {
        return true;
    }
    if let Some(short) = &svc.short_name {
        if bare_short && f(short) {
            return true;
        }
        if f(&format!("{short}.{}", svc.namespace)) {
            return true;
        }
    }
    svc.addresses.iter().any(|a| f(a))
}

/// The virtual host of one host's port, with the domains no earlier host of the route
/// configuration took (`used`); none when it has none left.
fn service_virtual_host(
    registry: &Registry,
    scope: &ProxyScope,
    node: &ProxyNode,
    svc: &ServiceModel,
    port: u32,
    used: &mut HashSet<String>,
) -> Option<VirtualHost> {
    let domains: Vec<String> = domains(svc, port, &scope.namespace)
        .into_iter()
        .filter(|d| used.insert(d.clone()))
        .collect();
    (!domains.is_empty()).then(|| VirtualHost {
        name: virtual_host_name(&svc.hostname, port),
        domains,
        routes: service_routes(registry, scope, node, svc, port),
        ..Default::default()
    })
}

/// The name of a host's virtual host in the route configuration of `port`.
pub fn virtual_host_name(hostname: &str, port: u32) -> String {
    format!("{hostname}:{port}")
}

/// Every domain a host may claim in a route configuration, whatever the proxy's namespace
/// and port: two hosts that share none never take a domain from each other.
pub fn claimable_domains(svc: &ServiceModel) -> Vec<String> {
    host_names(svc, true)
}

/// Whether `svc` may claim one of `domains` ([`claimable_domains`] without building them: a
/// Service change asks it of every other Service of the registry).
pub fn claims_any(svc: &ServiceModel, domains: &HashSet<String>) -> bool {
    any_host_name(svc, true, |n| domains.contains(n))
}

/// What one imported host adds to a sidecar's outbound configuration, as [`super::translate`]
/// renders it: its clusters and assignments (mutual TLS applied) and, per HTTP port, its
/// virtual host, for a route configuration in which no other host claims its domains.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostOutbound {
    pub clusters: Vec<Cluster>,
    pub endpoints: Vec<ClusterLoadAssignment>,
    /// By port (the route configuration's name).
    pub virtual_hosts: Vec<(u32, VirtualHost)>,
}

/// The [`HostOutbound`] of `svc` for the sidecar `node`, which imports it.
pub fn host_outbound(registry: &Registry, node: &ProxyNode, svc: &ServiceModel) -> HostOutbound {
    let scope = super::scope::proxy_scope(registry, &node.namespace, &node.labels);
    let mut out = Translated::default();
    outbound_clusters(registry, &scope.namespace, node.sds, svc, &mut out);
    super::mtls::apply(registry, node, &mut out);
    super::telemetry::mark_clusters(&mut out);
    let virtual_hosts = svc
        .ports
        .iter()
        .filter(|sp| sp.protocol.is_http())
        .filter_map(|sp| {
            service_virtual_host(registry, &scope, node, svc, sp.port, &mut HashSet::new())
                .map(|vh| (sp.port, vh))
        })
        .collect();
    HostOutbound {
        clusters: out.clusters,
        endpoints: out.endpoints,
        virtual_hosts,
    }
}

fn route_config(
    name: &str,
    port: u32,
    services: &[&(&ServiceModel, &ServicePort)],
    registry: &Registry,
    scope: &ProxyScope,
    node: &ProxyNode,
    fallback: &str,
) -> RouteConfiguration {
    let mut used = HashSet::new();
    let mut virtual_hosts: Vec<VirtualHost> = services
        .iter()
        .filter_map(|(svc, _)| service_virtual_host(registry, scope, node, svc, port, &mut used))
        .collect();
    virtual_hosts.push(fallback_virtual_host(fallback));
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

/// The virtual host for requests to hosts the proxy does not know.
pub(super) fn fallback_virtual_host(fallback: &str) -> VirtualHost {
    if fallback == PASSTHROUGH_CLUSTER {
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
    }
}

fn prefix_match() -> RouteMatch {
    RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix("/".to_string())),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::*;
    use crate::translate::registry::ServiceSource;

    fn mk_service(short_name: Option<&str>) -> ServiceModel {
        ServiceModel {
            hostname: "web.shop.svc.cluster.local".into(),
            namespace: "shop".into(),
            short_name: short_name.map(str::to_string),
            addresses: vec!["198.19.0.10".into()],
            ports: vec![],
            export_to: vec![],
            source: ServiceSource::Kubernetes {
                selector: BTreeMap::new(),
            },
        }
    }

    #[test]
    fn a_host_claims_exactly_its_claimable_domains() {
        for svc in [mk_service(Some("web")), mk_service(None)] {
            let claimable = claimable_domains(&svc);
            for d in &claimable {
                assert!(claims_any(&svc, &HashSet::from([d.clone()])), "{d}");
            }
            let others: HashSet<String> = [
                "web.pay",
                "web.shop:80",
                "shop.svc.cluster.local",
                "198.19.0.1",
                "api",
            ]
            .iter()
            .map(|d| d.to_string())
            .filter(|d| !claimable.contains(d))
            .collect();
            assert!(!claims_any(&svc, &others));
        }
        assert_eq!(
            claimable_domains(&mk_service(Some("web"))),
            [
                "web.shop.svc.cluster.local",
                "web",
                "web.shop",
                "198.19.0.10"
            ]
        );
    }
}
