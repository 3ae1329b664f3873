//! ValidatingAdmissionPolicies as the stand-in's admission chain applies them: the shipped
//! guardrails on the operator's writes (config/rbac/operator_guardrails.yaml, installed with
//! the rest of config/rbac exactly as shipped), and the policy semantics they rely on.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;
use meshplane_kube_standin::{Identity, StandIn, StandInHandle, StandInOptions};
use serde_json::{json, Value};

const RBAC_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/rbac");

fn resource_of(object: &DynamicObject) -> ApiResource {
    let types = object.types.clone().expect("typed object");
    let gvk = GroupVersionKind::try_from(&types).expect("group/version/kind");
    let plural = match gvk.kind.as_str() {
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicies".to_string(),
        kind => format!("{}s", kind.to_lowercase()),
    };
    ApiResource::from_gvk_with_plural(&gvk, &plural)
}

fn api_for(client: &Client, object: &DynamicObject) -> Api<DynamicObject> {
    let resource = resource_of(object);
    match &object.metadata.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

async fn create(client: &Client, object: Value) -> Result<DynamicObject, kube::Error> {
    let object: DynamicObject = serde_json::from_value(object).expect("object");
    api_for(client, &object)
        .create(&PostParams::default(), &object)
        .await
}

/// The refusal's code and message; panics when the request was admitted.
fn refused(result: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A stand-in with config/rbac installed as shipped, the operator's namespace, a namespace
/// that joined tenant blue (`shop`), one that did not (`victim`, holding a ConfigMap that is
/// not the operator's), and blue's control namespace created by the operator itself.
async fn cluster() -> (StandInHandle, Client, Client) {
    let handle = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let admin = handle.client(&Identity::Admin).await.expect("admin client");
    let operator = handle.client(&Identity::Operator).await.expect("client");
    for ns in [
        json!({"metadata": {"name": "meshplane-system"}}),
        json!({"metadata": {"name": "shop", "labels": {"meshplane.io/rev": "blue-v1"}}}),
        json!({"metadata": {"name": "victim"}}),
    ] {
        let mut ns = ns;
        ns["apiVersion"] = json!("v1");
        ns["kind"] = json!("Namespace");
        create(&admin, ns).await.expect("namespace");
    }
    let mut files: Vec<_> = std::fs::read_dir(RBAC_DIR)
        .expect("config/rbac")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml")
        })
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for doc in serde_saphyr::from_multiple::<Value>(&text).expect("yaml") {
            create(&admin, doc)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        }
    }
    create(
        &admin,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "victim"}, "data": {"Corefile": "."}}),
    )
    .await
    .expect("configmap");
    create(
        &operator,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "blue-system",
            "labels": {"app.kubernetes.io/managed-by": "meshplane", "meshplane.io/tenant": "blue"}}}),
    )
    .await
    .expect("the operator creates a control namespace");
    (handle, admin, operator)
}

fn binding(kind: &str, namespace: Option<&str>, role: &str) -> Value {
    let mut metadata = json!({"name": format!("probe-{role}"),
        "labels": {"app.kubernetes.io/managed-by": "meshplane"}});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "meshplane-operator", "namespace": "meshplane-system"}]})
}

#[tokio::test]
async fn the_operator_binds_its_secret_writing_role_only_in_control_namespaces() {
    let (_handle, admin, operator) = cluster().await;
    // Outside any tenant the operator creates nothing; in a member namespace it may bind only
    // the per-namespace roles.
    for (ns, why) in [
        ("victim", "only in member namespaces and control namespaces"),
        (
            "kube-system",
            "only in member namespaces and control namespaces",
        ),
        ("shop", "only in a tenant's control namespace"),
    ] {
        let (code, message) = refused(
            create(
                &operator,
                binding("RoleBinding", Some(ns), "meshplane-control-namespace"),
            )
            .await,
        );
        assert_eq!(code, 422, "{ns}: {message}");
        assert!(
            message.contains("ValidatingAdmissionPolicy 'meshplane-operator-guardrails'")
                && message.contains(why),
            "{ns}: {message}"
        );
    }
    create(
        &operator,
        binding(
            "RoleBinding",
            Some("blue-system"),
            "meshplane-control-namespace",
        ),
    )
    .await
    .expect("bound in the tenant's control namespace");
    let (_, message) = refused(
        create(
            &operator,
            binding("ClusterRoleBinding", None, "meshplane-control-namespace"),
        )
        .await,
    );
    assert!(message.contains("never bound cluster-wide"), "{message}");
    // A platform admin is not confined by the operator's guardrails.
    create(
        &admin,
        binding("RoleBinding", Some("victim"), "meshplane-control-namespace"),
    )
    .await
    .expect("admin binds where it likes");
}

#[tokio::test]
async fn the_operator_binds_per_namespace_roles_only_in_mesh_namespaces() {
    let (_handle, _admin, operator) = cluster().await;
    for role in [
        "meshplane-workload-restarter",
        "meshplane-gateway-namespace",
        "meshplane-gateway-credentials",
    ] {
        let (_, message) =
            refused(create(&operator, binding("RoleBinding", Some("victim"), role)).await);
        assert!(
            message.contains("only in member namespaces and control namespaces"),
            "{role}: {message}"
        );
        create(&operator, binding("RoleBinding", Some("shop"), role))
            .await
            .unwrap_or_else(|e| panic!("{role} in a member namespace: {e}"));
    }
}

