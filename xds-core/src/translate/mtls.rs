//! Mutual TLS between the tenant's sidecars (contract 11 of docs/architecture.md), as pure
//! functions over Envoy messages.
//!
//! [`apply`] runs after outbound and inbound translation (which call [`inbound_chain_plan`] per
//! port): it marks meshed endpoints and gives outbound clusters automatic mutual TLS.
//!
//! Certificates never appear in the config: every TLS context names the node agent's SDS
//! secrets ([`meshplane_ca::sds`]): `default` (the workload certificate and key, generated in
//! the pod) and `ROOTCA` (the tenant's trust bundle). Only proxies that announce the agent
//! (node metadata `SDS=true`) get TLS contexts; any other would wait forever for its secrets.
//!
//! - Client side: [`istio_mutual_transport_socket`] is what a DestinationRule's
//!   `tls.mode: ISTIO_MUTUAL` means; [`originate_mtls_to_meshed_endpoints`] applies it
//!   automatically, per endpoint, to endpoints that have a sidecar ([`meshed_endpoint_metadata`])
//!   and leaves the others plaintext. The server's identity must be one of the destination's
//!   SPIFFE IDs ([`expected_server_identities`]), or at least of the tenant's trust domain.
//! - Server side: [`inbound_chain_plan`] says which filter chains a port gets for its
//!   PeerAuthentication mode; [`inbound_mtls_transport_socket`] terminates mutual TLS and
//!   accepts only client identities of the tenant's trust domain. A different tenant's
//!   workload has another root and cannot complete the handshake; with a shared organisation
//!   root it has another trust domain and fails the SAN match.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::grpc_service::{EnvoyGrpc, TargetSpecifier};
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as SocketConfig;
use envoy_types::pb::envoy::config::core::v3::{
    api_config_source::ApiType, ApiConfigSource, ApiVersion, ConfigSource, GrpcService, Metadata,
    TransportSocket,
};
use envoy_types::pb::envoy::config::listener::v3::listener_filter::ConfigType as ListenerFilterConfigType;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChainMatch, ListenerFilter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::{
    ForwardClientCertDetails, SetCurrentClientCertDetails,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use prost::Message;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::{
    CombinedCertificateValidationContext, ValidationContextType,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::subject_alt_name_matcher::SanType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::tls_parameters::TlsProtocol;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    SubjectAltNameMatcher, TlsParameters, UpstreamTlsContext,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher;
use envoy_types::pb::google::protobuf::{value::Kind, BoolValue, Struct, Value};
use envoy_types::util::pack_any;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use meshplane_contracts::tenant_ca::{SDS_CLUSTER, TRUST_BUNDLE_SECRET, WORKLOAD_CERT_SECRET};
use meshplane_crds::security::MtlsMode;

use super::cluster_id::OutboundCluster;
use super::registry::{Registry, ServiceSource};
use super::Translated;
use crate::model::ProxyNode;

/// Name of Envoy's TLS transport socket.
pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";
/// Name of the listener filter that reads the TLS ClientHello (transport protocol, ALPN).
pub const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
/// Endpoint metadata namespace that `transport_socket_matches` read.
pub const TRANSPORT_SOCKET_MATCH_KEY: &str = "envoy.transport_socket_match";
/// Key and value of the endpoint metadata marking an endpoint with a sidecar (Istio's names,
/// so Istio-shaped EnvoyFilters and tools read them alike).
pub const TLS_MODE_KEY: &str = "tlsMode";
pub const TLS_MODE_MESH: &str = "istio";
/// Label of a ServiceEntry endpoint that has a sidecar of the tenant (a VM or a workload the
/// registry does not see as a Pod): `istio` turns on automatic mutual TLS to it, as Istio's
/// `security.istio.io/tlsMode` does.
pub const TLS_MODE_LABEL: &str = "security.meshplane.io/tlsMode";
/// Name of the transport socket match for meshed endpoints.
pub const MESH_TLS_MATCH: &str = "tlsMode-istio";
/// ALPN a meshed client offers: tells the server's PERMISSIVE chains that this TLS is the mesh's,
/// not the application's own.
pub const MESH_CLIENT_ALPN: [&str; 2] = ["istio-peer-exchange", "istio"];
/// ALPN values by which a server recognises mesh mutual TLS (ours, and Istio sidecars').
pub const MESH_SERVER_ALPN: [&str; 5] = [
    "istio-peer-exchange",
    "istio",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];

/// The TLS versions of the tenant's mutual TLS, on both sides, as Istio's sidecars offer them:
/// 1.2 at least, 1.3 at most. Envoy's own default for a client is 1.2 at most, so without this
/// two sidecars would never negotiate 1.3.
pub fn mesh_tls_params() -> TlsParameters {
    TlsParameters {
        tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
        tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
        ..Default::default()
    }
}

fn sds_secret(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            resource_api_version: ApiVersion::V3 as i32,
            config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: ApiType::Grpc as i32,
                    transport_api_version: ApiVersion::V3 as i32,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                            cluster_name: SDS_CLUSTER.to_string(),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                    set_node_on_first_message_only: true,
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
    }
}

/// The SPIFFE ID prefix of every identity of `trust_domain`.
pub fn trust_domain_prefix(trust_domain: &str) -> String {
    format!("spiffe://{trust_domain}/")
}

fn uri_san(pattern: MatchPattern) -> SubjectAltNameMatcher {
    SubjectAltNameMatcher {
        san_type: SanType::Uri as i32,
        matcher: Some(StringMatcher {
            match_pattern: Some(pattern),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The certificate, the trust bundle and the identities accepted from the peer: `exact` SPIFFE
/// IDs when given, else any identity of `trust_domain`. Never an identity of another trust
/// domain, whatever a rule names: with an organisation root shared by tenants, another
/// tenant's certificate chains to the bundle too, and only the trust domain tells them apart.
fn mesh_tls_context(trust_domain: &str, exact: &[String], alpn: &[&str]) -> CommonTlsContext {
    let prefix = trust_domain_prefix(trust_domain);
    let own: Vec<&String> = exact
        .iter()
        .filter(|id| id.len() > prefix.len() && id.starts_with(&prefix))
        .collect();
    let sans = match (exact.is_empty(), own.is_empty()) {
        (true, _) => vec![uri_san(MatchPattern::Prefix(prefix))],
        (false, false) => own
            .into_iter()
            .map(|id| uri_san(MatchPattern::Exact(id.clone())))
            .collect(),
        // Only other trust domains named: accept nothing. The trust domain's own ID (no path)
        // is never a workload's.
        (false, true) => vec![uri_san(MatchPattern::Exact(prefix))],
    };
    CommonTlsContext {
        tls_params: Some(mesh_tls_params()),
        tls_certificate_sds_secret_configs: vec![sds_secret(WORKLOAD_CERT_SECRET)],
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(CertificateValidationContext {
                    match_typed_subject_alt_names: sans,
                    ..Default::default()
                }),
                validation_context_sds_secret_config: Some(sds_secret(TRUST_BUNDLE_SECRET)),
                ..Default::default()
            },
        )),
        alpn_protocols: alpn.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// The client transport socket of the tenant's mutual TLS, what a DestinationRule's
/// `tls.mode: ISTIO_MUTUAL` means: the workload certificate of the pod, the tenant's trust
/// bundle, and the server's identity checked against `server_identities` (SPIFFE IDs, see
/// [`expected_server_identities`]); with none, any identity of `trust_domain` is accepted.
/// `sni` is Istio's `outbound_.<port>_.<subset>_.<host>` ([`mesh_sni`]).
pub fn istio_mutual_transport_socket(
    trust_domain: &str,
    server_identities: &[String],
    sni: &str,
) -> TransportSocket {
    let context = UpstreamTlsContext {
        common_tls_context: Some(mesh_tls_context(
            trust_domain,
            server_identities,
            &MESH_CLIENT_ALPN,
        )),
        sni: sni.to_string(),
        ..Default::default()
    };
    TransportSocket {
        name: TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(SocketConfig::TypedConfig(pack_any(context))),
    }
}

/// Istio's SNI for mesh traffic to `host:port` (and subset).
pub fn mesh_sni(port: u32, subset: &str, host: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{host}")
}

/// The identities a client accepts from the servers of a destination: the SPIFFE IDs of the
/// ServiceAccounts behind it, or the ServiceEntry's `subjectAltNames` when it sets them (they
/// replace the accounts, as in Istio). Sorted, without duplicates.
pub fn expected_server_identities(
    trust_domain: &str,
    service_accounts: &BTreeSet<(String, String)>,
    subject_alt_names: &[String],
) -> Vec<String> {
    if !subject_alt_names.is_empty() {
        let set: BTreeSet<&String> = subject_alt_names.iter().collect();
        return set.into_iter().cloned().collect();
    }
    service_accounts
        .iter()
        .map(|(ns, sa)| format!("spiffe://{trust_domain}/ns/{ns}/sa/{sa}"))
        .collect()
}

/// Automatic mutual TLS: endpoints marked with [`meshed_endpoint_metadata`] are reached with
/// `socket`, the others in plaintext (the cluster's own transport socket, unset here). A
/// cluster that already chose its transport (a DestinationRule's `tls`) is left alone.
pub fn originate_mtls_to_meshed_endpoints(cluster: &mut Cluster, socket: TransportSocket) {
    if cluster.transport_socket.is_some() || !cluster.transport_socket_matches.is_empty() {
        return;
    }
    cluster.transport_socket_matches = vec![TransportSocketMatch {
        name: MESH_TLS_MATCH.to_string(),
        r#match: Some(Struct {
            fields: [(
                TLS_MODE_KEY.to_string(),
                Value {
                    kind: Some(Kind::StringValue(TLS_MODE_MESH.to_string())),
                },
            )]
            .into(),
        }),
        transport_socket: Some(socket),
    }];
}

/// Metadata of an endpoint that has a sidecar: clients originate mutual TLS to it.
pub fn meshed_endpoint_metadata() -> Metadata {
    Metadata {
        filter_metadata: [(
            TRANSPORT_SOCKET_MATCH_KEY.to_string(),
            Struct {
                fields: [(
                    TLS_MODE_KEY.to_string(),
                    Value {
                        kind: Some(Kind::StringValue(TLS_MODE_MESH.to_string())),
                    },
                )]
                .into(),
            },
        )]
        .into(),
        ..Default::default()
    }
}

/// The server transport socket terminating the tenant's mutual TLS: a client certificate is
/// required, chained to the tenant's bundle, naming an identity of `trust_domain`.
pub fn inbound_mtls_transport_socket(trust_domain: &str) -> TransportSocket {
    let context = DownstreamTlsContext {
        common_tls_context: Some(mesh_tls_context(trust_domain, &[], &[])),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    };
    TransportSocket {
        name: TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(SocketConfig::TypedConfig(pack_any(context))),
    }
}

/// The listener filter that lets filter chains match TLS and its ALPN.
pub fn tls_inspector() -> ListenerFilter {
    ListenerFilter {
        name: TLS_INSPECTOR.to_string(),
        config_type: Some(ListenerFilterConfigType::TypedConfig(pack_any(
            TlsInspector::default(),
        ))),
        ..Default::default()
    }
}

/// How a connection reached the workload through one inbound filter chain: what the chain's
/// filters (and an authorization filter placed before the router or TCP proxy) can know about
/// the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InboundPeer {
    /// Mutual TLS terminated by the proxy: the peer's SPIFFE ID is known (`source.principal`)
    /// and forwarded to the application in `x-forwarded-client-cert`.
    Mtls,
    /// Plaintext: no peer identity.
    Plaintext,
    /// The application's own TLS, passed through untouched (PERMISSIVE): no peer identity, and
    /// the bytes are opaque, so it is TCP-proxied whatever the port's protocol.
    PassthroughTls,
}

impl InboundPeer {
    /// Suffix of the filter chain's name (the plaintext chain keeps the bare name).
    pub fn chain_suffix(self) -> &'static str {
        match self {
            InboundPeer::Mtls => ";mtls",
            InboundPeer::Plaintext => "",
            InboundPeer::PassthroughTls => ";tls",
        }
    }
}

