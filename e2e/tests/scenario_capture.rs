//! Transparent capture on real pod networks, in the default capture mode: the capture init
//! container really programs each pod's netfilter; the client app calls
//! `http://web.shop.svc.cluster.local:8080/` and the request goes client app → client sidecar
//! (15001) → server sidecar (15006) → server app, each hop proven by the sidecars' counters and
//! what the server app saw; the proxy runs as UID 1337 and its own xDS connection is not
//! captured (no loop through itself); a pod without a sidecar still calls a meshed service; a
//! pod that opts out of capture (`captureMode: NONE`) keeps its traffic to itself.

use std::time::{Duration, Instant};

use meshplane_crds::names::PROXY_UID;
use meshplane_e2e::harness::{app_and_client, wait_for, Cluster, WEB_PORT};
use meshplane_e2e::reach::{EnvoyStats, InPod};

const DEADLINE: Duration = Duration::from_secs(120);
/// Requests each hop check sends.
const REQUESTS: u64 = 3;

const CLIENT_OUTBOUND: &str = "cluster.outbound|8080||web.shop.svc.cluster.local.upstream_rq_200";
const SERVER_INBOUND: &str = "cluster.inbound|8080||.upstream_rq_200";

/// A pod with no sidecar (`sidecar.meshplane.io/inject: "false"`) and one whose sidecar does
/// not capture (`captureMode: NONE`), both calling `web`.
const OTHER_CALLERS: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: outsider
  namespace: shop
  labels: {app: outsider, sidecar.meshplane.io/inject: "false"}
