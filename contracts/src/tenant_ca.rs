//! Contract 11: the tenant CA and the identity plumbing between the operator, the instance and
//! the node agent.
//!
//! - The operator keeps the Secret [`SECRET`] in the tenant's control namespace, in Istio's
//!   `cacerts` layout ([`LAYOUT_KEYS`]); every instance of the tenant mounts those keys at
//!   [`MOUNT_DIR`] (`--ca-dir`) and signs workload certificates with them.
//! - Its `root-cert.pem` is the `root-cert.pem` of every bootstrap ConfigMap of the tenant
//!   (contract 6), which the injector mounts at [`crate::bootstrap::MOUNT_DIR`] and passes to
//!   the node agent as `--root-cert`.
//! - The agent serves Envoy the SDS secrets [`WORKLOAD_CERT_SECRET`] and
//!   [`TRUST_BUNDLE_SECRET`] on the static cluster [`SDS_CLUSTER`], and announces it with node
//!   metadata [`SDS_METADATA`]` = "true"`; the instance gives TLS contexts only to such proxies.

/// Secret in the control namespace holding the tenant CA, kept by the operator.
pub const SECRET: &str = "meshplane-ca";
/// Where the instance mounts [`SECRET`].
pub const MOUNT_DIR: &str = "/var/run/meshplane/ca";
/// The Secret keys mounted into the instance (Istio's `cacerts` files): the signing
/// certificate, its key, the chain up to the root, and the trust bundle.
pub const LAYOUT_KEYS: [&str; 4] = [
    "ca-cert.pem",
    "ca-key.pem",
    "cert-chain.pem",
    "root-cert.pem",
];
/// Static cluster of the bootstrap reaching the agent's SDS socket.
pub const SDS_CLUSTER: &str = "sds-grpc";
/// SDS secret holding the workload certificate chain and key.
pub const WORKLOAD_CERT_SECRET: &str = "default";
/// SDS secret holding the tenant's trust bundle.
pub const TRUST_BUNDLE_SECRET: &str = "ROOTCA";
/// Node metadata key the agent sets to `"true"`.
pub const SDS_METADATA: &str = "SDS";
