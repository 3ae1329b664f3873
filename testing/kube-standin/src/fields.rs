//! Field ownership for server-side apply: field paths, `managedFields` (FieldsV1) encoding,
//! conflicts, and the apply merge.
//!
//! Paths use the FieldsV1 element syntax: `f:<field>`, `k:<json key>` for an item of an
//! associative list, `v:<json value>` for an item of a set. Which lists are associative is
//! decided by a fixed rule (see [`list_kind`]), not by the OpenAPI schema; other lists are atomic.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::object;

/// One owned field, as FieldsV1 path elements.
pub type FieldPath = Vec<String>;
/// The fields one manager owns.
pub type FieldSet = BTreeSet<FieldPath>;

/// Which part of an object a write may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource of a kind with a `/status` subresource: everything but `status`.
    MainWithoutStatus,
    /// The main resource of a kind without a `/status` subresource.
    Whole,
    /// The `/status` subresource: only `status`.
    Status,
}

impl Scope {
    pub fn of(subresource: Option<&str>, has_status: bool) -> Self {
        match (subresource, has_status) {
            (Some("status"), _) => Scope::Status,
            (_, true) => Scope::MainWithoutStatus,
            (_, false) => Scope::Whole,
        }
    }

    fn includes(self, top_level_key: &str) -> bool {
        match self {
            Scope::Status => top_level_key == "status",
            Scope::MainWithoutStatus => top_level_key != "status",
            Scope::Whole => true,
        }
    }
}

/// Metadata fields that field managers own; the rest is system-managed.
const OWNED_METADATA: &[&str] = &["labels", "annotations", "finalizers", "ownerReferences"];

/// The part of `obj` that a write in `scope` owns: no `apiVersion`/`kind`, only user metadata.
pub fn scoped_view(obj: &Value, scope: Scope) -> Value {
    let mut view = Map::new();
    let Some(root) = obj.as_object() else {
        return Value::Object(view);
    };
    for (key, value) in root {
        if key == "apiVersion" || key == "kind" || !scope.includes(key) {
            continue;
        }
        if key == "metadata" {
            if scope == Scope::Status {
                continue;
            }
            let meta: Map<String, Value> = value
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| OWNED_METADATA.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default();
            if !meta.is_empty() {
                view.insert(key.clone(), Value::Object(meta));
            }
            continue;
        }
        view.insert(key.clone(), value.clone());
    }
    Value::Object(view)
}

/// How the items of a list are identified.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ListKind {
    Atomic,
    /// Items are objects identified by these key fields.
    Map(&'static [&'static str]),
    /// Items are scalars identified by their value.
    Set,
}

/// The rule standing in for the OpenAPI list markers of the built-in kinds: `finalizers` is a set,
/// `ownerReferences` is keyed by `uid`, `conditions` by `type`, other lists of objects that all
/// have a `name` by `name`; everything else is atomic.
fn list_kind(field: &str, items: &[Value]) -> ListKind {
    if items.is_empty() {
        return ListKind::Atomic;
    }
    let all_have = |key: &str| {
        items
            .iter()
            .all(|i| i.get(key).is_some_and(Value::is_string))
    };
    match field {
        "finalizers" if items.iter().all(Value::is_string) => ListKind::Set,
        "ownerReferences" if all_have("uid") => ListKind::Map(&["uid"]),
        "conditions" if all_have("type") => ListKind::Map(&["type"]),
        _ if all_have("name") => ListKind::Map(&["name"]),
        _ => ListKind::Atomic,
    }
}

fn item_key(item: &Value, keys: &[&str]) -> String {
    let key: Map<String, Value> = keys
        .iter()
        .filter_map(|k| Some((k.to_string(), item.get(*k)?.clone())))
        .collect();
    format!("k:{}", Value::Object(key))
}

fn collect_into(value: &Value, field: &str, path: &mut FieldPath, out: &mut FieldSet) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                path.push(format!("f:{k}"));
                collect_into(child, k, path, out);
                path.pop();
            }
        }
        Value::Array(items) => match list_kind(field, items) {
            ListKind::Map(keys) => {
                for item in items {
                    path.push(item_key(item, keys));
                    out.insert(path.clone());
                    collect_into(item, "", path, out);
                    path.pop();
                }
            }
            ListKind::Set => {
                for item in items {
                    path.push(format!("v:{item}"));
                    out.insert(path.clone());
                    path.pop();
                }
            }
            ListKind::Atomic => {
                out.insert(path.clone());
            }
        },
        _ => {
            out.insert(path.clone());
        }
    }
}

