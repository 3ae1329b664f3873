//! HTTPS serving of the webhooks on the instance's webhook port (contract 5): `/inject`,
//! `/validate` and `/healthz`, with the certificate of contract 4 reloaded on change, and,
//! when contract 4's Secret carries the API server's admission client CA, `/inject` and
//! `/validate` only for callers presenting its certificate ([`crate::client_auth`]).

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

use crate::client_auth::{self, ClientAuth, ClientAuthError, RefusalHook};
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
    /// The admission client CA exists but could not be loaded.
    #[error("loading the admission client CA: {0}")]
    ClientAuth(#[from] ClientAuthError),
    /// rustls refused the configuration.
    #[error("configuring TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The HTTP routes, without TLS: the admission paths behind `client_auth`'s gate, `/healthz`
/// open to anyone.
pub fn router(handlers: Arc<Webhooks>, client_auth: Arc<ClientAuth>) -> Router {
    Router::new()
        .route(webhooks::INJECT_PATH, post(inject))
        .route(webhooks::VALIDATE_PATH, post(validate))
        .route_layer(axum::middleware::from_fn_with_state(
            client_auth,
            client_auth::gate,
        ))
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
/// `shutdown` completes, then lets in-flight requests finish (bounded). With `client-ca.crt`
/// in `tls_dir` (and optionally `client-names`), admission calls need the API server's client
/// certificate; `on_refusal` is told of every caller refused for want of it.
pub async fn serve(
    addr: SocketAddr,
    tls_dir: PathBuf,
    handlers: Arc<Webhooks>,
    on_refusal: Option<RefusalHook>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    serve_with(listener, tls_dir, handlers, on_refusal, shutdown).await
}

/// [`serve`] on an already bound listener (tests bind port 0 and read the address).
pub async fn serve_on(
    listener: TcpListener,
    tls_dir: PathBuf,
    handlers: Arc<Webhooks>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    serve_with(listener, tls_dir, handlers, None, shutdown).await
}

/// [`serve_on`], telling `on_refusal` of every refused caller.
pub async fn serve_with(
    listener: TcpListener,
    tls_dir: PathBuf,
    handlers: Arc<Webhooks>,
    on_refusal: Option<RefusalHook>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = Arc::new(ReloadingCertResolver::load(&tls_dir, provider.clone())?);
    let mut client_auth = ClientAuth::from_dir(&tls_dir, provider.clone())?;
    if let Some(hook) = on_refusal {
        client_auth = client_auth.on_refusal(hook);
    }
    let client_auth = Arc::new(client_auth);
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(client_auth.clone())
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tracing::info!(
        tls_dir = %tls_dir.display(),
        client_certificates = client_auth.is_on(),
        "serving admission webhooks"
    );
    https::serve(
        listener,
        https::fixed(Arc::new(config)),
        router(handlers, client_auth),
        https::Limits::default(),
        shutdown,
    )
    .await;
    Ok(())
}
