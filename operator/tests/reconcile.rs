//! Reconcile-level tests against a fake API (tower-test pattern): create, steady state,
//! a namespace leaving, a conflict, and deletion blocked while injected pods run.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::Client;
use meshplane_crds::{names, MeshControlPlane};
use meshplane_operator::controller::{reconcile_control_plane, reconcile_tag, Context, Settings};
use meshplane_operator::metrics::Metrics;
use serde_json::{json, Value};
use support::FakeApi;

const MCP: (&str, &str) = ("meshplane.io", "meshcontrolplanes");
const TAGS: (&str, &str) = ("meshplane.io", "meshrevisiontags");
const NS: (&str, &str) = ("", "namespaces");

fn context(client: Client) -> Arc<Context> {
    let now = time::OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("valid");
    Arc::new(Context::new(
        client,
        Arc::new(Metrics::default()),
        Settings::default(),
        Arc::new(move || now),
    ))
}

fn control_plane(name: &str, tenant: &str, revision: Option<&str>, created: &str) -> Value {
    let mut spec = json!({
        "tenant": tenant,
        "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["green"]}]},
    });
    if let Some(r) = revision {
        spec["revision"] = json!(r);
    }
    json!({
        "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1,
                     "creationTimestamp": created, "finalizers": [names::FINALIZER]},
        "spec": spec,
    })
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

/// Tenant blue with revision blue-v1, tag blue-stable; shop follows the tag, cart is labelled
/// directly, intruder is labelled but owned by team green (rejected), outsider is unlabelled.
fn cluster() -> FakeApi {
    let api = FakeApi::default();
    api.insert(
        MCP,
        control_plane("blue-v1", "blue", None, "2026-01-01T00:00:00Z"),
    );
    api.insert(
        TAGS,
        json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshRevisionTag",
            "metadata": {"name": "blue-stable", "generation": 1},
            "spec": {"revision": "blue-v1"},
        }),
    );
    api.insert(
        NS,
        namespace("shop", json!({names::REV_LABEL: "blue-stable"})),
    );
    api.insert(NS, namespace("cart", json!({names::REV_LABEL: "blue-v1"})));
    api.insert(
        NS,
        namespace(
            "intruder",
            json!({names::REV_LABEL: "blue-v1", "team": "green"}),
        ),
    );
    api.insert(NS, namespace("outsider", json!({})));
    // Not ours: an unlabelled ConfigMap with our name elsewhere, and another tenant's object.
    api.insert(("", "configmaps"), json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "meshplane-blue-v1-bootstrap", "namespace": "outsider"}, "data": {"mine": "yes"}}));
    api.insert(("", "configmaps"), json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "meshplane-green-bootstrap", "namespace": "bank",
                     "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY_VALUE, names::TENANT_LABEL: "green", names::REVISION_LABEL: "green"},
                     "ownerReferences": [{"uid": "uid-green", "kind": "MeshControlPlane", "name": "green", "apiVersion": "meshplane.io/v1alpha1"}]}}));
    // The operator's shipped RBAC: no Secret, Deployment, ... rights but where it bound them.
    api.enforce_operator_rbac();
    api
}

fn stored(api: &FakeApi, name: &str) -> Arc<MeshControlPlane> {
    let v = api
        .get(MCP.0, MCP.1, None, name)
        .expect("stored control plane");
    Arc::new(serde_json::from_value(v).expect("decodes"))
}

fn object_writes(api: &FakeApi) -> Vec<String> {
    api.writes()
        .into_iter()
        .filter(|w| !w.1.starts_with("meshplane.io/"))
        .map(|(verb, gp, ns, name)| format!("{verb} {gp} {}/{name}", ns.unwrap_or_default()))
        .collect()
}

fn condition(mcp: &MeshControlPlane, type_: &str) -> (String, String) {
    let c = mcp
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("condition {type_} missing"));
    (c.status.clone(), c.reason.clone())
}

