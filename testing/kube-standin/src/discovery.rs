//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`.
//! `/apis` answers with the legacy `APIGroupList`; kubectl falls back to it from the aggregated
//! discovery it asks for first.

use serde_json::{json, Value};

use super::resources::ResourceType;

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "gitVersion": "v1.37.0-meshplane-standin",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// Groups in first-seen order, each with its versions in first-seen order.
fn groups(types: &[ResourceType]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for t in types.iter().filter(|t| !t.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == t.group) {
            Some((_, versions)) => {
                if !versions.contains(&t.version) {
                    versions.push(t.version.clone());
                }
            }
            None => out.push((t.group.clone(), vec![t.version.clone()])),
        }
    }
    out
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

pub fn group_list(types: &[ResourceType]) -> Value {
    let gs: Vec<Value> = groups(types)
        .iter()
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

pub fn group(types: &[ResourceType], group: &str) -> Option<Value> {
    let (g, vs) = groups(types).into_iter().find(|(g, _)| g == group)?;
    let mut doc = group_json(&g, &vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `APIResourceList` of one group/version; None when nothing is served there.
pub fn resource_list(types: &[ResourceType], group: &str, version: &str) -> Option<Value> {
    let served: Vec<&ResourceType> = types
        .iter()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if served.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for t in served {
        let mut r = json!({
            "name": t.plural,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": t.verbs(),
        });
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            r["categories"] = json!(t.categories);
        }
        resources.push(r);
        let mut subs: Vec<(&str, &str, Vec<&str>)> = Vec::new();
        if t.has_status {
            subs.push(("status", t.kind.as_str(), vec!["get", "patch", "update"]));
        }
        for s in &t.extra_subresources {
            subs.push((s.as_str(), "TokenRequest", vec!["create"]));
        }
        for (sub, kind, verbs) in subs {
            let mut entry = json!({
                "name": format!("{}/{sub}", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "kind": kind,
                "verbs": verbs,
            });
            if kind == "TokenRequest" {
                entry["group"] = json!("authentication.k8s.io");
                entry["version"] = json!("v1");
            }
            resources.push(entry);
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}
