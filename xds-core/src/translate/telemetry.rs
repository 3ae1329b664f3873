//! Telemetry of a workload's proxy: what the tenant's `Telemetry` objects and the revision's
//! access log switch ask for ([`meshplane_crds::telemetry::effective`]), as Envoy config.
//!
//! - Access logs: one access log per provider on the HTTP connection managers and TCP proxies
//!   of each side (inbound: server, outbound and gateways: client): the built-in `envoy`
//!   provider and `envoyFileAccessLog` providers as file logs (Istio's default format as text
//!   or JSON, or the provider's `logFormat`), `envoyOtelAls` providers as Envoy's OpenTelemetry
//!   access logger to the tenant's collector; behind Envoy's CEL filter when the Telemetry has
//!   one.
//! - Request metrics: Envoy's stats access logger on each HTTP connection manager counts
//!   `istio_requests_total` and records `istio_request_duration_milliseconds`,
//!   `istio_request_bytes` and `istio_response_bytes`; on each TCP proxy it counts
//!   `istio_tcp_connections_opened_total` (when the upstream connects),
//!   `istio_tcp_connections_closed_total`, `istio_tcp_sent_bytes_total` and
//!   `istio_tcp_received_bytes_total` (when the connection ends). Envoy prefixes them with
//!   `envoy_`; the sidecar PodMonitor renames them. Labels are Istio's: what the
//!   proxy knows of itself as constants, the peer as Envoy sees it per request (the endpoint's
//!   workload from its EDS `hostname`, the cluster's service from cluster metadata, the peer's
//!   certificate, the response code).
//! - Tracing: Envoy's OpenTelemetry tracer, exporting over OTLP/gRPC or OTLP/HTTP, with the
//!   Telemetry's custom tags and Istio's own span tags.
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
    extension_filter, AccessLog, AccessLogFilter, AndFilter, ExtensionFilter, LogTypeFilter,
};
use envoy_types::pb::envoy::data::accesslog::v3::AccessLogType;
use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::TcpAccessLogOptions;
use envoy_types::pb::opentelemetry::proto::common::v1::{
    any_value, AnyValue, KeyValue as OtelKeyValue, KeyValueList,
};
use envoy_types::pb::envoy::config::core::v3::{
    http_uri, HeaderValue as EnvoyHeaderValue, HeaderValueOption, HttpService, HttpUri,
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
    self, Defaults, EffectiveMetrics, EffectiveTelemetry, IstioMetric, LogSink, Side, Telemetry,
    ENVOY_PROVIDER, PROMETHEUS_PROVIDER,
};
use envoy_types::pb::envoy::config::core::v3::grpc_service::{EnvoyGrpc, TargetSpecifier};
use envoy_types::pb::envoy::config::core::v3::GrpcService;
use envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType as TracerConfig;
use envoy_types::pb::envoy::config::trace::v3::tracing::Http as TracerProvider;
use envoy_types::pb::envoy::config::trace::v3::OpenTelemetryConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing as HcmTracing;
use envoy_types::pb::envoy::r#type::tracing::v3::{custom_tag, CustomTag as EnvoyCustomTag};
use envoy_types::pb::envoy::r#type::v3::Percent;
use meshplane_crds::providers::{
    parse_service, FileAccessLogProvider, LogFormat, OpenTelemetryProvider, OtelAccessLogProvider,
    ProviderKind,
};
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
/// The request body size histogram, in the scope.
pub const REQUEST_BYTES: &str = "request_bytes";
/// The response body size histogram, in the scope.
pub const RESPONSE_BYTES: &str = "response_bytes";
/// TCP connections whose upstream connected, in the scope.
pub const TCP_OPENED: &str = "tcp_connections_opened_total";
/// TCP connections that ended, in the scope.
pub const TCP_CLOSED: &str = "tcp_connections_closed_total";
/// Bytes sent to the downstream of TCP connections (the responses), in the scope.
pub const TCP_SENT: &str = "tcp_sent_bytes_total";
/// Bytes received from the downstream of TCP connections (the requests), in the scope.
pub const TCP_RECEIVED: &str = "tcp_received_bytes_total";

