//! Two tenants from `config/samples`: each instance becomes Ready; blue's proxies get blue's
//! services and none of green's (and vice versa); a client in blue reaches blue's app through
//! its sidecar's bound listener.

use std::time::{Duration, Instant};

use meshplane_e2e::harness::{app_and_client, envoy_config_dump, pod_ip, wait_for, Cluster};
use meshplane_pod_runner::http_get;

const DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_are_ready_isolated_and_route_their_own_traffic() {
    let started = Instant::now();
    let cluster = Cluster::start_two_tenants("two-tenants", DEADLINE)
        .await
        .expect("two tenants Ready");

    for namespace in ["shop", "garden"] {
        cluster
            .apply_manifest(&app_and_client(namespace))
            .expect("workloads");
    }
    let mut clients = Vec::new();
    let mut sidecars = Vec::new();
    for namespace in ["shop", "garden"] {
        let web = cluster
            .wait_for_ready_pods(namespace, "app=web", 1, DEADLINE)
            .await
            .expect("web");
        let client = cluster
            .wait_for_ready_pods(namespace, "app=client", 1, DEADLINE)
            .await
            .expect("client");
        let containers: Vec<String> = client[0]
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        assert!(
            containers.len() >= 2,
            "the client in {namespace} is injected: {containers:?}"
        );
        clients.push((
            namespace,
            pod_ip(&client[0]).expect("client IP"),
            web[0].metadata.name.clone(),
        ));
        sidecars.push(pod_ip(&web[0]).expect("web IP"));
        sidecars.push(pod_ip(&client[0]).expect("client IP"));
    }

    // Each tenant's proxy knows its own services and none of the other tenant's.
    for (namespace, ip, _) in &clients {
        let other = if *namespace == "shop" {
            "garden"
        } else {
            "shop"
        };
        let what =
            format!("{namespace}'s client Envoy to have web.{namespace} and nothing of {other}");
        let dump = wait_for(&what, DEADLINE, || async {
            let dump = envoy_config_dump(*ip).await.map_err(|e| e.to_string())?;
            if dump.contains(&format!("web.{namespace}.svc.cluster.local")) {
                Ok(Some(dump))
            } else {
                Err("web not in config_dump yet".to_string())
            }
        })
        .await
        .expect("config_dump");
        assert!(
            !dump.contains(&format!(".{other}.svc")),
            "{namespace}'s proxy must not see {other}'s services"
        );
    }

    // Traffic: blue's client → its sidecar's bound listener → blue's web.
    let (_, client_ip, web_name) = &clients[0];
    let listener = std::net::SocketAddr::from((*client_ip, 8080));
    let reply = wait_for(
        "a reply from web.shop through the client's sidecar",
        DEADLINE,
        || async {
            let reply = http_get(
                listener,
                "web.shop.svc.cluster.local:8080",
                "/",
                Duration::from_secs(3),
            )
            .await?;
            (reply.status == 200)
                .then_some(reply.clone())
                .map(Some)
                .ok_or(format!("{reply:?}"))
        },
    )
    .await
    .expect("traffic through the sidecar");
    let body: serde_json::Value = serde_json::from_str(&reply.body).expect("echo JSON");
    assert_eq!(body["namespace"], "shop");
    assert_eq!(body["pod"].as_str(), web_name.as_deref());

    // Every sidecar accepted every update it got (a listener that cannot bind is a NACK).
    for ip in sidecars {
        let admin = std::net::SocketAddr::from((ip, 15000));
        let stats = http_get(
            admin,
            &ip.to_string(),
            "/stats?filter=update_rejected",
            Duration::from_secs(5),
        )
        .await
        .expect("Envoy stats");
        let rejected: Vec<&str> = stats
            .body
            .lines()
            .filter(|l| l.contains("update_rejected") && !l.trim_end().ends_with(": 0"))
            .collect();
        assert!(
            !stats.body.is_empty() && rejected.is_empty(),
            "the sidecar at {ip} rejected config: {rejected:?}"
        );
    }
    eprintln!("scenario two-tenants took {:?}", started.elapsed());
}
