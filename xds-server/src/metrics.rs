//! Prometheus metrics of the xds-server. Names follow Prometheus conventions (unit suffixes,
//! `_total` on counters); an instance's registry ([`Metrics::for_instance`]) labels every series
//! with its `tenant` and `revision`, so one query spans every instance of a cluster. Families
//! with a known label set start at zero, so dashboards and alerts see a series before the first
//! event. `docs/guide/monitoring.md` lists them; `config/monitoring/` queries them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Connected proxies by revision and ADS variant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabels {
    pub revision: String,
    /// ADS variant (`sotw`, `delta`).
    pub r#type: String,
}

/// Resource type label (`cds`, `eds`, `lds`, `rds`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    pub r#type: String,
}

/// Why a connection was refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// What triggered a push: the kind of the changed object (lowercase, as `kubectl get` names
/// it), or `members`, `meshconfig`, `resync`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabel {
    pub reason: String,
}

/// A certificate of the tenant CA, named as its file in the `cacerts` layout without `.pem`:
/// `ca-cert` (the signing certificate) or `root-cert` (the root anchoring it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabel {
    pub certificate: String,
}

/// Which per-stream budget a client exceeded ([`crate::ads::budget::BudgetError::limit`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    pub limit: String,
}

/// A bearer token refused before or instead of a TokenReview: the service that was asked and
/// why ([`crate::tokens::Refusal::reason`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenRefusalLabels {
    pub service: String,
    pub reason: String,
}

/// The binary's version.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    pub version: String,
}

/// Resource types every family with a `type` label starts with.
pub const RESOURCE_TYPES: [&str; 4] = ["cds", "eds", "lds", "rds"];
/// Refusal reasons every instance starts with (others appear when they happen).
const KNOWN_REJECTIONS: [&str; 3] = ["not_member", "unauthenticated", "wrong_tenant"];
/// Push trigger reasons every instance starts with (kinds added later appear when they happen).
pub const KNOWN_TRIGGERS: [&str; 10] = [
    "service",
    "endpointslice",
    "pod",
    "serviceentry",
    "sidecar",
    "envoyfilter",
    "namespace",
    "members",
    "meshconfig",
    "resync",
];
/// Certificate request results every instance starts with.
const CERTIFICATE_RESULTS: [&str; 5] = [
    "issued",
    "unauthenticated",
    "not_member",
    "bad_csr",
    "unavailable",
];

/// Answers of the SubjectAccessReviews for gateway credentials every instance starts with.
const CREDENTIAL_REVIEW_RESULTS: [&str; 3] = ["allowed", "denied", "failed"];

