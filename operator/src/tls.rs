//! Webhook TLS of an instance (contract 4): a CA and a serving certificate for the instance
//! Service's DNS name, issued with rcgen and rotated when less than a third of the validity
//! remains. Pure: the caller passes the clock, so rotation is testable.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use serde_json::Value;
use time::{Duration, OffsetDateTime};

/// Default validity of an issued serving certificate (and of its CA).
pub const DEFAULT_VALIDITY: Duration = Duration::days(90);

/// Why certificate material could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("issuing certificate: {0}")]
    Issue(#[from] rcgen::Error),
}

/// The PEM material of one instance's webhook TLS Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookTls {
    /// `ca.crt`: the current CA first, then the previous one while it may still be trusted
    /// somewhere, so a rotation never leaves the API server without a CA for the served cert.
    pub ca_bundle_pem: String,
    /// `tls.crt`.
    pub cert_pem: String,
    /// `tls.key`.
    pub key_pem: String,
}

/// The validity window and names of a parsed serving certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFacts {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    pub dns_names: Vec<String>,
}

impl WebhookTls {
    /// The Secret's `data`, base64-encoded as the API expects.
    pub fn secret_data(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("ca.crt", B64.encode(&self.ca_bundle_pem)),
            ("tls.crt", B64.encode(&self.cert_pem)),
            ("tls.key", B64.encode(&self.key_pem)),
        ])
    }

    /// `caBundle` of the webhook configurations.
    pub fn ca_bundle_base64(&self) -> String {
        B64.encode(&self.ca_bundle_pem)
    }

    /// Reads the material back from an observed Secret's `data` (base64 values).
    pub fn from_secret_data(data: &Value) -> Option<Self> {
        let field = |k: &str| -> Option<String> {
            let b = B64.decode(data.get(k)?.as_str()?).ok()?;
            String::from_utf8(b).ok()
        };
        Some(Self {
            ca_bundle_pem: field("ca.crt")?,
            cert_pem: field("tls.crt")?,
            key_pem: field("tls.key")?,
        })
    }

    /// Validity and DNS names of the serving certificate, if it parses.
    pub fn serving_cert_facts(&self) -> Option<CertFacts> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(self.cert_pem.as_bytes()).ok()?;
        let cert = pem.parse_x509().ok()?;
        let validity = cert.validity();
        let dns_names = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(CertFacts {
            not_before: OffsetDateTime::from_unix_timestamp(validity.not_before.timestamp())
                .ok()?,
            not_after: OffsetDateTime::from_unix_timestamp(validity.not_after.timestamp()).ok()?,
            dns_names,
        })
    }

    /// The first (current) CA certificate of the bundle.
    fn current_ca(&self) -> Option<&str> {
        let end = "-----END CERTIFICATE-----";
        self.ca_bundle_pem
            .find(end)
            .map(|i| &self.ca_bundle_pem[..i + end.len()])
    }
}

/// Whether `existing` must be replaced at `now`: missing, unparsable, for another host, or with
/// less than a third of its validity left.
pub fn needs_rotation(existing: Option<&WebhookTls>, host: &str, now: OffsetDateTime) -> bool {
    let Some(facts) = existing.and_then(WebhookTls::serving_cert_facts) else {
        return true;
    };
    if !facts.dns_names.iter().any(|d| d == host) {
        return true;
    }
    let total = facts.not_after - facts.not_before;
    let remaining = facts.not_after - now;
    remaining * 3 < total
}

/// Keeps `existing` when it is still good at `now`, else issues new material. Returns the
/// material and whether it was (re)issued.
pub fn ensure(
    existing: Option<WebhookTls>,
    host: &str,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<(WebhookTls, bool), TlsError> {
    if let Some(tls) = existing
        .as_ref()
        .filter(|t| !needs_rotation(Some(t), host, now))
    {
        return Ok((tls.clone(), false));
    }
    let previous_ca = existing
        .as_ref()
        .and_then(|t| t.current_ca().map(str::to_string));
    Ok((issue(host, now, validity, previous_ca.as_deref())?, true))
}

/// Issues a fresh CA and a serving certificate for `host`, valid from `now` for `validity`.
pub fn issue(
    host: &str,
    now: OffsetDateTime,
    validity: Duration,
    previous_ca: Option<&str>,
) -> Result<WebhookTls, TlsError> {
    // Backdate a little: API servers with a slightly slow clock must not see a future cert.
    let not_before = now - Duration::minutes(5);
    let not_after = now + validity;

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = DistinguishedName::new();
    ca_params.distinguished_name.push(
        DnType::CommonName,
        format!("meshplane webhook CA for {host}"),
    );
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.not_before = not_before;
    // The CA outlives the serving cert it signs by the rotation margin, never less.
    ca_params.not_after = not_after + validity / 3;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut params = CertificateParams::new(vec![host.to_string()])?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, host);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    let mut ca_bundle_pem = ca_cert.pem();
    if let Some(prev) = previous_ca {
        if !ca_bundle_pem.ends_with('\n') {
            ca_bundle_pem.push('\n');
        }
        ca_bundle_pem.push_str(prev);
        ca_bundle_pem.push('\n');
    }
    Ok(WebhookTls {
        ca_bundle_pem,
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "meshplane-blue-v1.meshplane-blue.svc";

    fn t0() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    #[test]
    fn issued_material_names_the_service_and_survives_the_secret_round_trip() {
        let tls = issue(HOST, t0(), DEFAULT_VALIDITY, None).unwrap();
        let facts = tls.serving_cert_facts().unwrap();
        assert_eq!(facts.dns_names, vec![HOST.to_string()]);
        assert_eq!(facts.not_after, t0() + DEFAULT_VALIDITY);
        let data = serde_json::to_value(tls.secret_data()).unwrap();
        assert_eq!(WebhookTls::from_secret_data(&data), Some(tls));
    }

    #[test]
    fn rotation_happens_only_when_a_third_of_the_validity_remains() {
        let validity = Duration::days(90);
        let (tls, issued) = ensure(None, HOST, t0(), validity).unwrap();
        assert!(issued);
        // 59 days in: 31 days (> 30) remain, keep.
        let (kept, issued) =
            ensure(Some(tls.clone()), HOST, t0() + Duration::days(59), validity).unwrap();
        assert!(!issued);
        assert_eq!(kept, tls);
        // 61 days in: 29 days remain, rotate, and keep trusting the old CA for the switch.
        let later = t0() + Duration::days(61);
        let (rotated, issued) = ensure(Some(tls.clone()), HOST, later, validity).unwrap();
        assert!(issued);
        assert_ne!(rotated.cert_pem, tls.cert_pem);
        assert_eq!(
            rotated.serving_cert_facts().unwrap().not_after,
            later + validity
        );
        let old_ca = tls.current_ca().unwrap();
        assert!(rotated.ca_bundle_pem.contains(old_ca));
        assert!(rotated
            .ca_bundle_pem
            .starts_with(rotated.current_ca().unwrap()));
        assert_eq!(
            rotated.ca_bundle_pem.matches("BEGIN CERTIFICATE").count(),
            2
        );
    }

    #[test]
    fn material_for_another_host_or_garbage_is_replaced() {
        let tls = issue("other.ns.svc", t0(), DEFAULT_VALIDITY, None).unwrap();
        assert!(needs_rotation(Some(&tls), HOST, t0()));
        let garbage = WebhookTls {
            cert_pem: "nope".into(),
            ..tls
        };
        assert!(needs_rotation(Some(&garbage), HOST, t0()));
        assert!(needs_rotation(None, HOST, t0()));
    }
}
