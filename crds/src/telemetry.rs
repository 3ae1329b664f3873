//! `telemetry.meshplane.io/v1alpha1` `Telemetry`: access logging, tracing and request metrics
//! of workloads, field-compatible with Istio's `telemetry.istio.io` Telemetry.
//!
//! Three levels, the most specific winning (Istio's hierarchy): a Telemetry without a selector
//! in the tenant's control namespace (tenant-wide, as Istio's root namespace), one without a
//! selector in the workload's namespace, and one whose `selector` matches the workload's labels
//! in its namespace. Which Telemetries apply and what they mean together is decided in one
//! place, [`effective`], for every consumer (translation, status, meshctl).

use std::collections::{BTreeMap, BTreeSet};

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::networking::status::ConfigStatus;
use crate::security::authorization::PolicyTargetReference;
use crate::security::LabelsSelector;

/// The built-in access log provider (Istio's `envoy`): a file log at the revision's
/// `meshConfig.accessLogging.path` (`/dev/stdout` by default) in its `encoding`.
pub const ENVOY_PROVIDER: &str = "envoy";
/// The built-in metrics provider (Istio's `prometheus`): the sidecar's request statistics on
/// its `/stats/prometheus`.
pub const PROMETHEUS_PROVIDER: &str = "prometheus";

/// Why `targetRef`/`targetRefs` are refused on a Telemetry.
pub const TARGET_REF_UNSUPPORTED: &str = "targetRef and targetRefs are not supported by meshplane sidecars; select workloads with spec.selector.matchLabels";

/// Which side of a workload's traffic a setting is for.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkloadMode {
    /// Both: requests the workload makes and requests it serves.
    #[default]
    ClientAndServer,
    /// Requests the workload makes (its outbound traffic).
    Client,
    /// Requests the workload serves (its inbound traffic).
    Server,
}

impl WorkloadMode {
    /// Whether the mode covers `side`.
    pub fn covers(self, side: Side) -> bool {
        matches!(
            (self, side),
            (WorkloadMode::ClientAndServer, _)
                | (WorkloadMode::Client, Side::Client)
                | (WorkloadMode::Server, Side::Server)
        )
    }
}

/// One side of a workload's traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Side {
    /// Outbound: the workload is the client.
    Client,
    /// Inbound: the workload is the server.
    Server,
}

impl Side {
    /// Both sides, client first.
    pub const BOTH: [Side; 2] = [Side::Client, Side::Server];
}

/// A provider by name: a built-in one (`envoy`, `prometheus`) or one of the revision's
/// `meshConfig.extensionProviders`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderRef {
    /// Name of the provider.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Selects the side a rule is for.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModeSelector {
    /// `CLIENT_AND_SERVER` (default), `CLIENT` or `SERVER`.
    #[serde(default)]
    pub mode: WorkloadMode,
}

/// A condition on the requests and connections to log.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessLogFilter {
    /// A CEL expression over Envoy's attributes (`response.code >= 400`, say); only requests
    /// and connections for which it is true are logged (Envoy's CEL access log filter).
    #[schemars(length(min = 1, max = 4096))]
    pub expression: String,
}

/// Access logging of the selected workloads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessLogging {
    /// The side this rule is for.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<ModeSelector>,
    /// The providers the rule is about; none: the built-in `envoy` provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub providers: Vec<ProviderRef>,
    /// `true` turns logging to these providers off (for this level and those below it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Log only what matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<AccessLogFilter>,
}

/// A constant tag value.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LiteralTag {
    /// The value.
    pub value: String,
}

/// A tag taken from the proxy's environment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentTag {
    /// Name of the environment variable.
    pub name: String,
    /// Value when the variable is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_value: Option<String>,
}

/// A tag taken from a request header.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderTag {
    /// Name of the header.
    pub name: String,
    /// Value when the header is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_value: Option<String>,
}

/// A tag added to every span: exactly one of `literal`, `environment`, `header`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.literal), has(self.environment), has(self.header)].filter(x, x).size() == 1",
    "message": "a custom tag is exactly one of literal, environment, header"
}]))]
pub struct CustomTag {
    /// A constant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub literal: Option<LiteralTag>,
    /// An environment variable of the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvironmentTag>,
    /// A request header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<HeaderTag>,
}

