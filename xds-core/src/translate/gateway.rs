//! Gateway proxies (`router~` nodes): listeners from the Gateways that select them, routes
//! from the VirtualServices bound to those Gateways, clusters of the tenant's hosts.
//!
//! Trust (docs/traffic.md): a gateway takes Gateways and VirtualServices only from its own
//! namespace, the control namespace, and the namespaces the tenant admin listed for it
//! (`spec.ingressGateway.allowedNamespaces`); anything else is ignored here and reported by
//! [`super::diagnostics`]. On one gateway a host belongs to the namespace whose VirtualService
//! claimed it first; VirtualServices of that namespace for the host merge in creation order
//! (catch-all routes last), later namespaces are refused for it.
//!
//! End-user authentication and authorization: the RequestAuthentications and
//! AuthorizationPolicies that select the gateway's pods (from its namespace, or tenant-wide from
//! the control namespace) give every HTTP chain its `jwt_authn` filter then its CUSTOM, DENY
//! and ALLOW filters ([`super::authz`]), and every TCP chain its RBAC network filters, as on a
//! sidecar's inbound chains; clients from outside the mesh have no peer identity there.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::core::v3::data_source::Specifier as DataSpecifier;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as SocketConfig;
use envoy_types::pb::envoy::config::core::v3::{DataSource, TransportSocket};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::virtual_host::TlsRequirementType;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::StripPortMode;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::tls_parameters::TlsProtocol as EnvoyTlsProtocol;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, TlsCertificate,
    TlsParameters,
};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfigType;
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;
use meshplane_crds::networking::gateway::{Server, ServerTlsMode, ServerTlsSettings, TlsProtocol};
use meshplane_crds::networking::resolve_host;
use meshplane_crds::{Gateway, VirtualService};

use super::envoy::{self, socket_address};
use super::outbound::{outbound_clusters, weighted_l4};
use super::policy::{san_matchers, TLS_TRANSPORT_SOCKET};
use super::registry::{Registry, ServiceSource, TargetPort};
use super::routes::{self, is_catch_all, RouteContext};
use super::traffic::{
    exported_to, host_matches, labels_match, resolve_gateways, vs_hosts, GatewayRef,
};
use super::{Translated, BLACKHOLE_CLUSTER};
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

fn namespace_of<K: kube_core::Resource>(o: &K) -> &str {
    o.meta().namespace.as_deref().unwrap_or_default()
}

fn name_of<K: kube_core::Resource>(o: &K) -> &str {
    o.meta().name.as_deref().unwrap_or_default()
}

/// The namespaces a gateway proxy takes config from: its own, the control namespace, and
/// those its operator-run deployment allows.
pub fn trusted_namespaces(registry: &Registry, node: &ProxyNode) -> BTreeSet<String> {
    let mut out = BTreeSet::from([node.namespace.clone(), registry.control_namespace.clone()]);
    for dep in &registry.gateway_deployments {
        if dep.namespace == node.namespace && labels_match(&dep.labels, &node.labels) {
            out.extend(dep.allowed_namespaces.iter().cloned());
        }
    }
    out
}

/// The Gateways that select this proxy and come from a namespace it trusts, oldest first;
/// then the compiled listeners of the Gateway API Gateway it runs for, which select only the
/// proxies of their own namespace.
pub fn selected_gateways<'a>(registry: &'a Registry, node: &ProxyNode) -> Vec<&'a Gateway> {
    let trusted = trusted_namespaces(registry, node);
    registry
        .gateways
        .iter()
        .filter(|g| labels_match(&g.spec.selector, &node.labels))
        .filter(|g| trusted.contains(namespace_of(*g)))
        .chain(
            registry
                .gateway_api_gateways
                .iter()
                .filter(|g| namespace_of(*g) == node.namespace)
                .filter(|g| labels_match(&g.spec.selector, &node.labels)),
        )
        .collect()
}

/// The VirtualServices gateways read: the tenant's, then those compiled from the Gateway API
/// routes (bound only to compiled listeners).
fn gateway_virtual_services(registry: &Registry) -> impl Iterator<Item = &VirtualService> {
    registry
        .virtual_services
        .iter()
        .chain(registry.gateway_api_routes.iter())
}