#[tokio::test]
async fn create_applies_the_instance_and_member_objects_then_steady_state_writes_nothing() {
    let api = cluster();
    let ctx = context(api.client());
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");

    let configmaps = api.names("configmaps");
    for expected in [
        "meshplane-blue/meshplane-blue-v1-members",
        "meshplane-blue/meshplane-blue-v1-proxies",
        "shop/meshplane-blue-v1-bootstrap",
        "cart/meshplane-blue-v1-bootstrap",
    ] {
        assert!(
            configmaps.contains(&expected.to_string()),
            "{expected} missing from {configmaps:?}"
        );
    }
    assert!(!configmaps.contains(&"intruder/meshplane-blue-v1-bootstrap".to_string()));
    assert_eq!(
        api.names("deployments"),
        ["meshplane-blue/meshplane-blue-v1"]
    );
    let mut bindings = api.names("rolebindings");
    bindings.sort();
    assert_eq!(
        bindings,
        [
            "cart/meshplane-blue-v1-reader",
            "cart/meshplane-blue-v1-restarter",
            "meshplane-blue/meshplane-blue-v1",
            "meshplane-blue/meshplane-blue-v1-operator",
            "meshplane-blue/meshplane-blue-v1-restarter",
            "shop/meshplane-blue-v1-reader",
            "shop/meshplane-blue-v1-restarter"
        ]
    );
    // Every read and write of Secrets, Deployments, ServiceAccounts, PDBs and
    // NetworkPolicies (and Service writes) stayed in the control namespace, after the
    // operator bound itself meshplane-control-namespace there (its first write after the
    // namespace).
    assert_eq!(api.forbidden(), [], "requests outside the operator's RBAC");
    let writes = api.writes();
    let first_bound = writes
        .iter()
        .position(|w| ["/secrets", "apps/deployments", "/serviceaccounts"].contains(&w.1.as_str()))
        .expect("instance objects written");
    let access = writes
        .iter()
        .position(|w| w.3 == "meshplane-blue-v1-operator")
        .expect("the access binding written");
    assert!(access < first_bound, "{writes:?}");
    assert_eq!(
        api.names("mutatingwebhookconfigurations"),
        ["meshplane-blue-v1-injector"]
    );
    let mut secrets = api.names("secrets");
    secrets.sort();
    assert_eq!(
        secrets,
        [
            "meshplane-blue/meshplane-blue-v1-webhook-tls",
            "meshplane-blue/meshplane-ca"
        ]
    );
    // The unlabelled ConfigMap of the same name in a non-member namespace is untouched.
    assert_eq!(
        api.get(
            "",
            "configmaps",
            Some("outsider"),
            "meshplane-blue-v1-bootstrap"
        )
        .unwrap()["data"],
        json!({"mine": "yes"})
    );
    // The bootstrap points at the ClusterIP the Service got in this same reconcile.
    let ip = api
        .get("", "services", Some("meshplane-blue"), "meshplane-blue-v1")
        .unwrap()["spec"]["clusterIP"]
        .clone();
    let bootstrap = api
        .get(
            "",
            "configmaps",
            Some("shop"),
            "meshplane-blue-v1-bootstrap",
        )
        .unwrap();
    assert!(bootstrap["data"]["envoy.yaml"]
        .as_str()
        .unwrap()
        .contains(ip.as_str().unwrap()));
    // Contract 11: the tenant CA was issued in the same reconcile, and every member's
    // bootstrap carries its root (not the placeholder).
    let ca = api
        .get("", "secrets", Some("meshplane-blue"), "meshplane-ca")
        .unwrap();
    let root = String::from_utf8(
        base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            ca["data"]["root-cert.pem"].as_str().unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(root.starts_with("-----BEGIN CERTIFICATE-----"), "{root}");
    for ns in ["shop", "cart"] {
        let cm = api
            .get("", "configmaps", Some(ns), "meshplane-blue-v1-bootstrap")
            .unwrap();
        assert_eq!(cm["data"]["root-cert.pem"], root, "{ns}");
    }
    // The caBundle is the Secret's CA.
    let secret = api
        .get(
            "",
            "secrets",
            Some("meshplane-blue"),
            "meshplane-blue-v1-webhook-tls",
        )
        .unwrap();
    let hook = api
        .get(
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            None,
            "meshplane-blue-v1-injector",
        )
        .unwrap();
    assert_eq!(
        hook["webhooks"][0]["clientConfig"]["caBundle"],
        secret["data"]["ca.crt"]
    );

    let mcp = stored(&api, "blue-v1");
    let status = mcp.status.clone().expect("status written");
    assert_eq!(
        status.members.as_ref().map(|m| m.names.clone()),
        Some(vec!["cart".to_string(), "shop".to_string()])
    );
    assert_eq!(status.rejected.as_ref().map(|r| r.count), Some(1));
    assert_eq!(status.tags, ["blue-stable"]);
    assert_eq!(
        condition(&mcp, "Reconciled"),
        ("True".into(), "Applied".into())
    );
    assert_eq!(
        condition(&mcp, "Ready").0,
        "False",
        "no Deployment is available yet"
    );
    let warnings: Vec<Value> = api
        .events()
        .into_iter()
        .filter(|e| e["type"] == "Warning")
        .collect();
    assert!(
        warnings
            .iter()
            .any(|e| e["regarding"]["name"] == "intruder" && e["reason"] == "OutsideSelector"),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|e| e["regarding"]["kind"] == "MeshControlPlane"
                && e["reason"] == "NamespaceRejected"
                && e["note"].as_str().unwrap_or_default().contains("intruder")),
        "{warnings:?}"
    );
    // Each member joined once, told on the control plane and on the namespace (with its
    // uid, which `kubectl describe namespace` looks Events up by).
    let joined = |regarding_kind: &str| -> Vec<String> {
        let mut named: Vec<String> = api
            .events()
            .iter()
            .filter(|e| {
                e["reason"] == "NamespaceJoined" && e["regarding"]["kind"] == regarding_kind
            })
            .map(|e| match regarding_kind {
                "Namespace" => {
                    assert!(e["regarding"]["uid"].is_string(), "{e}");
                    e["regarding"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                }
                _ => e["note"].as_str().unwrap_or_default().to_string(),
            })
            .collect();
        named.sort();
        named
    };
    assert_eq!(
        joined("MeshControlPlane"),
        [
            "namespace cart joined revision blue-v1 of tenant blue",
            "namespace shop joined revision blue-v1 of tenant blue"
        ]
    );
    assert_eq!(joined("Namespace"), ["cart", "shop"]);

    // Steady state: a resync with nothing changed writes nothing at all.
    api.clear_writes();
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(api.writes(), Vec::new());
    assert!(api.events().is_empty());
    assert!(
        ctx.metrics.total_writes() > 0,
        "the first reconcile's writes are counted"
    );
}

/// A binding whose roleRef changed (before this release the gateway's Secret reads were a Role
/// of the revision, now the shipped ClusterRole) is replaced: the API refuses a roleRef change.
#[tokio::test]
async fn a_binding_whose_role_ref_changed_is_deleted_then_applied() {
    let api = cluster();
    let ctx = context(api.client());
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    let restarter = ("rbac.authorization.k8s.io", "rolebindings");
    let mut old = api
        .get(
            restarter.0,
            restarter.1,
            Some("shop"),
            "meshplane-blue-v1-restarter",
        )
        .expect("the restarter binding");
    old["roleRef"] = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                            "name": "meshplane-blue-v1-restarter"});
    api.insert(restarter, old);
    api.clear_writes();
    reconcile_control_plane(stored(&api, "blue-v1"), ctx)
        .await
        .expect("reconciles");
    assert_eq!(
        object_writes(&api),
        [
            "delete rbac.authorization.k8s.io/rolebindings shop/meshplane-blue-v1-restarter",
            "apply rbac.authorization.k8s.io/rolebindings shop/meshplane-blue-v1-restarter",
        ]
    );
    let now = api
        .get(
            restarter.0,
            restarter.1,
            Some("shop"),
            "meshplane-blue-v1-restarter",
        )
        .expect("re-created");
    assert_eq!(now["roleRef"]["kind"], "ClusterRole");
}