/// One filter chain of an inbound port: what it matches beyond the port, and what it is.
#[derive(Clone, Debug, PartialEq)]
pub struct InboundChain {
    pub peer: InboundPeer,
    /// `transport_protocol` and `application_protocols` of the chain's match.
    pub transport_protocol: &'static str,
    pub application_protocols: Vec<String>,
}

impl InboundChain {
    fn new(peer: InboundPeer, transport_protocol: &'static str, alpn: &[&str]) -> Self {
        Self {
            peer,
            transport_protocol,
            application_protocols: alpn.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Fills the chain's part of a filter chain match.
    pub fn apply_to(&self, m: &mut FilterChainMatch) {
        m.transport_protocol = self.transport_protocol.to_string();
        m.application_protocols = self.application_protocols.clone();
    }

    /// Whether the chain needs the TLS inspector.
    pub fn inspects_tls(&self) -> bool {
        !self.transport_protocol.is_empty()
    }
}

/// The filter chains of one inbound port in `mode` (resolved, never `UNSET`), for a proxy that
/// has its SDS secrets (`sds`) or not.
///
/// Envoy picks the most specific chain level by level (port, then transport protocol, then
/// ALPN) and never falls back to a less specific one, so each mode lists complete
/// alternatives:
/// - STRICT: TLS only; plaintext matches nothing and is closed. Without SDS there is no
///   certificate to serve: nothing matches, the port is closed (never silently plaintext).
/// - PERMISSIVE: TLS with a mesh ALPN is mutual TLS; other TLS is the application's own and
///   passes through; the rest is plaintext.
/// - DISABLE: plaintext (and whatever else arrives) goes straight to the application.
pub fn inbound_chain_plan(mode: MtlsMode, sds: bool) -> Vec<InboundChain> {
    match (mode, sds) {
        (MtlsMode::Strict, true) => vec![InboundChain::new(InboundPeer::Mtls, "tls", &[])],
        (MtlsMode::Strict, false) => Vec::new(),
        (MtlsMode::Permissive | MtlsMode::Unset, true) => vec![
            InboundChain::new(InboundPeer::Mtls, "tls", &MESH_SERVER_ALPN),
            InboundChain::new(InboundPeer::PassthroughTls, "tls", &[]),
            InboundChain::new(InboundPeer::Plaintext, "raw_buffer", &[]),
        ],
        (MtlsMode::Permissive | MtlsMode::Unset | MtlsMode::Disable, false)
        | (MtlsMode::Disable, true) => vec![InboundChain::new(InboundPeer::Plaintext, "", &[])],
    }
}

/// The HTTP connection manager `filter` of a mutual TLS chain, forwarding the client's SPIFFE
/// ID to the application in `x-forwarded-client-cert` (`By`, `Hash` and `URI`), after what
/// earlier hops set, as Istio's sidecars do. Other filters are returned as they are.
pub fn forward_client_identity(filter: Filter) -> Filter {
    let Some(FilterConfig::TypedConfig(any)) = &filter.config_type else {
        return filter;
    };
    let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
        return filter;
    };
    hcm.forward_client_cert_details = ForwardClientCertDetails::AppendForward as i32;
    hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
        uri: true,
        ..Default::default()
    });
    Filter {
        name: filter.name,
        config_type: Some(FilterConfig::TypedConfig(pack_any(hcm))),
    }
}

