//! The `pods/<name>/portforward` subresource over WebSocket, as kube-apiserver serves it (the
//! kubelet's side included): `GET` with `Upgrade: websocket`, `ports=<p>[,<p>…]` (repeatable),
//! authorized as `create` on `pods/portforward` (what Kubernetes requires of WebSocket upgrades
//! since the `AuthorizePodWebsocketUpgradeCreatePermission` gate went on by default).
//!
//! Framing (subprotocol `v4.channel.k8s.io`, or none): every binary message starts with a
//! channel byte; port `i` of the request has data channel `2i` and error channel `2i + 1`. The
//! server first sends, on each of those channels, the port number (2 bytes, little endian);
//! then bytes from the pod on the data channel, and at most one UTF-8 error message on the error
//! channel. Bytes the client sends on a data channel go to the pod. One TCP connection per
//! port is opened to `localhost:<port>` inside the pod's network namespace, as the container
//! runtime does: a port bound to the pod's loopback only (an Envoy admin) is reachable. When
//! every port's connection has ended, the server closes the WebSocket.
//!
//! Not served: SPDY (`kubectl port-forward` speaks SPDY, tunnelled in a WebSocket as
//! `SPDY/3.1+portforward.k8s.io`); kube-rs's `Api::portforward` and other WebSocket clients work.

use std::sync::Arc;

use crate::error::ApiError;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use http::{header, HeaderValue, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// The channel subprotocol kubelets serve port forwarding with.
pub const V4_CHANNEL_PROTOCOL: &str = "v4.channel.k8s.io";

/// The pod a forwarded port belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

type Connect =
    dyn Fn(PodRef, u16) -> BoxFuture<'static, std::io::Result<TcpStream>> + Send + Sync + 'static;

/// How the stand-in opens a connection to `localhost:<port>` inside a pod: the kubelet's part of
/// port forwarding. The pod runner supplies one; without it, every forward fails with an error
/// on the port's error channel (no node runs the pod).
#[derive(Clone, Default)]
pub struct PodConnector(Option<Arc<Connect>>);

impl PodConnector {
    pub fn new<F, Fut>(connect: F) -> Self
    where
        F: Fn(PodRef, u16) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::io::Result<TcpStream>> + Send + 'static,
    {
        PodConnector(Some(Arc::new(move |pod, port| {
            Box::pin(connect(pod, port))
        })))
    }

    async fn connect(&self, pod: PodRef, port: u16) -> std::io::Result<TcpStream> {
        match &self.0 {
            Some(connect) => connect(pod, port).await,
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "no node runs this pod (the stand-in was started without a pod connector)",
            )),
        }
    }
}

impl std::fmt::Debug for PodConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "PodConnector"
        } else {
            "PodConnector(none)"
        })
    }
}

/// The `ports` of a port-forward request: every `ports=` parameter, comma-separated lists
/// allowed; at least one; each 1–65535.
pub fn ports(query: Option<&str>) -> Result<Vec<u16>, ApiError> {
    let mut ports = Vec::new();
    for (key, value) in form_pairs(query.unwrap_or_default()) {
        if key != "ports" {
            continue;
        }
        for p in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match p.parse::<u16>() {
                Ok(port) if port > 0 => ports.push(port),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "invalid port {p:?}: ports must be numbers from 1 to 65535"
                    )))
                }
            }
        }
    }
    if ports.is_empty() {
        return Err(ApiError::bad_request(
            "query parameter \"ports\" is required for WebSocket port forwarding",
        ));
    }
    Ok(ports)
}

/// `key=value` pairs of a query string, percent-decoded (`%2C` is how clients send commas).
fn form_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k), percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The subprotocol to answer with: `v4.channel.k8s.io` when offered; none when the client
/// offers none; an error when it offers only others (SPDY tunnelling among them).
fn choose_protocol(headers: &http::HeaderMap) -> Result<Option<&'static str>, ApiError> {
    let offered: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    if offered.is_empty() {
        return Ok(None);
    }
    if offered.iter().any(|p| p == V4_CHANNEL_PROTOCOL) {
        return Ok(Some(V4_CHANNEL_PROTOCOL));
    }
    Err(ApiError::bad_request(format!(
        "none of the offered port-forward protocols {offered:?} is served (the stand-in serves \
         {V4_CHANNEL_PROTOCOL}; SPDY is not served)"
    )))
}

/// Answers the upgrade and, once the connection is switched, forwards `ports` of `pod`.
pub fn serve(
    mut req: Request,
    connector: PodConnector,
    pod: PodRef,
    ports: Vec<u16>,
) -> Result<Response, ApiError> {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return Err(ApiError::bad_request("Upgrade request required"));
    }
    let key = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::bad_request("missing Sec-WebSocket-Key"))?;
    let accept = derive_accept_key(key.as_bytes());
    let protocol = choose_protocol(req.headers())?;
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                forward(ws, connector, pod, ports).await;
            }
            Err(e) => tracing::debug!(error = %e, "port-forward upgrade failed"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).map_err(|e| ApiError::internal(e.to_string()))?,
    );
    if let Some(p) = protocol {
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
    }
    Ok(response)
}

