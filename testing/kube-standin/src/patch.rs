//! Non-apply patches: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and an approximation of
//! strategic merge patch (lists of objects with a `name` merge by name, `$patch` directives on
//! maps and list items, other `$`-directives ignored).

use serde_json::{Map, Value};

use super::error::ApiError;

/// The patch formats the API accepts, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let media = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match media.as_str() {
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchKind::Apply),
            _ => Err(ApiError::unsupported_media_type(content_type)),
        }
    }
}

/// The real API server's JSON patch treats a missing path as `null` in a `test` operation;
/// kube-runtime's finalizer helper relies on it (`test /metadata/finalizers == null`, then
/// `add`). The json-patch crate fails such a test, so those operations are dropped here.
fn without_null_tests_of_missing_paths(doc: &Value, ops: json_patch::Patch) -> json_patch::Patch {
    json_patch::Patch(
        ops.0
            .into_iter()
            .filter(|op| match op {
                json_patch::PatchOperation::Test(t) => {
                    !(t.value.is_null() && doc.pointer(t.path.as_str()).is_none())
                }
                _ => true,
            })
            .collect(),
    )
}

/// Applies a JSON, merge or strategic patch to `doc`.
pub fn apply_patch(kind: PatchKind, doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    match kind {
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            let ops = without_null_tests_of_missing_paths(doc, ops);
            json_patch::patch(doc, &ops).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the JSON patch could not be applied: {e}"),
                )
            })
        }
        PatchKind::Merge => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(doc, patch);
            Ok(())
        }
        PatchKind::Strategic => {
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "a strategic merge patch must be a JSON object",
                ));
            }
            strategic_merge(doc, patch);
            Ok(())
        }
        PatchKind::Apply => Err(ApiError::internal(
            "apply patches are handled by field management",
        )),
    }
}

fn strategic_merge(doc: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *doc = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replacement = p.clone();
        replacement.remove("$patch");
        *doc = Value::Object(strip_directives(replacement));
        return;
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(d) = doc else { return };
    for (key, value) in p {
        if key.starts_with('$') {
            continue;
        }
        match value {
            Value::Null => {
                d.remove(key);
            }
            Value::Object(_) => strategic_merge(d.entry(key.clone()).or_insert(Value::Null), value),
            Value::Array(items) => {
                let merged = match d.get_mut(key) {
                    Some(Value::Array(existing)) if keyed_by_name(items) => {
                        merge_named_list(existing, items);
                        None
                    }
                    _ => Some(Value::Array(
                        items.iter().filter(|i| !is_delete(i)).cloned().collect(),
                    )),
                };
                if let Some(v) = merged {
                    d.insert(key.clone(), v);
                }
            }
            scalar => {
                d.insert(key.clone(), scalar.clone());
            }
        }
    }
}

fn strip_directives(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .collect()
}

fn is_delete(item: &Value) -> bool {
    item.get("$patch").and_then(Value::as_str) == Some("delete")
}

fn keyed_by_name(items: &[Value]) -> bool {
    !items.is_empty()
        && items
            .iter()
            .all(|i| i.get("name").is_some_and(Value::is_string))
}

fn merge_named_list(existing: &mut Vec<Value>, items: &[Value]) {
    for item in items {
        let name = item.get("name");
        let at = existing.iter().position(|e| e.get("name") == name);
        match (at, is_delete(item)) {
            (Some(i), true) => {
                existing.remove(i);
            }
            (Some(i), false) => strategic_merge(&mut existing[i], item),
            (None, true) => {}
            (None, false) => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, item);
                existing.push(fresh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_merges_named_lists_and_deletes_nulls() {
        let mut doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}},
            "spec": {"containers": [{"name": "app", "image": "x:1"}, {"name": "side", "image": "s"}]}});
        let patch = json!({"metadata": {"labels": {"b": null, "c": "3"}},
            "spec": {"$setElementOrder/containers": [{"name": "app"}],
                     "containers": [{"name": "app", "image": "x:2"}, {"name": "side", "$patch": "delete"}]}});
        apply_patch(PatchKind::Strategic, &mut doc, &patch).unwrap();
        assert_eq!(doc["metadata"]["labels"], json!({"a": "1", "c": "3"}));
        assert_eq!(
            doc["spec"]["containers"],
            json!([{"name": "app", "image": "x:2"}])
        );
    }

    #[test]
    fn json_patch_test_of_null_passes_on_a_missing_path_only() {
        // kube-runtime's finalizer helper: test finalizers == null, then add them.
        let patch = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["meshplane.io/cleanup"]}
        ]);
        let mut doc = json!({"metadata": {"name": "blue-v1"}});
        apply_patch(PatchKind::Json, &mut doc, &patch).unwrap();
        assert_eq!(
            doc["metadata"]["finalizers"],
            json!(["meshplane.io/cleanup"])
        );
        // Once finalizers exist the same test must fail: it guards against lost updates.
        let mut doc = json!({"metadata": {"name": "blue-v1", "finalizers": ["other"]}});
        let err = apply_patch(PatchKind::Json, &mut doc, &patch).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(doc["metadata"]["finalizers"], json!(["other"]));
    }
}
