//! Bounded inputs at the ADS port: oversized nodes are refused with a short INVALID_ARGUMENT,
//! undecodable requests are INVALID_ARGUMENT (not INTERNAL), one HTTP/2 connection may open
//! only a few streams, one namespace only so many proxies, and a proxy reconnecting with the
//! same token costs one TokenReview, new tokens at most the configured rate.

mod ads_common;
mod token_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ads_common::*;
use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use http_body_util::BodyExt;
use meshplane_xds::ads::pacing::PacingLimits;
use meshplane_xds::ads::AdsLimits;
use meshplane_xds::model::type_url;
use meshplane_xds::tenancy::TokenReviewer;
use meshplane_xds::tokens::ReviewBudget;

/// The same TokenReview rate for every kind of source.
fn budget(per_second: f64, burst: f64) -> ReviewBudget {
    ReviewBudget::uniform(per_second, burst)
}
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
            service_account: None,
            readable_credentials: None,
            kind: meshplane_xds::model::ProxyKind::Sidecar,
        };
        index.render(&node);
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

/// A kube client answering TokenReviews (the token named `<ns>-token` is ServiceAccount
/// `<ns>/default`), counting them.
fn counting_kube(reviews: Arc<AtomicUsize>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let reviews = Arc::clone(&reviews);
        async move {
            reviews.fetch_add(1, Ordering::SeqCst);
            let body = req.into_body().collect().await.expect("body").to_bytes();
            let mut review: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            let token =
                token_common::jwt_name(review["spec"]["token"].as_str().unwrap_or_default());
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
        format!("Bearer {}", token_common::jwt(token))
            .parse()
            .expect("ascii"),
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
    let reviewer = TokenReviewer::with_budget(
        counting_kube(Arc::clone(&reviews)),
        AUDIENCE,
        budget(0.001, 3.0),
    );
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
    // The peer's bucket held three reviews: the fourth new token waits for the rate.
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
        err.message()
            .contains("too many new tokens to review (peer_budget spent)"),
        "{}",
        err.message()
    );
    assert_eq!(reviews.load(Ordering::SeqCst), 3);
}

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use meshplane_xds::ads::budget::BudgetLimits;

type Sotw = (
    tokio::sync::mpsc::Sender<DiscoveryRequest>,
    tonic::Streaming<DiscoveryResponse>,
);
type Delta = (
    tokio::sync::mpsc::Sender<DeltaDiscoveryRequest>,
    tonic::Streaming<DeltaDiscoveryResponse>,
);

/// `n` resource names of `len` bytes each, starting with `prefix`.
fn padded_names(prefix: &str, n: usize, len: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let name = format!("{prefix}{i}-");
            format!("{name}{}", "x".repeat(len.saturating_sub(name.len())))
        })
        .collect()
}

/// Opens a SotW stream on `client` with `first` as its first request, `token` as its bearer.
async fn open_sotw(
    mut client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
    first: DiscoveryRequest,
    token: Option<&str>,
) -> Result<Sotw, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(first).await.expect("queue");
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", token_common::jwt(token))
                .parse()
                .expect("ascii"),
        );
    }
    let stream = client.stream_aggregated_resources(request).await?;
    Ok((tx, stream.into_inner()))
}

async fn open_delta(
    mut client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
    first: DeltaDiscoveryRequest,
) -> Result<Delta, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(first).await.expect("queue");
    let stream = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await?;
    Ok((tx, stream.into_inner()))
}

/// The status a stream ends with (refused at its start or later).
async fn ended<T: Send + 'static>(
    opened: Result<(T, tonic::Streaming<impl Send + 'static>), tonic::Status>,
) -> tonic::Status {
    let (_tx, mut rx) = match opened {
        Err(status) => return status,
        Ok(s) => s,
    };
    loop {
        match tokio::time::timeout(DEADLINE, rx.message())
            .await
            .expect("the stream ends before the deadline")
        {
            Err(status) => return status,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without a status"),
        }
    }
}

fn assert_exhausted(status: &tonic::Status, limit: &str) {
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains(&format!("(limit {limit})")),
        "{}",
        status.message()
    );
    assert!(status.message().len() < 512, "{}", status.message());
}