/// How a metric takes its value from one request or connection.
#[derive(Clone, Copy, Debug)]
enum StatValue {
    /// A counter adding one.
    One,
    /// A counter adding a command operator's value.
    Count(&'static str),
    /// A histogram recording a command operator's value in a unit.
    Record(&'static str, histogram::Unit),
}

/// One of the standard metrics: which, its name in the scope, its value.
type MetricSpec = (IstioMetric, &'static str, StatValue);

/// The metrics of an HTTP connection manager, one per request.
const HTTP_METRICS: [MetricSpec; 4] = [
    (IstioMetric::RequestCount, REQUESTS_TOTAL, StatValue::One),
    (
        IstioMetric::RequestDuration,
        REQUEST_DURATION,
        StatValue::Record("%DURATION%", histogram::Unit::Milliseconds),
    ),
    (
        IstioMetric::RequestSize,
        REQUEST_BYTES,
        StatValue::Record("%BYTES_RECEIVED%", histogram::Unit::Bytes),
    ),
    (
        IstioMetric::ResponseSize,
        RESPONSE_BYTES,
        StatValue::Record("%BYTES_SENT%", histogram::Unit::Bytes),
    ),
];

/// The metrics of a TCP proxy written when its upstream connects.
const TCP_CONNECTED_METRICS: [MetricSpec; 1] = [(
    IstioMetric::TcpOpenedConnections,
    TCP_OPENED,
    StatValue::One,
)];

/// The metrics of a TCP proxy written when its connection ends.
const TCP_END_METRICS: [MetricSpec; 3] = [
    (
        IstioMetric::TcpClosedConnections,
        TCP_CLOSED,
        StatValue::One,
    ),
    (
        IstioMetric::TcpSentBytes,
        TCP_SENT,
        StatValue::Count("%BYTES_SENT%"),
    ),
    (
        IstioMetric::TcpReceivedBytes,
        TCP_RECEIVED,
        StatValue::Count("%BYTES_RECEIVED%"),
    ),
];

/// Log name of `envoyOtelAls` providers that give none (Istio's).
pub const DEFAULT_OTEL_LOG_NAME: &str = "otel_envoy_accesslog";

/// Timeout of an OTLP/HTTP export whose provider gives none.
pub const DEFAULT_OTLP_HTTP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Path of an OTLP/HTTP export whose provider gives none (OTLP's).
pub const DEFAULT_OTLP_HTTP_PATH: &str = "/v1/traces";

/// `istio.cluster_id` of spans: Istio's default cluster name (meshplane runs one cluster per
/// instance).
pub const CLUSTER_ID: &str = "Kubernetes";

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

/// What the revision says before any Telemetry: the access log switch and
/// `defaultProviders.accessLogging`, the `prometheus` extension providers, and
/// `defaultConfig.tracing.sampling`.
pub fn defaults(registry: &Registry) -> Defaults {
    let mc = &registry.mesh_config;
    let default_logs: Vec<String> = mc
        .default_providers
        .as_ref()
        .map(|d| d.access_logging.clone())
        .unwrap_or_default();
    let mut access_logging = Vec::new();
    if mc.access_logging.enabled {
        access_logging.push(ENVOY_PROVIDER.to_string());
    }
    access_logging.extend(default_logs.iter().cloned());
    Defaults {
        access_logging,
        unnamed_access_logging: if default_logs.is_empty() {
            vec![ENVOY_PROVIDER.to_string()]
        } else {
            default_logs
        },
        metrics_providers: mc
            .extension_providers
            .iter()
            .filter(|p| matches!(p.kind(), Some(ProviderKind::Prometheus(_))))
            .map(|p| p.name.clone())
            .collect(),
        sampling: mc.default_sampling().unwrap_or(telemetry::DEFAULT_SAMPLING),
    }
}

/// What the Telemetries and the revision's defaults decide for the proxy.
pub fn effective_for(registry: &Registry, node: &ProxyNode) -> EffectiveTelemetry {
    telemetry::effective(&applicable(registry, node), &defaults(registry))
}

/// What of the proxy its telemetry config depends on, besides the registry: the Telemetries
/// that apply (by namespace and name), its workload's identity and the Services selecting it
/// by port (labels of its metrics), and when it traces its spans' service name and canonical
/// service and revision (Istio's span tags).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TelemetryKey {
    applied: Vec<(Option<String>, Option<String>)>,
    service_account: Option<String>,
    inbound_services: BTreeMap<u32, InboundService>,
    tracing_service: Option<String>,
    canonical: Option<(String, String)>,
}

/// The Service a workload serves on one port: (hostname, name, namespace).
pub type InboundService = (String, String, String);

/// The [`TelemetryKey`] of a proxy.
pub fn key(registry: &Registry, node: &ProxyNode) -> TelemetryKey {
    let eff = effective_for(registry, node);
    TelemetryKey {
        applied: applicable(registry, node)
            .into_iter()
            .map(|t| (t.metadata.namespace.clone(), t.metadata.name.clone()))
            .collect(),
        service_account: node.service_account.clone(),
        inbound_services: inbound_services(registry, node),
        tracing_service: traces(registry, &eff).then(|| tracing_service_name(node)),
        canonical: Side::BOTH
            .iter()
            .any(|side| {
                eff.tracing(*side).istio_tags && tracer_of(registry, eff.tracing(*side)).is_some()
            })
            .then(|| (canonical_service(node), canonical_revision(node))),
    }
}

/// Whether a side of the proxy has a tracer.
fn traces(registry: &Registry, eff: &EffectiveTelemetry) -> bool {
    Side::BOTH
        .iter()
        .any(|side| tracer_of(registry, eff.tracing(*side)).is_some())
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

/// Resolves a provider's `service` and `port` in the tenant's registry: a host of the tenant
/// (in the namespace the service names, if it names one) with that port.
fn resolve_host<'a>(
    registry: &'a Registry,
    name: &str,
    service: &str,
    port: u32,
) -> Result<&'a ServiceModel, String> {
    let parsed = parse_service(service, "service")
        .map_err(|e| format!("extension provider {name:?}: {e}"))?;
    let found = registry.services_named(&parsed.host).find(|s| {
        parsed
            .namespace
            .as_deref()
            .is_none_or(|ns| s.namespace == ns)
    });
    let Some(found) = found else {
        return Err(format!(
            "extension provider {name:?} names {service:?}, which is no Service or ServiceEntry host of the tenant"
        ));
    };
    if !found.ports.iter().any(|p| p.port == port) {
        return Err(format!(
            "extension provider {name:?}: {} has no port {port}",
            found.hostname
        ));
    }
    Ok(found)
}

/// An access log provider, resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum LogProvider<'a> {
    /// The built-in `envoy`: a file log at `meshConfig.accessLogging.path` in its encoding.
    Envoy,
    /// An `envoyFileAccessLog` provider.
    File(&'a FileAccessLogProvider),
    /// An `envoyOtelAls` provider and its collector's host.
    Otel(&'a OtelAccessLogProvider, &'a ServiceModel),
}

impl LogProvider<'_> {
    /// The outbound cluster an `envoyOtelAls` provider sends through.
    pub fn cluster(&self) -> Option<String> {
        match self {
            LogProvider::Otel(p, service) => {
                Some(HostPort::new(&service.hostname, p.port).cluster_name())
            }
            _ => None,
        }
    }
}

/// Resolves access log provider `name`: an `envoyFileAccessLog` or `envoyOtelAls` provider of
/// the revision (its collector a host of the tenant's registry), else the built-in `envoy`.
pub fn resolve_access_log<'a>(
    registry: &'a Registry,
    name: &str,
) -> Result<LogProvider<'a>, String> {
    let Some(provider) = registry.mesh_config.extension_provider(name) else {
        if name == ENVOY_PROVIDER {
            return Ok(LogProvider::Envoy);
        }
        return Err(format!(
            "provider {name:?} is neither the built-in {ENVOY_PROVIDER:?} nor an extension provider of the revision's meshConfig.extensionProviders"
        ));
    };
    match provider.kind() {
        Some(ProviderKind::FileAccessLog(f)) => Ok(LogProvider::File(f)),
        Some(ProviderKind::OtelAccessLog(o)) => {
            let service = resolve_host(registry, name, &o.service, o.port)?;
            Ok(LogProvider::Otel(o, service))
        }
        Some(other) => Err(format!(
            "extension provider {name:?} is of kind {}, not an access log provider (envoyFileAccessLog, envoyOtelAls)",
            other.field()
        )),
        None => Err(format!("extension provider {name:?} is invalid")),
    }
}

