//! The HTTP request pipeline: routing of API paths, authentication, authorization, schema
//! validation, admission, then storage (see `store`) or watch (see `watch`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{header, Method, StatusCode};
use serde_json::{json, Value};

use super::admission::{self, AdmissionInput};
use super::auth::{parse_service_account_username, Authenticator, UserInfo, GROUP_AUTHENTICATED};
use super::discovery;
use super::error::{ApiError, Target as ErrTarget};
use super::field_validation::{self, FieldValidation};
use super::fields::{self, Scope};
use super::object;
use super::openapi;
use super::patch::{self, PatchKind};
use super::pod_log;
use super::pod_proxy;
use super::port_forward;
use super::protobuf;
use super::query::{Filter, QueryParams};
use super::rbac::{self, RequestAttributes};
use super::requests::RequestCounter;
use super::resources::ResourceType;
use super::schema;
use super::store::{DeleteRequest, Propagation, Store, WriteCtx};
use super::table;
use super::tokens;
use super::watch::{self, Start, WatchRequest};

/// Largest request body accepted.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// Server-side watch timeout when the client gives none (the real server picks 30–60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// Internal retries of a patch that raced with another write.
const PATCH_ATTEMPTS: usize = 8;

/// Shared state of the HTTP server.
pub struct ServerState {
    pub store: Arc<Store>,
    pub auth: Arc<Authenticator>,
    /// `host:port` the server listens on (for `/api`'s `serverAddressByClientCIDRs`).
    pub address: String,
    pub bookmark_interval: Duration,
    /// Resource requests by verb, and the latest writes (`GET /standin/requests`).
    pub requests: Arc<RequestCounter>,
    /// How admission webhooks are reached.
    pub webhook_dialer: admission::Dialer,
    /// How forwarded ports reach a pod (the kubelet's part).
    pub pod_connector: port_forward::PodConnector,
    /// What containers wrote (the kubelet's part of `pods/log`).
    pub pod_logs: pod_log::PodLogs,
    /// The client certificates admission webhooks are called with.
    pub webhook_credentials: admission::WebhookClientCredentials,
    /// RBAC with its cache of resolved rules, for `store`.
    pub authorizer: Arc<rbac::Authorizer>,
}

/// The resource a request addresses.
#[derive(Debug, Clone)]
struct Target {
    rt: ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    fn err_target<'a>(&'a self, name: &'a str) -> ErrTarget<'a> {
        ErrTarget {
            group: &self.rt.group,
            resource: &self.rt.plural,
            name,
        }
    }
}

/// Everything about one request the handlers need.
struct Call {
    method: Method,
    query: QueryParams,
    accept: String,
    content_type: String,
    user_agent: String,
    user: UserInfo,
    body: bytes::Bytes,
    /// `Warning` headers of the response (unknown fields under `fieldValidation=Warn`).
    warnings: std::sync::Mutex<Vec<String>>,
}

impl Call {
    fn warn(&self, warnings: Vec<String>) {
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(warnings);
    }
}

/// Entry point for every request.
pub async fn handle(State(state): State<Arc<ServerState>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    tracing::debug!(%method, %path, %query, "request");
    match dispatch(&state, req).await {
        Ok(resp) => {
            tracing::debug!(%method, %path, status = resp.status().as_u16(), "response");
            resp
        }
        Err(e) => {
            tracing::debug!(%method, %path, code = e.code, reason = e.reason, message = %e.message, "request failed");
            e.into_response()
        }
    }
}

fn json_response(code: StatusCode, body: Value) -> Response {
    (code, axum::Json(body)).into_response()
}