/// Tracing of the selected workloads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tracing {
    /// The side this rule is for.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<ModeSelector>,
    /// The tracing provider (an `opentelemetry` extension provider); only the first is used,
    /// as in Istio.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub providers: Vec<ProviderRef>,
    /// Percentage of requests (0 to 100) that start a trace; unset: inherited, 1 at the top
    /// (Istio's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub random_sampling_percentage: Option<f64>,
    /// `true`: spans are not reported (trace context still propagates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_span_reporting: Option<bool>,
    /// Tags added to every span, by tag name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom_tags: BTreeMap<String, CustomTag>,
    /// Accepted for compatibility; Envoy's OpenTelemetry tracer samples by `x-request-id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_request_id_for_trace_sampling: Option<bool>,
    /// Istio's own span tags (`istio.canonical_service`, `istio.canonical_revision`,
    /// `istio.mesh_id`, `istio.namespace`, `istio.cluster_id`); unset: inherited, on at the top.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_istio_tags: Option<bool>,
}

/// Istio's standard metrics.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum IstioMetric {
    /// Every metric.
    #[default]
    AllMetrics,
    /// `istio_requests_total`.
    RequestCount,
    /// `istio_request_duration_milliseconds`.
    RequestDuration,
    /// `istio_request_bytes`.
    RequestSize,
    /// `istio_response_bytes`.
    ResponseSize,
    /// `istio_tcp_connections_opened_total`.
    TcpOpenedConnections,
    /// `istio_tcp_connections_closed_total`.
    TcpClosedConnections,
    /// `istio_tcp_sent_bytes_total`.
    TcpSentBytes,
    /// `istio_tcp_received_bytes_total`.
    TcpReceivedBytes,
    /// `istio_request_messages_total` (not produced by meshplane).
    GrpcRequestMessages,
    /// `istio_response_messages_total` (not produced by meshplane).
    GrpcResponseMessages,
}

/// Which metric an override is about.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricSelector {
    /// One of Istio's standard metrics; unset with no `customMetric`: every metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<IstioMetric>,
    /// A metric by name (accepted; meshplane produces only the standard ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_metric: Option<String>,
    /// The side.
    #[serde(default)]
    pub mode: WorkloadMode,
}

/// What a tag override does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TagOperation {
    /// Set the tag.
    #[default]
    Upsert,
    /// Leave the tag out (its value becomes empty).
    Remove,
}

/// A change of one metric label.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TagOverride {
    /// `UPSERT` (default) or `REMOVE`.
    #[serde(default)]
    pub operation: TagOperation,
    /// For `UPSERT`: the value, an expression: a string literal (`"'canary'"`) or one of the
    /// request attributes that Envoy's command operators give (`request.host`,
    /// `request.headers['x-user']`, `response.code`, ...: [`tag_value_format`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A change to metrics.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsOverride {
    /// The metric and side; unset: every metric, both sides.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<MetricSelector>,
    /// `true`: the metric is not produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Label changes, by label name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tag_overrides: BTreeMap<String, TagOverride>,
}

/// Request metrics of the selected workloads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// The providers (only the built-in `prometheus`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub providers: Vec<ProviderRef>,
    /// Changes, applied in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub overrides: Vec<MetricsOverride>,
    /// Accepted for compatibility (Prometheus scrapes at its own interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporting_interval: Option<String>,
}

/// How the selected workloads (or the whole namespace, or the whole tenant from the control
/// namespace) log, trace and count their requests.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "telemetry.meshplane.io",
    version = "v1alpha1",
    kind = "Telemetry",
    plural = "telemetries",
    doc = "Access logging, tracing and request metrics of workloads: tenant-wide from the control namespace, per namespace, or per workload selector (Istio-compatible).",
    namespaced,
    shortname = "telemetry",
    status = "ConfigStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.targetRef) && !has(self.targetRefs)", "message": "targetRef and targetRefs are not supported by meshplane sidecars; select workloads with spec.selector.matchLabels"}
]))]
#[serde(rename_all = "camelCase")]
pub struct TelemetrySpec {
    /// Workloads of the namespace this Telemetry applies to; absent: the whole namespace (in
    /// the control namespace: the whole tenant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelsSelector>,
    /// Not supported (refused): Istio's attachment to a Gateway or Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    /// Not supported (refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<PolicyTargetReference>,
    /// Tracing rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tracing: Vec<Tracing>,
    /// Request metrics rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub metrics: Vec<Metrics>,
    /// Access logging rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub access_logging: Vec<AccessLogging>,
}

