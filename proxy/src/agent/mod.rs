//! The node agent: what `meshplane-proxy` runs beside Envoy in every meshed pod.
//!
//! - [`instance`]: the way to the instance's TLS port, verified against the tenant's trust
//!   bundle (`root-cert.pem` of the bootstrap ConfigMap) and the instance Service's name, with
//!   the projected ServiceAccount token read from its file at every (re)connect.
//! - [`certs`]: the workload certificate: a key generated here (it never leaves the pod), a
//!   CSR to the instance's certificate service, renewal at about half the lifetime with jitter.
//! - [`sds`]: SDS on a Unix socket, serving `default` (certificate and key) and `ROOTCA` (the
//!   trust bundle) to Envoy, pushed again on every renewal or bundle change.
//! - [`xds_proxy`]: Envoy's ADS, accepted in plaintext on a Unix socket in the pod and carried
//!   to the instance over TLS, one upstream stream per Envoy stream, so every reconnect of Envoy
//!   presents the token the kubelet last wrote. With `--grpc-xds-socket`, the same for the
//!   pod's proxyless gRPC clients on an abstract socket (contract 13).
//! - [`envoy`]: Envoy as a child process: signals forwarded, its exit is the agent's.

pub mod certs;
pub mod envoy;
pub mod instance;
pub mod sds;
pub mod xds_proxy;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::bootstrap::AgentSockets;
pub use certs::WorkloadCert;
pub use instance::Instance;

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("runtime directory {path}: {source}")]
    RunDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("binding {path}: {source}")]
    Bind {
        path: String,
        source: std::io::Error,
    },
    #[error("starting Envoy {bin}: {source}")]
    Spawn {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("waiting for Envoy: {0}")]
    Wait(std::io::Error),
}

/// What the secrets of the pod are right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    /// The workload certificate, once issued.
    pub cert: Option<Arc<WorkloadCert>>,
    /// The trust bundle (PEM), once the bootstrap ConfigMap holds one.
    pub bundle: Option<String>,
}

/// Everything the agent needs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub instance: Instance,
    /// Directory of the sockets and Envoy's working directory (the runtime `emptyDir`).
    pub run_dir: PathBuf,
    pub sockets: AgentSockets,
    /// Abstract Unix socket name on which proxyless gRPC clients of the pod get ADS too
    /// (contract 13).
    pub grpc_xds_socket: Option<String>,
    /// Certificate lifetime to ask for; zero asks for the instance's default (24 h).
    pub cert_ttl: Duration,
    /// Envoy binary, its bootstrap and extra arguments.
    pub envoy: envoy::EnvoyCommand,
}

fn bind(run_dir: &Path, path: &str) -> Result<UnixListener, AgentError> {
    let full = run_dir.join(path);
    // A socket left by a previous container of this pod would make bind fail.
    let _ = std::fs::remove_file(&full);
    UnixListener::bind(path).map_err(|source| AgentError::Bind {
        path: full.display().to_string(),
        source,
    })
}

/// Binds the abstract Unix socket `name`: it lives in the pod's network namespace, which all
/// of the pod's containers share, and is gone with it (nothing to remove first).
fn bind_abstract(name: &str) -> Result<UnixListener, AgentError> {
    use std::os::linux::net::SocketAddrExt;
    let error = |source| AgentError::Bind {
        path: format!("@{name}"),
        source,
    };
    let address =
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).map_err(error)?;
    let listener = std::os::unix::net::UnixListener::bind_addr(&address).map_err(error)?;
    listener.set_nonblocking(true).map_err(error)?;
    UnixListener::from_std(listener).map_err(error)
}

/// Runs the agent and Envoy until Envoy exits (a termination signal is forwarded to it);
/// returns Envoy's exit code.
pub async fn run(config: AgentConfig) -> Result<i32, AgentError> {
    std::env::set_current_dir(&config.run_dir).map_err(|source| AgentError::RunDir {
        path: config.run_dir.clone(),
        source,
    })?;
    let sds_listener = bind(&config.run_dir, &config.sockets.sds)?;
    let xds_listener = bind(&config.run_dir, &config.sockets.xds)?;
    let grpc_listener = config
        .grpc_xds_socket
        .as_deref()
        .map(bind_abstract)
        .transpose()?;

    let (secrets_tx, secrets_rx) = watch::channel(Secrets::default());
    let secrets_tx = Arc::new(secrets_tx);
    let (stop_tx, stop_rx) = watch::channel(false);

    let mut tasks = vec![
        tokio::spawn(certs::watch_bundle(
            config.instance.clone(),
            Arc::clone(&secrets_tx),
            stop_rx.clone(),
        )),
        tokio::spawn(certs::keep_certificate(
            config.instance.clone(),
            config.cert_ttl,
            Arc::clone(&secrets_tx),
            stop_rx.clone(),
        )),
        tokio::spawn(sds::serve(sds_listener, secrets_rx, stop_rx.clone())),
        tokio::spawn(xds_proxy::serve(
            xds_listener,
            config.instance.clone(),
            stop_rx.clone(),
        )),
    ];
    if let Some(listener) = grpc_listener {
        tracing::info!(socket = ?config.grpc_xds_socket, "serving ADS to proxyless gRPC clients");
        tasks.push(tokio::spawn(xds_proxy::serve(
            listener,
            config.instance.clone(),
            stop_rx.clone(),
        )));
    }

    let code = envoy::run(&config.envoy, &config.run_dir).await;
    let _ = stop_tx.send(true);
    for task in tasks {
        task.abort();
    }
    code
}