fn header_str(req: &Request, name: header::HeaderName) -> String {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

async fn dispatch(state: &Arc<ServerState>, req: Request) -> Result<Response, ApiError> {
    let raw_path = req.uri().path().to_string();
    let path = raw_path.trim_end_matches('/').to_string();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    // `system:public-info-viewer` is bound to unauthenticated clients as well.
    let public = matches!(
        segments.as_slice(),
        ["version"] | ["healthz" | "livez" | "readyz"]
    );
    if public && authorization.is_none() {
        return non_resource(state, &segments, &path);
    }
    // Test-fixture instrumentation, not a Kubernetes path: the request counter, for readers in
    // other processes (the stand-in listens on loopback only).
    if segments.as_slice() == ["standin", "requests"] {
        if req.method() != Method::GET {
            return Err(ApiError::method_not_allowed(
                "/standin/requests answers GET only",
            ));
        }
        return Ok(json_response(
            StatusCode::OK,
            serde_json::to_value(state.requests.snapshot())
                .map_err(|e| ApiError::internal(format!("encoding the request counts: {e}")))?,
        ));
    }
    let user = state.auth.authenticate(authorization).map_err(|e| {
        tracing::debug!(error = %e, "authentication failed");
        ApiError::unauthorized()
    })?;
    let user = impersonate(state, user, req.headers())?;
    if !is_resource_request(&segments) {
        // Like the real API, a non-resource request is authorized by its path and its
        // lowercased HTTP method before anything else (unknown paths get 403, not 404).
        let verb = req.method().as_str().to_ascii_lowercase();
        state
            .authorizer
            .authorize_non_resource(state.store.as_ref(), &user, &verb, &raw_path)
            .map_err(|reason| ApiError::forbidden(format!("forbidden: {reason}")))?;
        return non_resource(state, &segments, &path);
    }
    if let ["api", "v1", "namespaces", ns, "pods", name, "log"] = segments.as_slice() {
        if req.method() != Method::GET {
            return Err(ApiError::method_not_allowed("pods/log answers GET only"));
        }
        let options = pod_log::LogOptions::parse(req.uri().query())?;
        return log_of_pod(state, user, ns, name, &options).await;
    }
    if let ["api", "v1", "namespaces", ns, "pods", name, "portforward"] = segments.as_slice() {
        let (ns, name) = (ns.to_string(), name.to_string());
        return port_forward_to_pod(state, user, &ns, &name, req).await;
    }
    if let ["api", "v1", "namespaces", ns, "pods", rest @ ..] = segments.as_slice() {
        if let Some(target) = pod_proxy::parse(rest, req.uri().query()) {
            return proxy_to_pod(state, user, ns, &target?, req.method(), req.headers()).await;
        }
    }
    let target = match segments.as_slice() {
        ["api", "v1", rest @ ..] => parse_target(&state.store, "", "v1", rest, &path)?,
        ["apis", group, version, rest @ ..] => {
            parse_target(&state.store, group, version, rest, &path)?
        }
        _ => return Err(ApiError::path_not_found(&path)),
    };
    let call = Call {
        method: req.method().clone(),
        query: QueryParams::parse(req.uri().query())?,
        accept: header_str(&req, header::ACCEPT),
        content_type: header_str(&req, header::CONTENT_TYPE),
        user_agent: header_str(&req, header::USER_AGENT),
        user,
        body: axum::body::to_bytes(req.into_body(), MAX_BODY)
            .await
            .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?,
        warnings: std::sync::Mutex::new(Vec::new()),
    };
    let verb = verb_of(&call, &target)?;
    let result = match authorize(state, &call, &target, verb) {
        Err(denied) => Err(denied),
        Ok(()) => match verb {
            "get" => get(state, &call, &target),
            "list" => list(state, &call, &target),
            "watch" => watch_resource(state, &call, &target),
            "create" => create(state, &call, &target).await,
            "update" => update(state, &call, &target).await,
            "patch" => patch_resource(state, &call, &target).await,
            "delete" => delete(state, &call, &target).await,
            "deletecollection" => delete_collection(state, &call, &target).await,
            _ => Err(ApiError::method_not_allowed(format!(
                "{verb} is not supported"
            ))),
        },
    };
    count_request(state, &call, &target, verb, &result);
    let warnings = std::mem::take(&mut *call.warnings.lock().unwrap_or_else(|e| e.into_inner()));
    result.map(|mut response| {
        for warning in warnings {
            // RFC 7234 warn-value: code, agent ("-"), quoted text.
            let text = format!("299 - {}", serde_json::Value::from(warning));
            if let Ok(value) = header::HeaderValue::from_str(&text) {
                response.headers_mut().append(header::WARNING, value);
            }
        }
        response
    })
}

/// Authorizes `verb` on the pod subresource `subresource` of `namespace/name` with the
/// caller's identity, as the API server does before it hands a request to the kubelet; the
/// pod's stored object and its reference on success.
fn authorized_pod(
    state: &ServerState,
    user: UserInfo,
    verb: &str,
    subresource: &str,
    namespace: &str,
    name: &str,
) -> Result<(Value, port_forward::PodRef), ApiError> {
    let attrs = RequestAttributes {
        user,
        verb: verb.to_string(),
        api_group: String::new(),
        resource: "pods".to_string(),
        subresource: Some(subresource.to_string()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
    };
    state
        .authorizer
        .authorize(state.store.as_ref(), &attrs)
        .map_err(|reason| forbidden(&attrs, &reason))?;
    let pods = state
        .store
        .find_type("", "v1", "pods")
        .ok_or_else(|| ApiError::internal("the pods type is not registered"))?;
    let pod = state.store.get(&pods, namespace, name)?;
    let uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let pod_ref = port_forward::PodRef {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid,
    };
    Ok((pod, pod_ref))
}

/// `pods/<name>[:<port>]/proxy/<path>`: authorized as `get` on `pods/proxy` with the caller's
/// identity, then forwarded to the pod (`pod_proxy`).
async fn proxy_to_pod(
    state: &ServerState,
    user: UserInfo,
    namespace: &str,
    target: &pod_proxy::ProxyTarget,
    method: &Method,
    headers: &http::HeaderMap,
) -> Result<Response, ApiError> {
    let (pod, _) = authorized_pod(state, user, "get", "proxy", namespace, &target.pod)?;
    pod_proxy::forward(&state.webhook_dialer, &pod, target, method, headers).await
}

/// `pods/<name>/log`: authorized as `get` on `pods/log` with the caller's identity, then read
/// from the node (`pod_log`).
async fn log_of_pod(
    state: &ServerState,
    user: UserInfo,
    namespace: &str,
    name: &str,
    options: &pod_log::LogOptions,
) -> Result<Response, ApiError> {
    let (pod, pod_ref) = authorized_pod(state, user, "get", "log", namespace, name)?;
    pod_log::serve(&state.pod_logs, &pod, pod_ref, options).await
}

/// `pods/<name>/portforward`: authorized as `create` on `pods/portforward` with the caller's
/// identity; the pod must be running; then the WebSocket is served by `port_forward`.
async fn port_forward_to_pod(
    state: &ServerState,
    user: UserInfo,
    namespace: &str,
    name: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let (pod, pod_ref) = authorized_pod(state, user, "create", "portforward", namespace, name)?;
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if phase != Some("Running") {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: pod {name:?} is not running (phase {})",
            phase.unwrap_or("unknown")
        )));
    }
    let ports = port_forward::ports(req.uri().query())?;
    port_forward::serve(req, state.pod_connector.clone(), pod_ref, ports)
}

