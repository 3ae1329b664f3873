//! Admission: calls to the registered mutating and validating webhooks.
//!
//! Like the real API server: mutating webhooks run first, one after the other (configurations
//! sorted by name, webhooks in their listed order), each seeing the previous one's patches;
//! ValidatingAdmissionPolicies (`admission_policy`) and then the validating webhooks run
//! concurrently on the final object. Each webhook is called over
//! HTTPS with an `admission.k8s.io/v1` AdmissionReview, its certificate verified against the
//! configuration's `caBundle` and the service DNS name `<svc>.<ns>.svc` (or the URL's host).
//! With [`WebhookClientCredentials`] (opt-in, as kube-apiserver's
//! `--admission-control-config-file` with a `WebhookAdmissionConfiguration` kubeconfig), the
//! call presents the client certificate of the kubeconfig user matching the webhook's host,
//! with the API server's matching rules.
//!
//! Not implemented: `matchConditions` (webhooks are called as if they matched),
//! `reinvocationPolicy: IfNeeded`, conversion of the object for `matchPolicy: Equivalent`
//! (the object is sent in the request's version), and a `caBundle`-less call using system roots.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, RuleWithOperations, ValidatingWebhook, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};

use super::auth::UserInfo;
use super::lookup::{label_selector_matches, object_labels, ObjectLookup};

const ADMISSION_REGISTRATION: &str = "admissionregistration.k8s.io/v1";
/// The v1 default of `timeoutSeconds`.
const DEFAULT_TIMEOUT_SECONDS: i32 = 10;
/// Webhook responses larger than this are refused (the real limit is of the same order).
const MAX_RESPONSE_BYTES: usize = 3 * 1024 * 1024;

/// One write request, as admission webhooks see it.
#[derive(Debug, Clone)]
pub struct AdmissionInput {
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: String,
    pub api_version: String,
    pub kind: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub object: Option<Value>,
    pub old_object: Option<Value>,
    pub user: UserInfo,
    pub dry_run: bool,
}

/// A request rejected by admission: answer with a `Status` of this code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionDenied {
    pub code: u16,
    pub message: String,
}

impl AdmissionDenied {
    /// The `reason` of the `Status` to answer with.
    pub fn reason(&self) -> &'static str {
        match self.code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            422 => "Invalid",
            500 => "InternalError",
            _ => "",
        }
    }
}

/// Why calling one webhook failed (its `failurePolicy` decides what that means).
#[derive(Debug, thiserror::Error)]
pub enum WebhookCallError {
    #[error("service {namespace}/{name} not found")]
    ServiceNotFound { namespace: String, name: String },
    #[error("service {namespace}/{name} has no port {port}")]
    ServicePortNotFound {
        namespace: String,
        name: String,
        port: i32,
    },
    #[error("no ready endpoints for service {namespace}/{name}")]
    NoEndpoints { namespace: String, name: String },
    #[error("clientConfig has neither service nor url")]
    NoClientConfig,
    #[error("invalid webhook url {0:?}")]
    InvalidUrl(String),
    #[error("invalid caBundle: {0}")]
    InvalidCaBundle(String),
    #[error("invalid client certificate for the webhook: {0}")]
    InvalidClientCertificate(String),
    #[error("invalid server name {0:?}")]
    InvalidServerName(String),
    #[error("failed to connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    #[error("HTTP: {0}")]
    Http(String),
    #[error("context deadline exceeded (timeout {0}s)")]
    Timeout(i32),
    #[error("webhook answered HTTP {0}")]
    Status(u16),
    #[error("invalid AdmissionReview response: {0}")]
    InvalidResponse(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WebhookKind {
    Mutating,
    Validating,
}

/// The fields of a mutating or validating webhook that admission needs.
#[derive(Debug, Clone)]
struct Webhook {
    name: String,
    kind: WebhookKind,
    client_config: WebhookClientConfig,
    rules: Vec<RuleWithOperations>,
    namespace_selector: Option<LabelSelector>,
    object_selector: Option<LabelSelector>,
    /// `Fail` unless `Ignore`.
    ignore_failure: bool,
    exact_match: bool,
    timeout_seconds: i32,
    side_effects: String,
}

impl From<MutatingWebhook> for Webhook {
    fn from(hook: MutatingWebhook) -> Self {
        Webhook {
            name: hook.name,
            kind: WebhookKind::Mutating,
            client_config: hook.client_config,
            rules: hook.rules.unwrap_or_default(),
            namespace_selector: hook.namespace_selector,
            object_selector: hook.object_selector,
            ignore_failure: hook.failure_policy.as_deref() == Some("Ignore"),
            exact_match: hook.match_policy.as_deref() == Some("Exact"),
            timeout_seconds: hook.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
            side_effects: hook.side_effects,
        }
    }
}

impl From<ValidatingWebhook> for Webhook {
    fn from(hook: ValidatingWebhook) -> Self {
        Webhook {
            name: hook.name,
            kind: WebhookKind::Validating,
            client_config: hook.client_config,
            rules: hook.rules.unwrap_or_default(),
            namespace_selector: hook.namespace_selector,
            object_selector: hook.object_selector,
            ignore_failure: hook.failure_policy.as_deref() == Some("Ignore"),
            exact_match: hook.match_policy.as_deref() == Some("Exact"),
            timeout_seconds: hook.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
            side_effects: hook.side_effects,
        }
    }
}

/// Runs mutating then validating webhooks. Returns the object to store (patched by mutating
/// webhooks); for DELETE, the old object unchanged.
pub async fn admit(
    lookup: &dyn ObjectLookup,
    req: AdmissionInput,
) -> Result<Value, AdmissionDenied> {
    admit_via(lookup, &Dialer::default(), req).await
}

/// How the stand-in opens TCP connections to admission webhooks. A real API server reaches
/// webhook pods over the pod network; with a pod runner, that network is a set of network
/// namespaces, and the runner supplies a dialer that connects from inside it.
#[derive(Clone)]
pub struct Dialer(
    Arc<
        dyn Fn(
                SocketAddr,
            )
                -> futures::future::BoxFuture<'static, std::io::Result<tokio::net::TcpStream>>
            + Send
            + Sync,
    >,
);

impl Dialer {
    /// A dialer from a connect function.
    pub fn new<F, Fut>(connect: F) -> Self
    where
        F: Fn(SocketAddr) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::io::Result<tokio::net::TcpStream>> + Send + 'static,
    {
        Dialer(Arc::new(move |address| Box::pin(connect(address))))
    }

    pub async fn connect(&self, address: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        (self.0)(address).await
    }
}

impl Default for Dialer {
    /// Connects from the stand-in's own network namespace.
    fn default() -> Self {
        Dialer::new(tokio::net::TcpStream::connect)
    }
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dialer")
    }
}

/// A client certificate and its key, PEM.
#[derive(Clone)]
pub struct ClientCertificate {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("ClientCertificate")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// The client certificates admission webhooks are called with, by webhook host: the `users`
/// of the kubeconfig a real API server reads from its `WebhookAdmissionConfiguration`
/// (`kubeConfigFile`). Empty (the default): webhooks are called without one.
#[derive(Clone, Debug, Default)]
pub struct WebhookClientCredentials {
    users: BTreeMap<String, ClientCertificate>,
}

impl WebhookClientCredentials {
    /// Adds the user `name`: a webhook host as the API server matches it, `<svc>.<ns>.svc:<port>`
    /// (`:443` may be left out), a URL's `host:port` (or host for port 443), `*.<suffix>` for
    /// every host ending so, or `*` for any.
    pub fn with(mut self, name: &str, cert_pem: &str, key_pem: &str) -> Self {
        self.users.insert(
            name.to_string(),
            ClientCertificate {
                cert_pem: cert_pem.to_string(),
                key_pem: key_pem.to_string(),
            },
        );
        self
    }