/// A server host `[namespace/]host` split; the namespace part says whose VirtualServices may
/// bind (`*` anyone, `.` the Gateway's namespace).
fn split_server_host<'a>(entry: &'a str, gateway_namespace: &'a str) -> (&'a str, &'a str) {
    match entry.split_once('/') {
        Some((".", host)) => (gateway_namespace, host),
        Some((ns, host)) => (ns, host),
        None => ("*", entry),
    }
}

/// The hosts a VirtualService serves on a server: the narrower of each (VS host, server host)
/// pair that overlaps, when the server admits the VirtualService's namespace.
pub fn served_hosts_for(
    vs: &VirtualService,
    server: &Server,
    gateway_namespace: &str,
) -> Vec<String> {
    let vs_ns = namespace_of(vs);
    let mut out = Vec::new();
    for entry in &server.hosts {
        let (ns, server_host) = split_server_host(entry, gateway_namespace);
        if ns != "*" && ns != vs_ns {
            continue;
        }
        for h in vs_hosts(vs) {
            let host = if host_matches(server_host, &h) {
                h.clone()
            } else if host_matches(&h, server_host) {
                server_host.to_string()
            } else {
                continue;
            };
            if !out.contains(&host) {
                out.push(host);
            }
        }
    }
    out
}

/// The port the gateway proxy binds for a server port: the `targetPort` of its Service (the
/// one selecting the proxy with that port), else the port itself.
pub fn bound_port(registry: &Registry, node: &ProxyNode, port: u32) -> u32 {
    registry
        .services
        .iter()
        .filter(|s| s.namespace == node.namespace)
        .filter(|s| match &s.source {
            ServiceSource::Kubernetes { selector } => {
                !selector.is_empty() && labels_match(selector, &node.labels)
            }
            ServiceSource::Entry { .. } => false,
        })
        .flat_map(|s| s.ports.iter())
        .find(|p| p.port == port)
        .and_then(|p| match p.target_port {
            TargetPort::Number(n) => Some(n),
            TargetPort::Named(_) => None,
        })
        .unwrap_or(port)
}

/// Whether the proxy-level trust lets a VirtualService bind to `gateway`.
fn bound_to(vs: &VirtualService, gateway: &GatewayRef, trusted: &BTreeSet<String>) -> bool {
    let ns = namespace_of(vs);
    trusted.contains(ns)
        && resolve_gateways(&vs.spec.gateways, ns).contains(gateway)
        && match gateway {
            GatewayRef::Gateway { namespace, .. } => exported_to(&vs.spec.export_to, ns, namespace),
            GatewayRef::Mesh => true,
        }
}

/// Virtual hosts of the plain or terminated HTTP servers of one listener.
fn http_virtual_hosts(
    registry: &Registry,
    node: &ProxyNode,
    servers: &[(&Gateway, &Server)],
    port: u32,
) -> Vec<VirtualHost> {
    let trusted = trusted_namespaces(registry, node);
    // host -> (claiming namespace, routes, https redirect)
    let mut hosts: BTreeMap<String, (String, Vec<Route>, bool)> = BTreeMap::new();
    // Oldest VirtualService first: it claims its hosts, and merged rules keep creation order.
    for vs in gateway_virtual_services(registry).filter(|vs| !vs.spec.http.is_empty()) {
        let vs_ns = namespace_of(vs);
        for (gw, server) in servers {
            let gateway = GatewayRef::Gateway {
                namespace: namespace_of(*gw).to_string(),
                name: name_of(*gw).to_string(),
            };
            if !bound_to(vs, &gateway, &trusted) {
                continue;
            }
            let redirect = server.tls.as_ref().is_some_and(|t| t.https_redirect);
            let ctx = RouteContext {
                registry,
                proxy_namespace: &node.namespace,
                proxy_labels: &node.labels,
                gateway: &gateway,
                port: server.port.number,
            };
            for host in served_hosts_for(vs, server, namespace_of(*gw)) {
                let entry = hosts
                    .entry(host)
                    .or_insert_with(|| (vs_ns.to_string(), Vec::new(), redirect));
                if entry.0 != vs_ns {
                    // Claimed by another namespace first: refused (reported on the status).
                    continue;
                }
                entry.1.extend(routes::http_routes(vs, &ctx));
                entry.2 |= redirect;
            }
        }
    }
    let _ = port;
    hosts
        .into_iter()
        .filter(|(_, (_, routes, _))| !routes.is_empty())
        .map(|(host, (_, mut routes, redirect))| {
            // Merged VirtualServices keep their order, but catch-alls cannot shadow later rules.
            routes.sort_by_key(is_catch_all);
            VirtualHost {
                name: format!(
                    "{host}:{}",
                    servers.first().map(|s| s.1.port.number).unwrap_or(0)
                ),
                domains: vec![host],
                routes,
                require_tls: if redirect {
                    TlsRequirementType::All as i32
                } else {
                    TlsRequirementType::None as i32
                },
                ..Default::default()
            }
        })
        .collect()
}