/// Records a resource request in the request counter, whatever its outcome.
fn count_request(
    state: &ServerState,
    call: &Call,
    t: &Target,
    verb: &str,
    result: &Result<Response, ApiError>,
) {
    let code = match result {
        Ok(resp) => resp.status().as_u16(),
        Err(e) => e.code,
    };
    // A create names its object in the body (best effort: JSON bodies only).
    let created_name = (verb == "create" && t.name.is_none())
        .then(|| serde_json::from_slice::<Value>(&call.body).ok())
        .flatten()
        .and_then(|body| {
            body.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    state.requests.record(
        verb,
        &t.rt.group,
        &t.rt.plural,
        t.subresource.as_deref(),
        t.namespace.as_deref(),
        t.name.as_deref().or(created_name.as_deref()),
        &call.user.username,
        code,
        call.query.dry_run(),
    );
}

/// Applies `Impersonate-User`/`Impersonate-Group` (`kubectl --as`/`--as-group`) like the real
/// API: each requires the `impersonate` verb on the user (or ServiceAccount) and every group;
/// the request then runs as that identity, in `system:authenticated`, and an impersonated
/// ServiceAccount without requested groups gets its own. UID and extra impersonation are not
/// supported (400).
fn impersonate(
    state: &ServerState,
    user: UserInfo,
    headers: &http::HeaderMap,
) -> Result<UserInfo, ApiError> {
    if headers.keys().any(|k| {
        let k = k.as_str();
        k == "impersonate-uid" || k.starts_with("impersonate-extra-")
    }) {
        return Err(ApiError::bad_request(
            "kube-standin (test fixture) supports only Impersonate-User and Impersonate-Group",
        ));
    }
    let text = |v: &http::HeaderValue| {
        v.to_str()
            .map(str::to_string)
            .map_err(|_| ApiError::bad_request("impersonation headers must be text"))
    };
    let username = headers
        .get("impersonate-user")
        .map(text)
        .transpose()?
        .filter(|u| !u.is_empty());
    let groups = headers
        .get_all("impersonate-group")
        .iter()
        .map(text)
        .collect::<Result<Vec<_>, _>>()?;
    let Some(username) = username else {
        if groups.is_empty() {
            return Ok(user);
        }
        return Err(ApiError::bad_request(format!(
            "requested {groups:?} without impersonating a user"
        )));
    };
    let check = |resource: &str, namespace: Option<&str>, name: &str| {
        let attrs = RequestAttributes {
            user: user.clone(),
            verb: "impersonate".to_string(),
            api_group: String::new(),
            resource: resource.to_string(),
            subresource: None,
            namespace: namespace.map(str::to_string),
            name: Some(name.to_string()),
        };
        state
            .authorizer
            .authorize(state.store.as_ref(), &attrs)
            .map_err(|reason| forbidden(&attrs, &reason))
    };
    let mut impersonated = match parse_service_account_username(&username) {
        Some((namespace, name)) => {
            check("serviceaccounts", Some(namespace), name)?;
            let account = UserInfo::service_account(namespace, name);
            if groups.is_empty() {
                account
            } else {
                UserInfo {
                    username: account.username,
                    groups: Vec::new(),
                }
            }
        }
        None => {
            check("users", None, &username)?;
            UserInfo {
                username,
                groups: Vec::new(),
            }
        }
    };
    for group in groups {
        check("groups", None, &group)?;
        if !impersonated.in_group(&group) {
            impersonated.groups.push(group);
        }
    }
    if impersonated.username != "system:anonymous" && !impersonated.in_group(GROUP_AUTHENTICATED) {
        impersonated.groups.push(GROUP_AUTHENTICATED.to_string());
    }
    tracing::debug!(by = %user.username, as_user = %impersonated.username, "impersonation");
    Ok(impersonated)
}

/// Whether a path addresses resources (`/api/<v>/<...>`, `/apis/<g>/<v>/<...>`), as the real
/// API's `RequestInfo` decides; everything else (discovery, `/version`, `/openapi/*`, health
/// and unknown paths) is a non-resource request.
fn is_resource_request(segments: &[&str]) -> bool {
    matches!(segments, ["api", _, _, ..] | ["apis", _, _, _, ..])
}

/// Serves an authorized non-resource path: discovery, `/version`, OpenAPI, health.
fn non_resource(state: &ServerState, segments: &[&str], path: &str) -> Result<Response, ApiError> {
    let types = state.store.types();
    let found = |doc: Option<Value>| {
        doc.map(|d| json_response(StatusCode::OK, d))
            .ok_or_else(|| ApiError::path_not_found(path))
    };
    match segments {
        ["version"] => Ok(json_response(StatusCode::OK, discovery::version())),
        ["healthz" | "livez" | "readyz"] => Ok((StatusCode::OK, "ok").into_response()),
        ["api"] => Ok(json_response(
            StatusCode::OK,
            discovery::core_versions(&state.address),
        )),
        ["apis"] => Ok(json_response(StatusCode::OK, discovery::group_list(&types))),
        ["api", "v1"] => found(discovery::resource_list(&types, "", "v1")),
        ["apis", group] => found(discovery::group(&types, group)),
        ["openapi", "v3"] => Ok(json_response(
            StatusCode::OK,
            openapi::root(&types, |t| state.store.crd_of(t)),
        )),
        ["openapi", "v3", gv @ ..] => found(openapi::group_version(&types, &gv.join("/"), |t| {
            state.store.crd_of(t)
        })),
        ["apis", group, version] => found(discovery::resource_list(&types, group, version)),
        _ => Err(ApiError::path_not_found(path)),
    }
}

fn parse_target(
    store: &Store,
    group: &str,
    version: &str,
    rest: &[&str],
    path: &str,
) -> Result<Target, ApiError> {
    let not_found = || ApiError::path_not_found(path);
    let namespaced = match rest {
        ["namespaces", ns, plural, tail @ ..] => store
            .find_type(group, version, plural)
            .filter(|rt| rt.namespaced)
            .map(|rt| (rt, Some(ns.to_string()), tail)),
        _ => None,
    };
    let (rt, namespace, tail) = match namespaced {
        Some(t) => t,
        None => match rest {
            [plural, tail @ ..] => (
                store
                    .find_type(group, version, plural)
                    .ok_or_else(not_found)?,
                None,
                tail,
            ),
            [] => return Err(not_found()),
        },
    };
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, sub] => (Some(name.to_string()), Some(sub.to_string())),
        _ => return Err(not_found()),
    };
    if namespace.is_none() && rt.namespaced && name.is_some() {
        return Err(not_found());
    }
    if let Some(sub) = &subresource {
        let served = (sub == "status" && rt.has_status) || rt.extra_subresources.contains(sub);
        if !served {
            return Err(not_found());
        }
    }
    Ok(Target {
        rt,
        namespace,
        name,
        subresource,
    })
}

