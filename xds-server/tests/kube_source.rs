//! The Kubernetes source against the e2e API stand-in (a test fixture serving the real API
//! semantics kube-runtime relies on): Strict mode follows the members ConfigMap, watches only
//! member namespaces, says `Ready` after its initial listings, and the proxy count is
//! server-side-applied under the pod's own manager.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::Api;
use meshplane_contracts::proxies::{MembersStale, ProxyCounts, RefusedWatches};
use meshplane_crds::{names, MeshControlPlane};
use meshplane_kube_standin::{Identity, StandIn, StandInOptions};
use meshplane_xds::model::{Object, SourceEvent};
use meshplane_xds::source_kube::{self, KubeSourceConfig};
use tokio::sync::{mpsc, watch};

const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<SourceEvent>>>);

impl Seen {
    fn has(&self, f: impl Fn(&SourceEvent) -> bool) -> bool {
        self.0.lock().expect("lock").iter().any(f)
    }
    /// Position of the first event matching `f`.
    fn position(&self, f: impl Fn(&SourceEvent) -> bool) -> Option<usize> {
        self.0.lock().expect("lock").iter().position(f)
    }
}

/// Runs blue-v1's Kubernetes source (`shared`: Shared isolation) against the stand-in and
/// records every event it sends.
fn start_source(
    client: &kube::Client,
    shared: bool,
) -> (Seen, Arc<meshplane_xds::metrics::Metrics>) {
    let (seen, metrics, _) = start_source_reporting(client, shared);
    (seen, metrics)
}

/// [`start_source`], with the refused-watches mark the source publishes.
fn start_source_reporting(
    client: &kube::Client,
    shared: bool,
) -> (
    Seen,
    Arc<meshplane_xds::metrics::Metrics>,
    watch::Receiver<Option<RefusedWatches>>,
) {
    let (refused_tx, refused_rx) = watch::channel(None);
    let seen = Seen::default();
    let (tx, mut rx) = mpsc::channel(1024);
    let metrics = Arc::new(meshplane_xds::metrics::Metrics::new());
    let config = KubeSourceConfig {
        tenant: "blue".into(),
        control_namespace: "meshplane-blue".into(),
        revision: "blue-v1".into(),
        shared,
        metrics: Arc::clone(&metrics),
        members_stale: watch::channel(None).0,
        refused_watches: refused_tx,
        status_scope: watch::channel(None).0,
    };
    tokio::spawn(source_kube::run(client.clone(), config, tx));
    let recorder = seen.clone();
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            recorder.0.lock().expect("lock").push(e);
        }
    });
    (seen, metrics, refused_rx)
}