/// `meshplane_xds_stream_budget_exceeded_total` for `limit`.
fn exceeded(h: &Harness, limit: &str) -> u64 {
    let text = h.hub.metrics().encode().expect("metrics");
    let series = format!("meshplane_xds_stream_budget_exceeded_total{{limit=\"{limit}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .trim()
        .parse()
        .expect("a count")
}

fn sotw_first(names: Vec<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(node("shop", "p-1")),
        type_url: type_url::CLUSTER.into(),
        resource_names: names,
        ..Default::default()
    }
}

fn limited(budget: BudgetLimits) -> AdsLimits {
    AdsLimits {
        budget,
        ..AdsLimits::default()
    }
}

/// A harness whose streams have `budget`, serving cluster `c1` in `shop`.
async fn budgeted(budget: BudgetLimits) -> Harness {
    let h = Harness::start_limited(None, limited(budget)).await;
    h.set("shop", config("a")).await;
    h
}

/// The first delta request of proxy `p-1` in `shop`.
fn delta_first(request: DeltaDiscoveryRequest) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(node("shop", "p-1")),
        ..request
    }
}

/// A first delta request for clusters claiming `n` initial versions.
fn delta_with_versions(n: usize) -> DeltaDiscoveryRequest {
    delta_first(DeltaDiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        initial_resource_versions: padded_names("c", n, 8)
            .into_iter()
            .map(|n| (n, "v".to_string()))
            .collect(),
        ..Default::default()
    })
}

/// A SotW request for clusters (no node: not a first request).
fn sotw_clusters(names: Vec<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        resource_names: names,
        ..Default::default()
    }
}

/// A 2.6 MB list of 300,000 names would cost tens of MB decoded and held: it is refused
/// from its encoding, before the token is even reviewed.
#[tokio::test]
async fn an_oversized_sotw_name_list_is_resource_exhausted_before_admission() {
    let reviews = Arc::new(AtomicUsize::new(0));
    let reviewer = TokenReviewer::new(counting_kube(Arc::clone(&reviews)), AUDIENCE);
    let h = Harness::start_with(Some(reviewer)).await;
    h.set("shop", config("a")).await;
    let first = sotw_first(padded_names("c", 300_000, 8));
    let status = ended(open_sotw(h.client().await, first, Some("shop-token")).await).await;
    assert_exhausted(&status, "names_per_type");
    assert!(status.message().contains("300000"), "{}", status.message());
    assert_eq!(
        reviews.load(Ordering::SeqCst),
        0,
        "refused before admission"
    );
    assert_eq!(exceeded(&h, "names_per_type"), 1);
    // A proxy with an ordinary request is served.
    let (_tx, mut rx) = open_sotw(h.client().await, sotw_first(vec![]), Some("shop-token"))
        .await
        .expect("admitted");
    tokio::time::timeout(DEADLINE, rx.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("a response");
}

/// A 3.6 MB subscription within the budget (40,000 names of 90 bytes) is served.
#[tokio::test]
async fn a_large_subscription_within_budget_is_served() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut names = padded_names("c", 40_000, 90);
    names.push("c1".into());
    let (_tx, mut rx) = open_sotw(h.client().await, sotw_first(names), None)
        .await
        .expect("admitted");
    let response = tokio::time::timeout(DEADLINE, rx.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("a response");
    assert_eq!(response.resources.len(), 1, "c1");
    for limit in meshplane_xds::ads::budget::LIMITS {
        assert_eq!(exceeded(&h, limit), 0, "{limit}");
    }
}

/// 60,000 initial versions (about 1 MB encoded, each an allocated entry once decoded) are
/// refused undecoded.
#[tokio::test]
async fn delta_initial_resource_versions_over_budget_are_resource_exhausted() {
    let h = budgeted(BudgetLimits::default()).await;
    let status = ended(open_delta(h.client().await, delta_with_versions(60_000)).await).await;
    assert_exhausted(&status, "initial_resource_versions");
    assert_eq!(exceeded(&h, "initial_resource_versions"), 1);

    // Within the per-request limit, initial versions still count against the stream's names.
    let h = budgeted(BudgetLimits {
        names_per_stream: 1_000,
        ..BudgetLimits::default()
    })
    .await;
    let status = ended(open_delta(h.client().await, delta_with_versions(1_001)).await).await;
    assert_exhausted(&status, "names_per_stream");
}

fn delta_request(
    type_url: &str,
    subscribe: Vec<String>,
    unsubscribe: Vec<String>,
) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        resource_names_subscribe: subscribe,
        resource_names_unsubscribe: unsubscribe,
        ..Default::default()
    }
}