/// One access log a side of a workload writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LogSink {
    /// The provider's name (`envoy` or an extension provider).
    pub provider: String,
    /// Only what this CEL expression accepts.
    pub filter: Option<String>,
}

/// The tracing in force on one side of a workload.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EffectiveTracing {
    /// The provider; `None`: no tracing.
    pub provider: Option<String>,
    /// Percentage of requests that start a trace (1 unless set, as Istio).
    pub sampling: f64,
    /// Spans are not reported.
    pub disable_span_reporting: bool,
    /// Tags added to spans.
    pub custom_tags: BTreeMap<String, CustomTag>,
    /// Istio's own span tags are added.
    pub istio_tags: bool,
}

/// The standard metrics meshplane produces, each one of [`IstioMetric`] but `ALL_METRICS`.
pub const PRODUCED_METRICS: [IstioMetric; 8] = [
    IstioMetric::RequestCount,
    IstioMetric::RequestDuration,
    IstioMetric::RequestSize,
    IstioMetric::ResponseSize,
    IstioMetric::TcpOpenedConnections,
    IstioMetric::TcpClosedConnections,
    IstioMetric::TcpSentBytes,
    IstioMetric::TcpReceivedBytes,
];

/// What the metric overrides of one side say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct EffectiveMetrics {
    /// Metrics that are not produced.
    pub disabled: BTreeSet<IstioMetric>,
    /// Label overrides per metric: `Some(format)` sets the label to an Envoy command-operator
    /// format ([`tag_value_format`]), `None` removes it.
    pub tags: BTreeMap<IstioMetric, BTreeMap<String, Option<String>>>,
}

impl EffectiveMetrics {
    /// Whether `metric` is produced.
    pub fn produced(&self, metric: IstioMetric) -> bool {
        !self.disabled.contains(&metric)
    }

    /// The label overrides of `metric`.
    pub fn tags_of(&self, metric: IstioMetric) -> Option<&BTreeMap<String, Option<String>>> {
        self.tags.get(&metric)
    }
}

/// Everything the Telemetries (and the revision's access log switch) decide for one workload,
/// per side.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EffectiveTelemetry {
    /// The access logs of outbound (client) traffic.
    pub client_logs: Vec<LogSink>,
    /// The access logs of inbound (server) traffic.
    pub server_logs: Vec<LogSink>,
    /// Tracing of outbound traffic.
    pub client_tracing: EffectiveTracing,
    /// Tracing of inbound traffic.
    pub server_tracing: EffectiveTracing,
    /// Request metrics as a client.
    pub client_metrics: EffectiveMetrics,
    /// Request metrics as a server.
    pub server_metrics: EffectiveMetrics,
}

impl EffectiveTelemetry {
    /// The access logs of `side`.
    pub fn logs(&self, side: Side) -> &[LogSink] {
        match side {
            Side::Client => &self.client_logs,
            Side::Server => &self.server_logs,
        }
    }

    /// The tracing of `side`.
    pub fn tracing(&self, side: Side) -> &EffectiveTracing {
        match side {
            Side::Client => &self.client_tracing,
            Side::Server => &self.server_tracing,
        }
    }

    /// The metrics of `side`.
    pub fn metrics(&self, side: Side) -> &EffectiveMetrics {
        match side {
            Side::Client => &self.client_metrics,
            Side::Server => &self.server_metrics,
        }
    }
}

/// Environment variable of the sidecar holding its workload's name ([`pod_workload`]), set
/// by the injector; the sidecar's request metrics read it.
pub const WORKLOAD_ENV: &str = "MESHPLANE_WORKLOAD";