/// The hosts and clusters the proxy sends telemetry to, by cluster: its tracers' and its
/// `envoyOtelAls` providers' (for the clusters the proxy needs whatever its outbound scope).
pub fn collectors<'a>(registry: &'a Registry, node: &ProxyNode) -> Vec<(String, &'a ServiceModel)> {
    let eff = effective_for(registry, node);
    let mut out: BTreeMap<String, &'a ServiceModel> = BTreeMap::new();
    for t in tracers(registry, node) {
        out.entry(t.cluster()).or_insert(t.service);
    }
    for side in Side::BOTH {
        for sink in eff.logs(side) {
            if let Ok(p @ LogProvider::Otel(_, service)) =
                resolve_access_log(registry, &sink.provider)
            {
                if let Some(cluster) = p.cluster() {
                    out.entry(cluster).or_insert(service);
                }
            }
        }
    }
    out.into_iter().collect()
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
    let service = resolve_host(registry, name, &settings.service, settings.port)?;
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
/// name ([`canonical_service`]) and its namespace, `<name>.<namespace>`.
pub fn tracing_service_name(node: &ProxyNode) -> String {
    format!("{}.{}", canonical_service(node), node.namespace)
}

/// The workload's canonical service, as Istio takes it: the label
/// `service.istio.io/canonical-name`, else `app.kubernetes.io/name`, else `app`; for a
/// tenant's gateway its name (label `meshplane.io/gateway`, its Deployment's name); else the
/// pod's name.
pub fn canonical_service(node: &ProxyNode) -> String {
    [
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
        meshplane_crds::names::GATEWAY_LABEL,
    ]
    .iter()
    .find_map(|k| node.labels.get(*k).filter(|v| !v.is_empty()))
    .cloned()
    .or_else(|| node.pod_name.clone())
    .unwrap_or_else(|| "unknown".to_string())
}

/// The workload's canonical revision, as Istio takes it: the label
/// `service.istio.io/canonical-revision`, else `app.kubernetes.io/version`, else `version`,
/// else `latest`.
pub fn canonical_revision(node: &ProxyNode) -> String {
    [
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ]
    .iter()
    .find_map(|k| node.labels.get(*k).filter(|v| !v.is_empty()))
    .cloned()
    .unwrap_or_else(|| "latest".to_string())
}

/// Istio's own span tags of the proxy, as literals: (tag, value).
pub fn istio_span_tags(registry: &Registry, node: &ProxyNode) -> Vec<(&'static str, String)> {
    vec![
        ("istio.canonical_revision", canonical_revision(node)),
        ("istio.canonical_service", canonical_service(node)),
        ("istio.cluster_id", CLUSTER_ID.to_string()),
        ("istio.mesh_id", registry.trust_domain().to_string()),
        ("istio.namespace", node.namespace.clone()),
    ]
}

fn pb_duration(d: std::time::Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// Where and how the tracer exports: OTLP/HTTP when the provider has `http`, else OTLP/gRPC.
fn otlp_export(tracer: &Tracer<'_>, node: &ProxyNode) -> OpenTelemetryConfig {
    let authority = format!("{}:{}", tracer.service.hostname, tracer.port);
    let header = |name: &str, value: &str| HeaderValueOption {
        header: Some(EnvoyHeaderValue {
            key: name.to_string(),
            value: value.to_string(),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Some(http) = &tracer.settings.http {
        let path = http.path.as_deref().unwrap_or(DEFAULT_OTLP_HTTP_PATH);
        let timeout = http
            .timeout
            .as_ref()
            .map(|d| d.get())
            .unwrap_or(DEFAULT_OTLP_HTTP_TIMEOUT);
        return OpenTelemetryConfig {
            http_service: Some(HttpService {
                http_uri: Some(HttpUri {
                    uri: format!("http://{authority}{path}"),
                    timeout: Some(pb_duration(timeout)),
                    http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(tracer.cluster())),
                }),
                request_headers_to_add: http
                    .headers
                    .iter()
                    .map(|h| header(&h.name, &h.value))
                    .collect(),
                ..Default::default()
            }),
            service_name: tracing_service_name(node),
            ..Default::default()
        };
    }
    let grpc = tracer.settings.grpc.as_ref();
    OpenTelemetryConfig {
        grpc_service: Some(GrpcService {
            target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                cluster_name: tracer.cluster(),
                authority,
                ..Default::default()
            })),
            timeout: grpc
                .and_then(|g| g.timeout.as_ref())
                .map(|d| pb_duration(d.get())),
            initial_metadata: grpc
                .map(|g| {
                    g.initial_metadata
                        .iter()
                        .map(|h| EnvoyHeaderValue {
                            key: h.name.clone(),
                            value: h.value.clone(),
                            ..Default::default()
                        })
                        .collect()
                })
                .unwrap_or_default(),
            ..Default::default()
        }),
        service_name: tracing_service_name(node),
        ..Default::default()
    }
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
        config_type: Some(TracerConfig::TypedConfig(pack_any(otlp_export(
            &tracer, node,
        )))),
    });
    // Custom tags by name; Istio's own tags unless a custom tag of the same name replaces one.
    let mut tags: BTreeMap<String, EnvoyCustomTag> = BTreeMap::new();
    if tracing.istio_tags {
        for (tag, value) in istio_span_tags(registry, node) {
            tags.insert(
                tag.to_string(),
                EnvoyCustomTag {
                    tag: tag.to_string(),
                    r#type: Some(custom_tag::Type::Literal(custom_tag::Literal { value })),
                },
            );
        }
    }
    for (k, v) in &tracing.custom_tags {
        if let Some(t) = custom_tag(k, v) {
            tags.insert(k.clone(), t);
        }
    }
    let percent = |value: f64| Some(Percent { value });
    Some(HcmTracing {
        client_sampling: percent(100.0),
        random_sampling: percent(tracing.sampling),
        overall_sampling: percent(100.0),
        max_path_tag_length: tracer
            .settings
            .max_tag_length
            .map(|value| envoy_types::pb::google::protobuf::UInt32Value { value }),
        custom_tags: tags.into_values().collect(),
        provider,
        ..Default::default()
    })
}

