//! A fake Kubernetes API for reconcile-level tests, in the tower-test pattern: the client
//! talks to a `tower_test::mock` service whose requests a task answers from an in-memory store.
//! It implements just what the operator uses: list with label selectors, get, server-side apply
//! (deep merge), JSON patch, delete, create (Events), and the status subresource. Every write
//! is recorded so tests can count them.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::Client;
use meshplane_crds::selector::Selector;
use serde_json::{json, Value};

/// `(group, plural, namespace, name)`.
pub type Key = (String, String, Option<String>, String);

#[derive(Default)]
pub struct State {
    pub objects: BTreeMap<Key, Value>,
    /// Every write: `(verb, group/plural, namespace, name)`; Events are kept apart.
    pub writes: Vec<(String, String, Option<String>, String)>,
    pub events: Vec<Value>,
    next_uid: u64,
    next_ip: u8,
    /// The operator's RBAC as `config/rbac/` ships it, when enforced: requests on these kinds
    /// (`group/plural`; for Services only writes) are refused (403) cluster-wide, and in a
    /// namespace unless a RoleBinding there binds `meshplane-control-namespace` or
    /// `meshplane-gateway-namespace`.
    pub bound_kinds: Option<Vec<String>>,
    pub forbidden: Vec<(String, String, Option<String>)>,
}

#[derive(Clone, Default)]
pub struct FakeApi {
    pub state: Arc<Mutex<State>>,
}

struct Path {
    group: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Option<Path> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match *segs.first()? {
        "api" => (String::new(), segs.get(2..)?),
        "apis" => (segs.get(1)?.to_string(), segs.get(3..)?),
        _ => return None,
    };
    let s = |i: usize| rest.get(i).map(|x| x.to_string());
    Some(if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        Path {
            group,
            plural: s(2)?,
            namespace: s(1),
            name: s(3),
            subresource: s(4),
        }
    } else {
        Path {
            group,
            plural: s(0)?,
            namespace: None,
            name: s(1),
            subresource: s(2),
        }
    })
}

fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

/// Server-side apply approximated as a deep merge: maps merge, everything else is replaced.
fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

fn status_json(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": message, "metadata": {}})
}

