//! Server-side field validation (`fieldValidation` on create, update and patch), as the real
//! API does it: fields the kind's schema does not declare are an error with `Strict` (what
//! kubectl sends by default), a `Warning` header per field with `Warn` (the server's default when
//! the parameter is absent), and silently dropped with `Ignore`. Either way they are never
//! stored.
//!
//! Custom resources are checked against their structural schema (the fields pruning removes);
//! built-in kinds against their Kubernetes types (k8s-openapi): a field that does not survive
//! decoding into the typed object and encoding back is unknown. Duplicate fields are not
//! detected (JSON bodies keep the last value).

use k8s_openapi::api;
use serde_json::Value;

use super::error::ApiError;

/// The `fieldValidation` directive of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

impl FieldValidation {
    /// From the query parameter; absent means `Warn`, as on the real API server.
    pub fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value {
            None => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation: unsupported value {other:?}: supported values are Strict, Warn and Ignore"
            ))),
        }
    }

    /// What to do with `unknown` field paths: Err under Strict, warnings under Warn.
    pub fn judge(self, unknown: &[String]) -> Result<Vec<String>, ApiError> {
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        let described: Vec<String> = unknown
            .iter()
            .map(|path| format!("unknown field {:?}", path))
            .collect();
        match self {
            FieldValidation::Strict => Err(ApiError::bad_request(format!(
                "strict decoding error: {}",
                described.join(", ")
            ))),
            FieldValidation::Warn => Ok(described),
            FieldValidation::Ignore => Ok(Vec::new()),
        }
    }
}

/// Paths (`spec.template.spec.containers[0].foo`) of the fields of a built-in object that its
/// Kubernetes type does not have, or None for kinds without a known type (or bodies that do not
/// decode; the store keeps those as they are).
pub fn unknown_builtin_fields(
    group: &str,
    version: &str,
    kind: &str,
    obj: &Value,
) -> Option<Vec<String>> {
    macro_rules! typed {
        ($t:ty) => {
            serde_json::from_value::<$t>(obj.clone())
                .ok()
                .and_then(|v| serde_json::to_value(v).ok())
        };
    }
    let typed = match (group, version, kind) {
        ("", "v1", "Namespace") => typed!(api::core::v1::Namespace),
        ("", "v1", "Pod") => typed!(api::core::v1::Pod),
        ("", "v1", "Service") => typed!(api::core::v1::Service),
        ("", "v1", "ConfigMap") => typed!(api::core::v1::ConfigMap),
        ("", "v1", "Secret") => typed!(api::core::v1::Secret),
        ("", "v1", "ServiceAccount") => typed!(api::core::v1::ServiceAccount),
        ("", "v1", "Event") => typed!(api::core::v1::Event),
        ("events.k8s.io", "v1", "Event") => typed!(api::events::v1::Event),
        ("apps", "v1", "Deployment") => typed!(api::apps::v1::Deployment),
        ("apps", "v1", "ReplicaSet") => typed!(api::apps::v1::ReplicaSet),
        ("apps", "v1", "StatefulSet") => typed!(api::apps::v1::StatefulSet),
        ("apps", "v1", "DaemonSet") => typed!(api::apps::v1::DaemonSet),
        ("discovery.k8s.io", "v1", "EndpointSlice") => typed!(api::discovery::v1::EndpointSlice),
        ("policy", "v1", "PodDisruptionBudget") => typed!(api::policy::v1::PodDisruptionBudget),
        ("rbac.authorization.k8s.io", "v1", "Role") => typed!(api::rbac::v1::Role),
        ("rbac.authorization.k8s.io", "v1", "RoleBinding") => typed!(api::rbac::v1::RoleBinding),
        ("rbac.authorization.k8s.io", "v1", "ClusterRole") => typed!(api::rbac::v1::ClusterRole),
        ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding") => {
            typed!(api::rbac::v1::ClusterRoleBinding)
        }
        ("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration") => {
            typed!(api::admissionregistration::v1::MutatingWebhookConfiguration)
        }
        ("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration") => {
            typed!(api::admissionregistration::v1::ValidatingWebhookConfiguration)
        }
        ("coordination.k8s.io", "v1", "Lease") => typed!(api::coordination::v1::Lease),
        ("apiextensions.k8s.io", "v1", "CustomResourceDefinition") => {
            typed!(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition)
        }
        _ => None,
    }?;
    let mut unknown = Vec::new();
    diff(obj, &typed, "", &mut unknown);
    Some(unknown)
}

