//! Extension providers of a tenant (`spec.meshConfig.extensionProviders`), in the shapes of
//! Istio's `MeshConfig.ExtensionProvider`: external authorizers (`envoyExtAuthzHttp`,
//! `envoyExtAuthzGrpc`) that `action: CUSTOM` AuthorizationPolicies name, and telemetry sinks
//! (`opentelemetry`, `envoyFileAccessLog`, `envoyOtelAls`, `prometheus`), with the providers
//! used when nothing else is said (`defaultProviders`).
//!
//! A provider that sends traffic somewhere (`service` and `port`) must name a host of its
//! tenant: a Kubernetes Service of a namespace of the tenant (`name.ns.svc.cluster.local`, or
//! `ns/name`) or a ServiceEntry host of the tenant (`host`, or `ns/host`). The syntax is
//! checked here ([`validate_extension_providers`]); whether the namespace is the tenant's is
//! checked by the operator's admission ([`foreign_provider_namespaces`]), and the tenant's
//! instance resolves the host in the tenant's own registry only, so a provider outside the
//! tenant is never programmed.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::validation::{validate_dns1123_label, validate_host, ValidationError, ValidationErrors};

/// DNS suffix of Kubernetes Service hosts.
pub const SERVICE_HOST_SUFFIX: &str = ".svc.cluster.local";

/// The most providers a control plane declares.
pub const MAX_PROVIDERS: usize = 64;

/// One extension provider: a name, and exactly one kind of provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionProvider {
    /// Name that AuthorizationPolicies (`provider.name`), Telemetry resources and
    /// `defaultProviders` use; unique in the control plane.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// An external authorizer speaking Envoy's ext_authz HTTP protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_ext_authz_http: Option<ExtAuthzHttpProvider>,
    /// An external authorizer speaking Envoy's ext_authz gRPC protocol
    /// (`envoy.service.auth.v3.Authorization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_ext_authz_grpc: Option<ExtAuthzGrpcProvider>,
    /// A tracing collector speaking OpenTelemetry (OTLP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opentelemetry: Option<OpenTelemetryProvider>,
    /// Access logs written by the proxy to a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_file_access_log: Option<FileAccessLogProvider>,
    /// Access logs sent to an OpenTelemetry collector (OTLP logs over gRPC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_otel_als: Option<OtelAccessLogProvider>,
    /// Workload metrics exposed for Prometheus to scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusProvider>,
}