/// Which side of the workload a connection manager or TCP proxy serves, by its stat prefix
/// (inbound ones are `inbound|<port>||` or the inbound passthrough cluster's).
fn side_of(stat_prefix: &str) -> Side {
    if stat_prefix.starts_with("inbound") || stat_prefix == super::INBOUND_PASSTHROUGH_CLUSTER {
        Side::Server
    } else {
        Side::Client
    }
}

/// A line format: a text template, or JSON fields in key order.
enum LineFormat {
    Text(String),
    Json(Vec<sorted::Entry>),
}

/// A JSON value of a `labels` format as a protobuf value (scalars; the provider's
/// validation refuses nested values).
fn label_value(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Null => Kind::NullValue(0),
        other => Kind::StringValue(other.to_string()),
    };
    Value { kind: Some(kind) }
}

/// Istio's default fields as JSON entries, in key order.
fn default_json() -> Vec<sorted::Entry> {
    let mut fields: Vec<sorted::Entry> = JSON_FIELDS
        .iter()
        .map(|(k, v)| sorted::Entry {
            key: k.to_string(),
            value: Some(string_value(v)),
        })
        .collect();
    fields.sort_by(|a, b| a.key.cmp(&b.key));
    fields
}

/// The line format of a provider's `logFormat` (`None`: Istio's default text format).
fn line_format(format: Option<&LogFormat>) -> LineFormat {
    match format {
        Some(LogFormat {
            labels: Some(labels),
            ..
        }) => LineFormat::Json(
            // A serde_json map iterates in key order.
            labels
                .iter()
                .map(|(k, v)| sorted::Entry {
                    key: k.clone(),
                    value: Some(label_value(v)),
                })
                .collect(),
        ),
        Some(LogFormat {
            text: Some(text), ..
        }) => {
            let mut t = text.clone();
            if !t.ends_with('\n') {
                t.push('\n');
            }
            LineFormat::Text(t)
        }
        _ => LineFormat::Text(TEXT_FORMAT.to_string()),
    }
}

