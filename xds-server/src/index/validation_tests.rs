//! Issue 16 item 4: what the Kubernetes source reads is validated again in the index (objects
//! admitted without the validating webhook); invalid objects are skipped and reported once per
//! generation, valid ones kept.

use serde_json::{json, Value};

use super::*;
use crate::config_events::{self, EventSink};

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
    tokio::sync::mpsc::Receiver<config_events::ConfigEvent>,
) {
    let (sink, rx) = EventSink::channel();
    let mut index = TenantIndex::new("blue", "blue-v1", "meshplane-blue", MeshConfig::default())
        .with_events(sink);
    index.apply(SourceEvent::Members(BTreeSet::from(["shop".to_string()])));
    (index, rx)
}

fn drain(
    rx: &mut tokio::sync::mpsc::Receiver<config_events::ConfigEvent>,
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