/// The kind of an [`ExtensionProvider`], borrowed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ProviderKind<'a> {
    ExtAuthzHttp(&'a ExtAuthzHttpProvider),
    ExtAuthzGrpc(&'a ExtAuthzGrpcProvider),
    OpenTelemetry(&'a OpenTelemetryProvider),
    FileAccessLog(&'a FileAccessLogProvider),
    OtelAccessLog(&'a OtelAccessLogProvider),
    Prometheus(&'a PrometheusProvider),
}

impl<'a> ProviderKind<'a> {
    /// The field that declares this kind.
    pub fn field(&self) -> &'static str {
        match self {
            ProviderKind::ExtAuthzHttp(_) => "envoyExtAuthzHttp",
            ProviderKind::ExtAuthzGrpc(_) => "envoyExtAuthzGrpc",
            ProviderKind::OpenTelemetry(_) => "opentelemetry",
            ProviderKind::FileAccessLog(_) => "envoyFileAccessLog",
            ProviderKind::OtelAccessLog(_) => "envoyOtelAls",
            ProviderKind::Prometheus(_) => "prometheus",
        }
    }

    /// The service and port the provider sends to, if it sends anywhere.
    pub fn target(&self) -> Option<(&'a str, u32)> {
        match self {
            ProviderKind::ExtAuthzHttp(p) => Some((p.service.as_str(), p.port)),
            ProviderKind::ExtAuthzGrpc(p) => Some((p.service.as_str(), p.port)),
            ProviderKind::OpenTelemetry(p) => Some((p.service.as_str(), p.port)),
            ProviderKind::OtelAccessLog(p) => Some((p.service.as_str(), p.port)),
            ProviderKind::FileAccessLog(_) | ProviderKind::Prometheus(_) => None,
        }
    }
}

/// The provider-kind fields, in the order of [`ExtensionProvider`].
pub const PROVIDER_KINDS: [&str; 6] = [
    "envoyExtAuthzHttp",
    "envoyExtAuthzGrpc",
    "opentelemetry",
    "envoyFileAccessLog",
    "envoyOtelAls",
    "prometheus",
];

impl ExtensionProvider {
    /// Every kind the provider sets (valid providers set exactly one).
    pub fn kinds(&self) -> Vec<ProviderKind<'_>> {
        let mut out = Vec::new();
        if let Some(p) = &self.envoy_ext_authz_http {
            out.push(ProviderKind::ExtAuthzHttp(p));
        }
        if let Some(p) = &self.envoy_ext_authz_grpc {
            out.push(ProviderKind::ExtAuthzGrpc(p));
        }
        if let Some(p) = &self.opentelemetry {
            out.push(ProviderKind::OpenTelemetry(p));
        }
        if let Some(p) = &self.envoy_file_access_log {
            out.push(ProviderKind::FileAccessLog(p));
        }
        if let Some(p) = &self.envoy_otel_als {
            out.push(ProviderKind::OtelAccessLog(p));
        }
        if let Some(p) = &self.prometheus {
            out.push(ProviderKind::Prometheus(p));
        }
        out
    }

    /// The provider's kind, when it sets exactly one.
    pub fn kind(&self) -> Option<ProviderKind<'_>> {
        match self.kinds().as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }
}

/// What of the request body an external authorizer receives.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestBodyInCheck {
    /// Buffer the body up to this many bytes before asking the authorizer.
    #[serde(default)]
    pub max_request_bytes: u32,
    /// Send the first `maxRequestBytes` of a larger body instead of answering 413.
    #[serde(default)]
    pub allow_partial_message: bool,
    /// Send the body as raw bytes rather than as a UTF-8 string (gRPC authorizers).
    #[serde(default)]
    pub pack_as_bytes: bool,
}

/// An HTTP external authorizer (Istio's `EnvoyExternalAuthorizationHttpProvider`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtAuthzHttpProvider {
    /// The authorizer's host, `[<namespace>/]<host>`: `authz.shop.svc.cluster.local`,
    /// `shop/authz` or a ServiceEntry host of the tenant. It must be inside the tenant.
    #[schemars(length(min = 1, max = 317))]
    pub service: String,
    /// Its port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u32,
    /// How long the proxy waits for an answer (default 600s, as Istio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Prefix of the path of the check request (the original path follows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub path_prefix: Option<String>,
    /// Let the request through when the authorizer cannot be reached or errs.
    #[serde(default)]
    pub fail_open: bool,
    /// Clear the route cache after the check, so headers the authorizer adds can route.
    #[serde(default)]
    pub clear_route_cache: bool,
    /// Status returned to the client when the authorizer cannot be reached or errs (default
    /// 403).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[1-5][0-9][0-9]$"))]
    pub status_on_error: Option<String>,
    /// Request headers sent to the authorizer besides `Host`, `Method`, `Path`,
    /// `Content-Length` and `Authorization` (exact, `prefix*` or `*suffix`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include_request_headers_in_check: Vec<String>,
    /// Deprecated spelling of `includeRequestHeadersInCheck`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include_headers_in_check: Vec<String>,
    /// Headers added to the check request with fixed values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub include_additional_headers_in_check: BTreeMap<String, String>,
    /// Send the request body too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_request_body_in_check: Option<RequestBodyInCheck>,
    /// Headers of the authorizer's OK answer copied to the request sent upstream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_upstream_on_allow: Vec<String>,
    /// Headers of the authorizer's denial copied to the response sent downstream (all of
    /// them when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_downstream_on_deny: Vec<String>,
    /// Headers of the authorizer's OK answer added to the response sent downstream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_downstream_on_allow: Vec<String>,
}