#[tokio::test]
async fn a_namespace_leaving_loses_only_its_bootstrap_and_reader_and_restarter_rbac() {
    let api = cluster();
    let ctx = context(api.client());
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    api.insert(NS, namespace("shop", json!({})));
    api.clear_writes();
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    let mut writes = object_writes(&api);
    writes.sort();
    assert_eq!(
        writes,
        [
            "apply /configmaps meshplane-blue/meshplane-blue-v1-members",
            // The instance's NetworkPolicy admits xDS from member namespaces: shop drops out.
            "apply networking.k8s.io/networkpolicies meshplane-blue/meshplane-blue-v1",
            "delete /configmaps shop/meshplane-blue-v1-bootstrap",
            "delete rbac.authorization.k8s.io/rolebindings shop/meshplane-blue-v1-reader",
            "delete rbac.authorization.k8s.io/rolebindings shop/meshplane-blue-v1-restarter",
            "delete rbac.authorization.k8s.io/roles shop/meshplane-blue-v1-reader",
        ]
    );
    // Told once, on the control plane and on shop; a resync tells nothing more.
    let left = |api: &FakeApi| -> Vec<(String, String)> {
        api.events()
            .iter()
            .filter(|e| e["reason"] == "NamespaceLeft")
            .map(|e| {
                (
                    e["regarding"]["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    e["note"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    };
    assert_eq!(
        left(&api),
        [
            (
                "MeshControlPlane".to_string(),
                "namespace shop left revision blue-v1 of tenant blue".to_string()
            ),
            (
                "Namespace".to_string(),
                "left revision blue-v1 of tenant blue".to_string()
            )
        ]
    );
    api.clear_writes();
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    assert!(api.events().is_empty(), "{:?}", api.events());
    // Another tenant's object and the unlabelled one are untouched.
    assert!(api
        .get("", "configmaps", Some("bank"), "meshplane-green-bootstrap")
        .is_some());
    assert!(api
        .get(
            "",
            "configmaps",
            Some("outsider"),
            "meshplane-blue-v1-bootstrap"
        )
        .is_some());
}

#[tokio::test]
async fn a_duplicate_revision_gets_a_condition_and_writes_no_object() {
    let api = cluster();
    api.insert(
        MCP,
        control_plane("blue-copy", "red", Some("blue-v1"), "2026-02-01T00:00:00Z"),
    );
    let ctx = context(api.client());
    reconcile_control_plane(stored(&api, "blue-copy"), ctx)
        .await
        .expect("reconciles");
    assert_eq!(object_writes(&api), Vec::<String>::new());
    let mcp = stored(&api, "blue-copy");
    assert_eq!(
        condition(&mcp, "Degraded"),
        ("True".into(), "RevisionConflict".into())
    );
    assert_eq!(condition(&mcp, "Reconciled").0, "False");
    assert!(api
        .events()
        .iter()
        .any(|e| e["reason"] == "RevisionConflict" && e["type"] == "Warning"));
}

/// A control plane naming another tenant's member namespace as its control
/// namespace (admitted while the admission check was down) gets a condition; the namespace is
/// not relabelled and stays a member of its tenant.
#[tokio::test]
async fn a_control_namespace_that_is_not_ours_is_never_taken() {
    let api = cluster();
    let mut thief = control_plane("red", "red", None, "2026-02-01T00:00:00Z");
    thief["spec"]["namespace"] = json!("shop");
    thief["spec"]["namespaceSelector"] = json!({});
    api.insert(MCP, thief);
    let ctx = context(api.client());
    reconcile_control_plane(stored(&api, "red"), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(object_writes(&api), Vec::<String>::new(), "nothing written");
    let red = stored(&api, "red");
    assert_eq!(
        condition(&red, "Reconciled"),
        ("False".into(), "ControlNamespaceNotOwned".into())
    );
    let shop = api.get("", "namespaces", None, "shop").expect("shop");
    assert_eq!(shop["metadata"]["labels"][names::REV_LABEL], "blue-stable");
    assert!(shop["metadata"]["labels"]
        .get(names::TENANT_LABEL)
        .is_none());
    // Its tenant keeps it.
    reconcile_control_plane(stored(&api, "blue-v1"), ctx)
        .await
        .expect("reconciles");
    let blue = stored(&api, "blue-v1");
    let members = blue
        .status
        .as_ref()
        .and_then(|s| s.members.as_ref())
        .map(|m| m.names.clone())
        .unwrap_or_default();
    assert!(members.contains(&"shop".to_string()), "{members:?}");
}

/// A namespace created in advance under the tenant's control namespace name,
/// with meshplane's labels (anyone who may create namespaces can set them), is never taken:
/// nothing is written into it, the tenant CA's key least of all. A namespace the operator
/// creates itself is recorded by UID, and that record is what later reconciles trust.
#[tokio::test]
async fn a_control_namespace_planted_in_advance_is_never_taken() {
    let api = cluster();
    api.insert(
        NS,
        namespace(
            "meshplane-blue",
            json!({names::MANAGED_BY_LABEL: names::MANAGED_BY_VALUE, names::TENANT_LABEL: "blue"}),
        ),
    );
    let ctx = context(api.client());
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(object_writes(&api), Vec::<String>::new(), "nothing written");
    assert!(
        api.names("secrets").is_empty(),
        "no CA key written anywhere"
    );
    let blue = stored(&api, "blue-v1");
    assert_eq!(
        condition(&blue, "Reconciled"),
        ("False".into(), "ControlNamespaceNotOwned".into())
    );
    assert_eq!(
        blue.status
            .as_ref()
            .and_then(|s| s.control_namespace_uid.clone()),
        None
    );

    // Handed over by the platform admin with its UID: taken, and the UID recorded.
    let planted = api
        .get("", "namespaces", None, "meshplane-blue")
        .expect("ns");
    let uid = planted["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let mut handed = api.get(MCP.0, MCP.1, None, "blue-v1").expect("mcp");
    handed["metadata"]["annotations"] = json!({names::ADOPT_CONTROL_NAMESPACE_ANNOTATION: uid});
    api.insert(MCP, handed);
    reconcile_control_plane(stored(&api, "blue-v1"), ctx)
        .await
        .expect("reconciles");
    let blue = stored(&api, "blue-v1");
    assert_eq!(
        blue.status
            .as_ref()
            .and_then(|s| s.control_namespace_uid.as_deref()),
        Some(uid.as_str())
    );
    assert!(api
        .names("secrets")
        .iter()
        .any(|s| s.starts_with("meshplane-blue/")));
}

#[tokio::test]
async fn the_control_namespace_the_operator_creates_is_recorded_by_uid() {
    let api = cluster();
    let ctx = context(api.client());
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    let ns = api
        .get("", "namespaces", None, "meshplane-blue")
        .expect("created");
    let uid = ns["metadata"]["uid"].as_str().expect("uid");
    let blue = stored(&api, "blue-v1");
    assert_eq!(
        blue.status
            .as_ref()
            .and_then(|s| s.control_namespace_uid.as_deref()),
        Some(uid)
    );
    assert!(api
        .writes()
        .iter()
        .any(|(verb, _, _, name)| verb == "create" && name == "meshplane-blue"));
    // Deleted and planted again under the same name: a new UID, refused from then on.
    api.remove("", "namespaces", None, "meshplane-blue");
    api.insert(
        NS,
        namespace(
            "meshplane-blue",
            json!({names::MANAGED_BY_LABEL: names::MANAGED_BY_VALUE, names::TENANT_LABEL: "blue"}),
        ),
    );
    let writes = api.writes().len();
    reconcile_control_plane(stored(&api, "blue-v1"), ctx)
        .await
        .expect("reconciles");
    assert_eq!(
        condition(&stored(&api, "blue-v1"), "Reconciled"),
        ("False".into(), "ControlNamespaceNotOwned".into())
    );
    assert!(
        api.writes()[writes..]
            .iter()
            .all(|(_, gp, _, _)| gp.starts_with("meshplane.io/")),
        "only the status is written"
    );
}

/// The tag `blue-stable` as stored now.
fn stored_tag(api: &FakeApi) -> Arc<meshplane_crds::MeshRevisionTag> {
    Arc::new(serde_json::from_value(api.get(TAGS.0, TAGS.1, None, "blue-stable").unwrap()).unwrap())
}

#[tokio::test]
async fn a_tag_moved_within_its_tenant_is_told_once() {
    let api = cluster();
    api.insert(
        MCP,
        control_plane("blue-v2", "blue", None, "2026-01-02T00:00:00Z"),
    );
    let ctx = context(api.client());
    reconcile_tag(stored_tag(&api), ctx.clone())
        .await
        .expect("reconciles");
    assert!(
        api.events().iter().all(|e| e["reason"] != "TagMoved"),
        "a first resolution is no move"
    );
    let mut moved = api.get(TAGS.0, TAGS.1, None, "blue-stable").unwrap();
    moved["spec"]["revision"] = json!("blue-v2");
    api.insert(TAGS, moved);
    api.clear_writes();
    reconcile_tag(stored_tag(&api), ctx.clone())
        .await
        .expect("reconciles");
    let told: Vec<Value> = api.events();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0]["reason"], "TagMoved");
    assert_eq!(told[0]["type"], "Normal");
    assert_eq!(told[0]["regarding"]["name"], "blue-stable");
    assert!(told[0]["note"]
        .as_str()
        .unwrap_or_default()
        .starts_with("tag blue-stable moved from revision blue-v1 to blue-v2"));
    // A resync of the moved tag tells nothing.
    api.clear_writes();
    reconcile_tag(stored_tag(&api), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(api.events(), Vec::<Value>::new());
}

#[tokio::test]
async fn a_tag_moved_to_another_tenant_is_refused_and_keeps_its_revision() {
    let api = cluster();
    api.insert(
        MCP,
        control_plane("green", "green", None, "2026-01-02T00:00:00Z"),
    );
    let ctx = context(api.client());
    reconcile_tag(stored_tag(&api), ctx.clone())
        .await
        .expect("reconciles");
    let status = stored_tag(&api).status.clone().unwrap();
    assert_eq!(
        (status.revision.as_deref(), status.tenant.as_deref()),
        (Some("blue-v1"), Some("blue"))
    );
    // Point it at green's revision.
    let mut moved = api.get(TAGS.0, TAGS.1, None, "blue-stable").unwrap();
    moved["spec"]["revision"] = json!("green");
    api.insert(TAGS, moved);
    reconcile_tag(stored_tag(&api), ctx.clone())
        .await
        .expect("reconciles");
    let status = stored_tag(&api).status.clone().unwrap();
    assert_eq!(
        (status.revision.as_deref(), status.tenant.as_deref()),
        (Some("blue-v1"), Some("blue"))
    );
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "TagMovedAcrossTenants")
    );
    assert!(
        api.events().iter().all(|e| e["reason"] != "TagMoved"),
        "a refused move is no move"
    );
    // blue-v1 still serves shop through the tag.
    reconcile_control_plane(stored(&api, "blue-v1"), ctx)
        .await
        .expect("reconciles");
    assert!(api
        .get(
            "",
            "configmaps",
            Some("shop"),
            "meshplane-blue-v1-bootstrap"
        )
        .is_some());
    assert!(api
        .get("", "configmaps", Some("shop"), "meshplane-green-bootstrap")
        .is_none());
}

#[tokio::test]
async fn deletion_waits_while_injected_pods_run_then_removes_webhooks_first() {
    let api = cluster();
    let ctx = context(api.client());
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    api.insert(("", "pods"), json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "shop", "annotations": {names::INJECTED_REVISION_ANNOTATION: "blue-v1"}}}));
    let mut deleting = api.get(MCP.0, MCP.1, None, "blue-v1").unwrap();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-03-01T00:00:00Z");
    api.insert(MCP, deleting);
    api.clear_writes();

    let err = reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect_err("waits");
    assert_eq!(err.reason(), "InUse");
    assert_eq!(object_writes(&api), Vec::<String>::new());
    assert_eq!(
        condition(&stored(&api, "blue-v1"), "InUse"),
        ("True".into(), "InUse".into())
    );
    assert!(api.events().iter().any(|e| e["reason"] == "InUse"));

    api.remove("", "pods", Some("shop"), "web-1");
    api.clear_writes();
    reconcile_control_plane(stored(&api, "blue-v1"), ctx)
        .await
        .expect("cleans up");
    let writes = object_writes(&api);
    assert!(
        writes[0].contains("mutatingwebhookconfigurations")
            && writes[1].contains("validatingwebhookconfigurations"),
        "{writes:?}"
    );
    let deployment_at = writes
        .iter()
        .position(|w| w.contains("deployments"))
        .unwrap();
    let bootstrap_at = writes
        .iter()
        .position(|w| w.contains("shop/meshplane-blue-v1-bootstrap"))
        .unwrap();
    assert!(bootstrap_at < deployment_at, "{writes:?}");
    // The operator's access binding goes last: it grants the rights to delete the instance.
    assert_eq!(
        writes.last().map(String::as_str),
        Some("delete rbac.authorization.k8s.io/rolebindings meshplane-blue/meshplane-blue-v1-operator"),
        "{writes:?}"
    );
    assert_eq!(api.forbidden(), [], "requests outside the operator's RBAC");
    assert!(api.names("deployments").is_empty());
    assert!(api
        .names("secrets")
        .iter()
        .all(|s| s.ends_with("/meshplane-ca")));
    assert!(api.names("clusterroles").is_empty());
    // Left alone: the control namespace (user config lives there) and objects not ours.
    assert!(api.get("", "namespaces", None, "meshplane-blue").is_some());
    assert!(api
        .get("", "configmaps", Some("bank"), "meshplane-green-bootstrap")
        .is_some());
    assert!(api
        .get(
            "",
            "configmaps",
            Some("outsider"),
            "meshplane-blue-v1-bootstrap"
        )
        .is_some());
    // The finalizer is gone.
    let finalizers =
        api.get(MCP.0, MCP.1, None, "blue-v1").unwrap()["metadata"]["finalizers"].clone();
    assert_eq!(finalizers, json!([]));
}

#[tokio::test]
async fn the_webhook_certificate_rotates_when_a_third_of_its_validity_remains() {
    use std::sync::atomic::{AtomicI64, Ordering};
    let api = cluster();
    let now = Arc::new(AtomicI64::new(1_800_000_000));
    let clock_now = now.clone();
    let clock = Arc::new(move || {
        time::OffsetDateTime::from_unix_timestamp(clock_now.load(Ordering::SeqCst)).expect("valid")
    });
    let ctx = Arc::new(Context::new(
        api.client(),
        Arc::new(Metrics::default()),
        Settings::default(),
        clock,
    ));
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    let secret = |api: &FakeApi| {
        api.get(
            "",
            "secrets",
            Some("meshplane-blue"),
            "meshplane-blue-v1-webhook-tls",
        )
        .unwrap()
    };
    let first = secret(&api);

    // 59 of 90 days later: still more than a third left, nothing is written.
    now.fetch_add(59 * 86_400, Ordering::SeqCst);
    api.clear_writes();
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(object_writes(&api), Vec::<String>::new());

    // 61 days: rotated; the webhooks get the new bundle, which still trusts the old CA.
    now.fetch_add(2 * 86_400, Ordering::SeqCst);
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    let rotated = secret(&api);
    assert_ne!(rotated["data"]["tls.crt"], first["data"]["tls.crt"]);
    let hook = api
        .get(
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            None,
            "meshplane-blue-v1-validator",
        )
        .unwrap();
    assert_eq!(
        hook["webhooks"][0]["clientConfig"]["caBundle"],
        rotated["data"]["ca.crt"]
    );
    use base64::Engine as _;
    let decode = |v: &Value| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    assert!(decode(&rotated["data"]["ca.crt"]).contains(decode(&first["data"]["ca.crt"]).trim()));
    assert!(api
        .events()
        .iter()
        .any(|e| e["reason"] == "CertificateRotated"));
}

/// What an instance pod's mark in the proxies ConfigMap (contract 3) turns into on the
/// MeshControlPlane.
struct PodMark {
    /// The mark's key is the pod's name with this suffix.
    suffix: &'static str,
    /// The live pod's mark and a gone pod's.
    live: &'static str,
    gone: &'static str,
    condition: &'static str,
    /// The condition's reason while no pod is marked, and while one is.
    clear: &'static str,
    raised: &'static str,
    /// What the condition's message says of the live pod (after its name), and a word of the
    /// gone pod's mark it must not repeat.
    says: &'static str,
    not: &'static str,
}

/// A live instance pod's mark turns the condition True, naming the pod, with one Warning
/// Event; a gone pod's mark counts for nothing and leaves with its count; a resync while
/// marked writes nothing; once the mark is gone the condition is False again.
async fn a_pod_mark_raises_its_condition_with_one_warning(mark: PodMark) {
    let api = cluster();
    let ctx = context(api.client());
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(
        condition(&stored(&api, "blue-v1"), mark.condition),
        ("False".into(), mark.clear.into())
    );
    let pod = "meshplane-blue-v1-xds-7f9c-abcde";
    let gone = "meshplane-blue-v1-xds-gone";
    api.insert(("", "pods"), json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": "meshplane-blue",
                     "labels": {"app.kubernetes.io/name": "meshplane-xds", names::REVISION_LABEL: "blue-v1"}}}));
    let proxies = |data: Value| {
        let mut cm = api
            .get(
                "",
                "configmaps",
                Some("meshplane-blue"),
                "meshplane-blue-v1-proxies",
            )
            .expect("proxies ConfigMap");
        cm["data"] = data;
        api.insert(("", "configmaps"), cm);
    };
    proxies(json!({
        pod: "2",
        format!("{pod}{}", mark.suffix): mark.live,
        gone: "5",
        format!("{gone}{}", mark.suffix): mark.gone,
    }));
    api.clear_writes();
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    let mcp = stored(&api, "blue-v1");
    assert_eq!(
        condition(&mcp, mark.condition),
        ("True".into(), mark.raised.into())
    );
    let message = mcp
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == mark.condition))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&format!("{pod} {}", mark.says)) && !message.contains(mark.not),
        "{message}"
    );
    assert_eq!(
        mcp.status.as_ref().and_then(|s| s.connected_proxies),
        Some(2)
    );
    let warnings: Vec<Value> = api
        .events()
        .into_iter()
        .filter(|e| e["type"] == "Warning" && e["reason"] == mark.condition)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0]["note"]
            .as_str()
            .is_some_and(|n| n.contains(pod)),
        "{warnings:?}"
    );
    let left: BTreeSet<String> = api
        .get(
            "",
            "configmaps",
            Some("meshplane-blue"),
            "meshplane-blue-v1-proxies",
        )
        .and_then(|cm| cm["data"].as_object().map(|d| d.keys().cloned().collect()))
        .unwrap_or_default();
    assert_eq!(
        left,
        BTreeSet::from([pod.to_string(), format!("{pod}{}", mark.suffix)]),
        "the gone pod's count and mark are removed"
    );

    // Still marked at the next resync: nothing is written, no second Warning.
    api.clear_writes();
    reconcile_control_plane(stored(&api, "blue-v1"), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(api.writes(), Vec::new());
    assert!(api.events().is_empty());

    // The pod drops its mark.
    proxies(json!({pod: "2"}));
    reconcile_control_plane(stored(&api, "blue-v1"), ctx)
        .await
        .expect("reconciles");
    assert_eq!(
        condition(&stored(&api, "blue-v1"), mark.condition),
        ("False".into(), mark.clear.into())
    );
    assert!(api.events().iter().all(|e| e["type"] != "Warning"));
}