impl FakeApi {
    /// A kube client served by this fake.
    pub fn client(&self) -> Client {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api = self.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let response = api.answer(request).await;
                send.send_response(response);
            }
        });
        Client::new(mock, "default")
    }

    /// Seeds an object (apiVersion, kind, metadata.name[, namespace]) as if it existed.
    pub fn insert(&self, group_plural: (&str, &str), mut obj: Value) {
        let mut st = self.state.lock().unwrap();
        st.next_uid += 1;
        let uid = format!("uid-{}", st.next_uid);
        let meta = obj["metadata"].as_object_mut().unwrap();
        meta.entry("uid").or_insert(json!(uid));
        meta.entry("resourceVersion").or_insert(json!("1"));
        meta.entry("creationTimestamp")
            .or_insert(json!("2026-01-01T00:00:00Z"));
        let key = (
            group_plural.0.to_string(),
            group_plural.1.to_string(),
            obj["metadata"]["namespace"].as_str().map(str::to_string),
            obj["metadata"]["name"].as_str().unwrap().to_string(),
        );
        st.objects.insert(key, obj);
    }

    pub fn get(&self, group: &str, plural: &str, ns: Option<&str>, name: &str) -> Option<Value> {
        let st = self.state.lock().unwrap();
        st.objects
            .get(&(
                group.into(),
                plural.into(),
                ns.map(str::to_string),
                name.into(),
            ))
            .cloned()
    }

    pub fn remove(&self, group: &str, plural: &str, ns: Option<&str>, name: &str) {
        let mut st = self.state.lock().unwrap();
        st.objects.remove(&(
            group.into(),
            plural.into(),
            ns.map(str::to_string),
            name.into(),
        ));
    }

    /// Objects of `plural` (any group), as `namespace/name` or `name`.
    pub fn names(&self, plural: &str) -> Vec<String> {
        let st = self.state.lock().unwrap();
        st.objects
            .keys()
            .filter(|k| k.1 == plural)
            .map(|k| match &k.2 {
                Some(ns) => format!("{ns}/{}", k.3),
                None => k.3.clone(),
            })
            .collect()
    }

    pub fn writes(&self) -> Vec<(String, String, Option<String>, String)> {
        self.state.lock().unwrap().writes.clone()
    }

    pub fn clear_writes(&self) {
        let mut st = self.state.lock().unwrap();
        st.writes.clear();
        st.events.clear();
    }

    pub fn events(&self) -> Vec<Value> {
        self.state.lock().unwrap().events.clone()
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        let (code, value) = self.handle(&parts, &bytes);
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&value).unwrap()))
            .unwrap()
    }

    /// Refuses, from now on, what the operator's shipped RBAC refuses (see
    /// [`State::bound_kinds`]).
    pub fn enforce_operator_rbac(&self) {
        self.state.lock().unwrap().bound_kinds = Some(
            [
                "/secrets",
                "/serviceaccounts",
                "apps/deployments",
                "policy/poddisruptionbudgets",
                "networking.k8s.io/networkpolicies",
            ]
            .map(str::to_string)
            .to_vec(),
        );
    }

    /// Requests refused by [`State::bound_kinds`]: `(verb, group/plural, namespace)`.
    pub fn forbidden(&self) -> Vec<(String, String, Option<String>)> {
        self.state.lock().unwrap().forbidden.clone()
    }

    fn handle(&self, parts: &http::request::Parts, body: &[u8]) -> (StatusCode, Value) {
        let Some(path) = parse_path(parts.uri.path()) else {
            return (
                StatusCode::NOT_FOUND,
                status_json(404, "NotFound", "unknown path"),
            );
        };
        let mut st = self.state.lock().unwrap();
        let group_plural = format!("{}/{}", path.group, path.plural);
        if let Some(bound) = &st.bound_kinds {
            let restricted = bound.contains(&group_plural)
                || (group_plural == "/services" && parts.method != Method::GET);
            let granted = path.namespace.as_ref().is_some_and(|ns| {
                st.objects.iter().any(|(k, v)| {
                    k.1 == "rolebindings"
                        && k.2.as_ref() == Some(ns)
                        && ["meshplane-control-namespace", "meshplane-gateway-namespace"]
                            .contains(&v["roleRef"]["name"].as_str().unwrap_or_default())
                })
            });
            if restricted && !granted {
                let refused = (
                    parts.method.to_string(),
                    group_plural.clone(),
                    path.namespace.clone(),
                );
                st.forbidden.push(refused);
                return (
                    StatusCode::FORBIDDEN,
                    status_json(403, "Forbidden", &format!("{group_plural} is forbidden")),
                );
            }
        }
        match (&parts.method, &path.name) {
            (&Method::GET, None) => {
                let selector = query_param(parts.uri.query(), "labelSelector")
                    .map(|q| Selector::parse_query(&q).unwrap())
                    .unwrap_or_default();
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|(k, _)| k.0 == path.group && k.1 == path.plural)
                    .filter(|(k, _)| path.namespace.is_none() || k.2 == path.namespace)
                    .filter(|(_, v)| {
                        let labels: BTreeMap<String, String> =
                            serde_json::from_value(v["metadata"]["labels"].clone())
                                .unwrap_or_default();
                        selector.matches(&labels)
                    })
                    .map(|(_, v)| v.clone())
                    .collect();
                (
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            (&Method::GET, Some(name)) => {
                let key = (
                    path.group.clone(),
                    path.plural.clone(),
                    path.namespace.clone(),
                    name.clone(),
                );
                match st.objects.get(&key) {
                    Some(v) => (StatusCode::OK, v.clone()),
                    None => (
                        StatusCode::NOT_FOUND,
                        status_json(404, "NotFound", &format!("{group_plural} {name} not found")),
                    ),
                }
            }
            (&Method::POST, _) => {
                let mut obj: Value = serde_json::from_slice(body).unwrap();
                if path.plural == "events" {
                    st.events.push(obj.clone());
                    return (StatusCode::CREATED, obj);
                }
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let key = (
                    path.group.clone(),
                    path.plural.clone(),
                    path.namespace.clone(),
                    name.clone(),
                );
                if st.objects.contains_key(&key) {
                    return (
                        StatusCode::CONFLICT,
                        status_json(
                            409,
                            "AlreadyExists",
                            &format!("{group_plural} {name:?} already exists"),
                        ),
                    );
                }
                obj["metadata"]["uid"] = json!(format!("uid-{name}"));
                obj["metadata"]["resourceVersion"] = json!("1");
                st.writes.push((
                    "create".into(),
                    group_plural,
                    path.namespace.clone(),
                    name.clone(),
                ));
                st.objects.insert(key, obj.clone());
                (StatusCode::CREATED, obj)
            }
            (&Method::PATCH, Some(name)) => {
                if path.plural == "events" {
                    // A repeated Event is patched into a series: still an Event write.
                    let event: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                    st.events.push(event.clone());
                    return (StatusCode::OK, event);
                }
                let key = (
                    path.group.clone(),
                    path.plural.clone(),
                    path.namespace.clone(),
                    name.clone(),
                );
                let content_type = parts
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let patch: Value = serde_json::from_slice(body).unwrap();
                let sub = path.subresource.clone();
                let verb = if sub.as_deref() == Some("status") {
                    "apply-status"
                } else {
                    "apply"
                };
                // Like the API server: an apply body must name the object of the URL.
                if !content_type.contains("json-patch")
                    && patch["metadata"]["name"].as_str() != Some(name.as_str())
                {
                    return (
                        StatusCode::BAD_REQUEST,
                        status_json(
                            400,
                            "BadRequest",
                            "the name of the object does not match the name on the URL",
                        ),
                    );
                }
                let existing = st.objects.get(&key).cloned();
                let obj = if content_type.contains("json-patch") {
                    let Some(mut obj) = existing else {
                        return (StatusCode::NOT_FOUND, status_json(404, "NotFound", name));
                    };
                    let p: json_patch::Patch = serde_json::from_value(patch).unwrap();
                    if json_patch::patch(&mut obj, &p).is_err() {
                        return (
                            StatusCode::UNPROCESSABLE_ENTITY,
                            status_json(422, "Invalid", "patch test failed"),
                        );
                    }
                    st.writes.push((
                        "patch".into(),
                        group_plural,
                        path.namespace.clone(),
                        name.clone(),
                    ));
                    obj
                } else {
                    let mut obj = existing.unwrap_or_else(|| {
                        st.next_uid += 1;
                        json!({"metadata": {"uid": format!("uid-{}", st.next_uid), "creationTimestamp": "2026-01-01T00:00:00Z"}})
                    });
                    if sub.as_deref() == Some("status") {
                        // SSA of status replaces what this manager owns: here, the whole status.
                        obj["status"] = patch["status"].clone();
                    } else {
                        merge(&mut obj, &patch);
                        if path.plural == "services" && obj["spec"]["clusterIP"].is_null() {
                            st.next_ip += 1;
                            obj["spec"]["clusterIP"] = json!(format!("198.19.96.{}", st.next_ip));
                        }
                    }
                    st.writes.push((
                        verb.into(),
                        group_plural,
                        path.namespace.clone(),
                        name.clone(),
                    ));
                    obj
                };
                st.objects.insert(key, obj.clone());
                (StatusCode::OK, obj)
            }
            (&Method::DELETE, Some(name)) => {
                let key = (
                    path.group.clone(),
                    path.plural.clone(),
                    path.namespace.clone(),
                    name.clone(),
                );
                match st.objects.remove(&key) {
                    Some(v) => {
                        st.writes.push((
                            "delete".into(),
                            group_plural,
                            path.namespace.clone(),
                            name.clone(),
                        ));
                        (StatusCode::OK, v)
                    }
                    None => (StatusCode::NOT_FOUND, status_json(404, "NotFound", name)),
                }
            }
            _ => (
                StatusCode::METHOD_NOT_ALLOWED,
                status_json(405, "MethodNotAllowed", "unsupported"),
            ),
        }
    }
}