/// A gRPC external authorizer (Istio's `EnvoyExternalAuthorizationGrpcProvider`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtAuthzGrpcProvider {
    /// The authorizer's host, as for `envoyExtAuthzHttp`.
    #[schemars(length(min = 1, max = 317))]
    pub service: String,
    /// Its port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u32,
    /// How long the proxy waits for an answer (default 600s, as Istio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Let the request through when the authorizer cannot be reached or errs.
    #[serde(default)]
    pub fail_open: bool,
    /// Clear the route cache after the check.
    #[serde(default)]
    pub clear_route_cache: bool,
    /// Status returned to the client when the authorizer cannot be reached or errs (default
    /// 403).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[1-5][0-9][0-9]$"))]
    pub status_on_error: Option<String>,
    /// Send the request body too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_request_body_in_check: Option<RequestBodyInCheck>,
}

/// A header name and value.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderValue {
    /// Header name.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Header value.
    #[serde(default)]
    pub value: String,
}

/// OTLP over HTTP.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OtlpHttp {
    /// Path of the export request (default `/v1/traces`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Request timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Headers added to the export request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderValue>,
}

/// OTLP over gRPC (the default transport).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OtlpGrpc {
    /// Request timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Metadata added to the export call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub initial_metadata: Vec<HeaderValue>,
}

/// An empty settings object (a switch that is on when present).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Enabled {}

/// Resource detectors of the OpenTelemetry tracer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceDetectors {
    /// Resource attributes from the `OTEL_RESOURCE_ATTRIBUTES` environment variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Enabled>,
    /// Resource attributes from Dynatrace's OneAgent files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynatrace: Option<Enabled>,
}

/// An OpenTelemetry tracing collector (Istio's `OpenTelemetryTracingProvider`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenTelemetryProvider {
    /// The collector's host, as for `envoyExtAuthzHttp`.
    #[schemars(length(min = 1, max = 317))]
    pub service: String,
    /// Its port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u32,
    /// Longest span tag value; longer ones are truncated (Envoy's default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tag_length: Option<u32>,
    /// Export over HTTP instead of gRPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<OtlpHttp>,
    /// Settings of the gRPC export (the default transport).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<OtlpGrpc>,
    /// Where resource attributes come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_detectors: Option<ResourceDetectors>,
}

/// The format of an access log: a text template or JSON labels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogFormat {
    /// A text line in Envoy's command-operator syntax (`%START_TIME% %RESPONSE_CODE%\n`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A JSON object per entry: keys and their values (command operators allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub labels: Option<serde_json::Map<String, serde_json::Value>>,
}

fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A file access log (Istio's `EnvoyFileAccessLogProvider`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileAccessLogProvider {
    /// File the proxy writes (`/dev/stdout` when empty).
    #[serde(default)]
    pub path: String,
    /// Format of an entry (Istio's default text format when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}

/// Access logs to an OpenTelemetry collector (Istio's `EnvoyOpenTelemetryLogProvider`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OtelAccessLogProvider {
    /// The collector's host, as for `envoyExtAuthzHttp`.
    #[schemars(length(min = 1, max = 317))]
    pub service: String,
    /// Its port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u32,
    /// Name of the log stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_name: Option<String>,
    /// Format of an entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}

/// Workload metrics for Prometheus (Istio's `PrometheusMetricsProvider`; no settings).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PrometheusProvider {}

/// Providers used when a Telemetry resource names none.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefaultProviders {
    /// Tracing providers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tracing: Vec<String>,
    /// Metrics providers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<String>,
    /// Access-logging providers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_logging: Vec<String>,
}

impl DefaultProviders {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.tracing.is_empty() && self.metrics.is_empty() && self.access_logging.is_empty()
    }
}

/// A provider's `service`, read: the host it names and the namespace it is qualified with (or,
/// for a Kubernetes Service host, the Service's namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderService {
    /// The fully qualified host (`authz.shop.svc.cluster.local`, or a ServiceEntry host).
    pub host: String,
    /// `ns` of `ns/host`, or of a `name.ns.svc.cluster.local` host.
    pub namespace: Option<String>,
    /// The host is a Kubernetes Service's (`.svc.cluster.local`).
    pub kubernetes: bool,
}