fn verb_of(call: &Call, t: &Target) -> Result<&'static str, ApiError> {
    let named = t.name.is_some();
    let verb = match (&call.method, named) {
        (&Method::GET, false) if call.query.flag("watch") => "watch",
        (&Method::GET, false) => "list",
        (&Method::GET, true) => "get",
        (&Method::POST, false) => "create",
        (&Method::POST, true) if t.subresource.is_some() => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        (m, _) => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m})"
            )))
        }
    };
    if t.rt.create_only && verb != "create" {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({})",
            t.rt.plural
        )));
    }
    Ok(verb)
}

/// The RBAC attributes of a resource request, as the real API's `RequestInfo` derives them.
fn request_attributes(call: &Call, t: &Target, verb: &str) -> RequestAttributes {
    let mut namespace = t.namespace.clone();
    let mut name = t.name.clone();
    // `/api/v1/namespaces/<n>[/status]` is inside namespace <n> as well.
    if t.rt.group.is_empty() && t.rt.plural == "namespaces" && namespace.is_none() {
        namespace = name.clone();
    }
    // A list or watch pinned to one object by `metadata.name=<n>` is a request for <n>, so
    // rules with `resourceNames` grant it. An unparsable selector leaves the name unset (the
    // handler answers it with 400).
    if matches!(verb, "list" | "watch") && name.is_none() {
        name = call
            .query
            .field_selector(&t.rt)
            .ok()
            .and_then(|selector| selector.exact_name().map(str::to_string))
            .filter(|n| valid_path_segment(n));
    }
    RequestAttributes {
        user: call.user.clone(),
        verb: verb.to_string(),
        api_group: t.rt.group.clone(),
        resource: t.rt.plural.clone(),
        subresource: t.subresource.clone(),
        namespace,
        name,
    }
}

/// Whether `name` could be a path segment (the real API ignores other selected names).
fn valid_path_segment(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
}

fn forbidden(attrs: &RequestAttributes, reason: &str) -> ApiError {
    ApiError::forbidden(rbac::forbidden_message(attrs, reason)).with_details(json!({
        "name": attrs.name.clone().unwrap_or_default(),
        "group": attrs.api_group,
        "kind": attrs.resource,
    }))
}

fn authorize(state: &ServerState, call: &Call, t: &Target, verb: &str) -> Result<(), ApiError> {
    let attrs = request_attributes(call, t, verb);
    state
        .authorizer
        .authorize(state.store.as_ref(), &attrs)
        .map_err(|reason| forbidden(&attrs, &reason))
}

/// Escalation prevention for a write of a Role, ClusterRole or (Cluster)RoleBinding: `obj` is
/// the object as it would be stored, `old` the stored one on update. Like the real API, an
/// update that changes only what garbage collection touches (owner references, finalizers) is
/// not checked.
fn check_escalation(
    state: &ServerState,
    call: &Call,
    t: &Target,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if t.rt.group != "rbac.authorization.k8s.io" {
        return Ok(());
    }
    // The check keys on apiVersion and kind, which a client may leave out of the body.
    let mut obj = obj.clone();
    obj["apiVersion"] = json!(t.rt.api_version());
    obj["kind"] = json!(t.rt.kind);
    if old.is_some_and(|old| only_gc_fields_differ(&obj, old, &t.rt)) {
        return Ok(());
    }
    state
        .authorizer
        .check_escalation(state.store.as_ref(), &call.user, &obj)
        .map_err(|reason| {
            let attrs = RequestAttributes {
                user: call.user.clone(),
                verb: String::new(),
                api_group: t.rt.group.clone(),
                resource: t.rt.plural.clone(),
                subresource: None,
                namespace: t.namespace.clone(),
                name: Some(object::name(&obj).to_string()),
            };
            forbidden(&attrs, &reason)
        })
}

/// Whether `new` equals `old` but for the metadata that garbage collection and the server
/// manage (empty and absent fields count as equal).
fn only_gc_fields_differ(new: &Value, old: &Value, rt: &ResourceType) -> bool {
    const IGNORED: &[&str] = &[
        "ownerReferences",
        "finalizers",
        "managedFields",
        "selfLink",
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ];
    let normalized = |obj: &Value| {
        let mut obj = obj.clone();
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        let meta = object::metadata_mut(&mut obj);
        for key in IGNORED {
            meta.remove(*key);
        }
        meta.retain(|_, v| !is_empty_value(v));
        if let Some(fields) = obj.as_object_mut() {
            fields.retain(|_, v| !is_empty_value(v));
        }
        obj
    };
    normalized(new) == normalized(old)
}

fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