    /// Reads the users of a kubeconfig (`client-certificate-data`/`client-key-data`, or
    /// `client-certificate`/`client-key` files relative to the kubeconfig) as the API server
    /// reads its admission kubeconfig. Users without a client certificate are skipped.
    pub fn from_kubeconfig(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: Value =
            serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(std::path::Path::new("."));
        let read = |user: &Value, data: &str, file: &str| -> Result<Option<String>, String> {
            if let Some(encoded) = user.get(data).and_then(Value::as_str) {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .map_err(|e| format!("{data}: {e}"))?;
                return String::from_utf8(raw)
                    .map(Some)
                    .map_err(|e| format!("{data}: {e}"));
            }
            match user.get(file).and_then(Value::as_str) {
                Some(name) => std::fs::read_to_string(base.join(name))
                    .map(Some)
                    .map_err(|e| format!("{file} {name}: {e}")),
                None => Ok(None),
            }
        };
        let mut credentials = Self::default();
        for entry in config
            .get("users")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(name) = entry.get("name").and_then(Value::as_str) else {
                continue;
            };
            let user = entry.get("user").cloned().unwrap_or(Value::Null);
            let cert = read(&user, "client-certificate-data", "client-certificate")?;
            let key = read(&user, "client-key-data", "client-key")?;
            if let (Some(cert), Some(key)) = (cert, key) {
                credentials = credentials.with(name, &cert, &key);
            }
        }
        Ok(credentials)
    }

