//! The controllers against the API stand-in share one watch per kind:
//! MeshControlPlanes, MeshRevisionTags and Namespaces feed both the control-plane and the tag
//! controller (and the membership caches) from a single watch each. The tag controller's
//! triggers on control planes and namespaces are exercised first, so the watches they use are
//! known to be open when they are counted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use kube::Client;
use meshplane_crds::{MeshControlPlane, MeshRevisionTag};
use meshplane_kube_standin::{Identity, StandIn, StandInOptions};
use meshplane_operator::controller::{self, Context, Settings};
use meshplane_operator::metrics::Metrics;
use serde::de::DeserializeOwned;

/// Upper bound for anything the test awaits; reached only when the behaviour is broken.
const DEADLINE: Duration = Duration::from_secs(60);

fn from_json<T: DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

async fn create<K>(api: &Api<K>, object: serde_json::Value)
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), &from_json(object))
        .await
        .expect("create");
}

/// Awaits the tag's status until `check` holds.
async fn tag_status(
    tags: &Api<MeshRevisionTag>,
    what: &str,
    check: impl Fn(&meshplane_crds::MeshRevisionTagStatus) -> bool,
) {
    let cond = move |tag: Option<&MeshRevisionTag>| {
        tag.and_then(|t| t.status.as_ref()).is_some_and(&check)
    };
    tokio::time::timeout(DEADLINE, await_condition(tags.clone(), "blue-stable", cond))
        .await
        .unwrap_or_else(|_| panic!("the tag's status never showed {what}"))
        .expect("watching the tag");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_both_controllers_follow_is_watched_once() {
    let standin = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let client: Client = standin.client(&Identity::Admin).await.expect("client");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in meshplane_crds::crdgen::all() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    let ctx = Arc::new(Context::new(
        client.clone(),
        Arc::new(Metrics::default()),
        Settings::default(),
        Arc::new(time::OffsetDateTime::now_utc),
    ));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = futures::FutureExt::shared(Box::pin(async move {
        let _ = stop_rx.await;
    }));
    let operator = tokio::spawn(controller::run(ctx, stop));

    let tags: Api<MeshRevisionTag> = Api::all(client.clone());
    create(
        &tags,
        serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshRevisionTag",
            "metadata": {"name": "blue-stable"},
            "spec": {"revision": "blue-v1"},
        }),
    )
    .await;
    tag_status(&tags, "an unresolved revision", |s| {
        s.revision.is_none() && !s.conditions.is_empty()
    })
    .await;
    // The tag controller learns of the control plane from the control-plane watch.
    create(
        &Api::<MeshControlPlane>::all(client.clone()),
        serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": "blue-v1"},
            "spec": {"tenant": "blue"},
        }),
    )
    .await;
    tag_status(&tags, "revision blue-v1", |s| {
        s.revision.as_deref() == Some("blue-v1")
    })
    .await;
    // ... and of the namespace that follows the tag from the namespace watch.
    create(
        &Api::<Namespace>::all(client.clone()),
        serde_json::json!({
            "metadata": {"name": "shop", "labels": {"meshplane.io/rev": "blue-stable"}},
        }),
    )
    .await;
    tag_status(&tags, "member shop", |s| {
        s.members.as_ref().is_some_and(|m| m.names == ["shop"])
    })
    .await;

    // The test's own watches of the tag close as their waits end: await the count, don't
    // sample it.
    let shared = [
        "meshcontrolplanes.meshplane.io",
        "meshrevisiontags.meshplane.io",
        "namespaces",
    ];
    let once = |open: &BTreeMap<String, usize>| {
        shared.iter().all(|r| open.get(*r) == Some(&1)) && open.values().all(|n| *n == 1)
    };
    let mut open = standin.watches_by_resource();
    let settled = matches!(
        tokio::time::timeout(Duration::from_secs(20), open.wait_for(once)).await,
        Ok(Ok(_))
    );
    let now = open.borrow().clone();
    assert!(
        settled,
        "each of {shared:?} (and every other kind) watched exactly once; open watches: {now:?}"
    );

    let _ = stop_tx.send(());
    tokio::time::timeout(DEADLINE, operator)
        .await
        .expect("the controllers stop")
        .expect("the controllers ran");
}
