//! Telemetry of a workload's proxy: what the tenant's `Telemetry` objects and the revision's
//! access log switch ask for ([`meshplane_crds::telemetry::effective`]), as Envoy config.
//!
//! - Access logs: a file log per provider on the HTTP connection managers and TCP proxies of
//!   each side (inbound: server, outbound and gateways: client), in Istio's default format as
//!   text or JSON, behind Envoy's CEL filter when the Telemetry has one.
//! - Request metrics: Envoy's stats access logger on each HTTP connection manager counts
//!   `istio_requests_total` and records `istio_request_duration_milliseconds` (Envoy prefixes
//!   both with `envoy_`; the sidecar PodMonitor renames them) with Istio's labels: what the
//!   proxy knows of itself as constants, the peer as Envoy sees it per request (the endpoint's
//!   workload from its EDS `hostname`, the cluster's service from cluster metadata, the peer's
//!   certificate, the response code).
//!
//! Maps in Envoy's protos are hash maps, encoded in no fixed order; resources are versioned by
//! their encoding, so everything here is encoded in one order: metadata with one key of one
//! field, and the JSON log format through [`sorted`] messages of the same wire format.
//!
//! EnvoyFilters are applied afterwards, so they can still change all of it.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::accesslog::v3::access_log::ConfigType as AccessLogConfigType;
use envoy_types::pb::envoy::config::accesslog::v3::access_log_filter::FilterSpecifier;
use envoy_types::pb::envoy::config::accesslog::v3::{
    extension_filter, AccessLog, AccessLogFilter, ExtensionFilter,
};
use envoy_types::pb::envoy::config::core::v3::substitution_format_string::Format;
use envoy_types::pb::envoy::config::core::v3::{
    data_source, DataSource, Metadata, SubstitutionFormatString,
};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::listener::v3::Filter;
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::file_access_log::AccessLogFormat;
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
use envoy_types::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
use envoy_types::pb::envoy::extensions::access_loggers::stats::v3::config::{
    histogram, Counter, Histogram, Stat, Tag,
};
use envoy_types::pb::envoy::extensions::access_loggers::stats::v3::Config as StatsLogConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::r#type::v3::Scope;
use envoy_types::pb::google::protobuf::{value::Kind, Any, Struct, Value};
use envoy_types::util::pack_any;
use meshplane_crds::controlplane::AccessLogEncoding;
use meshplane_crds::telemetry::{
    self, Defaults, EffectiveMetrics, EffectiveTelemetry, LogSink, Side, Telemetry, ENVOY_PROVIDER,
    PROMETHEUS_PROVIDER,
};
use envoy_types::pb::envoy::config::core::v3::grpc_service::{EnvoyGrpc, TargetSpecifier};
use envoy_types::pb::envoy::config::core::v3::GrpcService;
use envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType as TracerConfig;
use envoy_types::pb::envoy::config::trace::v3::tracing::Http as TracerProvider;
use envoy_types::pb::envoy::config::trace::v3::OpenTelemetryConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing as HcmTracing;
use envoy_types::pb::envoy::r#type::tracing::v3::{custom_tag, CustomTag as EnvoyCustomTag};
use envoy_types::pb::envoy::r#type::v3::Percent;
use meshplane_crds::providers::{parse_service, OpenTelemetryProvider, ProviderKind};
use meshplane_crds::telemetry::{CustomTag, EffectiveTracing};
use prost::{Message, Name};

use super::cluster_id::HostPort;
use super::cluster_id::OutboundCluster;
use super::envoy::filter_name::{HTTP_CONNECTION_MANAGER, TCP_PROXY};
use super::finding::Finding;
use super::registry::{Registry, ServiceModel, ServiceSource};
use super::Translated;
use crate::model::{ProxyKind, ProxyNode};

/// Where access logs go unless `accessLogging.path` says otherwise.
pub const DEFAULT_PATH: &str = "/dev/stdout";

/// The metadata namespace of what meshplane tells a proxy about endpoints and clusters (the
/// workload behind an endpoint, the service of a cluster), read by the request metrics.
pub const METADATA_NAMESPACE: &str = "meshplane";