/// The namespace of a Kubernetes Service host `name.ns.svc.cluster.local`.
pub fn service_host_namespace(host: &str) -> Option<&str> {
    let stem = host.strip_suffix(SERVICE_HOST_SUFFIX)?;
    let (name, ns) = stem.split_once('.')?;
    (!name.is_empty() && !ns.is_empty() && !ns.contains('.')).then_some(ns)
}

/// Reads a provider's `service`: `[<namespace>/]<host>`, where `<host>` is a Kubernetes Service
/// host `name.ns.svc.cluster.local`, a ServiceEntry host, or (after `ns/`) a Service's short
/// name.
pub fn parse_service(value: &str, field: &str) -> Result<ProviderService, ValidationError> {
    let invalid = |reason: String| ValidationError::Invalid {
        field: field.into(),
        reason,
    };
    let (qualifier, host) = match value.split_once('/') {
        Some((ns, host)) => {
            validate_dns1123_label(ns, field)?;
            (Some(ns), host)
        }
        None => (None, value),
    };
    validate_host(host, field, false)?;
    if host.starts_with("*.") {
        return Err(invalid(format!(
            "{value:?}: a provider names one host, not a wildcard"
        )));
    }
    let host = host.to_ascii_lowercase();
    if !host.contains('.') {
        // A short name is a Service of the qualifying namespace.
        return match qualifier {
            Some(ns) => Ok(ProviderService {
                host: format!("{host}.{ns}{SERVICE_HOST_SUFFIX}"),
                namespace: Some(ns.to_string()),
                kubernetes: true,
            }),
            None => Err(invalid(format!(
                "{value:?}: name the Service fully (name.namespace.svc.cluster.local), as namespace/name, or give a ServiceEntry host"
            ))),
        };
    }
    if let Some(ns) = service_host_namespace(&host) {
        if let Some(q) = qualifier.filter(|q| *q != ns) {
            return Err(invalid(format!(
                "{value:?}: the host is a Service of namespace {ns:?}, not of {q:?}"
            )));
        }
        return Ok(ProviderService {
            namespace: Some(ns.to_string()),
            host,
            kubernetes: true,
        });
    }
    if host.ends_with(SERVICE_HOST_SUFFIX) || host.ends_with(".svc") {
        return Err(invalid(format!(
            "{value:?}: a Kubernetes Service host reads name.namespace.svc.cluster.local"
        )));
    }
    Ok(ProviderService {
        host,
        namespace: qualifier.map(str::to_string),
        kubernetes: false,
    })
}

/// `value` is an exact header name, `prefix*` or `*suffix`.
fn check_header_pattern(value: &str, field: &str, errs: &mut ValidationErrors) {
    let bare = value
        .strip_prefix('*')
        .or_else(|| value.strip_suffix('*'))
        .unwrap_or(value);
    let ok = !bare.is_empty()
        && bare
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if !ok {
        errs.0.push(ValidationError::Invalid {
            field: field.into(),
            reason: format!(
                "{value:?} is not a header name, \"prefix*\" or \"*suffix\" (one '*' at an end at most)"
            ),
        });
    }
}

fn check_header_patterns(values: &[String], field: &str, errs: &mut ValidationErrors) {
    for (i, v) in values.iter().enumerate() {
        check_header_pattern(v, &format!("{field}[{i}]"), errs);
    }
}

fn check_log_format(format: &LogFormat, field: &str, errs: &mut ValidationErrors) {
    if format.text.is_some() && format.labels.is_some() {
        errs.0.push(ValidationError::Invalid {
            field: field.into(),
            reason: "give text or labels, not both".into(),
        });
    }
    for (key, value) in format.labels.iter().flatten() {
        if value.is_object() || value.is_array() {
            errs.0.push(ValidationError::Invalid {
                field: format!("{field}.labels[{key}]"),
                reason:
                    "a label's value is a string (command operators allowed), a number or a boolean"
                        .into(),
            });
        }
    }
}

