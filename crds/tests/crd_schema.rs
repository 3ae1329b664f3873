//! The generated CRDs are structural, carry the CEL rules, and match `config/crd/`.

use std::path::PathBuf;

use meshplane_crds::crdgen;
use serde_json::Value;

fn crd_json(kind: &str) -> Value {
    let crd = crdgen::all()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"));
    serde_json::to_value(crd).expect("CRD serializes")
}

fn schema(kind: &str) -> Value {
    crd_json(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Kubernetes' structural-schema rules that matter here: every node has a type (unless it
/// preserves unknown fields or is int-or-string), no `$ref`, and no type inside `anyOf`/`oneOf`
/// branches that the node itself does not declare.
fn assert_structural(node: &Value, path: &str) {
    let obj = node
        .as_object()
        .unwrap_or_else(|| panic!("{path}: schema node is not an object"));
    assert!(
        !obj.contains_key("$ref"),
        "{path}: $ref is not allowed in a structural schema"
    );
    let preserves = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if !preserves && !int_or_string {
        assert!(
            obj.get("type").is_some_and(Value::is_string),
            "{path}: missing type"
        );
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for (i, branch) in obj
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            assert!(
                branch.get("type").is_none(),
                "{path}.{key}[{i}]: branches must not declare types"
            );
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            assert_structural(child, &format!("{path}.{name}"));
        }
    }
    if let Some(items) = obj.get("items") {
        assert_structural(items, &format!("{path}[]"));
    }
    if let Some(extra) = obj.get("additionalProperties").filter(|v| v.is_object()) {
        assert_structural(extra, &format!("{path}{{}}"));
    }
}

#[test]
fn every_crd_schema_is_structural() {
    for crd in crdgen::all() {
        let kind = crd.spec.names.kind.clone();
        assert_structural(&schema(&kind), &kind);
    }
}

fn rules(node: &Value) -> Vec<(String, String)> {
    node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["rule"].as_str().unwrap_or_default().to_string(),
                r["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn mesh_control_plane_carries_immutability_and_name_rules() {
    let s = schema("MeshControlPlane");
    let spec = &s["properties"]["spec"];
    for field in ["tenant", "revision", "namespace"] {
        let r = rules(&spec["properties"][field]);
        assert_eq!(r.len(), 1, "{field}: {r:?}");
        assert_eq!(r[0].0, "self == oldSelf");
        assert_eq!(r[0].1, format!("spec.{field} is immutable"));
    }
    let spec_rules: Vec<String> = rules(spec).into_iter().map(|(r, _)| r).collect();
    assert!(spec_rules.contains(&"has(self.revision) == has(oldSelf.revision)".to_string()));
    let root_rules = rules(&s);
    assert!(
        root_rules
            .iter()
            .any(|(r, _)| r.contains("self.metadata.name.size() <= 32")),
        "{root_rules:?}"
    );
    assert_eq!(spec["properties"]["isolation"]["default"], "Strict");
    assert_eq!(
        spec["properties"]["isolation"]["enum"],
        serde_json::json!(["Strict", "Shared"])
    );
    assert_eq!(spec["properties"]["tenant"]["maxLength"], 32);
    assert!(spec["required"]
        .as_array()
        .is_some_and(|r| r.contains(&Value::from("tenant"))));
}

#[test]
fn mesh_control_plane_is_cluster_scoped_with_printer_columns() {
    let crd = crd_json("MeshControlPlane");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(
        crd["spec"]["names"]["shortNames"],
        serde_json::json!(["mcp"])
    );
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["subresources"]["status"], serde_json::json!({}));
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        columns,
        vec!["Tenant", "Revision", "Ready", "Members", "Proxies", "Age"]
    );
    let tag = crd_json("MeshRevisionTag");
    assert_eq!(tag["spec"]["scope"], "Cluster");
    assert_eq!(
        tag["spec"]["names"]["shortNames"],
        serde_json::json!(["mrt"])
    );
}

#[test]
fn every_spec_field_is_documented() {
    fn walk(node: &Value, path: &str, missing: &mut Vec<String>) {
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (name, child) in props {
                let p = format!("{path}.{name}");
                if child
                    .get("description")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    missing.push(p.clone());
                }
                walk(child, &p, missing);
                if let Some(items) = child.get("items") {
                    walk(items, &p, missing);
                }
            }
        }
    }
    for crd in crdgen::all() {
        let kind = crd.spec.names.kind.clone();
        let s = schema(&kind);
        let mut missing = Vec::new();
        walk(
            &s["properties"]["spec"],
            &format!("{kind}.spec"),
            &mut missing,
        );
        assert!(
            missing.is_empty(),
            "fields without a description (kubectl explain shows nothing): {missing:?}"
        );
    }
}

#[test]
fn committed_crds_match_the_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/crd");
    for (name, text) in crdgen::files().expect("CRDs serialize") {
        let committed = std::fs::read_to_string(dir.join(&name)).unwrap_or_default();
        assert!(
            committed == text,
            "config/crd/{name} differs from the Rust types: run `make crds` and commit the result"
        );
    }
}