fn parse_body(call: &Call) -> Result<Value, ApiError> {
    if call.body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let media = call.content_type.to_ascii_lowercase();
    if media.contains("protobuf") {
        return protobuf::decode(&call.body);
    }
    if media.contains("cbor") {
        return Err(ApiError::unsupported_media_type(&call.content_type));
    }
    serde_json::from_slice(&call.body).or_else(|json_err| {
        let text = std::str::from_utf8(&call.body)
            .map_err(|_| ApiError::bad_request(format!("the body is not JSON: {json_err}")))?;
        serde_saphyr::from_str::<Value>(text).map_err(|e| {
            ApiError::bad_request(format!(
                "the body is neither JSON ({json_err}) nor YAML ({e})"
            ))
        })
    })
}

/// The field manager of a non-apply write: `fieldManager`, else the user agent's product name.
fn update_manager(call: &Call) -> String {
    if let Some(m) = call.query.get("fieldManager") {
        return m.to_string();
    }
    match call.user_agent.split('/').next() {
        Some(ua) if !ua.is_empty() => ua.to_string(),
        _ => "unknown".to_string(),
    }
}

/// Rejects a body whose `apiVersion`/`kind` do not name the addressed resource.
fn check_type(obj: &Value, rt: &ResourceType) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let version_ok = api_version.is_empty()
        || api_version == rt.api_version()
        || api_version.split('/').next() == Some(rt.group.as_str()) && !rt.group.is_empty();
    if !version_ok || !(kind.is_empty() || kind == rt.kind) {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized or does not match the addressed resource: expected {}, Kind={}, got apiVersion {api_version:?} kind {kind:?}",
            rt.api_version(),
            rt.kind
        )));
    }
    Ok(())
}

/// Checks and fills `metadata.namespace` against the request path.
fn check_namespace(obj: &mut Value, t: &Target) -> Result<(), ApiError> {
    let given = object::namespace(obj).map(str::to_string);
    if t.rt.namespaced {
        match (&given, &t.namespace) {
            (Some(g), Some(ns)) if g != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            (_, Some(ns)) => {
                object::metadata_mut(obj).insert("namespace".into(), json!(ns));
            }
            (_, None) => return Err(ApiError::bad_request("a namespaced resource needs a namespace in the path")),
        }
    } else {
        object::metadata_mut(obj).remove("namespace");
    }
    Ok(())
}

fn list_meta(rv: u64, cont: Option<String>, remaining: Option<u64>) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    meta
}

fn get(state: &ServerState, call: &Call, t: &Target) -> Result<Response, ApiError> {
    let name = t.name.as_deref().unwrap_or_default();
    let obj = state.store.get(&t.rt, t.ns(), name)?;
    if table::wants_table(&call.accept) {
        let meta = json!({"resourceVersion": object::resource_version(&obj).unwrap_or_default()});
        return Ok(json_response(
            StatusCode::OK,
            table::to_table(&t.rt, &[obj], meta, call.query.get("includeObject")),
        ));
    }
    Ok(json_response(StatusCode::OK, obj))
}

fn list(state: &ServerState, call: &Call, t: &Target) -> Result<Response, ApiError> {
    let filter = Filter::from_query(&call.query, &t.rt)?;
    let page = state.store.list(
        &t.rt,
        t.namespace.as_deref(),
        &filter,
        call.query.number("limit")?.filter(|l| *l > 0),
        call.query.get("continue"),
    )?;
    let meta = list_meta(page.resource_version, page.continue_token, page.remaining);
    if table::wants_table(&call.accept) {
        return Ok(json_response(
            StatusCode::OK,
            table::to_table(&t.rt, &page.items, meta, call.query.get("includeObject")),
        ));
    }
    let mut body = json!({
        "kind": format!("{}List", t.rt.kind),
        "apiVersion": t.rt.api_version(),
        "metadata": meta,
    });
    // Moved in: `json!` would copy every item once more (it serializes by reference).
    body["items"] = Value::Array(page.items);
    Ok(json_response(StatusCode::OK, body))
}

fn watch_resource(state: &ServerState, call: &Call, t: &Target) -> Result<Response, ApiError> {
    let filter = Filter::from_query(&call.query, &t.rt)?;
    let send_initial = call.query.flag("sendInitialEvents");
    let start = match call.query.get("resourceVersion") {
        _ if send_initial => Start::CurrentState,
        None | Some("0") => Start::CurrentState,
        Some(rv) => Start::After(
            rv.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
        ),
    };
    let timeout = call
        .query
        .number("timeoutSeconds")?
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let req = WatchRequest {
        rt: t.rt.clone(),
        namespace: t.namespace.clone(),
        filter,
        start,
        bookmarks: call.query.flag("allowWatchBookmarks"),
        initial_events_end_marker: send_initial,
        timeout,
        bookmark_interval: state.bookmark_interval,
        table: table::wants_table(&call.accept)
            .then(|| call.query.get("includeObject").map(str::to_string)),
    };
    let stream = watch::open(state.store.clone(), req);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::internal(format!("building the watch response: {e}")))
}

/// Applies defaults and schema checks of a custom resource (422 on failure), and drops fields
/// the kind does not declare.
fn validate(
    state: &ServerState,
    t: &Target,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let Some(crd) = state.store.crd_of(&t.rt) else {
        let unknown =
            field_validation::unknown_builtin_fields(&t.rt.group, &t.rt.version, &t.rt.kind, obj)
                .unwrap_or_default();
        field_validation::remove_fields(obj, &unknown);
        return Ok(());
    };
    schema::validate_custom_resource(&crd, &t.rt.version, obj, old)
        .map_err(|causes| ApiError::invalid(&t.rt.kind, object::name(obj), &t.rt.group, &causes))
}

