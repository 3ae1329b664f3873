//! The `pods/proxy` subresource: `GET|HEAD /api/v1/namespaces/<ns>/pods/<name>[:<port>]/proxy/<path>`
//! forwards one HTTP request to the pod's `status.podIP` and answers with the pod's response,
//! as the real API server does for `kubectl get --raw .../proxy/...` and clients such as
//! `meshctl proxy-status`. Authorized as verb `get` on `pods/proxy` in the pod's namespace,
//! with the caller's credentials; the caller's `Authorization` and `Impersonate-*` headers never
//! reach the pod (the real API server drops them after authenticating), the other end-to-end
//! headers do (a custom header is how a caller authenticates to the pod itself).
//!
//! Pod addresses are reached the way admission webhooks are ([`crate::admission::Dialer`],
//! `StandInOptions::webhook_dialer`): from the pod runner's node network namespace when the
//! harness runs one. Only `http` targets (no `https:` prefix) and only GET and HEAD are served.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::admission::Dialer;
use crate::error::ApiError;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{header, Method, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// How long one proxied request may take, connect to last body byte.
const PROXY_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body passed back.
const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// A `pods/<name>[:<port>]/proxy/<path>` request, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyTarget {
    pub pod: String,
    pub port: u16,
    /// `/<path>[?query]` on the pod.
    pub path_and_query: String,
}

/// Parses the part after `/api/v1/namespaces/<ns>/pods/`: `<name>[:<port>]/proxy[/<path>]`.
/// `None` when it is not a proxy request.
pub fn parse(rest: &[&str], query: Option<&str>) -> Option<Result<ProxyTarget, ApiError>> {
    let [name_port, "proxy", path @ ..] = rest else {
        return None;
    };
    // `name`, `name:port`, `http:name:port`; `https:` targets are not served.
    let parts: Vec<&str> = name_port.split(':').collect();
    let (pod, port) = match parts.as_slice() {
        [pod] => (*pod, None),
        [pod, port] | ["http", pod, port] => (*pod, Some(*port)),
        _ => {
            return Some(Err(ApiError::bad_request(format!(
            "pod proxy target {name_port:?}: only http targets of the form name[:port] are served"
        ))))
        }
    };
    let port = match port.map(str::parse::<u16>) {
        None => 80,
        Some(Ok(p)) if p > 0 => p,
        Some(_) => {
            return Some(Err(ApiError::bad_request(format!(
                "pod proxy target {name_port:?}: the port must be a number (named ports are not served)"
            ))))
        }
    };
    let mut path_and_query = format!("/{}", path.join("/"));
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        path_and_query.push('?');
        path_and_query.push_str(q);
    }
    Some(Ok(ProxyTarget {
        pod: pod.to_string(),
        port,
        path_and_query,
    }))
}

fn unavailable(message: String) -> ApiError {
    ApiError::new(503, "ServiceUnavailable", message)
}

/// Forwards `method` on `target` to `pod` (its stored object) and returns the pod's answer.
pub async fn forward(
    dialer: &Dialer,
    pod: &serde_json::Value,
    target: &ProxyTarget,
    method: &Method,
    headers: &http::HeaderMap,
) -> Result<Response, ApiError> {
    if method != Method::GET && method != Method::HEAD {
        return Err(ApiError::method_not_allowed(format!(
            "the stand-in's pod proxy serves GET and HEAD only ({method})"
        )));
    }
    let ip = pod
        .pointer("/status/podIP")
        .and_then(|v| v.as_str())
        .and_then(|s| s.parse::<IpAddr>().ok())
        .ok_or_else(|| unavailable(format!("pod {:?} has no IP address yet", target.pod)))?;
    let addr = SocketAddr::new(ip, target.port);
    let reply = tokio::time::timeout(
        PROXY_TIMEOUT,
        request(dialer, addr, target, method, forwarded(headers)),
    )
    .await
    .map_err(|_| {
        unavailable(format!(
            "error trying to reach pod {:?} at {addr}: timed out after {PROXY_TIMEOUT:?}",
            target.pod
        ))
    })?
    .map_err(|e| {
        unavailable(format!(
            "error trying to reach pod {:?} at {addr}: {e}",
            target.pod
        ))
    })?;
    Ok(reply)
}

/// The caller's headers that travel on to the pod: not the credentials the API server consumed
/// (`Authorization`, `Impersonate-*`), not hop-by-hop headers, not `Host`.
pub fn forwarded(headers: &http::HeaderMap) -> http::HeaderMap {
    const DROPPED: [&str; 11] = [
        "authorization",
        "host",
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    let mut out = http::HeaderMap::new();
    for (name, value) in headers {
        let n = name.as_str();
        if !DROPPED.contains(&n) && !n.starts_with("impersonate-") && n != "content-length" {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

async fn request(
    dialer: &Dialer,
    addr: SocketAddr,
    target: &ProxyTarget,
    method: &Method,
    headers: http::HeaderMap,
) -> Result<Response, String> {
    let stream = dialer.connect(addr).await.map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let connection = tokio::spawn(connection);
    let mut req = http::Request::builder()
        .method(method.clone())
        .uri(&target.path_and_query)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    *req.headers_mut() = headers;
    req.headers_mut().insert(
        header::HOST,
        header::HeaderValue::from_str(&addr.to_string()).map_err(|e| e.to_string())?,
    );
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    connection.abort();
    let mut out = (
        StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
        body,
    )
        .into_response();
    if let Some(ct) = content_type {
        out.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_and_without_port() {
        let t = parse(&["web-1:15014", "proxy", "debug", "proxies"], None)
            .expect("proxy")
            .expect("valid");
        assert_eq!(
            t,
            ProxyTarget {
                pod: "web-1".into(),
                port: 15014,
                path_and_query: "/debug/proxies".into()
            }
        );
        let t = parse(&["http:web-1:8080", "proxy"], Some("a=1"))
            .expect("proxy")
            .expect("valid");
        assert_eq!((t.port, t.path_and_query.as_str()), (8080, "/?a=1"));
        assert_eq!(
            parse(&["web-1", "proxy", "x"], None)
                .expect("proxy")
                .expect("valid")
                .port,
            80
        );
        assert!(parse(&["web-1", "status"], None).is_none());
        assert!(parse(&["https:web-1:443", "proxy"], None)
            .expect("proxy")
            .is_err());
        assert!(parse(&["web-1:metrics", "proxy"], None)
            .expect("proxy")
            .is_err());
    }

    #[test]
    fn credentials_and_hop_by_hop_headers_stay_with_the_api_server() {
        let mut h = http::HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer user-token"),
            ("impersonate-user", "alice"),
            ("connection", "keep-alive"),
            ("host", "127.0.0.1:6443"),
            ("x-meshplane-debug-token", "debug"),
            ("accept", "application/json"),
        ] {
            h.insert(k, v.parse().expect("ascii"));
        }
        let out = forwarded(&h);
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-meshplane-debug-token", "accept"]);
    }
}