/// The stats scope of the request metrics: Envoy names them `envoy_istio_*` in Prometheus.
pub const METRICS_SCOPE: &str = "istio";
/// The request counter, in the scope.
pub const REQUESTS_TOTAL: &str = "requests_total";
/// The request duration histogram, in the scope.
pub const REQUEST_DURATION: &str = "request_duration_milliseconds";

/// Istio's default access log format, as a line of text (the field order of Istio's
/// `EnvoyTextLogFormat`).
pub const TEXT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n";

/// Istio's default access log fields as a JSON object: (key, command operator).
pub const JSON_FIELDS: &[(&str, &str)] = &[
    ("start_time", "%START_TIME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    (
        "connection_termination_details",
        "%CONNECTION_TERMINATION_DETAILS%",
    ),
    (
        "upstream_transport_failure_reason",
        "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    ),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration", "%DURATION%"),
    (
        "upstream_service_time",
        "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    ),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    ("route_name", "%ROUTE_NAME%"),
];

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// Metadata with one field under [`METADATA_NAMESPACE`] (one key: one encoding).
fn metadata(key: &str, value: &str) -> Metadata {
    Metadata {
        filter_metadata: [(
            METADATA_NAMESPACE.to_string(),
            Struct {
                fields: [(key.to_string(), string_value(value))].into(),
            },
        )]
        .into(),
        ..Default::default()
    }
}

/// Messages of the same wire format as Envoy's, whose maps are encoded in sorted order.
mod sorted {
    use envoy_types::pb::google::protobuf::Value;

    /// `google.protobuf.Struct`, its entries in order.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Struct {
        #[prost(message, repeated, tag = "1")]
        pub fields: Vec<Entry>,
    }

    /// One entry of a `Struct`'s `fields` map.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Entry {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Value>,
    }

    /// `SubstitutionFormatString` with `json_format`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct JsonFormat {
        #[prost(message, optional, tag = "2")]
        pub json_format: Option<Struct>,
    }

    /// `envoy.extensions.access_loggers.file.v3.FileAccessLog` with `log_format`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FileAccessLog {
        #[prost(string, tag = "1")]
        pub path: String,
        #[prost(message, optional, tag = "5")]
        pub log_format: Option<JsonFormat>,
    }
}

/// The proxy's own workload name, as its metrics carry it: the sidecar's environment
/// variable [`telemetry::WORKLOAD_ENV`], which the injector sets from the pod's owner (so the
/// configuration of a Deployment's pods, and of every other pod of the scope, stays one).
fn own_workload() -> String {
    format!("%ENVIRONMENT({})%", telemetry::WORKLOAD_ENV)
}

/// The Telemetries that apply to the proxy's workload, least specific first.
pub fn applicable<'a>(registry: &'a Registry, node: &ProxyNode) -> Vec<&'a Telemetry> {
    telemetry::applicable(
        &registry.telemetries,
        &registry.control_namespace,
        &node.namespace,
        &node.labels,
    )
}

/// What the Telemetries and the revision's access log switch decide for the proxy.
pub fn effective_for(registry: &Registry, node: &ProxyNode) -> EffectiveTelemetry {
    telemetry::effective(
        &applicable(registry, node),
        Defaults {
            access_logging: registry.mesh_config.access_logging.enabled,
        },
    )
}

/// What of the proxy its telemetry config depends on, besides the registry: the Telemetries
/// that apply (by namespace and name), its workload's identity and the Services selecting it
/// by port (labels of its metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TelemetryKey {
    applied: Vec<(Option<String>, Option<String>)>,
    service_account: Option<String>,
    inbound_services: BTreeMap<u32, InboundService>,
    tracing_service: Option<String>,
}

/// The Service a workload serves on one port: (hostname, name, namespace).
pub type InboundService = (String, String, String);

