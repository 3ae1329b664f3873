//! The names the node agent and the instance's translation share (contract 11 of
//! docs/architecture.md): the SDS cluster the agent adds to the bootstrap, the secrets it
//! serves on it, and the node metadata that tells the instance a proxy has them.

/// Static cluster of the bootstrap reaching the agent's SDS socket.
pub const SDS_CLUSTER: &str = "sds-grpc";
/// SDS secret holding the workload certificate chain and key.
pub const WORKLOAD_CERT_SECRET: &str = "default";
/// SDS secret holding the tenant's trust bundle.
pub const TRUST_BUNDLE_SECRET: &str = "ROOTCA";
/// Node metadata key the agent sets to `"true"`: the proxy can serve and originate mutual TLS.
/// A proxy without it (plaintext development setups) gets no TLS transport sockets, which
/// would otherwise wait forever for secrets nobody serves.
pub const SDS_METADATA: &str = "SDS";
