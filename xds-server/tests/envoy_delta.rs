//! Real Envoy over delta ADS: routing to two namespaces' services, its virtual hosts over
//! VHDS (a new service on a port joins that route configuration as one virtual host), a
//! cluster change warming at once on its assignment sent again, then a Sidecar narrowing the proxy's imports to its own namespace makes the other host unroutable.

mod envoy_common;

use std::net::{Ipv4Addr, SocketAddr};

use envoy_common::*;

const SIDECAR: &str = r#"apiVersion: networking.meshplane.io/v1alpha1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress:
  - hosts: ["./*"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_narrowing_makes_the_other_namespace_unroutable() {
    let target = two_upstreams().await;
    let web_port = free_port(Ipv4Addr::LOCALHOST);
    let api_port = free_port(Ipv4Addr::LOCALHOST);
    let web = SocketAddr::from((Ipv4Addr::LOCALHOST, web_port));
    let api = SocketAddr::from((Ipv4Addr::LOCALHOST, api_port));
    let server = Server::start(&[
        (
            "ns.yaml",
            &format!(
                "{}---\n{}",
                namespace("shop", true),
                namespace("bank", true)
            ),
        ),
        (
            "web.yaml",
            &service("web", "shop", "198.19.0.10", web_port, target, "127.0.0.2"),
        ),
        (
            "api.yaml",
            &service("api", "bank", "198.19.0.11", api_port, target, "127.0.0.3"),
        ),
    ])
    .await;
    let envoy = Envoy::start(&server, "shop", "client-1", Ads::Delta).await;

    eventually("web.shop routes to upstream-a", || async {
        http_get(web, "web.shop.svc.cluster.local", "/")
            .await
            .filter(|(s, b)| *s == 200 && b == "upstream-a")
    })
    .await;
    eventually("api.bank routes to upstream-b", || async {
        http_get(api, "api.bank.svc.cluster.local", "/")
            .await
            .filter(|(s, b)| *s == 200 && b == "upstream-b")
    })
    .await;
    let proxies = server.monitoring_get("/debug/proxies").await;
    assert!(proxies.contains(r#""protocol":"delta""#), "{proxies}");

    // The virtual hosts came over VHDS: the route configuration Envoy holds is the stub
    // pointing to VHDS, with the virtual hosts named `<route config>/<vhost>` beside it.
    assert!(
        proxies.contains(r#"{"type":"vhds","subscribed":true"#),
        "{proxies}"
    );
    let stat = format!("rds.vhds.{web_port}.update_success: ");
    let stats = envoy.admin_get("/stats?filter=vhds").await;
    assert!(
        stats
            .lines()
            .any(|l| l.contains(&stat) && !l.ends_with(" 0")),
        "{stats}"
    );
    let routes = envoy
        .admin_get("/config_dump?resource=dynamic_route_configs")
        .await;
    let vhost = format!(r#""{web_port}/web.shop.svc.cluster.local:{web_port}""#);
    assert!(
        routes.contains(&vhost) && routes.contains(r#""vhds""#),
        "{routes}"
    );

    // A new service on web's port: one virtual host more in that route configuration.
    server.write(
        "pay.yaml",
        &service("pay", "shop", "198.19.0.12", web_port, target, "127.0.0.3"),
    );
    eventually(
        "pay.shop routes to upstream-b through web's listener",
        || async {
            http_get(web, "pay.shop.svc.cluster.local", "/")
                .await
                .filter(|(s, b)| *s == 200 && b == "upstream-b")
        },
    )
    .await;
    let routes = envoy
        .admin_get("/config_dump?resource=dynamic_route_configs")
        .await;
    let pay = format!(r#""{web_port}/pay.shop.svc.cluster.local:{web_port}""#);
    assert!(routes.contains(&pay), "{routes}");

    // A service on a new port: a new listener and route configuration, whose virtual hosts
    // Envoy subscribes to once it has them.
    let ship_port = free_port(Ipv4Addr::LOCALHOST);
    let ship = SocketAddr::from((Ipv4Addr::LOCALHOST, ship_port));
    server.write(
        "ship.yaml",
        &service(
            "ship",
            "shop",
            "198.19.0.13",
            ship_port,
            target,
            "127.0.0.2",
        ),
    );
    eventually("ship.shop routes to upstream-a on its own port", || async {
        http_get(ship, "ship.shop.svc.cluster.local", "/")
            .await
            .filter(|(s, b)| *s == 200 && b == "upstream-a")
    })
    .await;

    // web's cluster changes, its endpoints do not: the re-created cluster gets its assignment
    // again and warms at once, without waiting out its initial fetch.
    server.write("web-rule.yaml", &least_request_rule("web", "shop", "web"));
    envoy
        .await_active_lb_policy("web.shop.svc.cluster.local", "LEAST_REQUEST")
        .await;
    assert_eq!(envoy.fetch_timeouts().await, Vec::<String>::new());
    assert_eq!(
        http_get(web, "web.shop.svc.cluster.local", "/").await,
        Some((200, "upstream-a".to_string()))
    );

    server.write("sidecar.yaml", SIDECAR);
    eventually("api.bank is no longer routable", || async {
        match http_get(api, "api.bank.svc.cluster.local", "/").await {
            Some((200, body)) if body == "upstream-b" => None,
            _ => Some(()),
        }
    })
    .await;
    let clusters = envoy.admin_get("/clusters").await;
    assert!(
        !clusters.contains("api.bank.svc.cluster.local"),
        "bank's cluster is removed: {clusters}"
    );
    let (status, body) = http_get(web, "web.shop.svc.cluster.local", "/")
        .await
        .expect("web still routable");
    assert_eq!(
        (status, body.as_str()),
        (200, "upstream-a"),
        "{}",
        envoy.log()
    );
}