/// A message from one port's pod connection to the client.
enum FromPod {
    Data(u8, Vec<u8>),
    Error(u8, String),
    Closed,
}

/// The forwarding loop of one WebSocket: opens the ports' connections, then relays until every
/// connection has ended or the client goes away.
async fn forward<S>(ws: WebSocketStream<S>, connector: PodConnector, pod: PodRef, ports: Vec<u16>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    // Each channel announces its port first.
    for (i, port) in ports.iter().enumerate() {
        for ch in [2 * i, 2 * i + 1] {
            let mut frame = vec![ch as u8];
            frame.extend_from_slice(&port.to_le_bytes());
            if sink.send(Message::binary(frame)).await.is_err() {
                return;
            }
        }
    }
    let (tx, mut rx) = mpsc::channel::<FromPod>(16);
    let mut writers = Vec::with_capacity(ports.len());
    for (i, port) in ports.iter().copied().enumerate() {
        let data_ch = (2 * i) as u8;
        match connector.connect(pod.clone(), port).await {
            Ok(conn) => {
                let (mut read, write) = conn.into_split();
                writers.push(Some(write));
                let tx = tx.clone();
                let label = format!("{}/{}, uid {}", pod.namespace, pod.name, pod.uid);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 32 * 1024];
                    loop {
                        match read.read(&mut buf).await {
                            Ok(0) => break,
                            Ok(n) => {
                                if tx
                                    .send(FromPod::Data(data_ch, buf[..n].to_vec()))
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                            }
                            Err(e) => {
                                let message =
                                    format!("error forwarding port {port} to pod {label}: {e}");
                                let _ = tx.send(FromPod::Error(data_ch + 1, message)).await;
                                break;
                            }
                        }
                    }
                    let _ = tx.send(FromPod::Closed).await;
                });
            }
            Err(e) => {
                writers.push(None);
                let message = format!(
                    "error forwarding port {port} to pod {}/{}, uid {}: {e}",
                    pod.namespace, pod.name, pod.uid
                );
                let _ = tx.send(FromPod::Error(data_ch + 1, message)).await;
                let _ = tx.send(FromPod::Closed).await;
            }
        }
    }
    drop(tx);
    let mut open = ports.len();
    while open > 0 {
        tokio::select! {
            from_pod = rx.recv() => {
                let frame = match from_pod {
                    Some(FromPod::Data(ch, bytes)) => {
                        let mut frame = Vec::with_capacity(bytes.len() + 1);
                        frame.push(ch);
                        frame.extend_from_slice(&bytes);
                        frame
                    }
                    Some(FromPod::Error(ch, message)) => {
                        let mut frame = vec![ch];
                        frame.extend_from_slice(message.as_bytes());
                        frame
                    }
                    Some(FromPod::Closed) => {
                        open -= 1;
                        continue;
                    }
                    None => break,
                };
                if sink.send(Message::binary(frame)).await.is_err() {
                    return;
                }
            }
            from_client = stream.next() => match from_client {
                Some(Ok(Message::Binary(bytes))) => {
                    let Some((&ch, data)) = bytes.split_first() else { continue };
                    // Odd channels (errors) carry nothing from clients.
                    if ch % 2 != 0 || data.is_empty() {
                        continue;
                    }
                    if let Some(Some(writer)) = writers.get_mut(usize::from(ch / 2)) {
                        if writer.write_all(data).await.is_err() {
                            writers[usize::from(ch / 2)] = None;
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
    let _ = sink.send(Message::Close(None)).await;
    let _ = sink.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_every_ports_parameter_and_must_be_valid() {
        assert_eq!(ports(Some("ports=15000")).expect("valid"), [15000]);
        assert_eq!(
            ports(Some("&ports=80%2C1234&ports=15000")).expect("valid"),
            [80, 1234, 15000]
        );
        for bad in [
            None,
            Some(""),
            Some("port=80"),
            Some("ports=0"),
            Some("ports=http"),
        ] {
            assert_eq!(ports(bad).expect_err("invalid").code, 400, "{bad:?}");
        }
    }

    #[test]
    fn the_v4_channel_protocol_is_chosen_and_spdy_refused() {
        let offer = |value: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(
                header::SEC_WEBSOCKET_PROTOCOL,
                value.parse().expect("ascii"),
            );
            h
        };
        assert_eq!(
            choose_protocol(&offer("v5.channel.k8s.io, v4.channel.k8s.io")).expect("served"),
            Some(V4_CHANNEL_PROTOCOL)
        );
        assert_eq!(
            choose_protocol(&http::HeaderMap::new()).expect("served"),
            None
        );
        assert!(choose_protocol(&offer("SPDY/3.1+portforward.k8s.io")).is_err());
    }
}
