//! The two admission handlers of an instance, from request body to response body, without I/O;
//! with [`Webhooks::with_metrics`], each answer is counted by outcome and timed.

use std::sync::Arc;
use std::time::Instant;

use http::StatusCode;
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::DynamicObject;
use meshplane_crds::names;
use serde_json::Value;

use crate::inject::{inject, InjectError, Injection, InjectionConfig, SkipReason};
use crate::metrics::{self, Outcome, WebhookMetrics};
use crate::review::{self, Verdict};
use crate::tenant::TenantView;
use crate::validate::{config_warnings, validate_config, ConfigKind, ConfigViolation};

/// An HTTP answer to an admission call.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// 200 for every answered review; 400 when the body is not a review at all.
    pub status: StatusCode,
    /// The AdmissionReview response.
    pub body: Value,
}

/// The admission webhooks of one revision's instance.
pub struct Webhooks {
    injection: InjectionConfig,
    tenant: Arc<dyn TenantView>,
    metrics: Option<WebhookMetrics>,
}

/// What a handler decided, for the metrics: the outcome, and for injection what became of
/// the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    Injected,
    Skipped(&'static str),
    Allowed,
    Denied(&'static str),
    Error,
}

impl Judged {
    fn outcome(self) -> Outcome {
        match self {
            Judged::Injected | Judged::Skipped(_) | Judged::Allowed => Outcome::Allowed,
            Judged::Denied(reason) => Outcome::Denied(reason),
            Judged::Error => Outcome::Error,
        }
    }
}

impl Webhooks {
    /// Handlers injecting with `injection` and validating against `tenant`'s membership.
    pub fn new(injection: InjectionConfig, tenant: Arc<dyn TenantView>) -> Self {
        Webhooks {
            injection,
            tenant,
            metrics: None,
        }
    }

    /// Counts and times every answer in `metrics` (registered with
    /// [`metrics::INSTANCE_WEBHOOKS`]).
    pub fn with_metrics(mut self, metrics: WebhookMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// `/inject`: the mutating review of a Pod CREATE.
    pub fn inject(&self, body: &[u8]) -> Reply {
        self.answer(metrics::INJECT, body, |req| self.injection_verdict(req))
    }

    /// `/validate`: the validating review of networking config CREATE/UPDATE.
    pub fn validate(&self, body: &[u8]) -> Reply {
        self.answer(metrics::VALIDATE, body, |req| self.validation_verdict(req))
    }

    fn answer(
        &self,
        webhook: &'static str,
        body: &[u8],
        verdict: impl FnOnce(&AdmissionRequest<DynamicObject>) -> (Verdict, Judged),
    ) -> Reply {
        let start = Instant::now();
        let (reply, judged) = answer(body, verdict);
        if let Some(m) = &self.metrics {
            match judged {
                Judged::Injected => m.injected(),
                Judged::Skipped(reason) => m.skipped(reason),
                _ => {}
            }
            m.observe(webhook, judged.outcome(), start.elapsed());
        }
        reply
    }

    fn injection_verdict(&self, req: &AdmissionRequest<DynamicObject>) -> (Verdict, Judged) {
        if req.operation != Operation::Create
            || !req.kind.group.is_empty()
            || req.kind.kind != "Pod"
        {
            return (Verdict::Allow, Judged::Skipped("not_pod_create"));
        }
        let Some(object) = &req.object else {
            return (
                Verdict::bad_request("request.object: missing for a Pod CREATE"),
                Judged::Error,
            );
        };
        let pod: Pod = match serde_json::to_value(object).and_then(serde_json::from_value) {
            Ok(pod) => pod,
            Err(e) => {
                return (
                    Verdict::bad_request(format!("request.object: not a Pod: {e}")),
                    Judged::Error,
                )
            }
        };
        let namespace = req
            .namespace
            .clone()
            .or_else(|| pod.metadata.namespace.clone());
        let Some(namespace) = namespace.filter(|ns| !ns.is_empty()) else {
            return (
                Verdict::bad_request("request.namespace: missing for a Pod CREATE"),
                Judged::Error,
            );
        };
        let pod_name = pod
            .metadata
            .name
            .clone()
            .or_else(|| pod.metadata.generate_name.clone());
        match inject(&pod, &namespace, &self.injection) {
            Ok(Injection::Patch(patch)) => {
                tracing::info!(uid = %req.uid, %namespace, pod = ?pod_name, revision = %self.injection.revision, "injecting sidecar");
                (Verdict::Patch(patch), Judged::Injected)
            }
            Ok(Injection::Skip(reason)) => {
                tracing::debug!(uid = %req.uid, %namespace, pod = ?pod_name, reason = reason.as_str(), "not injecting");
                (Verdict::Allow, Judged::Skipped(skip_label(reason)))
            }
            Err(e) => {
                tracing::info!(uid = %req.uid, %namespace, pod = ?pod_name, error = %e, "refusing pod");
                let reason = inject_denial(&e);
                (Verdict::bad_request(e.to_string()), Judged::Denied(reason))
            }
        }
    }

    fn validation_verdict(&self, req: &AdmissionRequest<DynamicObject>) -> (Verdict, Judged) {
        if !matches!(req.operation, Operation::Create | Operation::Update) {
            return (Verdict::Allow, Judged::Allowed);
        }
        let Some(kind) = ConfigKind::from_group_kind(&req.kind.group, &req.kind.kind) else {
            tracing::warn!(uid = %req.uid, group = %req.kind.group, kind = %req.kind.kind, "unexpected kind sent to /validate; allowing");
            return (Verdict::Allow, Judged::Allowed);
        };
        let Some(object) = &req.object else {
            return (
                Verdict::bad_request(format!(
                    "request.object: missing for a {} {:?}",
                    kind.as_str(),
                    req.operation
                )),
                Judged::Error,
            );
        };
        let mut object = match serde_json::to_value(object) {
            Ok(v) => v,
            Err(e) => {
                return (
                    Verdict::bad_request(format!("request.object: {e}")),
                    Judged::Error,
                )
            }
        };
        if let (Some(ns), Some(meta)) = (
            req.namespace.as_ref(),
            object.get_mut("metadata").and_then(Value::as_object_mut),
        ) {
            meta.entry("namespace")
                .or_insert_with(|| Value::String(ns.clone()));
        }
        if let Some(answer) = self.probe_answer(req, kind, &object) {
            return (answer, Judged::Denied("probe"));
        }
        match validate_config(kind, &object, self.tenant.as_ref()) {
            Ok(()) => match config_warnings(kind, &object).as_slice() {
                [] => (Verdict::Allow, Judged::Allowed),
                warnings => (Verdict::Warn(warnings.to_vec()), Judged::Allowed),
            },
            Err(violations) => {
                let reason = violations.first().map_or("invalid", validate_denial);
                let message = violations
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::info!(uid = %req.uid, kind = kind.as_str(), namespace = ?req.namespace, name = %req.name, %message, "denying config");
                (Verdict::forbidden(message), Judged::Denied(reason))
            }
        }
    }
}

impl Webhooks {
    /// The operator's dry-run probe of this revision (contract 5): refused with the known
    /// answer, which proves to the operator that the API server reaches this webhook. Only a
    /// dry run (never stored) of a Sidecar naming this revision counts; a probe of a sibling
    /// revision is validated like any Sidecar.
    fn probe_answer(
        &self,
        req: &AdmissionRequest<DynamicObject>,
        kind: ConfigKind,
        object: &Value,
    ) -> Option<Verdict> {
        let probed = object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(names::WEBHOOK_PROBE_ANNOTATION))
            .and_then(Value::as_str)?;
        (req.dry_run && kind == ConfigKind::Sidecar && probed == self.injection.revision)
            .then(|| Verdict::forbidden(names::webhook_probe_answer(probed)))
    }
}

/// The `reason` label of a skipped pod (one of [`metrics::SKIP_REASONS`]).
fn skip_label(reason: SkipReason) -> &'static str {
    match reason {
        SkipReason::OptedOut => "opted_out",
        SkipReason::AlreadyInjected => "already_injected",
        SkipReason::HostNetwork => "host_network",
    }
}

