//! DestinationRule traffic policies on clusters: load balancing, connection pools (circuit
//! breakers), outlier detection and upstream TLS, as Istio maps them to Envoy.
//!
//! Each function takes the cluster translation already built and adds one policy to it, so the
//! cluster shape (EDS, STATIC, DNS) stays the outbound module's decision.

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ring_hash_lb_config::HashFunction, ClusterDiscoveryType, CommonLbConfig, DiscoveryType,
    LbConfig, LbPolicy, LeastRequestLbConfig, MaglevLbConfig, RingHashLbConfig,
    RoundRobinLbConfig, SlowStartConfig,
};
use envoy_types::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds, CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlier,
    UpstreamConnectionOptions,
};
use envoy_types::pb::envoy::config::core::v3::data_source::Specifier as DataSpecifier;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as SocketConfig;
use envoy_types::pb::envoy::config::core::v3::{
    DataSource, HttpProtocolOptions as CommonHttpOptions, Http1ProtocolOptions,
    Http2ProtocolOptions, TcpKeepalive, TransportSocket,
};
use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy::{
    ConnectionProperties, Cookie, Header, PolicySpecifier, QueryParameter,
};
use envoy_types::pb::envoy::config::route::v3::route_action::HashPolicy;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::subject_alt_name_matcher::SanType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, TlsCertificate,
    UpstreamTlsContext,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    ExplicitHttpConfig, UpstreamProtocolOptions, UseDownstreamHttpConfig,
};
use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher;
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{UInt32Value, UInt64Value};
use envoy_types::util::pack_any;
use meshplane_crds::networking::destination_rule::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, ConsistentHashLb,
    H2UpgradePolicy, LoadBalancerSettings, OutlierDetection, SimpleLb,
};

use super::envoy::{duration, filter_name};
use super::traffic::EffectivePolicy;

/// Where upstream TLS finds the system's trusted roots when a rule names no CA.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Name of the TLS transport socket.
pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

/// Name of the plaintext transport socket.
pub const RAW_BUFFER_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.raw_buffer";

/// What a policy could not apply to a cluster (never a crash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyIssue {
    /// `ISTIO_MUTUAL` for a proxy that holds no workload certificate (a proxyless gRPC client):
    /// its cluster stays plaintext, which a `STRICT` server refuses.
    NoWorkloadCertificate,
}

/// The tenant's mutual TLS as a proxy can originate it: the trust domain, when the proxy holds
/// a workload certificate (node metadata `SDS=true`, contract 11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshTls<'a> {
    pub trust_domain: &'a str,
}

/// Applies the effective policy to a cluster, given whether its port speaks HTTP/2 upstream and
/// the proxy's mutual TLS (`None`: it holds no workload certificate).
pub fn apply(
    cluster: &mut Cluster,
    policy: &EffectivePolicy,
    http2: bool,
    mesh: Option<MeshTls<'_>>,
) -> Vec<PolicyIssue> {
    let mut issues = Vec::new();
    if let Some(lb) = &policy.load_balancer {
        load_balancer(cluster, lb);
    }
    if let Some(cp) = &policy.connection_pool {
        connection_pool(cluster, cp);
    }
    http_options(cluster, policy.connection_pool.as_ref(), http2);
    if let Some(od) = &policy.outlier_detection {
        outlier_detection(cluster, od);
    }
    if let Some(tls) = &policy.tls {
        if let Err(issue) = upstream_tls(cluster, tls, mesh) {
            issues.push(issue);
        }
    }
    issues
}