/// Every owned field path in an already scoped view.
pub fn collect(view: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    if let Some(map) = view.as_object() {
        for (k, child) in map {
            let mut path = vec![format!("f:{k}")];
            collect_into(child, k, &mut path, &mut out);
        }
    }
    out
}

fn is_item(element: &str) -> bool {
    element.starts_with("k:") || element.starts_with("v:")
}

fn find_item(items: &[Value], element: &str) -> Option<usize> {
    if let Some(key) = element.strip_prefix("k:") {
        let key: Map<String, Value> = serde_json::from_str(key).ok()?;
        items
            .iter()
            .position(|i| key.iter().all(|(k, v)| i.get(k) == Some(v)))
    } else if let Some(v) = element.strip_prefix("v:") {
        let v: Value = serde_json::from_str(v).ok()?;
        items.iter().position(|i| *i == v)
    } else if let Some(i) = element.strip_prefix("i:") {
        i.parse().ok().filter(|i: &usize| *i < items.len())
    } else {
        None
    }
}

fn child<'a>(value: &'a Value, element: &str) -> Option<&'a Value> {
    match value {
        Value::Object(m) => m.get(element.strip_prefix("f:")?),
        Value::Array(items) => items.get(find_item(items, element)?),
        _ => None,
    }
}

/// The value at `path`, if present.
pub fn value_at<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, el| child(v, el))
}

fn child_mut<'a>(value: &'a mut Value, element: &str) -> Option<&'a mut Value> {
    match value {
        Value::Object(m) => m.get_mut(element.strip_prefix("f:")?),
        Value::Array(items) => {
            let i = find_item(items, element)?;
            items.get_mut(i)
        }
        _ => None,
    }
}

/// Removes the field at `path`, then any parent map left empty.
fn remove_at(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let Some(parent) = parents
        .iter()
        .try_fold(&mut *value, |v, el| child_mut(v, el))
    else {
        return;
    };
    let removed = match parent {
        Value::Object(m) => last.strip_prefix("f:").and_then(|k| m.remove(k)).is_some(),
        Value::Array(items) => match find_item(items, last) {
            Some(i) => {
                items.remove(i);
                true
            }
            None => false,
        },
        _ => false,
    };
    let parent_empty = match parent {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    if removed && parent_empty && !parents.is_empty() {
        remove_at(value, parents);
    }
}

/// Encodes a field set as FieldsV1: a trie of path elements, `{}` leaves, `"."` marking
/// members that also have owned children.
pub fn encode(set: &FieldSet) -> Value {
    let mut root = Value::Object(Map::new());
    for path in set {
        let mut node = &mut root;
        for el in path {
            let Value::Object(map) = node else { break };
            node = map.entry(el.clone()).or_insert_with(|| json!({}));
        }
    }
    for path in set {
        if let Some(Value::Object(node)) = path.iter().try_fold(&mut root, |n, el| match n {
            Value::Object(m) => m.get_mut(el),
            _ => None,
        }) {
            if !node.is_empty() && !node.contains_key(".") {
                node.insert(".".into(), json!({}));
            }
        }
    }
    root
}

fn decode_into(node: &Map<String, Value>, path: &mut FieldPath, out: &mut FieldSet) {
    for (el, child) in node {
        if el == "." {
            out.insert(path.clone());
            continue;
        }
        path.push(el.clone());
        match child.as_object() {
            Some(m) if !m.is_empty() => decode_into(m, path, out),
            _ => {
                out.insert(path.clone());
            }
        }
        path.pop();
    }
}

/// Decodes FieldsV1.
pub fn decode(fields: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    if let Some(m) = fields.as_object() {
        decode_into(m, &mut Vec::new(), &mut out);
    }
    out
}

/// Renders a path the way the API server names fields in conflict messages.
pub fn render(path: &[String]) -> String {
    let mut s = String::new();
    for el in path {
        if let Some(f) = el.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = el.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = el.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        } else {
            s.push_str(&format!("[{el}]"));
        }
    }
    s
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone)]
pub struct ManagedEntry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

impl ManagedEntry {
    fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }
}

