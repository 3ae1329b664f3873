//! Conformance of the API stand-in (test fixture) against kube's client and kube-runtime: the
//! semantics the operator and xds-server rely on.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    PropagationPolicy, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use meshplane_kube_standin::{
    Identity, StandIn, StandInHandle, StandInOptions, KUBERNETES_SERVICE_IP,
};
use serde_json::{json, Value};

/// Upper bound for anything a test awaits; reached only when the behaviour is broken.
const DEADLINE: Duration = Duration::from_secs(20);

async fn start() -> (StandInHandle, Client) {
    let handle = StandIn::start(StandInOptions::default()).await.unwrap();
    let client = handle.client(&Identity::Admin).await.unwrap();
    (handle, client)
}

fn cm(name: &str, extra: Value) -> ConfigMap {
    let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

fn api_code<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn rv(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// Awaits until `get` reports NotFound.
async fn await_gone(api: &Api<ConfigMap>, name: &str) {
    tokio::time::timeout(DEADLINE, async {
        while api.get_opt(name).await.unwrap().is_some() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} was not deleted"));
}

#[tokio::test]
async fn crud_keeps_versions_uids_and_rejects_stale_updates() {
    let (_h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = api
        .create(
            &PostParams::default(),
            &cm("a", json!({"data": {"k": "1"}})),
        )
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    let (code, reason) = api_code(
        api.create(&PostParams::default(), &cm("a", json!({})))
            .await,
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

    let mut changed = created.clone();
    changed.data = Some([("k".to_string(), "2".to_string())].into());
    let updated = api
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert!(rv(&updated) > rv(&created));
    assert_eq!(updated.metadata.uid, created.metadata.uid);
    assert_eq!(updated.metadata.generation, Some(2));
    // Writing from the old version loses the race.
    let (code, reason) = api_code(api.replace("a", &PostParams::default(), &changed).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));

    // A label change is metadata: no new generation.
    let labelled = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(2));
    // A no-op write does not bump the version.
    let same = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "2"}})),
        )
        .await
        .unwrap();
    assert_eq!(rv(&same), rv(&labelled));
    let json_patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([{"op": "add", "path": "/data/j", "value": "3"}]))
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(json_patched.data.unwrap()["j"], "3");

    let (code, _) = api_code(api.get("missing").await);
    assert_eq!(code, 404);
    let (code, _) = api_code(
        api.create(&PostParams::default(), &{
            let mut c = cm("b", json!({}));
            c.metadata.namespace = Some("nope".into());
            c
        })
        .await,
    );
    assert_eq!(code, 400, "namespace in body differs from the path");
    let nowhere: Api<ConfigMap> = Api::namespaced(client, "nope");
    let (code, _) = api_code(
        nowhere
            .create(&PostParams::default(), &cm("b", json!({})))
            .await,
    );
    assert_eq!(code, 404, "the namespace does not exist");
}

async fn install_crds(client: &Client) -> Api<DynamicObject> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/crd");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let crd: Value = serde_saphyr::from_str(&text).unwrap();
        if crd["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let crd: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(
            &name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
    }
    let gvk = GroupVersionKind::gvk("meshplane.io", "v1alpha1", "MeshControlPlane");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "meshcontrolplanes");
    Api::all_with(client.clone(), &ar)
}

fn green() -> Value {
    json!({"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
           "metadata": {"name": "green"}, "spec": {"tenant": "green", "version": "0.1.0"}})
}

