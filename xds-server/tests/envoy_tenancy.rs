//! Real Envoy claiming a namespace outside the tenant gets no configuration.

mod envoy_common;

use envoy_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_of_a_non_member_namespace_gets_no_config() {
    let server = Server::start(&[
        (
            "ns.yaml",
            &format!(
                "{}---\n{}",
                namespace("shop", true),
                namespace("outsider", false)
            ),
        ),
        (
            "web.yaml",
            &service("web", "shop", "198.19.0.10", 18080, 8080, "127.0.0.2"),
        ),
    ])
    .await;
    let envoy = Envoy::start(&server, "outsider", "intruder-1", Ads::Sotw).await;

    eventually("the server refuses the stream", || async {
        let metrics = server.monitoring_get("/metrics").await;
        metrics
            .contains(r#"meshplane_xds_rejected_connections_total{reason="not_member"}"#)
            .then_some(())
    })
    .await;
    // Envoy saw the refusal (PERMISSION_DENIED) and holds nothing but its bootstrap.
    let clusters = envoy.admin_get("/clusters").await;
    assert!(clusters.contains("xds-grpc::"), "{clusters}");
    assert!(
        !clusters.contains("outbound|"),
        "no cluster was delivered: {clusters}"
    );
    let listeners = envoy.admin_get("/listeners").await;
    assert!(
        listeners.trim().is_empty(),
        "no listener was delivered: {listeners}"
    );
    let proxies = server.monitoring_get("/debug/proxies").await;
    assert_eq!(proxies, "[]", "the refused proxy is not registered");
    // Envoy's connected_state flaps while it retries (each retry opens a stream before the
    // refusal arrives), so the refusal is asserted on the server's counter above instead.
}