/// The [`TelemetryKey`] of a proxy.
pub fn key(registry: &Registry, node: &ProxyNode) -> TelemetryKey {
    TelemetryKey {
        applied: applicable(registry, node)
            .into_iter()
            .map(|t| (t.metadata.namespace.clone(), t.metadata.name.clone()))
            .collect(),
        service_account: node.service_account.clone(),
        inbound_services: inbound_services(registry, node),
        tracing_service: {
            let eff = effective_for(registry, node);
            Side::BOTH
                .iter()
                .any(|side| tracer_of(registry, eff.tracing(*side)).is_some())
                .then(|| tracing_service_name(node))
        },
    }
}

/// An `opentelemetry` provider of the tenant, resolved to the cluster of its host and port.
#[derive(Clone, Debug, PartialEq)]
pub struct Tracer<'a> {
    /// Its name in `meshConfig.extensionProviders`.
    pub name: String,
    /// Its settings.
    pub settings: &'a OpenTelemetryProvider,
    /// The host its service names in the registry.
    pub service: &'a ServiceModel,
    /// Its port.
    pub port: u32,
}

impl Tracer<'_> {
    /// The outbound cluster the proxy exports spans through.
    pub fn cluster(&self) -> String {
        HostPort::new(&self.service.hostname, self.port).cluster_name()
    }
}

/// Resolves tracing provider `name` in the tenant's mesh config and registry, as external
/// authorizers are: an `opentelemetry` provider whose `service` is a host of the tenant's
/// registry with that port. `Err` says why it cannot be used.
pub fn resolve_tracer<'a>(registry: &'a Registry, name: &str) -> Result<Tracer<'a>, String> {
    let Some(provider) = registry.mesh_config.extension_provider(name) else {
        return Err(format!(
            "no extension provider {name:?} is declared in the revision's meshConfig.extensionProviders"
        ));
    };
    let settings = match provider.kind() {
        Some(ProviderKind::OpenTelemetry(o)) => o,
        Some(other) => {
            return Err(format!(
                "extension provider {name:?} is of kind {}, not a tracing provider (opentelemetry)",
                other.field()
            ))
        }
        None => return Err(format!("extension provider {name:?} is invalid")),
    };
    if settings.http.is_some() {
        return Err(format!(
            "extension provider {name:?} exports over HTTP; meshplane exports spans over gRPC (leave `http` out)"
        ));
    }
    let parsed = parse_service(&settings.service, "service")
        .map_err(|e| format!("extension provider {name:?}: {e}"))?;
    let found = registry.services_named(&parsed.host).find(|s| {
        parsed
            .namespace
            .as_deref()
            .is_none_or(|ns| s.namespace == ns)
    });
    let Some(service) = found else {
        return Err(format!(
            "extension provider {name:?} names {:?}, which is no Service or ServiceEntry host of the tenant",
            settings.service
        ));
    };
    if !service.ports.iter().any(|p| p.port == settings.port) {
        return Err(format!(
            "extension provider {name:?}: {} has no port {}",
            service.hostname, settings.port
        ));
    }
    Ok(Tracer {
        name: name.to_string(),
        settings,
        service,
        port: settings.port,
    })
}

/// The name of the tracing provider of one side: the one the Telemetries name, else the
/// revision's `meshConfig.defaultProviders.tracing` (Istio's default), else none.
pub fn tracing_provider<'a>(
    registry: &'a Registry,
    tracing: &'a EffectiveTracing,
) -> Option<&'a str> {
    tracing.provider.as_deref().or_else(|| {
        registry
            .mesh_config
            .default_providers
            .as_ref()
            .and_then(|d| d.tracing.first())
            .map(String::as_str)
    })
}

/// The tracer of one side, when it has a provider that resolves.
pub fn tracer_of<'a>(registry: &'a Registry, tracing: &'a EffectiveTracing) -> Option<Tracer<'a>> {
    resolve_tracer(registry, tracing_provider(registry, tracing)?).ok()
}