#[tokio::test]
async fn crds_register_kinds_with_a_status_subresource() {
    let (_h, client) = start().await;
    let mcps = install_crds(&client).await;
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    let (ar, caps) = discovery
        .resolve_gvk(&GroupVersionKind::gvk(
            "meshplane.io",
            "v1alpha1",
            "MeshControlPlane",
        ))
        .expect("the CRD's kind is discoverable");
    assert_eq!(ar.plural, "meshcontrolplanes");
    assert_eq!(caps.scope, kube::discovery::Scope::Cluster);

    let obj: DynamicObject = serde_json::from_value(green()).unwrap();
    let created = mcps.create(&PostParams::default(), &obj).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    // Status writes go through /status and leave spec and generation alone.
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ok", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
                        "spec": {"tenant": "ignored"}});
    let after = mcps
        .patch_status("green", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    assert_eq!(after.data["status"]["conditions"][0]["status"], "True");
    assert_eq!(after.data["spec"]["tenant"], "green");
    assert_eq!(after.metadata.generation, Some(1));
    // Main-resource writes ignore status and bump generation on spec changes.
    let spec = json!({"spec": {"replicas": 3}, "status": {"conditions": []}});
    let after = mcps
        .patch("green", &PatchParams::default(), &Patch::Merge(spec))
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, Some(2));
    assert_eq!(after.data["status"]["conditions"][0]["type"], "Ready");

    // Deleting the CRD removes its objects and its kind.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("meshcontrolplanes.meshplane.io", &DeleteParams::default())
        .await
        .unwrap();
    let (code, _) = api_code(mcps.list(&ListParams::default()).await);
    assert_eq!(code, 404);
}

#[tokio::test]
async fn server_side_apply_tracks_owners_conflicts_and_removals() {
    let (_h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let apply = |data: Value| {
        Patch::Apply(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": data}),
        )
    };
    api.patch(
        "ssa",
        &PatchParams::apply("alpha"),
        &apply(json!({"a": "1", "shared": "s"})),
    )
    .await
    .unwrap();
    // Same value: shared ownership, no conflict.
    api.patch(
        "ssa",
        &PatchParams::apply("beta"),
        &apply(json!({"shared": "s", "b": "2"})),
    )
    .await
    .unwrap();
    // Different value on a field alpha owns: conflict naming alpha.
    let err = api
        .patch(
            "ssa",
            &PatchParams::apply("beta"),
            &apply(json!({"a": "x"})),
        )
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message.contains("conflict with \"alpha\""),
                "{}",
                s.message
            );
            assert!(s.message.contains(".data.a"), "{}", s.message);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    // Forced, beta takes `a`; beta's config no longer lists `b`, so `b` goes.
    let forced = api
        .patch(
            "ssa",
            &PatchParams::apply("beta").force(),
            &apply(json!({"a": "x", "shared": "s"})),
        )
        .await
        .unwrap();
    let data = forced.data.clone().unwrap();
    assert_eq!(data["a"], "x");
    assert!(!data.contains_key("b"));
    let managers: BTreeSet<String> = forced
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(
        managers,
        BTreeSet::from(["alpha".to_string(), "beta".to_string()])
    );
    // alpha drops everything: `shared` stays (beta owns it), `a` stays (beta owns it now).
    let after = api
        .patch("ssa", &PatchParams::apply("alpha"), &apply(json!({})))
        .await
        .unwrap();
    let data = after.data.unwrap();
    assert_eq!(
        data.keys().cloned().collect::<Vec<_>>(),
        vec!["a", "shared"]
    );
    // Applying the same configuration again writes nothing.
    let again = api
        .patch(
            "ssa",
            &PatchParams::apply("beta"),
            &apply(json!({"a": "x", "shared": "s"})),
        )
        .await
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        after.metadata.resource_version
    );
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (_h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(
        &PostParams::default(),
        &cm("held", json!({"metadata": {"finalizers": ["test/hold"]}})),
    )
    .await
    .unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let held = api.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    await_gone(&api, "held").await;
}

fn owned_by(name: &str, owner: &ConfigMap, block: bool) -> ConfigMap {
    cm(
        name,
        json!({"metadata": {"ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name, "uid": owner.metadata.uid,
        "blockOwnerDeletion": block}]}}),
    )
}