fn load_balancer(cluster: &mut Cluster, lb: &LoadBalancerSettings) {
    let slow_start = lb.warmup_duration_secs.as_ref().map(|d| SlowStartConfig {
        slow_start_window: Some(duration(d.get())),
        ..Default::default()
    });
    if let Some(ch) = &lb.consistent_hash {
        if let Some(maglev) = &ch.maglev {
            cluster.lb_policy = LbPolicy::Maglev as i32;
            cluster.lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig {
                table_size: maglev.table_size.map(|value| UInt64Value { value }),
            }));
        } else {
            cluster.lb_policy = LbPolicy::RingHash as i32;
            let min = ch
                .ring_hash
                .as_ref()
                .and_then(|r| r.minimum_ring_size)
                .or(ch.minimum_ring_size);
            cluster.lb_config = Some(LbConfig::RingHashLbConfig(RingHashLbConfig {
                minimum_ring_size: min.map(|value| UInt64Value { value }),
                hash_function: HashFunction::XxHash as i32,
                ..Default::default()
            }));
        }
        return;
    }
    match lb.simple {
        Some(SimpleLb::LeastConn) | Some(SimpleLb::LeastRequest) => {
            cluster.lb_policy = LbPolicy::LeastRequest as i32;
            cluster.lb_config = slow_start.map(|s| {
                LbConfig::LeastRequestLbConfig(LeastRequestLbConfig {
                    slow_start_config: Some(s),
                    ..Default::default()
                })
            });
        }
        Some(SimpleLb::Random) => cluster.lb_policy = LbPolicy::Random as i32,
        Some(SimpleLb::Passthrough) => {
            // Istio's PASSTHROUGH: forward to the address the client asked for.
            cluster.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32,
            ));
            cluster.lb_policy = LbPolicy::ClusterProvided as i32;
            cluster.eds_cluster_config = None;
            cluster.load_assignment = None;
        }
        Some(SimpleLb::RoundRobin) | Some(SimpleLb::Unspecified) | None => {
            cluster.lb_policy = LbPolicy::RoundRobin as i32;
            cluster.lb_config = slow_start.map(|s| {
                LbConfig::RoundRobinLbConfig(RoundRobinLbConfig {
                    slow_start_config: Some(s),
                })
            });
        }
    }
}

/// The route hash policy of a consistent-hash rule (Envoy hashes on the route, balances on the
/// cluster).
pub fn hash_policy(ch: &ConsistentHashLb) -> Vec<HashPolicy> {
    let specifier = if let Some(h) = &ch.http_header_name {
        PolicySpecifier::Header(Header {
            header_name: h.clone(),
            ..Default::default()
        })
    } else if let Some(c) = &ch.http_cookie {
        PolicySpecifier::Cookie(Cookie {
            name: c.name.clone(),
            path: c.path.clone(),
            ttl: c.ttl.as_ref().map(|t| duration(t.get())),
            ..Default::default()
        })
    } else if ch.use_source_ip == Some(true) {
        PolicySpecifier::ConnectionProperties(ConnectionProperties { source_ip: true })
    } else if let Some(q) = &ch.http_query_parameter_name {
        PolicySpecifier::QueryParameter(QueryParameter { name: q.clone() })
    } else {
        return Vec::new();
    };
    vec![HashPolicy {
        policy_specifier: Some(specifier),
        terminal: false,
    }]
}

fn connection_pool(cluster: &mut Cluster, cp: &ConnectionPoolSettings) {
    // Istio's defaults: unlimited unless the rule says otherwise.
    let limit = |v: Option<u32>| {
        Some(UInt32Value {
            value: v.unwrap_or(u32::MAX),
        })
    };
    let http = cp.http.as_ref();
    cluster.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![Thresholds {
            max_connections: limit(cp.tcp.as_ref().and_then(|t| t.max_connections)),
            max_pending_requests: limit(http.and_then(|h| h.http1_max_pending_requests)),
            max_requests: limit(http.and_then(|h| h.http2_max_requests)),
            max_retries: limit(http.and_then(|h| h.max_retries)),
            track_remaining: true,
            ..Default::default()
        }],
        ..Default::default()
    });
    if let Some(tcp) = &cp.tcp {
        if let Some(t) = &tcp.connect_timeout {
            cluster.connect_timeout = Some(duration(t.get()));
        }
        if let Some(ka) = &tcp.tcp_keepalive {
            let secs = |d: &Option<meshplane_crds::duration::Duration>| {
                d.as_ref().map(|d| UInt32Value {
                    value: u32::try_from(d.get().as_secs()).unwrap_or(u32::MAX).max(1),
                })
            };
            cluster.upstream_connection_options = Some(UpstreamConnectionOptions {
                tcp_keepalive: Some(TcpKeepalive {
                    keepalive_probes: ka.probes.map(|value| UInt32Value { value }),
                    keepalive_time: secs(&ka.time),
                    keepalive_interval: secs(&ka.interval),
                }),
                ..Default::default()
            });
        }
    }
}

