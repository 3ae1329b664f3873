//! Contract 4: the webhook TLS Secret `meshplane-<revision>-webhook-tls` in the control
//! namespace.
//!
//! Issued and rotated by the operator, mounted into the instance at [`MOUNT_DIR`] (so the
//! Secret's keys are the file names the instance reads); the instance reloads it on change.
//! The operator puts [`CA_CRT`] into the `caBundle` of the revision's webhook configurations.
//! Contract 9 (the operator's own certificate) uses the same keys.

use crate::error::ContractError;
use crate::Data;

const CONTRACT: &str = "4 (webhook TLS Secret)";

/// The Secret's `type`.
pub const SECRET_TYPE: &str = "kubernetes.io/tls";
/// Key (and file name) of the serving certificate chain, PEM.
pub const TLS_CRT: &str = "tls.crt";
/// Key (and file name) of the serving key, PEM.
pub const TLS_KEY: &str = "tls.key";
/// Key (and file name) of the CA bundle the API server trusts, PEM.
pub const CA_CRT: &str = "ca.crt";
/// Where the instance mounts the Secret.
pub const MOUNT_DIR: &str = "/var/run/meshplane/webhook-tls";

/// Name of the webhook TLS Secret of `revision`.
pub fn secret_name(revision: &str) -> String {
    format!("meshplane-{revision}-webhook-tls")
}

/// The Secret's content, decoded (PEM text).
#[derive(Clone, PartialEq, Eq)]
pub struct TlsData {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

impl std::fmt::Debug for TlsData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key.
        f.debug_struct("TlsData")
            .field("cert_pem", &self.cert_pem)
            .field("ca_pem", &self.ca_pem)
            .finish_non_exhaustive()
    }
}

impl TlsData {
    /// The Secret's `data`, before base64 encoding.
    pub fn to_data(&self) -> Data {
        Data::from([
            (TLS_CRT.to_string(), self.cert_pem.clone()),
            (TLS_KEY.to_string(), self.key_pem.clone()),
            (CA_CRT.to_string(), self.ca_pem.clone()),
        ])
    }

    /// Reads decoded Secret `data`: all three keys, each holding PEM.
    pub fn from_data(data: &Data) -> Result<Self, ContractError> {
        let field = |key: &'static str| -> Result<String, ContractError> {
            let value = data.get(key).ok_or(ContractError::MissingKey {
                contract: CONTRACT,
                key,
            })?;
            if !value.contains("-----BEGIN ") {
                return Err(ContractError::invalid(
                    CONTRACT,
                    key,
                    "",
                    "holds no PEM block",
                ));
            }
            Ok(value.clone())
        };
        Ok(Self {
            cert_pem: field(TLS_CRT)?,
            key_pem: field(TLS_KEY)?,
            ca_pem: field(CA_CRT)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_missing_or_non_pem_keys() {
        let pem = |what: &str| format!("-----BEGIN {what}-----\nAA==\n-----END {what}-----\n");
        let tls = TlsData {
            cert_pem: pem("CERTIFICATE"),
            key_pem: pem("PRIVATE KEY"),
            ca_pem: pem("CERTIFICATE"),
        };
        assert_eq!(TlsData::from_data(&tls.to_data()), Ok(tls.clone()));
        assert!(!format!("{tls:?}").contains("PRIVATE KEY"));
        let mut data = tls.to_data();
        data.remove(CA_CRT);
        assert!(TlsData::from_data(&data).is_err());
        data.insert(CA_CRT.into(), "not pem".into());
        assert!(TlsData::from_data(&data).is_err());
    }
}