/// Marks the endpoints of `cla` whose address is a pod with a sidecar of the tenant
/// ([`Registry::meshed_addresses`]), so that clients originate mutual TLS to them. The full
/// render and the index's endpoint-only patch both call it, so they agree.
pub fn mark_meshed_endpoints(registry: &Registry, cla: &mut ClusterLoadAssignment) {
    if registry.meshed_addresses.is_empty() {
        return;
    }
    for group in &mut cla.endpoints {
        for lb in &mut group.lb_endpoints {
            let Some(HostIdentifier::Endpoint(ep)) = &lb.host_identifier else {
                continue;
            };
            let Some(AddressKind::SocketAddress(sa)) =
                ep.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                continue;
            };
            if registry.meshed_addresses.contains(&sa.address) {
                lb.metadata = Some(meshed_endpoint_metadata());
            }
        }
    }
}

fn is_eds(cluster: &Cluster) -> bool {
    matches!(cluster.cluster_discovery_type, Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32)
}

/// The ServiceEntry behind an outbound cluster with inline endpoints (STATIC or DNS), as the
/// proxy in `namespace` sees it: the addresses of its endpoints labelled
/// [`TLS_MODE_LABEL`]`: istio`, and its `subjectAltNames`.
fn inline_entry<'a>(
    registry: &'a Registry,
    namespace: &str,
    cluster: &OutboundCluster,
) -> Option<(BTreeSet<&'a str>, &'a [String])> {
    let host = &cluster.service.host;
    let svc = registry
        .services
        .iter()
        .find(|s| s.hostname == *host && s.visible_from(namespace, &registry.mesh_config))?;
    let ServiceSource::Entry {
        endpoints,
        subject_alt_names,
        ..
    } = &svc.source
    else {
        return None;
    };
    let meshed = endpoints
        .iter()
        .filter(|ep| ep.labels.get(TLS_MODE_LABEL).map(String::as_str) == Some(TLS_MODE_MESH))
        .map(|ep| ep.address.as_str())
        .collect();
    Some((meshed, subject_alt_names.as_slice()))
}

