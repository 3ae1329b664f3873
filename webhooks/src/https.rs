//! One HTTPS accept loop for every admission endpoint meshplane serves: the instance's webhooks
//! (contract 5) and the operator's own admission check. The API server is the only intended
//! client, but anything that can reach the port can connect, so the loop bounds what one
//! client can hold: a handshake that does not finish in time is dropped, a failing `accept`
//! (out of file descriptors) pauses instead of spinning, and shutdown drains in-flight requests
//! for a bounded time.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::{Extension, Router};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::client_auth::ClientConnection;

/// The serving configuration new connections use; `None` refuses them (nothing to serve yet).
pub type TlsConfigs = watch::Receiver<Option<Arc<rustls::ServerConfig>>>;

/// Limits of the accept loop.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A client that has not finished the TLS handshake by then is dropped.
    pub handshake_timeout: Duration,
    /// How long in-flight requests may take after shutdown is asked. The API server's webhook
    /// timeout is at most 30 s and 10 s by default.
    pub drain_timeout: Duration,
    /// Pause after a failed `accept`, so the loop does not spin.
    pub accept_backoff: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
            accept_backoff: Duration::from_millis(100),
        }
    }
}

/// A configuration that serves one fixed certificate chain (the instance's webhooks reload
/// through a certificate resolver inside it).
pub fn fixed(config: Arc<rustls::ServerConfig>) -> TlsConfigs {
    let (sender, configs) = watch::channel(Some(config));
    // The receiver keeps the last value after the sender is gone.
    drop(sender);
    configs
}

/// Serves `router` over TLS on `listener` until `shutdown` completes, then lets in-flight
/// requests finish for at most `limits.drain_timeout`. Each new connection takes the latest
/// configuration of `configs` (certificate swaps without a restart). Every request carries the
/// connection's [`ClientConnection`] (peer address, client certificate chain) as an extension.
pub async fn serve(
    listener: TcpListener,
    configs: TlsConfigs,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let graceful = GracefulShutdown::new();
    tracing::info!(addr = ?listener.local_addr().ok(), "serving admission over HTTPS");
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an admission connection failed");
                    tokio::time::sleep(limits.accept_backoff).await;
                    continue;
                }
            },
        };
        let Some(config) = configs.borrow().clone() else {
            tracing::debug!(%peer, "no serving certificate yet; closing the connection");
            continue;
        };
        let acceptor = TlsAcceptor::from(config);
        let router = router.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            // What the routes may ask of the client (`client_auth::gate`).
            let client = ClientConnection {
                peer: Some(peer),
                certificates: Arc::new(
                    tls.get_ref()
                        .1
                        .peer_certificates()
                        .map(<[_]>::to_vec)
                        .unwrap_or_default(),
                ),
            };
            let service = TowerToHyperService::new(router.layer(Extension(client)));
            let conn = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "admission connection ended with an error");
            }
        });
    }
    // Refuse new connections at once instead of leaving them in the backlog while draining.
    drop(listener);
    tracing::info!("admission server shutting down");
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.drain_timeout) => {
            tracing::warn!("admission connections still open after the drain timeout; closing");
        }
    }
}