/// The tracers of both sides of the proxy that resolve, by cluster (for the clusters the
/// proxy needs whatever its outbound scope).
pub fn tracers<'a>(registry: &'a Registry, node: &ProxyNode) -> Vec<Tracer<'a>> {
    let eff = effective_for(registry, node);
    let mut out: Vec<Tracer<'a>> = Vec::new();
    for side in Side::BOTH {
        let Some(name) = tracing_provider(registry, eff.tracing(side)) else {
            continue;
        };
        if let Ok(t) = resolve_tracer(registry, name) {
            if !out.iter().any(|o| o.cluster() == t.cluster()) {
                out.push(t);
            }
        }
    }
    out
}

/// The `service.name` of the proxy's spans, as Istio names it: the workload's canonical
/// name (label `service.istio.io/canonical-name`, else `app.kubernetes.io/name`, else `app`,
/// else the pod's name) and its namespace, `<name>.<namespace>`.
pub fn tracing_service_name(node: &ProxyNode) -> String {
    let name = [
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ]
    .iter()
    .find_map(|k| node.labels.get(*k).filter(|v| !v.is_empty()))
    .cloned()
    .or_else(|| node.pod_name.clone())
    .unwrap_or_else(|| "unknown".to_string());
    format!("{name}.{}", node.namespace)
}

fn custom_tag(tag: &str, value: &CustomTag) -> Option<EnvoyCustomTag> {
    let r#type = if let Some(l) = &value.literal {
        custom_tag::Type::Literal(custom_tag::Literal {
            value: l.value.clone(),
        })
    } else if let Some(e) = &value.environment {
        custom_tag::Type::Environment(custom_tag::Environment {
            name: e.name.clone(),
            default_value: e.default_value.clone().unwrap_or_default(),
        })
    } else if let Some(h) = &value.header {
        custom_tag::Type::RequestHeader(custom_tag::Header {
            name: h.name.clone(),
            default_value: h.default_value.clone().unwrap_or_default(),
        })
    } else {
        return None;
    };
    Some(EnvoyCustomTag {
        tag: tag.to_string(),
        r#type: Some(r#type),
    })
}

/// The HTTP connection manager's tracing of one side, or `None` when the side has no tracing
/// provider that resolves. As Istio: `randomSamplingPercentage` is Envoy's random sampling,
/// client and overall sampling stay 100%; `disableSpanReporting` keeps the tracing settings
/// (request ids, context propagation) without a tracer; custom tags in tag-name order.
pub fn hcm_tracing(
    registry: &Registry,
    node: &ProxyNode,
    tracing: &EffectiveTracing,
) -> Option<HcmTracing> {
    let tracer = tracer_of(registry, tracing)?;
    let provider = (!tracing.disable_span_reporting).then(|| TracerProvider {
        name: "envoy.tracers.opentelemetry".to_string(),
        config_type: Some(TracerConfig::TypedConfig(pack_any(OpenTelemetryConfig {
            grpc_service: Some(GrpcService {
                target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                    cluster_name: tracer.cluster(),
                    authority: format!("{}:{}", tracer.service.hostname, tracer.port),
                    ..Default::default()
                })),
                ..Default::default()
            }),
            service_name: tracing_service_name(node),
            ..Default::default()
        }))),
    });
    let percent = |value: f64| Some(Percent { value });
    Some(HcmTracing {
        client_sampling: percent(100.0),
        random_sampling: percent(tracing.sampling),
        overall_sampling: percent(100.0),
        max_path_tag_length: tracer
            .settings
            .max_tag_length
            .map(|value| envoy_types::pb::google::protobuf::UInt32Value { value }),
        custom_tags: tracing
            .custom_tags
            .iter()
            .filter_map(|(k, v)| custom_tag(k, v))
            .collect(),
        provider,
        ..Default::default()
    })
}

/// Which side of the workload a connection manager or TCP proxy serves, by its stat prefix
/// (inbound ones are `inbound|<port>||`).
fn side_of(stat_prefix: &str) -> Side {
    if stat_prefix.starts_with("inbound") {
        Side::Server
    } else {
        Side::Client
    }
}

