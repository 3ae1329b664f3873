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
use kube::Api;
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

    let seen = Seen::default();
    let (tx, mut rx) = mpsc::channel(1024);
    let config = KubeSourceConfig {
        control_namespace: "meshplane-blue".into(),
        revision: "blue-v1".into(),
        shared: false,
        metrics: std::sync::Arc::new(meshplane_xds::metrics::Metrics::new()),
    };
    tokio::spawn(source_kube::run(client.clone(), config, tx));
    let recorder = seen.clone();
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            recorder.0.lock().expect("lock").push(e);
        }
    });

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
    tokio::spawn(source_kube::report_proxy_count(
        client.clone(),
        "meshplane-blue".into(),
        "blue-v1".into(),
        "xds-0".into(),
        count_rx,
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
}
