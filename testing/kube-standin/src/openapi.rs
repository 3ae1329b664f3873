//! OpenAPI v3 documents, one per group/version, shaped as kube-apiserver serves them: the
//! resource paths with their operations (each with its `x-kubernetes-group-version-kind`, its
//! query parameters such as `fieldValidation`, and responses referring to the kind's schema),
//! and `components.schemas` holding the schemas those refer to. `kubectl explain` reads the
//! schemas; `kubectl apply` reads the PATCH operations to choose server-side field validation.
//!
//! - Custom resources: the schema of each served version is its stored `openAPIV3Schema`,
//!   named by the reversed group, the version and the kind (`io.meshplane.v1alpha1.MeshControlPlane`)
//!   with `x-kubernetes-group-version-kind`, and with `apiVersion`, `kind` and `metadata`
//!   (referring to `ObjectMeta`) set as the API server sets them; plus its `<Kind>List`.
//! - Built-in kinds: the Kubernetes schemas compiled into k8s-openapi (generated once), named
//!   as Kubernetes names them (`io.k8s.api.core.v1.Pod`), with what they refer to.
//!
//! Differences from the real documents: no `x-kubernetes-patch-strategy`/`-merge-key`
//! markers in the built-in schemas, so the PATCH operations do not offer
//! `application/strategic-merge-patch+json` and `kubectl apply` keeps computing strategic
//! merge patches from its compiled-in types; no watch, proxy or status-only operations beyond
//! the `/status` subresource; no `/openapi/v2`.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use k8s_openapi::api;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, Status};
use k8s_openapi::schemars::generate::SchemaSettings;
use k8s_openapi::schemars::JsonSchema;
use serde_json::{json, Map, Value};

use super::resources::ResourceType;
use super::schema;

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const REF_PREFIX: &str = "#/components/schemas/";

const API_VERSION_DESCRIPTION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESCRIPTION: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DESCRIPTION: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_METADATA_DESCRIPTION: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#lists-and-simple-lists";

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("{REF_PREFIX}{name}")})
}

/// A reference with a description beside it, as OpenAPI 3.0 allows it (inside `allOf`).
fn described_ref(name: &str, description: &str) -> Value {
    json!({"allOf": [schema_ref(name)], "description": description, "default": {}})
}

/// The built-in kinds' schemas, and which schema is which kind.
struct Builtins {
    schemas: Map<String, Value>,
    kinds: Vec<(&'static str, &'static str, &'static str, String)>,
}

fn builtins() -> &'static Builtins {
    static BUILTINS: OnceLock<Builtins> = OnceLock::new();
    BUILTINS.get_or_init(|| {
        let mut generator = SchemaSettings::openapi3().into_generator();
        let mut kinds = Vec::new();
        macro_rules! kind {
            ($group:expr, $version:expr, $kind:expr, $t:ty) => {{
                generator.subschema_for::<$t>();
                kinds.push(($group, $version, $kind, <$t as JsonSchema>::schema_name().into_owned()));
            }};
        }
        kind!("", "v1", "Namespace", api::core::v1::Namespace);
        kind!("", "v1", "Pod", api::core::v1::Pod);
        kind!("", "v1", "Service", api::core::v1::Service);
        kind!("", "v1", "ConfigMap", api::core::v1::ConfigMap);
        kind!("", "v1", "Secret", api::core::v1::Secret);
        kind!("", "v1", "ServiceAccount", api::core::v1::ServiceAccount);
        kind!("", "v1", "Event", api::core::v1::Event);
        kind!("events.k8s.io", "v1", "Event", api::events::v1::Event);
        kind!("apps", "v1", "Deployment", api::apps::v1::Deployment);
        kind!("apps", "v1", "ReplicaSet", api::apps::v1::ReplicaSet);
        kind!("apps", "v1", "StatefulSet", api::apps::v1::StatefulSet);
        kind!("apps", "v1", "DaemonSet", api::apps::v1::DaemonSet);
        kind!("discovery.k8s.io", "v1", "EndpointSlice", api::discovery::v1::EndpointSlice);
        kind!("policy", "v1", "PodDisruptionBudget", api::policy::v1::PodDisruptionBudget);
        kind!("networking.k8s.io", "v1", "NetworkPolicy", api::networking::v1::NetworkPolicy);
        kind!("rbac.authorization.k8s.io", "v1", "Role", api::rbac::v1::Role);
        kind!("rbac.authorization.k8s.io", "v1", "RoleBinding", api::rbac::v1::RoleBinding);
        kind!("rbac.authorization.k8s.io", "v1", "ClusterRole", api::rbac::v1::ClusterRole);
        kind!(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            api::rbac::v1::ClusterRoleBinding
        );
        kind!(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
            api::admissionregistration::v1::MutatingWebhookConfiguration
        );
        kind!(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            api::admissionregistration::v1::ValidatingWebhookConfiguration
        );
        kind!(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
            api::admissionregistration::v1::ValidatingAdmissionPolicy
        );
        kind!(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            api::admissionregistration::v1::ValidatingAdmissionPolicyBinding
        );
        kind!("coordination.k8s.io", "v1", "Lease", api::coordination::v1::Lease);
        kind!(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition
        );
        kind!("authentication.k8s.io", "v1", "TokenReview", api::authentication::v1::TokenReview);
        kind!(
            "authorization.k8s.io",
            "v1",
            "SelfSubjectAccessReview",
            api::authorization::v1::SelfSubjectAccessReview
        );
        kind!(
            "authorization.k8s.io",
            "v1",
            "SubjectAccessReview",
            api::authorization::v1::SubjectAccessReview
        );
        generator.subschema_for::<ObjectMeta>();
        generator.subschema_for::<ListMeta>();
        generator.subschema_for::<Status>();
        let mut schemas = generator.take_definitions(true);
        for (group, version, kind, name) in &kinds {
            if let Some(Value::Object(s)) = schemas.get_mut(name) {
                s.insert(
                    "x-kubernetes-group-version-kind".into(),
                    json!([{"group": group, "version": version, "kind": kind}]),
                );
            }
        }
        Builtins { schemas, kinds }
    })
}