/// The workload a pod belongs to, as Istio names it in metrics: the Deployment of a
/// ReplicaSet's pod (the ReplicaSet's name without its `-<pod-template-hash>`), the owner of
/// any other controlled pod (StatefulSet, DaemonSet, Job, ...), else the pod itself.
pub fn pod_workload(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    let meta = &pod.metadata;
    let owner = meta
        .owner_references
        .as_ref()
        .and_then(|o| o.iter().find(|r| r.controller == Some(true)).or(o.first()));
    if let Some(owner) = owner {
        let hash = meta
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-template-hash"))
            .filter(|h| !h.is_empty());
        if owner.kind == "ReplicaSet" {
            if let Some(base) = hash.and_then(|h| owner.name.strip_suffix(&format!("-{h}"))) {
                return base.to_string();
            }
        }
        return owner.name.clone();
    }
    meta.name
        .clone()
        .or_else(|| meta.generate_name.clone())
        .unwrap_or_else(|| "unknown".to_string())
}

fn has_selector(t: &Telemetry) -> bool {
    t.spec
        .selector
        .as_ref()
        .is_some_and(|s| !s.match_labels.is_empty())
}

fn oldest_first(list: &mut [&Telemetry]) {
    list.sort_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
    });
}

/// The Telemetries that apply to a workload with `labels` in `namespace`, least specific
/// first: the tenant-wide one (control namespace, no selector), the namespace's (no
/// selector), the workload's (a matching selector in its namespace). Where Istio's rule of one
/// Telemetry per level is broken, the oldest (then first by name) counts, as Istio picks.
pub fn applicable<'a>(
    telemetries: impl IntoIterator<Item = &'a Telemetry>,
    control_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a Telemetry> {
    let (mut root, mut ns, mut workload) = (Vec::new(), Vec::new(), Vec::new());
    for t in telemetries {
        let t_ns = t.metadata.namespace.as_deref().unwrap_or_default();
        if has_selector(t) {
            if t_ns == namespace && LabelsSelector::admits(&t.spec.selector, labels) {
                workload.push(t);
            }
        } else if t_ns == namespace && namespace != control_namespace {
            ns.push(t);
        } else if t_ns == control_namespace {
            root.push(t);
        }
    }
    let mut out = Vec::new();
    for level in [&mut root, &mut ns, &mut workload] {
        oldest_first(level);
        out.extend(level.first().copied());
    }
    out
}

/// What the revision says before any Telemetry does.
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    /// Access log providers every workload writes to on both sides: the built-in `envoy` when
    /// `meshConfig.accessLogging.enabled`, and `meshConfig.defaultProviders.accessLogging`.
    pub access_logging: Vec<String>,
    /// What an access logging rule that names no provider is about:
    /// `defaultProviders.accessLogging`, else the built-in `envoy`.
    pub unnamed_access_logging: Vec<String>,
    /// Metrics providers besides the built-in `prometheus` (extension providers of kind
    /// `prometheus`): a metrics rule naming one of them is about the request metrics.
    pub metrics_providers: Vec<String>,
    /// Sampling percentage where no Telemetry sets one (`defaultConfig.tracing.sampling`,
    /// else Istio's 1%).
    pub sampling: f64,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            access_logging: Vec::new(),
            unnamed_access_logging: vec![ENVOY_PROVIDER.to_string()],
            metrics_providers: Vec::new(),
            sampling: DEFAULT_SAMPLING,
        }
    }
}

/// Default sampling percentage when no level sets one (Istio's).
pub const DEFAULT_SAMPLING: f64 = 1.0;

/// The metrics a selector is about.
fn metrics_of(metric: IstioMetric) -> Vec<IstioMetric> {
    match metric {
        IstioMetric::AllMetrics => PRODUCED_METRICS.to_vec(),
        IstioMetric::GrpcRequestMessages | IstioMetric::GrpcResponseMessages => Vec::new(),
        one => vec![one],
    }
}

