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

    // Issue 16 item 3: a members ConfigMap the operator cannot overwrite (someone replaced it
    // with one of their own, which the operator leaves alone) leaves the instance serving the
    // members it last read; the control plane says so (MembersStale, one Warning Event), and
    // says it no more once the ConfigMap is the operator's again.
    members_stale_is_reported_and_recovers(&cluster).await;
    if cluster.network().is_some() {
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

/// `MembersStale` of blue-v1 (status, reason, message) as `kubectl get` shows it.
fn members_stale(cluster: &Cluster) -> Result<(String, String, String), String> {
    let out = cluster
        .kubectl(&[
            "get",
            "meshcontrolplane",
            "blue-v1",
            "-o",
            r#"jsonpath={range .status.conditions[?(@.type=="MembersStale")]}{.status}|{.reason}|{.message}{end}"#,
        ])
        .map_err(|e| e.to_string())?;
    let mut parts = out.trim().splitn(3, '|').map(str::to_string);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(s), Some(r), Some(m)) => Ok((s, r, m)),
        _ => Err(format!("no MembersStale condition yet: {out:?}")),
    }
}

async fn members_stale_is_reported_and_recovers(cluster: &Cluster) {
    let control = names::control_namespace("blue");
    let name = names::members_configmap("blue-v1");
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), &control);
    // One replace: the operator's labels, owner and `members` go at once, so at no moment is
    // the object both the operator's and broken (it would rewrite it).
    let mut cm = api.get(&name).await.expect("members ConfigMap");
    cm.metadata.labels = None;
    cm.metadata.owner_references = None;
    cm.metadata.managed_fields = None;
    cm.data = Some([("note".to_string(), "not the operator's".to_string())].into());
    api.replace(&name, &Default::default(), &cm)
        .await
        .expect("replace the members ConfigMap");
    let (_, reason, message) = wait_for("blue-v1 MembersStale=True", DEADLINE, || async {
        match members_stale(cluster)? {
            c if c.0 == "True" => Ok(Some(c)),
            c => Err(format!("MembersStale {c:?}")),
        }
    })
    .await
    .expect("MembersStale True");
    assert_eq!(reason, "LastKnownMembers");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &control);
    let instances = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=meshplane-xds"))
        .await
        .expect("instance pods");
    assert!(
        instances
            .items
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .any(|pod| message.contains(pod)),
        "the message names the instance pod: {message}"
    );
    assert!(message.contains("unreadable"), "{message}");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(cluster.client());
    let warned = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("MembersStale"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("blue-v1"))
        .count();
    assert_eq!(warned, 1, "one Warning Event as MembersStale turns True");

    // Deleting the foreign ConfigMap lets the operator write its own again.
    cluster
        .kubectl(&["-n", &control, "delete", "configmap", &name])
        .expect("delete the foreign ConfigMap");
    wait_for("blue-v1 MembersStale=False", DEADLINE, || async {
        match members_stale(cluster)? {
            c if c.0 == "False" => Ok(Some(())),
            c => Err(format!("MembersStale {c:?}")),
        }
    })
    .await
    .expect("MembersStale False");
}