fn service_upsert<'a>(ns: &'a str, name: &'a str) -> impl Fn(&SourceEvent) -> bool + 'a {
    move |e| match e {
        SourceEvent::Upsert(Object::Service(s)) => {
            s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name)
        }
        _ => false,
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !check() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_follows_members_and_reports_proxy_count() {
    let standin = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let client = standin.client(&Identity::Admin).await.expect("client");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in meshplane_crds::crdgen::all() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in ["meshplane-blue", "shop", "bank"] {
        namespaces
            .create(
                &PostParams::default(),
                &from_json(serde_json::json!({"metadata": {"name": ns}})),
            )
            .await
            .expect("namespace");
    }
    for (ns, name) in [("shop", "web"), ("bank", "api")] {
        let svc: Service = from_json(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"ports": [{"name": "http", "port": 80}]},
        }));
        Api::<Service>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &svc)
            .await
            .expect("service");
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "meshplane-blue");
    let members = |list: &str| -> ConfigMap {
        from_json(serde_json::json!({
            "metadata": {"name": "meshplane-blue-v1-members", "namespace": "meshplane-blue"},
            "data": {"members": list, "attached": list, "tags": ""},
        }))
    };
    cms.create(&PostParams::default(), &members("shop\n"))
        .await
        .expect("members");

    let (seen, _metrics) = start_source(&client, false);

    eventually("the source is synced", || {
        seen.has(|e| matches!(e, SourceEvent::Ready))
    })
    .await;
    let ready = seen.position(|e| matches!(e, SourceEvent::Ready));
    let shop_only = seen.position(
        |e| matches!(e, SourceEvent::Members(m) if *m == BTreeSet::from(["shop".to_string()])),
    );
    let web = seen.position(service_upsert("shop", "web"));
    assert!(
        shop_only < ready && web < ready && shop_only.is_some() && web.is_some(),
        "Ready comes after the members and the initial listing: {shop_only:?} {web:?} {ready:?}"
    );
    assert!(
        !seen.has(service_upsert("bank", "api")),
        "bank is not a member: not watched"
    );

    // bank joins: its objects arrive.
    let mut cm = cms.get("meshplane-blue-v1-members").await.expect("get");
    cm.data = members("bank\nshop\n").data;
    cms.replace("meshplane-blue-v1-members", &PostParams::default(), &cm)
        .await
        .expect("update");
    eventually("bank's service arrives", || {
        seen.has(service_upsert("bank", "api"))
    })
    .await;

    // A deletion in a member namespace is delivered.
    Api::<Service>::namespaced(client.clone(), "shop")
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the deletion arrives", || {
        seen.has(|e| matches!(e, SourceEvent::Delete(k) if k.name == "web" && k.namespace.as_deref() == Some("shop")))
    })
    .await;

    // Proxy count, contract 3.
    let (count_tx, count_rx) = watch::channel(3usize);
    let (_stop, stop_rx) = watch::channel(false);
    let (stale_tx, stale_rx) = watch::channel(None);
    let (refused_tx, refused_rx) = watch::channel(None);
    tokio::spawn(meshplane_xds::report::proxy_count::run(
        client.clone(),
        "meshplane-blue".into(),
        "blue-v1".into(),
        "xds-0".into(),
        count_rx,
        meshplane_xds::report::proxy_count::Marks {
            members_stale: stale_rx,
            refused_watches: refused_rx,
        },
        stop_rx,
    ));
    let read = |cms: Api<ConfigMap>| async move {
        cms.get_opt("meshplane-blue-v1-proxies")
            .await
            .ok()
            .flatten()
            .and_then(|c| c.data)
            .and_then(|d| d.get("xds-0").cloned())
    };
    let end = Instant::now() + DEADLINE;
    while read(cms.clone()).await.as_deref() != Some("3") {
        assert!(Instant::now() < end, "proxy count 3 never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    count_tx.send_replace(5);
    while read(cms.clone()).await.as_deref() != Some("5") {
        assert!(Instant::now() < end, "proxy count 5 never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cm = cms.get("meshplane-blue-v1-proxies").await.expect("get");
    let managers: Vec<String> = cm
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.contains(&"meshplane-xds/xds-0".to_string()),
        "{managers:?}"
    );

    // While its members are stale the pod applies its mark next to its
    // count, and applying without it removes it (the pod's manager owned it alone).
    let mark = MembersStale {
        since: "2026-12-02T03:40:00Z".into(),
        reason: "the members ConfigMap was deleted".into(),
    };
    stale_tx.send_replace(Some(mark.clone()));
    let proxies_cm = |want: &'static str| {
        move |cm: Option<&ConfigMap>| {
            let data = cm.and_then(|c| c.data.clone()).unwrap_or_default();
            let counts = ProxyCounts::from_data(&data).expect("contract 3");
            match want {
                "stale" => counts.members_stale.contains_key("xds-0"),
                "refused" => counts.refused_watches.contains_key("xds-0"),
                _ => {
                    counts.members_stale.is_empty()
                        && counts.refused_watches.is_empty()
                        && counts.by_pod.get("xds-0") == Some(&5)
                }
            }
        }
    };
    let stale_cm = tokio::time::timeout(
        DEADLINE,
        await_condition(
            cms.clone(),
            "meshplane-blue-v1-proxies",
            proxies_cm("stale"),
        ),
    )
    .await
    .expect("the mark is applied")
    .expect("watch")
    .and_then(|c| c.data)
    .unwrap_or_default();
    assert_eq!(
        ProxyCounts::from_data(&stale_cm).map(|c| c.members_stale.get("xds-0").cloned()),
        Ok(Some(mark))
    );
    stale_tx.send_replace(None);
    tokio::time::timeout(
        DEADLINE,
        await_condition(
            cms.clone(),
            "meshplane-blue-v1-proxies",
            proxies_cm("fresh"),
        ),
    )
    .await
    .expect("the mark is removed, the count stays")
    .expect("watch");

    // The same for the watches the API server refuses: named next to the count while
    // refused, removed once they list.
    let refused = RefusedWatches::of([(Some("bank"), "Service")]);
    refused_tx.send_replace(refused.clone());
    let refused_cm = tokio::time::timeout(
        DEADLINE,
        await_condition(
            cms.clone(),
            "meshplane-blue-v1-proxies",
            proxies_cm("refused"),
        ),
    )
    .await
    .expect("the refused-watches mark is applied")
    .expect("watch")
    .and_then(|c| c.data)
    .unwrap_or_default();
    assert_eq!(
        ProxyCounts::from_data(&refused_cm).map(|c| c.refused_watches.get("xds-0").cloned()),
        Ok(refused)
    );
    refused_tx.send_replace(None);
    tokio::time::timeout(
        DEADLINE,
        await_condition(
            cms.clone(),
            "meshplane-blue-v1-proxies",
            proxies_cm("fresh"),
        ),
    )
    .await
    .expect("the refused-watches mark is removed, the count stays")
    .expect("watch");
}

/// Creates a namespace; returns its UID.
async fn create_namespace(client: &kube::Client, name: &str, labels: serde_json::Value) -> String {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({"metadata": {"name": name, "labels": labels}})),
        )
        .await
        .expect("namespace")
        .metadata
        .uid
        .expect("a uid")
}

