//! The instance's command line: contract 1 of docs/architecture.md. Flag names come from
//! `meshplane_contracts::instance`, which the operator formats the Deployment's arguments with.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use meshplane_contracts::instance::{env, flags, SOURCE_DIR_PREFIX, SOURCE_KUBE};
use meshplane_contracts::webhook_tls;

use crate::push::DebounceConfig;

/// Where the tenant's configuration comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Kubernetes watches.
    Kube,
    /// A directory of YAML manifests (standalone mode).
    Dir(PathBuf),
}

impl std::str::FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            SOURCE_KUBE => Ok(Source::Kube),
            _ => match s.strip_prefix(SOURCE_DIR_PREFIX) {
                Some(path) if !path.is_empty() => Ok(Source::Dir(PathBuf::from(path))),
                _ => Err(format!("expected `kube` or `dir:PATH`, got {s:?}")),
            },
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Isolation {
    #[value(name = "Strict")]
    Strict,
    #[value(name = "Shared")]
    Shared,
}

/// meshplane xds-server: Envoy control plane of one tenant revision.
#[derive(Parser, Debug)]
#[command(version)]
pub struct Args {
    /// Tenant name.
    #[arg(long = flags::TENANT)]
    pub tenant: String,
    /// Revision name.
    #[arg(long = flags::REVISION)]
    pub revision: String,
    /// Control namespace of the tenant (default `meshplane-<tenant>`).
    #[arg(long = flags::CONTROL_NAMESPACE)]
    pub control_namespace: Option<String>,
    /// `kube` or `dir:PATH`.
    #[arg(long = flags::SOURCE, default_value = SOURCE_KUBE)]
    pub source: Source,
    /// Kubernetes read scope: per member namespace (Strict) or cluster-wide (Shared).
    #[arg(long = flags::ISOLATION, value_enum, default_value = "Strict")]
    pub isolation: Isolation,
    /// Plaintext ADS (gRPC) listen address; off unless given. Proxies of a meshplane operator
    /// use the TLS port.
    #[arg(long = flags::XDS_ADDR)]
    pub xds_addr: Option<SocketAddr>,
    /// TLS listen address of ADS and the certificate service (Istio's 15012), with a serving
    /// certificate of the tenant CA in `--ca-dir`.
    #[arg(long = flags::XDS_TLS_ADDR)]
    pub xds_tls_addr: Option<SocketAddr>,
    /// Directory of the tenant CA (Istio's `cacerts` layout: `ca-cert.pem`, `ca-key.pem`,
    /// `root-cert.pem`, `cert-chain.pem`), mounted from its Secret.
    #[arg(long = flags::CA_DIR, default_value = meshplane_contracts::tenant_ca::MOUNT_DIR)]
    pub ca_dir: PathBuf,
    /// Trust domain of the tenant's workload identities; default `<tenant>.meshplane.local`.
    #[arg(long = flags::TRUST_DOMAIN)]
    pub trust_domain: Option<String>,
    /// Extra DNS names of the TLS port's serving certificate (the instance Service's names are
    /// always included); repeatable.
    #[arg(long = "serving-dns-name")]
    pub serving_dns_names: Vec<String>,
    /// Admission webhook (HTTPS) listen address.
    #[arg(long = flags::WEBHOOK_ADDR, default_value = "0.0.0.0:15017")]
    pub webhook_addr: SocketAddr,
    /// Metrics, health and debug (HTTP) listen address.
    #[arg(long = flags::MONITORING_ADDR, default_value = "0.0.0.0:15014")]
    pub monitoring_addr: SocketAddr,
    /// Directory of the webhook serving certificate (`tls.crt`, `tls.key`, `ca.crt`).
    #[arg(long = flags::WEBHOOK_TLS_DIR, default_value = webhook_tls::MOUNT_DIR)]
    pub webhook_tls_dir: PathBuf,
    /// This revision's proxy image, injected into pods; the operator sets the environment
    /// variable. Without it the admission webhooks are not served.
    #[arg(long = flags::PROXY_IMAGE, env = env::PROXY_IMAGE)]
    pub proxy_image: Option<String>,
    /// Audience proxies' tokens must carry (default `meshplane-<tenant>`).
    #[arg(long = flags::TOKEN_AUDIENCE)]
    pub token_audience: Option<String>,
    /// Revision tags pointing at this revision (directory mode membership).
    #[arg(long, value_delimiter = ',')]
    pub tags: Vec<String>,
    /// Push after this long without changes.
    #[arg(long, default_value_t = millis(DebounceConfig::default().quiet))]
    pub debounce_quiet_ms: u64,
    /// Push at the latest this long after the first change. Short, because a push only re-renders
    /// what changed (endpoint-only changes patch EDS alone) and the push loop never overlaps
    /// pushes: under load, batches grow instead of queueing.
    #[arg(long, default_value_t = millis(DebounceConfig::default().max))]
    pub debounce_max_ms: u64,
    /// Push after this long without changes a change that comes while pushes are rare (none in
    /// the last `--debounce-quiet-ms`); at most the quiet time.
    #[arg(long, default_value_t = millis(DebounceConfig::default().isolated_quiet))]
    pub debounce_isolated_quiet_ms: u64,
    /// Serve virtual hosts over VHDS to delta Envoys (`--vhds false`: routes inline for every
    /// client, as to state-of-the-world ones).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub vhds: bool,
    /// Log format: `text`, or `json` (one object per line, with tenant, revision and proxy).
    #[arg(long = flags::LOG_FORMAT, value_enum, default_value = "text")]
    pub log_format: crate::logging::LogFormat,
    /// Concurrent ADS streams one HTTP/2 connection may open.
    #[arg(long, default_value_t = 16)]
    pub max_streams_per_connection: u32,
    /// Connected proxies one namespace may have.
    #[arg(long, default_value_t = 5000)]
    pub max_proxies_per_namespace: usize,
    /// TokenReviews per second sent for new tokens that claim one namespace (verified tokens
    /// are remembered for a minute, refused ones for 10 s), and the burst allowed above that
    /// rate. ADS, certificate requests and /debug each have these budgets of their own.
    #[arg(long, default_value_t = 50.0)]
    pub token_review_qps: f64,
    #[arg(long, default_value_t = 200.0)]
    pub token_review_burst: f64,
    /// TokenReviews per second (and burst) sent for new tokens from one peer address.
    #[arg(long, default_value_t = 5.0)]
    pub token_review_peer_qps: f64,
    #[arg(long, default_value_t = 20.0)]
    pub token_review_peer_burst: f64,
    /// TokenReviews per second (and burst) one service sends in all.
    #[arg(long, default_value_t = 200.0)]
    pub token_review_service_qps: f64,
    #[arg(long, default_value_t = 800.0)]
    pub token_review_service_burst: f64,
    /// Set only by the local test pod runner, where every pod shares the host's loopback: then,
    /// and only then, proxies' node metadata `LOOPBACK_ADDR` is honoured.
    #[arg(long, env = "MESHPLANE_LOOPBACK_ADDR", hide = true)]
    pub loopback_addr: Option<String>,
}