/// What the Telemetries `applicable` returned (least specific first) mean for one workload:
/// for each side, each level overrides what the levels above it said about the same provider
/// (access logs), the same setting (tracing) or the same metric and label (metrics).
pub fn effective(applicable: &[&Telemetry], defaults: &Defaults) -> EffectiveTelemetry {
    let mut out = EffectiveTelemetry::default();
    for side in Side::BOTH {
        // Access logs: provider -> (enabled, filter).
        let mut logs: BTreeMap<String, (bool, Option<String>)> = BTreeMap::new();
        for p in &defaults.access_logging {
            logs.insert(p.clone(), (true, None));
        }
        let mut tracing = EffectiveTracing {
            sampling: defaults.sampling,
            istio_tags: true,
            ..EffectiveTracing::default()
        };
        let mut metrics = EffectiveMetrics::default();
        for t in applicable {
            for rule in &t.spec.access_logging {
                if !rule.match_.clone().unwrap_or_default().mode.covers(side) {
                    continue;
                }
                let providers: Vec<String> = if rule.providers.is_empty() {
                    defaults.unnamed_access_logging.clone()
                } else {
                    rule.providers.iter().map(|p| p.name.clone()).collect()
                };
                for p in providers {
                    let filter = rule.filter.as_ref().map(|f| f.expression.clone());
                    logs.insert(p, (rule.disabled != Some(true), filter));
                }
            }
            for rule in &t.spec.tracing {
                if !rule.match_.clone().unwrap_or_default().mode.covers(side) {
                    continue;
                }
                if let Some(p) = rule.providers.first() {
                    tracing.provider = Some(p.name.clone());
                }
                if let Some(s) = rule.random_sampling_percentage {
                    tracing.sampling = s;
                }
                if let Some(d) = rule.disable_span_reporting {
                    tracing.disable_span_reporting = d;
                }
                if let Some(i) = rule.enable_istio_tags {
                    tracing.istio_tags = i;
                }
                for (k, v) in &rule.custom_tags {
                    tracing.custom_tags.insert(k.clone(), v.clone());
                }
            }
            for rule in &t.spec.metrics {
                let prometheus = rule.providers.is_empty()
                    || rule.providers.iter().any(|p| {
                        p.name == PROMETHEUS_PROVIDER
                            || defaults.metrics_providers.contains(&p.name)
                    });
                if !prometheus {
                    continue;
                }
                for o in &rule.overrides {
                    let m = o.match_.clone().unwrap_or_default();
                    if !m.mode.covers(side) || m.custom_metric.is_some() {
                        continue;
                    }
                    for metric in metrics_of(m.metric.unwrap_or_default()) {
                        match o.disabled {
                            Some(true) => {
                                metrics.disabled.insert(metric);
                            }
                            Some(false) => {
                                metrics.disabled.remove(&metric);
                            }
                            None => {}
                        }
                        for (tag, change) in &o.tag_overrides {
                            let value = match change.operation {
                                TagOperation::Remove => None,
                                TagOperation::Upsert => Some(
                                    tag_value_format(change.value.as_deref().unwrap_or_default())
                                        .unwrap_or_default(),
                                ),
                            };
                            metrics
                                .tags
                                .entry(metric)
                                .or_default()
                                .insert(tag.clone(), value);
                        }
                    }
                }
            }
        }
        let sinks: Vec<LogSink> = logs
            .into_iter()
            .filter(|(_, (on, _))| *on)
            .map(|(provider, (_, filter))| LogSink { provider, filter })
            .collect();
        match side {
            Side::Client => {
                out.client_logs = sinks;
                out.client_tracing = tracing;
                out.client_metrics = metrics;
            }
            Side::Server => {
                out.server_logs = sinks;
                out.server_tracing = tracing;
                out.server_metrics = metrics;
            }
        }
    }
    out
}

/// The request attributes a tag override's value may name, and the Envoy command operator
/// that gives each per request or connection (Istio's attribute names).
pub const TAG_ATTRIBUTES: &[(&str, &str)] = &[
    ("request.host", "%REQ(:AUTHORITY)%"),
    ("request.method", "%REQ(:METHOD)%"),
    ("request.path", "%REQ(:PATH)%"),
    ("request.url_path", "%PATH(NQ)%"),
    ("request.scheme", "%REQ(:SCHEME)%"),
    ("request.protocol", "%PROTOCOL%"),
    ("request.id", "%REQ(X-REQUEST-ID)%"),
    ("request.referer", "%REQ(REFERER)%"),
    ("request.useragent", "%REQ(USER-AGENT)%"),
    ("response.code", "%RESPONSE_CODE%"),
    ("response.code_details", "%RESPONSE_CODE_DETAILS%"),
    ("response.flags", "%RESPONSE_FLAGS%"),
    ("response.grpc_status", "%GRPC_STATUS_NUMBER%"),
    ("source.address", "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"),
    ("source.port", "%DOWNSTREAM_REMOTE_PORT%"),
    (
        "destination.address",
        "%DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT%",
    ),
    ("destination.port", "%DOWNSTREAM_LOCAL_PORT%"),
    (
        "connection.requested_server_name",
        "%REQUESTED_SERVER_NAME%",
    ),
    ("upstream.address", "%UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"),
    ("upstream.port", "%UPSTREAM_REMOTE_PORT%"),
    ("xds.cluster_name", "%UPSTREAM_CLUSTER_RAW%"),
    ("xds.route_name", "%ROUTE_NAME%"),
];

