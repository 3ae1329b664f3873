//! Contract 4: the webhook TLS Secret `meshplane-<revision>-webhook-tls` in the control
//! namespace.
//!
//! Issued and rotated by the operator, mounted into the instance at [`MOUNT_DIR`] (so the
//! Secret's keys are the file names the instance reads); the instance reloads it on change.
//! The operator puts [`CA_CRT`] into the `caBundle` of the revision's webhook configurations.
//! Contract 9 (the operator's own certificate) uses the same keys.
//!
//! When the platform admin gave the operator the CA that signs the API server's admission
//! client certificate, the Secret also carries [`CLIENT_CA_CRT`] (and, if the admin named the
//! accepted client identities, [`CLIENT_NAMES`]): [`ClientAuthData`]. The instance then admits
//! `/inject` and `/validate` calls only from a client presenting a certificate of that CA.

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
/// Key (and file name) of the CA bundle that signs the API server's admission client
/// certificate, PEM; present only when client authentication is on.
pub const CLIENT_CA_CRT: &str = "client-ca.crt";
/// Key (and file name) of the client identities accepted (a certificate's subject CN or one of
/// its DNS or URI SANs), one per line; absent: any certificate of [`CLIENT_CA_CRT`].
pub const CLIENT_NAMES: &str = "client-names";
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

/// Who may call the webhooks: the CA of the API server's admission client certificate and,
/// optionally, the identities accepted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientAuthData {
    /// PEM, one or more certificates.
    pub ca_pem: String,
    /// Accepted subject CNs or SANs; empty: any certificate the CA signed.
    pub names: Vec<String>,
}

impl ClientAuthData {
    /// The Secret keys it adds, before base64 encoding ([`CLIENT_NAMES`] only when names are
    /// given).
    pub fn to_data(&self) -> Data {
        let mut data = Data::from([(CLIENT_CA_CRT.to_string(), self.ca_pem.clone())]);
        if !self.names.is_empty() {
            data.insert(CLIENT_NAMES.to_string(), format_names(&self.names));
        }
        data
    }

    /// Reads decoded Secret `data`: `None` when it has no [`CLIENT_CA_CRT`] (client
    /// authentication off); an error when that key holds no PEM certificate, or when
    /// [`CLIENT_NAMES`] comes without it.
    pub fn from_data(data: &Data) -> Result<Option<Self>, ContractError> {
        let Some(ca_pem) = data.get(CLIENT_CA_CRT) else {
            if data.contains_key(CLIENT_NAMES) {
                return Err(ContractError::MissingKey {
                    contract: CONTRACT,
                    key: CLIENT_CA_CRT,
                });
            }
            return Ok(None);
        };
        if !ca_pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(ContractError::invalid(
                CONTRACT,
                CLIENT_CA_CRT,
                "",
                "holds no PEM certificate",
            ));
        }
        Ok(Some(Self {
            ca_pem: ca_pem.clone(),
            names: data
                .get(CLIENT_NAMES)
                .map(|n| parse_names(n))
                .unwrap_or_default(),
        }))
    }
}

/// [`CLIENT_NAMES`]' text: one name a line.
pub fn format_names(names: &[String]) -> String {
    let mut text = names.join("\n");
    text.push('\n');
    text
}

/// The names of [`CLIENT_NAMES`]' text: trimmed lines, empty ones skipped.
pub fn parse_names(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_auth_round_trips_and_is_optional() {
        let ca = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n".to_string();
        let plain = ClientAuthData {
            ca_pem: ca.clone(),
            names: vec![],
        };
        assert_eq!(plain.to_data().len(), 1, "no names key without names");
        assert_eq!(ClientAuthData::from_data(&plain.to_data()), Ok(Some(plain)));
        let named = ClientAuthData {
            ca_pem: ca,
            names: vec![
                "kube-apiserver".into(),
                "spiffe://cluster.local/apiserver".into(),
            ],
        };
        assert_eq!(
            ClientAuthData::from_data(&named.to_data()),
            Ok(Some(named.clone()))
        );
        // The serving keys alone: client authentication is off.
        assert_eq!(ClientAuthData::from_data(&Data::new()), Ok(None));
        let mut names_only = named.to_data();
        names_only.remove(CLIENT_CA_CRT);
        assert!(ClientAuthData::from_data(&names_only).is_err());
        let mut not_pem = named.to_data();
        not_pem.insert(CLIENT_CA_CRT.into(), "not pem".into());
        assert!(ClientAuthData::from_data(&not_pem).is_err());
        assert_eq!(
            parse_names(" a \n\nb\n"),
            vec!["a".to_string(), "b".to_string()]
        );
    }

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
