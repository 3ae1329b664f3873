//! Cost of one write into the Kubernetes API stand-in's store when it already holds ~10,000
//! objects with owner references (the shape of the S5 benchmark: namespaces full of ConfigMaps
//! and Roles owned by a per-namespace owner).
//!
//! `cargo bench -p meshplane-kube-standin --bench standin_store`

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use meshplane_kube_standin::resources::ResourceType;
use meshplane_kube_standin::store::{DeleteRequest, Propagation, Store, WriteCtx};
use serde_json::{json, Value};

const NAMESPACES: usize = 100;
const DEPENDENTS_PER_NAMESPACE: usize = 99;

struct Fixture {
    store: Arc<Store>,
    configmaps: ResourceType,
    /// The owner ConfigMap's uid in namespace `ns-0`.
    owner_uid: String,
}

fn ctx() -> WriteCtx {
    WriteCtx {
        manager: "bench".into(),
        subresource: None,
        dry_run: false,
        record_update: true,
    }
}

fn resource(store: &Store, group: &str, version: &str, plural: &str) -> ResourceType {
    match store.find_type(group, version, plural) {
        Some(rt) => rt,
        None => panic!("the stand-in has no {plural} type"),
    }
}

fn created(store: &Store, rt: &ResourceType, obj: Value) -> Value {
    match store.create(rt, obj, &ctx()) {
        Ok(v) => v,
        Err(e) => panic!("create failed: {e:?}"),
    }
}

fn owner_ref(uid: &str) -> Value {
    json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid,
            "controller": true, "blockOwnerDeletion": true}])
}

fn fixture() -> Fixture {
    let store = Store::new(10_000);
    let namespaces = resource(&store, "", "v1", "namespaces");
    let configmaps = resource(&store, "", "v1", "configmaps");
    let roles = resource(&store, "rbac.authorization.k8s.io", "v1", "roles");
    let started = Instant::now();
    let mut owner_uid = String::new();
    for n in 0..NAMESPACES {
        let ns = format!("ns-{n}");
        created(&store, &namespaces, json!({"metadata": {"name": ns}}));
        let owner = created(
            &store,
            &configmaps,
            json!({"metadata": {"name": "owner", "namespace": ns}, "data": {"k": "v"}}),
        );
        let uid = owner["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for d in 0..DEPENDENTS_PER_NAMESPACE {
            let meta = json!({"name": format!("dep-{d}"), "namespace": ns,
                              "labels": {"app": "bench", "n": d.to_string()},
                              "ownerReferences": owner_ref(&uid)});
            if d % 2 == 0 {
                created(
                    &store,
                    &configmaps,
                    json!({"metadata": meta, "data": {"k": "v"}}),
                );
            } else {
                created(
                    &store,
                    &roles,
                    json!({"metadata": meta, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
                );
            }
        }
        if n == 0 {
            owner_uid = uid;
        }
    }
    let objects = NAMESPACES * (2 + DEPENDENTS_PER_NAMESPACE);
    eprintln!(
        "filling the store with {objects} objects took {:.2?} ({:.1?} per create)",
        started.elapsed(),
        started.elapsed() / objects as u32
    );
    Fixture {
        store,
        configmaps,
        owner_uid,
    }
}

fn writes(c: &mut Criterion) {
    let f = fixture();
    let mut group = c.benchmark_group("store_with_10k_objects");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(5));

    let mut i = 0u64;
    group.bench_function("update_owned_configmap", |b| {
        b.iter(|| {
            i += 1;
            let mut obj = match f.store.get(&f.configmaps, "ns-0", "dep-0") {
                Ok(o) => o,
                Err(e) => panic!("get failed: {e:?}"),
            };
            let rv = obj["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            obj["data"]["k"] = json!(i.to_string());
            match f.store.update(&f.configmaps, &rv, obj, &ctx()) {
                Ok(v) => black_box(v),
                Err(e) => panic!("update failed: {e:?}"),
            }
        })
    });

    let mut j = 0u64;
    group.bench_function("create_then_delete_owned_configmap", |b| {
        b.iter(|| {
            j += 1;
            let name = format!("extra-{j}");
            created(
                &f.store,
                &f.configmaps,
                json!({"metadata": {"name": name, "namespace": "ns-0",
                                    "ownerReferences": owner_ref(&f.owner_uid)}}),
            );
            let req = DeleteRequest {
                namespace: "ns-0",
                name: &name,
                policy: Propagation::Background,
                precondition_rv: None,
                precondition_uid: None,
                dry_run: false,
            };
            match f.store.delete(&f.configmaps, &req) {
                Ok(v) => black_box(v),
                Err(e) => panic!("delete failed: {e:?}"),
            }
        })
    });
    group.finish();
}

criterion_group!(benches, writes);
criterion_main!(benches);