#[tokio::test]
async fn owner_references_are_garbage_collected_per_propagation_policy() {
    let (_h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let pp = PostParams::default();

    // Background: the dependent goes with the owner.
    let owner = api.create(&pp, &cm("owner-bg", json!({}))).await.unwrap();
    api.create(&pp, &owned_by("dep-bg", &owner, false))
        .await
        .unwrap();
    api.delete("owner-bg", &DeleteParams::background())
        .await
        .unwrap();
    await_gone(&api, "dep-bg").await;

    // Foreground: the owner waits for a blocking dependent held by a finalizer.
    let owner = api.create(&pp, &cm("owner-fg", json!({}))).await.unwrap();
    let mut dep = owned_by("dep-fg", &owner, true);
    dep.metadata.finalizers = Some(vec!["test/hold".into()]);
    api.create(&pp, &dep).await.unwrap();
    api.delete("owner-fg", &DeleteParams::foreground())
        .await
        .unwrap();
    let waiting = api.get("owner-fg").await.unwrap();
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert_eq!(
        waiting.metadata.finalizers,
        Some(vec!["foregroundDeletion".to_string()])
    );
    assert!(api
        .get("dep-fg")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_some());
    api.patch(
        "dep-fg",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    await_gone(&api, "dep-fg").await;
    await_gone(&api, "owner-fg").await;

    // Orphan: the dependent stays, without the owner reference.
    let owner = api.create(&pp, &cm("owner-or", json!({}))).await.unwrap();
    api.create(&pp, &owned_by("dep-or", &owner, false))
        .await
        .unwrap();
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    api.delete("owner-or", &dp).await.unwrap();
    await_gone(&api, "owner-or").await;
    let orphan = api.get("dep-or").await.unwrap();
    assert!(orphan
        .metadata
        .owner_references
        .unwrap_or_default()
        .is_empty());
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_contents() {
    let (_h, client) = start().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "doomed");
    api.create(
        &PostParams::default(),
        &cm("held", json!({"metadata": {"finalizers": ["test/hold"]}})),
    )
    .await
    .unwrap();
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = namespaces.get("doomed").await.unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    let (code, _) = api_code(
        api.create(&PostParams::default(), &cm("new", json!({})))
            .await,
    );
    assert_eq!(code, 403, "no new content in a terminating namespace");
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    tokio::time::timeout(DEADLINE, async {
        while namespaces.get_opt("doomed").await.unwrap().is_some() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("namespace removed once empty");
}

#[tokio::test]
async fn lists_page_and_filter_by_label_and_field() {
    let (_h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..7 {
        let team = if i % 2 == 0 { "even" } else { "odd" };
        api.create(
            &PostParams::default(),
            &cm(
                &format!("c{i}"),
                json!({"metadata": {"labels": {"team": team}}}),
            ),
        )
        .await
        .unwrap();
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        names.extend(page.items.iter().map(|c| c.metadata.name.clone().unwrap()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = ListParams::default().limit(3).continue_token(&token),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, (0..7).map(|i| format!("c{i}")).collect::<Vec<_>>());

    let odd = api
        .list(&ListParams::default().labels("team=odd"))
        .await
        .unwrap();
    assert_eq!(odd.items.len(), 3);
    let notin = api
        .list(&ListParams::default().labels("team notin (odd)"))
        .await
        .unwrap();
    assert_eq!(notin.items.len(), 4);
    let one = api
        .list(&ListParams::default().fields("metadata.name=c4"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    let all: Api<ConfigMap> = Api::all(client);
    let in_default = all
        .list(&ListParams::default().fields("metadata.namespace=default"))
        .await
        .unwrap();
    assert_eq!(in_default.items.len(), 7);
    let (code, _) = api_code(api.list(&ListParams::default().fields("data.x=1")).await);
    assert_eq!(code, 400);
}

#[tokio::test]
async fn watches_resume_and_report_410_for_expired_versions() {
    let (h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let first = api
        .create(&PostParams::default(), &cm("w1", json!({})))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("w2", json!({})))
        .await
        .unwrap();
    // Resuming from w1's version replays w2 only.
    let mut stream = api
        .watch(
            &WatchParams::default().timeout(5),
            &first.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(DEADLINE, stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Added(c)) => assert_eq!(c.metadata.name.as_deref(), Some("w2")),
        other => panic!("expected ADDED w2, got {other:?}"),
    }
    drop(stream);
    h.expire_history();
    let mut stream = api
        .watch(
            &WatchParams::default(),
            &first.metadata.resource_version.unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(DEADLINE, stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

/// Open watch streams are counted per resource for as long as they run (what tests use to
/// check that a client watches each kind once).
#[tokio::test]
async fn open_watches_are_counted_per_resource_until_the_client_goes_away() {
    let (h, client) = start().await;
    let open = h.watches_by_resource();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let namespaces: Api<Namespace> = Api::all(client);
    let params = WatchParams::default();
    let first = config_maps.watch(&params, "0").await.unwrap().boxed();
    let second = config_maps.watch(&params, "0").await.unwrap().boxed();
    let third = namespaces.watch(&params, "0").await.unwrap().boxed();
    let expect = |counts: &[(&str, usize)]| {
        let want: BTreeMap<String, usize> =
            counts.iter().map(|(r, n)| (r.to_string(), *n)).collect();
        let mut open = open.clone();
        async move {
            tokio::time::timeout(DEADLINE, open.wait_for(|now| *now == want))
                .await
                .unwrap_or_else(|_| panic!("open watches never became {want:?}"))
                .unwrap();
        }
    };
    expect(&[("configmaps", 2), ("namespaces", 1)]).await;
    drop(first);
    expect(&[("configmaps", 1), ("namespaces", 1)]).await;
    drop((second, third));
    expect(&[]).await;
}

#[tokio::test]
async fn kube_runtime_watcher_resyncs_after_dropped_watches_and_410() {
    let (h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut seen = watcher(api.clone(), watcher::Config::default().any_semantic())
        .default_backoff()
        .applied_objects()
        .boxed();
    // Errors are part of the watcher's protocol (it relists after them); remember the codes.
    let mut error_codes = Vec::new();
    let mut await_name = async |name: &str| {
        tokio::time::timeout(DEADLINE, async {
            while let Some(item) = seen.next().await {
                match item {
                    Ok(c) if c.metadata.name.as_deref() == Some(name) => return,
                    Ok(_) => {}
                    Err(watcher::Error::WatchError(s)) => error_codes.push(s.code),
                    Err(e) => panic!("unexpected watcher error {e}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("watcher never saw {name}"));
    };
    api.create(&PostParams::default(), &cm("before", json!({})))
        .await
        .unwrap();
    await_name("before").await;
    h.drop_all_watches();
    api.create(&PostParams::default(), &cm("after-drop", json!({})))
        .await
        .unwrap();
    await_name("after-drop").await;
    h.expire_history();
    h.drop_all_watches();
    api.create(&PostParams::default(), &cm("after-410", json!({})))
        .await
        .unwrap();
    await_name("after-410").await;
    assert_eq!(
        error_codes,
        vec![410],
        "the resume after expiry was refused with 410 once"
    );
}

#[tokio::test]
async fn table_output_uses_printer_columns() {
    let (_h, client) = start().await;
    let mcps = install_crds(&client).await;
    let obj: DynamicObject = serde_json::from_value(green()).unwrap();
    mcps.create(&PostParams::default(), &obj).await.unwrap();
    let req = http::Request::get("/apis/meshplane.io/v1alpha1/meshcontrolplanes")
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: Value = client.request(req).await.unwrap();
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Name", "Tenant", "Revision", "Ready", "Members", "Proxies", "Age"]
    );
    assert_eq!(table["rows"][0]["cells"][0], "green");
    assert_eq!(table["rows"][0]["cells"][1], "green");
}

#[tokio::test]
async fn requests_without_a_valid_token_get_401() {
    let (h, _client) = start().await;
    let mut config = kube::Config::new(h.url().parse().unwrap());
    config.root_cert = Some(vec![rustls::pki_types::pem::PemObject::from_pem_slice(
        h.ca_pem().as_bytes(),
    )
    .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
    .unwrap()]);
    config.auth_info.token = Some("not-a-token".to_string().into());
    let client = Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let (code, _) = api_code(api.list(&ListParams::default()).await);
    assert_eq!(code, 401);
}

#[tokio::test]
async fn streaming_lists_end_initial_events_with_a_bookmark() {
    let (_h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("existing", json!({})))
        .await
        .unwrap();
    // kube-runtime's streaming list needs the marked BOOKMARK to finish its initial state.
    let mut events = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let initial = tokio::time::timeout(DEADLINE, async {
        let mut names = Vec::new();
        while let Some(event) = events.try_next().await.unwrap() {
            match event {
                watcher::Event::InitApply(c) => names.push(c.metadata.name.unwrap_or_default()),
                watcher::Event::InitDone => return names,
                _ => {}
            }
        }
        names
    })
    .await
    .expect("initial events end");
    assert_eq!(initial, vec!["existing".to_string()]);
    api.create(&PostParams::default(), &cm("later", json!({})))
        .await
        .unwrap();
    let next = tokio::time::timeout(DEADLINE, events.try_next())
        .await
        .unwrap()
        .unwrap();
    match next {
        Some(watcher::Event::Apply(c)) => assert_eq!(c.metadata.name.as_deref(), Some("later")),
        other => panic!("expected Apply(later), got {other:?}"),
    }
}

#[tokio::test]
async fn dry_run_writes_nothing_and_deletecollection_honours_selectors() {
    let (_h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let answered = api.create(&dry, &cm("dry", json!({}))).await.unwrap();
    assert_eq!(answered.metadata.name.as_deref(), Some("dry"));
    assert!(api.get_opt("dry").await.unwrap().is_none());

    for (name, team) in [("x1", "x"), ("x2", "x"), ("y1", "y")] {
        api.create(
            &PostParams::default(),
            &cm(name, json!({"metadata": {"labels": {"team": team}}})),
        )
        .await
        .unwrap();
    }
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("team=x"),
    )
    .await
    .unwrap();
    let left: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(left, vec!["y1".to_string()]);
}

#[tokio::test]
async fn services_get_cluster_ips_from_the_service_range_unless_headless() {
    let (_h, client) = start().await;
    let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client, "default");
    let svc = |name: &str, ip: Option<&str>| {
        let mut spec = json!({"ports": [{"name": "http", "port": 80}]});
        if let Some(ip) = ip {
            spec["clusterIP"] = json!(ip);
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    };
    let a = api
        .create(&PostParams::default(), &svc("a", None))
        .await
        .unwrap();
    let b = api
        .create(&PostParams::default(), &svc("b", None))
        .await
        .unwrap();
    let headless = api
        .create(&PostParams::default(), &svc("h", Some("None")))
        .await
        .unwrap();
    let ip = |s: &k8s_openapi::api::core::v1::Service| s.spec.clone().unwrap().cluster_ip.unwrap();
    assert!(ip(&a).starts_with("198.19."), "{}", ip(&a));
    assert_ne!(ip(&a), ip(&b));
    // The API server's own Service holds the first address of the range.
    let kubernetes = api.get("kubernetes").await.unwrap();
    assert_eq!(ip(&kubernetes), KUBERNETES_SERVICE_IP.to_string());
    assert_ne!(ip(&a), KUBERNETES_SERVICE_IP.to_string());
    assert_eq!(ip(&headless), "None");
    // The port's protocol and targetPort are defaulted as by the real API server.
    let port = &a.spec.unwrap().ports.unwrap()[0];
    assert_eq!(port.protocol.as_deref(), Some("TCP"));
    assert!(port.target_port.is_some());
}

/// `GET /standin/requests` over plain HTTP without a token, as a benchmark in another process
/// reads it.
async fn requests_over_http(h: &StandInHandle) -> meshplane_kube_standin::requests::RequestCounts {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(h.addr()).await.unwrap();
    conn.write_all(b"GET /standin/requests HTTP/1.0\r\nHost: standin\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(DEADLINE, conn.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    serde_json::from_str(body).unwrap()
}

#[tokio::test]
async fn request_counter_counts_writes_by_verb_and_not_reads() {
    let (h, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let before = h.requests();

    api.create(&PostParams::default(), &cm("counted", json!({})))
        .await
        .unwrap();
    api.patch(
        "counted",
        &PatchParams::apply("counter-test"),
        &Patch::Apply(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "counted"},
            "data": {"k": "1"},
        })),
    )
    .await
    .unwrap();
    let mut current = api.get("counted").await.unwrap();
    current.data = Some([("k".to_string(), "2".to_string())].into());
    api.replace("counted", &PostParams::default(), &current)
        .await
        .unwrap();
    // A rejected write is still a write request.
    let (code, _) = api_code(
        api.create(&PostParams::default(), &cm("counted", json!({})))
            .await,
    );
    assert_eq!(code, 409);
    api.delete("counted", &DeleteParams::default())
        .await
        .unwrap();

    let after_writes = h.requests();
    assert_eq!(after_writes.writes - before.writes, 5);
    assert_eq!(
        after_writes.verbs_since(&before),
        [
            ("create".to_string(), 2),
            ("delete".to_string(), 1),
            ("get".to_string(), 1),
            ("patch".to_string(), 1),
            ("update".to_string(), 1),
        ]
        .into()
    );
    let logged: Vec<(String, Option<String>, u16)> = after_writes
        .writes_after(&before)
        .into_iter()
        .map(|w| (w.verb.clone(), w.name.clone(), w.code))
        .collect();
    let counted = || Some("counted".to_string());
    assert_eq!(
        logged,
        [
            ("create".to_string(), counted(), 201),
            ("patch".to_string(), counted(), 200),
            ("update".to_string(), counted(), 200),
            ("create".to_string(), counted(), 409),
            ("delete".to_string(), counted(), 200),
        ]
    );
    assert!(after_writes
        .writes_after(&before)
        .iter()
        .all(|w| w.resource == "configmaps"
            && w.namespace.as_deref() == Some("default")
            && w.user == "admin"));

    // Reads (get, list, watch) are counted by verb but never as writes.
    api.list(&ListParams::default()).await.unwrap();
    assert!(api.get_opt("counted").await.unwrap().is_none());
    let watch = api
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap();
    drop(watch);
    let after_reads = h.requests();
    assert_eq!(after_reads.writes, after_writes.writes);
    assert_eq!(
        after_reads.verbs_since(&after_writes),
        [
            ("get".to_string(), 1),
            ("list".to_string(), 1),
            ("watch".to_string(), 1),
        ]
        .into()
    );
    assert_eq!(after_reads.reads(), after_writes.reads() + 3);

    // Another process reads the same counts over HTTP, without a token; reading them is not
    // a counted request.
    let served = requests_over_http(&h).await;
    assert_eq!(served, h.requests());
    assert_eq!(served.writes, after_reads.writes);
    assert_eq!(
        served.writes_by_resource_since(&before),
        [
            ("create configmaps".to_string(), 2),
            ("delete configmaps".to_string(), 1),
            ("patch configmaps".to_string(), 1),
            ("update configmaps".to_string(), 1),
        ]
        .into()
    );
}

/// Events are one store with two views: what a controller writes with `events.k8s.io/v1`
/// (kube-runtime's recorder: a create, then a merge patch of `series`) is the core/v1 Event
/// `kubectl get events` lists and `kubectl describe` finds by `involvedObject.*`, watched
/// and deleted through either view.
#[tokio::test]
async fn events_written_with_events_k8s_io_are_core_events_too() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    let (_h, client) = start().await;
    let v1: Api<Event> = Api::namespaced(client.clone(), "default");
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let mut core_watch = core
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "blue-v1.1", "namespace": "default"},
        "action": "Reconcile", "reason": "NamespaceJoined",
        "note": "namespace shop joined revision blue-v1 of tenant blue", "type": "Normal",
        "eventTime": "2026-12-07T17:00:00.000001Z",
        "regarding": {"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
                      "name": "blue-v1", "uid": "cp-uid"},
        "reportingController": "meshplane-operator", "reportingInstance": "meshplane-operator-0",
    }))
    .unwrap();
    let created = v1.create(&PostParams::default(), &event).await.unwrap();

    // The core view: same object, converted.
    let describe = ListParams::default().fields(
        "involvedObject.name=blue-v1,involvedObject.namespace=,involvedObject.kind=MeshControlPlane,involvedObject.uid=cp-uid",
    );
    let all: Api<CoreEvent> = Api::all(client.clone());
    let found = all.list(&describe).await.unwrap().items;
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert_eq!(e.metadata.uid, created.metadata.uid);
    assert_eq!(
        e.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(
        e.message.as_deref(),
        Some("namespace shop joined revision blue-v1 of tenant blue")
    );
    assert_eq!(e.involved_object.name.as_deref(), Some("blue-v1"));
    assert_eq!(e.reporting_component.as_deref(), Some("meshplane-operator"));
    assert_eq!(e.event_time, created.event_time);
    assert!(all
        .list(&ListParams::default().fields("involvedObject.name=blue-v2"))
        .await
        .unwrap()
        .items
        .is_empty());
    // The events.k8s.io view selects by its own field names, not the core ones.
    let by_regarding = Api::<Event>::all(client.clone())
        .list(
            &ListParams::default()
                .fields("regarding.name=blue-v1,reportingController=meshplane-operator"),
        )
        .await
        .unwrap()
        .items;
    assert_eq!(by_regarding.len(), 1);
    let (code, _) = api_code(
        Api::<Event>::all(client.clone())
            .list(&ListParams::default().fields("involvedObject.name=blue-v1"))
            .await,
    );
    assert_eq!(code, 400);

    // The recorder's repeat: a merge patch of `series` through events.k8s.io.
    v1.patch(
        "blue-v1.1",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"series": {"count": 2, "lastObservedTime": "2026-12-07T17:01:00.000001Z"}}),
        ),
    )
    .await
    .unwrap();
    let counted = core.get("blue-v1.1").await.unwrap();
    assert_eq!(counted.series.as_ref().and_then(|s| s.count), Some(2));
    assert_eq!(counted.message, e.message, "the rest is kept");

    // The core watch saw both writes.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(DEADLINE, core_watch.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Added(e)) => seen.push(("ADDED", e.message)),
            Some(WatchEvent::Modified(e)) => seen.push(("MODIFIED", e.message)),
            Some(WatchEvent::Bookmark(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen[0].0, "ADDED");
    assert_eq!(seen[1].0, "MODIFIED");
    assert_eq!(seen[1].1, e.message);

    // Written through core/v1, read through events.k8s.io; deleted through one, gone from both.
    let written: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "kubelet.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "Pulled", "message": "pulled", "type": "Normal",
        "source": {"component": "kubelet"}, "count": 3,
    }))
    .unwrap();
    core.create(&PostParams::default(), &written).await.unwrap();
    let read = v1.get("kubelet.1").await.unwrap();
    assert_eq!(read.note.as_deref(), Some("pulled"));
    assert_eq!(read.deprecated_count, Some(3));
    assert_eq!(
        read.deprecated_source.and_then(|s| s.component).as_deref(),
        Some("kubelet")
    );
    assert_eq!(read.regarding.and_then(|r| r.name).as_deref(), Some("web"));
    v1.delete("kubelet.1", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_code(core.get("kubelet.1").await).0, 404);
    assert_eq!(
        v1.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    assert_eq!(
        core.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
}
