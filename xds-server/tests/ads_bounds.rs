//! Bounded inputs at the ADS port: oversized nodes are refused with a short INVALID_ARGUMENT,
//! undecodable requests are INVALID_ARGUMENT (not INTERNAL), one HTTP/2 connection may open
//! only a few streams, one namespace only so many proxies, and a proxy reconnecting with the
//! same token costs one TokenReview, new tokens at most the configured rate.

mod ads_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ads_common::*;
use bytes::Bytes;
use http_body_util::BodyExt;
use meshplane_xds::ads::AdsLimits;
use meshplane_xds::model::type_url;
use meshplane_xds::tenancy::TokenReviewer;
use tokio_stream::wrappers::ReceiverStream;

const AUDIENCE: &str = "meshplane-blue";

#[tokio::test]
async fn a_huge_node_id_is_refused_with_a_short_invalid_argument() {
    let h = Harness::start().await;
    let mut n = node("shop", "p-1");
    n.id = "x".repeat(1024 * 1024);
    let err = match SotwClient::open(&h, n, type_url::CLUSTER, &[]).await {
        Err(status) => status,
        Ok(mut c) => c.rx.message().await.expect_err("refused"),
    };
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("node.id is 1048576 bytes"),
        "{}",
        err.message()
    );
    assert!(err.message().len() < 1024, "{} bytes", err.message().len());
}

/// A raw HTTP/2 connection to the ADS port.
async fn h2_connect(h: &Harness) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(h.addr).await.expect("tcp");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    client
}

fn grpc_request() -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri("http://xds/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

#[tokio::test]
async fn an_undecodable_request_is_invalid_argument_and_streams_per_connection_are_capped() {
    let h = Harness::start_limited(
        None,
        AdsLimits {
            streams_per_connection: 4,
            ..AdsLimits::default()
        },
    )
    .await;
    let mut client = h2_connect(&h).await.ready().await.expect("ready");
    let (response, mut body) = client.send_request(grpc_request(), false).expect("send");
    // One gRPC message of four bytes that are no protobuf.
    body.send_data(
        Bytes::from_static(&[0, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]),
        true,
    )
    .expect("data");
    let response = tokio::time::timeout(DEADLINE, response)
        .await
        .expect("answer before the deadline")
        .expect("response");
    let status = match response.headers().get("grpc-status") {
        Some(s) => s.clone(),
        None => {
            let mut body = response.into_body();
            while body.data().await.is_some() {}
            body.trailers()
                .await
                .expect("trailers")
                .and_then(|t| t.get("grpc-status").cloned())
                .expect("grpc-status")
        }
    };
    assert_eq!(status, "3", "INVALID_ARGUMENT");
    // The server's SETTINGS, seen by the client once it has answered a request.
    assert_eq!(client.current_max_send_streams(), 4);
}

#[tokio::test]
async fn a_namespace_gets_at_most_its_share_of_proxies() {
    let h = Harness::start_limited(
        None,
        AdsLimits {
            proxies_per_namespace: 2,
            ..AdsLimits::default()
        },
    )
    .await;
    h.set("shop", config("a")).await;
    let mut first = SotwClient::open(&h, node("shop", "p-1"), type_url::CLUSTER, &[])
        .await
        .expect("first");
    first.recv().await;
    let mut second = SotwClient::open(&h, node("shop", "p-2"), type_url::CLUSTER, &[])
        .await
        .expect("second");
    second.recv().await;
    let err = SotwClient::open(&h, node("shop", "p-3"), type_url::CLUSTER, &[])
        .await
        .err()
        .expect("third refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("\"shop\""), "{}", err.message());
    // Other namespaces are not affected (held open: the count below includes it).
    h.set("bank", config("b")).await;
    let mut bank = SotwClient::open(&h, node("bank", "p-1"), type_url::CLUSTER, &[])
        .await
        .expect("another namespace");
    bank.recv().await;
    let mut connected = h.hub.connected_count();
    assert_eq!(
        *connected.borrow_and_update(),
        3,
        "shop's two and bank's one"
    );
    // A slot frees when a proxy leaves.
    drop(first);
    tokio::time::timeout(DEADLINE, connected.wait_for(|n| *n == 2))
        .await
        .expect("before the deadline")
        .expect("open");
    SotwClient::open(&h, node("shop", "p-4"), type_url::CLUSTER, &[])
        .await
        .expect("room again");
}