fn gateway_hcm(
    stat_prefix: &str,
    route_name: &str,
    jwt: Option<&HttpFilter>,
) -> envoy_types::pb::envoy::config::listener::v3::Filter {
    let mut http_filters = envoy::routing_http_filters();
    if let Some(jwt) = jwt {
        // End-user authentication of the gateway's RequestAuthentications, before the router.
        let at = http_filters.len().saturating_sub(1);
        http_filters.insert(at, jwt.clone());
    }
    let hcm = HttpConnectionManager {
        stat_prefix: stat_prefix.to_string(),
        route_specifier: Some(envoy::rds(route_name)),
        http_filters,
        // Hosts are matched without the port clients may add.
        strip_port_mode: Some(StripPortMode::StripAnyHostPort(true)),
        use_remote_address: Some(BoolValue { value: true }),
        ..Default::default()
    };
    envoy_types::pb::envoy::config::listener::v3::Filter {
        name: envoy::filter_name::HTTP_CONNECTION_MANAGER.to_string(),
        config_type: Some(FilterConfigType::TypedConfig(pack_any(hcm))),
    }
}

fn inline(bytes: &[u8]) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(DataSpecifier::InlineBytes(bytes.to_vec())),
        ..Default::default()
    })
}

fn file(path: &str) -> Option<DataSource> {
    (!path.is_empty()).then(|| DataSource {
        specifier: Some(DataSpecifier::Filename(path.to_string())),
        ..Default::default()
    })
}

fn tls_version(v: Option<TlsProtocol>) -> i32 {
    (match v {
        None | Some(TlsProtocol::TlsAuto) => EnvoyTlsProtocol::TlsAuto,
        Some(TlsProtocol::TlsV1_0) => EnvoyTlsProtocol::TlSv10,
        Some(TlsProtocol::TlsV1_1) => EnvoyTlsProtocol::TlSv11,
        Some(TlsProtocol::TlsV1_2) => EnvoyTlsProtocol::TlSv12,
        Some(TlsProtocol::TlsV1_3) => EnvoyTlsProtocol::TlSv13,
    }) as i32
}

