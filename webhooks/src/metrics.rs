//! Prometheus metrics of admission webhooks: requests by outcome, denials by reason, and how
//! long each answer took; for sidecar injection also the pods injected and the pods admitted
//! unchanged, by reason. The instance registers them under `meshplane_xds_` (webhooks `inject`
//! and `validate`), the operator under `meshplane_operator_` (webhook `validate-meshplane`).
//!
//! Every label value comes from a fixed set (the webhook, the outcome, a reason named in this
//! crate or by the caller's `&'static str`), never from the object under review, so the
//! number of series stays bounded whatever the cluster sends. The known series start at zero.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The instance's mutating webhook (`/inject`).
pub const INJECT: &str = "inject";
/// The instance's validating webhook (`/validate`).
pub const VALIDATE: &str = "validate";
/// The operator's validating webhook (`/validate-meshplane`).
pub const VALIDATE_MESHPLANE: &str = "validate-meshplane";

/// Upper bounds of the latency buckets, in seconds: 0.5 ms to 10 s (the API server's
/// timeout for the instance's webhooks).
pub const DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Why the injector refuses a pod ([`crate::inject::InjectError`]).
pub const INJECT_DENIALS: [&str; 6] = [
    "invalid_capture_mode",
    "invalid_proxyless_grpc",
    "invalid_capture_annotation",
    "invalid_cert_ttl",
    "missing_spec",
    "name_taken",
];

/// Why config validation refuses an object ([`crate::validate::ConfigViolation`], the first
/// one of a request), and `probe`: the operator's dry-run probe, refused by design.
pub const VALIDATE_DENIALS: [&str; 9] = [
    "invalid",
    "foreign_namespace",
    "foreign_pod_address",
    "proxy_selection",
    "foreign_identity",
    "unsupported",
    "envoyfilter_policy",
    "malformed",
    "probe",
];

/// Why the injector admits a pod unchanged ([`crate::inject::SkipReason`]), and
/// `not_pod_create`: a request other than a Pod CREATE.
pub const SKIP_REASONS: [&str; 4] = [
    "opted_out",
    "already_injected",
    "host_network",
    "not_pod_create",
];

/// How an admission request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted, with or without a patch.
    Allowed,
    /// Refused for what the object is; the reason is one of the webhook's bounded set.
    Denied(&'static str),
    /// Not judged: the body is not a usable AdmissionReview, the request lacks its object or
    /// carries something else, or what the decision needs could not be read. The API server
    /// refuses the request (the webhooks fail closed).
    Error,
}

impl Outcome {
    /// The `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied(_) => "denied",
            Outcome::Error => "error",
        }
    }
}

/// The outcomes every webhook starts with.
const OUTCOMES: [Outcome; 3] = [Outcome::Allowed, Outcome::Denied(""), Outcome::Error];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabel {
    webhook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    webhook: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    webhook: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SkipLabel {
    reason: String,
}

/// A webhook whose series start at zero: its name and its denial reasons.
#[derive(Debug, Clone, Copy)]
pub struct Webhook {
    /// The `webhook` label ([`INJECT`], [`VALIDATE`], [`VALIDATE_MESHPLANE`]).
    pub name: &'static str,
    /// Every reason it may deny with.
    pub denials: &'static [&'static str],
}

/// The instance's two webhooks.
pub const INSTANCE_WEBHOOKS: [Webhook; 2] = [
    Webhook {
        name: INJECT,
        denials: &INJECT_DENIALS,
    },
    Webhook {
        name: VALIDATE,
        denials: &VALIDATE_DENIALS,
    },
];

/// The metrics of some admission webhooks; cheap to clone (the clones share the series).
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    requests: Family<OutcomeLabels, Counter>,
    denials: Family<ReasonLabels, Counter>,
    duration: Family<WebhookLabel, Histogram>,
    injections: Counter,
    skips: Family<SkipLabel, Counter>,
}

