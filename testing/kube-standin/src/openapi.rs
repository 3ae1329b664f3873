//! Minimal OpenAPI v3 documents: per group/version, the PATCH operations of every resource with
//! its `x-kubernetes-group-version-kind` and the `fieldValidation` parameter. That is what
//! kubectl reads to choose server-side field validation for `apply`; there are no schemas, so
//! `kubectl explain` does not work.

use serde_json::{json, Map, Value};

use super::resources::ResourceType;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: where each group/version's document is.
pub fn root(types: &[ResourceType]) -> Value {
    let mut paths = Map::new();
    for t in types {
        let p = gv_path(&t.group, &t.version);
        let url = format!("/openapi/v3/{p}?hash=standin");
        paths.insert(p, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

/// `/openapi/v3/<api|apis/group>/<version>`; None when nothing is served there.
pub fn group_version(types: &[ResourceType], gv: &str) -> Option<Value> {
    let served: Vec<&ResourceType> = types
        .iter()
        .filter(|t| gv_path(&t.group, &t.version) == gv)
        .collect();
    if served.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    for t in served {
        let base = format!("/{}", gv_path(&t.group, &t.version));
        let item = if t.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{base}/{}/{{name}}", t.plural)
        };
        let gvk = json!({"group": t.group, "version": t.version, "kind": t.kind});
        paths.insert(
            item,
            json!({
                "patch": {
                    "operationId": format!("patch{}", t.kind),
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [
                        {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                        {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                        {"name": "force", "in": "query", "schema": {"type": "boolean"}},
                    ],
                    "responses": {"200": {"description": "OK"}},
                }
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (meshplane kube-standin test fixture)", "version": "v1.37.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