/// The schema name of a custom resource kind: the reversed group, the version and the kind
/// (`meshplane.io`, `v1alpha1`, `MeshControlPlane` → `io.meshplane.v1alpha1.MeshControlPlane`).
pub fn custom_schema_name(group: &str, version: &str, kind: &str) -> String {
    let mut parts: Vec<&str> = group.split('.').collect();
    parts.reverse();
    format!("{}.{version}.{kind}", parts.join("."))
}

/// A custom resource version's schema as the API server publishes it: the stored
/// `openAPIV3Schema` (or any object when there is none) with `apiVersion`, `kind` and
/// `metadata` set and `x-kubernetes-group-version-kind`.
pub fn custom_kind_schema(crd: &Value, t: &ResourceType) -> Value {
    let mut s = match schema::version_schema(crd, &t.version) {
        Some(stored) => {
            let mut s = stored.clone();
            if !s.is_object() {
                s = json!({"type": "object"});
            }
            let props = s
                .as_object_mut()
                .map(|o| o.entry("properties").or_insert_with(|| json!({})));
            if let Some(Value::Object(props)) = props {
                props.insert(
                    "apiVersion".into(),
                    json!({"type": "string", "description": API_VERSION_DESCRIPTION}),
                );
                props.insert(
                    "kind".into(),
                    json!({"type": "string", "description": KIND_DESCRIPTION}),
                );
                props.insert(
                    "metadata".into(),
                    described_ref(OBJECT_META, METADATA_DESCRIPTION),
                );
            }
            s
        }
        None => json!({"type": "object"}),
    };
    s["x-kubernetes-group-version-kind"] =
        json!([{"group": t.group, "version": t.version, "kind": t.kind}]);
    s
}

fn list_schema(t: &ResourceType, item: &str) -> Value {
    json!({
        "description": format!("{}List is a list of {}", t.kind, t.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION_DESCRIPTION},
            "kind": {"type": "string", "description": KIND_DESCRIPTION},
            "items": {
                "type": "array",
                "description": format!("List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md", t.plural),
                "items": {"allOf": [schema_ref(item)], "default": {}},
            },
            "metadata": described_ref(LIST_META, LIST_METADATA_DESCRIPTION),
        },
        "x-kubernetes-group-version-kind": [{"group": t.group, "version": t.version, "kind": format!("{}List", t.kind)}],
    })
}