/// The upstream HTTP protocol options: HTTP/2 for HTTP/2 ports (or an `UPGRADE` policy), the
/// client's protocol with `useClientProtocol`, and the connection pool's HTTP limits.
fn http_options(cluster: &mut Cluster, cp: Option<&ConnectionPoolSettings>, http2_port: bool) {
    let http = cp.and_then(|c| c.http.as_ref());
    let tcp = cp.and_then(|c| c.tcp.as_ref());
    let upgrade = http.and_then(|h| h.h2_upgrade_policy);
    let h2 = match upgrade {
        Some(H2UpgradePolicy::Upgrade) => true,
        Some(H2UpgradePolicy::DoNotUpgrade) => false,
        _ => http2_port,
    };
    let http2_options = Http2ProtocolOptions {
        max_concurrent_streams: http
            .and_then(|h| h.max_concurrent_streams)
            .map(|value| UInt32Value { value }),
        ..Default::default()
    };
    let upstream = if http.and_then(|h| h.use_client_protocol) == Some(true) {
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(
            UseDownstreamHttpConfig {
                http_protocol_options: Some(Http1ProtocolOptions::default()),
                http2_protocol_options: Some(http2_options),
                ..Default::default()
            },
        ))
    } else if h2 {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(http2_options)),
            },
        ))
    } else {
        None
    };
    let common = CommonHttpOptions {
        idle_timeout: http
            .and_then(|h| h.idle_timeout.as_ref())
            .map(|d| duration(d.get())),
        max_connection_duration: tcp
            .and_then(|t| t.max_connection_duration.as_ref())
            .map(|d| duration(d.get())),
        max_requests_per_connection: http
            .and_then(|h| h.max_requests_per_connection)
            .map(|value| UInt32Value { value }),
        ..Default::default()
    };
    let has_common = common != CommonHttpOptions::default();
    if upstream.is_none() && !has_common {
        cluster
            .typed_extension_protocol_options
            .remove(filter_name::HTTP_PROTOCOL_OPTIONS);
        return;
    }
    let mut options = HttpProtocolOptions {
        upstream_protocol_options: upstream,
        common_http_protocol_options: has_common.then_some(common),
        ..Default::default()
    };
    if options.upstream_protocol_options.is_none() {
        // The HTTP protocol options need a protocol: keep HTTP/1.1, as without them.
        options.upstream_protocol_options = Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                    Http1ProtocolOptions::default(),
                )),
            },
        ));
    }
    cluster.typed_extension_protocol_options.insert(
        filter_name::HTTP_PROTOCOL_OPTIONS.to_string(),
        pack_any(options),
    );
}

fn outlier_detection(cluster: &mut Cluster, od: &OutlierDetection) {
    let u32v = |v: Option<u32>| v.map(|value| UInt32Value { value });
    let mut out = EnvoyOutlier {
        interval: od.interval.as_ref().map(|d| duration(d.get())),
        base_ejection_time: od.base_ejection_time.as_ref().map(|d| duration(d.get())),
        max_ejection_percent: u32v(od.max_ejection_percent),
        // Istio ejects on consecutive errors only, never on success-rate statistics.
        enforcing_success_rate: u32v(Some(0)),
        ..Default::default()
    };
    // The deprecated field first, as Istio: gateway errors only (5xx off); the fields that
    // replace it win where set.
    if let Some(n) = od.consecutive_errors.filter(|n| *n > 0) {
        out.consecutive_gateway_failure = u32v(Some(n.unsigned_abs()));
        out.enforcing_consecutive_gateway_failure = u32v(Some(100));
        out.enforcing_consecutive_5xx = u32v(Some(0));
    }
    if let Some(n) = od.consecutive_5xx_errors {
        out.consecutive_5xx = u32v(Some(n));
        // 0 turns this detector off.
        out.enforcing_consecutive_5xx = u32v(Some(if n == 0 { 0 } else { 100 }));
    }
    if let Some(n) = od.consecutive_gateway_errors {
        out.consecutive_gateway_failure = u32v(Some(n));
        out.enforcing_consecutive_gateway_failure = u32v(Some(if n == 0 { 0 } else { 100 }));
    }
    if od.split_external_local_origin_errors == Some(true) {
        out.split_external_local_origin_errors = true;
        if let Some(n) = od.consecutive_local_origin_failures {
            out.consecutive_local_origin_failure = u32v(Some(n));
            out.enforcing_consecutive_local_origin_failure = u32v(Some(100));
        }
    }
    cluster.outlier_detection = Some(out);
    // Istio's minHealthPercent is Envoy's panic threshold; unset means 0 (never panic), so an
    // ejected endpoint stays out even when few remain.
    cluster.common_lb_config = Some(CommonLbConfig {
        healthy_panic_threshold: Some(Percent {
            value: f64::from(od.min_health_percent.unwrap_or(0)),
        }),
        ..cluster.common_lb_config.take().unwrap_or_default()
    });
}

fn file(path: &str) -> Option<DataSource> {
    (!path.is_empty()).then(|| DataSource {
        specifier: Some(DataSpecifier::Filename(path.to_string())),
        ..Default::default()
    })
}

