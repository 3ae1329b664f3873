//! `VirtualService`: how requests to a host are routed (Istio's `networking.istio.io/v1`
//! VirtualService, field for field where supported).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::status::ConfigStatus;
use crate::duration::Duration;

/// Routing rules for the hosts of a VirtualService.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "networking.meshplane.io",
    version = "v1alpha1",
    kind = "VirtualService",
    doc = "Routing rules for requests to a host: matches, weights, retries, timeouts, faults (Istio-compatible).",
    namespaced,
    shortname = "vs",
    status = "ConfigStatus",
    printcolumn = r#"{"name":"Gateways","type":"string","jsonPath":".spec.gateways"}"#,
    printcolumn = r#"{"name":"Hosts","type":"string","jsonPath":".spec.hosts"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualServiceSpec {
    /// Hosts the rules apply to: FQDNs, `*.` wildcards, or short names resolved in this
    /// VirtualService's namespace (`reviews` is `reviews.<ns>.svc.cluster.local`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Gateways and sidecars the rules apply to: `mesh` (every sidecar, the default when empty),
    /// `<gateway>` (same namespace) or `<namespace>/<gateway>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    /// HTTP routes, in order: the first that matches a request is used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpRoute>,
    /// TLS routes by SNI for unterminated TLS, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls: Vec<TlsRoute>,
    /// TCP routes, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp: Vec<TcpRoute>,
    /// Namespaces that see these rules: `*` (the tenant, default), `.` (own namespace), `~`
    /// (nobody) or namespace names of the tenant. Never wider than the tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
}

/// One HTTP routing rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    /// Name of the route (Envoy route name, shown in access logs).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Conditions (OR of blocks, AND inside a block); empty matches every request.
    #[serde(default, rename = "match", skip_serializing_if = "Vec::is_empty")]
    pub match_: Vec<HttpMatchRequest>,
    /// Weighted destinations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<HttpRouteDestination>,
    /// Answer with a redirect instead of forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<HttpRedirect>,
    /// Answer directly instead of forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_response: Option<HttpDirectResponse>,
    /// Rewrite the path or authority before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<HttpRewrite>,
    /// Timeout of the whole request (retries included); absent or `0s`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Retry policy; absent: 2 retries on connect failures, refused streams and 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<HttpRetry>,
    /// Delays and aborts injected on the client side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<HttpFaultInjection>,
    /// Mirror requests to another destination (responses are discarded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Destination>,
    /// Share of requests mirrored by `mirror` (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_percentage: Option<Percent>,
    /// Deprecated (Istio still accepts it): the share mirrored by `mirror` as a whole number;
    /// `mirrorPercentage` wins when both are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub mirror_percent: Option<u32>,
    /// Several mirror destinations, each with its own share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<HttpMirrorPolicy>,
    /// Cross-origin resource sharing policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors_policy: Option<CorsPolicy>,
    /// Header changes for every destination of the route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

/// A set of conditions on a request, all of which must hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatchRequest {
    /// Name of the match (appended to the route name).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Path (without query string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    /// URI scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<StringMatch>,
    /// HTTP method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    /// Authority (Host) header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<StringMatch>,
    /// Request headers (names lowercase); `{}` as the value matches presence.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, StringMatch>,
    /// Port the request was addressed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u32>,
    /// Labels the calling workload must carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub source_labels: BTreeMap<String, String>,
    /// Gateways this match applies to (overrides the VirtualService's `gateways`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    /// Query parameters; `exact: ""` matches presence.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query_params: BTreeMap<String, StringMatch>,
    /// Match `uri` case-insensitively.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_uri_case: bool,
    /// Headers that must not match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub without_headers: BTreeMap<String, StringMatch>,
    /// Namespace the calling workload must be in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_namespace: String,
    /// Statistics prefix of the route.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stat_prefix: String,
}

/// A string condition: exactly one of `exact`, `prefix`, `regex` (RE2 syntax); none set
/// matches any value (presence, for headers).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StringMatch {
    /// The whole value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    /// A prefix of the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// An RE2 regular expression matching the whole value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// Where a request or connection goes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    /// Host from the tenant's registry (Service or ServiceEntry); short names resolve in the
    /// VirtualService's namespace.
    pub host: String,
    /// Subset of the host, declared by a DestinationRule.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subset: String,
    /// Port of the host; may be omitted when the host has one port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
}

/// A port of a host.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortSelector {
    /// Port number.
    #[schemars(range(min = 1, max = 65535))]
    pub number: u32,
}

/// A weighted HTTP destination.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteDestination {
    /// The destination.
    pub destination: Destination,
    /// Relative share of requests (weights of a route add up to 100 in Istio's convention; a
    /// single destination may omit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub weight: Option<i32>,
    /// Header changes for this destination only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

/// A weighted L4 destination.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteDestination {
    /// The destination.
    pub destination: Destination,
    /// Relative share of connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub weight: Option<i32>,
}

/// A redirect answer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRedirect {
    /// Replacement path.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uri: String,
    /// Replacement authority.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub authority: String,
    /// Replacement port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u32>,
    /// Port from the scheme's default or from the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derive_port: Option<RedirectPortSelection>,
    /// Replacement scheme.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scheme: String,
    /// Status code (301 by default; 301, 302, 303, 307 or 308).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_code: Option<u32>,
}