/// An instance pod serving the last members it could read says since when and why.
#[tokio::test]
async fn an_instance_serving_stale_members_raises_members_stale_with_one_warning() {
    a_pod_mark_raises_its_condition_with_one_warning(PodMark {
        suffix: ".members-stale",
        live:
            "2026-12-02T03:40:00Z the members ConfigMap is unreadable: key \"members\" is missing",
        gone: "2026-12-01T00:00:00Z the members ConfigMap was deleted",
        condition: "MembersStale",
        clear: "MembersCurrent",
        raised: "LastKnownMembers",
        says: "since 2026-12-02T03:40:00Z",
        not: "xds-gone",
    })
    .await;
}

/// An instance pod serving without what the API server refuses it to read names each
/// namespace/kind it cannot read.
#[tokio::test]
async fn an_instance_with_refused_watches_raises_watches_refused_with_one_warning() {
    a_pod_mark_raises_its_condition_with_one_warning(PodMark {
        suffix: ".refused-watches",
        live: "bank/EndpointSlice\nbank/Service",
        gone: "vault/Service",
        condition: "WatchesRefused",
        clear: "AllWatchesListed",
        raised: "ReadAccessRefused",
        says: "cannot read bank/EndpointSlice, bank/Service",
        not: "vault",
    })
    .await;
}