/// Collects paths present (and not null) in `sent` but absent from `kept`.
fn diff(sent: &Value, kept: &Value, path: &str, unknown: &mut Vec<String>) {
    match (sent, kept) {
        (Value::Object(sent), Value::Object(kept)) => {
            for (key, value) in sent {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match kept.get(key) {
                    Some(kept_value) => diff(value, kept_value, &child, unknown),
                    // A null is "unset", which every type accepts.
                    None if value.is_null() => {}
                    None => unknown.push(child),
                }
            }
        }
        (Value::Array(sent), Value::Array(kept)) => {
            for (index, (s, k)) in sent.iter().zip(kept).enumerate() {
                diff(s, k, &format!("{path}[{index}]"), unknown);
            }
        }
        _ => {}
    }
}

/// Removes the fields at `paths` (as [`unknown_builtin_fields`] names them) from `obj`.
pub fn remove_fields(obj: &mut Value, paths: &[String]) {
    for path in paths {
        let mut steps = parse_path(path);
        let Some(last) = steps.pop() else {
            continue;
        };
        let parent: String = steps
            .iter()
            .map(|step| format!("/{}", step.replace('~', "~0").replace('/', "~1")))
            .collect();
        if let Some(map) = obj.pointer_mut(&parent).and_then(Value::as_object_mut) {
            map.remove(&last);
        }
    }
}

/// `a.b[1].c` → `["a", "b", "1", "c"]` (JSON pointer steps).
fn parse_path(path: &str) -> Vec<String> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, indexes) = match part.find('[') {
            Some(at) => (&part[..at], &part[at..]),
            None => (part, ""),
        };
        steps.push(key.to_string());
        steps.extend(
            indexes
                .split(['[', ']'])
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        );
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_of_built_in_kinds_are_found_by_path() {
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}, "colour": "blue"},
            "spec": {
                "replicas": 1, "replica": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [
                        {"name": "a", "image": "x"},
                        {"name": "b", "image": "y", "imagePullPolicy": null, "ports": [{"containerPort": 80, "hostPortt": 1}]}
                    ]}}
            }
        });
        let unknown = unknown_builtin_fields("apps", "v1", "Deployment", &deployment).unwrap();
        assert_eq!(
            unknown,
            [
                "metadata.colour",
                "spec.replica",
                "spec.template.spec.containers[1].ports[0].hostPortt"
            ]
        );
        let mut cleaned = deployment.clone();
        remove_fields(&mut cleaned, &unknown);
        assert_eq!(
            unknown_builtin_fields("apps", "v1", "Deployment", &cleaned).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(cleaned["spec"]["replicas"], 1, "known fields stay");
        assert!(unknown_builtin_fields("example.com", "v1", "Widget", &deployment).is_none());
    }

    #[test]
    fn maps_and_free_form_values_are_not_unknown_fields() {
        let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "annotations": {"any.key/x": "1"}}, "data": {"whatever": "x"}});
        assert_eq!(
            unknown_builtin_fields("", "v1", "ConfigMap", &config_map).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn directives_decide_between_error_warning_and_silence() {
        let unknown = vec!["spec.foo".to_string()];
        let strict = FieldValidation::Strict.judge(&unknown).unwrap_err();
        assert_eq!(strict.code, 400);
        assert!(
            strict.message.contains("unknown field \"spec.foo\""),
            "{}",
            strict.message
        );
        assert_eq!(
            FieldValidation::Warn.judge(&unknown).unwrap(),
            ["unknown field \"spec.foo\""]
        );
        assert!(FieldValidation::Ignore.judge(&unknown).unwrap().is_empty());
        assert_eq!(FieldValidation::parse(None).unwrap(), FieldValidation::Warn);
        assert!(FieldValidation::parse(Some("Loose")).is_err());
    }
}