pub fn read_entries(obj: &Value) -> Vec<ManagedEntry> {
    let Some(entries) = object::metadata(obj)
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let s = |e: &Value, k: &str| {
        e.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    entries
        .iter()
        .map(|e| ManagedEntry {
            manager: s(e, "manager"),
            operation: s(e, "operation"),
            api_version: s(e, "apiVersion"),
            time: s(e, "time"),
            subresource: e
                .get("subresource")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
            fields: e.get("fieldsV1").map(decode).unwrap_or_default(),
        })
        .collect()
}

/// Drops ownership of fields the object no longer has and empty entries, then stores `entries`.
fn write_entries(obj: &mut Value, mut entries: Vec<ManagedEntry>) {
    let mut present = collect(&scoped_view(obj, Scope::Whole));
    // A map that became empty is still a field its manager set.
    present.extend(empty_maps(obj));
    for e in &mut entries {
        e.fields.retain(|p| present.contains(p));
    }
    entries.retain(|e| !e.fields.is_empty());
    let json: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": encode(&e.fields),
            });
            if let Some(sub) = &e.subresource {
                v["subresource"] = json!(sub);
            }
            v
        })
        .collect();
    let meta = object::metadata_mut(obj);
    if json.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(json));
    }
}

fn empty_maps(obj: &Value) -> FieldSet {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut FieldSet) {
        if let Value::Object(m) = v {
            for (k, c) in m {
                path.push(format!("f:{k}"));
                if c.as_object().is_some_and(Map::is_empty) {
                    out.insert(path.clone());
                }
                walk(c, path, out);
                path.pop();
            }
        }
    }
    let mut out = FieldSet::new();
    walk(&scoped_view(obj, Scope::Whole), &mut Vec::new(), &mut out);
    out
}

/// Records a non-apply write (create, update, patch): the fields it changed move to
/// `manager` (operation `Update`).
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    scope: Scope,
    subresource: Option<&str>,
    api_version: &str,
) {
    let empty = json!({});
    let old_view = scoped_view(old.unwrap_or(&empty), scope);
    let new_view = scoped_view(new, scope);
    let changed: FieldSet = collect(&new_view)
        .into_iter()
        .filter(|p| value_at(&old_view, p) != value_at(&new_view, p))
        .collect();
    let mut entries = old.map(read_entries).unwrap_or_default();
    for e in &mut entries {
        e.fields.retain(|p| !changed.contains(p));
    }
    if !changed.is_empty() {
        let at = match entries
            .iter()
            .position(|e| e.is(manager, "Update", subresource))
        {
            Some(i) => i,
            None => {
                entries.push(ManagedEntry {
                    manager: manager.into(),
                    operation: "Update".into(),
                    api_version: api_version.into(),
                    time: String::new(),
                    subresource: subresource.map(str::to_string),
                    fields: FieldSet::new(),
                });
                entries.len() - 1
            }
        };
        let entry = &mut entries[at];
        entry.fields.extend(changed);
        entry.time = object::now_rfc3339();
        entry.api_version = api_version.into();
    }
    write_entries(new, entries);
}

/// A field another manager owns with a different value.
#[derive(Debug, Clone)]
pub struct Conflict {
    pub manager: String,
    pub api_version: String,
    pub field: String,
}

