//! What the Kubernetes source reads is validated again in the index (objects
//! admitted without the validating webhook); invalid objects are skipped and reported once per
//! generation, valid ones kept.

use serde_json::{json, Value};

use super::*;
use crate::config_events::{self, EventSink};
use crate::model::{Kind, Object};
use crate::testing::mk_proxy;

fn entry(name: &str, generation: i64, spec: Value) -> SourceEvent {
    SourceEvent::Upsert(Object::ServiceEntry(Box::new(
        serde_json::from_value(json!({
            "apiVersion": "networking.meshplane.io/v1alpha1",
            "kind": "ServiceEntry",
            "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                         "generation": generation},
            "spec": spec,
        }))
        .expect("entry"),
    )))
}

fn good_spec(host: &str) -> Value {
    json!({"hosts": [host], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
           "resolution": "DNS"})
}

/// A wildcard host with DNS resolution: the CRD schema admits it, the validation does not.
fn bad_spec(host: &str) -> Value {
    json!({"hosts": [host], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
           "resolution": "DNS"})
}

fn hosts(index: &TenantIndex) -> Vec<String> {
    index
        .registry()
        .services
        .iter()
        .filter(|s| s.namespace == "shop")
        .map(|s| s.hostname.clone())
        .collect()
}

fn index() -> (
    TenantIndex,
    std::sync::mpsc::Receiver<config_events::ConfigEvent>,
) {
    let (sink, rx) = EventSink::channel();
    let mut index = TenantIndex::new("blue", "blue-v1", "meshplane-blue", MeshConfig::default())
        .with_events(sink);
    index.apply(SourceEvent::Members(BTreeSet::from(["shop".to_string()])));
    (index, rx)
}

fn drain(
    rx: &mut std::sync::mpsc::Receiver<config_events::ConfigEvent>,
) -> Vec<(String, Option<i64>, &'static str, String)> {
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        out.push((
            ev.regarding.name,
            ev.regarding.generation,
            ev.reason,
            ev.note,
        ));
    }
    out
}

#[test]
fn invalid_objects_are_skipped_and_reported_and_valid_ones_kept() {
    let (mut index, mut rx) = index();
    let change = index.apply(entry("good", 1, good_spec("good.example.com")));
    assert_eq!(change.kind, ChangeKind::Config);
    let change = index.apply(entry("bad", 1, bad_spec("*.bad.example.com")));
    assert_eq!(
        change.kind,
        ChangeKind::None,
        "nothing of it reaches a proxy"
    );
    assert_eq!(hosts(&index), ["good.example.com"]);
    let reported = drain(&mut rx);
    assert_eq!(reported.len(), 1, "{reported:?}");
    let (name, generation, reason, note) = &reported[0];
    assert_eq!(
        (name.as_str(), *generation, *reason),
        ("bad", Some(1), "InvalidConfig")
    );
    assert!(
        note.contains("spec.hosts") && note.contains("wildcard hosts need resolution NONE"),
        "the note names the field and the rule: {note}"
    );

    // Seen again (a relist): skipped again, not reported again.
    index.apply(SourceEvent::Resync {
        namespace: Some("shop".into()),
        kinds: vec![Kind::ServiceEntry],
    });
    index.apply(entry("good", 1, good_spec("good.example.com")));
    index.apply(entry("bad", 1, bad_spec("*.bad.example.com")));
    index.apply(SourceEvent::Synced);
    assert_eq!(hosts(&index), ["good.example.com"]);
    assert!(drain(&mut rx).is_empty(), "one Event per generation");

    // Fixed: applied. Broken again (a new generation): the old version goes too, and the new
    // generation is reported.
    index.apply(entry("bad", 2, good_spec("fixed.example.com")));
    assert_eq!(hosts(&index), ["fixed.example.com", "good.example.com"]);
    let change = index.apply(entry("bad", 3, bad_spec("*.fixed.example.com")));
    assert_eq!(
        change.kind,
        ChangeKind::Config,
        "the previous version is withdrawn"
    );
    assert_eq!(hosts(&index), ["good.example.com"]);
    let reported = drain(&mut rx);
    assert_eq!(
        reported
            .iter()
            .map(|r| (r.0.as_str(), r.1))
            .collect::<Vec<_>>(),
        [("bad", Some(3))]
    );
}

