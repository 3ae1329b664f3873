//! A minimal HTTP/1.1 GET over a fresh connection: the runner's readiness probes and the
//! scenarios' requests through Envoy use it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// Status and body of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    pub status: u16,
    pub body: String,
}

/// `GET path` on `address` with `Host: host`, all within `timeout`.
pub async fn http_get(
    address: SocketAddr,
    host: &str,
    path: &str,
    timeout: Duration,
) -> Result<HttpReply, String> {
    tokio::time::timeout(timeout, get(address, host, path))
        .await
        .map_err(|_| {
            format!("GET http://{address}{path} (Host {host}) timed out after {timeout:?}")
        })?
}

async fn get(address: SocketAddr, host: &str, path: &str) -> Result<HttpReply, String> {
    let describe = |what: &str, error: &dyn std::fmt::Display| {
        format!("GET http://{address}{path}: {what}: {error}")
    };
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| describe("connect", &e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| describe("handshake", &e))?;
    let connection = tokio::spawn(connection);
    let request = http::Request::get(path)
        .header(http::header::HOST, host)
        .body(Empty::<Bytes>::new())
        .map_err(|e| describe("request", &e))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| describe("send", &e))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| describe("body", &e))?
        .to_bytes();
    connection.abort();
    Ok(HttpReply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
