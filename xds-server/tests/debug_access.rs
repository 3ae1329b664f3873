//! `/debug/*` on the monitoring port (contract 12): served to a caller with a token
//! TokenReview accepts for the tenant's debug audience as the control namespace's
//! `meshplane-debug` ServiceAccount (a loopback peer too needs one), or, in directory mode
//! where no token can be checked, to a loopback peer; refused otherwise. `/metrics`, `/healthz` and `/readyz`
//! stay open. The API server is a fake tower service that knows a few tokens.

mod token_common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http_body_util::BodyExt;
use meshplane_xds::admin::{self, DebugAccess};
use meshplane_xds::metrics::Metrics;
use meshplane_xds::push::Hub;
use meshplane_xds::tenancy::TokenReviewer;
use tower::ServiceExt;

const CONTROL_NS: &str = "meshplane-blue";
const DEBUG_AUDIENCE: &str = "meshplane-blue-debug";

/// A kube client whose API server knows, for the debug audience only:
/// `debug-token` (meshplane-blue/meshplane-debug), `other-sa-token` (meshplane-blue/default),
/// `green-debug-token` (meshplane-green/meshplane-debug); `proxy-token` is valid only for the
/// proxies' audience `meshplane-blue`. Counts the reviews it answers.
fn fake_kube(reviews: Arc<AtomicUsize>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let reviews = Arc::clone(&reviews);
        async move {
            assert_eq!(
                req.uri().path(),
                "/apis/authentication.k8s.io/v1/tokenreviews"
            );
            reviews.fetch_add(1, Ordering::SeqCst);
            let body = req
                .into_body()
                .collect()
                .await
                .expect("request body")
                .to_bytes();
            let review: serde_json::Value =
                serde_json::from_slice(&body).expect("TokenReview JSON");
            let token =
                token_common::jwt_name(review["spec"]["token"].as_str().unwrap_or_default());
            let audience = review["spec"]["audiences"][0].as_str().unwrap_or_default();
            let user = match (token.as_str(), audience) {
                ("debug-token", DEBUG_AUDIENCE) => Some("meshplane-blue:meshplane-debug"),
                ("other-sa-token", DEBUG_AUDIENCE) => Some("meshplane-blue:default"),
                ("green-debug-token", DEBUG_AUDIENCE) => Some("meshplane-green:meshplane-debug"),
                ("proxy-token", "meshplane-blue") => Some("shop:default"),
                _ => None,
            };
            let status = match user {
                Some(user) => serde_json::json!({
                    "authenticated": true,
                    "audiences": [audience],
                    "user": { "username": format!("system:serviceaccount:{user}") },
                }),
                None => {
                    serde_json::json!({ "authenticated": false, "error": "invalid bearer token" })
                }
            };
            let mut answer = review.clone();
            answer["status"] = status;
            let bytes = serde_json::to_vec(&answer).expect("encode");
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(bytes))
                    .expect("response"),
            )
        }
    });
    kube::Client::new(service, "default")
}

fn hub() -> Arc<Hub> {
    Hub::new("blue", "blue-v1", CONTROL_NS, Arc::new(Metrics::new()))
}

fn access(reviews: &Arc<AtomicUsize>) -> DebugAccess {
    let reviewer = TokenReviewer::new(fake_kube(Arc::clone(reviews)), DEBUG_AUDIENCE);
    DebugAccess::new(Some(reviewer), CONTROL_NS)
}

/// A pod address of the test range: a caller from another pod, through the API server's
/// `pods/proxy` or the instance Service.
fn remote() -> SocketAddr {
    "198.18.0.10:40000".parse().expect("address")
}

/// The bearer token the test calls `name`: shaped as a projected token for the debug audience,
/// `proxy-token` for the proxies' one; `garbage` stays garbage.
fn token(name: &str) -> String {
    let (namespace, audience) = match name {
        "garbage" => return name.to_string(),
        "proxy-token" => ("shop", "meshplane-blue"),
        "green-debug-token" => ("meshplane-green", DEBUG_AUDIENCE),
        _ => (CONTROL_NS, DEBUG_AUDIENCE),
    };
    token_common::jwt_for(name, namespace, audience)
}