impl WebhookMetrics {
    /// Registers the families in `registry` (which gives the prefix) with the series of
    /// `webhooks` at zero; the injection families only when one of them is [`INJECT`].
    pub fn register(registry: &mut Registry, webhooks: &[Webhook]) -> Self {
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "webhook_requests",
            "Admission requests answered, by webhook and outcome: allowed, denied (by a rule the object breaks), error (not judged: not a usable AdmissionReview, no object, or what the decision needs could not be read; the API server refuses the request)",
            requests.clone(),
        );
        let denials = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "webhook_denials",
            "Admission requests denied, by webhook and reason (one per request: the first rule it breaks)",
            denials.clone(),
        );
        let duration = Family::<WebhookLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(DURATION_BUCKETS)) as fn() -> Histogram,
        );
        registry.register(
            "webhook_duration_seconds",
            "Time to answer an admission request, from its body read to its answer, by webhook",
            duration.clone(),
        );
        let injections = Counter::default();
        let skips = Family::<SkipLabel, Counter>::default();
        if webhooks.iter().any(|w| w.name == INJECT) {
            registry.register(
                "sidecar_injections",
                "Pods admitted with the sidecar injected",
                injections.clone(),
            );
            registry.register(
                "sidecar_injection_skips",
                "Pods admitted unchanged by the injector, by reason: opted_out (label sidecar.meshplane.io/inject=false), already_injected, host_network, not_pod_create (a request other than a Pod CREATE)",
                skips.clone(),
            );
            for reason in SKIP_REASONS {
                let _ = skips.get_or_create(&SkipLabel {
                    reason: reason.to_string(),
                });
            }
        }
        for webhook in webhooks {
            let _ = duration.get_or_create(&WebhookLabel {
                webhook: webhook.name.to_string(),
            });
            for outcome in OUTCOMES {
                let _ = requests.get_or_create(&OutcomeLabels {
                    webhook: webhook.name.to_string(),
                    outcome: outcome.as_str().to_string(),
                });
            }
            for reason in webhook.denials {
                let _ = denials.get_or_create(&ReasonLabels {
                    webhook: webhook.name.to_string(),
                    reason: reason.to_string(),
                });
            }
        }
        WebhookMetrics {
            requests,
            denials,
            duration,
            injections,
            skips,
        }
    }

    /// Records one request of `webhook` that ended with `outcome` after `elapsed`.
    pub fn observe(&self, webhook: &'static str, outcome: Outcome, elapsed: Duration) {
        self.requests
            .get_or_create(&OutcomeLabels {
                webhook: webhook.to_string(),
                outcome: outcome.as_str().to_string(),
            })
            .inc();
        if let Outcome::Denied(reason) = outcome {
            self.denials
                .get_or_create(&ReasonLabels {
                    webhook: webhook.to_string(),
                    reason: reason.to_string(),
                })
                .inc();
        }
        self.duration
            .get_or_create(&WebhookLabel {
                webhook: webhook.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Records a pod admitted with the sidecar.
    pub fn injected(&self) {
        self.injections.inc();
    }

    /// Records a pod admitted unchanged, for one of [`SKIP_REASONS`].
    pub fn skipped(&self, reason: &'static str) {
        self.skips
            .get_or_create(&SkipLabel {
                reason: reason.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).expect("encodes");
        out
    }

    #[test]
    fn every_webhooks_series_start_at_zero_and_move_by_outcome() {
        let mut registry = Registry::with_prefix("test");
        let m = WebhookMetrics::register(&mut registry, &INSTANCE_WEBHOOKS);
        let zero = text(&registry);
        for line in [
            r#"test_webhook_requests_total{webhook="inject",outcome="allowed"} 0"#,
            r#"test_webhook_requests_total{webhook="validate",outcome="error"} 0"#,
            r#"test_webhook_denials_total{webhook="validate",reason="foreign_namespace"} 0"#,
            r#"test_webhook_denials_total{webhook="inject",reason="invalid_cert_ttl"} 0"#,
            r#"test_webhook_duration_seconds_count{webhook="inject"} 0"#,
            r#"test_sidecar_injections_total 0"#,
            r#"test_sidecar_injection_skips_total{reason="opted_out"} 0"#,
        ] {
            assert!(zero.lines().any(|l| l == line), "missing {line} in\n{zero}");
        }
        m.observe(
            VALIDATE,
            Outcome::Denied("foreign_namespace"),
            Duration::from_micros(300),
        );
        m.observe(VALIDATE, Outcome::Error, Duration::from_millis(3));
        m.injected();
        m.skipped("host_network");
        let after = text(&registry);
        for line in [
            r#"test_webhook_requests_total{webhook="validate",outcome="denied"} 1"#,
            r#"test_webhook_requests_total{webhook="validate",outcome="error"} 1"#,
            r#"test_webhook_denials_total{webhook="validate",reason="foreign_namespace"} 1"#,
            // 0.3 ms in the first bucket, 3 ms in the 5 ms one.
            r#"test_webhook_duration_seconds_bucket{le="0.0005",webhook="validate"} 1"#,
            r#"test_webhook_duration_seconds_bucket{le="0.0025",webhook="validate"} 1"#,
            r#"test_webhook_duration_seconds_bucket{le="0.005",webhook="validate"} 2"#,
            r#"test_webhook_duration_seconds_count{webhook="validate"} 2"#,
            r#"test_sidecar_injections_total 1"#,
            r#"test_sidecar_injection_skips_total{reason="host_network"} 1"#,
        ] {
            assert!(
                after.lines().any(|l| l == line),
                "missing {line} in\n{after}"
            );
        }
    }

    #[test]
    fn the_operators_webhook_has_no_injection_families() {
        let mut registry = Registry::with_prefix("op");
        let _ = WebhookMetrics::register(
            &mut registry,
            &[Webhook {
                name: VALIDATE_MESHPLANE,
                denials: &["invalid"],
            }],
        );
        let text = text(&registry);
        assert!(
            text.lines().any(|l| l
                == r#"op_webhook_requests_total{webhook="validate-meshplane",outcome="denied"} 0"#),
            "{text}"
        );
        assert!(!text.contains("sidecar_injection"), "{text}");
    }
}