#[tokio::test]
async fn the_operator_changes_only_its_own_objects() {
    let (_handle, admin, operator) = cluster().await;
    let victim: Api<ConfigMap> = Api::namespaced(operator.clone(), "victim");
    let patch = json!({"data": {"Corefile": "hijacked"}});
    let (code, message) = refused(
        victim
            .patch("coredns", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("managed-by=meshplane"), "{message}");
    refused(victim.delete("coredns", &DeleteParams::default()).await);
    let kept: Api<ConfigMap> = Api::namespaced(admin, "victim");
    let data = kept.get("coredns").await.expect("still there").data;
    assert_eq!(
        data.and_then(|d| d.get("Corefile").cloned()).as_deref(),
        Some(".")
    );

    // Its own ConfigMap in a member namespace: created, changed and deleted.
    let shop: Api<ConfigMap> = Api::namespaced(operator.clone(), "shop");
    let own = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bootstrap",
        "labels": {"app.kubernetes.io/managed-by": "meshplane"}}, "data": {"a": "1"}});
    shop.create(
        &PostParams::default(),
        &serde_json::from_value(own.clone()).expect("configmap"),
    )
    .await
    .expect("created");
    shop.patch(
        "bootstrap",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"a": "2"}})),
    )
    .await
    .expect("patched");
    shop.delete("bootstrap", &DeleteParams::default())
        .await
        .expect("deleted");
    // Not even its own kind of object where no tenant lives.
    let mut planted = own;
    planted["metadata"]["namespace"] = json!("victim");
    let (_, message) = refused(create(&operator, planted).await);
    assert!(
        message.contains("only in member namespaces and control namespaces"),
        "{message}"
    );
}

#[tokio::test]
async fn the_operator_cannot_relabel_namespaces_into_or_out_of_a_tenant() {
    let (_handle, admin, operator) = cluster().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(operator.clone());
    let join = json!({"metadata": {"labels": {"meshplane.io/rev": "blue-v1"}}});
    let (_, message) = refused(
        namespaces
            .patch("victim", &PatchParams::default(), &Patch::Merge(&join))
            .await,
    );
    assert!(message.contains("control namespaces"), "{message}");
    let to_green = json!({"metadata": {"labels": {"meshplane.io/tenant": "green"}}});
    refused(
        namespaces
            .patch(
                "blue-system",
                &PatchParams::default(),
                &Patch::Merge(&to_green),
            )
            .await,
    );
    let note = json!({"metadata": {"annotations": {"meshplane.io/note": "x"}}});
    namespaces
        .patch("blue-system", &PatchParams::default(), &Patch::Merge(&note))
        .await
        .expect("its own control namespace");
    // Handed over by a platform admin: the operator may label it as the tenant's.
    let admin_ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin);
    let hand_over =
        json!({"metadata": {"annotations": {"meshplane.io/adopt-control-namespace": "uid"}}});
    admin_ns
        .patch("victim", &PatchParams::default(), &Patch::Merge(&hand_over))
        .await
        .expect("admin annotates");
    let adopt = json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "meshplane",
        "meshplane.io/tenant": "blue"}}});
    namespaces
        .patch("victim", &PatchParams::default(), &Patch::Merge(&adopt))
        .await
        .expect("adopted");
}

/// A bound policy with `Warn` only, a failing expression under `failurePolicy: Ignore`, and
/// an unbound policy never refuse; `Deny` with a false validation does, with its message.
#[tokio::test]
async fn policies_refuse_only_through_a_deny_binding() {
    let handle = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let admin = handle.client(&Identity::Admin).await.expect("admin client");
    let policy = |name: &str, expression: &str, failure: &str| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name}, "spec": {"failurePolicy": failure,
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["configmaps"]}]},
            "validations": [{"expression": expression, "message": format!("{name} says no")}]}})
    };
    let bind = |name: &str, action: &str| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": [action]}})
    };
    let no_a = "!has(object.data) || !('a' in object.data)";
    create(&admin, policy("unbound", no_a, "Fail"))
        .await
        .expect("policy");
    create(&admin, policy("warn", no_a, "Fail"))
        .await
        .expect("policy");
    create(&admin, bind("warn", "Warn")).await.expect("binding");
    create(
        &admin,
        policy("ignored", "object.data.missing == 'x'", "Ignore"),
    )
    .await
    .expect("policy");
    create(&admin, bind("ignored", "Deny"))
        .await
        .expect("binding");
    let cm = |name: &str, key: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"}, "data": {key: "1"}})
    };
    create(&admin, cm("one", "a")).await.expect("admitted");
    create(&admin, policy("deny", no_a, "Fail"))
        .await
        .expect("policy");
    create(&admin, bind("deny", "Deny")).await.expect("binding");
    let (code, message) = refused(create(&admin, cm("two", "a")).await);
    assert_eq!(code, 422);
    assert_eq!(
        message,
        "ValidatingAdmissionPolicy 'deny' with binding 'deny' denied request: deny says no"
    );
    create(&admin, cm("three", "b")).await.expect("admitted");
}

