//! The instance's TLS port (Istio's 15012): ADS and the certificate service over TLS with a
//! certificate of the tenant CA, so that proxies verify the instance against the tenant's trust
//! bundle and the instance Service's name before they send their token.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use meshplane_ca::grpc::IstioCertificateServiceServer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;

use super::service::CertificateServer;
use super::serving::ServingCert;
use crate::ads::AdsServer;

/// A handshake that takes longer is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The rustls server configuration of the TLS port: TLS 1.2+, ALPN `h2` (gRPC), no client
/// certificates (callers authenticate with their token).
pub fn server_config(
    serving: Arc<ServingCert>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(meshplane_ca::verify::provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(serving);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// An accepted TLS connection, as tonic's server wants it.
pub struct SecureConn {
    inner: TlsStream<TcpStream>,
    remote: Option<SocketAddr>,
}

impl tonic::transport::server::Connected for SecureConn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.inner.get_ref().0.local_addr().ok(),
            remote_addr: self.remote,
        }
    }
}

impl AsyncRead for SecureConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SecureConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Accepts TCP connections and completes their handshakes concurrently; a failed handshake
/// (a plaintext client, a client that does not trust the tenant CA) closes that connection
/// only.
fn accept_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    mut shutdown: watch::Receiver<bool>,
) -> ReceiverStream<Result<SecureConn, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut incoming = crate::ads::accepted(listener);
        loop {
            let accepted = tokio::select! {
                a = incoming.next() => match a {
                    Some(a) => a,
                    None => return,
                },
                _ = shutdown.wait_for(|s| *s) => return,
            };
            let (tcp, remote) = match accepted.and_then(|tcp| {
                let remote = tcp.peer_addr()?;
                Ok((tcp, remote))
            }) {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting on the TLS port");
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(inner)) => {
                        let _ = tx
                            .send(Ok(SecureConn {
                                inner,
                                remote: Some(remote),
                            }))
                            .await;
                    }
                    Ok(Err(e)) => tracing::info!(%remote, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::info!(%remote, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Serves ADS and, when given, the certificate service over TLS on `listener` until
/// `shutdown` turns true.
pub async fn serve_secure(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    ads: AdsServer,
    certificates: Option<CertificateServer>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error> {
    let incoming = accept_tls(listener, TlsAcceptor::from(tls), shutdown.clone());
    let mut stop = shutdown;
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .max_concurrent_streams(ads.limits().streams_per_connection)
        .add_service(ads.into_service())
        .add_optional_service(certificates.map(IstioCertificateServiceServer::new));
    router
        .serve_with_incoming_shutdown(incoming, async move {
            crate::ads::stream::shutting_down(&mut stop).await
        })
        .await
}