/// Checks the providers and the default providers: unique names, exactly one kind each,
/// `service` syntax, header patterns, status codes, defaults naming declared providers of the
/// right kind.
pub fn validate_extension_providers(
    providers: &[ExtensionProvider],
    defaults: Option<&DefaultProviders>,
    field: &str,
) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if providers.len() > MAX_PROVIDERS {
        errs.0.push(ValidationError::Invalid {
            field: format!("{field}.extensionProviders"),
            reason: format!("at most {MAX_PROVIDERS} providers"),
        });
    }
    let mut seen = BTreeSet::new();
    for (i, p) in providers.iter().enumerate() {
        let pf = format!("{field}.extensionProviders[{i}]");
        if p.name.is_empty() {
            errs.0.push(ValidationError::Empty {
                field: format!("{pf}.name"),
            });
        } else if !seen.insert(p.name.as_str()) {
            errs.0.push(ValidationError::Invalid {
                field: format!("{pf}.name"),
                reason: format!("provider {:?} is declared twice", p.name),
            });
        }
        let kinds = p.kinds();
        if kinds.len() != 1 {
            errs.0.push(ValidationError::Invalid {
                field: pf.clone(),
                reason: format!(
                    "a provider sets exactly one of {} (this one sets {})",
                    PROVIDER_KINDS.join(", "),
                    kinds.len()
                ),
            });
        }
        for kind in kinds {
            let kf = format!("{pf}.{}", kind.field());
            if let Some((service, port)) = kind.target() {
                if let Err(e) = parse_service(service, &format!("{kf}.service")) {
                    errs.0.push(e);
                }
                if !(1..=65535).contains(&port) {
                    errs.0.push(ValidationError::InvalidPort {
                        field: format!("{kf}.port"),
                        reason: format!("{port} is not a port number (1-65535)"),
                    });
                }
            }
            let status = match kind {
                ProviderKind::ExtAuthzHttp(h) => {
                    check_header_patterns(
                        &h.include_request_headers_in_check,
                        &format!("{kf}.includeRequestHeadersInCheck"),
                        &mut errs,
                    );
                    check_header_patterns(
                        &h.include_headers_in_check,
                        &format!("{kf}.includeHeadersInCheck"),
                        &mut errs,
                    );
                    check_header_patterns(
                        &h.headers_to_upstream_on_allow,
                        &format!("{kf}.headersToUpstreamOnAllow"),
                        &mut errs,
                    );
                    check_header_patterns(
                        &h.headers_to_downstream_on_deny,
                        &format!("{kf}.headersToDownstreamOnDeny"),
                        &mut errs,
                    );
                    check_header_patterns(
                        &h.headers_to_downstream_on_allow,
                        &format!("{kf}.headersToDownstreamOnAllow"),
                        &mut errs,
                    );
                    for name in h.include_additional_headers_in_check.keys() {
                        if name.contains('*') {
                            errs.0.push(ValidationError::Invalid {
                                field: format!("{kf}.includeAdditionalHeadersInCheck"),
                                reason: format!("{name:?} is not a header name"),
                            });
                        } else {
                            check_header_pattern(
                                name,
                                &format!("{kf}.includeAdditionalHeadersInCheck"),
                                &mut errs,
                            );
                        }
                    }
                    if let Some(prefix) = &h.path_prefix {
                        if !prefix.starts_with('/') {
                            errs.0.push(ValidationError::Invalid {
                                field: format!("{kf}.pathPrefix"),
                                reason: format!("{prefix:?} must start with '/'"),
                            });
                        }
                    }
                    h.status_on_error.as_deref()
                }
                ProviderKind::ExtAuthzGrpc(g) => g.status_on_error.as_deref(),
                ProviderKind::FileAccessLog(f) => {
                    if !f.path.is_empty() && !f.path.starts_with('/') {
                        errs.0.push(ValidationError::Invalid {
                            field: format!("{kf}.path"),
                            reason: format!("{:?} is not an absolute path", f.path),
                        });
                    }
                    if let Some(fmt) = &f.log_format {
                        check_log_format(fmt, &format!("{kf}.logFormat"), &mut errs);
                    }
                    None
                }
                ProviderKind::OtelAccessLog(o) => {
                    if let Some(fmt) = &o.log_format {
                        check_log_format(fmt, &format!("{kf}.logFormat"), &mut errs);
                    }
                    None
                }
                ProviderKind::OpenTelemetry(o) => {
                    if o.http.is_some() && o.grpc.is_some() {
                        errs.0.push(ValidationError::Invalid {
                            field: kf.clone(),
                            reason: "give http or grpc, not both".into(),
                        });
                    }
                    if let Some(path) = o.http.as_ref().and_then(|h| h.path.as_deref()) {
                        if !path.starts_with('/') {
                            errs.0.push(ValidationError::Invalid {
                                field: format!("{kf}.http.path"),
                                reason: format!("{path:?} must start with '/'"),
                            });
                        }
                    }
                    None
                }
                ProviderKind::Prometheus(_) => None,
            };
            if let Some(code) = status {
                if status_code(code).is_none() {
                    errs.0.push(ValidationError::Invalid {
                        field: format!("{kf}.statusOnError"),
                        reason: format!("{code:?} is not an HTTP status code (100-599)"),
                    });
                }
            }
        }
    }
    if let Some(d) = defaults {
        let mut by_name: BTreeMap<&str, &ExtensionProvider> = BTreeMap::new();
        for p in providers {
            by_name.entry(p.name.as_str()).or_insert(p);
        }
        type Fits = fn(&ProviderKind<'_>) -> bool;
        let lists: [(&str, &Vec<String>, Fits); 3] = [
            ("tracing", &d.tracing, |k| {
                matches!(k, ProviderKind::OpenTelemetry(_))
            }),
            ("metrics", &d.metrics, |k| {
                matches!(k, ProviderKind::Prometheus(_))
            }),
            ("accessLogging", &d.access_logging, |k| {
                matches!(
                    k,
                    ProviderKind::FileAccessLog(_) | ProviderKind::OtelAccessLog(_)
                )
            }),
        ];
        for (name, list, fits) in lists {
            for (i, v) in list.iter().enumerate() {
                let f = format!("{field}.defaultProviders.{name}[{i}]");
                match by_name.get(v.as_str()).map(|p| p.kind()) {
                    None => errs.0.push(ValidationError::Invalid {
                        field: f,
                        reason: format!("no extension provider is named {v:?}"),
                    }),
                    Some(Some(kind)) if !fits(&kind) => errs.0.push(ValidationError::Invalid {
                        field: f,
                        reason: format!(
                            "provider {v:?} is of kind {}, which cannot serve {name}",
                            kind.field()
                        ),
                    }),
                    Some(_) => {}
                }
            }
        }
    }
    errs.into_result()
}

