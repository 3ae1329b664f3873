//! Contract 6: the bootstrap ConfigMap in every member namespace of the tenant.

use meshplane_contracts::bootstrap::{
    BootstrapData, ADS_CLUSTER, ADS_MAX_FRAME_SIZE, HTTP2_SETTINGS_MAX_FRAME_SIZE, MOUNT_DIR,
    READY_PATH, ROOT_CERT, STATS_PATH,
};
use meshplane_crds::names::{self, ports};
use serde_json::{json, Value};

use super::{DesiredObject, Kind, Revision};

/// Stand-in for the tenant root certificate until the tenant CA exists.
pub const ROOT_CERT_PLACEHOLDER: &str =
    "# meshplane: the tenant root certificate is not issued yet\n";

/// The Envoy bootstrap of a proxy of this revision: admin on loopback, readiness listener on
/// 15021 (also serving the admin's `/stats/prometheus`), and incremental (delta) ADS over the static HTTP/2 cluster `xds-grpc` pointing at
/// `ads_host`:15012 over TLS. Delta, as Istio's sidecars since 1.22: a change sends what
/// changed, not every resource of its type. The instance's certificate is verified against the
/// tenant's trust bundle (the ConfigMap's `root-cert.pem` as the injector mounts it) and must
/// name `server_name`, the instance Service's host, which is also the SNI. The node agent reads
/// the address and the SNI from this cluster and carries ADS there itself (contract 11). `node`
/// is left to the proxy launcher, which knows the pod (contract 7).
pub fn envoy_bootstrap(ads_host: &str, server_name: &str) -> Value {
    let is_ip = ads_host.parse::<std::net::IpAddr>().is_ok();
    let endpoint = |address: &str, port: u16| json!({"endpoint": {"address": {"socket_address": {"address": address, "port_value": port}}}});
    json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": ports::PROXY_ADMIN}}},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": ADS_CLUSTER}}],
                "set_node_on_first_message_only": true,
            },
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
        },
        "static_resources": {
            "listeners": [{
                "name": "readiness",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": ports::PROXY_READY}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "readiness",
                        "route_config": {"virtual_hosts": [{
                            "name": "readiness",
                            "domains": ["*"],
                            // Envoy's own /ready answers 200 only once the proxy is LIVE.
                            "routes": [{"match": {"path": READY_PATH},
                                        "route": {"cluster": "envoy-admin", "prefix_rewrite": "/ready"}},
                                       // The proxy's own request statistics (read-only), for
                                       // migration gates and scrapers; no other admin path.
                                       {"match": {"path": STATS_PATH},
                                        "route": {"cluster": "envoy-admin"}}],
                        }]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                    },
                }]}],
            }],
            "clusters": [
                {
                    "name": ADS_CLUSTER,
                    // A ClusterIP needs no resolution; a DNS name is resolved by Envoy.
                    "type": if is_ip { "STATIC" } else { "STRICT_DNS" },
                    "connect_timeout": "1s",
                    "load_assignment": {"cluster_name": ADS_CLUSTER,
                        "endpoints": [{"lb_endpoints": [endpoint(ads_host, ports::GRPC_XDS_TLS)]}]},
                    "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                        "sni": server_name,
                        "common_tls_context": {
                            "alpn_protocols": ["h2"],
                            "validation_context": {
                                "trusted_ca": {"filename": format!("{MOUNT_DIR}/{ROOT_CERT}")},
                                "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": server_name}}],
                            },
                        },
                    }},
                    // gRPC needs HTTP/2; without it Envoy silently retries over HTTP/1.1.
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            // Large pushes in few writes (contract 6).
                            "explicit_http_config": {"http2_protocol_options": {
                                "custom_settings_parameters": [{
                                    "identifier": HTTP2_SETTINGS_MAX_FRAME_SIZE,
                                    "value": ADS_MAX_FRAME_SIZE,
                                }],
                            }},
                        }
                    },
                },
                {
                    "name": "envoy-admin",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {"cluster_name": "envoy-admin",
                        "endpoints": [{"lb_endpoints": [endpoint("127.0.0.1", ports::PROXY_ADMIN)]}]},
                },
            ],
        },
    })
}

pub fn bootstrap_configmaps(rev: &Revision<'_>) -> Vec<DesiredObject> {
    let observed = rev.input.observed;
    let ads_host = observed
        .service_cluster_ip
        .clone()
        .filter(|ip| !ip.is_empty() && ip != "None")
        .unwrap_or_else(|| names::service_host(&rev.revision, &rev.control_namespace));
    // JSON is YAML; serde_saphyr gives the readable block form users expect in `kubectl get -o yaml`.
    let bootstrap = envoy_bootstrap(
        &ads_host,
        &names::service_host(&rev.revision, &rev.control_namespace),
    );
    let envoy_yaml = serde_saphyr::to_string(&bootstrap).unwrap_or_else(|_| bootstrap.to_string());
    let root_cert = observed
        .root_cert
        .clone()
        .unwrap_or_else(|| ROOT_CERT_PLACEHOLDER.to_string());
    let name = names::bootstrap_configmap(&rev.revision);
    let data = BootstrapData {
        envoy_yaml,
        root_cert,
        revision: rev.revision.clone(),
    }
    .to_data();
    // A gateway in the control namespace needs the bootstrap there too.
    let gateway_home: Vec<String> = super::gateway::gateway_namespaces(rev)
        .into_iter()
        .filter(|ns| !rev.input.tenant_members.contains(ns))
        .collect();
    rev.input
        .tenant_members
        .iter()
        .chain(gateway_home.iter())
        .map(|member| rev.object(Kind::ConfigMap, Some(member), &name, json!({"data": data})))
        .collect()
}
