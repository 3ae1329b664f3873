//! AdmissionReview request/response golden tests of the operator's own admission check.

use std::path::PathBuf;

use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use meshplane_crds::{MeshControlPlane, MeshRevisionTag};
use meshplane_operator::admission::review;
use serde_json::{json, Value};

fn existing() -> (Vec<MeshControlPlane>, Vec<MeshRevisionTag>) {
    let cp = |name: &str, tenant: &str, created: &str| -> MeshControlPlane {
        serde_json::from_value(json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"tenant": tenant},
        }))
        .expect("valid control plane")
    };
    let tag: MeshRevisionTag = serde_json::from_value(json!({
        "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshRevisionTag",
        "metadata": {"name": "blue-stable", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"revision": "blue-v1"},
        "status": {"revision": "blue-v1", "tenant": "blue"},
    }))
    .expect("valid tag");
    (
        vec![
            cp("blue-v1", "blue", "2026-01-01T00:00:00Z"),
            cp("green", "green", "2026-01-02T00:00:00Z"),
        ],
        vec![tag],
    )
}

fn request(kind: &str, operation: &str, object: Value, old: Option<Value>) -> Value {
    let resource = if kind == "MeshControlPlane" {
        "meshcontrolplanes"
    } else {
        "meshrevisiontags"
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{}", object["metadata"]["name"].as_str().unwrap_or_default()),
            "kind": {"group": "meshplane.io", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "meshplane.io", "version": "v1alpha1", "resource": resource},
            "name": object["metadata"]["name"],
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    })
}

fn mcp(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane", "metadata": {"name": name}, "spec": spec})
}

fn tag(name: &str, revision: &str) -> Value {
    json!({"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshRevisionTag", "metadata": {"name": name}, "spec": {"revision": revision}})
}

fn run(case: &str, req: Value) -> Value {
    let (cps, tags) = existing();
    let review_in: AdmissionReview<DynamicObject> =
        serde_json::from_value(req.clone()).expect("valid review");
    let request: AdmissionRequest<DynamicObject> = review_in.try_into().expect("has a request");
    let response =
        serde_json::to_value(review(&request, &cps, &tags).into_review()).expect("serializes");
    let actual = serde_json::to_string_pretty(&json!({"request": req, "response": response}))
        .expect("json")
        + "\n";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/admission")
        .join(format!("{case}.json"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &actual).expect("golden writable");
    } else {
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("missing {}; run with UPDATE_GOLDEN=1", path.display()));
        assert_eq!(
            actual, expected,
            "golden {case} differs; run with UPDATE_GOLDEN=1 to accept"
        );
    }
    response["response"].clone()
}

fn allowed(resp: &Value) -> bool {
    resp["allowed"].as_bool().expect("allowed is set")
}

#[test]
fn a_new_control_plane_with_a_fresh_revision_is_allowed() {
    let resp = run(
        "mcp-allowed",
        request(
            "MeshControlPlane",
            "CREATE",
            mcp("blue-v2", json!({"tenant": "blue"})),
            None,
        ),
    );
    assert!(allowed(&resp));
}

#[test]
fn a_duplicate_revision_is_refused() {
    let resp = run(
        "mcp-duplicate-revision",
        request(
            "MeshControlPlane",
            "CREATE",
            mcp("red", json!({"tenant": "red", "revision": "blue-v1"})),
            None,
        ),
    );
    assert!(!allowed(&resp));
    assert!(resp["status"]["message"]
        .as_str()
        .unwrap()
        .contains("already claimed"));
}

#[test]
fn a_revision_named_like_a_tag_is_refused() {
    let resp = run(
        "mcp-named-like-tag",
        request(
            "MeshControlPlane",
            "CREATE",
            mcp("blue-stable", json!({"tenant": "blue"})),
            None,
        ),
    );
    assert!(!allowed(&resp));
}

#[test]
fn an_invalid_selector_is_refused() {
    let spec = json!({"tenant": "blue", "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Like"}]}});
    let resp = run(
        "mcp-invalid-selector",
        request("MeshControlPlane", "CREATE", mcp("blue-v3", spec), None),
    );
    assert!(!allowed(&resp));
    assert!(resp["status"]["message"]
        .as_str()
        .unwrap()
        .contains("spec.namespaceSelector"));
}

#[test]
fn a_tag_named_like_a_revision_is_refused() {
    let resp = run(
        "tag-named-like-revision",
        request("MeshRevisionTag", "CREATE", tag("green", "blue-v1"), None),
    );
    assert!(!allowed(&resp));
}

#[test]
fn a_tag_moved_across_tenants_is_refused() {
    let old = json!({"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshRevisionTag", "metadata": {"name": "blue-stable"},
                     "spec": {"revision": "blue-v1"}, "status": {"revision": "blue-v1", "tenant": "blue"}});
    let resp = run(
        "tag-moved-across-tenants",
        request(
            "MeshRevisionTag",
            "UPDATE",
            tag("blue-stable", "green"),
            Some(old),
        ),
    );
    assert!(!allowed(&resp));
    assert!(resp["status"]["message"]
        .as_str()
        .unwrap()
        .contains("never moves across tenants"));
}

#[test]
fn a_tag_to_a_revision_not_created_yet_is_allowed_with_a_warning() {
    let resp = run(
        "tag-revision-missing",
        request(
            "MeshRevisionTag",
            "CREATE",
            tag("blue-canary", "blue-v9"),
            None,
        ),
    );
    assert!(allowed(&resp));
    assert_eq!(resp["warnings"].as_array().map(Vec::len), Some(1));
}