/// The file access log of one sink.
fn file_log(registry: &Registry, sink: &LogSink) -> Option<AccessLog> {
    if sink.provider != ENVOY_PROVIDER {
        return None;
    }
    let settings = &registry.mesh_config.access_logging;
    let path = settings
        .path
        .clone()
        .unwrap_or_else(|| DEFAULT_PATH.to_string());
    let typed_config = match settings.encoding {
        AccessLogEncoding::Text => pack_any(FileAccessLog {
            path,
            access_log_format: Some(AccessLogFormat::LogFormat(SubstitutionFormatString {
                format: Some(Format::TextFormatSource(DataSource {
                    specifier: Some(data_source::Specifier::InlineString(
                        TEXT_FORMAT.to_string(),
                    )),
                    ..Default::default()
                })),
                ..Default::default()
            })),
        }),
        AccessLogEncoding::Json => {
            let mut fields: Vec<sorted::Entry> = JSON_FIELDS
                .iter()
                .map(|(k, v)| sorted::Entry {
                    key: k.to_string(),
                    value: Some(string_value(v)),
                })
                .collect();
            fields.sort_by(|a, b| a.key.cmp(&b.key));
            let log = sorted::FileAccessLog {
                path,
                log_format: Some(sorted::JsonFormat {
                    json_format: Some(sorted::Struct { fields }),
                }),
            };
            Any {
                type_url: format!("type.googleapis.com/{}", FileAccessLog::full_name()),
                value: log.encode_to_vec(),
            }
        }
    };
    Some(AccessLog {
        name: "envoy.access_loggers.file".to_string(),
        filter: sink.filter.as_ref().map(|expression| AccessLogFilter {
            filter_specifier: Some(FilterSpecifier::ExtensionFilter(ExtensionFilter {
                name: "envoy.access_loggers.extension_filters.cel".to_string(),
                config_type: Some(extension_filter::ConfigType::TypedConfig(pack_any(
                    ExpressionFilter {
                        expression: expression.clone(),
                        ..Default::default()
                    },
                ))),
            })),
        }),
        config_type: Some(AccessLogConfigType::TypedConfig(typed_config)),
    })
}

/// Escapes `%` for a command-operator format string.
fn literal(s: &str) -> String {
    s.replace('%', "%%")
}

