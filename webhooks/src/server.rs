//! HTTPS serving of the webhooks on the instance's webhook port (contract 5): `/inject`,
//! `/validate` and `/healthz`, with the certificate of contract 4 reloaded on change.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use meshplane_contracts::webhooks;
use tokio::net::TcpListener;

use crate::handlers::Webhooks;
use crate::https;
use crate::tls::{ReloadingCertResolver, TlsError};

/// The API server sends the object and the old object; Kubernetes objects are at most ~1.5 MiB.
const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("binding the webhook port {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The initial certificate could not be loaded.
    #[error("loading the webhook certificate: {0}")]
    Tls(#[from] TlsError),
    /// rustls refused the configuration.
    #[error("configuring TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The HTTP routes, without TLS.
pub fn router(handlers: Arc<Webhooks>) -> Router {
    Router::new()
        .route(webhooks::INJECT_PATH, post(inject))
        .route(webhooks::VALIDATE_PATH, post(validate))
        .route(webhooks::HEALTHZ_PATH, get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(handlers)
}

async fn inject(State(handlers): State<Arc<Webhooks>>, body: Bytes) -> impl IntoResponse {
    let reply = handlers.inject(&body);
    (reply.status, Json(reply.body))
}

async fn validate(State(handlers): State<Arc<Webhooks>>, body: Bytes) -> impl IntoResponse {
    let reply = handlers.validate(&body);
    (reply.status, Json(reply.body))
}

/// Serves the webhooks over HTTPS on `addr` with `tls.crt`/`tls.key` from `tls_dir` until
/// `shutdown` completes, then lets in-flight requests finish (bounded).
pub async fn serve(
    addr: SocketAddr,
    tls_dir: PathBuf,
    handlers: Arc<Webhooks>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    serve_on(listener, tls_dir, handlers, shutdown).await
}

/// [`serve`] on an already bound listener (tests bind port 0 and read the address).
pub async fn serve_on(
    listener: TcpListener,
    tls_dir: PathBuf,
    handlers: Arc<Webhooks>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = Arc::new(ReloadingCertResolver::load(&tls_dir, provider.clone())?);
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tracing::info!(tls_dir = %tls_dir.display(), "serving admission webhooks");
    https::serve(
        listener,
        https::fixed(Arc::new(config)),
        router(handlers),
        https::Limits::default(),
        shutdown,
    )
    .await;
    Ok(())
}