/// GET `path` on the router as if from `peer`, with `headers` (token names made tokens by
/// [`token`]); the status and body.
async fn get(
    router: &axum::Router,
    peer: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut request = http::Request::get(path);
    for (k, v) in headers {
        let value = match v.strip_prefix("Bearer ") {
            Some(name) => format!("Bearer {}", token(name)),
            None if k.contains("token") => token(v),
            None => v.to_string(),
        };
        request = request.header(*k, value);
    }
    let mut request = request.body(Body::empty()).expect("request");
    request.extensions_mut().insert(ConnectInfo(peer));
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn debug_endpoints_need_the_debug_accounts_token_from_a_remote_peer() {
    let reviews = Arc::new(AtomicUsize::new(0));
    let router = admin::router(hub(), access(&reviews));
    for path in [
        "/debug/proxies",
        "/debug/config_dump?proxy=x",
        "/debug/intended?proxy=x",
    ] {
        let (status, body) = get(&router, remote(), path, &[]).await;
        assert_eq!(status, 401, "{path} without a token: {body}");
        assert!(
            body.contains("x-meshplane-debug-token")
                && body.contains("system:serviceaccount:meshplane-blue:meshplane-debug"),
            "the refusal says what to send: {body}"
        );
    }
    let refused = [
        // Not a token the API server knows.
        ("x-meshplane-debug-token", "garbage", 401),
        // A proxy's token: valid, but not for the debug audience.
        ("authorization", "Bearer proxy-token", 401),
        // The debug audience, but another ServiceAccount of the control namespace.
        ("x-meshplane-debug-token", "other-sa-token", 403),
        // Another tenant's debug account.
        ("x-meshplane-debug-token", "green-debug-token", 403),
    ];
    for (header, value, want) in refused {
        let (status, body) = get(&router, remote(), "/debug/proxies", &[(header, value)]).await;
        assert_eq!(status, want, "{header}: {value}: {body}");
        assert!(!body.starts_with('['), "no proxy list leaks: {body}");
    }
    let (status, body) = get(
        &router,
        remote(),
        "/debug/proxies",
        &[("x-meshplane-debug-token", "debug-token")],
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "[]"));
    let (status, body) = get(
        &router,
        remote(),
        "/debug/proxies",
        &[("authorization", "Bearer debug-token")],
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (200, "[]"),
        "Authorization: Bearer works for direct calls"
    );
    let (status, _) = get(
        &router,
        remote(),
        "/debug/config_dump?proxy=nobody",
        &[("x-meshplane-debug-token", "debug-token")],
    )
    .await;
    assert_eq!(status, 404, "authorized: the dump answers for itself");
    // Garbage and the proxy's token were refused from themselves (not a JWT, another
    // audience); each other token was reviewed once, and the accepted one is remembered.
    assert_eq!(reviews.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn metrics_and_health_stay_open_and_loopback_needs_a_token_too() {
    let reviews = Arc::new(AtomicUsize::new(0));
    let router = admin::router(hub(), access(&reviews));
    for path in ["/metrics", "/healthz"] {
        let (status, body) = get(&router, remote(), path, &[]).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, _) = get(&router, remote(), "/readyz", &[]).await;
    assert_eq!(
        status, 503,
        "readyz answers for itself (not synced yet), no auth"
    );
    for peer in ["127.0.0.1:5000", "[::1]:5000", "[::ffff:127.0.0.1]:5000"] {
        let peer: SocketAddr = peer.parse().expect("address");
        // In a pod, loopback is also the other containers and kubectl port-forward.
        let (status, body) = get(&router, peer, "/debug/proxies", &[]).await;
        assert_eq!(status, 401, "{peer}: {body}");
        assert!(body.contains("meshplane-debug"), "{peer}: {body}");
    }
    assert_eq!(reviews.load(Ordering::SeqCst), 0, "no review for any of it");
}

#[tokio::test]
async fn without_an_api_server_only_loopback_reads_debug() {
    let router = admin::router(hub(), DebugAccess::loopback_only(CONTROL_NS));
    let (status, body) = get(
        &router,
        remote(),
        "/debug/proxies",
        &[("x-meshplane-debug-token", "debug-token")],
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("loopback"), "{body}");
}

/// Over a real socket, the peer address is the accepted connection's: in directory mode a
/// loopback client reads `/debug` without a token, and a forwarded-for header changes nothing for a remote one (the
/// remote case is above; here, the header must not be needed nor trusted).
#[tokio::test]
async fn the_served_router_sees_the_sockets_peer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Directory mode: no API server to check tokens, so the loopback peer is trusted.
    let access = DebugAccess::loopback_only(CONTROL_NS);
    let server = tokio::spawn(admin::serve(listener, hub(), access, stopped));
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "GET /debug/proxies HTTP/1.1\r\nhost: {addr}\r\nx-forwarded-for: 198.18.0.10\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut answer = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_string(&mut answer),
    )
    .await
    .expect("answered before the deadline")
    .expect("read");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("[]"), "{answer}");
    let _ = stop.send(true);
    let _ = server.await;
}