/// A file access logger writing `path` in `format`.
fn file_config(path: String, format: LineFormat) -> Any {
    match format {
        LineFormat::Text(text) => pack_any(FileAccessLog {
            path,
            access_log_format: Some(AccessLogFormat::LogFormat(SubstitutionFormatString {
                format: Some(Format::TextFormatSource(DataSource {
                    specifier: Some(data_source::Specifier::InlineString(text)),
                    ..Default::default()
                })),
                ..Default::default()
            })),
        }),
        LineFormat::Json(fields) => {
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
    }
}

/// An OpenTelemetry access logger sending to an `envoyOtelAls` provider's collector: the
/// log's body is the text format (Istio's default unless `logFormat.text`), its attributes
/// the `logFormat.labels`, in key order.
fn otel_config(provider: &OtelAccessLogProvider, cluster: String, authority: String) -> Any {
    let format = provider.log_format.as_ref();
    let body = format
        .and_then(|f| f.text.clone())
        .unwrap_or_else(|| TEXT_FORMAT.trim_end_matches('\n').to_string());
    let text = |s: String| AnyValue {
        value: Some(any_value::Value::StringValue(s)),
    };
    let attributes = format
        .and_then(|f| f.labels.as_ref())
        .map(|labels| KeyValueList {
            values: labels
                .iter()
                .map(|(k, v)| OtelKeyValue {
                    key: k.clone(),
                    value: Some(match v {
                        serde_json::Value::String(s) => text(s.clone()),
                        other => text(other.to_string()),
                    }),
                    ..Default::default()
                })
                .collect(),
        });
    pack_any(OpenTelemetryAccessLogConfig {
        grpc_service: Some(GrpcService {
            target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                cluster_name: cluster,
                authority,
                ..Default::default()
            })),
            ..Default::default()
        }),
        log_name: provider
            .log_name
            .clone()
            .unwrap_or_else(|| DEFAULT_OTEL_LOG_NAME.to_string()),
        body: Some(text(body)),
        attributes,
        ..Default::default()
    })
}

