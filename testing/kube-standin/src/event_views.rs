//! One store of Events served through two views, as the real API server does: core/v1
//! `events` and `events.k8s.io/v1` `events` are the same objects (Kubernetes keeps them as
//! the core type and converts). An Event written through either view is read, listed,
//! watched, patched and deleted through both, with the same name, uid and
//! `resourceVersion`; so `kubectl get events` and `kubectl describe` (core/v1, looked up
//! with `involvedObject.*` field selectors) show what a controller writes with
//! `events.k8s.io/v1`.
//!
//! Objects are stored in the core/v1 shape; the `events.k8s.io/v1` view converts field by
//! field as Kubernetes' conversion does (`pkg/apis/events/v1`): `note` ↔ `message`,
//! `regarding` ↔ `involvedObject`, `reportingController` ↔ `reportingComponent`,
//! `deprecatedSource` ↔ `source`, `deprecatedFirstTimestamp` ↔ `firstTimestamp`,
//! `deprecatedLastTimestamp` ↔ `lastTimestamp`, `deprecatedCount` ↔ `count`; `eventTime`,
//! `series`, `action`, `reason`, `related`, `reportingInstance`, `type` and `metadata` are
//! shared. The server's Table for either view is the core Event printer's (Last Seen, Type,
//! Reason, Object, Message; wide: Subobject, Source, First Seen, Count, Name).

use serde_json::{json, Map, Value};

use super::object;
use super::resources::{PrinterColumn, ResourceKey, ResourceType};

/// The group of the `events.k8s.io` view.
pub const EVENTS_GROUP: &str = "events.k8s.io";

