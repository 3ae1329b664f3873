//! Join and leave: labelling a namespace brings blue's bootstrap ConfigMap, the instance's
//! RoleBinding and sidecar injection; removing the label removes them all and nothing else.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::ListParams;
use kube::Api;
use meshplane_crds::names;
use meshplane_e2e::harness::{container_names, test_pod, wait_for, Cluster};

const DEADLINE: Duration = Duration::from_secs(120);
const MANAGED: &str = "app.kubernetes.io/managed-by=meshplane";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_brings_bootstrap_rbac_and_injection_and_leaving_removes_only_them() {
    let started = Instant::now();
    let cluster = Cluster::start("join-leave").await.expect("cluster");
    cluster
        .install_operator()
        .await
        .expect("operator installed");
    cluster
        .kubectl(&["apply", "--server-side", "-f", "config/samples/blue.yaml"])
        .expect("blue");
    cluster
        .wait_for_mcp_ready("blue-v1", DEADLINE)
        .await
        .expect("blue-v1 Ready");
    cluster
        .kubectl(&["create", "namespace", "shop"])
        .expect("shop");
    cluster
        .kubectl(&[
            "-n",
            "shop",
            "create",
            "configmap",
            "mine",
            "--from-literal=owner=shop",
        ])
        .expect("a user ConfigMap");

    cluster
        .kubectl(&["label", "namespace", "shop", "meshplane.io/rev=blue-stable"])
        .expect("join");
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "shop");
    let bindings: Api<RoleBinding> = Api::namespaced(cluster.client(), "shop");
    let bootstrap = names::bootstrap_configmap("blue-v1");
    wait_for(
        "bootstrap ConfigMap and reader RoleBinding in shop",
        DEADLINE,
        || async {
            let cm = config_maps
                .get_opt(&bootstrap)
                .await
                .map_err(|e| e.to_string())?;
            let rb = bindings
                .get_opt(&names::member_reader("blue-v1"))
                .await
                .map_err(|e| e.to_string())?;
            match (cm, rb) {
                (Some(cm), Some(_))
                    if cm
                        .data
                        .as_ref()
                        .is_some_and(|d| d.contains_key("envoy.yaml")) =>
                {
                    Ok(Some(()))
                }
                (cm, rb) => Err(format!(
                    "ConfigMap present: {}, RoleBinding present: {}",
                    cm.is_some(),
                    rb.is_some()
                )),
            }
        },
    )
    .await
    .expect("joined");
    let mine_before = config_maps
        .get("mine")
        .await
        .expect("mine")
        .metadata
        .resource_version;

    cluster
        .apply_manifest(&test_pod("shop", "member"))
        .expect("pod");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "shop");
    let member = pods.get("member").await.expect("pod");
    assert!(
        container_names(&member).len() >= 2,
        "pod in a member namespace is injected: {:?}",
        container_names(&member)
    );

    let connected = |want: &'static str| {
        let cluster = &cluster;
        async move {
            wait_for(
                &format!("blue-v1 status.connectedProxies {want}"),
                DEADLINE,
                || async {
                    let n = cluster
                        .kubectl(&[
                            "get",
                            "meshcontrolplane",
                            "blue-v1",
                            "-o",
                            "jsonpath={.status.connectedProxies}",
                        ])
                        .map_err(|e| e.to_string())?;
                    if n.trim() == want {
                        Ok(Some(()))
                    } else {
                        Err(format!("connectedProxies {n:?}"))
                    }
                },
            )
            .await
            .expect("connected proxies")
        }
    };
    if cluster.network().is_some() {
        cluster
            .wait_for_ready_pods("shop", "app=member", 1, DEADLINE)
            .await
            .expect("member ready");
        connected("1").await;
    }

    cluster
        .kubectl(&["label", "namespace", "shop", "meshplane.io/rev-"])
        .expect("leave");
    // Issue 16 item 3: the stream of the proxy in shop, which left the tenant, is closed (its
    // reconnects are refused), so blue's instance counts no proxy.
    if cluster.network().is_some() {
        connected("0").await;
    }
    wait_for(
        "every meshplane object gone from shop",
        DEADLINE,
        || async {
            let cms = config_maps
                .list(&ListParams::default().labels(MANAGED))
                .await
                .map_err(|e| e.to_string())?;
            let rbs = bindings
                .list(&ListParams::default().labels(MANAGED))
                .await
                .map_err(|e| e.to_string())?;
            (cms.items.is_empty() && rbs.items.is_empty())
                .then_some(())
                .map(Some)
                .ok_or(format!(
                    "{} ConfigMaps, {} RoleBindings left",
                    cms.items.len(),
                    rbs.items.len()
                ))
        },
    )
    .await
    .expect("left");
    let mine_after = config_maps
        .get("mine")
        .await
        .expect("mine is still there")
        .metadata
        .resource_version;
    assert_eq!(mine_before, mine_after, "the user's ConfigMap is untouched");
    assert!(
        pods.get_opt("member").await.expect("get").is_some(),
        "running pods are not deleted on leave"
    );

    cluster
        .apply_manifest(&test_pod("shop", "outsider"))
        .expect("pod after leaving");
    let outsider = pods.get("outsider").await.expect("pod");
    assert_eq!(
        container_names(&outsider),
        ["app"],
        "no injection after leaving"
    );
    eprintln!("scenario join-leave took {:?}", started.elapsed());
}
