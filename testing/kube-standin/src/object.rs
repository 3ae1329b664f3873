//! Accessors for the `metadata` of objects stored as JSON, and the API's timestamp format.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value};

/// The current time as the API formats `metav1.Time` (RFC 3339, whole seconds, UTC).
pub fn now_rfc3339() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Parses an RFC 3339 timestamp; None when malformed.
pub fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

/// `kubectl`-style short age ("5s", "3m", "2h", "4d") of a timestamp.
pub fn human_age(timestamp: &str) -> String {
    let Some(t) = parse_time(timestamp) else {
        return "<unknown>".to_string();
    };
    let secs = Timestamp::now()
        .as_second()
        .saturating_sub(t.as_second())
        .max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 2 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

pub fn metadata(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata")?.as_object()
}

/// The `metadata` map, created when missing (a non-object `metadata` is replaced).
pub fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let Value::Object(root) = obj else {
        unreachable!("obj was just made an object")
    };
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    match meta {
        Value::Object(m) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

pub fn meta_str<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    metadata(obj)?.get(key)?.as_str()
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or_default()
}

pub fn namespace(obj: &Value) -> Option<&str> {
    meta_str(obj, "namespace").filter(|ns| !ns.is_empty())
}

pub fn uid(obj: &Value) -> Option<&str> {
    meta_str(obj, "uid")
}

pub fn resource_version(obj: &Value) -> Option<&str> {
    meta_str(obj, "resourceVersion").filter(|rv| !rv.is_empty())
}

pub fn is_deleting(obj: &Value) -> bool {
    meta_str(obj, "deletionTimestamp").is_some()
}

pub fn string_map(obj: &Value, key: &str) -> BTreeMap<String, String> {
    metadata(obj)
        .and_then(|m| m.get(key))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

pub fn labels(obj: &Value) -> BTreeMap<String, String> {
    string_map(obj, "labels")
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    metadata(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub fn set_finalizers(obj: &mut Value, finalizers: Vec<String>) {
    let meta = metadata_mut(obj);
    if finalizers.is_empty() {
        meta.remove("finalizers");
    } else {
        meta.insert("finalizers".into(), finalizers.into());
    }
}

/// One `metadata.ownerReferences` entry: the owner's uid and whether it blocks deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRef {
    pub uid: String,
    pub block_owner_deletion: bool,
}

pub fn owner_refs(obj: &Value) -> Vec<OwnerRef> {
    metadata(obj)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| {
                    Some(OwnerRef {
                        uid: r.get("uid")?.as_str()?.to_string(),
                        block_owner_deletion: r
                            .get("blockOwnerDeletion")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the owner references to `owner_uid`; true when one was removed.
pub fn remove_owner_ref(obj: &mut Value, owner_uid: &str) -> bool {
    let meta = metadata_mut(obj);
    let Some(Value::Array(refs)) = meta.get_mut("ownerReferences") else {
        return false;
    };
    let before = refs.len();
    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid));
    let removed = refs.len() != before;
    if refs.is_empty() {
        meta.remove("ownerReferences");
    }
    removed
}

/// Follows a `.`-separated path of object keys.
pub fn get_path<'a>(obj: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted
        .split('.')
        .filter(|s| !s.is_empty())
        .try_fold(obj, |v, key| v.get(key))
}