/// The `reason` label of a refused pod (one of [`metrics::INJECT_DENIALS`]).
fn inject_denial(error: &InjectError) -> &'static str {
    match error {
        InjectError::InvalidCaptureMode { .. } => "invalid_capture_mode",
        InjectError::InvalidProxylessGrpc { .. } => "invalid_proxyless_grpc",
        InjectError::InvalidCaptureAnnotation(_) => "invalid_capture_annotation",
        InjectError::InvalidCertTtl(_) => "invalid_cert_ttl",
        InjectError::MissingSpec => "missing_spec",
        InjectError::NameTaken { .. } => "name_taken",
    }
}

/// The `reason` label of refused config (one of [`metrics::VALIDATE_DENIALS`]).
fn validate_denial(violation: &ConfigViolation) -> &'static str {
    match violation {
        ConfigViolation::Invalid(_) => "invalid",
        ConfigViolation::ForeignNamespace { .. } => "foreign_namespace",
        ConfigViolation::ForeignPodAddress { .. } => "foreign_pod_address",
        ConfigViolation::ProxySelection { .. } => "proxy_selection",
        ConfigViolation::NeverAuthenticates(_) => "foreign_identity",
        ConfigViolation::Unavailable { .. } => "unsupported",
        ConfigViolation::Policy(_) => "envoyfilter_policy",
        ConfigViolation::Malformed { .. } => "malformed",
    }
}

fn answer(
    body: &[u8],
    verdict: impl FnOnce(&AdmissionRequest<DynamicObject>) -> (Verdict, Judged),
) -> (Reply, Judged) {
    match review::decode(body) {
        Ok(req) => {
            let (verdict, judged) = verdict(&req);
            let reply = Reply {
                status: StatusCode::OK,
                body: review::encode(&req.uid, &verdict),
            };
            (reply, judged)
        }
        Err(e) => {
            tracing::warn!(error = %e, "malformed admission request");
            // With a uid the API server can still show the reason to the user.
            let status = if e.uid.is_some() {
                StatusCode::OK
            } else {
                StatusCode::BAD_REQUEST
            };
            let uid = e.uid.clone().unwrap_or_default();
            let reply = Reply {
                status,
                body: review::encode(&uid, &Verdict::bad_request(e.to_string())),
            };
            (reply, Judged::Error)
        }
    }
}