/// `fieldValidation` on what the client sent (the object of a create or update, the result of
/// a patch, the configuration of an apply): unknown fields are an error under Strict, warnings
/// under Warn, and removed unless refused.
fn check_fields(
    state: &ServerState,
    call: &Call,
    t: &Target,
    obj: &mut Value,
) -> Result<(), ApiError> {
    let directive = FieldValidation::parse(call.query.get("fieldValidation"))?;
    let unknown = match state.store.crd_of(&t.rt) {
        Some(crd) => schema::unknown_fields(&crd, &t.rt.version, obj),
        None => {
            field_validation::unknown_builtin_fields(&t.rt.group, &t.rt.version, &t.rt.kind, obj)
                .unwrap_or_default()
        }
    };
    call.warn(directive.judge(&unknown)?);
    field_validation::remove_fields(obj, &unknown);
    Ok(())
}

async fn admit(
    state: &ServerState,
    call: &Call,
    t: &Target,
    operation: &str,
    name: &str,
    object: Option<Value>,
    old_object: Option<Value>,
) -> Result<Option<Value>, ApiError> {
    let had_object = object.is_some();
    let input = AdmissionInput {
        operation: operation.to_string(),
        api_version: t.rt.api_version(),
        kind: t.rt.kind.clone(),
        resource: t.rt.plural.clone(),
        subresource: t.subresource.clone(),
        namespace: t.namespace.clone(),
        name: name.to_string(),
        object,
        old_object,
        user: call.user.clone(),
        dry_run: call.query.dry_run(),
    };
    match admission::admit_warning(
        state.store.as_ref(),
        &state.webhook_dialer,
        &state.webhook_credentials,
        input,
    )
    .await
    {
        Ok(admitted) => {
            call.warn(admitted.warnings);
            Ok(had_object.then_some(admitted.object))
        }
        Err(denied) => {
            let reason = match denied.code {
                400 => "BadRequest",
                403 => "Forbidden",
                404 => "NotFound",
                409 => "Conflict",
                422 => "Invalid",
                429 => "TooManyRequests",
                504 => "Timeout",
                _ => "InternalError",
            };
            Err(ApiError::new(denied.code, reason, denied.message))
        }
    }
}

/// Schema validation and RBAC escalation prevention, then admission, then both again if a
/// webhook changed the object. Callers turn `generateName` into a name first: CEL rules on
/// `metadata.name` see the name that will be stored.
async fn validate_and_admit(
    state: &ServerState,
    call: &Call,
    t: &Target,
    operation: &str,
    mut obj: Value,
    old: Option<Value>,
) -> Result<Value, ApiError> {
    validate(state, t, &mut obj, old.as_ref())?;
    check_escalation(state, call, t, &obj, old.as_ref())?;
    let name = object::name(&obj).to_string();
    let admitted = admit(
        state,
        call,
        t,
        operation,
        &name,
        Some(obj.clone()),
        old.clone(),
    )
    .await?
    .unwrap_or(obj.clone());
    if admitted != obj {
        let mut admitted = admitted;
        validate(state, t, &mut admitted, old.as_ref())?;
        check_escalation(state, call, t, &admitted, old.as_ref())?;
        return Ok(admitted);
    }
    Ok(obj)
}

fn write_ctx(call: &Call, t: &Target, manager: String, record_update: bool) -> WriteCtx {
    WriteCtx {
        manager,
        subresource: t.subresource.clone(),
        dry_run: call.query.dry_run(),
        record_update,
    }
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

async fn create(state: &ServerState, call: &Call, t: &Target) -> Result<Response, ApiError> {
    if t.rt.group == "authorization.k8s.io"
        && matches!(
            t.rt.plural.as_str(),
            "selfsubjectaccessreviews" | "subjectaccessreviews"
        )
    {
        let mut body = parse_body(call)?;
        check_type(&body, &t.rt)?;
        // The kind decides whose access is reviewed: it must be the addressed one.
        body["kind"] = json!(t.rt.kind);
        let review = state
            .authorizer
            .handle_access_review(state.store.as_ref(), &call.user, &body)
            .map_err(ApiError::bad_request)?;
        return Ok(json_response(StatusCode::CREATED, review));
    }
    if t.rt.group == "authentication.k8s.io" && t.rt.plural == "tokenreviews" {
        let body = parse_body(call)?;
        let review = tokens::handle_token_review(&state.auth, state.store.as_ref(), &body)
            .map_err(token_error)?;
        return Ok(json_response(StatusCode::CREATED, review));
    }
    if t.subresource.as_deref() == Some("token") {
        let body = parse_body(call)?;
        let name = t.name.as_deref().unwrap_or_default();
        state.store.get(&t.rt, t.ns(), name)?;
        let issued =
            tokens::handle_token_request(&state.auth, state.store.as_ref(), t.ns(), name, &body)
                .map_err(token_error)?;
        return Ok(json_response(StatusCode::CREATED, issued));
    }
    if t.subresource.is_some() {
        return Err(ApiError::method_not_allowed(
            "create is not supported on this subresource",
        ));
    }
    let mut obj = parse_body(call)?;
    check_type(&obj, &t.rt)?;
    check_namespace(&mut obj, t)?;
    check_fields(state, call, t, &mut obj)?;
    if object::name(&obj).is_empty() {
        let generate = object::meta_str(&obj, "generateName")
            .unwrap_or_default()
            .to_string();
        if generate.is_empty() {
            return Err(ApiError::invalid(
                &t.rt.kind,
                "",
                &t.rt.group,
                &["metadata.name: Required value: name or generateName is required".into()],
            ));
        }
        object::metadata_mut(&mut obj).insert(
            "name".into(),
            json!(format!("{generate}{}", random_suffix())),
        );
    }
    if let Some(ns) = &t.namespace {
        if !state.store.namespace_exists(ns)? {
            return Err(ApiError::not_found(ErrTarget {
                group: "",
                resource: "namespaces",
                name: ns,
            }));
        }
    }
    if t.rt.has_status && t.rt.plural != "customresourcedefinitions" {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    let obj = validate_and_admit(state, call, t, "CREATE", obj, None).await?;
    let created =
        state
            .store
            .create(&t.rt, obj, &write_ctx(call, t, update_manager(call), true))?;
    Ok(json_response(StatusCode::CREATED, created))
}

fn token_error(e: tokens::TokenApiError) -> ApiError {
    ApiError::new(e.code, e.reason, e.message)
}

/// Combines the old object with the written one according to what the write may change.
fn scoped_write(old: &Value, new: Value, t: &Target) -> Value {
    match Scope::of(t.subresource.as_deref(), t.rt.has_status) {
        Scope::Whole => new,
        Scope::MainWithoutStatus => {
            let mut merged = new;
            if let Some(m) = merged.as_object_mut() {
                match old.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
            merged
        }
        Scope::Status => {
            let mut merged = old.clone();
            if let Some(m) = merged.as_object_mut() {
                match new.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
            merged
        }
    }
}

async fn update(state: &ServerState, call: &Call, t: &Target) -> Result<Response, ApiError> {
    let name = t.name.as_deref().unwrap_or_default();
    let mut new = parse_body(call)?;
    check_type(&new, &t.rt)?;
    check_namespace(&mut new, t)?;
    check_fields(state, call, t, &mut new)?;
    if object::name(&new) != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            object::name(&new)
        )));
    }
    let old = state.store.get(&t.rt, t.ns(), name)?;
    let old_rv = object::resource_version(&old)
        .unwrap_or_default()
        .to_string();
    if object::resource_version(&new).is_some_and(|rv| rv != old_rv) {
        return Err(ApiError::stale(t.err_target(name)));
    }
    let new = scoped_write(&old, new, t);
    let new = validate_and_admit(state, call, t, "UPDATE", new, Some(old.clone())).await?;
    let updated = state.store.update(
        &t.rt,
        &old_rv,
        new,
        &write_ctx(call, t, update_manager(call), true),
    )?;
    Ok(json_response(StatusCode::OK, updated))
}

