//! Join and leave: labelling a namespace brings blue's bootstrap ConfigMap, the instance's
//! RoleBinding and sidecar injection; removing the label removes them all and nothing else.
//! Each join, leave and rejection is one Event on blue-v1 and one on the namespace, as
//! `kubectl get events` and `kubectl describe` show them, never repeated by the reconciles
//! that follow.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::ListParams;
use kube::Api;
use meshplane_crds::names;
use meshplane_e2e::harness::{container_names, test_pod, wait_for, Cluster, ToldEvent};

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
    let joined = "namespace shop joined revision blue-v1 of tenant blue";
    wait_for("the NamespaceJoined Event of shop", DEADLINE, || async {
        let told = cluster
            .events_about("MeshControlPlane", "blue-v1")
            .map_err(|e| e.to_string())?;
        Ok(told
            .iter()
            .any(|e| e.reason == "NamespaceJoined" && e.message == joined)
            .then_some(()))
    })
    .await
    .expect("NamespaceJoined");
    let described = cluster
        .kubectl(&["describe", "meshcontrolplane", "blue-v1"])
        .expect("describe blue-v1");
    assert!(
        described
            .lines()
            .any(|l| l.contains("NamespaceJoined") && l.contains(joined)),
        "kubectl describe lists the Event: {described}"
    );
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

    // A members ConfigMap the operator cannot overwrite (someone replaced it
    // with one of their own, which the operator leaves alone) leaves the instance serving the
    // members it last read; the control plane says so (MembersStale, one Warning Event), and
    // says it no more once the ConfigMap is the operator's again.
    members_stale_is_reported_and_recovers(&cluster).await;
    if cluster.network().is_some() {
        connected("1").await;
    }

    // A member namespace whose admin took the instance's read access away (replaced its
    // reader RoleBinding with one of their own, which the operator leaves alone) does not keep
    // a restarted instance unready: it serves shop's proxy without that namespace, and the
    // control plane names what it cannot read (WatchesRefused, one Warning Event) until
    // access returns.
    watches_refused_is_reported_and_recovers(&cluster).await;
    if cluster.network().is_some() {
        connected("1").await;
    }

    cluster
        .kubectl(&["label", "namespace", "shop", "meshplane.io/rev-"])
        .expect("leave");
    // The stream of the proxy in shop, which left the tenant, is closed (its
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

    // A namespace of team green labelled for blue is rejected (blue's selector refuses it).
    cluster
        .kubectl(&["create", "namespace", "intruder"])
        .expect("intruder");
    cluster
        .kubectl(&[
            "label",
            "namespace",
            "intruder",
            "team=green",
            "meshplane.io/rev=blue-stable",
        ])
        .expect("intruder labelled");
    wait_for(
        "the NamespaceRejected Event of intruder",
        DEADLINE,
        || async {
            let told = cluster
                .events_about("MeshControlPlane", "blue-v1")
                .map_err(|e| e.to_string())?;
            Ok(told
                .iter()
                .any(|e| e.reason == "NamespaceRejected" && e.message.contains("intruder"))
                .then_some(()))
        },
    )
    .await
    .expect("NamespaceRejected");
    every_membership_change_is_one_event(&cluster).await;
    eprintln!("scenario join-leave took {:?}", started.elapsed());
}

/// shop and bank joined and left, intruder was rejected: each change is one Event on blue-v1
/// and one on the namespace, each occurring once, although blue-v1 was reconciled many times
/// since (the members ConfigMap replaced and restored, bank's access taken and given back,
/// status changes).
async fn every_membership_change_is_one_event(cluster: &Cluster) {
    let once = |kind: &str, name: &str, reason: &str, message: &str| {
        let told = cluster.events_about(kind, name).expect("events");
        let matching: Vec<&ToldEvent> = told
            .iter()
            .filter(|e| e.reason == reason && e.message.contains(message))
            .collect();
        assert!(
            matching.len() == 1 && matching[0].count == 1,
            "one {reason} Event on {kind} {name} saying {message:?}, occurring once: {told:?}"
        );
    };
    for ns in ["shop", "bank"] {
        for (reason, verb) in [("NamespaceJoined", "joined"), ("NamespaceLeft", "left")] {
            once(
                "MeshControlPlane",
                "blue-v1",
                reason,
                &format!("namespace {ns} {verb} revision blue-v1 of tenant blue"),
            );
            once(
                "Namespace",
                ns,
                reason,
                &format!("{verb} revision blue-v1 of tenant blue"),
            );
        }
    }
    once(
        "MeshControlPlane",
        "blue-v1",
        "NamespaceRejected",
        "rejected namespace intruder (OutsideSelector)",
    );
    once("Namespace", "intruder", "OutsideSelector", "intruder");
}

/// `MembersStale` of blue-v1 (status, reason, message) as `kubectl get` shows it.
fn members_stale(cluster: &Cluster) -> Result<(String, String, String), String> {
    blue_condition(cluster, "MembersStale")
}

/// Condition `type_` of blue-v1 (status, reason, message) as `kubectl get` shows it.
fn blue_condition(cluster: &Cluster, type_: &str) -> Result<(String, String, String), String> {
    let out = cluster
        .kubectl(&[
            "get",
            "meshcontrolplane",
            "blue-v1",
            "-o",
            &format!(
                r#"jsonpath={{range .status.conditions[?(@.type=="{type_}")]}}{{.status}}|{{.reason}}|{{.message}}{{end}}"#
            ),
        ])
        .map_err(|e| e.to_string())?;
    let mut parts = out.trim().splitn(3, '|').map(str::to_string);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(s), Some(r), Some(m)) => Ok((s, r, m)),
        _ => Err(format!("no {type_} condition yet: {out:?}")),
    }
}

