//! Prometheus metrics of the operator: reconciles, their durations, errors by reason, and API
//! writes by kind and verb (the steady-state "writes nothing" promise is visible here).

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
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("meshplane_operator");
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
        Self {
            registry,
            reconciles,
            errors,
            writes,
            durations,
        }
    }
}

impl Metrics {
    /// Counts one reconcile of `controller` that took `seconds`.
    pub fn record_reconcile(&self, controller: &str, seconds: f64) {
        let l = labels(&[("controller", controller)]);
        self.reconciles.get_or_create(&l).inc();
        self.durations.get_or_create(&l).observe(seconds);
    }

    /// Counts one failed reconcile.
    pub fn record_error(&self, controller: &str, reason: &str) {
        self.errors
            .get_or_create(&labels(&[("controller", controller), ("reason", reason)]))
            .inc();
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
    }
}
