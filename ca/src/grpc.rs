//! The certificate service's wire contract, compatible with Istio's
//! `istio.v1.auth.IstioCertificateService/CreateCertificate` (security/v1alpha1/ca.proto), so
//! that Istio's own agent can use a meshplane instance as its CA.
//!
//! The messages are declared with prost's derive (field numbers as in Istio's proto); the
//! server and client glue uses tonic's generic unary machinery, as generated code would.

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{http, BoxFuture, Service, StdError};

/// Fully qualified service name.
pub const SERVICE_NAME: &str = "istio.v1.auth.IstioCertificateService";
/// Path of the one method.
pub const CREATE_CERTIFICATE_PATH: &str =
    "/istio.v1.auth.IstioCertificateService/CreateCertificate";

/// A CSR and the lifetime the caller would like. The caller authenticates with its
/// ServiceAccount token in the `authorization: Bearer` metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateRequest {
    /// PEM-encoded PKCS#10 certificate signing request.
    #[prost(string, tag = "1")]
    pub csr: String,
    /// Requested lifetime in seconds; 0 asks for the server's default.
    #[prost(int64, tag = "3")]
    pub validity_duration: i64,
    /// Optional request metadata (Istio uses it for impersonation by trusted callers; a
    /// meshplane instance ignores it).
    #[prost(message, optional, tag = "4")]
    pub metadata: Option<prost_types::Struct>,
}

/// The issued certificate chain: PEM certificates, the issued one first, the root last.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateResponse {
    #[prost(string, repeated, tag = "1")]
    pub cert_chain: Vec<String>,
}

/// The server side of the service.
#[tonic::async_trait]
pub trait IstioCertificateService: Send + Sync + 'static {
    async fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> Result<tonic::Response<IstioCertificateResponse>, tonic::Status>;
}

/// Mounts an [`IstioCertificateService`] on a tonic server.
#[derive(Debug)]
pub struct IstioCertificateServiceServer<T> {
    inner: Arc<T>,
}

impl<T> IstioCertificateServiceServer<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }
}

impl<T> Clone for IstioCertificateServiceServer<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> tonic::server::NamedService for IstioCertificateServiceServer<T> {
    const NAME: &'static str = SERVICE_NAME;
}

/// Adapts the trait's method to tonic's unary service.
struct CreateCertificate<T>(Arc<T>);

impl<T: IstioCertificateService> tonic::server::UnaryService<IstioCertificateRequest>
    for CreateCertificate<T>
{
    type Response = IstioCertificateResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<IstioCertificateRequest>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.create_certificate(request).await })
    }
}

impl<T, B> Service<http::Request<B>> for IstioCertificateServiceServer<T>
where
    T: IstioCertificateService,
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != CREATE_CERTIFICATE_PATH {
            return Box::pin(async move {
                Ok(tonic::Status::unimplemented(format!(
                    "{SERVICE_NAME} has no method at {}",
                    req.uri().path()
                ))
                .into_http())
            });
        }
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            Ok(grpc.unary(CreateCertificate(inner), req).await)
        })
    }
}

/// CSRs and chains are a few kilobytes; anything much larger is not a certificate request.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// A client of the service over any tonic transport (a `Channel`, or a connector of one's own).
#[derive(Debug, Clone)]
pub struct IstioCertificateServiceClient<T> {
    inner: tonic::client::Grpc<T>,
}

impl<T> IstioCertificateServiceClient<T>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: http_body::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<StdError> + Send,
{
    pub fn new(inner: T) -> Self {
        Self {
            inner: tonic::client::Grpc::new(inner).max_decoding_message_size(MAX_MESSAGE_BYTES),
        }
    }

    /// Asks for a certificate; put the token into the request's `authorization` metadata.
    pub async fn create_certificate(
        &mut self,
        request: impl tonic::IntoRequest<IstioCertificateRequest>,
    ) -> Result<tonic::Response<IstioCertificateResponse>, tonic::Status> {
        let request = request.into_request();
        self.inner.ready().await.map_err(|e| {
            tonic::Status::unavailable(format!("certificate service: {}", e.into()))
        })?;
        let path = http::uri::PathAndQuery::from_static(CREATE_CERTIFICATE_PATH);
        self.inner
            .unary(request, path, tonic_prost::ProstCodec::default())
            .await
    }
}

/// Initial HTTP/2 flow-control window of a connection to the instance, per stream and for the
/// connection: Envoy's own default for its xDS connections (256 MiB), so that a large push
/// flows without waiting for window updates, as it does when Envoy talks ADS directly.
pub const INSTANCE_WINDOW: u32 = 256 * 1024 * 1024;

/// The HTTP/2 settings every connection to the instance uses: the node agent's (ADS and
/// certificates) and the load generator's simulated proxies, which stand for it. Frames as
/// large as contract 6 has the bootstrap's ADS cluster accept.
pub fn instance_http2(endpoint: tonic::transport::Endpoint) -> tonic::transport::Endpoint {
    endpoint
        .max_frame_size(meshplane_contracts::bootstrap::ADS_MAX_FRAME_SIZE)
        .initial_stream_window_size(INSTANCE_WINDOW)
        .initial_connection_window_size(INSTANCE_WINDOW)
}

