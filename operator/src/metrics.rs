//! Prometheus metrics of the operator: reconciles, their durations, errors by reason, and API
//! writes by kind and verb (the steady-state "writes nothing" promise is visible here). The
//! reconcile metrics are exported under controller-runtime's names as well
//! (`controller_runtime_reconcile_total{controller,result}`, `..._errors_total`,
//! `..._time_seconds`), so dashboards written for Go operators apply unchanged. The admission
//! check `/validate-meshplane` is counted by outcome and denial reason and timed
//! (`meshplane_operator_webhook_*`, [`meshplane_webhooks::metrics`]).

use meshplane_webhooks::metrics::{Webhook, WebhookMetrics, VALIDATE_MESHPLANE};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// All operator metrics and their registry.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    writes: Family<Labels, Counter>,
    durations: Family<Labels, Histogram>,
    cr_total: Family<Labels, Counter>,
    cr_errors: Family<Labels, Counter>,
    cr_time: Family<Labels, Histogram>,
    webhook: WebhookMetrics,
}

/// Name of the controllers in Events and metrics. They live here, with the series they label,
/// so that metrics need nothing from the controllers that record into them.
pub const CONTROL_PLANE_CONTROLLER: &str = "meshcontrolplane";
pub const TAG_CONTROLLER: &str = "meshrevisiontag";
pub const MIGRATION_CONTROLLER: &str = "meshrevisionmigration";

/// The controllers whose series exist from the start (at zero).
const CONTROLLERS: [&str; 3] = [
    CONTROL_PLANE_CONTROLLER,
    TAG_CONTROLLER,
    MIGRATION_CONTROLLER,
];

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        let cr_total = Family::<Labels, Counter>::default();
        let cr_errors = Family::<Labels, Counter>::default();
        let cr_time = Family::<Labels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 14))) as fn() -> Histogram,
        );
        {
            let cr = root.sub_registry_with_prefix("controller_runtime");
            cr.register(
                "reconcile",
                "Reconciles, by controller and result (controller-runtime's name)",
                cr_total.clone(),
            );
            cr.register(
                "reconcile_errors",
                "Failed reconciles, by controller (controller-runtime's name)",
                cr_errors.clone(),
            );
            cr.register(
                "reconcile_time_seconds",
                "Duration of reconciles, by controller (controller-runtime's name)",
                cr_time.clone(),
            );
        }
        let registry = root.sub_registry_with_prefix("meshplane_operator");
        let build_info = Family::<Labels, prometheus_client::metrics::gauge::Gauge>::default();
        registry.register(
            "build_info",
            "Always 1; the version of the running operator",
            build_info.clone(),
        );
        build_info
            .get_or_create(&labels(&[("version", env!("CARGO_PKG_VERSION"))]))
            .set(1);
        let reconciles = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let writes = Family::<Labels, Counter>::default();
        let durations = Family::<Labels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 14))) as fn() -> Histogram,
        );
        registry.register(
            "reconciles",
            "Reconciles run, by controller",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by controller and reason",
            errors.clone(),
        );
        registry.register(
            "api_writes",
            "Writes to the Kubernetes API, by kind and verb",
            writes.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconciles, by controller",
            durations.clone(),
        );
        let webhook = WebhookMetrics::register(
            registry,
            &[Webhook {
                name: VALIDATE_MESHPLANE,
                denials: &crate::admission::DENIAL_REASONS,
            }],
        );
        for c in CONTROLLERS {
            let l = labels(&[("controller", c)]);
            let _ = cr_errors.get_or_create(&l);
            let _ = cr_time.get_or_create(&l);
            for result in ["success", "error"] {
                let _ = cr_total.get_or_create(&labels(&[("controller", c), ("result", result)]));
            }
        }
        Self {
            registry: root,
            reconciles,
            errors,
            writes,
            durations,
            cr_total,
            cr_errors,
            cr_time,
            webhook,
        }
    }
}

impl Metrics {
    /// Counts one reconcile of `controller` that took `seconds`.
    pub fn record_reconcile(&self, controller: &str, seconds: f64) {
        let l = labels(&[("controller", controller)]);
        self.reconciles.get_or_create(&l).inc();
        self.durations.get_or_create(&l).observe(seconds);
        self.cr_time.get_or_create(&l).observe(seconds);
    }

    /// Counts the outcome of one reconcile under controller-runtime's names.
    pub fn record_result(&self, controller: &str, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.cr_total
            .get_or_create(&labels(&[("controller", controller), ("result", result)]))
            .inc();
        if !ok {
            self.cr_errors
                .get_or_create(&labels(&[("controller", controller)]))
                .inc();
        }
    }

    /// Counts one failed reconcile.
    pub fn record_error(&self, controller: &str, reason: &str) {
        self.errors
            .get_or_create(&labels(&[("controller", controller), ("reason", reason)]))
            .inc();
    }

    /// The admission check's requests, denials and latency.
    pub fn webhook(&self) -> &WebhookMetrics {
        &self.webhook
    }

    /// Counts one API write.
    pub fn record_write(&self, kind: &str, verb: &str) {
        self.writes
            .get_or_create(&labels(&[("kind", kind), ("verb", verb)]))
            .inc();
    }

    /// Total API writes so far (all kinds and verbs).
    pub fn total_writes(&self) -> u64 {
        let mut text = String::new();
        if encode(&mut text, &self.registry).is_err() {
            return 0;
        }
        text.lines()
            .filter(|l| l.starts_with("meshplane_operator_api_writes_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_reconciles_are_exposed() {
        let m = Metrics::default();
        m.record_write("ConfigMap", "apply");
        m.record_write("ConfigMap", "apply");
        m.record_write("Role", "delete");
        m.record_reconcile("meshcontrolplane", 0.01);
        m.record_error("meshcontrolplane", "Api");
        m.record_result("meshcontrolplane", true);
        m.record_result("meshcontrolplane", false);
        assert_eq!(m.total_writes(), 3);
        let text = m.encode().unwrap();
        assert!(
            text.contains(
                "meshplane_operator_api_writes_total{kind=\"ConfigMap\",verb=\"apply\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("meshplane_operator_reconcile_errors_total{controller=\"meshcontrolplane\",reason=\"Api\"} 1"));
        assert!(text.contains("meshplane_operator_reconcile_duration_seconds_count{controller=\"meshcontrolplane\"} 1"));
        for line in [
            r#"controller_runtime_reconcile_total{controller="meshcontrolplane",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="meshcontrolplane",result="error"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="meshcontrolplane"} 1"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="meshcontrolplane"} 1"#,
            // The other controller's series exist before its first reconcile.
            r#"controller_runtime_reconcile_errors_total{controller="meshrevisiontag"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        let version = format!(
            r#"meshplane_operator_build_info{{version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.lines().any(|l| l == version), "{text}");
    }
}
