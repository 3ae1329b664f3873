//! The monitoring HTTP server: `/metrics`, `/healthz`, `/readyz`, `/debug/proxies` and
//! `/debug/config_dump?proxy=<id>`.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use crate::push::Hub;

/// The routes of the monitoring server.
pub fn router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/debug/proxies", get(proxies))
        .route("/debug/config_dump", get(config_dump))
        .with_state(hub)
}

/// Serves the monitoring endpoints on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    hub: Arc<Hub>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, router(hub))
        .with_graceful_shutdown(
            async move { crate::ads::stream::shutting_down(&mut shutdown).await },
        )
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