/// core/v1 field ↔ events.k8s.io/v1 field, for the fields that are renamed.
const RENAMED: [(&str, &str); 7] = [
    ("message", "note"),
    ("involvedObject", "regarding"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// Fields both versions carry under one name (besides `metadata`).
const SHARED: [&str; 7] = [
    "eventTime",
    "series",
    "action",
    "reason",
    "related",
    "reportingInstance",
    "type",
];

/// Whether `rt` is one of the two views of Events.
pub fn is_event(rt: &ResourceType) -> bool {
    rt.plural == "events" && (rt.group.is_empty() || rt.group == EVENTS_GROUP)
}

/// Whether `rt` is the `events.k8s.io` view.
pub fn is_events_view(rt: &ResourceType) -> bool {
    rt.plural == "events" && rt.group == EVENTS_GROUP
}

/// Where objects of `group`/`plural` are stored: both views of Events in the core one.
pub fn storage_key(group: &str, plural: &str) -> ResourceKey {
    let group = if plural == "events" && group == EVENTS_GROUP {
        ""
    } else {
        group
    };
    ResourceKey {
        group: group.to_string(),
        plural: plural.to_string(),
    }
}

/// Moves the fields of `obj` named in `pairs` (`from` → `to`) and the shared ones into a
/// new object; others are dropped, as a conversion drops fields its target does not have.
fn convert(obj: &Value, pairs: impl Iterator<Item = (&'static str, &'static str)>) -> Value {
    let Some(from) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    for key in ["apiVersion", "kind", "metadata"] {
        if let Some(v) = from.get(key) {
            out.insert(key.to_string(), v.clone());
        }
    }
    for (src, dst) in pairs.chain(SHARED.iter().map(|f| (*f, *f))) {
        if let Some(v) = from.get(src) {
            out.insert(dst.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// An object written through `rt`'s view, in the shape it is stored in.
pub fn to_storage(rt: &ResourceType, obj: Value) -> Value {
    if !is_events_view(rt) {
        return obj;
    }
    let mut core = convert(&obj, RENAMED.iter().map(|(core, v1)| (*v1, *core)));
    if let Some(m) = core.as_object_mut() {
        m.insert("apiVersion".into(), json!("v1"));
        m.insert("kind".into(), json!("Event"));
    }
    core
}

/// A stored object as `rt`'s view shows it.
pub fn to_view(rt: &ResourceType, obj: Value) -> Value {
    if !is_events_view(rt) {
        return obj;
    }
    convert(&obj, RENAMED.iter().copied())
}

/// The fields a `fieldSelector` may name on the `events.k8s.io` view (besides
/// `metadata.name` and `metadata.namespace`), evaluated on the view's own shape.
pub const EVENTS_VIEW_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

fn column(name: &str, priority: i64, format: &str, description: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: if name == "Count" { "integer" } else { "string" }.into(),
        format: format.into(),
        description: description.into(),
        priority,
        json_path: String::new(),
    }
}

/// The columns of the Event printer, as the API server's Table has them.
pub fn columns() -> Vec<PrinterColumn> {
    vec![
        column("Last Seen", 0, "", "The time at which the most recent occurrence of this event was recorded."),
        column("Type", 0, "", "Type of this event (Normal, Warning), new types could be added in the future"),
        column("Reason", 0, "", "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
        column("Object", 0, "", "The object that this event is about."),
        column("Subobject", 1, "", "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement."),
        column("Source", 1, "", "The component reporting this event. Should be a short machine understandable string."),
        column("Message", 0, "", "A human-readable description of the status of this operation."),
        column("First Seen", 1, "", "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)"),
        column("Count", 1, "", "The number of times this event has occurred."),
        column("Name", 1, "name", "Name must be unique within a namespace."),
    ]
}

fn text<'a>(obj: &'a Value, path: &str) -> &'a str {
    object::get_path(obj, path)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn since(timestamp: &str) -> String {
    if timestamp.is_empty() {
        "<unknown>".into()
    } else {
        object::human_age(timestamp)
    }
}

/// The cells of one Event (of `rt`'s view) in [`columns`] order, as the core printer makes
/// them: times fall back from `lastTimestamp` to `firstTimestamp` to `eventTime`, a series
/// gives the last time and the count, a singleton counts 1.
pub fn cells(rt: &ResourceType, obj: &Value) -> Vec<Value> {
    let core = match is_events_view(rt) {
        true => to_storage(rt, obj.clone()),
        false => obj.clone(),
    };
    let mut first = since(text(&core, "firstTimestamp"));
    if text(&core, "firstTimestamp").is_empty() {
        first = since(text(&core, "eventTime"));
    }
    let mut last = match text(&core, "lastTimestamp") {
        "" => first.clone(),
        t => since(t),
    };
    let mut count = core.get("count").and_then(Value::as_i64).unwrap_or(0);
    if core.get("series").is_some_and(|s| !s.is_null()) {
        last = since(text(&core, "series.lastObservedTime"));
        count = object::get_path(&core, "series.count")
            .and_then(Value::as_i64)
            .unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let kind = text(&core, "involvedObject.kind").to_lowercase();
    let target = match text(&core, "involvedObject.name") {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let source = match text(&core, "source.component") {
        "" => text(&core, "reportingComponent").to_string(),
        component => match text(&core, "source.host") {
            "" => component.to_string(),
            host => format!("{component}, {host}"),
        },
    };
    vec![
        json!(last),
        json!(text(&core, "type")),
        json!(text(&core, "reason")),
        json!(target),
        json!(text(&core, "involvedObject.fieldPath")),
        json!(source),
        json!(text(&core, "message").trim()),
        json!(first),
        json!(count),
        json!(text(&core, "metadata.name")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin_types;

    fn mk_type(group: &str) -> ResourceType {
        builtin_types()
            .into_iter()
            .find(|t| t.plural == "events" && t.group == group)
            .expect("a built-in Event type")
    }

    /// An Event as kube-runtime's recorder writes it.
    fn mk_v1_event() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "blue-v1.18", "namespace": "default", "uid": "u1", "resourceVersion": "7"},
            "action": "Reconcile", "reason": "NamespaceJoined",
            "note": "namespace shop joined revision blue-v1 of tenant blue",
            "type": "Normal", "eventTime": "2026-12-07T17:00:00.000001Z",
            "regarding": {"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane", "name": "blue-v1", "uid": "cp-uid"},
            "reportingController": "meshplane-operator", "reportingInstance": "meshplane-operator-0",
            "series": {"count": 2, "lastObservedTime": "2026-12-07T17:01:00.000001Z"},
            "deprecatedCount": 3,
            "deprecatedSource": {"component": "old"},
        })
    }

    #[test]
    fn both_views_share_one_storage_key() {
        let core = mk_type("");
        let v1 = mk_type(EVENTS_GROUP);
        assert_eq!(core.key(), v1.key());
        assert_eq!(v1.key(), storage_key("", "events"));
        assert!(is_event(&core) && is_event(&v1) && is_events_view(&v1) && !is_events_view(&core));
        assert_ne!(
            storage_key("apps", "deployments"),
            storage_key("", "deployments")
        );
    }

    #[test]
    fn an_events_v1_event_reads_as_the_core_event_kubernetes_converts_it_to() {
        let v1 = mk_type(EVENTS_GROUP);
        let core = to_storage(&v1, mk_v1_event());
        assert_eq!(
            core,
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "blue-v1.18", "namespace": "default", "uid": "u1", "resourceVersion": "7"},
                "action": "Reconcile", "reason": "NamespaceJoined",
                "message": "namespace shop joined revision blue-v1 of tenant blue",
                "type": "Normal", "eventTime": "2026-12-07T17:00:00.000001Z",
                "involvedObject": {"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane", "name": "blue-v1", "uid": "cp-uid"},
                "reportingComponent": "meshplane-operator", "reportingInstance": "meshplane-operator-0",
                "series": {"count": 2, "lastObservedTime": "2026-12-07T17:01:00.000001Z"},
                "count": 3,
                "source": {"component": "old"},
            })
        );
        // And back: nothing is lost either way (apiVersion is the presenter's to set).
        let mut back = to_view(&v1, core);
        back["apiVersion"] = json!("events.k8s.io/v1");
        assert_eq!(back, mk_v1_event());
    }

    #[test]
    fn other_kinds_pass_unchanged() {
        let core = mk_type("");
        let obj = json!({"apiVersion": "v1", "kind": "Event", "message": "m", "count": 1});
        assert_eq!(to_storage(&core, obj.clone()), obj);
        assert_eq!(to_view(&core, obj.clone()), obj);
    }

    #[test]
    fn the_table_is_the_core_event_printers() {
        let v1 = mk_type(EVENTS_GROUP);
        let core = mk_type("");
        let event = mk_v1_event();
        let from_v1 = cells(&v1, &event);
        let from_core = cells(&core, &to_storage(&v1, event));
        assert_eq!(from_v1, from_core, "one printer for both views");
        assert_eq!(from_v1.len(), columns().len());
        assert_eq!(from_v1[1], json!("Normal"));
        assert_eq!(from_v1[2], json!("NamespaceJoined"));
        assert_eq!(from_v1[3], json!("meshcontrolplane/blue-v1"));
        assert_eq!(from_v1[5], json!("old"), "source.component first");
        assert_eq!(
            from_v1[6],
            json!("namespace shop joined revision blue-v1 of tenant blue")
        );
        assert_eq!(from_v1[8], json!(2), "a series counts its occurrences");
        assert_eq!(from_v1[9], json!("blue-v1.18"));
        // A singleton without source counts 1 and names its reporting controller.
        let mut single = mk_v1_event();
        let m = single.as_object_mut().expect("an object");
        m.remove("series");
        m.remove("deprecatedCount");
        m.remove("deprecatedSource");
        let c = cells(&v1, &single);
        assert_eq!(c[8], json!(1));
        assert_eq!(c[5], json!("meshplane-operator"));
        assert_ne!(
            c[0],
            json!("<unknown>"),
            "last seen falls back to eventTime"
        );
    }
}