/// The TLS context of a terminating server; `None` when its certificate is not available
/// (an unknown Secret, one the proxy's ServiceAccount may not read, `ISTIO_MUTUAL` before
/// identity): the server is then left out.
fn downstream_tls(
    registry: &Registry,
    node: &ProxyNode,
    tls: &ServerTlsSettings,
) -> Option<DownstreamTlsContext> {
    let (certificate, ca) = if tls.credential_name.is_empty() {
        (
            TlsCertificate {
                certificate_chain: file(&tls.server_certificate),
                private_key: file(&tls.private_key),
                ..Default::default()
            },
            file(&tls.ca_certificates),
        )
    } else {
        // The proxy's ServiceAccount must be allowed to read it (checked in Kubernetes mode).
        if !may_read_credential(node, &tls.credential_name) {
            return None;
        }
        // The Secret must live in the gateway's own namespace, as in Istio.
        let secret = registry
            .tls_secrets
            .get(&(node.namespace.clone(), tls.credential_name.clone()))?;
        (
            TlsCertificate {
                certificate_chain: inline(&secret.certificate),
                private_key: inline(&secret.private_key),
                ..Default::default()
            },
            secret.ca.as_deref().and_then(inline),
        )
    };
    let mutual = matches!(
        tls.mode,
        Some(ServerTlsMode::Mutual) | Some(ServerTlsMode::OptionalMutual)
    );
    let validation = (mutual && ca.is_some()).then(|| {
        ValidationContextType::ValidationContext(CertificateValidationContext {
            trusted_ca: ca,
            match_typed_subject_alt_names: san_matchers(&tls.subject_alt_names),
            ..Default::default()
        })
    });
    if mutual && validation.is_none() {
        return None;
    }
    Some(DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(TlsParameters {
                tls_minimum_protocol_version: tls_version(tls.min_protocol_version),
                tls_maximum_protocol_version: tls_version(tls.max_protocol_version),
                cipher_suites: tls.cipher_suites.clone(),
                ..Default::default()
            }),
            tls_certificates: vec![certificate],
            validation_context_type: validation,
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue {
            value: tls.mode == Some(ServerTlsMode::Mutual),
        }),
        ..Default::default()
    })
}

/// Whether `node` may get the credential Secret `name` of its namespace: its ServiceAccount
/// may `get` it ([`ProxyNode::readable_credentials`]), or nobody checks (directory mode).
pub fn may_read_credential(node: &ProxyNode, name: &str) -> bool {
    node.readable_credentials
        .as_ref()
        .is_none_or(|readable| readable.contains(name))
}

/// The `credentialName`s of the terminating TLS servers of the Gateways that select `node`:
/// the Secrets of its namespace it would serve.
pub fn credential_names(registry: &Registry, node: &ProxyNode) -> BTreeSet<String> {
    server_credentials(selected_gateways(registry, node))
}

/// The `credentialName`s of the terminating TLS servers of every Gateway of the tenant.
pub fn all_credential_names(registry: &Registry) -> BTreeSet<String> {
    server_credentials(
        registry
            .gateways
            .iter()
            .chain(registry.gateway_api_gateways.iter()),
    )
}

fn server_credentials<'a>(gateways: impl IntoIterator<Item = &'a Gateway>) -> BTreeSet<String> {
    gateways
        .into_iter()
        .flat_map(|g| g.spec.servers.iter())
        .filter(|s| terminates(s))
        .filter_map(|s| s.tls.as_ref())
        .filter(|t| !t.credential_name.is_empty())
        .map(|t| t.credential_name.clone())
        .collect()
}

/// SNI names of a server: its hosts unless one is `*`.
fn server_names(server: &Server, gateway_namespace: &str) -> Vec<String> {
    let hosts: Vec<&str> = server
        .hosts
        .iter()
        .map(|h| split_server_host(h, gateway_namespace).1)
        .collect();
    if hosts.contains(&"*") {
        Vec::new()
    } else {
        hosts.into_iter().map(str::to_string).collect()
    }
}

/// The server's protocol as the gateway serves it: Istio's `GRPC-WEB` is gRPC over HTTP, and its
/// database protocols (`MONGO`, `MYSQL`, `REDIS`) are opaque TCP, as Istio's gateways serve them.
fn protocol(server: &Server) -> String {
    let upper = server.port.protocol.to_ascii_uppercase();
    match upper.as_str() {
        "GRPC-WEB" => "GRPC".to_string(),
        "MONGO" | "MYSQL" | "REDIS" => "TCP".to_string(),
        _ => upper,
    }
}

fn terminates(server: &Server) -> bool {
    match protocol(server).as_str() {
        "HTTP" | "HTTP2" | "GRPC" => true,
        "HTTPS" => server
            .tls
            .as_ref()
            .is_some_and(|t| t.mode != Some(ServerTlsMode::Passthrough)),
        _ => false,
    }
}