fn webhook_configuration(kind: &str, name: &str, managed: bool, webhook: Value) -> Value {
    let mut metadata = json!({"name": name});
    if managed {
        metadata["labels"] = json!({"app.kubernetes.io/managed-by": "meshplane"});
    }
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": metadata,
        "webhooks": [webhook]})
}

fn webhook(name: &str, client: Value, rules: Value, namespace_selector: Value) -> Value {
    json!({"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "clientConfig": client, "rules": rules, "namespaceSelector": namespace_selector})
}

/// Webhook configurations are not the operator's to edit unless it made them, and those it
/// makes can only call a Service about pods of mesh namespaces or the meshplane API.
#[tokio::test]
async fn the_operator_edits_only_its_own_webhook_configurations() {
    let (_handle, admin, operator) = cluster().await;
    let istiod =
        json!({"service": {"name": "istiod", "namespace": "istio-system", "path": "/validate"}});
    let pods = json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]);
    let istio_config = json!([{"apiGroups": ["networking.istio.io"], "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE"], "resources": ["*"]}]);
    create(
        &admin,
        webhook_configuration(
            "ValidatingWebhookConfiguration",
            "istio-validator-istio-system",
            false,
            webhook(
                "rev.validation.istio.io",
                istiod.clone(),
                istio_config.clone(),
                json!({}),
            ),
        ),
    )
    .await
    .expect("Istio's validator");
    let resource = kube::core::ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
        ),
        "validatingwebhookconfigurations",
    );
    let validators: Api<DynamicObject> = Api::all_with(operator.clone(), &resource);
    let mut hook = webhook(
        "rev.validation.istio.io",
        istiod.clone(),
        istio_config.clone(),
        json!({}),
    );
    hook["failurePolicy"] = json!("Ignore");
    let open_up = json!({"webhooks": [hook]});
    let (code, message) = refused(
        validators
            .patch(
                "istio-validator-istio-system",
                &PatchParams::default(),
                &Patch::Merge(&open_up),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("managed-by=meshplane"), "{message}");
    refused(
        validators
            .delete("istio-validator-istio-system", &DeleteParams::default())
            .await,
    );
    // Labelling a new one as its own does not widen what it may make.
    let mesh_only = json!({"matchExpressions": [{"key": "meshplane.io/rev", "operator": "In", "values": ["blue-v1"]}]});
    let own = json!({"service": {"name": "meshplane-blue-v1", "namespace": "blue-system", "path": "/inject"}});
    for (kind, name, hook, why) in [
        (
            "MutatingWebhookConfiguration",
            "istio-sidecar-injector",
            webhook(
                "a.meshplane.io",
                own.clone(),
                pods.clone(),
                mesh_only.clone(),
            ),
            "named meshplane-*",
        ),
        (
            "MutatingWebhookConfiguration",
            "meshplane-blue-v1-injector",
            webhook(
                "a.meshplane.io",
                json!({"url": "https://198.18.0.10/inject"}),
                pods.clone(),
                mesh_only.clone(),
            ),
            "call only Services",
        ),
        (
            "MutatingWebhookConfiguration",
            "meshplane-blue-v1-injector",
            webhook("a.meshplane.io", own.clone(), pods.clone(), json!({})),
            "namespaces that joined a revision",
        ),
        (
            "MutatingWebhookConfiguration",
            "meshplane-blue-v1-injector",
            webhook(
                "a.meshplane.io",
                own.clone(),
                json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["secrets"]}]),
                mesh_only.clone(),
            ),
            "only pod creation",
        ),
        (
            "ValidatingWebhookConfiguration",
            "meshplane-blue-v1-validator",
            webhook(
                "a.meshplane.io",
                own.clone(),
                json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["secrets"]}]),
                mesh_only.clone(),
            ),
            "only the meshplane API",
        ),
    ] {
        let (_, message) =
            refused(create(&operator, webhook_configuration(kind, name, true, hook)).await);
        assert!(message.contains(why), "{name}: {message}");
    }
    // What it does make: created, changed and deleted.
    let validator = webhook_configuration(
        "ValidatingWebhookConfiguration",
        "meshplane-blue-v1-validator",
        true,
        webhook(
            "blue-v1.validate.meshplane.io",
            own,
            json!([{"apiGroups": ["networking.meshplane.io"], "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["sidecars"]}]),
            mesh_only,
        ),
    );
    create(&operator, validator)
        .await
        .expect("its own validator");
    let note = json!({"metadata": {"annotations": {"meshplane.io/note": "x"}}});
    validators
        .patch(
            "meshplane-blue-v1-validator",
            &PatchParams::default(),
            &Patch::Merge(&note),
        )
        .await
        .expect("changed");
    validators
        .delete("meshplane-blue-v1-validator", &DeleteParams::default())
        .await
        .expect("deleted");
}