async fn patch_resource(
    state: &ServerState,
    call: &Call,
    t: &Target,
) -> Result<Response, ApiError> {
    let kind = PatchKind::from_content_type(&call.content_type)?;
    let patch_body = parse_body(call)?;
    let name = t.name.as_deref().unwrap_or_default();
    for _attempt in 0..PATCH_ATTEMPTS {
        let outcome = match kind {
            PatchKind::Apply => apply_once(state, call, t, name, &patch_body).await,
            _ => patch_once(state, call, t, name, kind, &patch_body).await,
        };
        match outcome {
            // Another write landed between reading and storing: patch the newer object.
            Err(e)
                if e.code == 409 && e.reason == "Conflict" && e.message.contains(RACE_MARKER) =>
            {
                continue
            }
            Err(e) if e.code == 409 && e.reason == "AlreadyExists" && kind == PatchKind::Apply => {
                continue
            }
            other => return other,
        }
    }
    Err(ApiError::conflict(
        t.err_target(name),
        "too many concurrent writes; try again",
    ))
}

/// Part of the stale-object message, used to recognise a lost race worth retrying.
const RACE_MARKER: &str = "the object has been modified";

async fn patch_once(
    state: &ServerState,
    call: &Call,
    t: &Target,
    name: &str,
    kind: PatchKind,
    patch_body: &Value,
) -> Result<Response, ApiError> {
    let old = state.store.get(&t.rt, t.ns(), name)?;
    let old_rv = object::resource_version(&old)
        .unwrap_or_default()
        .to_string();
    let mut doc = old.clone();
    patch::apply_patch(kind, &mut doc, patch_body)?;
    check_fields(state, call, t, &mut doc)?;
    if object::resource_version(&doc).is_some_and(|rv| rv != old_rv) {
        // A resourceVersion in the patch is a precondition; do not retry it.
        return Err(ApiError::conflict(t.err_target(name), "the resourceVersion in the patch does not match the current object; please apply your changes to the latest version and try again"));
    }
    for k in ["name", "namespace"] {
        if object::meta_str(&doc, k) != object::meta_str(&old, k) {
            return Err(ApiError::bad_request(format!(
                "metadata.{k} cannot be changed by a patch"
            )));
        }
    }
    let new = scoped_write(&old, doc, t);
    let new = validate_and_admit(state, call, t, "UPDATE", new, Some(old.clone())).await?;
    let updated = state.store.update(
        &t.rt,
        &old_rv,
        new,
        &write_ctx(call, t, update_manager(call), true),
    )?;
    Ok(json_response(StatusCode::OK, updated))
}

