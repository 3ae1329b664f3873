//! Proxyless gRPC clients (gRFC A27; node metadata `GENERATOR=grpc`): for every HTTP port of
//! every host visible to the client, an API listener named `host:port` (what the client asks
//! for when dialing `xds:///host:port`), its route configuration of the same name (the host's
//! VirtualService rules, as for a sidecar), EDS clusters and their endpoints.
//!
//! gRPC accepts a subset of Envoy's configuration and refuses the whole response when it meets
//! something it cannot use, so only what it supports is sent: EDS clusters (round robin or
//! ring hash, outlier detection, circuit breakers), the fault and router HTTP filters, and
//! routes without per-filter configuration it does not know (CORS).

use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType, LbConfig};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfigType;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::util::pack_any;

use super::envoy::{self, filter_name};
use super::outbound::outbound_clusters;
use super::registry::{outbound_cluster_name, Registry, ServiceModel};
use super::routes::{self, RouteContext};
use super::traffic::{self, GatewayRef};
use super::Translated;
use crate::model::ProxyNode;

/// The hosts a proxyless client sees: every host visible from its namespace (its own
/// namespace's declaration first).
fn visible_hosts<'a>(registry: &'a Registry, namespace: &str) -> Vec<&'a ServiceModel> {
    let mut hosts: Vec<&ServiceModel> = Vec::new();
    for svc in &registry.services {
        if !svc.visible_from(namespace, &registry.mesh_config) {
            continue;
        }
        match hosts.last_mut() {
            Some(prev) if prev.hostname == svc.hostname => {
                if svc.namespace == namespace {
                    *prev = svc;
                }
            }
            _ => hosts.push(svc),
        }
    }
    hosts
}

fn grpc_http_filters() -> Vec<HttpFilter> {
    vec![
        HttpFilter {
            name: filter_name::FAULT.to_string(),
            config_type: Some(HttpFilterConfigType::TypedConfig(pack_any(
                HttpFault::default(),
            ))),
            ..Default::default()
        },
        envoy::router_filter(),
    ]
}

/// Translates the registry for a proxyless gRPC client.
pub fn translate_proxyless(registry: &Registry, node: &ProxyNode, out: &mut Translated) {
    for svc in visible_hosts(registry, &node.namespace) {
        let mut clusters = Translated::default();
        // gRPC takes no TLS settings from here (it would refuse them): no workload identity.
        outbound_clusters(registry, &node.namespace, false, svc, &mut clusters);
        for mut c in clusters.clusters {
            let eds = c.cluster_discovery_type
                == Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32));
            if !eds {
                continue;
            }
            // What gRPC cannot use it would refuse: keep balancing, ejection and limits.
            c.transport_socket = None;
            c.typed_extension_protocol_options.clear();
            c.upstream_connection_options = None;
            if !matches!(c.lb_config, Some(LbConfig::RingHashLbConfig(_))) {
                c.lb_config = None;
            }
            out.clusters.push(c);
        }
        out.endpoints.extend(clusters.endpoints);
        for sp in svc.ports.iter().filter(|p| p.protocol.is_http()) {
            let name = format!("{}:{}", svc.hostname, sp.port);
            let ctx = RouteContext {
                registry,
                proxy_namespace: &node.namespace,
                proxy_labels: &node.labels,
                gateway: &GatewayRef::Mesh,
                port: sp.port,
            };
            let mut host_routes =
                match traffic::mesh_virtual_service(registry, &node.namespace, &svc.hostname) {
                    Some(vs) if !vs.spec.http.is_empty() => routes::http_routes(vs, &ctx),
                    _ => Vec::new(),
                };
            if host_routes.is_empty() {
                host_routes.push(routes::default_route(&outbound_cluster_name(
                    sp.port,
                    &svc.hostname,
                )));
            }
            for r in &mut host_routes {
                r.typed_per_filter_config.remove(filter_name::CORS);
            }
            out.routes.push(RouteConfiguration {
                name: name.clone(),
                virtual_hosts: vec![VirtualHost {
                    name: name.clone(),
                    domains: vec![name.clone(), svc.hostname.clone()],
                    routes: host_routes,
                    ..Default::default()
                }],
                ..Default::default()
            });
            let hcm = HttpConnectionManager {
                stat_prefix: name.clone(),
                route_specifier: Some(RouteSpecifier::Rds(
                    envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::Rds {
                        config_source: Some(envoy::ads_config_source()),
                        route_config_name: name.clone(),
                    },
                )),
                http_filters: grpc_http_filters(),
                ..Default::default()
            };
            out.listeners.push(Listener {
                name,
                api_listener: Some(ApiListener {
                    api_listener: Some(pack_any(hcm)),
                }),
                ..Default::default()
            });
        }
    }
}
