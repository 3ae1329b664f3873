//! A minimal HTTP/1.1 GET over a fresh connection: the runner's readiness probes and the
//! harness's requests into the test network use it. The caller opens the connection (inside
//! the node's or a pod's network namespace), so that no request leaves the test network.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Status, headers and body of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    pub status: u16,
    /// Header names in lowercase; repeated headers joined with `, `.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// `GET path` with `Host: host` over the connection `connect` opens (to `target`, named in
/// errors), all within `timeout`.
pub async fn http_get<C>(
    connect: C,
    target: &str,
    host: &str,
    path: &str,
    timeout: Duration,
) -> Result<HttpReply, String>
where
    C: Future<Output = std::io::Result<TcpStream>>,
{
    tokio::time::timeout(timeout, get(connect, target, host, path))
        .await
        .map_err(|_| {
            format!("GET http://{target}{path} (Host {host}) timed out after {timeout:?}")
        })?
}

async fn get<C>(connect: C, target: &str, host: &str, path: &str) -> Result<HttpReply, String>
where
    C: Future<Output = std::io::Result<TcpStream>>,
{
    let describe = |what: &str, error: &dyn std::fmt::Display| {
        format!("GET http://{target}{path}: {what}: {error}")
    };
    let stream = connect.await.map_err(|e| describe("connect", &e))?;
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
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in response.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_string())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| describe("body", &e))?
        .to_bytes();
    connection.abort();
    Ok(HttpReply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