/// An HTTP status code string (`"403"`), as a number.
pub fn status_code(value: &str) -> Option<u32> {
    value
        .parse::<u32>()
        .ok()
        .filter(|c| (100..=599).contains(c))
}

/// A provider that names a namespace outside its tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignProvider {
    /// The `service` field.
    pub field: String,
    /// Its value.
    pub service: String,
    /// The namespace it names.
    pub namespace: String,
    /// Why the namespace is not the tenant's.
    pub why: String,
}

impl std::fmt::Display for ForeignProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:?} is in namespace {:?}, {}: a provider outside the tenant is refused (name a Service of a namespace of the tenant, or a ServiceEntry host of the tenant)",
            self.field, self.service, self.namespace, self.why
        )
    }
}

/// Every provider `service` whose namespace `owner` says is not the tenant's: `owner(ns)`
/// returns `None` for a namespace of the tenant (or one that may still join it), and the
/// reason otherwise. Services that do not parse are left to [`validate_extension_providers`].
pub fn foreign_provider_namespaces(
    providers: &[ExtensionProvider],
    field: &str,
    owner: &dyn Fn(&str) -> Option<String>,
) -> Vec<ForeignProvider> {
    let mut out = Vec::new();
    for (i, p) in providers.iter().enumerate() {
        for kind in p.kinds() {
            let Some((service, _)) = kind.target() else {
                continue;
            };
            let sf = format!("{field}.extensionProviders[{i}].{}.service", kind.field());
            let Ok(parsed) = parse_service(service, &sf) else {
                continue;
            };
            if let Some(ns) = parsed.namespace {
                if let Some(why) = owner(&ns) {
                    out.push(ForeignProvider {
                        field: sf,
                        service: service.to_string(),
                        namespace: ns,
                        why,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn providers(v: serde_json::Value) -> Vec<ExtensionProvider> {
        serde_json::from_value(v).expect("providers decode")
    }

    fn errors(v: serde_json::Value, defaults: Option<serde_json::Value>) -> String {
        let d: Option<DefaultProviders> =
            defaults.map(|d| serde_json::from_value(d).expect("defaults decode"));
        match validate_extension_providers(&providers(v), d.as_ref(), "spec.meshConfig") {
            Ok(()) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn istio_shaped_providers_decode_and_pass() {
        let v = serde_json::json!([
            {"name": "authz-http", "envoyExtAuthzHttp": {
                "service": "authz.shop.svc.cluster.local", "port": 8000, "timeout": "2s",
                "pathPrefix": "/check", "failOpen": true, "statusOnError": "503",
                "includeRequestHeadersInCheck": ["x-user", "x-ext-*"],
                "includeAdditionalHeadersInCheck": {"x-from": "mesh"},
                "includeRequestBodyInCheck": {"maxRequestBytes": 4096, "allowPartialMessage": true},
                "headersToUpstreamOnAllow": ["x-authz-*"], "headersToDownstreamOnDeny": ["*-reason"]}},
            {"name": "authz-grpc", "envoyExtAuthzGrpc": {"service": "shop/authz", "port": 9000,
                "timeout": "500ms", "statusOnError": "403",
                "includeRequestBodyInCheck": {"maxRequestBytes": 1024, "packAsBytes": true}}},
            {"name": "otel", "opentelemetry": {"service": "otel.observe.svc.cluster.local", "port": 4317,
                "maxTagLength": 256, "resourceDetectors": {"environment": {}}}},
            {"name": "file", "envoyFileAccessLog": {"path": "/dev/stdout",
                "logFormat": {"labels": {"code": "%RESPONSE_CODE%"}}}},
            {"name": "als", "envoyOtelAls": {"service": "collector.example.com", "port": 4317}},
            {"name": "prom", "prometheus": {}}
        ]);
        let d = serde_json::json!({"tracing": ["otel"], "metrics": ["prom"], "accessLogging": ["file", "als"]});
        assert_eq!(errors(v.clone(), Some(d)), "");
        let ps = providers(v);
        assert_eq!(ps[0].kind().map(|k| k.field()), Some("envoyExtAuthzHttp"));
        assert_eq!(
            ps[1].kind().and_then(|k| k.target()),
            Some(("shop/authz", 9000))
        );
        // Round trip keeps Istio's field names.
        let back = serde_json::to_value(&ps).expect("serializes");
        assert_eq!(back[0]["envoyExtAuthzHttp"]["statusOnError"], "503");
        assert_eq!(
            back[1]["envoyExtAuthzGrpc"]["includeRequestBodyInCheck"]["packAsBytes"],
            true
        );
    }

    #[test]
    fn each_broken_rule_names_its_field() {
        let text = errors(
            serde_json::json!([
                {"name": "a", "envoyExtAuthzHttp": {"service": "authz", "port": 80,
                    "statusOnError": "99", "includeRequestHeadersInCheck": ["x-*-y"], "pathPrefix": "check"}},
                {"name": "a", "envoyExtAuthzGrpc": {"service": "shop/authz.bank.svc.cluster.local", "port": 0}},
                {"name": "b"},
                {"name": "c", "prometheus": {}, "envoyFileAccessLog": {"path": "/x"}},
                {"name": "d", "envoyFileAccessLog": {"path": "/x", "logFormat": {"text": "t", "labels": {}}}},
                {"name": "e", "envoyFileAccessLog": {"path": "logs/access.log", "logFormat": {"labels": {"nested": {"a": 1}}}}},
                {"name": "f", "opentelemetry": {"service": "otel.example.com", "port": 4318, "http": {"path": "v1/traces"}}}
            ]),
            Some(serde_json::json!({"tracing": ["nope"], "metrics": ["a"]})),
        );
        for needle in [
            "extensionProviders[0].envoyExtAuthzHttp.service: \"authz\": name the Service fully",
            "extensionProviders[0].envoyExtAuthzHttp.statusOnError",
            "extensionProviders[0].envoyExtAuthzHttp.includeRequestHeadersInCheck[0]",
            "extensionProviders[0].envoyExtAuthzHttp.pathPrefix",
            "extensionProviders[1].name: provider \"a\" is declared twice",
            "extensionProviders[1].envoyExtAuthzGrpc.service: \"shop/authz.bank.svc.cluster.local\": the host is a Service of namespace \"bank\"",
            "extensionProviders[1].envoyExtAuthzGrpc.port",
            "extensionProviders[2]: a provider sets exactly one of",
            "extensionProviders[3]: a provider sets exactly one of",
            "extensionProviders[4].envoyFileAccessLog.logFormat: give text or labels",
            "extensionProviders[5].envoyFileAccessLog.path: \"logs/access.log\" is not an absolute path",
            "extensionProviders[5].envoyFileAccessLog.logFormat.labels[nested]: a label's value is a string",
            "extensionProviders[6].opentelemetry.http.path: \"v1/traces\" must start with '/'",
            "defaultProviders.tracing[0]: no extension provider is named \"nope\"",
            "defaultProviders.metrics[0]: provider \"a\" is of kind envoyExtAuthzHttp",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text}");
        }
    }

    #[test]
    fn service_forms_are_read() {
        let p = |s: &str| parse_service(s, "f");
        assert_eq!(
            p("authz.shop.svc.cluster.local"),
            Ok(ProviderService {
                host: "authz.shop.svc.cluster.local".into(),
                namespace: Some("shop".into()),
                kubernetes: true
            })
        );
        assert_eq!(p("shop/authz"), p("authz.shop.svc.cluster.local"));
        assert_eq!(p("shop/authz.shop.svc.cluster.local"), p("shop/authz"));
        assert_eq!(
            p("shop/authz.example.com"),
            Ok(ProviderService {
                host: "authz.example.com".into(),
                namespace: Some("shop".into()),
                kubernetes: false
            })
        );
        assert_eq!(p("authz.example.com").map(|s| s.namespace), Ok(None));
        for bad in [
            "",
            "authz",
            "*.example.com",
            "Shop/authz",
            "a/b/c",
            "authz.shop.svc",
        ] {
            assert!(p(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn providers_in_namespaces_of_other_tenants_are_found() {
        let ps = providers(serde_json::json!([
            {"name": "mine", "envoyExtAuthzGrpc": {"service": "authz.shop.svc.cluster.local", "port": 9000}},
            {"name": "theirs", "envoyExtAuthzHttp": {"service": "bank/authz", "port": 80}},
            {"name": "se", "envoyExtAuthzHttp": {"service": "authz.example.com", "port": 80}},
            {"name": "file", "envoyFileAccessLog": {"path": "/dev/stdout"}}
        ]));
        let owner = |ns: &str| (ns == "bank").then(|| "a member of tenant \"green\"".to_string());
        let found = foreign_provider_namespaces(&ps, "spec.meshConfig", &owner);
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].field,
            "spec.meshConfig.extensionProviders[1].envoyExtAuthzHttp.service"
        );
        let text = found[0].to_string();
        assert!(
            text.contains("a provider outside the tenant is refused"),
            "{text}"
        );
    }
}