    /// The user for a webhook at `host_port` (`host:port`), by the API server's rules: the
    /// exact name, then `*.` + each shorter suffix; for port 443 the same again without the
    /// port; then `*`.
    pub fn resolve(&self, host_port: &str) -> Option<&ClientCertificate> {
        let by_name = |target: &str| {
            self.users.get(target).or_else(|| {
                let steps: Vec<&str> = target.split('.').collect();
                (1..steps.len())
                    .find_map(|i| self.users.get(&format!("*.{}", steps[i..].join("."))))
            })
        };
        by_name(host_port)
            .or_else(|| host_port.strip_suffix(":443").and_then(by_name))
            .or_else(|| self.users.get("*"))
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

/// [`admit`], reaching webhooks through `dialer`.
pub async fn admit_via(
    lookup: &dyn ObjectLookup,
    dialer: &Dialer,
    req: AdmissionInput,
) -> Result<Value, AdmissionDenied> {
    admit_with(lookup, dialer, &WebhookClientCredentials::default(), req).await
}

/// [`admit_via`], presenting the client certificates of `credentials`.
pub async fn admit_with(
    lookup: &dyn ObjectLookup,
    dialer: &Dialer,
    credentials: &WebhookClientCredentials,
    req: AdmissionInput,
) -> Result<Value, AdmissionDenied> {
    admit_warning(lookup, dialer, credentials, req)
        .await
        .map(|admitted| admitted.object)
}

/// What admission let through, and the warnings the webhooks returned with it
/// (`response.warnings`), which the API server hands to the client as `Warning` headers.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    /// The object to store (after the mutating webhooks' patches).
    pub object: Value,
    /// Every webhook's warnings, in the order of the calls.
    pub warnings: Vec<String>,
}

/// [`admit_with`], keeping the webhooks' warnings.
pub async fn admit_warning(
    lookup: &dyn ObjectLookup,
    dialer: &Dialer,
    credentials: &WebhookClientCredentials,
    req: AdmissionInput,
) -> Result<Admitted, AdmissionDenied> {
    let mut warnings = Vec::new();
    // Like the real API, admission configuration is never subject to webhooks, so a broken
    // webhook can always be removed; policies do apply to webhook configurations, but never
    // to policies and their bindings.
    if req.api_version == ADMISSION_REGISTRATION {
        const POLICIES: [&str; 4] = [
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
            "mutatingadmissionpolicies",
            "mutatingadmissionpolicybindings",
        ];
        if !POLICIES.contains(&req.resource.as_str()) {
            super::admission_policy::check(lookup, &req, &namespace_labels(lookup, &req))?;
        }
        return Ok(Admitted {
            object: stored_object(&req),
            warnings,
        });
    }
    let mut req = req;
    let namespace_labels = namespace_labels(lookup, &req);

    for hook in webhooks(lookup, WebhookKind::Mutating) {
        if !matches(&hook, &req, &namespace_labels) {
            continue;
        }
        let Some(response) = call_with_policy(lookup, dialer, credentials, &hook, &req).await?
        else {
            continue;
        };
        warnings.extend(response_warnings(&response));
        if let (Some(patch), Some(object)) = (response.get("patch"), req.object.as_mut()) {
            apply_patch(&hook.name, response.get("patchType"), patch, object)?;
        }
    }

    // The validating phase: in-process policies first, then the webhooks.
    super::admission_policy::check(lookup, &req, &namespace_labels)?;
    let validating: Vec<Webhook> = webhooks(lookup, WebhookKind::Validating)
        .into_iter()
        .filter(|hook| matches(hook, &req, &namespace_labels))
        .collect();
    let calls = validating
        .iter()
        .map(|hook| call_with_policy(lookup, dialer, credentials, hook, &req));
    for outcome in futures::future::join_all(calls).await {
        if let Some(response) = outcome? {
            warnings.extend(response_warnings(&response));
        }
    }
    Ok(Admitted {
        object: stored_object(&req),
        warnings,
    })
}

/// `response.warnings` of an AdmissionReview response: strings, each as the API server passes
/// it on (it drops empty ones).
fn response_warnings(response: &Value) -> Vec<String> {
    response
        .get("warnings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|w| !w.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

fn stored_object(req: &AdmissionInput) -> Value {
    req.object
        .clone()
        .or_else(|| req.old_object.clone())
        .unwrap_or(Value::Null)
}

/// Webhooks of one kind, configurations sorted by name, webhooks in listed order.
fn webhooks(lookup: &dyn ObjectLookup, kind: WebhookKind) -> Vec<Webhook> {
    let config_kind = match kind {
        WebhookKind::Mutating => "MutatingWebhookConfiguration",
        WebhookKind::Validating => "ValidatingWebhookConfiguration",
    };
    let mut configs = lookup.list(ADMISSION_REGISTRATION, config_kind, None);
    configs.sort_by(|a, b| {
        let name = |o: &Value| {
            o.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        name(a).cmp(&name(b))
    });
    let mut hooks = Vec::new();
    for config in configs {
        let Some(list) = config.get("webhooks").cloned() else {
            continue;
        };
        let parsed: Result<Vec<Webhook>, _> = match kind {
            WebhookKind::Mutating => serde_json::from_value::<Vec<MutatingWebhook>>(list)
                .map(|l| l.into_iter().map(Webhook::from).collect()),
            WebhookKind::Validating => serde_json::from_value::<Vec<ValidatingWebhook>>(list)
                .map(|l| l.into_iter().map(Webhook::from).collect()),
        };
        match parsed {
            Ok(parsed) => hooks.extend(parsed),
            Err(error) => {
                tracing::warn!(%error, config_kind, "skipping malformed webhook configuration")
            }
        }
    }
    hooks
}

/// Labels the namespaceSelector sees: the Namespace object itself for Namespace requests, the
/// request's namespace otherwise, None for other cluster-scoped objects (selector not applied).
fn namespace_labels(
    lookup: &dyn ObjectLookup,
    req: &AdmissionInput,
) -> Option<BTreeMap<String, String>> {
    if req.api_version == "v1" && req.kind == "Namespace" {
        let object = req.object.as_ref().or(req.old_object.as_ref())?;
        return Some(object_labels(object));
    }
    let namespace = req.namespace.as_deref()?;
    // A namespace that does not exist (yet) has no labels.
    Some(
        lookup
            .get("v1", "Namespace", None, namespace)
            .map(|ns| object_labels(&ns))
            .unwrap_or_default(),
    )
}

fn matches(
    hook: &Webhook,
    req: &AdmissionInput,
    namespace_labels: &Option<BTreeMap<String, String>>,
) -> bool {
    if !hook
        .rules
        .iter()
        .any(|rule| rule_matches(rule, req, hook.exact_match))
    {
        return false;
    }
    if let (Some(selector), Some(labels)) = (&hook.namespace_selector, namespace_labels) {
        if !selector_matches(&hook.name, selector, labels) {
            return false;
        }
    }
    if let Some(selector) = &hook.object_selector {
        // Matches when either the new or the old object matches, as in the real API.
        let candidates = [req.object.as_ref(), req.old_object.as_ref()];
        let any = candidates
            .into_iter()
            .flatten()
            .any(|object| selector_matches(&hook.name, selector, &object_labels(object)));
        if !any {
            return false;
        }
    }
    true
}

fn selector_matches(
    hook: &str,
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    label_selector_matches(selector, labels).unwrap_or_else(|error| {
        tracing::warn!(hook, %error, "invalid selector; webhook not called");
        false
    })
}

fn group_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

pub(crate) fn rule_matches(rule: &RuleWithOperations, req: &AdmissionInput, exact: bool) -> bool {
    let listed = |values: &Option<Vec<String>>, wanted: &str| {
        values.iter().flatten().any(|v| v == "*" || v == wanted)
    };
    let (group, version) = group_version(&req.api_version);
    // `Equivalent` also takes other versions of the same resource (sent unconverted).
    let version_matches = listed(&rule.api_versions, version) || !exact;
    let scope_matches = match rule.scope.as_deref().unwrap_or("*") {
        "Cluster" => req.namespace.is_none(),
        "Namespaced" => req.namespace.is_some(),
        _ => true,
    };
    listed(&rule.operations, &req.operation)
        && listed(&rule.api_groups, group)
        && version_matches
        && scope_matches
        && rule
            .resources
            .iter()
            .flatten()
            .any(|r| resource_matches(r, &req.resource, req.subresource.as_deref()))
}

/// `*` is every resource but no subresource, `pods/*` every subresource of pods, `*/scale`
/// every scale subresource, `*/*` everything.
fn resource_matches(rule: &str, resource: &str, subresource: Option<&str>) -> bool {
    let (rule_resource, rule_sub) = match rule.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (rule, None),
    };
    let resource_ok = rule_resource == "*" || rule_resource == resource;
    let sub_ok = match (rule_sub, subresource) {
        (None, None) => true,
        (Some("*"), Some(_)) => true,
        (Some(wanted), Some(actual)) => wanted == actual,
        _ => false,
    };
    resource_ok && sub_ok
}

/// Calls one webhook; applies its failure policy to call errors. Ok(None) when an ignored
/// failure skipped it; Err when it denied the request or failed under `Fail`.
async fn call_with_policy(
    lookup: &dyn ObjectLookup,
    dialer: &Dialer,
    credentials: &WebhookClientCredentials,
    hook: &Webhook,
    req: &AdmissionInput,
) -> Result<Option<Value>, AdmissionDenied> {
    if req.dry_run && !matches!(hook.side_effects.as_str(), "None" | "NoneOnDryRun") {
        return Err(AdmissionDenied {
            code: 400,
            message: format!("admission webhook {:?} does not support dry run", hook.name),
        });
    }
    let uid = new_uid();
    let review = admission_review(&uid, req);
    match call(lookup, dialer, credentials, hook, &review, &uid).await {
        Ok(response) => {
            if response.get("allowed").and_then(Value::as_bool) == Some(true) {
                if hook.kind == WebhookKind::Validating && response.get("patch").is_some() {
                    tracing::warn!(hook = %hook.name, "validating webhook returned a patch; ignored");
                }
                tracing::debug!(hook = %hook.name, "webhook allowed the request");
                Ok(Some(response))
            } else {
                Err(denial(&hook.name, response.get("status")))
            }
        }
        Err(error) if hook.ignore_failure => {
            tracing::warn!(hook = %hook.name, %error, "webhook call failed; ignored (failurePolicy Ignore)");
            Ok(None)
        }
        Err(error) => {
            tracing::warn!(hook = %hook.name, %error, "webhook call failed; request rejected (failurePolicy Fail)");
            Err(AdmissionDenied {
                code: 500,
                message: format!(
                    "Internal error occurred: failed calling webhook {:?}: failed to call webhook: {error}",
                    hook.name
                ),
            })
        }
    }
}

/// The rejection of a webhook, worded like the real API.
fn denial(hook: &str, status: Option<&Value>) -> AdmissionDenied {
    let field = |name: &str| {
        status
            .and_then(|s| s.get(name))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let code = status
        .and_then(|s| s.get("code"))
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let denied_by = format!("admission webhook {hook:?} denied the request");
    let message = match field("message").or_else(|| field("reason")) {
        Some(explanation) => format!("{denied_by}: {explanation}"),
        None => format!("{denied_by} without explanation"),
    };
    AdmissionDenied { code, message }
}

fn apply_patch(
    hook: &str,
    patch_type: Option<&Value>,
    patch: &Value,
    object: &mut Value,
) -> Result<(), AdmissionDenied> {
    let internal = |detail: String| AdmissionDenied {
        code: 500,
        message: format!(
            "Internal error occurred: admission webhook {hook:?} returned a bad patch: {detail}"
        ),
    };
    if patch_type.and_then(Value::as_str) != Some("JSONPatch") {
        return Err(internal("patchType must be JSONPatch".to_string()));
    }
    let decoded = patch_bytes(patch).map_err(internal)?;
    let operations: json_patch::Patch =
        serde_json::from_slice(&decoded).map_err(|e| internal(e.to_string()))?;
    json_patch::patch(object, &operations.0).map_err(|e| internal(e.to_string()))?;
    tracing::debug!(
        hook,
        operations = operations.0.len(),
        "applied webhook patch"
    );
    Ok(())
}

/// The bytes of `response.patch`: Go's JSON for `[]byte` is a base64 string, and it also
/// accepts an array of numbers, which is what kube-rs webhooks send.
fn patch_bytes(patch: &Value) -> Result<Vec<u8>, String> {
    match patch {
        Value::String(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| e.to_string()),
        Value::Array(items) => items
            .iter()
            .map(|b| {
                b.as_u64()
                    .and_then(|b| u8::try_from(b).ok())
                    .ok_or_else(|| format!("patch byte {b} is not in 0..=255"))
            })
            .collect(),
        other => Err(format!("patch must be base64 bytes, got {other}")),
    }
}

fn admission_review(uid: &str, req: &AdmissionInput) -> Value {
    let (group, version) = group_version(&req.api_version);
    let options_kind = match req.operation.as_str() {
        "CREATE" => Some("CreateOptions"),
        "UPDATE" => Some("UpdateOptions"),
        "DELETE" => Some("DeleteOptions"),
        _ => None,
    };
    let kind = json!({"group": group, "version": version, "kind": req.kind});
    let resource = json!({"group": group, "version": version, "resource": req.resource});
    let mut request = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": req.name,
        "operation": req.operation,
        "userInfo": {"username": req.user.username, "groups": req.user.groups},
        "object": req.object,
        "oldObject": req.old_object,
        "dryRun": req.dry_run,
    });
    if let Some(sub) = &req.subresource {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    if let Some(namespace) = &req.namespace {
        request["namespace"] = json!(namespace);
    }
    if let Some(kind) = options_kind {
        request["options"] = json!({"apiVersion": "meta.k8s.io/v1", "kind": kind});
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// A random request uid in UUID form.
fn new_uid() -> String {
    let bytes: [u8; 16] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Where and how to reach one webhook.
#[derive(Debug)]
struct CallTarget {
    /// Host and port to connect to (an endpoint IP for services).
    connect_host: String,
    connect_port: u16,
    /// The name the certificate must be valid for.
    server_name: String,
    /// `Host` header.
    authority: String,
    /// The host and port the API server looks the webhook's client credentials up by.
    credentials_name: String,
    path: String,
}

async fn call(
    lookup: &dyn ObjectLookup,
    dialer: &Dialer,
    credentials: &WebhookClientCredentials,
    hook: &Webhook,
    review: &Value,
    uid: &str,
) -> Result<Value, WebhookCallError> {
    let timeout_seconds = hook.timeout_seconds.clamp(1, 30);
    let target = resolve_target(lookup, &hook.client_config)?;
    let tls = tls_config(
        hook.client_config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.as_slice()),
        credentials.resolve(&target.credentials_name),
    )?;
    let path = format!("{}?timeout={timeout_seconds}s", target.path);
    let body = serde_json::to_vec(review).map_err(|e| WebhookCallError::Http(e.to_string()))?;
    tracing::debug!(hook = %hook.name, host = %target.connect_host, port = target.connect_port,
        server_name = %target.server_name, "calling admission webhook");
    let timeout = Duration::from_secs(timeout_seconds.unsigned_abs().into());
    let response = tokio::time::timeout(timeout, post(dialer, &target, &path, tls, body))
        .await
        .map_err(|_| WebhookCallError::Timeout(timeout_seconds))??;
    parse_response(&response, uid)
}

fn parse_response(body: &[u8], uid: &str) -> Result<Value, WebhookCallError> {
    let review: Value = serde_json::from_slice(body)
        .map_err(|e| WebhookCallError::InvalidResponse(e.to_string()))?;
    if review.get("apiVersion").and_then(Value::as_str) != Some("admission.k8s.io/v1")
        || review.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
    {
        return Err(WebhookCallError::InvalidResponse(
            "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview".to_string(),
        ));
    }
    let response = review
        .get("response")
        .filter(|r| r.is_object())
        .ok_or_else(|| WebhookCallError::InvalidResponse("no response".to_string()))?;
    let got = response
        .get("uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if got != uid {
        return Err(WebhookCallError::InvalidResponse(format!(
            "expected response.uid={uid:?}, got {got:?}"
        )));
    }
    Ok(response.clone())
}

fn resolve_target(
    lookup: &dyn ObjectLookup,
    config: &WebhookClientConfig,
) -> Result<CallTarget, WebhookCallError> {
    if let Some(service) = &config.service {
        let port = service.port.unwrap_or(443);
        let (ip, target_port) = resolve_service(lookup, &service.namespace, &service.name, port)?;
        let server_name = format!("{}.{}.svc", service.name, service.namespace);
        return Ok(CallTarget {
            connect_host: ip.to_string(),
            connect_port: target_port,
            authority: format!("{server_name}:{port}"),
            credentials_name: format!("{server_name}:{port}"),
            server_name,
            path: service.path.clone().unwrap_or_else(|| "/".to_string()),
        });
    }
    let url = config
        .url
        .as_deref()
        .ok_or(WebhookCallError::NoClientConfig)?;
    let uri: http::Uri = url
        .parse()
        .map_err(|_| WebhookCallError::InvalidUrl(url.to_string()))?;
    if uri.scheme_str() != Some("https") {
        return Err(WebhookCallError::InvalidUrl(url.to_string()));
    }
    let host = uri
        .host()
        .ok_or_else(|| WebhookCallError::InvalidUrl(url.to_string()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let authority = uri
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_else(|| host.clone());
    let credentials_name = match uri.port_u16() {
        Some(port) => format!("{host}:{port}"),
        None => host.clone(),
    };
    Ok(CallTarget {
        connect_host: host.clone(),
        connect_port: port,
        server_name: host,
        authority,
        credentials_name,
        path: uri.path().to_string(),
    })
}

/// The address of a ready endpoint of a Service and the target port behind its `port`, from the
/// Service's EndpointSlices (as kube-proxy would route it).
fn resolve_service(
    lookup: &dyn ObjectLookup,
    namespace: &str,
    name: &str,
    port: i32,
) -> Result<(IpAddr, u16), WebhookCallError> {
    let service = lookup
        .get("v1", "Service", Some(namespace), name)
        .ok_or_else(|| WebhookCallError::ServiceNotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?;
    let service_port = service
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("port").and_then(Value::as_i64) == Some(i64::from(port)))
        .ok_or_else(|| WebhookCallError::ServicePortNotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
            port,
        })?;
    let port_name = service_port
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // A numeric targetPort (or none: the port itself) is the fallback when a slice lists no ports.
    let numeric_target = match service_port.get("targetPort") {
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Some(_) => None,
        None => u16::try_from(port).ok(),
    };
    let no_endpoints = || WebhookCallError::NoEndpoints {
        namespace: namespace.to_string(),
        name: name.to_string(),
    };
    for slice in lookup.list("discovery.k8s.io/v1", "EndpointSlice", Some(namespace)) {
        if slice
            .pointer("/metadata/labels/kubernetes.io~1service-name")
            .and_then(Value::as_str)
            != Some(name)
        {
            continue;
        }
        let slice_port = slice
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str).unwrap_or_default() == port_name)
            .and_then(|p| p.get("port").and_then(Value::as_u64))
            .and_then(|p| u16::try_from(p).ok())
            .or(numeric_target);
        let Some(slice_port) = slice_port else {
            continue;
        };
        let ready_address = slice
            .get("endpoints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|e| e.pointer("/conditions/ready").and_then(Value::as_bool) != Some(false))
            .flat_map(|e| {
                e.get("addresses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .find_map(|a| a.as_str().and_then(|a| a.parse::<IpAddr>().ok()));
        if let Some(address) = ready_address {
            return Ok((address, slice_port));
        }
    }
    Err(no_endpoints())
}

fn tls_config(
    ca_bundle: Option<&[u8]>,
    client: Option<&ClientCertificate>,
) -> Result<Arc<rustls::ClientConfig>, WebhookCallError> {
    let pem = ca_bundle
        .filter(|b| !b.is_empty())
        .ok_or_else(|| WebhookCallError::InvalidCaBundle("caBundle is empty".to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| WebhookCallError::InvalidCaBundle(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| WebhookCallError::InvalidCaBundle(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(WebhookCallError::InvalidCaBundle(
            "no certificate in caBundle".to_string(),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| WebhookCallError::InvalidCaBundle(e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match client {
        Some(client) => {
            let invalid = |e: String| WebhookCallError::InvalidClientCertificate(e);
            let chain = CertificateDer::pem_slice_iter(client.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(e.to_string()))?;
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes())
                .map_err(|e| invalid(e.to_string()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid(e.to_string()))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

async fn post(
    dialer: &Dialer,
    target: &CallTarget,
    path: &str,
    tls: Arc<rustls::ClientConfig>,
    body: Vec<u8>,
) -> Result<Bytes, WebhookCallError> {
    let server_name = ServerName::try_from(target.server_name.clone())
        .map_err(|_| WebhookCallError::InvalidServerName(target.server_name.clone()))?;
    let address = match target.connect_host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, target.connect_port),
        Err(_) => tokio::net::lookup_host((target.connect_host.as_str(), target.connect_port))
            .await
            .map_err(WebhookCallError::Connect)?
            .next()
            .ok_or_else(|| {
                WebhookCallError::Connect(std::io::Error::other(format!(
                    "{} has no address",
                    target.connect_host
                )))
            })?,
    };
    let tcp = dialer
        .connect(address)
        .await
        .map_err(WebhookCallError::Connect)?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .map_err(WebhookCallError::Tls)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| WebhookCallError::Http(e.to_string()))?;
    let driver = tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "webhook connection ended with an error");
        }
    });
    let request = http::Request::post(path)
        .header(http::header::HOST, &target.authority)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| WebhookCallError::Http(e.to_string()))?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| WebhookCallError::Http(e.to_string()))?;
        let status = response.status();
        let collected = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| WebhookCallError::Http(e.to_string()))?;
        if !status.is_success() {
            return Err(WebhookCallError::Status(status.as_u16()));
        }
        Ok(collected.to_bytes())
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::tests::MemoryLookup;
    use hyper::service::service_fn;
    use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
    use kube::core::DynamicObject;
    use std::convert::Infallible;
    use std::sync::Mutex;

    const SERVICE_DNS_NAME: &str = "webhook.hooks.svc";

    /// A local HTTPS admission webhook built on kube's admission types, answering per path.
    struct WebhookServer {
        port: u16,
        ca_bundle: String,
        seen: Arc<Mutex<Vec<Value>>>,
    }

    fn certificates(server_names: &[&str]) -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = server_names.iter().map(|n| n.to_string()).collect();
        let leaf = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        (ca_cert.pem(), leaf.pem(), leaf_key.serialize_pem())
    }

    async fn respond(path: String, body: Bytes, seen: Arc<Mutex<Vec<Value>>>) -> Value {
        let raw: Value = serde_json::from_slice(&body).unwrap();
        seen.lock().unwrap().push(raw.clone());
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(raw).unwrap();
        let request: AdmissionRequest<DynamicObject> = review.try_into().unwrap();
        let response = AdmissionResponse::from(&request);
        let response = match path.as_str() {
            "/deny" => {
                let mut denied = response.deny("namespace green does not belong to tenant blue");
                denied.result.code = 403;
                denied
            }
            "/label-1" | "/label-2" => {
                let value = if path == "/label-1" { "1" } else { "2" };
                let patch: json_patch::Patch = serde_json::from_value(json!([
                    {"op": "add", "path": "/metadata/labels/injected", "value": value}
                ]))
                .unwrap();
                response.with_patch(patch).unwrap()
            }
            "/require-label-2" => {
                let labels = request
                    .object
                    .as_ref()
                    .map(|o| o.metadata.labels.clone().unwrap_or_default());
                if labels.and_then(|l| l.get("injected").cloned()).as_deref() == Some("2") {
                    response
                } else {
                    response.deny("not patched")
                }
            }
            "/hang" => std::future::pending().await,
            _ => response,
        };
        let mut review = serde_json::to_value(response.into_review()).unwrap();
        if path == "/warn" {
            review["response"]["warnings"] = json!(["spec.old: deprecated, use spec.new", ""]);
        }
        review
    }

    impl WebhookServer {
        async fn start(server_names: &[&str]) -> Self {
            Self::start_with(server_names, None).await
        }

        /// A server that, with `client_ca`, accepts only clients presenting a certificate of
        /// that CA.
        async fn start_with(server_names: &[&str], client_ca: Option<&str>) -> Self {
            let (ca_bundle, cert_pem, key_pem) = certificates(server_names);
            let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .unwrap();
            let builder = match client_ca {
                Some(ca) => {
                    let mut roots = rustls::RootCertStore::empty();
                    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                        roots.add(cert.unwrap()).unwrap();
                    }
                    builder.with_client_cert_verifier(
                        rustls::server::WebPkiClientVerifier::builder_with_provider(
                            Arc::new(roots),
                            provider,
                        )
                        .build()
                        .unwrap(),
                    )
                }
                None => builder.with_no_client_auth(),
            };
            let config = builder.with_single_cert(certs, key).unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let seen_by_server = seen.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    let acceptor = acceptor.clone();
                    let seen = seen_by_server.clone();
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let service =
                            service_fn(move |request: http::Request<hyper::body::Incoming>| {
                                let seen = seen.clone();
                                async move {
                                    let path = request.uri().path().to_string();
                                    let body =
                                        request.into_body().collect().await.unwrap().to_bytes();
                                    let answer = respond(path, body, seen).await;
                                    let bytes = Bytes::from(serde_json::to_vec(&answer).unwrap());
                                    Ok::<_, Infallible>(http::Response::new(Full::new(bytes)))
                                }
                            });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    });
                }
            });
            WebhookServer {
                port,
                ca_bundle,
                seen,
            }
        }

        fn requests(&self) -> Vec<Value> {
            self.seen.lock().unwrap().clone()
        }
    }

    fn base64(pem: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(pem)
    }

    /// Namespaces blue (tenant blue) and green, and Service hooks/webhook routed to `port`.
    fn cluster(port: u16) -> MemoryLookup {
        MemoryLookup::with(vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "blue", "labels": {"meshplane.io/rev": "blue"}}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "green", "labels": {"meshplane.io/rev": "green"}}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "webhook", "namespace": "hooks"},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": "https"}]}}),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "webhook-abc", "namespace": "hooks", "labels": {"kubernetes.io/service-name": "webhook"}},
                "endpoints": [
                    {"addresses": ["127.0.0.9"], "conditions": {"ready": false}},
                    {"addresses": ["127.0.0.1"], "conditions": {"ready": true}},
                ],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}),
        ])
    }

    fn hook(name: &str, path: &str, ca_bundle: &str, extra: Value) -> Value {
        let mut hook = json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {"caBundle": base64(ca_bundle), "service": {"namespace": "hooks", "name": "webhook", "path": path}},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "namespaces"]}],
        });
        if let (Some(hook), Some(extra)) = (hook.as_object_mut(), extra.as_object()) {
            hook.extend(extra.clone());
        }
        hook
    }

    fn configuration(kind: &str, name: &str, hooks: Vec<Value>) -> Value {
        json!({"apiVersion": ADMISSION_REGISTRATION, "kind": kind, "metadata": {"name": name}, "webhooks": hooks})
    }

    fn create_pod(namespace: &str) -> AdmissionInput {
        AdmissionInput {
            operation: "CREATE".into(),
            api_version: "v1".into(),
            kind: "Pod".into(),
            resource: "pods".into(),
            subresource: None,
            namespace: Some(namespace.into()),
            name: "app-0".into(),
            object: Some(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "app-0", "namespace": namespace, "labels": {"app": "shop"}},
                "spec": {"containers": [{"name": "app", "image": "shop:1"}]}})),
            old_object: None,
            user: UserInfo {
                username: "admin".into(),
                groups: vec!["system:masters".into()],
            },
            dry_run: false,
        }
    }

    #[tokio::test]
    async fn allowed_request_sends_a_complete_admission_review() {
        let server = WebhookServer::start(&[SERVICE_DNS_NAME]).await;
        let lookup = cluster(server.port);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "allow.meshplane.io",
                "/allow",
                &server.ca_bundle,
                json!({}),
            )],
        ));
        let input = create_pod("blue");
        let admitted = admit(&lookup, input.clone()).await.unwrap();
        assert_eq!(Some(admitted), input.object);

        let requests = server.requests();
        assert_eq!(requests.len(), 1);
        let request = &requests[0]["request"];
        assert_eq!(request["operation"], "CREATE");
        assert_eq!(request["namespace"], "blue");
        assert_eq!(request["name"], "app-0");
        assert_eq!(
            request["kind"],
            json!({"group": "", "version": "v1", "kind": "Pod"})
        );
        assert_eq!(
            request["resource"],
            json!({"group": "", "version": "v1", "resource": "pods"})
        );
        assert_eq!(request["userInfo"]["username"], "admin");
        assert_eq!(
            request["object"]["spec"]["containers"][0]["image"],
            "shop:1"
        );
        assert_eq!(request["dryRun"], false);
    }

    #[tokio::test]
    async fn denial_carries_the_webhook_message_and_code() {
        let server = WebhookServer::start(&[SERVICE_DNS_NAME]).await;
        let lookup = cluster(server.port);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "deny.meshplane.io",
                "/deny",
                &server.ca_bundle,
                json!({}),
            )],
        ));
        let denied = admit(&lookup, create_pod("green")).await.unwrap_err();
        assert_eq!(
            denied,
            AdmissionDenied {
                code: 403,
                message: "admission webhook \"deny.meshplane.io\" denied the request: namespace green does not belong to tenant blue".into(),
            }
        );
        assert_eq!(denied.reason(), "Forbidden");
    }

    #[tokio::test]
    async fn warnings_of_an_allowing_webhook_reach_the_caller() {
        let server = WebhookServer::start(&[SERVICE_DNS_NAME]).await;
        let lookup = cluster(server.port);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "warn.meshplane.io",
                "/warn",
                &server.ca_bundle,
                json!({}),
            )],
        ));
        let admitted = admit_warning(
            &lookup,
            &Dialer::default(),
            &WebhookClientCredentials::default(),
            create_pod("blue"),
        )
        .await
        .unwrap();
        assert_eq!(
            admitted.warnings,
            vec!["spec.old: deprecated, use spec.new".to_string()],
            "empty warnings are dropped, as the API server does"
        );
        assert_eq!(admitted.object["metadata"]["namespace"], "blue");
    }

    #[tokio::test]
    async fn mutating_webhooks_run_in_name_order_before_validating_ones() {
        let server = WebhookServer::start(&[SERVICE_DNS_NAME]).await;
        let lookup = cluster(server.port);
        // Listed out of order: the configuration named "a-..." must run first.
        lookup.add(configuration(
            "MutatingWebhookConfiguration",
            "b-second",
            vec![hook(
                "two.meshplane.io",
                "/label-2",
                &server.ca_bundle,
                json!({}),
            )],
        ));
        lookup.add(configuration(
            "MutatingWebhookConfiguration",
            "a-first",
            vec![hook(
                "one.meshplane.io",
                "/label-1",
                &server.ca_bundle,
                json!({}),
            )],
        ));
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "check.meshplane.io",
                "/require-label-2",
                &server.ca_bundle,
                json!({}),
            )],
        ));
        let admitted = admit(&lookup, create_pod("blue")).await.unwrap();
        assert_eq!(
            admitted["metadata"]["labels"],
            json!({"app": "shop", "injected": "2"})
        );
        assert_eq!(server.requests().len(), 3);
    }

    #[tokio::test]
    async fn failure_policy_decides_for_unreachable_webhooks() {
        let closed_port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let (ca_bundle, _, _) = certificates(&[SERVICE_DNS_NAME]);
        let lookup = cluster(closed_port);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "ignored.meshplane.io",
                "/allow",
                &ca_bundle,
                json!({"failurePolicy": "Ignore"}),
            )],
        ));
        assert!(admit(&lookup, create_pod("blue")).await.is_ok());

        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "w",
            vec![hook(
                "strict.meshplane.io",
                "/allow",
                &ca_bundle,
                json!({"failurePolicy": "Fail"}),
            )],
        ));
        let denied = admit(&lookup, create_pod("blue")).await.unwrap_err();
        assert_eq!(denied.code, 500);
        assert!(
            denied.message.starts_with(
                "Internal error occurred: failed calling webhook \"strict.meshplane.io\""
            ),
            "{}",
            denied.message
        );

        // A Service without ready endpoints is a call failure too.
        let missing_service = json!({"clientConfig": {"caBundle": base64(&ca_bundle), "service": {"namespace": "hooks", "name": "absent"}}});
        let lookup = cluster(closed_port);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "absent.meshplane.io",
                "/",
                &ca_bundle,
                missing_service,
            )],
        ));
        let denied = admit(&lookup, create_pod("blue")).await.unwrap_err();
        assert!(
            denied.message.contains("service hooks/absent not found"),
            "{}",
            denied.message
        );
    }

    #[tokio::test]
    async fn timeout_applies_the_failure_policy() {
        let server = WebhookServer::start(&[SERVICE_DNS_NAME]).await;
        let lookup = cluster(server.port);
        lookup.add(configuration(
            "MutatingWebhookConfiguration",
            "m",
            vec![hook(
                "slow.meshplane.io",
                "/hang",
                &server.ca_bundle,
                json!({"timeoutSeconds": 1, "failurePolicy": "Ignore"}),
            )],
        ));
        let input = create_pod("blue");
        assert_eq!(
            admit(&lookup, input.clone()).await.unwrap(),
            input.object.clone().unwrap()
        );

        let lookup = cluster(server.port);
        lookup.add(configuration(
            "MutatingWebhookConfiguration",
            "m",
            vec![hook(
                "slow.meshplane.io",
                "/hang",
                &server.ca_bundle,
                json!({"timeoutSeconds": 1}),
            )],
        ));
        let denied = admit(&lookup, input).await.unwrap_err();
        assert_eq!(denied.code, 500);
        assert!(
            denied.message.contains("context deadline exceeded"),
            "{}",
            denied.message
        );
    }

    #[tokio::test]
    async fn certificate_must_match_the_service_name() {
        let server = WebhookServer::start(&["other.hooks.svc", "127.0.0.1"]).await;
        let lookup = cluster(server.port);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "tls.meshplane.io",
                "/allow",
                &server.ca_bundle,
                json!({}),
            )],
        ));
        let denied = admit(&lookup, create_pod("blue")).await.unwrap_err();
        assert!(
            denied.message.contains("TLS handshake failed"),
            "{}",
            denied.message
        );
        assert!(server.requests().is_empty());

        // A caBundle of another CA is refused as well.
        let (other_ca, _, _) = certificates(&["unused"]);
        let good = WebhookServer::start(&[SERVICE_DNS_NAME]).await;
        let lookup = cluster(good.port);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook("tls.meshplane.io", "/allow", &other_ca, json!({}))],
        ));
        assert!(admit(&lookup, create_pod("blue")).await.is_err());
        assert!(good.requests().is_empty());
    }

    /// A client CA and a client certificate it signed: (CA PEM, certificate PEM, key PEM).
    fn client_certificate() -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-admission");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).unwrap();
        (ca_cert.pem(), cert.pem(), key.serialize_pem())
    }

    #[tokio::test]
    async fn configured_client_certificates_are_presented_by_webhook_host() {
        let (client_ca, cert, key) = client_certificate();
        let server = WebhookServer::start_with(&[SERVICE_DNS_NAME], Some(&client_ca)).await;
        let lookup = cluster(server.port);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "auth.meshplane.io",
                "/allow",
                &server.ca_bundle,
                json!({}),
            )],
        ));
        // Like an API server without an admission kubeconfig: no certificate, the webhook
        // refuses the handshake and failurePolicy Fail rejects the request.
        let refused = admit(&lookup, create_pod("blue")).await.unwrap_err();
        assert_eq!(refused.code, 500, "{refused:?}");
        assert!(
            refused.message.contains("failed calling webhook"),
            "{refused:?}"
        );
        // A certificate for another host is not presented either.
        let elsewhere = WebhookClientCredentials::default().with("*.other.svc", &cert, &key);
        assert!(
            admit_with(&lookup, &Dialer::default(), &elsewhere, create_pod("blue"))
                .await
                .is_err()
        );
        assert!(server.requests().is_empty());
        // The service's host (port 443 may be left out of the name): presented and admitted.
        for name in [
            "webhook.hooks.svc",
            "webhook.hooks.svc:443",
            "*.hooks.svc",
            "*.svc:443",
            "*",
        ] {
            let credentials = WebhookClientCredentials::default().with(name, &cert, &key);
            admit_with(
                &lookup,
                &Dialer::default(),
                &credentials,
                create_pod("blue"),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        }
        assert_eq!(server.requests().len(), 5);
    }

    #[test]
    fn client_credentials_resolve_like_the_api_servers_admission_kubeconfig() {
        let (_, cert, key) = client_certificate();
        let dir = std::env::temp_dir().join(format!(
            "standin-admission-kubeconfig-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("client.crt"), &cert).unwrap();
        std::fs::write(dir.join("client.key"), &key).unwrap();
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: hook.blue.svc:15017\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n- name: '*.green.svc:15017'\n  user:\n    client-certificate: client.crt\n    client-key: client.key\n- name: token-only\n  user:\n    token: abc\n",
            base64(&cert),
            base64(&key)
        );
        std::fs::write(dir.join("admission.kubeconfig"), kubeconfig).unwrap();
        let credentials =
            WebhookClientCredentials::from_kubeconfig(&dir.join("admission.kubeconfig")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let found = |host: &str| credentials.resolve(host).map(|c| c.cert_pem.clone());
        assert_eq!(found("hook.blue.svc:15017"), Some(cert.clone()));
        assert_eq!(found("hook.green.svc:15017"), Some(cert.clone()));
        assert_eq!(found("a.b.green.svc:15017"), Some(cert.clone()));
        // Another port, another namespace, a user without a certificate: none.
        assert_eq!(found("hook.blue.svc:443"), None);
        assert_eq!(found("hook.red.svc:15017"), None);
        assert_eq!(found("token-only"), None);
        // Port 443 falls back to the bare host; `*` is the default.
        let credentials = WebhookClientCredentials::default()
            .with("hook.blue.svc", &cert, "k1")
            .with("*", &cert, "k2");
        assert_eq!(
            credentials
                .resolve("hook.blue.svc:443")
                .map(|c| c.key_pem.as_str()),
            Some("k1")
        );
        assert_eq!(
            credentials
                .resolve("hook.blue.svc:8443")
                .map(|c| c.key_pem.as_str()),
            Some("k2")
        );
    }

    #[tokio::test]
    async fn url_client_config_is_supported() {
        let server = WebhookServer::start(&["127.0.0.1"]).await;
        let lookup = cluster(server.port);
        let by_url = json!({"clientConfig": {"caBundle": base64(&server.ca_bundle), "url": format!("https://127.0.0.1:{}/deny", server.port)}});
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook("url.meshplane.io", "/", &server.ca_bundle, by_url)],
        ));
        let denied = admit(&lookup, create_pod("blue")).await.unwrap_err();
        assert_eq!(denied.code, 403);
    }

    #[tokio::test]
    async fn namespace_and_object_selectors_limit_calls() {
        let server = WebhookServer::start(&[SERVICE_DNS_NAME]).await;
        let lookup = cluster(server.port);
        let blue_only = json!({"namespaceSelector": {"matchLabels": {"meshplane.io/rev": "blue"}}});
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "blue.meshplane.io",
                "/deny",
                &server.ca_bundle,
                blue_only,
            )],
        ));
        assert!(admit(&lookup, create_pod("green")).await.is_ok());
        assert!(server.requests().is_empty());
        assert!(admit(&lookup, create_pod("blue")).await.is_err());

        // A Namespace is matched against its own labels.
        let mut create_namespace = create_pod("unused");
        create_namespace.kind = "Namespace".into();
        create_namespace.resource = "namespaces".into();
        create_namespace.namespace = None;
        create_namespace.name = "shop".into();
        create_namespace.object = Some(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop", "labels": {"meshplane.io/rev": "blue"}}}),
        );
        assert!(admit(&lookup, create_namespace.clone()).await.is_err());
        create_namespace.object =
            Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}));
        assert!(admit(&lookup, create_namespace).await.is_ok());

        let lookup = cluster(server.port);
        let injected_only = json!({"objectSelector": {"matchExpressions": [{"key": "sidecar", "operator": "Exists"}]}});
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "obj.meshplane.io",
                "/deny",
                &server.ca_bundle,
                injected_only,
            )],
        ));
        assert!(admit(&lookup, create_pod("blue")).await.is_ok());
        let mut labelled = create_pod("blue");
        labelled.object.as_mut().unwrap()["metadata"]["labels"]["sidecar"] = json!("yes");
        assert!(admit(&lookup, labelled).await.is_err());
    }

    #[tokio::test]
    async fn dry_run_refused_by_webhooks_with_side_effects() {
        let server = WebhookServer::start(&[SERVICE_DNS_NAME]).await;
        let lookup = cluster(server.port);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![hook(
                "fx.meshplane.io",
                "/allow",
                &server.ca_bundle,
                json!({"sideEffects": "Unknown"}),
            )],
        ));
        let mut input = create_pod("blue");
        assert!(admit(&lookup, input.clone()).await.is_ok());
        input.dry_run = true;
        let denied = admit(&lookup, input).await.unwrap_err();
        assert_eq!(denied.code, 400);
        assert!(denied.message.contains("does not support dry run"));
    }

    #[test]
    fn patches_in_go_and_kube_rs_encodings_apply() {
        let ops = r#"[{"op":"replace","path":"/a","value":2}]"#;
        let as_base64 = json!(base64::engine::general_purpose::STANDARD.encode(ops));
        let as_numbers = json!(ops.as_bytes());
        for encoded in [as_base64, as_numbers] {
            let mut object = json!({"a": 1});
            apply_patch("h", Some(&json!("JSONPatch")), &encoded, &mut object).unwrap();
            assert_eq!(object, json!({"a": 2}));
        }
        let mut object = json!({"a": 1});
        let bad = apply_patch("h", Some(&json!("JSONPatch")), &json!([300]), &mut object);
        assert_eq!(bad.unwrap_err().code, 500);
        let failing = json!(base64::engine::general_purpose::STANDARD
            .encode(r#"[{"op":"remove","path":"/missing"}]"#));
        assert!(apply_patch("h", Some(&json!("JSONPatch")), &failing, &mut object).is_err());
        assert_eq!(object, json!({"a": 1}));
    }

    #[test]
    fn rule_matching() {
        assert!(resource_matches("pods", "pods", None));
        assert!(!resource_matches("pods", "pods", Some("status")));
        assert!(resource_matches("*", "pods", None));
        assert!(!resource_matches("*", "pods", Some("status")));
        assert!(resource_matches("pods/*", "pods", Some("status")));
        assert!(resource_matches("*/status", "deployments", Some("status")));
        assert!(!resource_matches("*/status", "deployments", Some("scale")));
        assert!(resource_matches("*/*", "deployments", Some("scale")));
        assert!(!resource_matches("*/*", "deployments", None));

        let rule: RuleWithOperations = serde_json::from_value(json!({
            "operations": ["CREATE"], "apiGroups": ["meshplane.io"], "apiVersions": ["v1alpha1"],
            "resources": ["meshcontrolplanes"], "scope": "Cluster"}))
        .unwrap();
        let mut input = create_pod("unused");
        input.api_version = "meshplane.io/v1alpha1".into();
        input.kind = "MeshControlPlane".into();
        input.resource = "meshcontrolplanes".into();
        input.namespace = None;
        assert!(rule_matches(&rule, &input, true));
        input.operation = "DELETE".into();
        assert!(!rule_matches(&rule, &input, true));
        input.operation = "CREATE".into();
        input.api_version = "meshplane.io/v1beta1".into();
        assert!(!rule_matches(&rule, &input, true));
        assert!(rule_matches(&rule, &input, false));
        input.namespace = Some("blue".into());
        assert!(!rule_matches(&rule, &input, false));
    }

    #[tokio::test]
    async fn webhook_configurations_are_never_admitted_by_webhooks() {
        let lookup = cluster(1);
        let (ca_bundle, _, _) = certificates(&[SERVICE_DNS_NAME]);
        let mut everything = hook("all.meshplane.io", "/", &ca_bundle, json!({}));
        everything["rules"] = json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]);
        lookup.add(configuration(
            "ValidatingWebhookConfiguration",
            "v",
            vec![everything],
        ));
        let mut input = create_pod("unused");
        input.api_version = ADMISSION_REGISTRATION.into();
        input.kind = "ValidatingWebhookConfiguration".into();
        input.resource = "validatingwebhookconfigurations".into();
        input.namespace = None;
        assert!(admit(&lookup, input).await.is_ok());
    }
}