/// The operation id stem of a group/version as the API server spells it (`CoreV1`, `AppsV1`,
/// `RbacAuthorizationV1`, `MeshplaneIoV1alpha1`).
fn operation_stem(group: &str, version: &str) -> String {
    let capital = |s: &str| {
        let mut c = s.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    let group = group.strip_suffix(".k8s.io").unwrap_or(group);
    let group = if group.is_empty() {
        "Core".to_string()
    } else {
        group.split(['.', '-']).map(capital).collect()
    };
    format!("{group}{}", capital(version))
}

fn query(name: &str) -> Value {
    let type_ = match name {
        "force" | "watch" | "allowWatchBookmarks" | "sendInitialEvents" => "boolean",
        "limit" | "timeoutSeconds" | "gracePeriodSeconds" => "integer",
        _ => "string",
    };
    json!({"name": name, "in": "query", "uniqueItems": true, "schema": {"type": type_}})
}

fn path_params(namespaced: bool, named: bool) -> Value {
    let mut params = Vec::new();
    if named {
        params.push(json!({"name": "name", "in": "path", "required": true, "description": "name of the resource", "schema": {"type": "string", "uniqueItems": true}}));
    }
    if namespaced {
        params.push(json!({"name": "namespace", "in": "path", "required": true, "description": "object name and auth scope, such as for teams and projects", "schema": {"type": "string", "uniqueItems": true}}));
    }
    params.push(json!({"name": "pretty", "in": "query", "description": "If 'true', then the output is pretty printed.", "schema": {"type": "string", "uniqueItems": true}}));
    Value::Array(params)
}

const LIST_PARAMS: &[&str] = &[
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
];
const WRITE_PARAMS: &[&str] = &["dryRun", "fieldManager", "fieldValidation"];
const PATCH_PARAMS: &[&str] = &["dryRun", "fieldManager", "fieldValidation", "force"];
const DELETE_PARAMS: &[&str] = &["dryRun", "gracePeriodSeconds", "propagationPolicy"];

/// One operation of `t`, answering 200 with the schema `response` refers to.
fn operation(
    t: &ResourceType,
    action: &str,
    id: String,
    params: &[&str],
    response: Option<&str>,
    body: Option<&[&str]>,
) -> Value {
    let ok = match response {
        Some(name) => json!({"description": "OK", "content": {
            "application/json": {"schema": schema_ref(name)},
            "application/yaml": {"schema": schema_ref(name)},
        }}),
        None => json!({"description": "OK"}),
    };
    let mut op = json!({
        "operationId": id,
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": t.group, "version": t.version, "kind": t.kind},
        "parameters": params.iter().map(|p| query(p)).collect::<Vec<_>>(),
        "responses": {"200": ok, "401": {"description": "Unauthorized"}},
    });
    if let (Some(types), Some(name)) = (body, response) {
        let content: Map<String, Value> = types
            .iter()
            .map(|ct| {
                let schema = if ct.contains("patch") {
                    json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."})
                } else {
                    schema_ref(name)
                };
                (ct.to_string(), json!({"schema": schema}))
            })
            .collect();
        op["requestBody"] = json!({"required": true, "content": content});
    }
    op
}

/// The paths of one resource type and their operations.
fn resource_paths(
    t: &ResourceType,
    kind: Option<&str>,
    list: Option<&str>,
    paths: &mut Map<String, Value>,
) {
    let base = format!("/{}", gv_path(&t.group, &t.version));
    let stem = operation_stem(&t.group, &t.version);
    let scope = if t.namespaced { "Namespaced" } else { "" };
    let collection = if t.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", t.plural)
    } else {
        format!("{base}/{}", t.plural)
    };
    let json_body: &[&str] = &["application/json", "application/yaml"];
    let id = |verb: &str, suffix: &str| format!("{verb}{stem}{scope}{}{suffix}", t.kind);
    if t.create_only {
        paths.insert(
            collection,
            json!({
                "post": operation(t, "post", format!("create{stem}{}", t.kind), WRITE_PARAMS, kind, Some(json_body)),
                "parameters": path_params(false, false),
            }),
        );
        return;
    }
    paths.insert(
        collection.clone(),
        json!({
            "get": operation(t, "list", id("list", ""), LIST_PARAMS, list, None),
            "post": operation(t, "post", id("create", ""), WRITE_PARAMS, kind, Some(json_body)),
            "delete": operation(t, "deletecollection", id("deleteCollection", ""), DELETE_PARAMS, None, None),
            "parameters": path_params(t.namespaced, false),
        }),
    );
    if t.namespaced {
        paths.insert(
            format!("{base}/{}", t.plural),
            json!({
                "get": operation(t, "list", format!("list{stem}{}ForAllNamespaces", t.kind), LIST_PARAMS, list, None),
                "parameters": path_params(false, false),
            }),
        );
    }
    // Custom resources take JSON and merge patches and apply; built-in kinds also take
    // strategic merge patches, left out here (see the module doc).
    let patch_body: &[&str] = &[
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/apply-patch+yaml",
    ];
    let mut item_paths = vec![(format!("{collection}/{{name}}"), "")];
    if t.has_status {
        item_paths.push((format!("{collection}/{{name}}/status"), "Status"));
    }
    for (path, suffix) in item_paths {
        let mut item = json!({
            "get": operation(t, "get", id("read", suffix), &[], kind, None),
            "put": operation(t, "put", id("replace", suffix), WRITE_PARAMS, kind, Some(json_body)),
            "patch": operation(t, "patch", id("patch", suffix), PATCH_PARAMS, kind, Some(patch_body)),
            "parameters": path_params(t.namespaced, true),
        });
        if suffix.is_empty() {
            item["delete"] = operation(
                t,
                "delete",
                id("delete", ""),
                DELETE_PARAMS,
                Some(STATUS),
                None,
            );
        }
        paths.insert(path, item);
    }
}