/// Translates the registry for a gateway proxy.
pub fn translate_router(registry: &Registry, node: &ProxyNode, out: &mut Translated) {
    let gateways = selected_gateways(registry, node);
    let trusted = trusted_namespaces(registry, node);
    let jwt = super::jwt::http_filter(
        &super::request_authentications(registry, node),
        &registry.jwks,
    );
    // The AuthorizationPolicies that select the gateway's pods (or the whole tenant): enforced
    // on every chain it serves, as on a sidecar's inbound chains. A client from outside the
    // mesh has no peer identity, so principal conditions fail closed here.
    let policies = super::authorization_policies(registry, node);
    let custom = super::ext_authz::CustomProviders::of(registry, &policies);
    let facts = |port: u32, http: bool| super::authz::ChainFacts {
        identity: false,
        http,
        port: Some(port),
    };
    let http_chain = |route_name: &str, port: u32| {
        super::authz::with_http_rbac(
            gateway_hcm(route_name, route_name, jwt.as_ref()),
            super::authz::http_filters_with(
                &policies,
                facts(port, true),
                registry.trust_domain(),
                &custom,
            ),
        )
    };
    let tcp_authz = |port: u32| {
        super::authz::network_filters_with(
            &policies,
            facts(port, false),
            registry.trust_domain(),
            &custom,
        )
    };
    // Servers by the port the proxy binds.
    let mut by_port: BTreeMap<u32, Vec<(&Gateway, &Server)>> = BTreeMap::new();
    for gw in &gateways {
        for server in &gw.spec.servers {
            by_port
                .entry(bound_port(registry, node, server.port.number))
                .or_default()
                .push((gw, server));
        }
    }
    for (port, servers) in &by_port {
        let mut chains: Vec<FilterChain> = Vec::new();
        let mut sni = false;
        let plain: Vec<(&Gateway, &Server)> = servers
            .iter()
            .filter(|(_, s)| terminates(s) && s.tls.as_ref().is_none_or(|t| t.mode.is_none()))
            .copied()
            .collect();
        for (gw, server) in servers
            .iter()
            .filter(|(_, s)| protocol(s) == "HTTPS" && terminates(s))
        {
            let Some(tls) = server
                .tls
                .as_ref()
                .and_then(|t| downstream_tls(registry, node, t))
            else {
                continue;
            };
            let gw_ns = namespace_of(*gw);
            let key = if server.name.is_empty() {
                &server.port.name
            } else {
                &server.name
            };
            let route_name = format!(
                "https.{}.{key}.{}.{gw_ns}",
                server.port.number,
                name_of(*gw)
            );
            out.routes.push(RouteConfiguration {
                name: route_name.clone(),
                virtual_hosts: http_virtual_hosts(registry, node, &[(gw, server)], *port),
                validate_clusters: Some(BoolValue { value: false }),
                ..Default::default()
            });
            let names = server_names(server, gw_ns);
            sni |= !names.is_empty();
            let mut chain = envoy::filter_chain(&route_name, http_chain(&route_name, *port));
            chain.filter_chain_match = Some(FilterChainMatch {
                server_names: names,
                transport_protocol: "tls".to_string(),
                ..Default::default()
            });
            chain.transport_socket = Some(TransportSocket {
                name: TLS_TRANSPORT_SOCKET.to_string(),
                config_type: Some(SocketConfig::TypedConfig(pack_any(tls))),
            });
            chains.push(chain);
        }
        // Passthrough TLS: VirtualService `tls` rules by SNI.
        for (gw, server) in servers
            .iter()
            .filter(|(_, s)| !terminates(s) && protocol(s) != "TCP")
        {
            let gateway = GatewayRef::Gateway {
                namespace: namespace_of(*gw).to_string(),
                name: name_of(*gw).to_string(),
            };
            for vs in
                gateway_virtual_services(registry).filter(|vs| bound_to(vs, &gateway, &trusted))
            {
                let vs_ns = namespace_of(vs);
                for rule in &vs.spec.tls {
                    let dests = weighted_l4(registry, &rule.route, vs_ns, server.port.number);
                    if dests.is_empty() {
                        continue;
                    }
                    for m in &rule.match_ {
                        let applies = m.port.is_none_or(|p| p == server.port.number)
                            && (m.gateways.is_empty()
                                || resolve_gateways(&m.gateways, vs_ns).contains(&gateway));
                        if !applies {
                            continue;
                        }
                        sni = true;
                        let name = format!("{}|{}", name_of(vs), m.sni_hosts.join(","));
                        let mut chain = envoy::filter_chain(
                            &name,
                            envoy::weighted_tcp_proxy_filter(
                                &name,
                                &dests,
                                idle(registry, &node.namespace, &dests),
                            ),
                        );
                        chain.filters.splice(0..0, tcp_authz(*port));
                        chain.filter_chain_match = Some(FilterChainMatch {
                            server_names: m
                                .sni_hosts
                                .iter()
                                .map(|h| resolve_host(h, vs_ns))
                                .collect(),
                            transport_protocol: "tls".to_string(),
                            ..Default::default()
                        });
                        chains.push(chain);
                    }
                }
            }
        }
        if !plain.is_empty() {
            let route_name = format!("http.{port}");
            out.routes.push(RouteConfiguration {
                name: route_name.clone(),
                virtual_hosts: http_virtual_hosts(registry, node, &plain, *port),
                validate_clusters: Some(BoolValue { value: false }),
                ..Default::default()
            });
            chains.push(envoy::filter_chain(
                &route_name,
                http_chain(&route_name, *port),
            ));
        } else if let Some((gw, server)) = servers.iter().find(|(_, s)| protocol(s) == "TCP") {
            // Opaque TCP: the first `tcp` rule bound to the Gateway.
            let gateway = GatewayRef::Gateway {
                namespace: namespace_of(*gw).to_string(),
                name: name_of(*gw).to_string(),
            };
            let dests = gateway_virtual_services(registry)
                .filter(|vs| bound_to(vs, &gateway, &trusted))
                .find_map(|vs| {
                    let vs_ns = namespace_of(vs);
                    vs.spec
                        .tcp
                        .iter()
                        .find(|r| {
                            r.match_.is_empty()
                                || r.match_
                                    .iter()
                                    .any(|m| m.port.is_none_or(|p| p == server.port.number))
                        })
                        .map(|r| weighted_l4(registry, &r.route, vs_ns, server.port.number))
                })
                .filter(|d| !d.is_empty())
                .unwrap_or_else(|| vec![(BLACKHOLE_CLUSTER.to_string(), 100)]);
            let name = format!("tcp.{port}");
            let mut chain = envoy::filter_chain(
                &name,
                envoy::weighted_tcp_proxy_filter(
                    &name,
                    &dests,
                    idle(registry, &node.namespace, &dests),
                ),
            );
            chain.filters.splice(0..0, tcp_authz(*port));
            chains.push(chain);
        }
        if chains.is_empty() {
            continue;
        }
        let bind = servers
            .iter()
            .map(|(_, s)| s.bind.as_str())
            .find(|b| !b.is_empty())
            .unwrap_or("0.0.0.0");
        let address = node.local_address(bind);
        out.listeners.push(Listener {
            name: format!("{address}_{port}"),
            address: Some(socket_address(&address, *port)),
            listener_filters: if sni || chains.iter().any(|c| c.transport_socket.is_some()) {
                vec![envoy::tls_inspector_listener_filter()]
            } else {
                Vec::new()
            },
            filter_chains: chains,
            ..Default::default()
        });
    }
    // The gateway reaches every host of the tenant visible from its namespace.
    let mut seen = BTreeSet::new();
    let mut hosts: Vec<&super::registry::ServiceModel> = Vec::new();
    for svc in &registry.services {
        if !svc.visible_from(&node.namespace, &registry.mesh_config) {
            continue;
        }
        if seen.insert(svc.hostname.clone()) {
            hosts.push(svc);
        } else if svc.namespace == node.namespace {
            if let Some(prev) = hosts.iter_mut().find(|h| h.hostname == svc.hostname) {
                *prev = svc;
            }
        }
    }
    for svc in hosts {
        outbound_clusters(registry, &node.namespace, node.sds, svc, out);
    }
    out.clusters.push(envoy::cluster(
        BLACKHOLE_CLUSTER,
        envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType::Static,
    ));
    // The external authorizers of its CUSTOM policies.
    super::authorizer_clusters(registry, node, &custom, out);
}
