//! The monitoring HTTP server: `/metrics`, `/healthz`, `/readyz` for anyone (scrapers and
//! probes), and `/debug/proxies` and `/debug/config_dump?proxy=<id>` only for a caller with a
//! debug token, or a loopback peer where no token can be checked (contract 12, [`DebugAccess`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use meshplane_contracts::debug as contract;
use serde::Deserialize;

use crate::push::Hub;
use crate::tenancy::{AdmissionError, TokenReviewer};

/// Who may read `/debug/*` (contract 12): a caller whose token TokenReview accepts for the
/// tenant's debug audience as the control namespace's debug ServiceAccount. A loopback peer
/// (the accepted socket's address, never a forwarded-for header) is trusted only in directory
/// mode, where no token can be checked: in a pod, loopback is also every other container of
/// the pod and every `kubectl port-forward` to it, which are not the debug ServiceAccount.
#[derive(Clone, Debug)]
pub struct DebugAccess {
    /// Reviews tokens for the debug audience; `None` (directory mode, no API server to ask):
    /// loopback only.
    reviewer: Option<TokenReviewer>,
    /// The one username accepted.
    username: String,
}

/// Why a `/debug` request is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DebugDenied {
    #[error("/debug needs a token of ServiceAccount {account} (header {header} or Authorization: Bearer)")]
    NoToken {
        account: String,
        header: &'static str,
    },
    #[error("debug token rejected: {0}")]
    InvalidToken(String),
    #[error("debug token belongs to {got:?}; only {want:?} may read /debug")]
    WrongAccount { got: String, want: String },
    #[error("this instance checks debug tokens with the Kubernetes API, which it has no access to in directory mode; call from the instance's loopback")]
    NoReviewer,
    #[error("the debug token could not be checked now: {0}")]
    Unavailable(String),
}

impl IntoResponse for DebugDenied {
    fn into_response(self) -> Response {
        let status = match &self {
            DebugDenied::NoToken { .. } | DebugDenied::InvalidToken(_) => StatusCode::UNAUTHORIZED,
            DebugDenied::WrongAccount { .. } | DebugDenied::NoReviewer => StatusCode::FORBIDDEN,
            DebugDenied::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut response = (status, format!("{self}\n")).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

/// The debug token of a request: [`contract::TOKEN_HEADER`] first, else `Authorization: Bearer`.
pub fn debug_token(headers: &HeaderMap) -> Option<&str> {
    let custom = headers
        .get(contract::TOKEN_HEADER)
        .and_then(|v| v.to_str().ok());
    let bearer = || {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
    };
    custom
        .or_else(bearer)
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Whether `ip` is a loopback address (IPv4-mapped IPv6 included).
fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

impl DebugAccess {
    /// Access for the instance of a tenant whose control namespace is `control_namespace`:
    /// `reviewer` must review for [`contract::audience`] of the tenant.
    pub fn new(reviewer: Option<TokenReviewer>, control_namespace: &str) -> Self {
        Self {
            reviewer,
            username: contract::username(control_namespace),
        }
    }

    /// Loopback peers only.
    pub fn loopback_only(control_namespace: &str) -> Self {
        Self::new(None, control_namespace)
    }

    /// Decides one request from its peer address and headers.
    pub async fn check(
        &self,
        peer: Option<IpAddr>,
        headers: &HeaderMap,
    ) -> Result<(), DebugDenied> {
        if self.reviewer.is_none() && peer.is_some_and(is_loopback) {
            return Ok(());
        }
        let Some(token) = debug_token(headers) else {
            return Err(DebugDenied::NoToken {
                account: self.username.clone(),
                header: contract::TOKEN_HEADER,
            });
        };
        let reviewer = self.reviewer.as_ref().ok_or(DebugDenied::NoReviewer)?;
        let reviewed = reviewer.review(token, peer).await.map_err(|e| match e {
            AdmissionError::ReviewFailed(why) => DebugDenied::Unavailable(why),
            e @ AdmissionError::ReviewThrottled(_) => DebugDenied::Unavailable(e.to_string()),
            AdmissionError::InvalidToken(why) => DebugDenied::InvalidToken(why),
            other => DebugDenied::InvalidToken(other.to_string()),
        })?;
        if reviewed.username != self.username {
            return Err(DebugDenied::WrongAccount {
                got: crate::bounds::echo(&reviewed.username),
                want: self.username.clone(),
            });
        }
        Ok(())
    }
}

async fn require_debug_access(
    State(access): State<Arc<DebugAccess>>,
    request: Request,
    next: Next,
) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip());
    match access.check(peer, request.headers()).await {
        Ok(()) => next.run(request).await,
        Err(denied) => {
            tracing::info!(peer = ?peer, path = %request.uri().path(), reason = %denied, "refused a /debug request");
            denied.into_response()
        }
    }
}

/// The routes of the monitoring server.
pub fn router(hub: Arc<Hub>, access: DebugAccess) -> Router {
    let debug = Router::new()
        .route("/debug/proxies", get(proxies))
        .route("/debug/config_dump", get(config_dump))
        .route("/debug/intended", get(intended))
        .route_layer(middleware::from_fn_with_state(
            Arc::new(access),
            require_debug_access,
        ));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .merge(debug)
        .with_state(hub)
}

/// Serves the monitoring endpoints on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    hub: Arc<Hub>,
    access: DebugAccess,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router(hub, access).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move { crate::ads::stream::shutting_down(&mut shutdown).await })
    .await
}

/// Sets `unsynced_proxies` from the streams' current state, so that a scrape sees it as of now.
fn count_unsynced(hub: &Hub) {
    let mut counts: std::collections::BTreeMap<&'static str, i64> = crate::metrics::RESOURCE_TYPES
        .iter()
        .map(|t| (*t, 0))
        .collect();
    for proxy in hub.proxy_overview() {
        for t in &proxy.types {
            let unsynced = t.subscribed
                && t.sent_version.is_some()
                && (t.awaiting_ack || t.acked_version != t.sent_version);
            *counts.entry(t.type_name).or_default() += i64::from(unsynced);
        }
    }
    for (type_name, count) in counts {
        hub.metrics().set_unsynced(type_name, count);
    }
}

async fn metrics(State(hub): State<Arc<Hub>>) -> Response {
    count_unsynced(&hub);
    match hub.metrics().encode() {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn readyz(State(hub): State<Arc<Hub>>) -> Response {
    if hub.is_ready() {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "sources not synced").into_response()
    }
}

async fn proxies(State(hub): State<Arc<Hub>>) -> Response {
    // The resource lists belong to the config dump; the overview stays small.
    Json(hub.proxy_overview()).into_response()
}

#[derive(Deserialize)]
struct DumpQuery {
    proxy: String,
}

/// What the instance intends proxy `proxy` to hold, in Envoy's admin form.
async fn intended(State(hub): State<Arc<Hub>>, Query(q): Query<DumpQuery>) -> Response {
    match hub.intended(&q.proxy) {
        Some(intended) => Json(intended).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no connected proxy {:?}", q.proxy),
        )
            .into_response(),
    }
}

async fn config_dump(State(hub): State<Arc<Hub>>, Query(q): Query<DumpQuery>) -> Response {
    match hub.proxy_status(&q.proxy) {
        Some(p) => Json(p).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no connected proxy {:?}", q.proxy),
        )
            .into_response(),
    }
}
