//! Contract 6: the bootstrap ConfigMap `meshplane-<revision>-bootstrap` in every member
//! namespace of the tenant.
//!
//! [`ENVOY_YAML`] is an Envoy bootstrap with admin on `127.0.0.1:`[`PROXY_ADMIN`], a readiness
//! listener on [`PROXY_READY`] answering [`READY_PATH`], and ADS over the static HTTP/2 cluster
//! [`ADS_CLUSTER`] pointing at the instance Service's [`GRPC_XDS_TLS`] port over TLS: the
//! cluster's `transport_socket.sni` is the instance Service's host, which its certificate must
//! name, verified against [`ROOT_CERT`] under [`MOUNT_DIR`]. It carries no `node`: the proxy
//! launcher sets that (contract 7); the node agent (contract 11) reads the address and the SNI
//! from [`ADS_CLUSTER`] and carries ADS there itself, with the token. [`ADS_CLUSTER`]
//! accepts HTTP/2 frames of up to [`ADS_MAX_FRAME_SIZE`].

use crate::error::ContractError;
use crate::Data;

pub use crate::ports::{GRPC_XDS_TLS, PROXY_ADMIN, PROXY_READY};

const CONTRACT: &str = "6 (bootstrap ConfigMap)";

/// Key of the Envoy bootstrap (YAML).
pub const ENVOY_YAML: &str = "envoy.yaml";
/// Key of the tenant root certificate (PEM; a comment until the tenant CA exists).
pub const ROOT_CERT: &str = "root-cert.pem";
/// Where the injector mounts the ConfigMap in the proxy container; `envoy.yaml` names
/// `root-cert.pem` under it.
pub const MOUNT_DIR: &str = "/etc/meshplane/bootstrap";
/// Key of the revision that wrote it.
pub const REVISION: &str = "revision";
/// The static cluster carrying ADS to the instance.
pub const ADS_CLUSTER: &str = "xds-grpc";
/// Largest HTTP/2 frame (SETTINGS_MAX_FRAME_SIZE) a connection carrying ADS from a proxy
/// accepts: the bootstrap's [`ADS_CLUSTER`] advertises it (`custom_settings_parameters`,
/// identifier 5), and so does the node agent's connection to the instance. An HTTP/2 sender
/// writes a large data frame with a system call of its own and never sends a frame larger
/// than this: at the protocol's default of 16 KiB, a state-of-the-world route configuration of
/// 10,000 services (about 5 MB) took some 300 writes per proxy on a plain socket; at 1 MiB,
/// five (docs/benchmarks.md, "The node agent accepts 1 MiB frames").
pub const ADS_MAX_FRAME_SIZE: u32 = 1024 * 1024;
/// SETTINGS_MAX_FRAME_SIZE's identifier (RFC 9113, section 6.5.2).
pub const HTTP2_SETTINGS_MAX_FRAME_SIZE: u32 = 0x5;
/// Path of the readiness listener.
pub const READY_PATH: &str = "/healthz/ready";
/// Path on the readiness listener that serves Envoy's own `/stats/prometheus` (the proxy's
/// request statistics, read by the operator's migration gates and by scrapers).
pub const STATS_PATH: &str = "/stats/prometheus";

/// Name of the bootstrap ConfigMap of `revision`.
pub fn configmap_name(revision: &str) -> String {
    format!("meshplane-{revision}-bootstrap")
}

/// The ConfigMap's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapData {
    pub envoy_yaml: String,
    pub root_cert: String,
    pub revision: String,
}

impl BootstrapData {
    /// The ConfigMap `data`.
    pub fn to_data(&self) -> Data {
        Data::from([
            (ENVOY_YAML.to_string(), self.envoy_yaml.clone()),
            (ROOT_CERT.to_string(), self.root_cert.clone()),
            (REVISION.to_string(), self.revision.clone()),
        ])
    }

    /// Reads the ConfigMap `data`; every key is required and `envoy.yaml` must name the ADS
    /// cluster (a bootstrap that cannot reach the instance is not this contract's).
    pub fn from_data(data: &Data) -> Result<Self, ContractError> {
        let field = |key: &'static str| {
            data.get(key).cloned().ok_or(ContractError::MissingKey {
                contract: CONTRACT,
                key,
            })
        };
        let envoy_yaml = field(ENVOY_YAML)?;
        if !envoy_yaml.contains(ADS_CLUSTER) {
            return Err(ContractError::invalid(
                CONTRACT,
                ENVOY_YAML,
                "",
                format!("names no {ADS_CLUSTER:?} cluster"),
            ));
        }
        Ok(Self {
            envoy_yaml,
            root_cert: field(ROOT_CERT)?,
            revision: field(REVISION)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_requires_every_key() {
        let data = BootstrapData {
            envoy_yaml: "static_resources: {clusters: [{name: xds-grpc}]}\n".into(),
            root_cert: "# none yet\n".into(),
            revision: "blue-v1".into(),
        };
        assert_eq!(BootstrapData::from_data(&data.to_data()), Ok(data.clone()));
        let mut partial = data.to_data();
        partial.remove(REVISION);
        assert!(BootstrapData::from_data(&partial).is_err());
        let mut no_ads = data.to_data();
        no_ads.insert(ENVOY_YAML.into(), "admin: {}\n".into());
        assert!(BootstrapData::from_data(&no_ads).is_err());
    }
}
