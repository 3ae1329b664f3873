//! `DestinationRule`: subsets of a host and the policies of the traffic sent to it (Istio's
//! `networking.istio.io/v1` DestinationRule, field for field where supported).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::status::ConfigStatus;
use super::virtual_service::PortSelector;
use crate::duration::Duration;

/// Subsets and traffic policies of a host.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "networking.meshplane.io",
    version = "v1alpha1",
    kind = "DestinationRule",
    doc = "Subsets of a host and policies for traffic to it: load balancing, connection pools, outlier detection, TLS (Istio-compatible).",
    namespaced,
    shortname = "dr",
    status = "ConfigStatus",
    printcolumn = r#"{"name":"Host","type":"string","jsonPath":".spec.host"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    /// Host the rule applies to: an FQDN, a `*.` wildcard, or a short name resolved in this
    /// DestinationRule's namespace.
    #[schemars(length(min = 1))]
    pub host: String,
    /// Policy for all traffic to the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
    /// Named subsets (versions) of the host, selected by endpoint labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subsets: Vec<Subset>,
    /// Namespaces that see this rule: `*` (the tenant, default), `.`, `~` or namespace names of
    /// the tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
}

/// A named group of a host's endpoints.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Subset {
    /// Name, used by `destination.subset` and in the cluster name `outbound|port|name|host`.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Labels the endpoints of the subset carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Overrides of the host's policy for this subset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
}

/// Policies of traffic to a host or subset.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicy {
    /// Load-balancing algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection limits and timeouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Ejection of failing endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// TLS towards the endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
    /// Overrides per port of the host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_level_settings: Vec<PortTrafficPolicy>,
}

/// Overrides of a policy for one port.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortTrafficPolicy {
    /// The port.
    pub port: PortSelector,
    /// Load-balancing algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection limits and timeouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Ejection of failing endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// TLS towards the endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
}

/// Load balancing: `simple` or `consistentHash`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerSettings {
    /// A standard algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simple: Option<SimpleLb>,
    /// Session affinity by a hash of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_hash: Option<ConsistentHashLb>,
    /// Ramp traffic up to new endpoints over this time (slow start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_duration_secs: Option<Duration>,
}

/// A standard load-balancing algorithm.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SimpleLb {
    /// The proxy's default (round robin).
    Unspecified,
    /// Fewest active requests (alias of `LEAST_REQUEST`).
    LeastConn,
    /// A random endpoint.
    Random,
    /// The connection's original destination, no load balancing.
    Passthrough,
    /// Each endpoint in turn.
    RoundRobin,
    /// Fewest active requests among two random choices.
    LeastRequest,
}

/// Consistent hashing: exactly one hash key.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsistentHashLb {
    /// Hash of this request header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_header_name: Option<String>,
    /// Hash of this cookie (generated when missing and a `ttl` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_cookie: Option<HttpCookie>,
    /// Hash of the source IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_source_ip: Option<bool>,
    /// Hash of this query parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_query_parameter_name: Option<String>,
    /// Ring hash (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_hash: Option<RingHash>,
    /// Maglev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maglev: Option<MagLev>,
    /// Deprecated form of `ringHash.minimumRingSize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

/// A cookie hash key.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpCookie {
    /// Cookie name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Cookie path.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Lifetime of a generated cookie.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
}

/// Ring-hash settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RingHash {
    /// Minimum number of virtual nodes on the ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

/// Maglev settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MagLev {
    /// Lookup table size (a prime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_size: Option<u64>,
}

/// Connection limits and timeouts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionPoolSettings {
    /// TCP settings (HTTP too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpSettings>,
    /// HTTP settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSettings>,
}

/// TCP connection settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpSettings {
    /// Most connections to the host (all endpoints together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_connections: Option<u32>,
    /// TCP connect timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<Duration>,
    /// Keepalive probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// Most lifetime of a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connection_duration: Option<Duration>,
    /// Idle time after which a connection is closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
}

/// TCP keepalive.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpKeepalive {
    /// Unanswered probes before the connection is dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<u32>,
    /// Idle time before the first probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Duration>,
    /// Time between probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
}

/// HTTP connection settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpSettings {
    /// Most requests waiting for a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub http1_max_pending_requests: Option<u32>,
    /// Most active requests to the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub http2_max_requests: Option<u32>,
    /// Most requests per connection (1 disables keep-alive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_requests_per_connection: Option<u32>,
    /// Most concurrent retries to the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_retries: Option<u32>,
    /// Idle time after which a connection is closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    /// Whether HTTP/1.1 connections are upgraded to HTTP/2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2_upgrade_policy: Option<H2UpgradePolicy>,
    /// Speak the protocol the client spoke.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_client_protocol: Option<bool>,
    /// Most concurrent streams per HTTP/2 connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent_streams: Option<u32>,
}

/// HTTP/2 upgrade policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum H2UpgradePolicy {
    /// The mesh default (no upgrade).
    Default,
    /// Never upgrade.
    DoNotUpgrade,
    /// Speak HTTP/2 to the endpoints.
    Upgrade,
}

/// Ejection of endpoints that keep failing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Count local-origin failures (connect errors, timeouts) apart from upstream errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_external_local_origin_errors: Option<bool>,
    /// Consecutive local-origin failures before ejection (with the split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_local_origin_failures: Option<u32>,
    /// Consecutive 502, 503 or 504 answers before ejection (0 disables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_errors: Option<u32>,
    /// Consecutive 5xx answers before ejection (0 disables; default 5).
    #[serde(
        default,
        rename = "consecutive5xxErrors",
        skip_serializing_if = "Option::is_none"
    )]
    pub consecutive_5xx_errors: Option<u32>,
    /// Deprecated (Istio still accepts it): consecutive 502, 503 or 504 answers before ejection,
    /// with 5xx answers not counted, as Istio maps it; `consecutiveGatewayErrors` and
    /// `consecutive5xxErrors` win where set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub consecutive_errors: Option<i32>,
    /// Time between ejection sweeps (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// Minimum ejection time, multiplied by the number of ejections (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ejection_time: Option<Duration>,
    /// Most endpoints ejected at once, in percent (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_ejection_percent: Option<u32>,
    /// Below this share of healthy endpoints, ejection stops (panic mode; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub min_health_percent: Option<u32>,
}

/// TLS towards the endpoints.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientTlsSettings {
    /// `DISABLE`, `SIMPLE`, `MUTUAL` or `ISTIO_MUTUAL`.
    pub mode: ClientTlsMode,
    /// Client certificate file (MUTUAL).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_certificate: String,
    /// Client private key file (MUTUAL).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub private_key: String,
    /// CA bundle file that verifies the server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_certificates: String,
    /// Secret holding the client certificate, key and CA (gateways only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credential_name: String,
    /// Identities the server certificate must carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    /// SNI sent to the server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sni: String,
    /// Do not verify the server certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// Certificate revocation list file.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_crl: String,
}

/// TLS mode towards the endpoints.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClientTlsMode {
    /// Plain text.
    #[default]
    Disable,
    /// TLS, verifying the server.
    Simple,
    /// Mutual TLS with the given client certificate.
    Mutual,
    /// Mutual TLS with the workload's mesh identity.
    IstioMutual,
}
