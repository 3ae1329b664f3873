//! Contract 1: the instance command line.
//!
//! The operator's Deployment runs `meshplane-xds` with [`InstanceArgs::to_args`], and the
//! environment of [`env`]. The instance's command-line parser names its flags with
//! [`flags`], so a renamed flag breaks both sides at compile time, and its round-trip test
//! parses what [`InstanceArgs::to_args`] formats.

use crate::ports;
use crate::tenant_ca;
use crate::webhook_tls;

/// Flag names (without the leading `--`).
pub mod flags {
    pub const TENANT: &str = "tenant";
    pub const REVISION: &str = "revision";
    pub const CONTROL_NAMESPACE: &str = "control-namespace";
    pub const SOURCE: &str = "source";
    pub const ISOLATION: &str = "isolation";
    pub const XDS_ADDR: &str = "xds-addr";
    pub const XDS_TLS_ADDR: &str = "xds-tls-addr";
    pub const CA_DIR: &str = "ca-dir";
    pub const TRUST_DOMAIN: &str = "trust-domain";
    pub const WEBHOOK_ADDR: &str = "webhook-addr";
    pub const MONITORING_ADDR: &str = "monitoring-addr";
    pub const WEBHOOK_TLS_DIR: &str = "webhook-tls-dir";
    pub const TOKEN_AUDIENCE: &str = "token-audience";
    pub const PROXY_IMAGE: &str = "proxy-image";
    pub const LOG_FORMAT: &str = "log-format";
}

/// `--log-format` of the instances the operator runs: JSON, like the operator's own shipped
/// Deployment, so one log pipeline parses the tenant, revision and proxy fields of both. Text
/// stays the instance's default for standalone runs on a workstation.
pub const LOG_FORMAT_KUBE: &str = "json";

/// Environment of the instance container.
pub mod env {
    /// The pod's name (downward API `metadata.name`): names its key in contract 3.
    pub const POD_NAME: &str = "POD_NAME";
    /// The pod's namespace (downward API `metadata.namespace`).
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    /// The revision's proxy image, which `/inject` adds to pods (same as `--proxy-image`).
    pub const PROXY_IMAGE: &str = "MESHPLANE_PROXY_IMAGE";
}

/// `--source kube`: Kubernetes watches. Standalone mode passes `dir:PATH` instead.
pub const SOURCE_KUBE: &str = "kube";
/// Prefix of `--source dir:PATH`.
pub const SOURCE_DIR_PREFIX: &str = "dir:";

/// `--isolation`: how far the instance reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// Per member namespace, granted as namespaces join.
    Strict,
    /// Cluster-wide read, filtered in the instance.
    Shared,
}

impl Isolation {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Strict => "Strict",
            Isolation::Shared => "Shared",
        }
    }
}

/// What the operator passes to one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceArgs {
    pub tenant: String,
    pub revision: String,
    pub control_namespace: String,
    pub isolation: Isolation,
    /// Trust domain of the tenant's workload identities.
    pub trust_domain: String,
}

impl InstanceArgs {
    /// The instance's arguments in Kubernetes mode: every address on all interfaces at the
    /// ports of [`crate::ports`], ADS only on the TLS port with the tenant CA at
    /// [`tenant_ca::MOUNT_DIR`] (contract 11; no plaintext ADS), the webhook certificate at
    /// [`webhook_tls::MOUNT_DIR`], the tenant's token audience, and JSON logs.
    pub fn to_args(&self) -> Vec<String> {
        let all = |port: u16| format!("0.0.0.0:{port}");
        let pairs = [
            (flags::TENANT, self.tenant.clone()),
            (flags::REVISION, self.revision.clone()),
            (flags::CONTROL_NAMESPACE, self.control_namespace.clone()),
            (flags::SOURCE, SOURCE_KUBE.to_string()),
            (flags::ISOLATION, self.isolation.as_str().to_string()),
            (flags::XDS_TLS_ADDR, all(ports::GRPC_XDS_TLS)),
            (flags::CA_DIR, tenant_ca::MOUNT_DIR.to_string()),
            (flags::TRUST_DOMAIN, self.trust_domain.clone()),
            (flags::WEBHOOK_ADDR, all(ports::HTTPS_WEBHOOK)),
            (flags::MONITORING_ADDR, all(ports::HTTP_MONITORING)),
            (flags::WEBHOOK_TLS_DIR, webhook_tls::MOUNT_DIR.to_string()),
            (
                flags::TOKEN_AUDIENCE,
                crate::node::token_audience(&self.tenant),
            ),
            (flags::LOG_FORMAT, LOG_FORMAT_KUBE.to_string()),
        ];
        pairs
            .into_iter()
            .flat_map(|(flag, value)| [format!("--{flag}"), value])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_has_a_value_and_the_documented_defaults() {
        let args = InstanceArgs {
            tenant: "blue".into(),
            revision: "blue-v1".into(),
            control_namespace: "meshplane-blue".into(),
            isolation: Isolation::Strict,
            trust_domain: "blue.example".into(),
        }
        .to_args();
        let pairs: Vec<(&str, &str)> = args
            .chunks(2)
            .map(|c| (c[0].as_str(), c[1].as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("--tenant", "blue"),
                ("--revision", "blue-v1"),
                ("--control-namespace", "meshplane-blue"),
                ("--source", "kube"),
                ("--isolation", "Strict"),
                ("--xds-tls-addr", "0.0.0.0:15012"),
                ("--ca-dir", "/var/run/meshplane/ca"),
                ("--trust-domain", "blue.example"),
                ("--webhook-addr", "0.0.0.0:15017"),
                ("--monitoring-addr", "0.0.0.0:15014"),
                ("--webhook-tls-dir", "/var/run/meshplane/webhook-tls"),
                ("--token-audience", "meshplane-blue"),
                ("--log-format", "json"),
            ]
        );
    }
}