/// What a client chooses never grows the render cache without bound: `LOOPBACK_ADDR` is
/// dropped unless the instance runs under the local pod runner, and the cache keeps at most
/// its limit of configurations.
#[tokio::test]
async fn client_chosen_loopback_addresses_do_not_grow_the_render_cache() {
    use meshplane_crds::MeshConfig;
    use meshplane_xds::index::TenantIndex;
    use meshplane_xds::model::ProxyNode;

    let index = TenantIndex::new(TENANT, "blue-v1", "meshplane-blue", MeshConfig::default())
        .with_cache_limit(8);
    for i in 0..64u8 {
        let node = ProxyNode {
            id: format!(
                "sidecar~198.18.0.{i}~p-{i}.meshplane-blue~meshplane-blue.svc.cluster.local"
            ),
            namespace: "meshplane-blue".into(),
            pod_name: Some(format!("p-{i}")),
            ip: Some(format!("198.18.0.{i}")),
            labels: Default::default(),
            capture_mode: Default::default(),
            loopback: Some(format!("127.0.0.{i}")),
            sds: false,
            kind: meshplane_xds::model::ProxyKind::Sidecar,
        };
        index.render_proxy_shared(&node);
        assert!(
            index.cached_scopes() <= 8,
            "{} cached",
            index.cached_scopes()
        );
    }

    // Through the ADS port, a claimed loopback address is not honoured by default: every
    // proxy of one namespace renders from one cache entry.
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut md = node("shop", "p-1");
    if let Some(m) = md.metadata.as_mut() {
        m.fields.insert(
            "LOOPBACK_ADDR".into(),
            envoy_types::pb::google::protobuf::Value {
                kind: Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
                    "127.0.0.77".into(),
                )),
            },
        );
    }
    let mut c = SotwClient::open(&h, md, type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    c.recv().await;
    let seen = h.rendered_nodes();
    assert!(
        seen.iter().all(|n| n.loopback.is_none()),
        "claimed loopback honoured: {seen:?}"
    );
    assert!(!seen.is_empty());
}

/// A kube client answering TokenReviews (`<ns>-token` is ServiceAccount `<ns>/default`),
/// counting them.
fn counting_kube(reviews: Arc<AtomicUsize>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let reviews = Arc::clone(&reviews);
        async move {
            reviews.fetch_add(1, Ordering::SeqCst);
            let body = req.into_body().collect().await.expect("body").to_bytes();
            let mut review: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            let token = review["spec"]["token"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            review["status"] = match token.strip_suffix("-token") {
                Some(ns) => serde_json::json!({
                    "authenticated": true, "audiences": [AUDIENCE],
                    "user": {"username": format!("system:serviceaccount:{ns}:default")},
                }),
                None => {
                    serde_json::json!({"authenticated": false, "error": "invalid bearer token"})
                }
            };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&review).expect("encode"),
                    ))
                    .expect("response"),
            )
        }
    });
    kube::Client::new(service, "default")
}

type Open = (
    tokio::sync::mpsc::Sender<envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest>,
    tonic::Streaming<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse>,
);

async fn open_with_token(h: &Harness, token: &str) -> Result<Open, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(
        envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
            node: Some(node("shop", "p-1")),
            type_url: type_url::CLUSTER.into(),
            ..Default::default()
        },
    )
    .await
    .expect("queue");
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    let stream = h
        .client()
        .await
        .stream_aggregated_resources(request)
        .await?;
    Ok((tx, stream.into_inner()))
}

#[tokio::test]
async fn reconnects_with_one_token_cost_one_token_review_and_new_tokens_are_rate_limited() {
    let reviews = Arc::new(AtomicUsize::new(0));
    let reviewer =
        TokenReviewer::with_rate(counting_kube(Arc::clone(&reviews)), AUDIENCE, 0.001, 3.0);
    let h = Harness::start_with(Some(reviewer)).await;
    h.set("shop", config("a")).await;
    for _ in 0..20 {
        let (_tx, mut rx) = open_with_token(&h, "shop-token").await.expect("admitted");
        tokio::time::timeout(DEADLINE, rx.message())
            .await
            .expect("before the deadline")
            .expect("ok")
            .expect("a response");
    }
    assert_eq!(
        reviews.load(Ordering::SeqCst),
        1,
        "one review for 20 streams"
    );
    // A refused token is remembered too.
    for _ in 0..5 {
        let Err(err) = open_with_token(&h, "forged").await else {
            panic!("a forged token was admitted");
        };
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
    }
    assert_eq!(reviews.load(Ordering::SeqCst), 2);
    // The bucket held three reviews: the third new token waits for the rate.
    let Err(err) = open_with_token(&h, "bank-token").await else {
        panic!("bank's token was admitted for shop");
    };
    assert_eq!(
        err.code(),
        tonic::Code::PermissionDenied,
        "bank is no match for shop"
    );
    let Err(err) = open_with_token(&h, "other-token").await else {
        panic!("a review beyond the rate was sent");
    };
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("TokenReviews per second"),
        "{}",
        err.message()
    );
    assert_eq!(reviews.load(Ordering::SeqCst), 3);
}
