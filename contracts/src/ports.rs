//! Ports every part agrees on: the instance's Service ports (contracts 1 and 5) and the ports of
//! an injected proxy (contracts 6 and 7).

/// ADS (gRPC, HTTP/2 cleartext) on the instance; off unless the instance is given `--xds-addr`
/// (the operator never renders it).
pub const GRPC_XDS: u16 = 15010;
/// ADS and the certificate service over TLS on the instance (Istio's 15012, contract 11).
pub const GRPC_XDS_TLS: u16 = 15012;
/// Admission webhooks (HTTPS) on the instance.
pub const HTTPS_WEBHOOK: u16 = 15017;
/// Metrics, health and debug (HTTP) on the instance.
pub const HTTP_MONITORING: u16 = 15014;
/// Virtual outbound listener a captured proxy receives redirected traffic on.
pub const VIRTUAL_OUTBOUND: u16 = 15001;
/// Virtual inbound listener a captured proxy receives redirected traffic on.
pub const VIRTUAL_INBOUND: u16 = 15006;
/// Envoy admin of a proxy (loopback only).
pub const PROXY_ADMIN: u16 = 15000;
/// Readiness endpoint of a proxy.
pub const PROXY_READY: u16 = 15021;
