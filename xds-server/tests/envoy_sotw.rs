//! Real Envoy over state-of-the-world ADS: routing through a bound listener, an endpoint
//! change shifting traffic while the assignments left out of the (partial) EDS response keep
//! serving, a cluster change warming at once on its assignment sent again, and an EnvoyFilter whose output Envoy rejects (NACK) while traffic
//! keeps flowing on the last good config.

mod envoy_common;

use std::net::{Ipv4Addr, SocketAddr};

use envoy_common::*;

const HOST: &str = "web.shop.svc.cluster.local";
const API: &str = "api.shop.svc.cluster.local";

const BAD_FILTER: &str = r#"apiVersion: networking.meshplane.io/v1alpha1
kind: EnvoyFilter
metadata: {name: negative-timeout, namespace: shop}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {service: web.shop.svc.cluster.local}}
    patch: {operation: MERGE, value: {connect_timeout: -1s}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_routes_follows_endpoints_and_survives_a_nacked_envoyfilter() {
    let target = two_upstreams().await;
    let port = free_port(Ipv4Addr::LOCALHOST);
    let listener = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let server = Server::start(&[
        ("ns.yaml", &namespace("shop", true)),
        (
            "web.yaml",
            &service("web", "shop", "198.19.0.10", port, target, "127.0.0.2"),
        ),
        (
            "api.yaml",
            &service("api", "shop", "198.19.0.11", port, target, "127.0.0.2"),
        ),
    ])
    .await;
    let envoy = Envoy::start(&server, "shop", "client-1", Ads::Sotw).await;

    // Real HTTP through the bound listener to upstream a.
    eventually("traffic reaches upstream-a", || async {
        http_get(listener, HOST, "/")
            .await
            .filter(|(s, b)| *s == 200 && b == "upstream-a")
    })
    .await;

    // The endpoint moves: traffic follows.
    server.write(
        "web.yaml",
        &service("web", "shop", "198.19.0.10", port, target, "127.0.0.3"),
    );
    eventually("traffic shifts to upstream-b", || async {
        http_get(listener, HOST, "/")
            .await
            .filter(|(s, b)| *s == 200 && b == "upstream-b")
    })
    .await;
    // That EDS response carried web's assignment only: api keeps the one it had.
    assert_eq!(
        http_get(listener, API, "/").await,
        Some((200, "upstream-a".to_string())),
        "{}",
        envoy.log()
    );

    // api's cluster changes, its endpoints do not: the re-created cluster gets its assignment
    // again and warms at once, without waiting out its initial fetch.
    server.write("api-rule.yaml", &least_request_rule("api", "shop", "api"));
    envoy.await_active_lb_policy(API, "LEAST_REQUEST").await;
    assert_eq!(envoy.fetch_timeouts().await, Vec::<String>::new());
    assert_eq!(
        http_get(listener, API, "/").await,
        Some((200, "upstream-a".to_string()))
    );

    let proxies = server.monitoring_get("/debug/proxies").await;
    let list: serde_json::Value = serde_json::from_str(&proxies).expect("debug JSON");
    let cds = &list[0]["types"][0];
    assert_eq!(cds["type"], "cds");
    assert_eq!(cds["sent_version"], cds["acked_version"], "{proxies}");

    // An EnvoyFilter producing a cluster Envoy rejects.
    server.write("filter.yaml", BAD_FILTER);
    let nack = eventually("the NACK is reported on /debug/proxies", || async {
        let body = server.monitoring_get("/debug/proxies").await;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let m = v[0]["types"][0]["last_nack"]["message"]
            .as_str()?
            .to_string();
        Some(m)
    })
    .await;
    assert!(
        nack.to_lowercase().contains("duration"),
        "Envoy names the bad field: {nack}"
    );
    let metrics = server.monitoring_get("/metrics").await;
    assert!(
        metrics.contains(r#"meshplane_xds_nacks_total{type="cds"}"#),
        "{metrics}"
    );
    let dump = server
        .monitoring_get(
            "/debug/config_dump?proxy=sidecar~127.0.0.1~client-1.shop~shop.svc.cluster.local",
        )
        .await;
    assert!(
        dump.contains("outbound|"),
        "config dump lists the held clusters: {dump}"
    );

    // The last good config keeps serving.
    let (status, body) = http_get(listener, HOST, "/").await.expect("still routable");
    assert_eq!(
        (status, body.as_str()),
        (200, "upstream-b"),
        "{}",
        envoy.log()
    );
    let clusters = envoy.admin_get("/clusters").await;
    assert!(clusters.contains("127.0.0.3"), "{clusters}");

    // Without the EnvoyFilter the intended clusters are again those the proxy holds: nothing
    // is sent, and the proxy is no longer reported as rejecting its config.
    server.remove("filter.yaml");
    eventually("the rejection is lifted on /debug/proxies", || async {
        let body = server.monitoring_get("/debug/proxies").await;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let cds = &v[0]["types"][0];
        (cds["rejected"] == false && cds["sent_version"] == cds["acked_version"]).then_some(())
    })
    .await;
}
