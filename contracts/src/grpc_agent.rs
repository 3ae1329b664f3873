//! Contract 13: the way a proxyless gRPC client of a meshed pod reaches its tenant's instance.
//!
//! A pod annotated `sidecar.meshplane.io/proxylessGrpc: "true"` gets, from the injector, a node
//! agent that also serves ADS on the abstract Unix socket [`XDS_SOCKET`] (flag
//! [`AGENT_FLAG`]), and app containers whose env holds gRPC's xDS bootstrap
//! ([`env::BOOTSTRAP_CONFIG`], gRFC A27) pointing at [`server_uri`]. The agent carries each
//! stream to the instance over TLS with the pod's token, as it does Envoy's: gRPC never holds a
//! credential, and its identity is still the pod's, checked by TokenReview.
//!
//! Why an abstract socket: gRPC's default `:authority` for `unix:///abs/path` targets is the
//! path, which HTTP/2 servers built on the `h2` crate refuse (`PROTOCOL_ERROR`); for
//! `unix-abstract:` it is `localhost`. Abstract sockets belong to the network namespace, which
//! every container of a pod shares (and only they: the injector skips `hostNetwork` pods), so
//! no volume has to be mounted into app containers.

/// Abstract Unix socket name (without the leading NUL) of the agent's ADS for gRPC clients.
pub const XDS_SOCKET: &str = "meshplane-grpc-xds";

/// The launcher flag that turns the socket on; its value is the socket name.
pub const AGENT_FLAG: &str = "--grpc-xds-socket";

/// Node metadata key and value marking a proxyless gRPC client (Istio's convention).
pub const GENERATOR_METADATA: &str = "GENERATOR";
pub const GENERATOR: &str = "grpc";

/// `server_uri` of the bootstrap's xDS server.
pub fn server_uri() -> String {
    format!("unix-abstract:{XDS_SOCKET}")
}

/// Environment the injector gives app containers.
pub mod env {
    /// gRPC's bootstrap, inline (gRPC reads it when `GRPC_XDS_BOOTSTRAP` names no file).
    pub const BOOTSTRAP_CONFIG: &str = "GRPC_XDS_BOOTSTRAP_CONFIG";
    /// gRPC's bootstrap file: an app container that sets it (or [`BOOTSTRAP_CONFIG`]) keeps its own.
    pub const BOOTSTRAP_FILE: &str = "GRPC_XDS_BOOTSTRAP";
    /// Downward API values the bootstrap's node id is expanded from (prefixed so as not to
    /// collide with an app's own variables).
    pub const POD_NAME: &str = "MESHPLANE_POD_NAME";
    pub const POD_NAMESPACE: &str = "MESHPLANE_POD_NAMESPACE";
    pub const POD_IP: &str = "MESHPLANE_POD_IP";
}