async fn apply_once(
    state: &ServerState,
    call: &Call,
    t: &Target,
    name: &str,
    applied: &Value,
) -> Result<Response, ApiError> {
    let Some(manager) = call.query.get("fieldManager") else {
        return Err(ApiError::invalid(
            "PatchOptions",
            "",
            "meta.k8s.io",
            &["fieldManager: Required value: is required for apply patch".into()],
        ));
    };
    check_type(applied, &t.rt)?;
    if applied.get("apiVersion").is_none() || applied.get("kind").is_none() {
        return Err(ApiError::bad_request(
            "apiVersion and kind must be set in an apply patch",
        ));
    }
    if object::name(applied) != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            object::name(applied)
        )));
    }
    let mut applied = applied.clone();
    check_namespace(&mut applied, t)?;
    check_fields(state, call, t, &mut applied)?;
    let force = call.query.flag("force");
    let scope = Scope::of(t.subresource.as_deref(), t.rt.has_status);
    let old = match state.store.get(&t.rt, t.ns(), name) {
        Ok(o) => Some(o),
        Err(e) if e.code == 404 && t.subresource.is_none() => None,
        Err(e) => return Err(e),
    };
    let mut new = fields::apply(
        old.as_ref(),
        &applied,
        manager,
        force,
        scope,
        t.subresource.as_deref(),
        &t.rt.api_version(),
    )
    .map_err(|conflicts| conflict_error(t, name, &conflicts))?;
    let ctx = write_ctx(call, t, manager.to_string(), false);
    match old {
        None => {
            if let Some(ns) = &t.namespace {
                if !state.store.namespace_exists(ns)? {
                    return Err(ApiError::not_found(ErrTarget {
                        group: "",
                        resource: "namespaces",
                        name: ns,
                    }));
                }
            }
            let meta = object::metadata_mut(&mut new);
            meta.insert("name".into(), json!(name));
            if let Some(ns) = &t.namespace {
                meta.insert("namespace".into(), json!(ns));
            }
            let new = validate_and_admit(state, call, t, "CREATE", new, None).await?;
            let created = state.store.create(&t.rt, new, &ctx)?;
            Ok(json_response(StatusCode::CREATED, created))
        }
        Some(old) => {
            let old_rv = object::resource_version(&old)
                .unwrap_or_default()
                .to_string();
            let new = validate_and_admit(state, call, t, "UPDATE", new, Some(old.clone())).await?;
            let updated = state.store.update(&t.rt, &old_rv, new, &ctx)?;
            Ok(json_response(StatusCode::OK, updated))
        }
    }
}

fn conflict_error(t: &Target, name: &str, conflicts: &[fields::Conflict]) -> ApiError {
    let lines: Vec<String> = conflicts
        .iter()
        .map(|c| {
            format!(
                "conflict with \"{}\" using {}: {}",
                c.manager, c.api_version, c.field
            )
        })
        .collect();
    let plural = if conflicts.len() == 1 { "" } else { "s" };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\" using {}", c.manager, c.api_version), "field": c.field}))
        .collect();
    ApiError::new(
        409,
        "Conflict",
        format!(
            "Apply failed with {} conflict{plural}: {}",
            conflicts.len(),
            lines.join("\n")
        ),
    )
    .with_details(json!({"name": name, "group": t.rt.group, "kind": t.rt.plural, "causes": causes}))
}

/// `DeleteOptions` from the body and the query.
struct DeleteOptions {
    propagation: Propagation,
    precondition_rv: Option<String>,
    precondition_uid: Option<String>,
}

fn delete_options(call: &Call) -> Result<DeleteOptions, ApiError> {
    let body: Value = if call.body.is_empty() {
        json!({})
    } else {
        parse_body(call)?
    };
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or_else(|| call.query.get("propagationPolicy"));
    let orphan = body.get("orphanDependents").and_then(Value::as_bool) == Some(true)
        || call.query.flag("orphanDependents");
    let propagation = match (policy, orphan) {
        (Some("Foreground"), _) => Propagation::Foreground,
        (Some("Orphan"), _) | (None, true) => Propagation::Orphan,
        (Some("Background") | None, _) => Propagation::Background,
        (Some(other), _) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            )))
        }
    };
    let pre = |k: &str| {
        body.pointer(&format!("/preconditions/{k}"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(DeleteOptions {
        propagation,
        precondition_rv: pre("resourceVersion"),
        precondition_uid: pre("uid"),
    })
}

async fn delete(state: &ServerState, call: &Call, t: &Target) -> Result<Response, ApiError> {
    if t.subresource.is_some() {
        return Err(ApiError::method_not_allowed(
            "delete is not supported on subresources",
        ));
    }
    let name = t.name.as_deref().unwrap_or_default();
    let opts = delete_options(call)?;
    let current = state.store.get(&t.rt, t.ns(), name)?;
    admit(state, call, t, "DELETE", name, None, Some(current)).await?;
    let deleted = state.store.delete(
        &t.rt,
        &DeleteRequest {
            namespace: t.ns(),
            name,
            policy: opts.propagation,
            precondition_rv: opts.precondition_rv.as_deref(),
            precondition_uid: opts.precondition_uid.as_deref(),
            dry_run: call.query.dry_run(),
        },
    )?;
    Ok(json_response(StatusCode::OK, deleted))
}

async fn delete_collection(
    state: &ServerState,
    call: &Call,
    t: &Target,
) -> Result<Response, ApiError> {
    let opts = delete_options(call)?;
    let filter = Filter::from_query(&call.query, &t.rt)?;
    let page = state
        .store
        .list(&t.rt, t.namespace.as_deref(), &filter, None, None)?;
    let mut deleted = Vec::new();
    for obj in page.items {
        let name = object::name(&obj).to_string();
        let ns = object::namespace(&obj).unwrap_or_default().to_string();
        admit(state, call, t, "DELETE", &name, None, Some(obj.clone())).await?;
        let req = DeleteRequest {
            namespace: &ns,
            name: &name,
            policy: opts.propagation,
            precondition_rv: None,
            precondition_uid: None,
            dry_run: call.query.dry_run(),
        };
        match state.store.delete(&t.rt, &req) {
            Ok(o) => deleted.push(o),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(json_response(
        StatusCode::OK,
        json!({
            "kind": format!("{}List", t.rt.kind),
            "apiVersion": t.rt.api_version(),
            "metadata": {"resourceVersion": state.store.current_rv().to_string()},
            "items": deleted,
        }),
    ))
}