/// The labels of the request metrics of one side, as (name, format) pairs, before overrides.
fn metric_labels(
    registry: &Registry,
    node: &ProxyNode,
    side: Side,
    inbound_port: Option<u32>,
) -> Vec<(String, String)> {
    let me = own_workload();
    let my_ns = literal(&node.namespace);
    let my_principal = node
        .service_account
        .as_ref()
        .map(|sa| {
            literal(&format!(
                "spiffe://{}/ns/{}/sa/{sa}",
                registry.trust_domain(),
                node.namespace
            ))
        })
        .unwrap_or_else(|| "unknown".to_string());
    let pairs: Vec<(&str, String)> = match side {
        Side::Client => vec![
            ("reporter", "source".into()),
            ("source_workload", me),
            ("source_workload_namespace", my_ns),
            ("source_principal", my_principal),
            // `<workload>.<namespace>` (the endpoint's hostname), or its address when the
            // instance does not know its pod: split or replaced by the PodMonitor.
            ("destination_workload", "%UPSTREAM_HOST_NAME%".into()),
            ("destination_principal", "%UPSTREAM_PEER_URI_SAN%".into()),
            (
                "destination_service",
                format!("%CLUSTER_METADATA({METADATA_NAMESPACE}:service)%"),
            ),
            ("response_code", "%RESPONSE_CODE%".into()),
            ("response_flags", "%RESPONSE_FLAGS%".into()),
        ],
        Side::Server => {
            let service = inbound_port.and_then(|p| inbound_services(registry, node).remove(&p));
            let (host, name, ns) = match service {
                Some((h, n, ns)) => (literal(&h), literal(&n), literal(&ns)),
                None => ("unknown".into(), "unknown".into(), "unknown".into()),
            };
            vec![
                ("reporter", "destination".into()),
                ("source_workload", "unknown".into()),
                ("source_workload_namespace", "unknown".into()),
                ("source_principal", "%DOWNSTREAM_PEER_URI_SAN%".into()),
                ("destination_workload", me),
                ("destination_workload_namespace", my_ns),
                ("destination_principal", my_principal),
                ("destination_service", host),
                ("destination_service_name", name),
                ("destination_service_namespace", ns),
                ("response_code", "%RESPONSE_CODE%".into()),
                ("response_flags", "%RESPONSE_FLAGS%".into()),
            ]
        }
    };
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The Services of the proxy's namespace selecting its workload, by service port (the first
/// by hostname where several do).
pub fn inbound_services(registry: &Registry, node: &ProxyNode) -> BTreeMap<u32, InboundService> {
    let mut out = BTreeMap::new();
    for s in &registry.services {
        let ServiceSource::Kubernetes { selector } = &s.source else {
            continue;
        };
        let selects =
            !selector.is_empty() && selector.iter().all(|(k, v)| node.labels.get(k) == Some(v));
        if s.namespace != node.namespace || !selects {
            continue;
        }
        for p in &s.ports {
            out.entry(p.port).or_insert_with(|| {
                (
                    s.hostname.clone(),
                    s.short_name.clone().unwrap_or_default(),
                    s.namespace.clone(),
                )
            });
        }
    }
    out
}

/// Envoy's stats access logger counting and timing requests, or `None` when both metrics are
/// off for the side.
fn metrics_log(labels: Vec<(String, String)>, metrics: &EffectiveMetrics) -> Option<AccessLog> {
    if metrics.count_disabled && metrics.duration_disabled {
        return None;
    }
    let mut labels: BTreeMap<String, String> = labels.into_iter().collect();
    for (tag, value) in &metrics.tags {
        match value {
            Some(v) => {
                labels.insert(tag.clone(), literal(v));
            }
            None => {
                labels.remove(tag);
            }
        }
    }
    let tags: Vec<Tag> = labels
        .into_iter()
        .map(|(name, value_format)| Tag {
            name,
            value_format,
            ..Default::default()
        })
        .collect();
    let stat = |name: &str| Stat {
        name: name.to_string(),
        tags: tags.clone(),
    };
    #[allow(deprecated)]
    let config = StatsLogConfig {
        stats_scope: Some(Scope {
            prefix: METRICS_SCOPE.to_string(),
            ..Default::default()
        }),
        counters: if metrics.count_disabled {
            Vec::new()
        } else {
            vec![Counter {
                stat: Some(stat(REQUESTS_TOTAL)),
                value_fixed: Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 }),
                ..Default::default()
            }]
        },
        histograms: if metrics.duration_disabled {
            Vec::new()
        } else {
            vec![Histogram {
                stat: Some(stat(REQUEST_DURATION)),
                unit: histogram::Unit::Milliseconds as i32,
                value_format: "%DURATION%".to_string(),
            }]
        },
        ..Default::default()
    };
    Some(AccessLog {
        name: "envoy.access_loggers.stats".to_string(),
        config_type: Some(AccessLogConfigType::TypedConfig(pack_any(config))),
        ..Default::default()
    })
}

/// The inbound service port of an `inbound|<port>||` stat prefix.
fn inbound_port(stat_prefix: &str) -> Option<u32> {
    stat_prefix
        .strip_prefix("inbound|")?
        .split('|')
        .next()?
        .parse()
        .ok()
}

