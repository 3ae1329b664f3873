//! Read access to the stand-in's store, and selecting stored objects by their labels.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Read-only view of stored objects. The stand-in's store implements it; the RBAC, token and
/// admission modules use it so they stay independent of how objects are stored.
pub trait ObjectLookup: Send + Sync {
    /// One object, by `apiVersion`, `kind`, namespace (None for cluster-scoped) and name.
    fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<serde_json::Value>;

    /// All objects of a kind; `namespace` None means all namespaces (or cluster-scoped).
    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Vec<serde_json::Value>;

    /// A number that changes whenever a Role, ClusterRole, RoleBinding or ClusterRoleBinding
    /// that RBAC reads for `namespace` is created, updated or deleted: cluster-scoped ones, and
    /// for Some(ns) also those in `ns`. It never returns to an earlier value, so rules resolved
    /// at one value are current while it stays. None (the default): not tracked, no caching.
    fn rbac_generation(&self, _namespace: Option<&str>) -> Option<u64> {
        None
    }
}

/// `metadata.labels` of an object (empty when absent or malformed).
pub fn object_labels(object: &serde_json::Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(|labels| labels.as_object())
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `labels` satisfy a `LabelSelector` (matchLabels and matchExpressions, ANDed).
/// An empty selector matches everything. Err names an invalid operator.
pub fn label_selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    if !labels_match {
        return Ok(false);
    }
    for requirement in selector.match_expressions.iter().flatten() {
        let values = requirement.values.as_deref().unwrap_or_default();
        let actual = labels.get(&requirement.key);
        let satisfied = match requirement.operator.as_str() {
            "In" => actual.is_some_and(|v| values.contains(v)),
            "NotIn" => actual.is_none_or(|v| !values.contains(v)),
            "Exists" => actual.is_some(),
            "DoesNotExist" => actual.is_none(),
            other => return Err(format!("{other:?} is not a valid label selector operator")),
        };
        if !satisfied {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    /// A test store: objects in a vector, found by apiVersion, kind, namespace and name. Its
    /// `rbac_generation` counts every change, whatever its kind and namespace.
    #[derive(Default)]
    pub(crate) struct MemoryLookup {
        pub objects: Mutex<Vec<Value>>,
        changes: AtomicU64,
    }

    impl MemoryLookup {
        pub fn with(objects: Vec<Value>) -> Self {
            MemoryLookup {
                objects: Mutex::new(objects),
                changes: AtomicU64::new(0),
            }
        }

        pub fn add(&self, object: Value) {
            self.objects.lock().unwrap().push(object);
            self.changes.fetch_add(1, Ordering::SeqCst);
        }

        /// Removes the objects of `kind` named `name` (in any namespace).
        pub fn remove(&self, kind: &str, name: &str) {
            self.objects.lock().unwrap().retain(|o| {
                field(o, "/kind") != Some(kind) || field(o, "/metadata/name") != Some(name)
            });
            self.changes.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn field<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
        object.pointer(pointer).and_then(Value::as_str)
    }

    impl ObjectLookup for MemoryLookup {
        fn get(
            &self,
            api_version: &str,
            kind: &str,
            namespace: Option<&str>,
            name: &str,
        ) -> Option<Value> {
            self.list(api_version, kind, namespace)
                .into_iter()
                .find(|o| field(o, "/metadata/name") == Some(name))
        }

        fn list(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Vec<Value> {
            self.objects
                .lock()
                .unwrap()
                .iter()
                .filter(|o| field(o, "/apiVersion") == Some(api_version))
                .filter(|o| field(o, "/kind") == Some(kind))
                .filter(|o| namespace.is_none() || field(o, "/metadata/namespace") == namespace)
                .cloned()
                .collect()
        }

        fn rbac_generation(&self, _namespace: Option<&str>) -> Option<u64> {
            Some(self.changes.load(Ordering::SeqCst))
        }
    }

    fn selector(value: Value) -> LabelSelector {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn selector_operators() {
        let labels =
            object_labels(&json!({"metadata": {"labels": {"rev": "blue", "env": "prod"}}}));
        let cases = [
            (json!({}), true),
            (json!({"matchLabels": {"rev": "blue"}}), true),
            (json!({"matchLabels": {"rev": "green"}}), false),
            (
                json!({"matchExpressions": [{"key": "rev", "operator": "In", "values": ["a", "blue"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "rev", "operator": "NotIn", "values": ["blue"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["x"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "Exists"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]}),
                false,
            ),
        ];
        for (sel, expected) in cases {
            assert_eq!(
                label_selector_matches(&selector(sel.clone()), &labels),
                Ok(expected),
                "{sel}"
            );
        }
        let bad = selector(json!({"matchExpressions": [{"key": "env", "operator": "Near"}]}));
        assert!(label_selector_matches(&bad, &labels).is_err());
    }
}