async fn create_service(client: &kube::Client, ns: &str, name: &str) {
    let svc: Service = from_json(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }));
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("service");
}

/// In Shared isolation the instance may read every namespace, so the members
/// ConfigMap must not decide which: one that lists another tenant's namespace and
/// `kube-system` (as anyone who can edit it could) makes the instance read only the listed
/// namespace that the cluster's labels, control planes and tags make the tenant's; and a
/// namespace relabelled away stops being read though the ConfigMap still lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_mode_reads_only_listed_namespaces_that_membership_confirms() {
    let standin = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let client = standin.client(&Identity::Admin).await.expect("client");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in meshplane_crds::crdgen::all() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    let rev = names::REV_LABEL;
    let mut control_namespace_uids = std::collections::BTreeMap::new();
    for tenant in ["blue", "green"] {
        // Control namespaces as the operator creates them (membership checks they are its).
        let labels = serde_json::json!({
            names::MANAGED_BY_LABEL: names::MANAGED_BY_VALUE,
            names::TENANT_LABEL: tenant,
        });
        let uid = create_namespace(&client, &format!("meshplane-{tenant}"), labels).await;
        control_namespace_uids.insert(tenant, uid);
    }
    create_namespace(&client, "shop", serde_json::json!({rev: "blue-v1"})).await;
    create_namespace(&client, "bank", serde_json::json!({rev: "green-v1"})).await;
    for (ns, name) in [
        ("shop", "web"),
        ("bank", "ledger"),
        ("kube-system", "kube-dns"),
    ] {
        create_service(&client, ns, name).await;
    }
    let mcps: Api<MeshControlPlane> = Api::all(client.clone());
    for (name, tenant) in [("blue-v1", "blue"), ("green-v1", "green")] {
        let mcp: MeshControlPlane = from_json(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": name},
            "spec": {"tenant": tenant, "isolation": "Shared"},
        }));
        mcps.create(&PostParams::default(), &mcp)
            .await
            .expect("control plane");
        // The operator records the control namespace it created.
        let status = serde_json::json!({"status": {
            "controlNamespace": format!("meshplane-{tenant}"),
            "controlNamespaceUID": control_namespace_uids[tenant],
        }});
        mcps.patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .expect("control plane status");
    }
    // The members ConfigMap as a tenant admin with `edit` in the control namespace could write it.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "meshplane-blue");
    let listed = "bank\nkube-system\nshop\n";
    cms.create(
        &PostParams::default(),
        &from_json(serde_json::json!({
            "metadata": {"name": "meshplane-blue-v1-members", "namespace": "meshplane-blue"},
            "data": {"members": listed, "attached": listed, "tags": ""},
        })),
    )
    .await
    .expect("members");

    let (seen, metrics) = start_source(&client, true);
    eventually("the source is synced", || {
        seen.has(|e| matches!(e, SourceEvent::Ready))
    })
    .await;
    let members: Vec<BTreeSet<String>> = seen
        .0
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Members(m) => Some(m.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(members, [BTreeSet::from(["shop".to_string()])]);
    assert!(seen.has(service_upsert("shop", "web")));
    assert!(
        !seen.has(service_upsert("bank", "ledger"))
            && !seen.has(service_upsert("kube-system", "kube-dns")),
        "listed but not the tenant's: never read"
    );
    let text = metrics.encode().expect("metrics");
    assert!(
        text.lines()
            .any(|l| l.starts_with("meshplane_xds_members_unverified") && l.ends_with(" 2")),
        "{text}"
    );

    // shop moves to green: it stops being read although the ConfigMap still lists it.
    Api::<Namespace>::all(client.clone())
        .patch(
            "shop",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"labels": {rev: "green-v1"}}}),
            ),
        )
        .await
        .expect("relabel");
    eventually("shop leaves blue by its label", || {
        seen.has(|e| matches!(e, SourceEvent::Members(m) if m.is_empty()))
    })
    .await;
}