/// Outcome of a certificate request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    connected_proxies: Family<ProxyLabels, Gauge>,
    pushes: Family<TypeLabel, Counter>,
    push_latency: Family<TypeLabel, Histogram>,
    nacks: Family<TypeLabel, Counter>,
    rejected: Family<ReasonLabel, Counter>,
    budget_exceeded: Family<LimitLabel, Counter>,
    certificates: Family<ResultLabel, Counter>,
    token_refusals: Family<TokenRefusalLabels, Counter>,
    webhook_refusals: Family<ReasonLabel, Counter>,
    webhooks: meshplane_webhooks::metrics::WebhookMetrics,
    unsynced: Family<TypeLabel, Gauge>,
    triggers: Family<TriggerLabel, Counter>,
    ca_expiry: Family<CertificateLabel, Gauge>,
    debounce: Histogram,
    queue: Histogram,
    members_stale: Gauge,
    members_unverified: Gauge,
    refused_watches: Gauge,
    credential_reviews: Family<ResultLabel, Counter>,
    credentials_refused: Gauge,
    unknown_types: Counter,
    unusable_manifests: Gauge,
    paced: Counter,
    /// Encoded config size of each rendered proxy config.
    pub proxy_config_bytes: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Metrics without instance labels (tests, benches).
    pub fn new() -> Self {
        Self::build(Registry::with_prefix("meshplane_xds"), None)
    }

    /// The metrics of the instance of `revision` of `tenant`: every series carries both.
    pub fn for_instance(tenant: &str, revision: &str) -> Self {
        let registry = Registry::with_prefix_and_labels(
            "meshplane_xds",
            [("tenant".into(), tenant.to_string().into())].into_iter(),
        );
        Self::build(registry, Some(revision))
    }

    fn build(mut root: Registry, revision: Option<&str>) -> Self {
        // `connected_proxies` has its own `revision` label (proxies of one revision).
        let connected_proxies = Family::<ProxyLabels, Gauge>::default();
        root.register(
            "connected_proxies",
            "Proxies connected over ADS, by revision and ADS variant",
            connected_proxies.clone(),
        );
        let registry = match revision {
            Some(r) => root.sub_registry_with_label(("revision".into(), r.to_string().into())),
            None => &mut root,
        };
        let build_info = Family::<VersionLabel, Gauge>::default();
        registry.register(
            "build_info",
            "Always 1; the version of the running xds-server",
            build_info.clone(),
        );
        build_info
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        let unsynced = Family::<TypeLabel, Gauge>::default();
        registry.register(
            "unsynced_proxies",
            "Connected proxies whose latest response of a type is not acknowledged (awaiting ACK or NACKed), at scrape time",
            unsynced.clone(),
        );
        let pushes = Family::<TypeLabel, Counter>::default();
        registry.register(
            "pushes",
            "xDS responses sent, by resource type",
            pushes.clone(),
        );
        let push_latency = Family::<TypeLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        registry.register(
            "push_latency_seconds",
            "Time from the first config change of a batch to its response on the stream",
            push_latency.clone(),
        );
        let nacks = Family::<TypeLabel, Counter>::default();
        registry.register(
            "nacks",
            "Responses rejected by proxies, by resource type",
            nacks.clone(),
        );
        let rejected = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "rejected_connections",
            "ADS streams refused at admission, by reason",
            rejected.clone(),
        );
        let budget_exceeded = Family::<LimitLabel, Counter>::default();
        registry.register(
            "stream_budget_exceeded",
            "ADS streams ended with RESOURCE_EXHAUSTED because the client made the server hold more than a budget allows, by limit",
            budget_exceeded.clone(),
        );
        for limit in crate::ads::budget::LIMITS {
            let _ = budget_exceeded.get_or_create(&LimitLabel {
                limit: limit.to_string(),
            });
        }
        let certificates = Family::<ResultLabel, Counter>::default();
        registry.register(
            "certificate_requests",
            "CreateCertificate requests, by result (issued, unauthenticated, not_member, bad_csr, unavailable)",
            certificates.clone(),
        );
        let token_refusals = Family::<TokenRefusalLabels, Counter>::default();
        registry.register(
            "token_refusals",
            "Bearer tokens refused without a new TokenReview, by service (ads, certificates, debug) and reason: malformed, wrong_audience, expired (read from the token itself), refused_before (a TokenReview refused it within 10 s), peer_budget, namespace_budget, service_budget (reviews for new tokens from that peer address, claimed namespace or service are spent; the caller may retry)",
            token_refusals.clone(),
        );
        let webhook_refusals = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "webhook_refusals",
            "Calls of /inject and /validate refused because the caller is not the authenticated API server (only with the API server's admission client CA configured), by reason: no_certificate, unknown_ca (a certificate no CA in force signed; the handshake fails), name_not_accepted",
            webhook_refusals.clone(),
        );
        for reason in meshplane_webhooks::client_auth::REFUSAL_REASONS {
            let _ = webhook_refusals.get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            });
        }
        // `webhook_requests_total`, `webhook_denials_total`, `webhook_duration_seconds`,
        // `sidecar_injections_total`, `sidecar_injection_skips_total`.
        let webhooks = meshplane_webhooks::metrics::WebhookMetrics::register(
            registry,
            &meshplane_webhooks::metrics::INSTANCE_WEBHOOKS,
        );
        let triggers = Family::<TriggerLabel, Counter>::default();
        registry.register(
            "push_triggers",
            "Source events that changed what some proxy receives, by reason (the changed object's kind, members, meshconfig, resync)",
            triggers.clone(),
        );
        // 5 ms to ~20 s: the debounce window is 100 ms quiet, 1 s at most by default.
        let debounce = Histogram::new(exponential_buckets(0.005, 2.0, 13));
        registry.register(
            "push_debounce_seconds",
            "Time from the first change of a batch to the start of its push (the debounce wait)",
            debounce.clone(),
        );
        // 0.1 ms to ~3 s: rendering is serial, so this grows with the proxies per push.
        let queue = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "proxy_queue_seconds",
            "Time a proxy waits for its snapshot: from the start of a push (or its connection, for its first config) until the push loop hands the snapshot to its stream",
            queue.clone(),
        );
        // No zero start: an expiry of 0 would read as long expired. Absent until the CA loads.
        let ca_expiry = Family::<CertificateLabel, Gauge>::default();
        registry.register(
            "ca_expiry_timestamp_seconds",
            "When the tenant CA's certificates expire (Unix time): ca-cert, the signing certificate (nothing issued outlives it), and root-cert, the root that anchors it; present once the CA has loaded",
            ca_expiry.clone(),
        );
        let members_stale = Gauge::default();
        registry.register(
            "members_stale",
            "1 while the members ConfigMap is deleted or unreadable and the last known members are kept",
            members_stale.clone(),
        );
        let members_unverified = Gauge::default();
        registry.register(
            "members_unverified",
            "Shared isolation: namespaces the members ConfigMap lists that are not the tenant's by their labels and the cluster's control planes and tags, and are not read",
            members_unverified.clone(),
        );
        let refused_watches = Gauge::default();
        registry.register(
            "refused_watches",
            "Watches (one kind in one namespace) the API server refuses (403) before they first listed: the instance serves without those objects until access returns",
            refused_watches.clone(),
        );
        let credential_reviews = Family::<ResultLabel, Counter>::default();
        registry.register(
            "credential_reviews",
            "SubjectAccessReviews asking whether a gateway proxy's ServiceAccount may get a Gateway server's credentialName Secret, by result (allowed, denied, failed)",
            credential_reviews.clone(),
        );
        for result in CREDENTIAL_REVIEW_RESULTS {
            let _ = credential_reviews.get_or_create(&ResultLabel {
                result: result.to_string(),
            });
        }
        let credentials_refused = Gauge::default();
        registry.register(
            "credentials_refused",
            "Gateway credentials (ServiceAccount, Secret) currently refused by SubjectAccessReview: the gateway proxies of that ServiceAccount do not get the servers naming the Secret",
            credentials_refused.clone(),
        );
        let unusable_manifests = Gauge::default();
        registry.register(
            "unusable_manifests",
            "Directory mode: manifest files that do not read whole (not YAML, a document that does not decode or validate); each keeps the objects it last held until it reads whole again",
            unusable_manifests.clone(),
        );
        let unknown_types = Counter::default();
        registry.register(
            "unknown_type_requests",
            "ADS requests for a resource type this server does not serve (not answered; the type is in the instance's log)",
            unknown_types.clone(),
        );
        let paced = Counter::default();
        registry.register(
            "paced_responses",
            "Times a stream's responses waited because its own requests had used its allowance of client-caused responses (a client changing its subscriptions faster than 16 a second after a burst of 64)",
            paced.clone(),
        );
        let proxy_config_bytes = Histogram::new(exponential_buckets(1024.0, 2.0, 16));
        registry.register(
            "proxy_config_bytes",
            "Encoded configuration size per rendered proxy",
            proxy_config_bytes.clone(),
        );
        for t in RESOURCE_TYPES {
            let label = TypeLabel {
                r#type: t.to_string(),
            };
            let _ = pushes.get_or_create(&label);
            let _ = push_latency.get_or_create(&label);
            let _ = nacks.get_or_create(&label);
            let _ = unsynced.get_or_create(&label);
        }
        for reason in KNOWN_REJECTIONS {
            let _ = rejected.get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            });
        }
        for reason in KNOWN_TRIGGERS {
            let _ = triggers.get_or_create(&TriggerLabel {
                reason: reason.to_string(),
            });
        }
        for result in CERTIFICATE_RESULTS {
            let _ = certificates.get_or_create(&ResultLabel {
                result: result.to_string(),
            });
        }
        Self {
            connected_proxies,
            pushes,
            push_latency,
            nacks,
            rejected,
            budget_exceeded,
            certificates,
            token_refusals,
            webhook_refusals,
            webhooks,
            unsynced,
            triggers,
            ca_expiry,
            debounce,
            queue,
            members_stale,
            members_unverified,
            refused_watches,
            credential_reviews,
            credentials_refused,
            unknown_types,
            unusable_manifests,
            paced,
            proxy_config_bytes,
            registry: root,
        }
    }

    /// Sets how many connected proxies have not acknowledged their latest `type_name` response.
    pub fn set_unsynced(&self, type_name: &str, count: i64) {
        self.unsynced
            .get_or_create(&TypeLabel {
                r#type: type_name.to_string(),
            })
            .set(count);
    }

    /// Adds `delta` to the connected proxies of a revision and variant.
    pub fn proxy_connected(&self, revision: &str, protocol: &str, delta: i64) {
        self.connected_proxies
            .get_or_create(&ProxyLabels {
                revision: revision.to_string(),
                r#type: protocol.to_string(),
            })
            .inc_by(delta);
    }

    /// Records a response sent, with its latency from the change.
    pub fn pushed(&self, type_name: &str, latency_seconds: f64) {
        let label = TypeLabel {
            r#type: type_name.to_string(),
        };
        self.pushes.get_or_create(&label).inc();
        self.push_latency
            .get_or_create(&label)
            .observe(latency_seconds);
    }

    /// Records a source event that changed what some proxy receives.
    pub fn push_triggered(&self, reason: &str) {
        self.triggers
            .get_or_create(&TriggerLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Records how long a batch of changes waited in the debouncer.
    pub fn debounced(&self, wait: std::time::Duration) {
        self.debounce.observe(wait.as_secs_f64());
    }

    /// Records how long a proxy waited for its snapshot in the push loop.
    pub fn queued(&self, wait: std::time::Duration) {
        self.queue.observe(wait.as_secs_f64());
    }

    /// Records when the loaded tenant CA's certificates expire (Unix seconds), by file
    /// (`ca-cert`, `root-cert`).
    pub fn ca_loaded(&self, expiries: &[(&str, i64)]) {
        for (certificate, not_after) in expiries {
            self.ca_expiry
                .get_or_create(&CertificateLabel {
                    certificate: certificate.to_string(),
                })
                .set(*not_after);
        }
    }

    /// Records a NACK.
    pub fn nacked(&self, type_name: &str) {
        self.nacks
            .get_or_create(&TypeLabel {
                r#type: type_name.to_string(),
            })
            .inc();
    }

    /// Counts a SubjectAccessReview for a gateway credential by result.
    pub fn credential_review(&self, result: &str) {
        self.credential_reviews
            .get_or_create(&ResultLabel {
                result: result.to_string(),
            })
            .inc();
    }

    /// Sets how many gateway credentials are refused now.
    pub fn credentials_refused(&self, count: usize) {
        self.credentials_refused
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Counts one wait of a stream's responses for its pacing allowance.
    pub fn paced_response(&self) {
        self.paced.inc();
    }

    /// Sets how many manifest files are unusable (directory mode).
    pub fn set_unusable_manifests(&self, files: usize) {
        self.unusable_manifests
            .set(i64::try_from(files).unwrap_or(i64::MAX));
    }

    /// Counts one ADS request for a type this server does not serve.
    pub fn unknown_type_request(&self) {
        self.unknown_types.inc();
    }

    /// Adds `delta` to the watches refused before their first listing.
    pub fn refused_watches(&self, delta: i64) {
        self.refused_watches.inc_by(delta);
    }

    /// Records a refused stream.
    pub fn rejected(&self, reason: &str) {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Records an admission call refused for want of the API server's client certificate.
    pub fn webhook_refused(&self, reason: &str) {
        self.webhook_refusals
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The admission webhooks' requests, denials, latency and injections, for
    /// [`meshplane_webhooks::Webhooks::with_metrics`].
    pub fn webhooks(&self) -> &meshplane_webhooks::metrics::WebhookMetrics {
        &self.webhooks
    }

    /// Starts the token refusal series of `service` at zero.
    pub fn token_refusals_start(&self, service: &str) {
        for refusal in crate::tokens::Refusal::ALL {
            let _ = self.token_refusals.get_or_create(&TokenRefusalLabels {
                service: service.to_string(),
                reason: refusal.reason().to_string(),
            });
        }
    }

    /// Records a bearer token `service` refused without a new TokenReview.
    pub fn token_refused(&self, service: &str, reason: &str) {
        self.token_refusals
            .get_or_create(&TokenRefusalLabels {
                service: service.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Records a stream ended for exceeding the budget named `limit`.
    pub fn budget_exceeded(&self, limit: &str) {
        self.budget_exceeded
            .get_or_create(&LimitLabel {
                limit: limit.to_string(),
            })
            .inc();
    }

    /// Whether the members in use are the last known ones, kept because the members ConfigMap
    /// is deleted or unreadable.
    pub fn set_members_stale(&self, stale: bool) {
        self.members_stale.set(i64::from(stale));
    }

    /// How many namespaces the members ConfigMap lists that membership does not confirm
    /// (Shared isolation), which the instance does not read.
    pub fn set_members_unverified(&self, count: usize) {
        self.members_unverified
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Records a certificate request's outcome.
    pub fn certificate(&self, result: &str) {
        self.certificates
            .get_or_create(&ResultLabel {
                result: result.to_string(),
            })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instances_series_carry_tenant_and_revision_and_start_at_zero() {
        let m = Metrics::for_instance("blue", "blue-v1");
        m.proxy_connected("blue-v1", "delta", 1);
        m.nacked("cds");
        m.set_unsynced("lds", 2);
        m.push_triggered("sidecar");
        m.debounced(std::time::Duration::from_millis(150));
        m.queued(std::time::Duration::from_micros(50));
        let text = m.encode().expect("encodes");
        for line in [
            r#"meshplane_xds_connected_proxies{tenant="blue",revision="blue-v1",type="delta"} 1"#,
            r#"meshplane_xds_nacks_total{tenant="blue",revision="blue-v1",type="cds"} 1"#,
            r#"meshplane_xds_nacks_total{tenant="blue",revision="blue-v1",type="eds"} 0"#,
            r#"meshplane_xds_unsynced_proxies{tenant="blue",revision="blue-v1",type="lds"} 2"#,
            r#"meshplane_xds_pushes_total{tenant="blue",revision="blue-v1",type="rds"} 0"#,
            r#"meshplane_xds_rejected_connections_total{tenant="blue",revision="blue-v1",reason="not_member"} 0"#,
            r#"meshplane_xds_certificate_requests_total{tenant="blue",revision="blue-v1",result="issued"} 0"#,
            r#"meshplane_xds_push_triggers_total{tenant="blue",revision="blue-v1",reason="sidecar"} 1"#,
            r#"meshplane_xds_push_triggers_total{tenant="blue",revision="blue-v1",reason="endpointslice"} 0"#,
            // 150 ms: above the 80 ms bucket, within 160 ms.
            r#"meshplane_xds_push_debounce_seconds_bucket{tenant="blue",revision="blue-v1",le="0.08"} 0"#,
            r#"meshplane_xds_push_debounce_seconds_bucket{tenant="blue",revision="blue-v1",le="0.16"} 1"#,
            r#"meshplane_xds_push_debounce_seconds_count{tenant="blue",revision="blue-v1"} 1"#,
            r#"meshplane_xds_proxy_queue_seconds_count{tenant="blue",revision="blue-v1"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        let version = format!(
            r#"meshplane_xds_build_info{{tenant="blue",revision="blue-v1",version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.lines().any(|l| l == version), "{text}");
        assert!(
            !text.contains(r#"revision="blue-v1",revision"#),
            "one revision label per series: {text}"
        );
    }

    #[test]
    fn the_instances_webhooks_count_their_answers_under_its_tenant_and_revision() {
        use meshplane_webhooks::inject::{CaptureMode, InjectionConfig};
        let m = Metrics::for_instance("blue", "blue-v1");
        let webhooks = meshplane_webhooks::Webhooks::new(
            InjectionConfig {
                tenant: "blue".into(),
                revision: "blue-v1".into(),
                proxy_image: "proxy:test".into(),
                trust_domain: "cluster.local".into(),
                default_capture_mode: CaptureMode::Default,
            },
            std::sync::Arc::new(meshplane_webhooks::StaticTenant::new(
                "blue",
                "meshplane-blue",
                ["shop"],
            )),
        )
        .with_metrics(m.webhooks().clone());
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "shop",
                "operation": "CREATE",
                "userInfo": {"username": "admin"},
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
                           "spec": {"containers": [{"name": "web", "image": "web:1"}]}},
            }
        });
        let reply = webhooks.inject(review.to_string().as_bytes());
        assert_eq!(reply.body["response"]["allowed"], true, "{reply:?}");
        let _ = webhooks.validate(b"{}");
        let text = m.encode().expect("encodes");
        for line in [
            r#"meshplane_xds_webhook_requests_total{tenant="blue",revision="blue-v1",webhook="inject",outcome="allowed"} 1"#,
            r#"meshplane_xds_webhook_requests_total{tenant="blue",revision="blue-v1",webhook="validate",outcome="error"} 1"#,
            r#"meshplane_xds_webhook_requests_total{tenant="blue",revision="blue-v1",webhook="validate",outcome="denied"} 0"#,
            r#"meshplane_xds_webhook_denials_total{tenant="blue",revision="blue-v1",webhook="validate",reason="foreign_namespace"} 0"#,
            r#"meshplane_xds_webhook_duration_seconds_count{tenant="blue",revision="blue-v1",webhook="inject"} 1"#,
            r#"meshplane_xds_sidecar_injections_total{tenant="blue",revision="blue-v1"} 1"#,
            r#"meshplane_xds_sidecar_injection_skips_total{tenant="blue",revision="blue-v1",reason="opted_out"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}