/// The filter of an access log: the Telemetry's CEL expression, and on a TCP proxy that also
/// writes when its upstream connects (for the opened-connections metric), only the other
/// writes.
fn log_filter(expression: Option<&String>, skip_connected: bool) -> Option<AccessLogFilter> {
    let cel = expression.map(|expression| AccessLogFilter {
        filter_specifier: Some(FilterSpecifier::ExtensionFilter(ExtensionFilter {
            name: "envoy.access_loggers.extension_filters.cel".to_string(),
            config_type: Some(extension_filter::ConfigType::TypedConfig(pack_any(
                ExpressionFilter {
                    expression: expression.clone(),
                    ..Default::default()
                },
            ))),
        })),
    });
    let not_connected =
        skip_connected.then(|| log_types(&[AccessLogType::TcpUpstreamConnected], true));
    match (not_connected, cel) {
        (Some(t), Some(c)) => Some(AccessLogFilter {
            filter_specifier: Some(FilterSpecifier::AndFilter(AndFilter {
                filters: vec![t, c],
            })),
        }),
        (t, c) => t.or(c),
    }
}

/// A filter passing the writes of `types` (with `exclude`: every other write).
fn log_types(types: &[AccessLogType], exclude: bool) -> AccessLogFilter {
    AccessLogFilter {
        filter_specifier: Some(FilterSpecifier::LogTypeFilter(LogTypeFilter {
            types: types.iter().map(|t| *t as i32).collect(),
            exclude,
        })),
    }
}

