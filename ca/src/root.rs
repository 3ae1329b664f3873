//! Roots and intermediates: the per-tenant self-signed root the operator issues by default,
//! and intermediates of an organisation root (what a platform team plugs in as `cacerts`).

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

use crate::authority::{CaFiles, BACKDATE_CA};
use crate::CaError;

/// Default lifetime of a self-signed tenant root.
pub const DEFAULT_ROOT_VALIDITY: Duration = Duration::days(3650);

/// A CA certificate and its key, as PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaCert {
    pub cert_pem: String,
    pub key_pem: String,
}

fn ca_params(
    common_name: &str,
    organization: &str,
    now: OffsetDateTime,
    validity: Duration,
    path_len: Option<u8>,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, organization);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(match path_len {
        Some(n) => BasicConstraints::Constrained(n),
        None => BasicConstraints::Unconstrained,
    });
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now - BACKDATE_CA;
    params.not_after = now + validity;
    params.serial_number = Some(crate::authority::random_serial());
    params
}

/// A new self-signed root (P-256) named after `tenant` and `trust_domain`.
pub fn generate_root(
    tenant: &str,
    trust_domain: &str,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<CaCert, CaError> {
    let key = KeyPair::generate().map_err(|e| CaError::Issue(e.to_string()))?;
    let params = ca_params(
        &format!("meshplane root CA of tenant {tenant} ({trust_domain})"),
        "meshplane",
        now,
        validity,
        None,
    );
    let cert = params
        .self_signed(&key)
        .map_err(|e| CaError::Issue(e.to_string()))?;
    Ok(CaCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The `cacerts` layout of a self-signed root: it signs, and it is the whole bundle.
pub fn self_signed_files(root: &CaCert) -> CaFiles {
    CaFiles {
        ca_cert: root.cert_pem.clone(),
        ca_key: root.key_pem.clone(),
        root_cert: root.cert_pem.clone(),
        cert_chain: String::new(),
    }
}

/// An intermediate CA signed by `parent` (whose certificate is `parent.cert_pem`), e.g. a
/// tenant's CA under an organisation root. `path_len` 0: it signs only leaves.
pub fn generate_intermediate(
    parent: &CaCert,
    common_name: &str,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<CaCert, CaError> {
    let parent_key =
        KeyPair::from_pem(&parent.key_pem).map_err(|e| CaError::BadKey(e.to_string()))?;
    let issuer = Issuer::from_ca_cert_pem(&parent.cert_pem, parent_key)
        .map_err(|e| CaError::BadCertificate(e.to_string()))?;
    let key = KeyPair::generate().map_err(|e| CaError::Issue(e.to_string()))?;
    let mut params = ca_params(common_name, "meshplane", now, validity, Some(0));
    params.use_authority_key_identifier_extension = true;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| CaError::Issue(e.to_string()))?;
    Ok(CaCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The `cacerts` layout of an intermediate of `root`, as Istio documents it: the chain holds
/// the intermediate and the root.
pub fn plugged_in_files(intermediate: &CaCert, root_pem: &str) -> CaFiles {
    CaFiles {
        ca_cert: intermediate.cert_pem.clone(),
        ca_key: intermediate.key_pem.clone(),
        root_cert: root_pem.to_owned(),
        cert_chain: format!("{}{}", intermediate.cert_pem, root_pem),
    }
}