#[test]
fn config_of_another_revision_is_skipped_and_not_reported() {
    let (mut index, mut rx) = index();
    // Another revision's config (revision-scoped by label): not this instance's to report.
    let SourceEvent::Upsert(Object::ServiceEntry(mut se)) =
        entry("canary", 1, bad_spec("*.canary.example.com"))
    else {
        unreachable!()
    };
    se.metadata.labels = Some([("meshplane.io/rev".to_string(), "blue-v2".to_string())].into());
    index.apply(SourceEvent::Upsert(Object::ServiceEntry(se)));
    index.apply(entry("mine", 1, bad_spec("*.mine.example.com")));
    assert!(hosts(&index).is_empty());
    let reported: Vec<String> = drain(&mut rx).into_iter().map(|r| r.0).collect();
    assert_eq!(
        reported,
        ["mine"],
        "only this revision's config is reported"
    );
}

fn envoy_filter(name: &str, generation: i64, patches: Value) -> SourceEvent {
    SourceEvent::Upsert(Object::EnvoyFilter(Box::new(
        serde_json::from_value(json!({
            "apiVersion": "networking.meshplane.io/v1alpha1",
            "kind": "EnvoyFilter",
            "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                         "generation": generation},
            "spec": {"configPatches": patches},
        }))
        .expect("envoy filter"),
    )))
}

fn proxy(pod: &str) -> ProxyNode {
    ProxyNode {
        id: format!("sidecar~198.18.1.1~{pod}.shop~shop.svc.cluster.local"),
        pod_name: Some(pod.into()),
        ip: None,
        ..mk_proxy("shop", &[])
    }
}

/// A MERGE the validation and the default policy admit, whose value Envoy's Cluster cannot
/// take (a duration that is not one).
fn unmergeable(timeout: &str) -> Value {
    json!([{"applyTo": "CLUSTER",
            "match": {"context": "SIDECAR_OUTBOUND", "cluster": {"service": "good.example.com"}},
            "patch": {"operation": "MERGE", "value": {"connect_timeout": timeout}}}])
}

/// A patch that cannot apply is reported on its EnvoyFilter, once per
/// generation of the filter, however many proxies it fails for.
#[test]
fn envoy_filter_patches_that_cannot_apply_are_reported_once_per_generation() {
    let (mut index, mut rx) = index();
    index.apply(entry("good", 1, good_spec("good.example.com")));
    index.apply(envoy_filter("slow", 1, unmergeable("soon")));
    assert!(drain(&mut rx).is_empty(), "valid and allowed: nothing yet");
    index.render(&proxy("a"));
    let reported = drain(&mut rx);
    assert_eq!(reported.len(), 1, "{reported:?}");
    let (name, generation, reason, note) = &reported[0];
    assert_eq!(
        (name.as_str(), *generation, *reason),
        ("slow", Some(1), "EnvoyFilterPatchNotApplied")
    );
    assert!(
        note.starts_with("spec.configPatches[0]: ") && note.contains("connect_timeout"),
        "the note names the patch and why: {note}"
    );
    // Other proxies, other renders (a config change empties the cache): no second Event.
    index.apply(entry("other", 1, good_spec("other.example.com")));
    index.render(&proxy("a"));
    index.render(&proxy("b"));
    assert!(drain(&mut rx).is_empty());
    // A new generation (the spec changed) is judged anew.
    index.apply(envoy_filter("slow", 2, unmergeable("later")));
    index.render(&proxy("a"));
    let reported: Vec<Option<i64>> = drain(&mut rx).into_iter().map(|r| r.1).collect();
    assert_eq!(reported, [Some(2)]);
}

/// An EnvoyFilter beyond the tenant's EnvoyFilter policy (admitted before the policy narrowed,
/// or while the webhook was down) is not applied and reported once per generation.
#[test]
fn envoy_filters_beyond_the_policy_are_reported_once_per_generation() {
    let (mut index, mut rx) = index();
    let lua = json!([{"applyTo": "HTTP_FILTER",
        "match": {"context": "SIDECAR_INBOUND"},
        "patch": {"operation": "INSERT_FIRST", "value": {"name": "envoy.filters.http.lua",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                             "default_source_code": {"inline_string": "-- x"}}}}}]);
    index.apply(envoy_filter("lua", 1, lua));
    assert!(index.registry().envoy_filters.is_empty(), "not applied");
    index.apply(entry("good", 1, good_spec("good.example.com")));
    let reported = drain(&mut rx);
    assert_eq!(reported.len(), 1, "one Event across rebuilds: {reported:?}");
    let (name, _, reason, note) = &reported[0];
    assert_eq!((name.as_str(), *reason), ("lua", "EnvoyFilterBeyondPolicy"));
    assert!(note.contains("allowLua"), "{note}");
}