/// Warning Events with `reason` about blue-v1.
async fn blue_warnings(cluster: &Cluster, reason: &str) -> usize {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(cluster.client());
    events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("blue-v1"))
        .count()
}

/// bank joins blue; its admin replaces the instance's reader RoleBinding with their own (the
/// instance's ServiceAccount no longer a subject); blue's instance restarts. It becomes ready
/// without bank, `WatchesRefused` names what it cannot read in bank, one Warning Event says so,
/// and deleting the admin's binding (the operator puts its own back) clears it.
async fn watches_refused_is_reported_and_recovers(cluster: &Cluster) {
    let reader = names::member_reader("blue-v1");
    cluster
        .kubectl(&["create", "namespace", "bank"])
        .expect("bank");
    cluster
        .kubectl(&["label", "namespace", "bank", "meshplane.io/rev=blue-stable"])
        .expect("bank joins");
    let bindings: Api<RoleBinding> = Api::namespaced(cluster.client(), "bank");
    let mut binding = wait_for("the reader RoleBinding in bank", DEADLINE, || async {
        match bindings.get_opt(&reader).await.map_err(|e| e.to_string())? {
            Some(b) => Ok(Some(b)),
            None => Err("no reader RoleBinding in bank yet".to_string()),
        }
    })
    .await
    .expect("bank joined");
    wait_for("blue-v1 WatchesRefused=False", DEADLINE, || async {
        match blue_condition(cluster, "WatchesRefused")? {
            c if c.0 == "False" => Ok(Some(())),
            c => Err(format!("WatchesRefused {c:?}")),
        }
    })
    .await
    .expect("every watch lists before");
    let warned_before = blue_warnings(cluster, "WatchesRefused").await;
    let control = names::control_namespace("blue");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &control);
    let instance_pods = ListParams::default().labels("app.kubernetes.io/name=meshplane-xds");
    let before: Vec<String> = pods
        .list(&instance_pods)
        .await
        .expect("instance pods")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();

    // One replace: the operator's labels and owner and the instance as subject go at once.
    binding.metadata.labels = None;
    binding.metadata.owner_references = None;
    binding.metadata.managed_fields = None;
    binding.subjects = Some(vec![k8s_openapi::api::rbac::v1::Subject {
        kind: "ServiceAccount".into(),
        name: "default".into(),
        namespace: Some("bank".into()),
        ..Default::default()
    }]);
    bindings
        .replace(&reader, &Default::default(), &binding)
        .await
        .expect("replace the reader RoleBinding");
    cluster
        .kubectl(&[
            "-n",
            &control,
            "rollout",
            "restart",
            "deployment/meshplane-blue-v1",
        ])
        .expect("restart blue's instance");
    // The restarted instance becomes ready although bank cannot be read: the rollout ends
    // with one ready pod, a new one.
    let restarted = wait_for("one ready instance pod, a new one", DEADLINE, || async {
        let now = pods
            .list(&instance_pods)
            .await
            .map_err(|e| e.to_string())?
            .items;
        match now.as_slice() {
            [pod] if meshplane_e2e::harness::pod_is_ready(pod) => {
                let name = pod.metadata.name.clone().unwrap_or_default();
                match before.contains(&name) {
                    true => Err(format!("{name} is the pod from before the restart")),
                    false => Ok(Some(name)),
                }
            }
            pods => Err(format!(
                "{} instance pods, {} ready",
                pods.len(),
                pods.iter()
                    .filter(|p| meshplane_e2e::harness::pod_is_ready(p))
                    .count()
            )),
        }
    })
    .await
    .expect("the restarted instance is ready");

    let (_, reason, message) = wait_for("blue-v1 WatchesRefused=True", DEADLINE, || async {
        match blue_condition(cluster, "WatchesRefused")? {
            c if c.0 == "True" => Ok(Some(c)),
            c => Err(format!("WatchesRefused {c:?}")),
        }
    })
    .await
    .expect("WatchesRefused True");
    assert_eq!(reason, "ReadAccessRefused");
    assert!(
        message.contains(&format!("{restarted} cannot read ")),
        "the message names the instance pod: {message}"
    );
    assert!(message.contains("bank/Service"), "{message}");
    assert!(message.contains("serve without"), "{message}");
    assert!(!message.contains("shop/"), "shop is readable: {message}");
    cluster
        .wait_for_mcp_ready("blue-v1", DEADLINE)
        .await
        .expect("blue-v1 Ready with bank unreadable");
    assert_eq!(
        blue_warnings(cluster, "WatchesRefused").await,
        warned_before + 1,
        "one Warning Event as WatchesRefused turns True"
    );

    // Access returns: without the admin's binding the operator writes its own again, and the
    // instance's watches of bank list (it retries them) without a restart.
    bindings
        .delete(&reader, &Default::default())
        .await
        .expect("delete the admin's RoleBinding");
    wait_for("blue-v1 WatchesRefused=False", DEADLINE, || async {
        match blue_condition(cluster, "WatchesRefused")? {
            c if c.0 == "False" => Ok(Some(())),
            c => Err(format!("WatchesRefused {c:?}")),
        }
    })
    .await
    .expect("WatchesRefused False");
    cluster
        .kubectl(&["label", "namespace", "bank", "meshplane.io/rev-"])
        .expect("bank leaves");
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
    assert_eq!(
        blue_warnings(cluster, "MembersStale").await,
        1,
        "one Warning Event as MembersStale turns True"
    );

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
