//! Contract 5: the revision's injection and validation webhook configurations. Validation
//! covers the revision's namespaces and the tenant's control namespace.

use meshplane_contracts::webhooks::{INJECT_PATH, VALIDATE_PATH};
use meshplane_crds::names::{self, ports};
use serde_json::{json, Value};

use super::{DesiredObject, Kind, Revision};

/// Seconds the API server waits for the instance; well under the 30s maximum so a down
/// instance fails pod creation quickly instead of stalling controllers.
const TIMEOUT_SECONDS: i32 = 10;

/// Namespaces whose `meshplane.io/rev` is the revision or one of its tags, AND that the
/// revision's `namespaceSelector` admits: a namespace rejected by membership must not get
/// this revision's sidecars either. Label-selector requirements are ANDed, so merging is exact.
fn namespace_selector(rev: &Revision<'_>) -> Value {
    let mut values: Vec<String> = vec![rev.revision.clone()];
    values.extend(rev.input.revision.tags.iter().cloned());
    let mut expressions =
        vec![json!({"key": names::REV_LABEL, "operator": "In", "values": values})];
    let mut selector = serde_json::Map::new();
    if let Some(sel) = &rev.input.control_plane.spec.namespace_selector {
        if let Some(ml) = sel.match_labels.as_ref().filter(|m| !m.is_empty()) {
            selector.insert("matchLabels".into(), json!(ml));
        }
        for e in sel.match_expressions.iter().flatten() {
            expressions.push(serde_json::to_value(e).unwrap_or(Value::Null));
        }
    }
    selector.insert("matchExpressions".into(), Value::Array(expressions));
    Value::Object(selector)
}

fn client_config(rev: &Revision<'_>, path: &str) -> Value {
    json!({
        "service": {
            "name": names::instance_name(&rev.revision),
            "namespace": rev.control_namespace,
            "path": path,
            "port": ports::HTTPS_WEBHOOK,
        },
        "caBundle": rev.input.tls.ca_bundle_base64(),
    })
}

/// failurePolicy Fail: a namespace that opted into the mesh must not start pods without their
/// sidecar (they would bypass the mesh silently). The consequence: while every replica of the
/// instance is down, pod creation in its namespaces fails with a clear admission error; the
/// PodDisruptionBudget and replicas > 1 limit that window.
pub fn webhooks(rev: &Revision<'_>) -> Vec<DesiredObject> {
    let ns_selector = namespace_selector(rev);
    let common = |name: String, path: &str, rules: Value| {
        json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "clientConfig": client_config(rev, path),
            "namespaceSelector": ns_selector,
            "rules": rules,
        })
    };
    let mut inject = common(
        format!("{}.inject.meshplane.io", rev.revision),
        INJECT_PATH,
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}]),
    );
    if let Some(w) = inject.as_object_mut() {
        w.insert(
            "objectSelector".into(),
            json!({"matchExpressions": [{"key": names::INJECT_LABEL, "operator": "NotIn", "values": ["false"]}]}),
        );
        w.insert("reinvocationPolicy".into(), json!("Never"));
    }
    let config_rules = json!([{"apiGroups": ["networking.meshplane.io"], "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["serviceentries", "envoyfilters", "sidecars", "virtualservices", "destinationrules", "gateways"], "scope": "Namespaced"},
        {"apiGroups": ["security.meshplane.io"], "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["peerauthentications", "authorizationpolicies", "requestauthentications"], "scope": "Namespaced"}]);
    let validate = common(
        format!("{}.validate.meshplane.io", rev.revision),
        VALIDATE_PATH,
        config_rules.clone(),
    );
    // The control namespace carries no revision label, yet its config applies tenant-wide:
    // every revision of the tenant validates it, selected by the name label the API server
    // sets on every namespace (a label nobody can move to another namespace).
    let mut validate_control = common(
        format!("{}.validate-control.meshplane.io", rev.revision),
        VALIDATE_PATH,
        config_rules,
    );
    if let Some(w) = validate_control.as_object_mut() {
        w.insert(
            "namespaceSelector".into(),
            json!({"matchLabels": {names::NAMESPACE_NAME_LABEL: rev.control_namespace}}),
        );
    }
    vec![
        rev.object(
            Kind::MutatingWebhookConfiguration,
            None,
            &names::injector_webhook(&rev.revision),
            json!({"webhooks": [inject]}),
        ),
        rev.object(
            Kind::ValidatingWebhookConfiguration,
            None,
            &names::validator_webhook(&rev.revision),
            json!({"webhooks": [validate, validate_control]}),
        ),
    ]
}