/// Merges an applied configuration into `target`: maps recursively, associative lists by key,
/// sets by value, atomic lists and scalars replaced.
fn merge_apply(target: &mut Value, applied: &Value, field: &str) {
    match (target, applied) {
        (Value::Object(t), Value::Object(a)) => {
            for (k, v) in a {
                match t.get_mut(k) {
                    Some(existing) => merge_apply(existing, v, k),
                    None => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(t), Value::Array(a)) => match list_kind(field, a) {
            ListKind::Map(keys) => {
                for item in a {
                    let key = item_key(item, keys);
                    match find_item(t, &key) {
                        Some(i) => merge_apply(&mut t[i], item, ""),
                        None => t.push(item.clone()),
                    }
                }
            }
            ListKind::Set => {
                for item in a {
                    if !t.contains(item) {
                        t.push(item.clone());
                    }
                }
            }
            ListKind::Atomic => *t = a.clone(),
        },
        (t, a) => *t = a.clone(),
    }
}

/// Server-side apply of `applied` by `manager` onto `live` (None: the object is created).
/// Returns the new object, or the conflicts when `force` is false.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    scope: Scope,
    subresource: Option<&str>,
    api_version: &str,
) -> Result<Value, Vec<Conflict>> {
    let applied_view = scoped_view(applied, scope);
    let applied_set = collect(&applied_view);
    let mut obj = live.cloned().unwrap_or_else(|| json!({}));
    let live_view = scoped_view(&obj, scope);
    let mut entries = read_entries(&obj);
    let mine = |e: &ManagedEntry| e.is(manager, "Apply", subresource);

    let mut conflicting = FieldSet::new();
    let mut conflicts = Vec::new();
    for e in entries.iter().filter(|e| !mine(e)) {
        for p in e.fields.intersection(&applied_set) {
            let differs = !p.last().is_some_and(|el| is_item(el))
                && value_at(&live_view, p) != value_at(&applied_view, p);
            if differs {
                conflicting.insert(p.clone());
                conflicts.push(Conflict {
                    manager: e.manager.clone(),
                    api_version: e.api_version.clone(),
                    field: render(p),
                });
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for e in entries.iter_mut().filter(|e| !mine(e)) {
        e.fields.retain(|p| !conflicting.contains(p));
    }

    // Fields this manager applied before and no longer applies are removed, unless another
    // manager also owns them (or something below them).
    let previous = entries
        .iter()
        .find(|e| mine(e))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: Vec<&FieldPath> = entries
        .iter()
        .filter(|e| !mine(e))
        .flat_map(|e| e.fields.iter())
        .collect();
    let mut dropped: Vec<&FieldPath> = previous
        .difference(&applied_set)
        .filter(|p| !others.iter().any(|o| o.starts_with(p)))
        .collect();
    // Deepest first, so removing an item does not shift a sibling path still to remove.
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in dropped {
        remove_at(&mut obj, p);
    }

    merge_apply(&mut obj, &applied_view, "");
    match entries.iter_mut().find(|e| mine(e)) {
        Some(e) => {
            if e.fields != applied_set {
                e.time = object::now_rfc3339();
            }
            e.fields = applied_set;
            e.api_version = api_version.into();
        }
        None => entries.push(ManagedEntry {
            manager: manager.into(),
            operation: "Apply".into(),
            api_version: api_version.into(),
            time: object::now_rfc3339(),
            subresource: subresource.map(str::to_string),
            fields: applied_set,
        }),
    }
    write_entries(&mut obj, entries);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fieldsv1_round_trips_with_item_markers() {
        let obj = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"name": "http", "port": 80}]}});
        let set = collect(&scoped_view(&obj, Scope::Whole));
        let encoded = encode(&set);
        assert_eq!(
            encoded["f:spec"]["f:ports"]["k:{\"name\":\"http\"}"]["."],
            json!({})
        );
        assert_eq!(decode(&encoded), set);
    }

    #[test]
    fn apply_conflicts_then_force_takes_ownership() {
        let first = apply(
            None,
            &json!({"spec": {"x": 1, "y": 2}}),
            "a",
            false,
            Scope::Whole,
            None,
            "v1",
        )
        .unwrap();
        let err = apply(
            Some(&first),
            &json!({"spec": {"x": 5}}),
            "b",
            false,
            Scope::Whole,
            None,
            "v1",
        )
        .unwrap_err();
        assert_eq!(err[0].manager, "a");
        assert_eq!(err[0].field, ".spec.x");
        let forced = apply(
            Some(&first),
            &json!({"spec": {"x": 5}}),
            "b",
            true,
            Scope::Whole,
            None,
            "v1",
        )
        .unwrap();
        assert_eq!(forced["spec"], json!({"x": 5, "y": 2}));
        // "a" no longer owns x: dropping y from its config removes only y.
        let again = apply(
            Some(&forced),
            &json!({"spec": {}}),
            "a",
            false,
            Scope::Whole,
            None,
            "v1",
        )
        .unwrap();
        assert_eq!(again["spec"], json!({"x": 5}));
    }

    #[test]
    fn shared_ownership_keeps_field_when_one_manager_drops_it() {
        let one = apply(
            None,
            &json!({"data": {"k": "v"}}),
            "a",
            false,
            Scope::Whole,
            None,
            "v1",
        )
        .unwrap();
        let two = apply(
            Some(&one),
            &json!({"data": {"k": "v"}}),
            "b",
            false,
            Scope::Whole,
            None,
            "v1",
        )
        .unwrap();
        let three = apply(Some(&two), &json!({}), "a", false, Scope::Whole, None, "v1").unwrap();
        assert_eq!(three["data"]["k"], "v");
    }
}