/// The Envoy command-operator format of a tag override's value: a CEL string literal
/// (`'canary'`, `%` escaped), one attribute of [`TAG_ATTRIBUTES`], or a request or response
/// header (`request.headers['x-user']`, `response.headers['x-cache']`). `None`: an expression
/// meshplane cannot evaluate (operators, functions, conditionals).
pub fn tag_value_format(expr: &str) -> Option<String> {
    let t = expr.trim();
    if is_string_literal(t) {
        return Some(string_literal(t).replace('%', "%%"));
    }
    if let Some((_, op)) = TAG_ATTRIBUTES.iter().find(|(a, _)| *a == t) {
        return Some((*op).to_string());
    }
    for (prefix, op) in [("request.headers", "REQ"), ("response.headers", "RESP")] {
        let Some(index) = t.strip_prefix(prefix) else {
            continue;
        };
        let inner = index.strip_prefix('[')?.strip_suffix(']')?.trim();
        if !is_string_literal(inner) {
            return None;
        }
        let name = string_literal(inner);
        let header = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        return header.then(|| format!("%{op}({name})%"));
    }
    None
}

/// The value of a CEL string literal (`'canary'` or `"canary"`); anything else as written.
pub fn string_literal(expr: &str) -> String {
    let t = expr.trim();
    for q in ['\'', '"'] {
        if let Some(inner) = t.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner.to_string();
        }
    }
    t.to_string()
}