spec:
  containers:
    - {name: app, image: example.com/echo:1, ports: [{name: http, containerPort: 9080}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: uncaptured
  namespace: shop
  labels: {app: uncaptured}
  annotations: {sidecar.meshplane.io/captureMode: NONE}
spec:
  containers:
    - {name: app, image: example.com/echo:1, ports: [{name: http, containerPort: 9080}]}
"#;

/// The pod's nat table as `iptables-save -c` prints it, run inside the pod.
async fn nat_rules(pod: &InPod) -> String {
    let output = pod
        .command("iptables-save")
        .expect("command in the pod")
        .args(["-c", "-t", "nat"])
        .output()
        .await
        .expect("iptables-save runs");
    assert!(output.status.success(), "iptables-save: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

async fn stats(pod: &InPod) -> EnvoyStats {
    pod.envoy_stats().await.expect("Envoy stats")
}

/// Sends `count` GETs from `pod` to `url`; each must reach the web app.
async fn call_web(pod: &InPod, url: &str, count: u64) -> Vec<serde_json::Value> {
    let mut bodies = Vec::new();
    for _ in 0..count {
        let reply = pod.http_get(url).await.expect("a reply from web");
        assert_eq!(reply.status, 200, "{url}: {reply:?}");
        bodies.push(serde_json::from_str(&reply.body).expect("echo JSON"));
    }
    bodies
}

/// Waits until the counter `name` of `pod`'s sidecar is `at_least`; returns its value.
async fn wait_for_counter(pod: &InPod, name: &str, at_least: u64) -> u64 {
    wait_for(&format!("{name} >= {at_least}"), DEADLINE, || async {
        let value = pod
            .envoy_stats()
            .await
            .map_err(|e| e.to_string())?
            .get(name);
        if value >= at_least {
            Ok(Some(value))
        } else {
            Err(format!("{name} = {value}"))
        }
    })
    .await
    .expect("counter")
}

fn pod_name(pods: &[k8s_openapi::api::core::v1::Pod]) -> String {
    pods[0].metadata.name.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_takes_pod_traffic_through_both_sidecars() {
    let started = Instant::now();
    let cluster = Cluster::start("capture").await.expect("cluster");
    let network_available = cluster.network().is_some();
    cluster.install_operator().await.expect("operator");
    cluster
        .kubectl(&["apply", "--server-side", "-f", "config/samples/blue.yaml"])
        .expect("blue");
    cluster
        .kubectl(&["create", "namespace", "shop"])
        .expect("shop");
    cluster
        .kubectl(&["label", "namespace", "shop", "meshplane.io/rev=blue-stable"])
        .expect("join");
    cluster
        .wait_for_mcp_ready("blue-v1", DEADLINE)
        .await
        .expect("blue-v1 Ready");
    cluster
        .apply_manifest(&app_and_client("shop"))
        .expect("workloads");
    cluster
        .apply_manifest(OTHER_CALLERS)
        .expect("other callers");
    let web = cluster
        .wait_for_ready_pods("shop", "app=web", 1, DEADLINE)
        .await
        .expect("web");
    let client = cluster
        .wait_for_ready_pods("shop", "app=client", 1, DEADLINE)
        .await
        .expect("client");
    let outsider = cluster
        .wait_for_ready_pods("shop", "app=outsider", 1, DEADLINE)
        .await
        .expect("outsider");
    let uncaptured = cluster
        .wait_for_ready_pods("shop", "app=uncaptured", 1, DEADLINE)
        .await
        .expect("uncaptured");

    // The capture init container ran to completion before the app and the proxy started.
    for pods in [&web, &client] {
        let status = pods[0].status.clone().unwrap_or_default();
        let init = status.init_container_statuses.unwrap_or_default();
        let capture = init
            .iter()
            .find(|s| s.name == "meshplane-init")
            .expect("a capture init container");
        let terminated = capture
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("the capture init container ran");
        assert_eq!(terminated.exit_code, 0, "{capture:?}");
    }
    for pods in [&outsider, &uncaptured] {
        let spec = pods[0].spec.clone().unwrap_or_default();
        assert!(
            spec.init_containers.unwrap_or_default().is_empty(),
            "{} has no capture init container",
            pod_name(pods)
        );
    }
    if !network_available {
        eprintln!("the hop checks need the local test network; E2E_KUBECONFIG is set");
        return;
    }
    let in_web = cluster.in_pod("shop", &pod_name(&web)).expect("web pod");
    let in_client = cluster
        .in_pod("shop", &pod_name(&client))
        .expect("client pod");
    let in_outsider = cluster
        .in_pod("shop", &pod_name(&outsider))
        .expect("outsider");
    let in_uncaptured = cluster
        .in_pod("shop", &pod_name(&uncaptured))
        .expect("uncaptured");

    // The rules are in the pods' own netfilter: outbound to 15001, inbound to 15006; none
    // in the pod that opted out.
    for pod in [&in_web, &in_client] {
        let rules = nat_rules(pod).await;
        assert!(rules.contains("--to-ports 15001"), "{rules}");
        assert!(rules.contains("--to-ports 15006"), "{rules}");
    }
    let rules = nat_rules(&in_uncaptured).await;
    assert!(!rules.contains("REDIRECT"), "captureMode NONE: {rules}");

    // The proxy runs as UID 1337; the app as root.
    let processes = in_client.processes();
    let envoy_uids: Vec<u32> = processes
        .iter()
        .filter(|(_, name, _)| name == "envoy")
        .map(|(_, _, uid)| *uid)
        .collect();
    assert_eq!(
        envoy_uids,
        vec![u32::try_from(PROXY_UID).expect("uid")],
        "{processes:?}"
    );

    // client app → client sidecar (15001) → server sidecar (15006) → server app.
    let url = format!("http://web.shop.svc.cluster.local:{WEB_PORT}/");
    wait_for("traffic through both sidecars", DEADLINE, || async {
        match in_client.http_get(&url).await {
            Ok(reply) if reply.status == 200 => Ok(Some(())),
            Ok(reply) => Err(format!("{reply:?}")),
            Err(error) => Err(error.to_string()),
        }
    })
    .await
    .expect("first request");
    let (client_before, web_before) = (stats(&in_client).await, stats(&in_web).await);
    let bodies = call_web(&in_client, &url, REQUESTS).await;
    let web_name = pod_name(&web);
    for body in &bodies {
        assert_eq!(body["pod"], web_name.as_str(), "{body}");
        assert_eq!(
            body["host"],
            format!("web.shop.svc.cluster.local:{WEB_PORT}")
        );
        // The server sidecar's inbound cluster connects to the app over the pod's loopback.
        assert!(
            body["peer"]
                .as_str()
                .unwrap_or_default()
                .starts_with("127.0.0.1:"),
            "the app is reached through its sidecar: {body}"
        );
        assert!(body["headers"]["x-request-id"].is_string(), "{body}");
    }
    let client_outbound = wait_for_counter(
        &in_client,
        CLIENT_OUTBOUND,
        client_before.get(CLIENT_OUTBOUND) + REQUESTS,
    )
    .await;
    assert_eq!(
        client_outbound - client_before.get(CLIENT_OUTBOUND),
        REQUESTS,
        "every request went through the client's sidecar"
    );
    let server_inbound = wait_for_counter(
        &in_web,
        SERVER_INBOUND,
        web_before.get(SERVER_INBOUND) + REQUESTS,
    )
    .await;
    assert_eq!(
        server_inbound - web_before.get(SERVER_INBOUND),
        REQUESTS,
        "every request went through the server's sidecar"
    );

    // Short names resolve in the pod (search path of the pod's namespace).
    for short in ["web", "web.shop"] {
        let bodies = call_web(&in_client, &format!("http://{short}:{WEB_PORT}/"), 1).await;
        assert_eq!(bodies[0]["pod"], web_name.as_str());
    }

    // The proxy's own xDS connection is not captured: it goes straight to the instance, never
    // through the proxy's own listeners (the UID 1337 exclusion rule counted its packets).
    let client_stats = stats(&in_client).await;
    assert!(client_stats.get("cluster.xds-grpc.upstream_cx_total") >= 1);
    assert_eq!(
        client_stats.get("cluster.PassthroughCluster.upstream_cx_total"),
        0,
        "nothing, the xDS connection included, looped through the proxy"
    );
    let owner_rules: Vec<String> = nat_rules(&in_client)
        .await
        .lines()
        .filter(|l| l.contains(&format!("--uid-owner {PROXY_UID}")))
        .map(str::to_string)
        .collect();
    let excluded_packets: u64 = owner_rules
        .iter()
        .filter_map(|l| l.strip_prefix('[')?.split(':').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        excluded_packets > 0,
        "the proxy's own connections matched its exclusion: {owner_rules:?}"
    );

    // A pod without a sidecar calls the meshed service: only the server's sidecar handles it.
    let (client_before, web_before) = (stats(&in_client).await, stats(&in_web).await);
    let bodies = call_web(&in_outsider, &url, REQUESTS).await;
    assert!(bodies.iter().all(|b| b["pod"] == web_name.as_str()));
    wait_for_counter(
        &in_web,
        SERVER_INBOUND,
        web_before.get(SERVER_INBOUND) + REQUESTS,
    )
    .await;
    assert_eq!(
        stats(&in_client).await.get(CLIENT_OUTBOUND),
        client_before.get(CLIENT_OUTBOUND),
        "the client's sidecar saw none of the outsider's requests"
    );

    // captureMode NONE: the pod's own requests bypass its sidecar.
    let uncaptured_before = stats(&in_uncaptured).await;
    let web_before = stats(&in_web).await;
    call_web(&in_uncaptured, &url, REQUESTS).await;
    wait_for_counter(
        &in_web,
        SERVER_INBOUND,
        web_before.get(SERVER_INBOUND) + REQUESTS,
    )
    .await;
    assert_eq!(
        stats(&in_uncaptured).await.get(CLIENT_OUTBOUND),
        uncaptured_before.get(CLIENT_OUTBOUND),
        "an uncaptured pod's requests do not pass its sidecar"
    );
    eprintln!("scenario capture took {:?}", started.elapsed());
}