/// Adds to `schemas` the built-in schemas that what it holds refers to, transitively.
fn add_referenced(schemas: &mut Map<String, Value>, available: &Map<String, Value>) {
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                for (k, v) in o {
                    match (k.as_str(), v) {
                        ("$ref", Value::String(r)) => {
                            if let Some(name) = r.strip_prefix(REF_PREFIX) {
                                out.push(name.to_string());
                            }
                        }
                        _ => refs(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut pending = Vec::new();
    for s in schemas.values() {
        refs(s, &mut pending);
    }
    while let Some(name) = pending.pop() {
        if schemas.contains_key(&name) {
            continue;
        }
        if let Some(s) = available.get(&name) {
            refs(s, &mut pending);
            schemas.insert(name, s.clone());
        }
    }
}

/// `/openapi/v3/<api|apis/group>/<version>`; None when nothing is served there. `crd_of` gives
/// the CRD that registered a custom resource type.
pub fn group_version(
    types: &[ResourceType],
    gv: &str,
    crd_of: impl Fn(&ResourceType) -> Option<Value>,
) -> Option<Value> {
    let served: Vec<&ResourceType> = types
        .iter()
        .filter(|t| gv_path(&t.group, &t.version) == gv)
        .collect();
    if served.is_empty() {
        return None;
    }
    let builtins = builtins();
    let mut schemas = Map::new();
    let mut paths = Map::new();
    for t in served {
        let kind = match t.crd_name {
            Some(_) => crd_of(t).map(|crd| {
                let name = custom_schema_name(&t.group, &t.version, &t.kind);
                schemas.insert(name.clone(), custom_kind_schema(&crd, t));
                name
            }),
            None => builtins
                .kinds
                .iter()
                .find(|(g, v, k, _)| (*g, *v, *k) == (&*t.group, &*t.version, &*t.kind))
                .map(|(_, _, _, name)| {
                    let schema = builtins.schemas.get(name).cloned().unwrap_or(json!({}));
                    schemas.insert(name.clone(), schema);
                    name.clone()
                }),
        };
        let list = kind.as_ref().filter(|_| !t.create_only).map(|name| {
            let list = format!("{name}List");
            schemas.insert(list.clone(), list_schema(t, name));
            list
        });
        resource_paths(t, kind.as_deref(), list.as_deref(), &mut paths);
    }
    if let Some(status) = builtins.schemas.get(STATUS).filter(|_| !schemas.is_empty()) {
        schemas.insert(STATUS.into(), status.clone());
    }
    add_referenced(&mut schemas, &builtins.schemas);
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (meshplane kube-standin test fixture)", "version": "v1.37.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// `/openapi/v3`: where each group/version's document is, with a hash of its content (as the
/// real server gives it, so a client's cache is renewed when a CRD changes).
pub fn root(types: &[ResourceType], crd_of: impl Fn(&ResourceType) -> Option<Value>) -> Value {
    let mut paths = Map::new();
    for t in types {
        let p = gv_path(&t.group, &t.version);
        if paths.contains_key(&p) {
            continue;
        }
        let mut hasher = DefaultHasher::new();
        if let Some(doc) = group_version(types, &p, &crd_of) {
            doc.to_string().hash(&mut hasher);
        }
        let url = format!("/openapi/v3/{p}?hash={:016X}", hasher.finish());
        paths.insert(p, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{builtin_types, types_from_crd};

    fn mcp_crd() -> Value {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../config/crd/meshplane.io_meshcontrolplanes.yaml"
        ))
        .unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }

    fn all_types(crd: &Value) -> Vec<ResourceType> {
        let mut types = builtin_types();
        types.extend(types_from_crd(crd).unwrap());
        types
    }

    /// Every `$ref` in the document resolves inside it.
    fn assert_refs_resolve(doc: &Value) {
        fn walk(v: &Value, doc: &Value) {
            match v {
                Value::Object(o) => {
                    if let Some(Value::String(r)) = o.get("$ref") {
                        let name = r.strip_prefix(REF_PREFIX).unwrap();
                        assert!(
                            doc["components"]["schemas"].get(name).is_some(),
                            "unresolved {r}"
                        );
                    }
                    o.values().for_each(|v| walk(v, doc));
                }
                Value::Array(a) => a.iter().for_each(|v| walk(v, doc)),
                _ => {}
            }
        }
        walk(doc, doc);
    }

    #[test]
    fn custom_resource_schemas_are_named_and_typed_like_the_api_servers() {
        assert_eq!(
            custom_schema_name("networking.meshplane.io", "v1alpha1", "VirtualService"),
            "io.meshplane.networking.v1alpha1.VirtualService"
        );
        let crd = mcp_crd();
        let types = all_types(&crd);
        let doc =
            group_version(&types, "apis/meshplane.io/v1alpha1", |_| Some(crd.clone())).unwrap();
        let schemas = &doc["components"]["schemas"];
        let mcp = &schemas["io.meshplane.v1alpha1.MeshControlPlane"];
        assert_eq!(
            mcp["x-kubernetes-group-version-kind"],
            json!([{"group": "meshplane.io", "version": "v1alpha1", "kind": "MeshControlPlane"}])
        );
        assert_eq!(
            mcp["properties"]["metadata"]["allOf"][0]["$ref"],
            json!("#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
        );
        assert!(mcp["properties"]["spec"]["properties"]["revision"].is_object());
        assert!(schemas[OBJECT_META]["properties"]["labels"].is_object());
        assert_eq!(
            schemas["io.meshplane.v1alpha1.MeshControlPlaneList"]["properties"]["items"]["items"]
                ["allOf"][0]["$ref"],
            json!("#/components/schemas/io.meshplane.v1alpha1.MeshControlPlane")
        );
        let patch = &doc["paths"]["/apis/meshplane.io/v1alpha1/meshcontrolplanes/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            json!("MeshControlPlane")
        );
        assert!(patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation"));
        assert_eq!(
            patch["operationId"],
            json!("patchMeshplaneIoV1alpha1MeshControlPlane")
        );
        assert!(doc["paths"]["/apis/meshplane.io/v1alpha1/meshcontrolplanes"]["get"].is_object());
        assert!(
            doc["paths"]["/apis/meshplane.io/v1alpha1/meshcontrolplanes/{name}/status"]["patch"]
                .is_object()
        );
        // Only what the group/version's kinds use: no Pod schema here.
        assert!(schemas.get("io.k8s.api.core.v1.Pod").is_none());
        assert_refs_resolve(&doc);
    }

    #[test]
    fn built_in_kinds_carry_kubernetes_schemas() {
        let types = builtin_types();
        let core = group_version(&types, "api/v1", |_| None).unwrap();
        let schemas = &core["components"]["schemas"];
        assert_eq!(
            schemas["io.k8s.api.core.v1.Pod"]["x-kubernetes-group-version-kind"],
            json!([{"group": "", "version": "v1", "kind": "Pod"}])
        );
        assert!(schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"].is_object());
        assert!(schemas["io.k8s.api.core.v1.Container"]["description"].is_string());
        assert_refs_resolve(&core);
        for t in &types {
            let doc = group_version(&types, &gv_path(&t.group, &t.version), |_| None).unwrap();
            assert_refs_resolve(&doc);
        }
    }

    #[test]
    fn root_hash_follows_the_content() {
        let crd = mcp_crd();
        let types = all_types(&crd);
        let url =
            |root: &Value| root["paths"]["apis/meshplane.io/v1alpha1"]["serverRelativeURL"].clone();
        let before = root(&types, |_| Some(crd.clone()));
        assert_eq!(url(&before), url(&root(&types, |_| Some(crd.clone()))));
        let mut changed = crd.clone();
        changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] =
            json!("changed");
        let after = root(&types, |_| Some(changed.clone()));
        assert_ne!(url(&before), url(&after));
        assert_eq!(
            before["paths"]["api/v1"]["serverRelativeURL"],
            after["paths"]["api/v1"]["serverRelativeURL"]
        );
    }

    #[test]
    fn operation_stems() {
        assert_eq!(operation_stem("", "v1"), "CoreV1");
        assert_eq!(
            operation_stem("rbac.authorization.k8s.io", "v1"),
            "RbacAuthorizationV1"
        );
        assert_eq!(
            operation_stem("meshplane.io", "v1alpha1"),
            "MeshplaneIoV1alpha1"
        );
    }
}
