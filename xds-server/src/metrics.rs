//! Prometheus metrics of the xds-server.

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
    certificates: Family<ResultLabel, Counter>,
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
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("meshplane_xds");
        let connected_proxies = Family::<ProxyLabels, Gauge>::default();
        registry.register(
            "connected_proxies",
            "Proxies connected over ADS, by revision and ADS variant",
            connected_proxies.clone(),
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
        let certificates = Family::<ResultLabel, Counter>::default();
        registry.register(
            "certificate_requests",
            "CreateCertificate requests, by result (issued, unauthenticated, not_member, bad_csr, unavailable)",
            certificates.clone(),
        );
        let proxy_config_bytes = Histogram::new(exponential_buckets(1024.0, 2.0, 16));
        registry.register(
            "proxy_config_bytes",
            "Encoded configuration size per rendered proxy",
            proxy_config_bytes.clone(),
        );
        Self {
            registry,
            connected_proxies,
            pushes,
            push_latency,
            nacks,
            rejected,
            certificates,
            proxy_config_bytes,
        }
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

    /// Records a NACK.
    pub fn nacked(&self, type_name: &str) {
        self.nacks
            .get_or_create(&TypeLabel {
                r#type: type_name.to_string(),
            })
            .inc();
    }

    /// Records a refused stream.
    pub fn rejected(&self, reason: &str) {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
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