/// A member namespace's admin who deletes the instance's reader RoleBinding
/// (or never had it) used to keep the whole instance unready after a restart, its proxies in
/// every other namespace included. Now the refused watch does not hold readiness; the
/// namespace's objects arrive once access returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_member_namespace_does_not_keep_the_instance_unready() {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let standin = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let admin = standin.client(&Identity::Admin).await.expect("client");
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in meshplane_crds::crdgen::all() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    for ns in ["meshplane-blue", "shop", "bank"] {
        create_namespace(&admin, ns, serde_json::json!({})).await;
    }
    create_service(&admin, "shop", "web").await;
    create_service(&admin, "bank", "ledger").await;
    Api::<ConfigMap>::namespaced(admin.clone(), "meshplane-blue")
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": {"name": "meshplane-blue-v1-members", "namespace": "meshplane-blue"},
                "data": {"members": "bank\nshop\n", "attached": "bank\nshop\n", "tags": ""},
            })),
        )
        .await
        .expect("members");
    // The instance may read its control namespace and shop; bank's reader binding is gone.
    let grant = |ns: &'static str| {
        let admin = admin.clone();
        async move {
            let role: Role = from_json(serde_json::json!({
                "metadata": {"name": "meshplane-blue-v1-reader", "namespace": ns},
                "rules": [{
                    "apiGroups": ["", "discovery.k8s.io", "networking.meshplane.io", "security.meshplane.io", "telemetry.meshplane.io", "gateway.networking.k8s.io"],
                    "resources": ["*"],
                    "verbs": ["get", "list", "watch"],
                }],
            }));
            Api::<Role>::namespaced(admin.clone(), ns)
                .create(&PostParams::default(), &role)
                .await
                .expect("role");
            let binding: RoleBinding = from_json(serde_json::json!({
                "metadata": {"name": "meshplane-blue-v1-reader", "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                            "name": "meshplane-blue-v1-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "meshplane-blue-v1",
                              "namespace": "meshplane-blue"}],
            }));
            Api::<RoleBinding>::namespaced(admin, ns)
                .create(&PostParams::default(), &binding)
                .await
                .expect("binding");
        }
    };
    grant("meshplane-blue").await;
    grant("shop").await;
    let instance = standin
        .client(&Identity::ServiceAccount {
            namespace: "meshplane-blue".into(),
            name: "meshplane-blue-v1".into(),
        })
        .await
        .expect("instance client");

    let (seen, metrics, mark) = start_source_reporting(&instance, false);
    let refused = || {
        let text = metrics.encode().expect("metrics");
        text.lines()
            .find_map(|l| l.strip_prefix("meshplane_xds_refused_watches "))
            .and_then(|v| v.trim().parse::<i64>().ok())
            .expect("the refused watches gauge")
    };
    eventually("ready though bank cannot be listed", || {
        seen.has(|e| matches!(e, SourceEvent::Ready))
    })
    .await;
    assert!(seen.has(service_upsert("shop", "web")));
    assert!(!seen.has(service_upsert("bank", "ledger")));
    assert!(refused() > 0, "what is missing is reported");
    // ... and named, for the operator's `WatchesRefused` condition (contract 3): every kind
    // read per member namespace, in bank only.
    let named = mark.borrow().clone().expect("a refused-watches mark");
    assert_eq!(
        i64::try_from(named.listed.len() + named.more).ok(),
        Some(refused()),
        "{named:?}"
    );
    assert!(
        named.listed.iter().all(|w| w.starts_with("bank/")),
        "{named:?}"
    );
    assert!(
        named.listed.contains(&"bank/Service".to_string()),
        "{named:?}"
    );

    // Access returns: bank's objects follow without a restart.
    grant("bank").await;
    eventually("bank's Service arrives and nothing is refused", || {
        seen.has(service_upsert("bank", "ledger")) && refused() == 0 && mark.borrow().is_none()
    })
    .await;
}