/// Marks the inline endpoints of `cluster` whose address is in `meshed` (or a meshed pod of
/// the tenant); whether any was marked.
fn mark_inline_endpoints(
    registry: &Registry,
    meshed: &BTreeSet<&str>,
    cluster: &mut Cluster,
) -> bool {
    let mut marked = false;
    for group in cluster
        .load_assignment
        .iter_mut()
        .flat_map(|cla| cla.endpoints.iter_mut())
    {
        for lb in &mut group.lb_endpoints {
            let Some(HostIdentifier::Endpoint(ep)) = &lb.host_identifier else {
                continue;
            };
            let Some(AddressKind::SocketAddress(sa)) =
                ep.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                continue;
            };
            if meshed.contains(sa.address.as_str())
                || registry.meshed_addresses.contains(&sa.address)
            {
                lb.metadata = Some(meshed_endpoint_metadata());
                marked = true;
            }
        }
    }
    marked
}

/// Automatic mutual TLS for one proxy: meshed endpoints are marked in every assignment, and a
/// proxy with the agent's SDS secrets originates mutual TLS on its outbound clusters to the
/// marked endpoints, plaintext to the others:
/// - EDS clusters (Services, ServiceEntries selecting pods): endpoints that are pods with a
///   sidecar of the tenant; any identity of the tenant's trust domain is accepted;
/// - clusters with inline endpoints (STATIC and DNS ServiceEntries): endpoints labelled
///   [`TLS_MODE_LABEL`]`: istio` (or that are meshed pods); the server must present one of the
///   entry's `subjectAltNames` when it sets them, else any identity of the trust domain.
pub fn apply(registry: &Registry, node: &ProxyNode, out: &mut Translated) {
    for cla in &mut out.endpoints {
        mark_meshed_endpoints(registry, cla);
    }
    let trust_domain = registry.trust_domain();
    for cluster in out.clusters.iter_mut() {
        // Clusters come here as Envoy messages from every translator (sidecars, gateways,
        // gRPC clients): their names say which are outbound.
        let Some(id) = OutboundCluster::parse(&cluster.name) else {
            continue;
        };
        let sni = id.sni();
        if is_eds(cluster) {
            if node.sds {
                let identities = eds_server_identities(registry, &node.namespace, &id);
                originate_mtls_to_meshed_endpoints(
                    cluster,
                    istio_mutual_transport_socket(trust_domain, &identities, &sni),
                );
            }
            continue;
        }
        if cluster.load_assignment.is_none()
            || cluster.transport_socket.is_some()
            || !cluster.transport_socket_matches.is_empty()
        {
            continue;
        }
        let Some((meshed, subject_alt_names)) = inline_entry(registry, &node.namespace, &id) else {
            continue;
        };
        if mark_inline_endpoints(registry, &meshed, cluster) && node.sds {
            let identities =
                expected_server_identities(trust_domain, &BTreeSet::new(), subject_alt_names);
            originate_mtls_to_meshed_endpoints(
                cluster,
                istio_mutual_transport_socket(trust_domain, &identities, &sni),
            );
        }
    }
}

