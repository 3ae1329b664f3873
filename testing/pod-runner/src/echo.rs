//! The built-in echo HTTP server that stands in for every application image.
//!
//! It answers any request with a small JSON document naming the pod that served it, the Host
//! it was asked for, the peer it saw and the request headers, so scenarios can tell which
//! workload a request reached and by which way (a sidecar's inbound listener connects from the
//! pod's own loopback and adds its headers).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// Who is answering.
#[derive(Debug, Clone)]
pub struct EchoIdentity {
    pub pod: String,
    pub namespace: String,
    pub container: String,
}

/// Serves HTTP/1.1 and HTTP/2 (prior knowledge) on `listener` until the task is aborted.
pub async fn serve_echo(listener: TcpListener, identity: EchoIdentity) {
    let identity = Arc::new(identity);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "echo server accept failed");
                continue;
            }
        };
        let identity = Arc::clone(&identity);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let identity = Arc::clone(&identity);
                async move { Ok::<_, Infallible>(echo_response(&identity, peer, &request)) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(error) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "echo connection ended with an error");
            }
        });
    }
}

fn echo_response<B>(
    identity: &EchoIdentity,
    peer: std::net::SocketAddr,
    request: &Request<B>,
) -> Response<Full<Bytes>> {
    let host = request
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let body = serde_json::json!({
        "pod": identity.pod,
        "namespace": identity.namespace,
        "container": identity.container,
        "host": host,
        "path": request.uri().path(),
        "peer": peer.to_string(),
        "headers": request
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str().to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
            .collect::<std::collections::BTreeMap<String, String>>(),
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