/// Why a channel to an instance could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("trust bundle: {0}")]
    Bundle(#[from] crate::CaError),
    #[error("TLS client configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
    #[error("connecting to {target}: {source}")]
    Connect {
        target: String,
        source: tonic::transport::Error,
    },
}

/// The rustls client configuration of a proxy talking to its instance: the server must present
/// a chain to a root of `bundle_pem` naming the server name; ALPN `h2` for gRPC.
pub fn instance_client_config(bundle_pem: &str) -> Result<Arc<rustls::ClientConfig>, ChannelError> {
    let roots = crate::verify::root_store(bundle_pem)?;
    let mut config = rustls::ClientConfig::builder_with_provider(crate::verify::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Opens a gRPC channel over TLS to `target` (`host:port`, resolved by the system), verifying
/// the server against `bundle_pem` and `server_name` (the instance Service's DNS name). The
/// channel connects now, so a server that fails verification is an error here.
pub fn connect_instance(
    target: &str,
    server_name: &str,
    bundle_pem: &str,
) -> impl std::future::Future<Output = Result<tonic::transport::Channel, ChannelError>> + Send + 'static
{
    let (target, server_name, bundle_pem) = (
        target.to_owned(),
        server_name.to_owned(),
        bundle_pem.to_owned(),
    );
    async move { connect_owned(target, server_name, bundle_pem, None).await }
}

/// [`connect_instance`] from the local address `local` (a host with several addresses; tests
/// and benches calling from distinct loopback addresses).
pub fn connect_instance_from(
    target: &str,
    server_name: &str,
    bundle_pem: &str,
    local: std::net::IpAddr,
) -> impl std::future::Future<Output = Result<tonic::transport::Channel, ChannelError>> + Send + 'static
{
    let (target, server_name, bundle_pem) = (
        target.to_owned(),
        server_name.to_owned(),
        bundle_pem.to_owned(),
    );
    async move { connect_owned(target, server_name, bundle_pem, Some(local)).await }
}

/// A TCP connection to `addr`, from `local` when given.
async fn tcp_connect(
    addr: &str,
    local: Option<std::net::IpAddr>,
) -> std::io::Result<tokio::net::TcpStream> {
    let Some(local) = local else {
        return tokio::net::TcpStream::connect(addr).await;
    };
    let mut last = None;
    for remote in tokio::net::lookup_host(addr).await? {
        let socket = if remote.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.bind(std::net::SocketAddr::new(local, 0))?;
        match socket.connect(remote).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other(format!("{addr} resolves to nothing"))))
}

async fn connect_owned(
    target: String,
    server_name: String,
    bundle_pem: String,
    local: Option<std::net::IpAddr>,
) -> Result<tonic::transport::Channel, ChannelError> {
    let (target, server_name, bundle_pem) = (&target, &server_name, &bundle_pem);
    let config = instance_client_config(bundle_pem)?;
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|_| ChannelError::ServerName(server_name.to_owned()))?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let addr = target.to_owned();
    let connect = tower::service_fn(move |_: http::Uri| {
        let (connector, name, addr) = (connector.clone(), name.clone(), addr.clone());
        async move {
            let tcp = tcp_connect(&addr, local).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    // The URI only names the authority of HTTP/2 requests; the connector decides where to go
    // and does the TLS (tonic is built without its own TLS).
    let uri = format!("http://{server_name}");
    let endpoint = tonic::transport::Endpoint::from_shared(uri)
        .map_err(|e| ChannelError::Connect {
            target: target.to_owned(),
            source: e,
        })?
        .connect_timeout(std::time::Duration::from_secs(10))
        .http2_keep_alive_interval(std::time::Duration::from_secs(30));
    instance_http2(endpoint)
        .connect_with_connector(connect)
        .await
        .map_err(|source| ChannelError::Connect {
            target: target.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// The settings a client sends in its first SETTINGS frame, by identifier.
    async fn advertised(
        stream: &mut tokio::net::TcpStream,
    ) -> std::collections::BTreeMap<u16, u32> {
        let mut preface = [0u8; 24];
        stream.read_exact(&mut preface).await.expect("preface");
        assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        let mut header = [0u8; 9];
        stream.read_exact(&mut header).await.expect("frame header");
        assert_eq!(header[3], 0x4, "the first frame is SETTINGS");
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).await.expect("settings");
        payload
            .chunks_exact(6)
            .map(|c| {
                (
                    u16::from_be_bytes([c[0], c[1]]),
                    u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn a_connection_to_the_instance_advertises_large_frames_and_windows() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let endpoint = instance_http2(
            tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("uri"),
        );
        let client = tokio::spawn(async move { endpoint.connect().await });
        let (mut stream, _) = listener.accept().await.expect("accept");
        let settings = advertised(&mut stream).await;
        // RFC 9113 6.5.2: 0x4 INITIAL_WINDOW_SIZE, 0x5 MAX_FRAME_SIZE.
        assert_eq!(
            settings.get(&0x5),
            Some(&meshplane_contracts::bootstrap::ADS_MAX_FRAME_SIZE)
        );
        assert_eq!(settings.get(&0x4), Some(&INSTANCE_WINDOW));
        client.abort();
    }
}