/// The identities a client accepts from the servers of an EDS cluster: the ServiceAccounts
/// behind its host ([`Registry::service_accounts`]), or the `subjectAltNames` of a
/// ServiceEntry for the host that the proxy sees and that sets them. None known: any identity
/// of the trust domain (no meshed endpoint yet, so nothing is reached over mutual TLS anyway).
fn eds_server_identities(
    registry: &Registry,
    namespace: &str,
    cluster: &OutboundCluster,
) -> Vec<String> {
    let host = cluster.service.host.as_str();
    let subject_alt_names = registry
        .services_named(host)
        .filter(|s| s.visible_from(namespace, &registry.mesh_config))
        .find_map(|s| match &s.source {
            ServiceSource::Entry {
                subject_alt_names, ..
            } if !subject_alt_names.is_empty() => Some(subject_alt_names.as_slice()),
            _ => None,
        })
        .unwrap_or_default();
    let accounts = registry.service_accounts.get(host);
    expected_server_identities(
        registry.trust_domain(),
        accounts.unwrap_or(&BTreeSet::new()),
        subject_alt_names,
    )
}

/// Istio's SNI for an outbound cluster name `outbound|<port>|<subset>|<host>` (the name itself
/// for a cluster of another form).
pub fn outbound_sni(cluster_name: &str) -> String {
    OutboundCluster::parse(cluster_name).map_or_else(|| cluster_name.to_string(), |c| c.sni())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(socket: &TransportSocket) -> UpstreamTlsContext {
        let Some(SocketConfig::TypedConfig(any)) = &socket.config_type else {
            panic!("typed config");
        };
        UpstreamTlsContext::decode(any.value.as_slice()).expect("decodes")
    }

    fn sans(ctx: &CommonTlsContext) -> Vec<Option<MatchPattern>> {
        let Some(ValidationContextType::CombinedValidationContext(c)) =
            &ctx.validation_context_type
        else {
            panic!("combined validation");
        };
        c.default_validation_context
            .as_ref()
            .expect("default")
            .match_typed_subject_alt_names
            .iter()
            .map(|m| m.matcher.as_ref().and_then(|s| s.match_pattern.clone()))
            .collect()
    }

    #[test]
    fn istio_mutual_uses_the_agents_secrets_and_checks_the_server_identity() {
        let ids = vec!["spiffe://blue.example/ns/shop/sa/web".to_string()];
        let socket = istio_mutual_transport_socket(
            "blue.example",
            &ids,
            &mesh_sni(80, "", "web.shop.svc.cluster.local"),
        );
        let ctx = upstream(&socket);
        assert_eq!(ctx.sni, "outbound_.80_._.web.shop.svc.cluster.local");
        let common = ctx.common_tls_context.expect("common");
        assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
        assert_eq!(
            sans(&common),
            vec![Some(MatchPattern::Exact(ids[0].clone()))]
        );
        assert_eq!(common.alpn_protocols, MESH_CLIENT_ALPN);
        let params = common.tls_params.clone().expect("TLS versions set");
        assert_eq!(
            (
                params.tls_minimum_protocol_version,
                params.tls_maximum_protocol_version
            ),
            (TlsProtocol::TlSv12 as i32, TlsProtocol::TlSv13 as i32),
            "the client offers TLS 1.3 (Envoy's client default stops at 1.2)"
        );
        // No known account: any identity of the trust domain, never of another.
        let any = upstream(&istio_mutual_transport_socket("blue.example", &[], "x"));
        assert_eq!(
            sans(&any.common_tls_context.expect("common")),
            vec![Some(MatchPattern::Prefix("spiffe://blue.example/".into()))]
        );
        // A rule naming another trust domain's identities adds none of them.
        let named = [
            "spiffe://red.example/ns/shop/sa/web".to_string(),
            ids[0].clone(),
        ];
        let own = upstream(&istio_mutual_transport_socket("blue.example", &named, "x"));
        assert_eq!(
            sans(&own.common_tls_context.expect("common")),
            vec![Some(MatchPattern::Exact(ids[0].clone()))]
        );
        let foreign = upstream(&istio_mutual_transport_socket(
            "blue.example",
            &named[..1],
            "x",
        ));
        assert_eq!(
            sans(&foreign.common_tls_context.expect("common")),
            vec![Some(MatchPattern::Exact("spiffe://blue.example/".into()))],
            "nothing of another trust domain is accepted"
        );
    }

    #[test]
    fn service_entry_subject_alt_names_replace_the_accounts() {
        let accounts = BTreeSet::from([
            ("shop".to_string(), "web".to_string()),
            ("shop".to_string(), "api".to_string()),
        ]);
        assert_eq!(
            expected_server_identities("td", &accounts, &[]),
            vec!["spiffe://td/ns/shop/sa/api", "spiffe://td/ns/shop/sa/web"]
        );
        assert_eq!(
            expected_server_identities("td", &accounts, &["spiffe://org/legacy".into()]),
            vec!["spiffe://org/legacy"]
        );
    }

    #[test]
    fn auto_mtls_leaves_a_cluster_with_its_own_transport_alone() {
        let socket = istio_mutual_transport_socket("td", &[], "sni");
        let mut auto = Cluster::default();
        originate_mtls_to_meshed_endpoints(&mut auto, socket.clone());
        assert_eq!(auto.transport_socket_matches.len(), 1);
        let m = auto.transport_socket_matches[0]
            .r#match
            .as_ref()
            .expect("match");
        assert_eq!(
            meshed_endpoint_metadata().filter_metadata[TRANSPORT_SOCKET_MATCH_KEY],
            *m
        );
        let mut chosen = Cluster {
            transport_socket: Some(TransportSocket::default()),
            ..Default::default()
        };
        originate_mtls_to_meshed_endpoints(&mut chosen, socket);
        assert!(chosen.transport_socket_matches.is_empty());
    }

    #[test]
    fn inbound_mutual_tls_accepts_only_the_tenants_trust_domain() {
        let Some(SocketConfig::TypedConfig(any)) =
            inbound_mtls_transport_socket("blue.meshplane.local").config_type
        else {
            panic!("typed config");
        };
        let ctx = DownstreamTlsContext::decode(any.value.as_slice()).expect("decodes");
        assert_eq!(
            ctx.require_client_certificate,
            Some(BoolValue { value: true })
        );
        let common = ctx.common_tls_context.expect("common");
        assert_eq!(
            sans(&common),
            vec![Some(MatchPattern::Prefix(
                "spiffe://blue.meshplane.local/".into()
            ))]
        );
        assert_eq!(common.tls_params, Some(mesh_tls_params()));
    }

    #[test]
    fn inbound_chains_per_mode() {
        let peers = |mode, sds| {
            inbound_chain_plan(mode, sds)
                .iter()
                .map(|c| c.peer)
                .collect::<Vec<_>>()
        };
        assert_eq!(peers(MtlsMode::Strict, true), [InboundPeer::Mtls]);
        assert!(
            peers(MtlsMode::Strict, false).is_empty(),
            "STRICT without a certificate is closed"
        );
        assert_eq!(
            peers(MtlsMode::Permissive, true),
            [
                InboundPeer::Mtls,
                InboundPeer::PassthroughTls,
                InboundPeer::Plaintext
            ]
        );
        assert_eq!(peers(MtlsMode::Permissive, false), [InboundPeer::Plaintext]);
        assert_eq!(peers(MtlsMode::Disable, true), [InboundPeer::Plaintext]);
        // Within PERMISSIVE only the mesh's ALPN selects mutual TLS.
        let permissive = inbound_chain_plan(MtlsMode::Permissive, true);
        assert_eq!(permissive[0].application_protocols, MESH_SERVER_ALPN);
        assert!(permissive[1].application_protocols.is_empty());
        assert!(!inbound_chain_plan(MtlsMode::Disable, true)[0].inspects_tls());
    }
}