/// SAN matchers: `spiffe://` identities and other URIs by URI, the rest by DNS name.
pub fn san_matchers(sans: &[String]) -> Vec<SubjectAltNameMatcher> {
    sans.iter()
        .map(|san| SubjectAltNameMatcher {
            san_type: if san.contains("://") {
                SanType::Uri as i32
            } else {
                SanType::Dns as i32
            },
            matcher: Some(StringMatcher {
                match_pattern: Some(MatchPattern::Exact(san.clone())),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect()
}

/// An explicit plaintext transport: what `tls.mode: DISABLE` means. Unlike no transport at all,
/// it tells automatic mutual TLS to leave the cluster alone (Istio: DISABLE is never TLS).
pub fn plaintext_transport_socket() -> TransportSocket {
    TransportSocket {
        name: RAW_BUFFER_TRANSPORT_SOCKET.to_string(),
        config_type: Some(SocketConfig::TypedConfig(pack_any(RawBuffer::default()))),
    }
}

fn upstream_tls(
    cluster: &mut Cluster,
    tls: &ClientTlsSettings,
    mesh: Option<MeshTls<'_>>,
) -> Result<(), PolicyIssue> {
    match tls.mode {
        ClientTlsMode::Disable => {
            cluster.transport_socket = Some(plaintext_transport_socket());
            return Ok(());
        }
        ClientTlsMode::IstioMutual => {
            let Some(mesh) = mesh else {
                cluster.transport_socket = None;
                return Err(PolicyIssue::NoWorkloadCertificate);
            };
            // `sni` and `subjectAltNames` of the rule narrow what the tenant's mutual TLS
            // sends and accepts (Istio's ISTIO_MUTUAL honours both).
            let sni = if tls.sni.is_empty() {
                super::mtls::outbound_sni(&cluster.name)
            } else {
                tls.sni.clone()
            };
            cluster.transport_socket = Some(super::mtls::istio_mutual_transport_socket(
                mesh.trust_domain,
                &tls.subject_alt_names,
                &sni,
            ));
            return Ok(());
        }
        ClientTlsMode::Simple | ClientTlsMode::Mutual => {}
    }
    let validation = (tls.insecure_skip_verify != Some(true)).then(|| {
        let ca = if tls.ca_certificates.is_empty() {
            SYSTEM_CA_BUNDLE
        } else {
            tls.ca_certificates.as_str()
        };
        ValidationContextType::ValidationContext(CertificateValidationContext {
            trusted_ca: file(ca),
            crl: file(&tls.ca_crl),
            match_typed_subject_alt_names: san_matchers(&tls.subject_alt_names),
            ..Default::default()
        })
    });
    let certificates = if tls.mode == ClientTlsMode::Mutual {
        vec![TlsCertificate {
            certificate_chain: file(&tls.client_certificate),
            private_key: file(&tls.private_key),
            ..Default::default()
        }]
    } else {
        Vec::new()
    };
    let context = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates: certificates,
            validation_context_type: validation,
            ..Default::default()
        }),
        sni: tls.sni.clone(),
        ..Default::default()
    };
    cluster.transport_socket = Some(TransportSocket {
        name: TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(SocketConfig::TypedConfig(pack_any(context))),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ejection(od: OutlierDetection) -> EnvoyOutlier {
        let mut cluster = Cluster::default();
        outlier_detection(&mut cluster, &od);
        cluster.outlier_detection.expect("outlier detection set")
    }

    fn value(v: Option<UInt32Value>) -> Option<u32> {
        v.map(|v| v.value)
    }

    #[test]
    fn deprecated_consecutive_errors_count_gateway_errors_only_as_istio_maps_them() {
        let out = ejection(OutlierDetection {
            consecutive_errors: Some(3),
            ..Default::default()
        });
        assert_eq!(value(out.consecutive_gateway_failure), Some(3));
        assert_eq!(value(out.enforcing_consecutive_gateway_failure), Some(100));
        assert_eq!(
            value(out.enforcing_consecutive_5xx),
            Some(0),
            "5xx not counted"
        );
        // The fields that replace it win where set.
        let out = ejection(OutlierDetection {
            consecutive_errors: Some(3),
            consecutive_gateway_errors: Some(7),
            consecutive_5xx_errors: Some(5),
            ..Default::default()
        });
        assert_eq!(value(out.consecutive_gateway_failure), Some(7));
        assert_eq!(value(out.consecutive_5xx), Some(5));
        assert_eq!(value(out.enforcing_consecutive_5xx), Some(100));
        // 0 means unset, as in Istio.
        let out = ejection(OutlierDetection {
            consecutive_errors: Some(0),
            ..Default::default()
        });
        assert_eq!(out.consecutive_gateway_failure, None);
        assert_eq!(out.enforcing_consecutive_5xx, None);
    }
}
