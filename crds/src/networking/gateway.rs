//! `Gateway`: the ports, hosts and TLS of a gateway proxy (Istio's `networking.istio.io/v1`
//! Gateway, field for field where supported).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::status::ConfigStatus;
use super::Port;

/// Servers (ports, hosts, TLS) of the gateway proxies it selects.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "networking.meshplane.io",
    version = "v1alpha1",
    kind = "Gateway",
    doc = "Ports, hosts and TLS of the tenant's gateway proxies selected by labels (Istio-compatible).",
    namespaced,
    shortname = "gw",
    status = "ConfigStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The servers (listeners) of the gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<Server>,
    /// Labels of the gateway proxies (pods) this Gateway configures.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
}

/// One listener of a gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Server {
    /// Port and protocol (`HTTP`, `HTTPS`, `HTTP2`, `GRPC`, `TLS`, `TCP`).
    pub port: Port,
    /// Address to bind (default all addresses).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bind: String,
    /// Hosts served, as `[namespace/]host`: `*`, `*.example.com`, `shop/web.example.com`. The
    /// namespace part (`.`, `*` or a name) limits which namespaces' VirtualServices may bind.
    #[schemars(length(min = 1))]
    pub hosts: Vec<String>,
    /// TLS of the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTlsSettings>,
    /// Name of the server (unique in the gateway).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// TLS of a gateway server.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerTlsSettings {
    /// Answer plain HTTP with a redirect to HTTPS.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub https_redirect: bool,
    /// `PASSTHROUGH`, `SIMPLE`, `MUTUAL`, `ISTIO_MUTUAL`, `OPTIONAL_MUTUAL`, `AUTO_PASSTHROUGH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ServerTlsMode>,
    /// Server certificate file.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server_certificate: String,
    /// Server private key file.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub private_key: String,
    /// CA bundle file verifying client certificates (MUTUAL).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_certificates: String,
    /// Secret in the gateway's namespace with `tls.crt`, `tls.key` and (MUTUAL) `ca.crt`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credential_name: String,
    /// Identities a client certificate must carry (MUTUAL).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    /// Lowest TLS version accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_protocol_version: Option<TlsProtocol>,
    /// Highest TLS version accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_protocol_version: Option<TlsProtocol>,
    /// Cipher suites (OpenSSL names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cipher_suites: Vec<String>,
}

/// TLS mode of a gateway server.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServerTlsMode {
    /// Forward the TLS connection untouched, routed by SNI.
    Passthrough,
    /// Terminate TLS with the server certificate.
    Simple,
    /// Terminate TLS and require a client certificate.
    Mutual,
    /// Like PASSTHROUGH, routed by SNI without VirtualServices (multi-cluster; not supported).
    AutoPassthrough,
    /// Mutual TLS with mesh identities.
    IstioMutual,
    /// Like MUTUAL, the client certificate optional.
    OptionalMutual,
}

/// TLS protocol versions.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum TlsProtocol {
    /// The proxy's choice.
    #[serde(rename = "TLS_AUTO")]
    TlsAuto,
    /// TLS 1.0.
    #[serde(rename = "TLSV1_0")]
    TlsV1_0,
    /// TLS 1.1.
    #[serde(rename = "TLSV1_1")]
    TlsV1_1,
    /// TLS 1.2.
    #[serde(rename = "TLSV1_2")]
    TlsV1_2,
    /// TLS 1.3.
    #[serde(rename = "TLSV1_3")]
    TlsV1_3,
}