/// Whether `expr` is a CEL string literal (what meshplane evaluates in tag overrides).
pub fn is_string_literal(expr: &str) -> bool {
    let t = expr.trim();
    ['\'', '"'].iter().any(|q| {
        t.len() >= 2
            && t.starts_with(*q)
            && t.ends_with(*q)
            && !t[1..t.len() - 1].contains(*q)
            && !t[1..t.len() - 1].contains('\\')
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn telemetry(ns: &str, name: &str, spec: serde_json::Value) -> Telemetry {
        let mut t = Telemetry::new(name, serde_json::from_value(spec).expect("spec"));
        t.metadata.namespace = Some(ns.into());
        t
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn istio_manifests_decode() {
        let t = telemetry(
            "shop",
            "all",
            json!({
                "selector": {"matchLabels": {"app": "web"}},
                "accessLogging": [{"providers": [{"name": "envoy"}], "filter": {"expression": "response.code >= 400"}, "match": {"mode": "SERVER"}}],
                "tracing": [{"providers": [{"name": "otel"}], "randomSamplingPercentage": 10.0,
                             "customTags": {"env": {"literal": {"value": "prod"}}, "user": {"header": {"name": "x-user", "defaultValue": "anon"}},
                                            "pod": {"environment": {"name": "POD_NAME"}}},
                             "disableSpanReporting": false, "match": {"mode": "CLIENT"}}],
                "metrics": [{"providers": [{"name": "prometheus"}], "overrides": [
                    {"match": {"metric": "REQUEST_COUNT", "mode": "CLIENT"}, "disabled": true},
                    {"match": {"metric": "ALL_METRICS"}, "tagOverrides": {"request_protocol": {"operation": "REMOVE"}}}]}]
            }),
        );
        assert_eq!(t.spec.tracing[0].random_sampling_percentage, Some(10.0));
        assert_eq!(
            t.spec.access_logging[0].match_.as_ref().map(|m| m.mode),
            Some(WorkloadMode::Server)
        );
    }

    #[test]
    fn the_most_specific_level_wins_and_each_level_counts_once() {
        let root = telemetry(
            "meshplane-blue",
            "mesh",
            json!({"accessLogging": [{}], "tracing": [{"providers": [{"name": "otel"}], "randomSamplingPercentage": 5.0}]}),
        );
        let ns = telemetry(
            "shop",
            "ns",
            json!({"tracing": [{"randomSamplingPercentage": 50.0}]}),
        );
        let web = telemetry(
            "shop",
            "web",
            json!({"selector": {"matchLabels": {"app": "web"}}, "accessLogging": [{"disabled": true}]}),
        );
        let other_ns = telemetry(
            "bank",
            "web",
            json!({"selector": {"matchLabels": {"app": "web"}}}),
        );
        let all = [root.clone(), ns.clone(), web.clone(), other_ns];
        let applied = applicable(&all, "meshplane-blue", "shop", &labels(&[("app", "web")]));
        let names: Vec<_> = applied.iter().map(|t| t.metadata.name.clone()).collect();
        assert_eq!(
            names,
            vec![Some("mesh".into()), Some("ns".into()), Some("web".into())]
        );
        let e = effective(&applied, &Defaults::default());
        assert!(e.server_logs.is_empty() && e.client_logs.is_empty());
        assert_eq!(e.client_tracing.provider.as_deref(), Some("otel"));
        assert_eq!(e.client_tracing.sampling, 50.0);

        // Another workload of the namespace keeps the tenant-wide access log.
        let applied = applicable(&all, "meshplane-blue", "shop", &labels(&[("app", "db")]));
        let e = effective(&applied, &Defaults::default());
        assert_eq!(
            e.server_logs,
            vec![LogSink {
                provider: ENVOY_PROVIDER.into(),
                filter: None
            }]
        );
        // A selector in the control namespace selects workloads of the control namespace only.
        let rooted = telemetry(
            "meshplane-blue",
            "sel",
            json!({"selector": {"matchLabels": {"app": "db"}}, "accessLogging": [{"disabled": true}]}),
        );
        let applied = applicable(
            std::slice::from_ref(&rooted),
            "meshplane-blue",
            "shop",
            &labels(&[("app", "db")]),
        );
        assert!(applied.is_empty());
    }

    #[test]
    fn the_revision_switch_is_the_default_and_a_telemetry_can_turn_it_off_per_side() {
        let t = telemetry(
            "shop",
            "ns",
            json!({"accessLogging": [{"disabled": true, "match": {"mode": "CLIENT"}}]}),
        );
        let on = Defaults {
            access_logging: vec![ENVOY_PROVIDER.into()],
            ..Defaults::default()
        };
        let e = effective(&[&t], &on);
        assert!(e.client_logs.is_empty());
        assert_eq!(e.server_logs.len(), 1);
        let e = effective(&[], &on);
        assert_eq!(e.client_logs.len(), 1);
    }

    #[test]
    fn metric_overrides_disable_and_relabel_per_side() {
        let t = telemetry(
            "shop",
            "ns",
            json!({"metrics": [{"overrides": [
                {"match": {"metric": "REQUEST_COUNT", "mode": "SERVER"}, "disabled": true},
                {"match": {"metric": "TCP_SENT_BYTES"}, "disabled": true},
                {"tagOverrides": {"destination_service": {"operation": "REMOVE"}, "source_workload": {"value": "'batch'"}}}]}]}),
        );
        let e = effective(&[&t], &Defaults::default());
        assert!(!e.server_metrics.produced(IstioMetric::RequestCount));
        assert!(e.server_metrics.produced(IstioMetric::RequestDuration));
        assert!(e.client_metrics.produced(IstioMetric::RequestCount));
        assert!(!e.client_metrics.produced(IstioMetric::TcpSentBytes));
        assert!(e.client_metrics.produced(IstioMetric::TcpReceivedBytes));
        for metric in PRODUCED_METRICS {
            let tags = e.client_metrics.tags_of(metric).expect("ALL_METRICS");
            assert_eq!(tags["destination_service"], None);
            assert_eq!(tags["source_workload"].as_deref(), Some("batch"));
        }
    }

    #[test]
    fn workload_names_follow_the_pod_owner() {
        let pod = |v: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(v).expect("pod")
        };
        let owned = |kind: &str, name: &str, labels: serde_json::Value| {
            pod(json!({"metadata": {"name": "x-1", "labels": labels,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true}]}}))
        };
        assert_eq!(
            pod_workload(&owned(
                "ReplicaSet",
                "web-v1-7d9f8c6b5",
                json!({"pod-template-hash": "7d9f8c6b5"})
            )),
            "web-v1"
        );
        assert_eq!(pod_workload(&owned("StatefulSet", "db", json!({}))), "db");
        assert_eq!(
            pod_workload(&pod(json!({"metadata": {"name": "standalone"}}))),
            "standalone"
        );
    }

    #[test]
    fn tag_overrides_are_per_metric_and_name_request_attributes() {
        let t = telemetry(
            "shop",
            "ns",
            json!({"metrics": [{"providers": [{"name": "prom"}], "overrides": [
                {"match": {"metric": "REQUEST_COUNT"}, "tagOverrides": {"host": {"value": "request.host"}, "user": {"value": "request.headers['x-user']"}}},
                {"match": {"metric": "TCP_OPENED_CONNECTIONS"}, "tagOverrides": {"port": {"value": "destination.port"}}},
                {"match": {"metric": "GRPC_REQUEST_MESSAGES"}, "disabled": true}]}]}),
        );
        // `prom` is a prometheus extension provider of the revision: the rule applies.
        let defaults = Defaults {
            metrics_providers: vec!["prom".into()],
            ..Defaults::default()
        };
        let e = effective(&[&t], &defaults);
        let count = e
            .server_metrics
            .tags_of(IstioMetric::RequestCount)
            .expect("count");
        assert_eq!(count["host"].as_deref(), Some("%REQ(:AUTHORITY)%"));
        assert_eq!(count["user"].as_deref(), Some("%REQ(x-user)%"));
        assert!(e
            .server_metrics
            .tags_of(IstioMetric::RequestDuration)
            .is_none());
        let opened = e
            .server_metrics
            .tags_of(IstioMetric::TcpOpenedConnections)
            .expect("tcp");
        assert_eq!(opened["port"].as_deref(), Some("%DOWNSTREAM_LOCAL_PORT%"));
        assert!(PRODUCED_METRICS
            .iter()
            .all(|m| e.server_metrics.produced(*m)));
        // Without the provider declared, a rule naming it is not about these metrics.
        let e = effective(&[&t], &Defaults::default());
        assert!(e.server_metrics.tags.is_empty());
    }

    #[test]
    fn default_access_log_providers_and_sampling_come_from_the_revision() {
        let defaults = Defaults {
            access_logging: vec!["file".into(), "als".into()],
            unnamed_access_logging: vec!["file".into(), "als".into()],
            metrics_providers: Vec::new(),
            sampling: 25.0,
        };
        let e = effective(&[], &defaults);
        let names: Vec<&str> = e.client_logs.iter().map(|s| s.provider.as_str()).collect();
        assert_eq!(names, ["als", "file"]);
        assert_eq!(e.client_tracing.sampling, 25.0);
        assert!(e.client_tracing.istio_tags);
        // A rule naming no provider is about the default providers.
        let t = telemetry(
            "shop",
            "ns",
            json!({"accessLogging": [{"match": {"mode": "SERVER"}, "disabled": true}],
                   "tracing": [{"enableIstioTags": false}]}),
        );
        let e = effective(&[&t], &defaults);
        assert!(e.server_logs.is_empty());
        assert_eq!(e.client_logs.len(), 2);
        assert!(!e.server_tracing.istio_tags);
    }

    #[test]
    fn tag_value_formats() {
        assert_eq!(tag_value_format("'50%'").as_deref(), Some("50%%"));
        assert_eq!(
            tag_value_format(" response.code ").as_deref(),
            Some("%RESPONSE_CODE%")
        );
        assert_eq!(
            tag_value_format("response.headers[\"x-cache\"]").as_deref(),
            Some("%RESP(x-cache)%")
        );
        for refused in [
            "request.host + 'x'",
            "request.headers['a)%']",
            "request.headers[x]",
            "has(request.host) ? request.host : 'none'",
            "node.metadata['X']",
            "",
        ] {
            assert_eq!(tag_value_format(refused), None, "{refused:?}");
        }
    }

    #[test]
    fn string_literals() {
        assert!(is_string_literal("'canary'"));
        assert!(is_string_literal("\"canary\""));
        assert!(!is_string_literal("request.host"));
        assert!(!is_string_literal("'a' + 'b'"));
        assert_eq!(string_literal(" 'v1' "), "v1");
    }
}
