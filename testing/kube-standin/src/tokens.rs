//! ServiceAccount tokens: TokenRequest (issuing) and TokenReview (checking).
//!
//! Tokens are the opaque random strings of [`Authenticator`]; the stand-in answers both APIs
//! from its in-memory token table, with the checks of the real API: the ServiceAccount (and
//! bound pod) must exist, audiences must intersect, expired tokens are refused.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::auth::{
    parse_service_account_username, Authenticator, BoundPod, TokenRecord, API_SERVER_AUDIENCE,
};
use super::lookup::ObjectLookup;

/// Lifetime when a TokenRequest does not ask for one (the real default).
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// The real API refuses shorter token lifetimes.
const MIN_EXPIRATION_SECONDS: i64 = 600;
/// The real API refuses lifetimes above 2^32 seconds.
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

/// Extra key of a pod-bound token's identity, as the real API sets it.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// An API error to answer a token request with (the server turns it into a `Status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TokenApiError {
    pub code: u16,
    /// `reason` of the Status: `NotFound`, `BadRequest`, `Invalid`.
    pub reason: &'static str,
    pub message: String,
}

impl TokenApiError {
    fn bad_request(message: String) -> Self {
        TokenApiError {
            code: 400,
            reason: "BadRequest",
            message,
        }
    }

    fn invalid(service_account: &str, field: &str, value: &str, detail: &str) -> Self {
        TokenApiError {
            code: 422,
            reason: "Invalid",
            message: format!(
                "TokenRequest.authentication.k8s.io {service_account:?} is invalid: {field}: Invalid value: {value}: {detail}"
            ),
        }
    }

    fn not_found(resource: &str, name: &str) -> Self {
        TokenApiError {
            code: 404,
            reason: "NotFound",
            message: format!("{resource} {name:?} not found"),
        }
    }
}

