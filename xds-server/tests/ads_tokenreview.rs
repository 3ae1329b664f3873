//! Kubernetes-mode admission: the proxy's bearer token is verified by a TokenReview, and its
//! namespace must be the namespace the node claims. The API server is a fake tower service
//! that answers TokenReviews for two known tokens.

mod ads_common;
mod token_common;

use ads_common::*;
use http_body_util::BodyExt;
use meshplane_xds::model::type_url;
use meshplane_xds::tenancy::TokenReviewer;
use tokio_stream::wrappers::ReceiverStream;

const AUDIENCE: &str = "meshplane-blue";

/// A kube client whose API server knows `shop-token` (ServiceAccount shop/default) and
/// `bank-token` (bank/default), for the audience `meshplane-blue` only.
fn fake_kube() -> kube::Client {
    let service = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
        assert_eq!(
            req.uri().path(),
            "/apis/authentication.k8s.io/v1/tokenreviews"
        );
        let body = req
            .into_body()
            .collect()
            .await
            .expect("request body")
            .to_bytes();
        let review: serde_json::Value = serde_json::from_slice(&body).expect("TokenReview JSON");
        let token = token_common::jwt_name(review["spec"]["token"].as_str().unwrap_or_default());
        let wants_audience = review["spec"]["audiences"][0] == AUDIENCE;
        let status = match (token.as_str(), wants_audience) {
            ("shop-token", true) | ("bank-token", true) => serde_json::json!({
                "authenticated": true,
                "audiences": [AUDIENCE],
                "user": { "username": format!("system:serviceaccount:{}:default", &token[..4]) },
            }),
            _ => serde_json::json!({ "authenticated": false, "error": "invalid bearer token" }),
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
    });
    kube::Client::new(service, "default")
}

type Stream = (
    tokio::sync::mpsc::Sender<envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest>,
    tonic::Streaming<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse>,
);

/// Opens a SotW stream for a proxy of `namespace` with the token named `token`
/// ([`token_common::jwt`]); the sender keeps the request side open.
async fn open(h: &Harness, namespace: &str, token: Option<&str>) -> Result<Stream, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(
        envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
            node: Some(node(namespace, "p-1")),
            type_url: type_url::CLUSTER.into(),
            ..Default::default()
        },
    )
    .await
    .expect("queue");
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(t) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", token_common::jwt(t))
                .parse()
                .expect("ascii"),
        );
    }
    let stream = h
        .client()
        .await
        .stream_aggregated_resources(request)
        .await?;
    Ok((tx, stream.into_inner()))
}

async fn kube_mode_harness() -> Harness {
    Harness::start_with(Some(TokenReviewer::new(fake_kube(), AUDIENCE))).await
}

#[tokio::test]
async fn a_valid_token_of_the_claimed_namespace_is_admitted() {
    let h = kube_mode_harness().await;
    h.set("shop", config("a")).await;
    let (_tx, mut stream) = open(&h, "shop", Some("shop-token"))
        .await
        .expect("admitted");
    let r = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("deadline")
        .expect("ok")
        .expect("open");
    assert_eq!(r.type_url, type_url::CLUSTER);
}

#[tokio::test]
async fn a_token_of_another_namespace_cannot_claim_this_one() {
    let h = kube_mode_harness().await;
    let err = open(&h, "shop", Some("bank-token"))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(
        err.message().contains("\"bank\"") && err.message().contains("\"shop\""),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn missing_or_invalid_tokens_are_unauthenticated() {
    let h = kube_mode_harness().await;
    let err = open(&h, "shop", None).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = open(&h, "shop", Some("forged")).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(
        err.message().contains("invalid bearer token"),
        "{}",
        err.message()
    );
    let metrics = h.hub.metrics().encode().expect("metrics");
    assert!(
        metrics.contains(r#"meshplane_xds_rejected_connections_total{reason="unauthenticated"} 2"#),
        "{metrics}"
    );
}