/// The access log of one sink, or `None` when its provider does not resolve.
fn access_log(registry: &Registry, sink: &LogSink, skip_connected: bool) -> Option<AccessLog> {
    let (name, typed_config) = match resolve_access_log(registry, &sink.provider).ok()? {
        LogProvider::Envoy => {
            let settings = &registry.mesh_config.access_logging;
            let path = settings
                .path
                .clone()
                .unwrap_or_else(|| DEFAULT_PATH.to_string());
            let format = match settings.encoding {
                AccessLogEncoding::Text => LineFormat::Text(TEXT_FORMAT.to_string()),
                AccessLogEncoding::Json => LineFormat::Json(default_json()),
            };
            ("envoy.access_loggers.file", file_config(path, format))
        }
        LogProvider::File(f) => {
            let path = if f.path.is_empty() {
                DEFAULT_PATH.to_string()
            } else {
                f.path.clone()
            };
            (
                "envoy.access_loggers.file",
                file_config(path, line_format(f.log_format.as_ref())),
            )
        }
        LogProvider::Otel(o, service) => (
            "envoy.access_loggers.open_telemetry",
            otel_config(
                o,
                HostPort::new(&service.hostname, o.port).cluster_name(),
                format!("{}:{}", service.hostname, o.port),
            ),
        ),
    };
    Some(AccessLog {
        name: name.to_string(),
        filter: log_filter(sink.filter.as_ref(), skip_connected),
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
    tcp: bool,
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
    pairs
        .into_iter()
        // TCP connections have no response code (Istio's TCP metrics have no such label).
        .filter(|(k, _)| !(tcp && *k == "response_code"))
        .map(|(k, v)| (k.to_string(), v))
        .collect()
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

/// Envoy's stats access logger writing the `specs` metrics that are produced for the side,
/// each with the side's labels and that metric's overrides; `None` when none is produced.
fn metrics_log(
    labels: &[(String, String)],
    metrics: &EffectiveMetrics,
    specs: &[MetricSpec],
    filter: Option<AccessLogFilter>,
) -> Option<AccessLog> {
    let mut counters = Vec::new();
    let mut histograms = Vec::new();
    for (metric, name, value) in specs {
        if !metrics.produced(*metric) {
            continue;
        }
        let mut tags: BTreeMap<String, String> = labels.iter().cloned().collect();
        for (tag, change) in metrics.tags_of(*metric).into_iter().flatten() {
            match change {
                Some(v) => {
                    tags.insert(tag.clone(), v.clone());
                }
                None => {
                    tags.remove(tag);
                }
            }
        }
        let stat = Some(Stat {
            name: name.to_string(),
            tags: tags
                .into_iter()
                .map(|(name, value_format)| Tag {
                    name,
                    value_format,
                    ..Default::default()
                })
                .collect(),
        });
        match value {
            StatValue::One => counters.push(Counter {
                stat,
                value_fixed: Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 }),
                ..Default::default()
            }),
            StatValue::Count(format) => counters.push(Counter {
                stat,
                value_format: format.to_string(),
                ..Default::default()
            }),
            StatValue::Record(format, unit) => histograms.push(Histogram {
                stat,
                unit: *unit as i32,
                value_format: format.to_string(),
            }),
        }
    }
    if counters.is_empty() && histograms.is_empty() {
        return None;
    }
    #[allow(deprecated)]
    let config = StatsLogConfig {
        stats_scope: Some(Scope {
            prefix: METRICS_SCOPE.to_string(),
            ..Default::default()
        }),
        counters,
        histograms,
        ..Default::default()
    };
    Some(AccessLog {
        name: "envoy.access_loggers.stats".to_string(),
        filter,
        config_type: Some(AccessLogConfigType::TypedConfig(pack_any(config))),
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
    let logs = |side: Side, skip_connected: bool| -> Vec<AccessLog> {
        eff.logs(side)
            .iter()
            .filter_map(|s| access_log(registry, s, skip_connected))
            .collect()
    };
    let metered = node.kind != ProxyKind::Grpc;
    if f.name == HTTP_CONNECTION_MANAGER {
        if let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) {
            let side = side_of(&hcm.stat_prefix);
            hcm.access_log.extend(logs(side, false));
            if let Some(tracing) = hcm_tracing(registry, node, eff.tracing(side)) {
                hcm.tracing = Some(tracing);
            }
            if metered {
                let labels =
                    metric_labels(registry, node, side, inbound_port(&hcm.stat_prefix), false);
                hcm.access_log
                    .extend(metrics_log(&labels, eff.metrics(side), &HTTP_METRICS, None));
            }
            any.value = hcm.encode_to_vec();
        }
    } else if f.name == TCP_PROXY {
        if let Ok(mut tcp) = TcpProxy::decode(any.value.as_slice()) {
            let side = side_of(&tcp.stat_prefix);
            let metrics = eff.metrics(side);
            let labels = metric_labels(registry, node, side, inbound_port(&tcp.stat_prefix), true);
            // The opened-connections metric needs a write when the upstream connects; the other
            // logs skip that write.
            let opened = metered
                .then(|| {
                    metrics_log(
                        &labels,
                        metrics,
                        &TCP_CONNECTED_METRICS,
                        Some(log_types(&[AccessLogType::TcpUpstreamConnected], false)),
                    )
                })
                .flatten();
            let on_connect = opened.is_some();
            tcp.access_log.extend(logs(side, on_connect));
            if metered {
                tcp.access_log.extend(opened);
                tcp.access_log.extend(metrics_log(
                    &labels,
                    metrics,
                    &TCP_END_METRICS,
                    on_connect.then(|| log_types(&[AccessLogType::TcpUpstreamConnected], true)),
                ));
            }
            if on_connect {
                tcp.access_log_options
                    .get_or_insert_with(TcpAccessLogOptions::default)
                    .flush_access_log_on_connected = true;
            }
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
    for (i, a) in t.spec.access_logging.iter().enumerate() {
        for p in &a.providers {
            if let Err(why) = resolve_access_log(registry, &p.name) {
                findings.push(Finding {
                    reason: "ProviderNotFound",
                    message: format!("spec.accessLogging[{i}]: {why}"),
                });
            }
        }
    }
    let metrics_providers = defaults(registry).metrics_providers;
    for (i, m) in t.spec.metrics.iter().enumerate() {
        for p in &m.providers {
            if p.name != PROMETHEUS_PROVIDER && !metrics_providers.contains(&p.name) {
                findings.push(Finding {
                    reason: "ProviderNotFound",
                    message: format!(
                        "spec.metrics[{i}]: provider {:?} is neither the built-in {PROMETHEUS_PROVIDER:?} nor a prometheus provider of the revision's meshConfig.extensionProviders",
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