/// How a redirect picks its port.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RedirectPortSelection {
    /// 80 for http, 443 for https.
    FromProtocolDefault,
    /// The port of the request.
    FromRequestPort,
}

/// A direct answer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpDirectResponse {
    /// Status code.
    #[schemars(range(min = 200, max = 599))]
    pub status: u32,
    /// Body of the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<HttpBody>,
}

/// Body of a direct answer: `string` or base64 `bytes`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpBody {
    /// Text body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// Binary body, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
}

/// A rewrite before forwarding.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRewrite {
    /// Replaces the matched path prefix (or the whole path for exact and regex matches).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uri: String,
    /// Replaces the authority (Host) header.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub authority: String,
    /// Rewrites the path with a regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

/// A regular-expression path rewrite.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegexRewrite {
    /// RE2 expression.
    #[serde(rename = "match")]
    pub match_: String,
    /// Replacement, with `\1`-style group references.
    pub rewrite: String,
}

/// A retry policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRetry {
    /// Number of retries (0 disables retries).
    #[schemars(range(min = 0))]
    pub attempts: i32,
    /// Timeout of each attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<Duration>,
    /// Envoy retry conditions (`5xx`, `gateway-error`, `connect-failure`, `retriable-4xx`,
    /// `refused-stream`, `reset`, gRPC `cancelled`, `deadline-exceeded`, `unavailable`, ...)
    /// and status codes, comma-separated.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub retry_on: String,
    /// Retry on other localities' hosts too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_remote_localities: Option<bool>,
}

/// Faults injected on the client side.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpFaultInjection {
    /// Delay before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<FaultDelay>,
    /// Answer with an error instead of forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<FaultAbort>,
}

/// A fixed delay on a share of requests.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FaultDelay {
    /// The delay.
    pub fixed_delay: Duration,
    /// Share of requests delayed (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
    /// Deprecated (Istio still accepts it): the share delayed as a whole number; `percentage`
    /// wins when both are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub percent: Option<i32>,
}

impl FaultDelay {
    /// The share of requests delayed: `percentage`, else the deprecated `percent`, as Istio
    /// reads them; `None`: every request.
    pub fn effective_percentage(&self) -> Option<Percent> {
        self.percentage.or(self.percent.map(|p| Percent {
            value: f64::from(p),
        }))
    }
}

impl HttpRoute {
    /// The share of requests `mirror` copies: `mirrorPercentage`, else the deprecated
    /// `mirrorPercent`, as Istio reads them; `None`: every request.
    pub fn effective_mirror_percentage(&self) -> Option<Percent> {
        self.mirror_percentage
            .or(self.mirror_percent.map(|p| Percent {
                value: f64::from(p),
            }))
    }
}

/// An error answer on a share of requests.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FaultAbort {
    /// HTTP status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 200, max = 599))]
    pub http_status: Option<u32>,
    /// gRPC status name (`UNAVAILABLE`, ...) or number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<String>,
    /// Share of requests aborted (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

/// A percentage in [0, 100].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Percent {
    /// The percentage.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub value: f64,
}

/// One mirror destination.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpMirrorPolicy {
    /// The destination.
    pub destination: Destination,
    /// Share of requests mirrored (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

/// Cross-origin resource sharing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CorsPolicy {
    /// Origins allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_origins: Vec<StringMatch>,
    /// Methods allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_methods: Vec<String>,
    /// Request headers allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
    /// Response headers exposed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    /// How long preflight answers may be cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    /// Whether credentials are allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    /// What to do with preflight requests that match no allowed origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmatched_preflights: Option<UnmatchedPreflights>,
}

/// Handling of unmatched CORS preflights.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UnmatchedPreflights {
    /// Forward them (the default).
    UnspecifiedPreflight,
    /// Forward them to the upstream.
    Forward,
    /// Answer them without CORS headers.
    Ignore,
}

/// Header changes of requests and responses.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Headers {
    /// Changes to the request before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    /// Changes to the response before answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

/// Set, add and remove headers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderOperations {
    /// Overwrite (or add) these headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Append these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    /// Remove these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// A rule for unterminated TLS, by SNI.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsRoute {
    /// Conditions (OR of blocks).
    #[serde(rename = "match")]
    #[schemars(length(min = 1))]
    pub match_: Vec<TlsMatchAttributes>,
    /// Weighted destinations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<RouteDestination>,
}

/// Conditions on a TLS connection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsMatchAttributes {
    /// SNI values (wildcards allowed); required.
    #[schemars(length(min = 1))]
    pub sni_hosts: Vec<String>,
    /// Destination IPs or CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_subnets: Vec<String>,
    /// Destination port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u32>,
    /// Labels of the calling workload.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub source_labels: BTreeMap<String, String>,
    /// Gateways this match applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    /// Namespace of the calling workload.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_namespace: String,
}

/// A rule for opaque TCP.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpRoute {
    /// Conditions (OR of blocks); empty matches every connection.
    #[serde(default, rename = "match", skip_serializing_if = "Vec::is_empty")]
    pub match_: Vec<L4MatchAttributes>,
    /// Weighted destinations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<RouteDestination>,
}

/// Conditions on a TCP connection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct L4MatchAttributes {
    /// Destination IPs or CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_subnets: Vec<String>,
    /// Destination port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u32>,
    /// Labels of the calling workload.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub source_labels: BTreeMap<String, String>,
    /// Gateways this match applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    /// Namespace of the calling workload.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_namespace: String,
}
