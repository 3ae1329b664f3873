//! PEM bundles of certificates, and the few facts read back from a certificate (x509-parser).

use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;
use x509_parser::prelude::FromDer;

use crate::CaError;

/// One certificate of a bundle: its DER and its PEM text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemCert {
    pub der: Vec<u8>,
    pub pem: String,
}

impl PemCert {
    /// Parses the DER as X.509 (borrowing from `self`).
    pub fn parse(&self) -> Result<X509Certificate<'_>, CaError> {
        X509Certificate::from_der(&self.der)
            .map(|(_, c)| c)
            .map_err(|e| CaError::BadCertificate(e.to_string()))
    }
}

/// Every `CERTIFICATE` block of `bundle`, in order; anything else (keys, comments) is skipped.
/// An empty bundle gives an empty list; a block that is not base64 or not X.509 is an error.
pub fn certificates(bundle: &str) -> Result<Vec<PemCert>, CaError> {
    let mut out = Vec::new();
    for block in Pem::iter_from_buffer(bundle.as_bytes()) {
        let block = block.map_err(|e| CaError::BadPem(e.to_string()))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        X509Certificate::from_der(&block.contents)
            .map_err(|e| CaError::BadCertificate(e.to_string()))?;
        out.push(PemCert {
            pem: to_pem(&block.contents),
            der: block.contents,
        });
    }
    Ok(out)
}

/// PEM text of a DER certificate.
pub fn to_pem(der: &[u8]) -> String {
    ::pem::encode_config(
        &::pem::Pem::new("CERTIFICATE", der.to_vec()),
        ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF),
    )
}

/// Concatenates PEM blocks into one bundle, one block after the other.
pub fn join(certs: &[PemCert]) -> String {
    certs.iter().map(|c| c.pem.as_str()).collect()
}

/// The validity window of a certificate.
pub fn validity(cert: &X509Certificate<'_>) -> Result<(OffsetDateTime, OffsetDateTime), CaError> {
    let v = cert.validity();
    let from = OffsetDateTime::from_unix_timestamp(v.not_before.timestamp())
        .map_err(|e| CaError::BadCertificate(e.to_string()))?;
    let to = OffsetDateTime::from_unix_timestamp(v.not_after.timestamp())
        .map_err(|e| CaError::BadCertificate(e.to_string()))?;
    Ok((from, to))
}

/// The URI subject alternative names of a certificate (SPIFFE IDs among them).
pub fn uri_sans(cert: &X509Certificate<'_>) -> Vec<String> {
    general_names(cert, |n| match n {
        GeneralName::URI(u) => Some(u.to_string()),
        _ => None,
    })
}

/// The DNS subject alternative names of a certificate.
pub fn dns_sans(cert: &X509Certificate<'_>) -> Vec<String> {
    general_names(cert, |n| match n {
        GeneralName::DNSName(d) => Some(d.to_string()),
        _ => None,
    })
}

fn general_names(
    cert: &X509Certificate<'_>,
    pick: impl Fn(&GeneralName<'_>) -> Option<String>,
) -> Vec<String> {
    cert.subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| san.value.general_names.iter().filter_map(&pick).collect())
        .unwrap_or_default()
}