/// Delta subscriptions add up across requests: past a type's cap, or the stream's, the stream
/// ends.
#[tokio::test]
async fn delta_subscriptions_accumulating_past_the_cap_are_resource_exhausted() {
    let h = budgeted(BudgetLimits::default()).await;
    let first = delta_first(delta_request(
        type_url::CLUSTER,
        padded_names("a", 20_000, 8),
        vec![],
    ));
    let opened = open_delta(h.client().await, first).await.expect("admitted");
    for prefix in ["b", "c"] {
        opened
            .0
            .send(delta_request(
                type_url::CLUSTER,
                padded_names(prefix, 20_000, 8),
                vec![],
            ))
            .await
            .expect("send");
    }
    let status = ended(Ok(opened)).await;
    assert_exhausted(&status, "names_per_type");
    assert!(status.message().contains("60000"), "{}", status.message());

    // Over every type: 400 names each of four types, 1,500 at most.
    let h = budgeted(BudgetLimits {
        names_per_type: 1_000,
        names_per_stream: 1_500,
        ..BudgetLimits::default()
    })
    .await;
    let first = delta_first(delta_request(
        type_url::CLUSTER,
        padded_names("a", 400, 8),
        vec![],
    ));
    let opened = open_delta(h.client().await, first).await.expect("admitted");
    for t in [type_url::LISTENER, type_url::ROUTE, type_url::ENDPOINT] {
        opened
            .0
            .send(delta_request(t, padded_names("a", 400, 8), vec![]))
            .await
            .expect("send");
    }
    let status = ended(Ok(opened)).await;
    assert_exhausted(&status, "names_per_stream");
    assert!(status.message().contains("1600"), "{}", status.message());
    assert_eq!(exceeded(&h, "names_per_stream"), 1);
}

/// Unsubscribing (delta) or a smaller list (SotW) gives room back; names never subscribed
/// give none.
#[tokio::test]
async fn unsubscribing_makes_room_for_other_names() {
    let h = budgeted(BudgetLimits {
        names_per_type: 1_000,
        ..BudgetLimits::default()
    })
    .await;
    let a = padded_names("a", 800, 8);
    let b = padded_names("b", 800, 8);
    let first = delta_first(delta_request(type_url::CLUSTER, a.clone(), vec![]));
    let (tx, mut rx) = open_delta(h.client().await, first).await.expect("admitted");
    tx.send(delta_request(type_url::CLUSTER, b.clone(), a))
        .await
        .expect("send");
    // The stream is still served: a subscription to c1 is answered.
    tx.send(delta_request(type_url::CLUSTER, vec!["c1".into()], vec![]))
        .await
        .expect("send");
    // Responses to the earlier subscriptions may come first.
    loop {
        let response = tokio::time::timeout(DEADLINE, rx.message())
            .await
            .expect("in time")
            .expect("not refused")
            .expect("a response");
        if delta_names(&response) == ["c1"] {
            break;
        }
        tx.send(DeltaDiscoveryRequest {
            response_nonce: response.nonce.clone(),
            ..delta_request(type_url::CLUSTER, vec![], vec![])
        })
        .await
        .expect("ACK");
    }
    // Unsubscribing names it never subscribed to makes no room.
    tx.send(delta_request(
        type_url::CLUSTER,
        padded_names("c", 300, 8),
        padded_names("z", 800, 8),
    ))
    .await
    .expect("send");
    let status = ended(Ok((tx, rx))).await;
    assert_exhausted(&status, "names_per_type");
    assert!(status.message().contains("1101"), "{}", status.message());

    // SotW: the latest list is what the stream holds.
    let (tx, mut rx) = open_sotw(
        h.client().await,
        sotw_first(padded_names("a", 900, 8)),
        None,
    )
    .await
    .expect("admitted");
    tx.send(sotw_clusters(padded_names("b", 900, 8)))
        .await
        .expect("send");
    tx.send(sotw_clusters(vec!["c1".into()]))
        .await
        .expect("send");
    loop {
        let response = tokio::time::timeout(DEADLINE, rx.message())
            .await
            .expect("in time")
            .expect("not refused")
            .expect("a response");
        if response.resources.len() == 1 {
            break;
        }
        tx.send(DiscoveryRequest {
            version_info: response.version_info.clone(),
            response_nonce: response.nonce.clone(),
            ..sotw_clusters(vec!["c1".into()])
        })
        .await
        .expect("ACK");
    }
    tx.send(sotw_clusters(padded_names("c", 1_001, 8)))
        .await
        .expect("send");
    assert_exhausted(&ended(Ok((tx, rx))).await, "names_per_type");
}

