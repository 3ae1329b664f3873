//! Webhook TLS of an instance (contract 4): a CA and a serving certificate for the instance
//! Service's DNS name, issued with rcgen and rotated when less than a third of the validity
//! remains. Pure: the caller passes the clock, so rotation is testable.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use meshplane_contracts::webhook_tls::{CA_CRT, TLS_CRT, TLS_KEY};
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
            (CA_CRT, B64.encode(&self.ca_bundle_pem)),
            (TLS_CRT, B64.encode(&self.cert_pem)),
            (TLS_KEY, B64.encode(&self.key_pem)),
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
            ca_bundle_pem: field(CA_CRT)?,
            cert_pem: field(TLS_CRT)?,
            key_pem: field(TLS_KEY)?,
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

/// What a replica of the operator does with the shared admission TLS Secret it just read
/// (`observed`, `None` when the Secret does not exist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SharedTlsStep {
    /// The Secret holds good material: serve it (this is also how a replica adopts the winner
    /// after its own create lost with 409 AlreadyExists: it re-reads and lands here).
    Use(WebhookTls),
    /// No Secret yet: create it (POST, never apply) with this material; on 409 re-read.
    Create(WebhookTls),
    /// The Secret must be rotated: replace it carrying the resourceVersion that was read; on
    /// 409 re-read (another replica rotated first).
    Update(WebhookTls),
}

/// The create-or-adopt decision of the replicas sharing one admission certificate. Pure, so
/// every replica decides the same way from the same observation. `secret_exists` with
/// `observed` `None` is a Secret whose data is unreadable: it is replaced, not created.
pub fn shared_tls_step(
    secret_exists: bool,
    observed: Option<WebhookTls>,
    host: &str,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<SharedTlsStep, TlsError> {
    let (tls, issued) = ensure(observed, host, now, validity)?;
    Ok(match (secret_exists, issued) {
        (_, false) => SharedTlsStep::Use(tls),
        (false, true) => SharedTlsStep::Create(tls),
        (true, true) => SharedTlsStep::Update(tls),
    })
}

fn pem_certs(bundle: &str) -> Vec<&str> {
    let end = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(end)
        .map(str::trim)
        .filter(|c| c.starts_with("-----BEGIN CERTIFICATE-----") && c.ends_with(end))
        .collect()
}

/// Whether a replica serving `ours` (the Secret's material) must write its `ca.crt` into a
/// webhook configuration whose caBundle is `current` (PEM). It writes unless the bundle already
/// equals `ca.crt`, or unless the bundle is from a newer rotation that still trusts our current
/// CA (it starts with another CA but contains ours): a replica that has not yet re-read a
/// rotated Secret must not roll the caBundle back.
pub fn ca_bundle_needs_write(current: &str, ours: &WebhookTls) -> bool {
    let have = pem_certs(current);
    let want = pem_certs(&ours.ca_bundle_pem);
    if have == want {
        return false;
    }
    let Some(our_ca) = want.first() else {
        return false;
    };
    let newer_rotation = have.first().is_some_and(|c| c != our_ca) && have.contains(our_ca);
    !newer_rotation
}

/// Whether the caBundle `current` (PEM) trusts the CA that signed `ours`' serving certificate.
pub fn ca_bundle_trusts(current: &str, ours: &WebhookTls) -> bool {
    let have = pem_certs(current);
    pem_certs(&ours.ca_bundle_pem)
        .first()
        .is_some_and(|ca| have.contains(ca))
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

    #[test]
    fn a_missing_secret_is_created_and_an_existing_one_adopted() {
        let validity = Duration::days(90);
        // Nobody created it yet: issue and create.
        let SharedTlsStep::Create(ours) =
            shared_tls_step(false, None, HOST, t0(), validity).unwrap()
        else {
            panic!("expected Create");
        };
        // A Secret that exists but does not parse is replaced, never re-created.
        assert!(matches!(
            shared_tls_step(true, None, HOST, t0(), validity).unwrap(),
            SharedTlsStep::Update(_)
        ));
        assert!(!needs_rotation(Some(&ours), HOST, t0()));
        // Our create lost (409): the re-read shows the winner's material, which is used as is,
        // never replaced by ours.
        let winner = issue(HOST, t0(), validity, None).unwrap();
        assert_ne!(winner, ours);
        assert_eq!(
            shared_tls_step(
                true,
                Some(winner.clone()),
                HOST,
                t0() + Duration::days(1),
                validity
            )
            .unwrap(),
            SharedTlsStep::Use(winner.clone())
        );
        // With less than a third left the Secret is replaced (guarded update), trusting the
        // winner's CA during the switch.
        match shared_tls_step(
            true,
            Some(winner.clone()),
            HOST,
            t0() + Duration::days(61),
            validity,
        )
        .unwrap()
        {
            SharedTlsStep::Update(rotated) => {
                assert!(rotated.ca_bundle_pem.contains(winner.current_ca().unwrap()));
            }
            other => panic!("expected Update, got {other:?}"),
        }
    }

    #[test]
    fn ca_bundle_is_kept_equal_to_the_secret_and_never_rolled_back() {
        let validity = Duration::days(90);
        let old = issue(HOST, t0(), validity, None).unwrap();
        let (new, _) =
            ensure(Some(old.clone()), HOST, t0() + Duration::days(61), validity).unwrap();
        // Another replica's self-issued CA only: replace it.
        let stray = issue(HOST, t0(), validity, None).unwrap();
        assert!(ca_bundle_needs_write(&stray.ca_bundle_pem, &old));
        assert!(!ca_bundle_trusts(&stray.ca_bundle_pem, &old));
        assert!(ca_bundle_needs_write("", &old));
        // Equal (modulo trailing whitespace): nothing to do.
        assert!(!ca_bundle_needs_write(
            &format!("{}\n\n", old.ca_bundle_pem),
            &old
        ));
        assert!(ca_bundle_trusts(&old.ca_bundle_pem, &old));
        // The rotating replica moves the bundle forward...
        assert!(ca_bundle_needs_write(&old.ca_bundle_pem, &new));
        // ...and a replica still on the old Secret does not move it back, and is trusted.
        assert!(!ca_bundle_needs_write(&new.ca_bundle_pem, &old));
        assert!(ca_bundle_trusts(&new.ca_bundle_pem, &old));
        // A bundle holding our CA plus a stray one behind it is made exact.
        let extra = format!("{}{}", old.ca_bundle_pem, stray.ca_bundle_pem);
        assert!(ca_bundle_needs_write(&extra, &old));
    }
}
