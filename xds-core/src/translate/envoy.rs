//! Small constructors for the Envoy messages translation emits, so the translation reads as
//! domain decisions rather than protobuf plumbing.

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy,
};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, Http2ProtocolOptions, Locality,
    SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfigType;
use envoy_types::pb::envoy::config::listener::v3::listener_filter::ConfigType as ListenerFilterConfigType;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, ListenerFilter};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::{
    weighted_cluster::ClusterWeight as TcpClusterWeight, WeightedCluster as TcpWeightedCluster,
};
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfigType;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier as TcpClusterSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    ExplicitHttpConfig, UpstreamProtocolOptions,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use envoy_types::util::pack_any;

use super::registry::EndpointModel;

/// Well-known Envoy extension names.
pub mod filter_name {
    pub const HTTP_CONNECTION_MANAGER: &str = "envoy.filters.network.http_connection_manager";
    pub const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
    pub const ROUTER: &str = "envoy.filters.http.router";
    pub const ORIGINAL_DST: &str = "envoy.filters.listener.original_dst";
    pub const HTTP_PROTOCOL_OPTIONS: &str =
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
    pub const FAULT: &str = "envoy.filters.http.fault";
    pub const CORS: &str = "envoy.filters.http.cors";
    pub const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
    pub const PREVIOUS_HOSTS: &str = "envoy.retry_host_predicates.previous_hosts";
}

/// Where EDS and RDS resources come from: the ADS stream.
pub fn ads_config_source() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

pub fn socket_address(address: &str, port: u32) -> Address {
    Address {
        address: Some(AddressKind::SocketAddress(SocketAddress {
            address: address.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

fn timeout(seconds: i64) -> Option<Duration> {
    Some(Duration { seconds, nanos: 0 })
}

/// A protobuf duration.
pub fn duration(d: std::time::Duration) -> Duration {
    Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // Below 1e9 by definition.
        nanos: d.subsec_nanos() as i32,
    }
}

/// A cluster of the given discovery type with Envoy defaults we always set.
pub fn cluster(name: &str, ty: DiscoveryType) -> Cluster {
    Cluster {
        name: name.to_string(),
        connect_timeout: timeout(10),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(ty as i32)),
        ..Default::default()
    }
}

/// An EDS cluster fed over ADS.
pub fn eds_cluster(name: &str) -> Cluster {
    Cluster {
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ads_config_source()),
            service_name: String::new(),
        }),
        ..cluster(name, DiscoveryType::Eds)
    }
}

/// A cluster forwarding to the connection's original destination.
pub fn original_dst_cluster(name: &str) -> Cluster {
    Cluster {
        lb_policy: LbPolicy::ClusterProvided as i32,
        ..cluster(name, DiscoveryType::OriginalDst)
    }
}

/// Makes the cluster speak HTTP/2 upstream (gRPC, h2c).
pub fn with_http2(mut c: Cluster) -> Cluster {
    let options = HttpProtocolOptions {
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                    Http2ProtocolOptions::default(),
                )),
            },
        )),
        ..Default::default()
    };
    c.typed_extension_protocol_options.insert(
        filter_name::HTTP_PROTOCOL_OPTIONS.to_string(),
        pack_any(options),
    );
    c
}

/// A load assignment grouping endpoints by locality, in a stable order.
pub fn load_assignment(cluster_name: &str, endpoints: &[EndpointModel]) -> ClusterLoadAssignment {
    let mut sorted: Vec<&EndpointModel> = endpoints.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut groups: Vec<LocalityLbEndpoints> = Vec::new();
    for ep in sorted {
        let locality = Locality {
            region: ep.region.clone(),
            zone: ep.zone.clone(),
            sub_zone: ep.subzone.clone(),
        };
        let lb = LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(socket_address(&ep.address, ep.port)),
                // The pod's workload, which request metrics read (`%UPSTREAM_HOST_NAME%`).
                hostname: ep
                    .workload
                    .as_ref()
                    .map(|(ns, name)| endpoint_hostname(ns, name))
                    .unwrap_or_default(),
                ..Default::default()
            })),
            load_balancing_weight: ep
                .weight
                .filter(|w| *w > 0)
                .map(|value| UInt32Value { value }),
            ..Default::default()
        };
        match groups
            .iter_mut()
            .find(|g| g.locality.as_ref() == Some(&locality))
        {
            Some(g) => g.lb_endpoints.push(lb),
            None => groups.push(LocalityLbEndpoints {
                locality: Some(locality),
                lb_endpoints: vec![lb],
                // gRPC clients ignore localities without a weight; Envoy reads it only with
                // locality-weighted balancing, where equal weights change nothing.
                load_balancing_weight: Some(UInt32Value { value: 1 }),
                ..Default::default()
            }),
        }
    }
    ClusterLoadAssignment {
        cluster_name: cluster_name.to_string(),
        endpoints: groups,
        ..Default::default()
    }
}