/// `POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`: issues a token and returns the
/// TokenRequest with `status.token` and `status.expirationTimestamp` (answer 201 Created).
pub fn handle_token_request(
    auth: &Authenticator,
    lookup: &dyn ObjectLookup,
    namespace: &str,
    service_account: &str,
    body: &Value,
) -> Result<Value, TokenApiError> {
    if lookup
        .get("v1", "ServiceAccount", Some(namespace), service_account)
        .is_none()
    {
        return Err(TokenApiError::not_found("serviceaccounts", service_account));
    }
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let audiences = string_list(spec.get("audiences"))
        .map_err(|e| TokenApiError::bad_request(format!("spec.audiences: {e}")))?;
    let expiration_seconds = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(value) => value.as_i64().ok_or_else(|| {
            TokenApiError::bad_request(format!("spec.expirationSeconds: {value} is not an integer"))
        })?,
    };
    if expiration_seconds < MIN_EXPIRATION_SECONDS {
        return Err(TokenApiError::invalid(
            service_account,
            "spec.expirationSeconds",
            &expiration_seconds.to_string(),
            "may not specify a duration less than 10 minutes",
        ));
    }
    if expiration_seconds > MAX_EXPIRATION_SECONDS {
        return Err(TokenApiError::invalid(
            service_account,
            "spec.expirationSeconds",
            &expiration_seconds.to_string(),
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let bound_pod = match spec.get("boundObjectRef") {
        None | Some(Value::Null) => None,
        Some(reference) => Some(bound_pod(lookup, namespace, service_account, reference)?),
    };
    let lifetime = Duration::from_secs(expiration_seconds.unsigned_abs());
    let (token, expires_at) = auth.issue_service_account_token(
        namespace,
        service_account,
        audiences.clone(),
        lifetime,
        bound_pod,
    );
    let mut response = body.clone();
    response["apiVersion"] = json!("authentication.k8s.io/v1");
    response["kind"] = json!("TokenRequest");
    response["metadata"] = json!({
        "name": service_account,
        "namespace": namespace,
        "creationTimestamp": rfc3339(SystemTime::now()),
    });
    response["spec"] = spec;
    response["spec"]["expirationSeconds"] = json!(expiration_seconds);
    let effective_audiences = if audiences.is_empty() {
        vec![API_SERVER_AUDIENCE.to_string()]
    } else {
        audiences
    };
    response["spec"]["audiences"] = json!(effective_audiences);
    response["status"] = json!({"token": token, "expirationTimestamp": rfc3339(expires_at)});
    Ok(response)
}

/// Checks a TokenRequest's `boundObjectRef`: only Pods are supported; the pod must exist, match
/// the given uid and run as the ServiceAccount.
fn bound_pod(
    lookup: &dyn ObjectLookup,
    namespace: &str,
    service_account: &str,
    reference: &Value,
) -> Result<BoundPod, TokenApiError> {
    let kind = reference
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != "Pod" {
        return Err(TokenApiError::invalid(
            service_account,
            "spec.boundObjectRef.kind",
            &format!("{kind:?}"),
            "the stand-in binds tokens to Pods only",
        ));
    }
    let name = reference
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let pod = lookup
        .get("v1", "Pod", Some(namespace), name)
        .ok_or_else(|| TokenApiError::not_found("pods", name))?;
    let pod_uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if let Some(wanted) = reference.get("uid").and_then(Value::as_str) {
        if !wanted.is_empty() && wanted != pod_uid {
            return Err(TokenApiError {
                code: 409,
                reason: "Conflict",
                message: format!(
                    "the UID in the bound object reference ({wanted}) does not match the UID in record ({pod_uid}). The object might have been deleted and then recreated"
                ),
            });
        }
    }
    let pod_service_account = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default");
    if pod_service_account != service_account {
        return Err(TokenApiError::bad_request(format!(
            "cannot bind token for serviceaccount {service_account:?} to pod running with different serviceaccount name."
        )));
    }
    Ok(BoundPod {
        name: name.to_string(),
        uid: pod_uid,
    })
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`: returns the TokenReview with `status`
/// (answer 201 Created). A token that fails review is `authenticated: false` with an `error`,
/// not an API error, as in the real API.
pub fn handle_token_review(
    auth: &Authenticator,
    lookup: &dyn ObjectLookup,
    body: &Value,
) -> Result<Value, TokenApiError> {
    let token = body
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| TokenApiError {
            code: 422,
            reason: "Invalid",
            message: "TokenReview.authentication.k8s.io \"\" is invalid: spec.token: Required value: token must not be empty".to_string(),
        })?;
    let requested = string_list(body.pointer("/spec/audiences"))
        .map_err(|e| TokenApiError::bad_request(format!("spec.audiences: {e}")))?;
    let status = match review(auth, lookup, token, &requested) {
        Ok((record, audiences)) => {
            let mut user = json!({
                "username": record.user.username,
                "groups": record.user.groups,
            });
            if let Some(uid) = service_account_uid(lookup, &record) {
                user["uid"] = json!(uid);
            }
            if let Some(pod) = &record.bound_pod {
                user["extra"] = json!({EXTRA_POD_NAME: [pod.name], EXTRA_POD_UID: [pod.uid]});
            }
            json!({"authenticated": true, "user": user, "audiences": audiences})
        }
        Err(error) => {
            tracing::debug!(%error, "TokenReview refused a token");
            json!({"authenticated": false, "user": {}, "error": error})
        }
    };
    let mut response = body.clone();
    response["apiVersion"] = json!("authentication.k8s.io/v1");
    response["kind"] = json!("TokenReview");
    if response.get("metadata").is_none_or(|m| !m.is_object()) {
        response["metadata"] = json!({});
    }
    response["metadata"]["creationTimestamp"] = json!(rfc3339(SystemTime::now()));
    response["status"] = status;
    Ok(response)
}

/// The token's record and the audiences it was accepted for, or why it is refused.
fn review(
    auth: &Authenticator,
    lookup: &dyn ObjectLookup,
    token: &str,
    requested: &[String],
) -> Result<(TokenRecord, Vec<String>), String> {
    let record = auth
        .lookup(token)
        .ok_or_else(|| "invalid bearer token".to_string())?;
    if record.expires_at.is_some_and(|at| at <= SystemTime::now()) {
        return Err("invalid bearer token, token has expired".to_string());
    }
    let token_audiences = if record.audiences.is_empty() {
        vec![API_SERVER_AUDIENCE.to_string()]
    } else {
        record.audiences.clone()
    };
    // No requested audiences means "valid for the API server".
    let wanted = if requested.is_empty() {
        vec![API_SERVER_AUDIENCE.to_string()]
    } else {
        requested.to_vec()
    };
    let accepted: Vec<String> = wanted
        .iter()
        .filter(|a| token_audiences.contains(a))
        .cloned()
        .collect();
    if accepted.is_empty() {
        return Err(format!(
            "invalid bearer token, token audiences {token_audiences:?} is invalid for the target audiences {wanted:?}"
        ));
    }
    // Issued tokens die with their ServiceAccount and bound pod (fixed identities never expire).
    if record.expires_at.is_some() {
        if let Some((namespace, name)) = parse_service_account_username(&record.user.username) {
            if lookup
                .get("v1", "ServiceAccount", Some(namespace), name)
                .is_none()
            {
                return Err(format!(
                    "invalid bearer token, service account {namespace}/{name} has been deleted"
                ));
            }
            if let Some(pod) = &record.bound_pod {
                let current_uid = lookup
                    .get("v1", "Pod", Some(namespace), &pod.name)
                    .and_then(|p| {
                        p.pointer("/metadata/uid")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    });
                if current_uid.as_deref() != Some(pod.uid.as_str()) {
                    return Err(format!(
                        "invalid bearer token, pod {namespace}/{} has been deleted",
                        pod.name
                    ));
                }
            }
        }
    }
    Ok((record, accepted))
}

fn service_account_uid(lookup: &dyn ObjectLookup, record: &TokenRecord) -> Option<String> {
    let (namespace, name) = parse_service_account_username(&record.user.username)?;
    let account = lookup.get("v1", "ServiceAccount", Some(namespace), name)?;
    account
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn string_list(value: Option<&Value>) -> Result<Vec<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("{item} is not a string"))
            })
            .collect(),
        Some(other) => Err(format!("{other} is not a list of strings")),
    }
}

/// RFC 3339 in UTC with second precision, as Kubernetes writes timestamps.
fn rfc3339(at: SystemTime) -> String {
    let seconds = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let seconds = i64::try_from(seconds).unwrap_or(i64::MAX);
    match k8s_openapi::jiff::Timestamp::from_second(seconds) {
        Ok(timestamp) => timestamp.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        // Out of jiff's range only for absurd clocks; the epoch keeps the field well-formed.
        Err(_) => "1970-01-01T00:00:00Z".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::tests::MemoryLookup;

    fn store() -> MemoryLookup {
        MemoryLookup::with(vec![
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "xds", "namespace": "meshplane-blue", "uid": "sa-uid-1"}}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "xds-0", "namespace": "meshplane-blue", "uid": "pod-uid-1"},
                "spec": {"serviceAccountName": "xds"}}),
        ])
    }

    fn request_token(
        auth: &Authenticator,
        lookup: &MemoryLookup,
        spec: Value,
    ) -> Result<Value, TokenApiError> {
        let body =
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
        handle_token_request(auth, lookup, "meshplane-blue", "xds", &body)
    }

    fn review_token(
        auth: &Authenticator,
        lookup: &MemoryLookup,
        token: &str,
        audiences: Value,
    ) -> Value {
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences}});
        handle_token_review(auth, lookup, &body).unwrap()["status"].clone()
    }

    #[test]
    fn issued_token_reviews_with_identity_audiences_and_pod() {
        let auth = Authenticator::new();
        let lookup = store();
        let issued = request_token(&auth, &lookup, json!({
            "audiences": ["meshplane-xds"], "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "xds-0", "uid": "pod-uid-1"},
        }))
        .unwrap();
        assert_eq!(issued["kind"], "TokenRequest");
        assert_eq!(issued["metadata"]["name"], "xds");
        let token = issued["status"]["token"].as_str().unwrap();
        assert!(issued["status"]["expirationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z'));

        let status = review_token(&auth, &lookup, token, json!(["meshplane-xds", "other"]));
        assert_eq!(status["authenticated"], true, "{status}");
        assert_eq!(
            status["user"]["username"],
            "system:serviceaccount:meshplane-blue:xds"
        );
        assert_eq!(status["user"]["uid"], "sa-uid-1");
        assert_eq!(status["audiences"], json!(["meshplane-xds"]));
        assert!(status["user"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:serviceaccounts:meshplane-blue")));
        assert_eq!(status["user"]["extra"][EXTRA_POD_NAME], json!(["xds-0"]));

        // Not valid for the API server: neither review without audiences nor a request.
        let status = review_token(&auth, &lookup, token, json!(null));
        assert_eq!(status["authenticated"], false);
        assert!(auth.authenticate(Some(&format!("Bearer {token}"))).is_err());
    }

    #[test]
    fn audience_mismatch_is_refused() {
        let auth = Authenticator::new();
        let lookup = store();
        let issued = request_token(&auth, &lookup, json!({"audiences": ["tenant-blue"]})).unwrap();
        let token = issued["status"]["token"].as_str().unwrap();
        let status = review_token(&auth, &lookup, token, json!(["tenant-green"]));
        assert_eq!(status["authenticated"], false);
        let error = status["error"].as_str().unwrap();
        assert!(error.contains("token audiences [\"tenant-blue\"] is invalid for the target audiences [\"tenant-green\"]"), "{error}");
    }

    #[test]
    fn default_audience_is_the_api_server() {
        let auth = Authenticator::new();
        let lookup = store();
        let issued = request_token(&auth, &lookup, json!({})).unwrap();
        assert_eq!(issued["spec"]["expirationSeconds"], 3600);
        let token = issued["status"]["token"].as_str().unwrap();
        let user = auth.authenticate(Some(&format!("Bearer {token}"))).unwrap();
        assert_eq!(user.username, "system:serviceaccount:meshplane-blue:xds");
        assert_eq!(
            review_token(&auth, &lookup, token, json!([]))["authenticated"],
            true
        );
    }

    #[test]
    fn token_dies_with_its_service_account_and_pod() {
        let auth = Authenticator::new();
        let lookup = store();
        let issued = request_token(
            &auth,
            &lookup,
            json!({
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "xds-0"}}),
        )
        .unwrap();
        let token = issued["status"]["token"].as_str().unwrap().to_string();
        lookup
            .objects
            .lock()
            .unwrap()
            .retain(|o| o["kind"] != "Pod");
        let status = review_token(&auth, &lookup, &token, json!(null));
        assert_eq!(status["authenticated"], false);
        assert!(status["error"]
            .as_str()
            .unwrap()
            .contains("pod meshplane-blue/xds-0 has been deleted"));
    }

    #[test]
    fn invalid_requests_are_api_errors() {
        let auth = Authenticator::new();
        let lookup = store();
        let short = request_token(&auth, &lookup, json!({"expirationSeconds": 60})).unwrap_err();
        assert_eq!(short.code, 422);
        assert!(short
            .message
            .contains("may not specify a duration less than 10 minutes"));
        let wrong_uid = request_token(
            &auth,
            &lookup,
            json!({
            "boundObjectRef": {"kind": "Pod", "name": "xds-0", "uid": "stale"}}),
        )
        .unwrap_err();
        assert_eq!(wrong_uid.code, 409);
        let missing = handle_token_request(&auth, &lookup, "meshplane-blue", "nobody", &json!({}))
            .unwrap_err();
        assert_eq!(
            (missing.code, missing.message.as_str()),
            (404, "serviceaccounts \"nobody\" not found")
        );
        let no_token = handle_token_review(&auth, &lookup, &json!({"spec": {}})).unwrap_err();
        assert_eq!(no_token.code, 422);
        assert_eq!(
            review_token(&auth, &lookup, "made-up", json!(null))["authenticated"],
            false
        );
    }

    #[test]
    fn fixed_identities_authenticate() {
        let auth = Authenticator::new();
        let admin = auth.token_for(&crate::auth::Identity::Admin);
        let user = auth.authenticate(Some(&format!("Bearer {admin}"))).unwrap();
        assert!(user.in_group("system:masters"));
        let operator = auth.token_for(&crate::auth::Identity::Operator);
        let user = auth
            .authenticate(Some(&format!("bearer {operator}")))
            .unwrap();
        assert_eq!(
            user.username,
            "system:serviceaccount:meshplane-system:meshplane-operator"
        );
        assert!(auth.authenticate(None).is_err());
        assert!(auth.authenticate(Some("Basic abc")).is_err());
        assert!(auth.authenticate(Some("Bearer nope")).is_err());
    }
}
