//! HTTP endpoints: `/metrics`, `/healthz`, `/readyz` (plain HTTP) and the admission check
//! (HTTPS with rustls).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use kube::api::DynamicObject;
use kube::core::admission::AdmissionReview;
use kube::Client;
use meshplane_webhooks::client_auth::ClientAuth;
use meshplane_webhooks::metrics::{Outcome, VALIDATE_MESHPLANE};
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Why serving could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS material: {0}")]
    Pem(String),
    #[error("TLS config: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Readiness of this replica: set while its admission check serves a certificate the API
/// server trusts (the serving certificate is loaded and the caBundle contains its CA).
#[derive(Clone)]
pub struct Health {
    ready: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            ready: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.send_replace(ready);
    }
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }
    /// Completes once this replica is ready.
    pub async fn ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives in `self`, so the wait ends only by readiness.
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// `/metrics`, `/healthz`, `/readyz`.
pub fn monitoring_router(metrics: Arc<Metrics>, health: Health) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State((m, _)): State<(Arc<Metrics>, Health)>| async move {
                match m.encode() {
                    Ok(text) => (
                        StatusCode::OK,
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    )
                        .into_response(),
                    Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State((_, h)): State<(Arc<Metrics>, Health)>| async move {
                if h.is_ready() {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting")
                }
            }),
        )
        .with_state((metrics, health))
}

/// `POST /validate-meshplane`; with `client_auth`, only for callers presenting the API
/// server's admission client certificate (`meshplane_webhooks::client_auth`).
/// Every answer is counted and timed in `metrics` (`meshplane_operator_webhook_*`); a body that
/// is not an AdmissionReview as an error.
pub fn admission_router(
    client: Client,
    client_auth: Option<Arc<ClientAuth>>,
    metrics: Arc<Metrics>,
) -> Router {
    let router = Router::new().route(
        crate::admission::PATH,
        post(
            |State((client, metrics)): State<(Client, Arc<Metrics>)>,
             review: Result<Json<AdmissionReview<DynamicObject>>, JsonRejection>| async move {
                let start = Instant::now();
                let (reply, outcome) = match review {
                    Ok(Json(review)) => {
                        let (reply, outcome) = crate::admission::handle(&client, review).await;
                        (Json(reply).into_response(), outcome)
                    }
                    Err(rejection) => (rejection.into_response(), Outcome::Error),
                };
                metrics
                    .webhook()
                    .observe(VALIDATE_MESHPLANE, outcome, start.elapsed());
                reply
            },
        ),
    );
    let router = match client_auth {
        Some(auth) => router.route_layer(axum::middleware::from_fn_with_state(
            auth,
            meshplane_webhooks::client_auth::gate,
        )),
        None => router,
    };
    router.with_state((client, metrics))
}

/// Reads `tls.crt` and `tls.key` from a directory (a mounted `kubernetes.io/tls` Secret).
pub fn read_tls_dir(dir: &Path) -> Result<(String, String), ServeError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| ServeError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    use meshplane_contracts::webhook_tls::{TLS_CRT, TLS_KEY};
    Ok((read(TLS_CRT)?, read(TLS_KEY)?))
}

/// A rustls server configuration from PEM material; with `client_auth`, it asks every client
/// for a certificate of the API server's admission client CA (optional in the handshake, the
/// admission route refuses calls without one).
pub fn rustls_config(
    cert_pem: &str,
    key_pem: &str,
    client_auth: Option<Arc<ClientAuth>>,
) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| ServeError::Pem(e.to_string()))?;
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .map_err(|e| ServeError::Pem(e.to_string()))?
        .ok_or_else(|| ServeError::Pem("no private key found".into()))?;
    // Explicit provider: kube's client may link another one, and the default would be ambiguous.
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?;
    let builder = match client_auth {
        Some(auth) => builder.with_client_cert_verifier(auth),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Binds `addr`, failing early (before leader election) when the port is taken.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Serves `router` over HTTPS on `listener` until `shutdown` completes; every new connection
/// uses the latest configuration in `configs` (certificate swaps without a restart), and
/// connections are refused while it is `None`. The accept loop is the instance webhooks' own
/// ([`meshplane_webhooks::https`]): handshake timeout, accept backoff, bounded drain.
pub async fn serve_https_reloading(
    listener: TcpListener,
    configs: tokio::sync::watch::Receiver<Option<Arc<rustls::ServerConfig>>>,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    meshplane_webhooks::https::serve(
        listener,
        configs,
        router,
        meshplane_webhooks::https::Limits::default(),
        shutdown,
    )
    .await;
}
