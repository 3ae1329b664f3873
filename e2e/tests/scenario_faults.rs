//! Faults: the operator killed mid-reconcile, the xds-server killed (Envoy reconnects and gets
//! the same config), and watches dropped / history expired (410) in the stand-in: everything
//! converges. Runs on the stand-in only (it needs the pod runner and the stand-in's faults).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use meshplane_crds::names;
use meshplane_e2e::harness::{app_and_client, wait_for, Cluster, WEB_PORT};

const DEADLINE: Duration = Duration::from_secs(120);

/// The `version_info` of every dynamic resource in a config dump, sorted: equal dumps mean
/// the proxy holds the same config versions.
fn config_versions(dump: &str) -> Vec<String> {
    let value: serde_json::Value = serde_json::from_str(dump).unwrap_or_default();
    let mut versions = Vec::new();
    let mut pending = vec![&value];
    while let Some(node) = pending.pop() {
        match node {
            serde_json::Value::Object(map) => {
                if let (Some(version), Some(name)) = (
                    map.get("version_info").and_then(|v| v.as_str()),
                    map.get("cluster")
                        .or(map.get("listener"))
                        .or(map.get("route_config")),
                ) {
                    let name = name
                        .get("name")
                        .and_then(|n| n.as_str())
                        .unwrap_or_default();
                    versions.push(format!("{name}@{version}"));
                }
                pending.extend(map.values());
            }
            serde_json::Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    versions.sort();
    versions
}

async fn wait_for_bootstrap(cluster: &Cluster, namespace: &str) {
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), namespace);
    let name = names::bootstrap_configmap("blue-v1");
    wait_for(
        &format!("bootstrap ConfigMap in {namespace}"),
        DEADLINE,
        || async {
            config_maps
                .get_opt(&name)
                .await
                .map_err(|e| e.to_string())?
                .map(|_| Some(()))
                .ok_or("absent".to_string())
        },
    )
    .await
    .expect("bootstrap ConfigMap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_xds_and_watch_faults_converge() {
    let started = Instant::now();
    let cluster = Cluster::start("faults").await.expect("cluster");
    let (Some(standin), Some(runner)) = (cluster.standin(), cluster.runner()) else {
        eprintln!("faults need the stand-in and the pod runner; E2E_KUBECONFIG is set, so this scenario does not apply");
        return;
    };
    cluster
        .install_operator()
        .await
        .expect("operator installed");
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
        .wait_for_ready_pods("shop", "app=web", 1, DEADLINE)
        .await
        .expect("web");
    let client = cluster
        .wait_for_ready_pods("shop", "app=client", 1, DEADLINE)
        .await
        .expect("client");
    let in_client = cluster
        .in_pod(
            "shop",
            client[0].metadata.name.as_deref().unwrap_or_default(),
        )
        .expect("client pod");
    let url = format!("http://web.shop.svc.cluster.local:{WEB_PORT}/");
    let through_sidecar = || async {
        let reply = in_client.http_get(&url).await.map_err(|e| e.to_string())?;
        (reply.status == 200)
            .then_some(())
            .map(Some)
            .ok_or(format!("{reply:?}"))
    };
    wait_for(
        "traffic through the client's sidecar",
        DEADLINE,
        through_sidecar,
    )
    .await
    .expect("traffic");

    // Operator killed mid-reconcile: label a namespace and kill every operator container at once.
    cluster
        .kubectl(&["create", "namespace", "shop2"])
        .expect("shop2");
    cluster
        .kubectl(&[
            "label",
            "namespace",
            "shop2",
            "meshplane.io/rev=blue-stable",
        ])
        .expect("join shop2");
    for pod in cluster
        .wait_for_ready_pods(
            "meshplane-system",
            "app.kubernetes.io/name=meshplane-operator",
            2,
            DEADLINE,
        )
        .await
        .expect("operator pods")
    {
        runner
            .kill_container(
                "meshplane-system",
                pod.metadata.name.as_deref().unwrap_or_default(),
                "operator",
            )
            .await
            .expect("kill operator");
    }
    wait_for_bootstrap(&cluster, "shop2").await;

    // xds-server killed: Envoy reconnects and ends with the same config versions.
    let before = config_versions(&in_client.envoy_admin("/config_dump").await.expect("dump"));
    let control = names::control_namespace("blue");
    let instance = cluster
        .wait_for_ready_pods(
            &control,
            &format!("{}=blue-v1", names::REVISION_LABEL),
            1,
            DEADLINE,
        )
        .await
        .expect("blue-v1 instance pod");
    let instance_pod = instance[0].metadata.name.clone().unwrap_or_default();
    let container = instance[0]
        .spec
        .as_ref()
        .map(|s| s.containers[0].name.clone())
        .unwrap_or_default();
    runner
        .kill_container(&control, &instance_pod, &container)
        .await
        .expect("kill xds-server");
    cluster
        .wait_for_ready_pods(
            &control,
            &format!("{}=blue-v1", names::REVISION_LABEL),
            1,
            DEADLINE,
        )
        .await
        .expect("instance back");
    wait_for(
        "traffic after the xds-server restart",
        DEADLINE,
        through_sidecar,
    )
    .await
    .expect("traffic");
    let after = wait_for(
        "the same config versions after reconnecting",
        DEADLINE,
        || async {
            let now = config_versions(
                &in_client
                    .envoy_admin("/config_dump")
                    .await
                    .map_err(|e| e.to_string())?,
            );
            (now == before)
                .then_some(now.clone())
                .map(Some)
                .ok_or(format!("{now:?} != {before:?}"))
        },
    )
    .await
    .expect("same versions");
    assert!(!after.is_empty(), "the proxy holds dynamic config");

    // History expired and watches dropped: every watch's resume gets 410 Gone and must relist.
    // A new member still converges, and promptly (one shared backoff across the controller's
    // watches used to stall it for minutes; see docs/e2e-on-kind.md).
    standin.expire_history();
    standin.drop_all_watches();
    cluster
        .kubectl(&["create", "namespace", "shop3"])
        .expect("shop3");
    cluster
        .kubectl(&[
            "label",
            "namespace",
            "shop3",
            "meshplane.io/rev=blue-stable",
        ])
        .expect("join shop3");
    wait_for_bootstrap(&cluster, "shop3").await;
    let planes = cluster
        .kubectl(&["get", "meshcontrolplanes", "-o", "name"])
        .expect("planes");
    assert_eq!(planes.lines().count(), 1, "nothing duplicated: {planes}");
    eprintln!("scenario faults took {:?}", started.elapsed());
}