impl Args {
    /// The TokenReview budgets of each service, from the flags.
    pub fn review_budget(&self) -> crate::tokens::ReviewBudget {
        use crate::tokens::{Rate, ReviewBudget};
        ReviewBudget {
            per_peer: Rate::new(self.token_review_peer_qps, self.token_review_peer_burst),
            per_namespace: Rate::new(self.token_review_qps, self.token_review_burst),
            per_service: Rate::new(
                self.token_review_service_qps,
                self.token_review_service_burst,
            ),
        }
    }
}

/// A default duration as a flag's milliseconds.
impl Args {
    /// The tenant's trust domain: `--trust-domain`, else the tenant's default.
    pub fn trust_domain(&self) -> String {
        self.trust_domain
            .clone()
            .unwrap_or_else(|| meshplane_crds::names::default_trust_domain(&self.tenant))
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshplane_contracts::instance::{InstanceArgs, Isolation as ContractIsolation};

    /// Contract 1 from the instance's side: what the operator formats parses into the same
    /// values, and the addresses are the contract's ports.
    #[test]
    fn parses_what_the_operator_formats() {
        for (isolation, expected) in [
            (ContractIsolation::Strict, Isolation::Strict),
            (ContractIsolation::Shared, Isolation::Shared),
        ] {
            let formatted = InstanceArgs {
                tenant: "blue".into(),
                revision: "blue-v1".into(),
                control_namespace: "meshplane-blue".into(),
                isolation,
                trust_domain: "blue.example".into(),
            }
            .to_args();
            let args =
                Args::try_parse_from(std::iter::once("meshplane-xds".to_string()).chain(formatted))
                    .expect("the operator's arguments parse");
            assert_eq!(args.tenant, "blue");
            assert_eq!(args.revision, "blue-v1");
            assert_eq!(args.control_namespace.as_deref(), Some("meshplane-blue"));
            assert_eq!(args.source, Source::Kube);
            assert_eq!(args.isolation, expected);
            // Contract 11: ADS only over TLS, with the tenant CA where the operator mounts it.
            assert_eq!(args.xds_addr, None, "no plaintext ADS");
            assert_eq!(
                args.xds_tls_addr.map(|a| a.port()),
                Some(meshplane_contracts::ports::GRPC_XDS_TLS)
            );
            assert_eq!(
                args.ca_dir,
                PathBuf::from(meshplane_contracts::tenant_ca::MOUNT_DIR)
            );
            assert_eq!(args.trust_domain(), "blue.example");
            assert_eq!(
                args.webhook_addr.port(),
                meshplane_contracts::ports::HTTPS_WEBHOOK
            );
            assert_eq!(
                args.monitoring_addr.port(),
                meshplane_contracts::ports::HTTP_MONITORING
            );
            assert_eq!(args.webhook_tls_dir, PathBuf::from(webhook_tls::MOUNT_DIR));
            assert_eq!(args.token_audience.as_deref(), Some("meshplane-blue"));
            assert_eq!(args.log_format, crate::logging::LogFormat::Json);
            assert_eq!(args.review_budget(), crate::tokens::ReviewBudget::default());
        }
    }
}