fn add_to_filter(registry: &Registry, node: &ProxyNode, eff: &EffectiveTelemetry, f: &mut Filter) {
    let Some(ConfigType::TypedConfig(any)) = &mut f.config_type else {
        return;
    };
    let logs = |side: Side| -> Vec<AccessLog> {
        eff.logs(side)
            .iter()
            .filter_map(|s| file_log(registry, s))
            .collect()
    };
    if f.name == HTTP_CONNECTION_MANAGER {
        if let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) {
            let side = side_of(&hcm.stat_prefix);
            hcm.access_log.extend(logs(side));
            if let Some(tracing) = hcm_tracing(registry, node, eff.tracing(side)) {
                hcm.tracing = Some(tracing);
            }
            if node.kind != ProxyKind::Grpc {
                let labels = metric_labels(registry, node, side, inbound_port(&hcm.stat_prefix));
                hcm.access_log
                    .extend(metrics_log(labels, eff.metrics(side)));
            }
            any.value = hcm.encode_to_vec();
        }
    } else if f.name == TCP_PROXY {
        if let Ok(mut tcp) = TcpProxy::decode(any.value.as_slice()) {
            tcp.access_log.extend(logs(side_of(&tcp.stat_prefix)));
            any.value = tcp.encode_to_vec();
        }
    }
}

/// Marks each outbound cluster with its service (what the clients' request metrics read as
/// `destination_service`).
pub fn mark_clusters(out: &mut Translated) {
    for c in &mut out.clusters {
        let Some(id) = OutboundCluster::parse(&c.name) else {
            continue;
        };
        let marks = metadata("service", &id.service.host);
        c.metadata
            .get_or_insert_with(Default::default)
            .filter_metadata
            .extend(marks.filter_metadata);
    }
}

/// Adds the proxy's access logs and request metrics to its listeners.
pub fn apply(registry: &Registry, node: &ProxyNode, out: &mut Translated) {
    let eff = effective_for(registry, node);
    for l in &mut out.listeners {
        for chain in &mut l.filter_chains {
            for f in &mut chain.filters {
                add_to_filter(registry, node, &eff, f);
            }
        }
    }
    mark_clusters(out);
}

/// Why a Telemetry does not (fully) apply: providers the tenant does not have, and a second
/// Telemetry of one level (Istio allows one per namespace without a selector; the oldest
/// counts).
pub fn diagnose(registry: &Registry, t: &Telemetry) -> Vec<Finding> {
    let mut findings = Vec::new();
    let known_log = |name: &str| name == ENVOY_PROVIDER;
    for (i, a) in t.spec.access_logging.iter().enumerate() {
        for p in &a.providers {
            if !known_log(&p.name) {
                findings.push(Finding {
                    reason: "ProviderNotFound",
                    message: format!(
                        "spec.accessLogging[{i}]: provider {:?} is neither the built-in {ENVOY_PROVIDER:?} nor an access log provider of the revision's meshConfig.extensionProviders",
                        p.name
                    ),
                });
            }
        }
    }
    for (i, m) in t.spec.metrics.iter().enumerate() {
        for p in &m.providers {
            if p.name != PROMETHEUS_PROVIDER {
                findings.push(Finding {
                    reason: "ProviderNotFound",
                    message: format!(
                        "spec.metrics[{i}]: provider {:?} is not supported; meshplane's request metrics go to {PROMETHEUS_PROVIDER:?}",
                        p.name
                    ),
                });
            }
        }
    }
    for (i, tr) in t.spec.tracing.iter().enumerate() {
        if let Some(p) = tr.providers.first() {
            if let Err(why) = resolve_tracer(registry, &p.name) {
                findings.push(Finding {
                    reason: "ProviderNotFound",
                    message: format!("spec.tracing[{i}]: {why}"),
                });
            }
        }
    }
    let selectorless = |x: &Telemetry| {
        x.spec
            .selector
            .as_ref()
            .is_none_or(|s| s.match_labels.is_empty())
    };
    if selectorless(t) {
        let ns = t.metadata.namespace.as_deref();
        let older = registry.telemetries.iter().find(|o| {
            o.metadata.namespace.as_deref() == ns
                && selectorless(o)
                && (&o.metadata.creation_timestamp, &o.metadata.name)
                    < (&t.metadata.creation_timestamp, &t.metadata.name)
        });
        if let Some(o) = older {
            findings.push(Finding {
                reason: "Conflict",
                message: format!(
                    "Telemetry {:?} already applies to this whole namespace (one Telemetry without a selector per namespace; the oldest counts): merge this one into it",
                    o.metadata.name.as_deref().unwrap_or_default()
                ),
            });
        }
    }
    findings
}
