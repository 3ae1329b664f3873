//! AdmissionReview request/response golden tests of the operator's own admission check.

use std::path::PathBuf;

use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use meshplane_crds::membership::NamespaceFacts;
use meshplane_crds::{MeshControlPlane, MeshRevisionTag};
use meshplane_operator::admission::review;
use serde_json::{json, Value};

fn existing() -> (Vec<MeshControlPlane>, Vec<MeshRevisionTag>) {
    let cp = |name: &str, tenant: &str, created: &str| -> MeshControlPlane {
        serde_json::from_value(json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"tenant": tenant},
            // The operator recorded the control namespace it created.
            "status": {"controlNamespace": format!("meshplane-{tenant}"),
                       "controlNamespaceUID": format!("uid-meshplane-{tenant}")},
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
    // A tenant whose CA is an intermediate of the organisation's root, with its own trust
    // domain.
    let mut orange = cp("orange-v1", "orange", "2026-01-03T00:00:00Z");
    orange.spec.mesh_config.trust_domain = Some("orange.corp.example".into());
    (
        vec![
            cp("blue-v1", "blue", "2026-01-01T00:00:00Z"),
            cp("green", "green", "2026-01-02T00:00:00Z"),
            orange,
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
    run_with(case, req, None)
}

fn run_with(case: &str, req: Value, control_namespace: Option<NamespaceFacts>) -> Value {
    let (cps, tags) = existing();
    let review_in: AdmissionReview<DynamicObject> =
        serde_json::from_value(req.clone()).expect("valid review");
    let request: AdmissionRequest<DynamicObject> = review_in.try_into().expect("has a request");
    let response = serde_json::to_value(
        review(&request, &cps, &tags, control_namespace.as_ref()).into_review(),
    )
    .expect("serializes");
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

/// A control plane may not take a namespace meshplane did not create for its tenant: another
/// tenant's member, a system namespace, an unlabelled one (the operator's own, say). One it
/// created for the same tenant is fine, and so is one that does not exist yet.
#[test]
fn a_control_namespace_that_is_not_the_tenants_to_take_is_refused() {
    let create = |spec: Value| request("MeshControlPlane", "CREATE", mcp("red", spec), None);
    let member = NamespaceFacts::new("shop", &[("meshplane.io/rev", "blue-v1")]);
    let resp = run_with(
        "mcp-control-namespace-member",
        create(json!({"tenant": "red", "namespace": "shop"})),
        Some(member),
    );
    assert!(!allowed(&resp));
    let message = resp["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(r#"control namespace "shop""#)
            && message.contains("meshplane.io/rev=blue-v1"),
        "{message}"
    );
    let system = run_with(
        "mcp-control-namespace-system",
        create(json!({"tenant": "red", "namespace": "kube-system"})),
        Some(NamespaceFacts::new("kube-system", &[])),
    );
    assert!(!allowed(&system));
    let operator = run_with(
        "mcp-control-namespace-unlabelled",
        create(json!({"tenant": "red", "namespace": "meshplane-system"})),
        Some(NamespaceFacts::new("meshplane-system", &[])),
    );
    assert!(!allowed(&operator));
    let other_tenant = NamespaceFacts::new(
        "meshplane-green",
        &[
            ("app.kubernetes.io/managed-by", "meshplane"),
            ("meshplane.io/tenant", "green"),
        ],
    );
    assert!(!allowed(&run_with(
        "mcp-control-namespace-other-tenant",
        create(json!({"tenant": "red", "namespace": "meshplane-green"})),
        Some(other_tenant),
    )));
    // Created in advance with meshplane's labels by whoever may create namespaces: refused,
    // or the operator would write the tenant CA's private key into it.
    let planted = NamespaceFacts::new(
        "meshplane-red",
        &[
            ("app.kubernetes.io/managed-by", "meshplane"),
            ("meshplane.io/tenant", "red"),
        ],
    )
    .with_uid("uid-planted");
    let resp = run_with(
        "mcp-control-namespace-planted",
        create(json!({"tenant": "red"})),
        Some(planted.clone()),
    );
    assert!(!allowed(&resp));
    assert!(resp["status"]["message"]
        .as_str()
        .unwrap()
        .contains("meshplane.io/adopt-control-namespace"));
    // The platform admin hands it over by its UID.
    let mut handed = mcp("red", json!({"tenant": "red"}));
    handed["metadata"]["annotations"] =
        json!({"meshplane.io/adopt-control-namespace": "uid-planted"});
    assert!(allowed(&run_with(
        "mcp-control-namespace-handed",
        request("MeshControlPlane", "CREATE", handed, None),
        Some(planted),
    )));
    // A new revision of a tenant whose existing revision recorded creating the namespace.
    let own = NamespaceFacts::new(
        "meshplane-blue",
        &[
            ("app.kubernetes.io/managed-by", "meshplane"),
            ("meshplane.io/tenant", "blue"),
        ],
    )
    .with_uid("uid-meshplane-blue");
    assert!(allowed(&run_with(
        "mcp-control-namespace-own",
        request(
            "MeshControlPlane",
            "CREATE",
            mcp("blue-v3", json!({"tenant": "blue"})),
            None
        ),
        Some(own.clone()),
    )));
    // The same name recreated by someone else has another UID.
    let recreated = NamespaceFacts {
        uid: Some("uid-recreated".into()),
        ..own
    };
    assert!(!allowed(&run_with(
        "mcp-control-namespace-recreated",
        request(
            "MeshControlPlane",
            "CREATE",
            mcp("blue-v3", json!({"tenant": "blue"})),
            None
        ),
        Some(recreated),
    )));
}

fn denial(resp: &Value) -> String {
    assert!(!allowed(resp), "{resp}");
    resp["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_trust_domain_another_tenant_uses_is_refused() {
    let create =
        |name: &str, spec: Value| request("MeshControlPlane", "CREATE", mcp(name, spec), None);
    let message = denial(&run(
        "mcp-trust-domain-taken",
        create(
            "purple-v1",
            json!({"tenant": "purple", "meshConfig": {"trustDomain": "orange.corp.example"}}),
        ),
    ));
    assert!(
        message
            .contains(r#"trust domain "orange.corp.example" already belongs to tenant "orange""#),
        "{message}"
    );
    // Another tenant's default is reserved for it.
    let message = denial(&run(
        "mcp-trust-domain-reserved",
        create(
            "purple-v1",
            json!({"tenant": "purple", "meshConfig": {"trustDomain": "blue.meshplane.local"}}),
        ),
    ));
    assert!(message.contains("spec.meshConfig.trustDomain"), "{message}");
    // An older tenant cannot take a younger one's either.
    let old = mcp("blue-v1", json!({"tenant": "blue"}));
    let mut moved = old.clone();
    moved["spec"]["meshConfig"] = json!({"trustDomain": "orange.corp.example"});
    moved["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    let message = denial(&run(
        "mcp-trust-domain-taken-by-update",
        request("MeshControlPlane", "UPDATE", moved, Some(old)),
    ));
    assert!(
        message.contains("TrustDomain") || message.contains("trust domain"),
        "{message}"
    );
    // With nothing set, a new tenant gets its own default: admitted.
    assert!(allowed(&run(
        "mcp-trust-domain-default",
        create("purple-v1", json!({"tenant": "purple"})),
    )));
}

#[test]
fn a_canary_revision_shares_its_tenants_trust_domain() {
    let create =
        |name: &str, spec: Value| request("MeshControlPlane", "CREATE", mcp(name, spec), None);
    assert!(allowed(&run(
        "mcp-trust-domain-canary",
        create(
            "orange-v2",
            json!({"tenant": "orange", "meshConfig": {"trustDomain": "orange.corp.example"}}),
        ),
    )));
    // A canary naming another trust domain would split the tenant: refused, naming the one.
    let message = denial(&run(
        "mcp-trust-domain-canary-mismatch",
        create("orange-v2", json!({"tenant": "orange"})),
    ));
    assert!(
        message.contains("trustDomain: orange.corp.example"),
        "{message}"
    );
}

/// How the check's metrics count `req`.
fn outcome(req: Value) -> meshplane_webhooks::metrics::Outcome {
    let (cps, tags) = existing();
    let review_in: AdmissionReview<DynamicObject> =
        serde_json::from_value(req).expect("valid review");
    let request: AdmissionRequest<DynamicObject> = review_in.try_into().expect("has a request");
    meshplane_operator::admission::judge(&request, &cps, &tags, None).1
}

#[test]
fn each_answer_is_counted_by_outcome_and_a_denial_by_a_bounded_reason() {
    use meshplane_webhooks::metrics::Outcome;
    let cases = [
        (
            mcp("blue-v2", json!({"tenant": "blue"})),
            "MeshControlPlane",
            Outcome::Allowed,
        ),
        (
            mcp("red", json!({"tenant": "red", "revision": "blue-v1"})),
            "MeshControlPlane",
            Outcome::Denied("revision_conflict"),
        ),
        (
            mcp(
                "blue-v3",
                json!({"tenant": "blue", "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Like"}]}}),
            ),
            "MeshControlPlane",
            Outcome::Denied("invalid"),
        ),
        (
            mcp("bad", json!({"tenant": 7})),
            "MeshControlPlane",
            Outcome::Denied("malformed"),
        ),
        (
            tag("green", "blue-v1"),
            "MeshRevisionTag",
            Outcome::Denied("tag_named_like_revision"),
        ),
        (
            tag("blue-canary", "blue-v9"),
            "MeshRevisionTag",
            Outcome::Allowed,
        ),
    ];
    for (object, kind, expected) in cases {
        let name = object["metadata"]["name"].clone();
        let got = outcome(request(kind, "CREATE", object, None));
        assert_eq!(got, expected, "{kind} {name}");
        if let Outcome::Denied(reason) = got {
            assert!(
                meshplane_operator::admission::DENIAL_REASONS.contains(&reason),
                "{reason} starts at zero"
            );
        }
    }
    let mut no_object = request("MeshRevisionTag", "CREATE", tag("t", "blue-v1"), None);
    no_object["request"]["object"] = Value::Null;
    assert_eq!(outcome(no_object), Outcome::Error);
}

#[test]
fn an_extension_provider_outside_the_tenant_is_refused() {
    let (cps, tags) = existing();
    let namespaces = [
        NamespaceFacts::new("shop", &[("meshplane.io/rev", "blue-v1")]),
        NamespaceFacts::new("bank", &[("meshplane.io/rev", "green")]),
        NamespaceFacts::new("later", &[]),
        NamespaceFacts::new("lab", &[("env", "lab")]),
    ];
    let judge = |providers: Value, selector: Option<Value>| {
        let mut spec = json!({"tenant": "blue", "meshConfig": {"extensionProviders": providers}});
        if let Some(sel) = selector {
            spec["namespaceSelector"] = sel;
        }
        let mut object = mcp("blue-v1", spec);
        object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        let review_in: AdmissionReview<DynamicObject> = serde_json::from_value(request(
            "MeshControlPlane",
            "UPDATE",
            object.clone(),
            Some(object),
        ))
        .expect("valid review");
        let request: AdmissionRequest<DynamicObject> = review_in.try_into().expect("has a request");
        let (resp, outcome) =
            meshplane_operator::admission::judge_in(&request, &cps, &tags, None, &namespaces);
        (
            serde_json::to_value(resp.into_review()).expect("serializes")["response"].clone(),
            outcome,
        )
    };
    let authz = |service: &str| json!([{"name": "authz", "envoyExtAuthzGrpc": {"service": service, "port": 9000}}]);
    // A Service of a member namespace, the control namespace, a ServiceEntry host: admitted.
    for service in [
        "authz.shop.svc.cluster.local",
        "meshplane-blue/authz",
        "authz.example.com",
        "shop/authz.example.com",
    ] {
        let (resp, _) = judge(authz(service), None);
        assert!(allowed(&resp), "{service}: {resp}");
        assert!(resp["warnings"].is_null(), "{service}: {resp}");
    }
    // Another tenant's member or control namespace, or a system namespace: refused.
    for (service, why) in [
        (
            "authz.bank.svc.cluster.local",
            "a namespace of tenant \"green\"",
        ),
        (
            "meshplane-green/authz",
            "the control namespace of tenant \"green\"",
        ),
        ("kube-system/authz", "a system namespace"),
    ] {
        let (resp, outcome) = judge(authz(service), None);
        let message = denial(&resp);
        assert!(message.contains(why), "{service}: {message}");
        assert!(
            message.contains("a provider outside the tenant is refused"),
            "{message}"
        );
        assert!(
            message.contains("spec.meshConfig.extensionProviders[0].envoyExtAuthzGrpc.service"),
            "{message}"
        );
        assert_eq!(
            outcome,
            meshplane_webhooks::metrics::Outcome::Denied("provider_outside_tenant")
        );
    }
    // A namespace the selector excludes can never join: refused.
    let (resp, _) = judge(
        authz("lab/authz"),
        Some(json!({"matchLabels": {"env": "prod"}})),
    );
    assert!(denial(&resp).contains("namespaceSelector"), "{resp}");
    // A namespace that may still join: admitted with a warning.
    let (resp, _) = judge(authz("later/authz"), None);
    assert!(allowed(&resp), "{resp}");
    assert!(
        resp["warnings"][0]
            .as_str()
            .unwrap_or_default()
            .contains("not a namespace of the tenant yet"),
        "{resp}"
    );
    // Malformed providers are refused by the semantic checks.
    let (resp, _) = judge(authz("authz"), None);
    assert!(denial(&resp).contains("name the Service fully"), "{resp}");
}