/// Streams of one HTTP/2 connection share twice a stream's budget; another connection has its
/// own, and a stream that ends gives its share back.
#[tokio::test]
async fn streams_of_one_connection_share_its_budget() {
    let h = budgeted(BudgetLimits {
        name_bytes_per_stream: 64 * 1024,
        ..BudgetLimits::default()
    })
    .await;
    // About 50 KiB of names each: two fit the connection's 128 KiB, three do not.
    let first = |pod: &str| {
        let mut names = padded_names(pod, 500, 100);
        names.push("c1".into());
        DiscoveryRequest {
            node: Some(node("shop", pod)),
            ..sotw_first(names)
        }
    };
    let connection = h.client().await;
    let mut served = Vec::new();
    for pod in ["p-1", "p-2"] {
        let (tx, mut rx) = open_sotw(connection.clone(), first(pod), None)
            .await
            .expect("admitted");
        tokio::time::timeout(DEADLINE, rx.message())
            .await
            .expect("in time")
            .expect("ok")
            .expect("a response");
        served.push((tx, rx));
    }
    let status = ended(open_sotw(connection.clone(), first("p-3"), None).await).await;
    assert_exhausted(&status, "connection");
    assert_eq!(exceeded(&h, "connection"), 1);
    // Another connection is not affected.
    let (_other, mut rx) = open_sotw(h.client().await, first("p-4"), None)
        .await
        .expect("another connection");
    tokio::time::timeout(DEADLINE, rx.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("a response");
    // One stream leaves: its share is the connection's again.
    let mut connected = h.hub.connected_count();
    let before = *connected.borrow_and_update();
    served.pop();
    tokio::time::timeout(DEADLINE, connected.wait_for(|n| *n < before))
        .await
        .expect("in time")
        .expect("open");
    let (_tx, mut rx) = open_sotw(connection.clone(), first("p-5"), None)
        .await
        .expect("room again");
    tokio::time::timeout(DEADLINE, rx.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("a response");
}

/// A kube client answering TokenReviews only once `open` turns true (`shop-<n>-token` is
/// ServiceAccount `shop/default`), counting the reviews it was sent.
fn held_kube(
    reviews: tokio::sync::watch::Sender<usize>,
    open: tokio::sync::watch::Receiver<bool>,
) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let reviews = reviews.clone();
        let mut open = open.clone();
        async move {
            reviews.send_modify(|n| *n += 1);
            let body = req.into_body().collect().await.expect("body").to_bytes();
            let mut review: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            let _ = open.wait_for(|o| *o).await;
            review["status"] = serde_json::json!({
                "authenticated": true, "audiences": [AUDIENCE],
                "user": {"username": "system:serviceaccount:shop:default"},
            });
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

/// Large first requests held while their streams wait for admission share one pool: past it,
/// a stream is refused at once instead of holding its request too.
#[tokio::test]
async fn large_first_requests_waiting_for_admission_are_bounded_together() {
    let (reviews, mut reviewed) = tokio::sync::watch::channel(0usize);
    let (open, opened) = tokio::sync::watch::channel(false);
    let reviewer =
        TokenReviewer::with_budget(held_kube(reviews, opened), AUDIENCE, budget(1e3, 1e3));
    let h = Harness::start_limited(
        Some(reviewer),
        limited(BudgetLimits {
            awaiting_admission: 350 * 1024,
            ..BudgetLimits::default()
        }),
    )
    .await;
    h.set("shop", config("a")).await;
    // About 100 KiB each: three fit the pool.
    let large = |i: usize| {
        let mut names = padded_names(&format!("s{i}-"), 1_000, 100);
        names.push("c1".into());
        sotw_first(names)
    };
    let mut waiting = Vec::new();
    for i in 0..3 {
        let client = h.client().await;
        let first = large(i);
        waiting.push(tokio::spawn(async move {
            let token = format!("shop-{i}-token");
            let (tx, mut rx) = open_sotw(client, first, Some(&token)).await?;
            let response = rx.message().await?;
            Ok::<_, tonic::Status>((tx, rx, response))
        }));
    }
    tokio::time::timeout(DEADLINE, reviewed.wait_for(|n| *n == 3))
        .await
        .expect("three streams await their review")
        .expect("open");
    let refused =
        async { ended(open_sotw(h.client().await, large(3), Some("shop-3-token")).await).await };
    let status = tokio::time::timeout(DEADLINE, refused)
        .await
        .expect("refused at once, not left waiting");
    assert_exhausted(&status, "awaiting_admission");
    assert_eq!(exceeded(&h, "awaiting_admission"), 1);
    // Admission decides: the three are served and the pool is free again.
    open.send_replace(true);
    for w in waiting {
        let (_tx, _rx, response) = tokio::time::timeout(DEADLINE, w)
            .await
            .expect("in time")
            .expect("task")
            .expect("served");
        assert!(response.is_some());
    }
    let (_tx, mut rx) = open_sotw(h.client().await, large(4), Some("shop-4-token"))
        .await
        .expect("admitted");
    tokio::time::timeout(DEADLINE, rx.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("a response");
}

/// A client that acknowledges each response with a changed subscription (each change owes it
/// the whole subscribed set again) gets its burst of answers at once, then each answer waits
/// for the stream's pacing allowance; every request is still answered, for what it asked.
#[tokio::test]
async fn subscription_changes_past_the_burst_are_paced() {
    const BURST: u32 = 4;
    const EXCHANGES: usize = 16;
    let limits = AdsLimits {
        pacing: PacingLimits {
            burst: BURST,
            rate: 10,
        },
        ..AdsLimits::default()
    };
    let h = Harness::start_limited(None, limits).await;
    let mut two = config("a");
    two.clusters.push(res(type_url::CLUSTER, "c2", "a"));
    h.set("shop", two).await;
    let (tx, mut rx) = open_sotw(h.client().await, sotw_first(vec!["c1".into()]), None)
        .await
        .expect("admitted");
    let mut response = next_sotw(&mut rx).await;
    assert_eq!(sotw_names(&response), vec!["c1"]);
    for i in 0..EXCHANGES {
        let names: Vec<String> = if i % 2 == 0 {
            vec!["c1", "c2"]
        } else {
            vec!["c1"]
        }
        .into_iter()
        .map(String::from)
        .collect();
        let mut request = sotw_clusters(names.clone());
        request.response_nonce = response.nonce.clone();
        request.version_info = response.version_info.clone();
        tx.send(request).await.expect("sent");
        response = next_sotw(&mut rx).await;
        assert_eq!(sotw_names(&response), names, "exchange {i}");
    }
    let text = h.hub.metrics().encode().expect("metrics");
    let paced: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("meshplane_xds_paced_responses_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no paced count in\n{text}"));
    // The first response and BURST - 1 changes were free; the later ones waited, unless the
    // client's round trip alone took as long as the allowance grows by one (100 ms).
    assert!(
        paced >= (EXCHANGES + 1 - BURST as usize) / 2,
        "{paced} paced of {EXCHANGES} changes"
    );
}

async fn next_sotw(rx: &mut tonic::Streaming<DiscoveryResponse>) -> DiscoveryResponse {
    tokio::time::timeout(DEADLINE, rx.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("a response")
}