/// A network filter proxying TCP to a cluster.
pub fn tcp_proxy_filter(stat_prefix: &str, cluster: &str) -> Filter {
    let proxy = TcpProxy {
        stat_prefix: stat_prefix.to_string(),
        cluster_specifier: Some(TcpClusterSpecifier::Cluster(cluster.to_string())),
        ..Default::default()
    };
    Filter {
        name: filter_name::TCP_PROXY.to_string(),
        config_type: Some(FilterConfigType::TypedConfig(pack_any(proxy))),
    }
}

/// The router HTTP filter (always last).
pub fn router_filter() -> HttpFilter {
    HttpFilter {
        name: filter_name::ROUTER.to_string(),
        config_type: Some(HttpFilterConfigType::TypedConfig(pack_any(
            Router::default(),
        ))),
        ..Default::default()
    }
}

/// An HTTP connection manager network filter with the given route source.
pub fn http_connection_manager(stat_prefix: &str, route: RouteSpecifier) -> Filter {
    http_connection_manager_with(stat_prefix, route, vec![router_filter()])
}

/// An HTTP connection manager with these HTTP filters (the router last).
pub fn http_connection_manager_with(
    stat_prefix: &str,
    route: RouteSpecifier,
    http_filters: Vec<HttpFilter>,
) -> Filter {
    let hcm = HttpConnectionManager {
        stat_prefix: stat_prefix.to_string(),
        route_specifier: Some(route),
        http_filters,
        ..Default::default()
    };
    Filter {
        name: filter_name::HTTP_CONNECTION_MANAGER.to_string(),
        config_type: Some(FilterConfigType::TypedConfig(pack_any(hcm))),
    }
}

/// The HTTP filters of routed (outbound and gateway) traffic: fault injection and CORS, which
/// act only where a route configures them, then the router.
pub fn routing_http_filters() -> Vec<HttpFilter> {
    vec![
        HttpFilter {
            name: filter_name::FAULT.to_string(),
            config_type: Some(HttpFilterConfigType::TypedConfig(pack_any(
                HttpFault::default(),
            ))),
            ..Default::default()
        },
        HttpFilter {
            name: filter_name::CORS.to_string(),
            config_type: Some(HttpFilterConfigType::TypedConfig(pack_any(Cors::default()))),
            ..Default::default()
        },
        router_filter(),
    ]
}

/// The listener filter reading the SNI of TLS connections (for routing by server name).
pub fn tls_inspector_listener_filter() -> ListenerFilter {
    ListenerFilter {
        name: filter_name::TLS_INSPECTOR.to_string(),
        config_type: Some(ListenerFilterConfigType::TypedConfig(pack_any(
            TlsInspector::default(),
        ))),
        ..Default::default()
    }
}

/// A TCP proxy splitting connections between clusters by weight, closing connections idle
/// for `idle_timeout` (Envoy's default of one hour when `None`).
pub fn weighted_tcp_proxy_filter(
    stat_prefix: &str,
    clusters: &[(String, u32)],
    idle_timeout: Option<std::time::Duration>,
) -> Filter {
    let specifier = match clusters {
        [(only, _)] => TcpClusterSpecifier::Cluster(only.clone()),
        many => TcpClusterSpecifier::WeightedClusters(TcpWeightedCluster {
            clusters: many
                .iter()
                .map(|(name, weight)| TcpClusterWeight {
                    name: name.clone(),
                    weight: *weight,
                    ..Default::default()
                })
                .collect(),
        }),
    };
    let proxy = TcpProxy {
        stat_prefix: stat_prefix.to_string(),
        cluster_specifier: Some(specifier),
        idle_timeout: idle_timeout.map(duration),
        ..Default::default()
    };
    Filter {
        name: filter_name::TCP_PROXY.to_string(),
        config_type: Some(FilterConfigType::TypedConfig(pack_any(proxy))),
    }
}

/// Routes from RDS over ADS.
pub fn rds(route_config_name: &str) -> RouteSpecifier {
    RouteSpecifier::Rds(Rds {
        config_source: Some(ads_config_source()),
        route_config_name: route_config_name.to_string(),
    })
}

/// A filter chain with one network filter.
pub fn filter_chain(name: &str, filter: Filter) -> FilterChain {
    FilterChain {
        name: name.to_string(),
        filters: vec![filter],
        ..Default::default()
    }
}

/// The listener filter restoring the pre-redirect destination of captured connections.
pub fn original_dst_listener_filter() -> ListenerFilter {
    ListenerFilter {
        name: filter_name::ORIGINAL_DST.to_string(),
        config_type: Some(ListenerFilterConfigType::TypedConfig(pack_any(
            OriginalDst::default(),
        ))),
        ..Default::default()
    }
}

/// The EDS `hostname` of an endpoint whose pod belongs to workload `name` in `namespace`:
/// `<name>.<namespace>`, which the clients' request metrics read (`%UPSTREAM_HOST_NAME%`)
/// and the sidecar PodMonitor splits into `destination_workload` and its namespace.
pub fn endpoint_hostname(namespace: &str, name: &str) -> String {
    format!("{name}.{namespace}")
}
