//! The `admission.k8s.io/v1` AdmissionReview wire format: decoding a request, encoding a
//! response.
//!
//! Requests decode with kube's `AdmissionReview` types. Responses are encoded here because the
//! Kubernetes API carries `response.patch` as a base64 string (Go's `[]byte`), which kube's
//! `AdmissionResponse` does not produce.

use base64::Engine;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use kube::core::DynamicObject;
use serde_json::{json, Value};

/// API version of the reviews this webhook speaks.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// Kind of the review objects.
pub const KIND: &str = "AdmissionReview";

/// A body that is not a usable AdmissionReview request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed AdmissionReview: {reason}")]
pub struct ReviewError {
    /// `request.uid` when it could be read, so the API server can still match the answer.
    pub uid: Option<String>,
    /// What is wrong.
    pub reason: String,
}

/// Decodes an AdmissionReview v1 request body.
pub fn decode(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, ReviewError> {
    let raw: Value = serde_json::from_slice(body).map_err(|e| ReviewError {
        uid: None,
        reason: format!("body is not JSON: {e}"),
    })?;
    let uid = raw
        .get("request")
        .and_then(|r| r.get("uid"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let fail = |reason: String| ReviewError {
        uid: uid.clone(),
        reason,
    };
    let api_version = raw
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if api_version != API_VERSION || raw.get("kind").and_then(Value::as_str) != Some(KIND) {
        return Err(fail(format!(
            "expected apiVersion {API_VERSION} kind {KIND}, got apiVersion {api_version:?}"
        )));
    }
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_value(raw.clone()).map_err(|e| fail(e.to_string()))?;
    review
        .try_into()
        .map_err(|_| fail("the review has no request".into()))
}

/// What the webhook answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Admit unchanged.
    Allow,
    /// Admit unchanged, with warnings for the client (`response.warnings`; kubectl prints each
    /// as `Warning: ...`).
    Warn(Vec<String>),
    /// Admit with this JSON patch.
    Patch(json_patch::Patch),
    /// Refuse; `code` is the HTTP status the API server reports to the client.
    Deny { code: u16, message: String },
}

impl Verdict {
    /// A refusal by policy (403).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Verdict::Deny {
            code: 403,
            message: message.into(),
        }
    }

    /// A refusal of a malformed request or object (400).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Verdict::Deny {
            code: 400,
            message: message.into(),
        }
    }
}

/// Encodes the AdmissionReview response for the request `uid`.
pub fn encode(uid: &str, verdict: &Verdict) -> Value {
    let response = match verdict {
        Verdict::Allow => json!({ "uid": uid, "allowed": true }),
        Verdict::Warn(warnings) => json!({ "uid": uid, "allowed": true, "warnings": warnings }),
        Verdict::Patch(patch) => {
            // A `Patch` is a list of plain operations: serializing it cannot fail.
            let bytes = serde_json::to_vec(patch).unwrap_or_default();
            json!({
                "uid": uid,
                "allowed": true,
                "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(bytes),
            })
        }
        Verdict::Deny { code, message } => json!({
            "uid": uid,
            "allowed": false,
            "status": { "code": code, "message": message },
        }),
    };
    json!({ "apiVersion": API_VERSION, "kind": KIND, "response": response })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_reports_the_uid_of_a_request_it_cannot_read() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1"}}"#;
        let err = decode(body).unwrap_err();
        assert_eq!(err.uid.as_deref(), Some("u-1"));
        assert!(
            err.to_string().starts_with("malformed AdmissionReview:"),
            "{err}"
        );
    }

    #[test]
    fn decode_rejects_non_json_and_other_versions() {
        assert_eq!(decode(b"not json").unwrap_err().uid, None);
        let v1beta1 = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}"#;
        assert!(decode(v1beta1)
            .unwrap_err()
            .reason
            .contains("admission.k8s.io/v1beta1"));
        let no_request = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        assert_eq!(
            decode(no_request).unwrap_err().reason,
            "the review has no request"
        );
    }

    #[test]
    fn encode_carries_warnings_of_an_admitted_object() {
        let out = encode("u", &Verdict::Warn(vec!["spec.a is deprecated".into()]));
        assert_eq!(out["response"]["allowed"], true);
        assert_eq!(out["response"]["warnings"], json!(["spec.a is deprecated"]));
    }

    #[test]
    fn encode_carries_the_patch_as_base64() {
        let patch: json_patch::Patch =
            serde_json::from_value(json!([{"op": "add", "path": "/a", "value": 1}])).unwrap();
        let out = encode("u", &Verdict::Patch(patch));
        let b64 = out["response"]["patch"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&decoded).unwrap(),
            json!([{"op": "add", "path": "/a", "value": 1}])
        );
        assert_eq!(out["response"]["patchType"], "JSONPatch");
    }
}
