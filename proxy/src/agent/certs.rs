//! The workload certificate and the trust bundle, kept current.
//!
//! The private key is generated here, in memory, for every issuance; it goes to Envoy over the
//! pod-local SDS socket and nowhere else. Renewal happens at about half the certificate's
//! lifetime, spread by ±10 % so that the proxies of a rollout do not all renew at once; a
//! failed request is retried with backoff well before the certificate expires.

use std::sync::Arc;
use std::time::Duration;

use meshplane_ca::authority::csr_for;
use meshplane_ca::grpc::{IstioCertificateRequest, IstioCertificateServiceClient};
use meshplane_ca::pem::{certificates, uri_sans, validity};
use time::OffsetDateTime;
use tokio::sync::watch;

use super::instance::{Instance, InstanceError};
use super::Secrets;

/// How often the bundle file is checked for changes (the kubelet updates ConfigMap volumes
/// within about a minute).
const BUNDLE_POLL: Duration = Duration::from_secs(2);
/// First retry delay after a failed certificate request; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Share of the lifetime after which a certificate is renewed, before jitter.
const RENEW_FRACTION: f64 = 0.5;
/// Jitter of the renewal point, as a share of the lifetime either way.
const RENEW_JITTER: f64 = 0.1;

/// An issued workload certificate and its key.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkloadCert {
    /// PEM chain Envoy presents: the certificate, then any intermediates (no root).
    pub chain_pem: String,
    /// PEM private key (PKCS#8).
    pub key_pem: String,
    /// The root the instance returned last in the chain.
    pub root_pem: String,
    /// The certificate's SPIFFE identity.
    pub identity: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl std::fmt::Debug for WorkloadCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadCert")
            .field("identity", &self.identity)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Why a certificate could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error(transparent)]
    Instance(#[from] InstanceError),
    #[error("generating the key: {0}")]
    Key(String),
    #[error("the certificate service refused: {0}")]
    Refused(tonic::Status),
    #[error("the certificate service answered with an unusable chain: {0}")]
    BadChain(String),
}

/// When to renew a certificate valid from `not_before` to `not_after`, received at
/// `received`; `jitter` in [-1, 1]. The life counts from when the certificate arrived, not
/// from `not_before`: the CA backdates `not_before` (5 minutes, for clock skew), and counting
/// from it would put the renewal of a short-lived certificate in the past, re-issuing it in a
/// loop.
pub fn renew_at(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    received: OffsetDateTime,
    jitter: f64,
) -> OffsetDateTime {
    let not_before = not_before.max(received.min(not_after));
    let lifetime = not_after - not_before;
    let share = RENEW_FRACTION + RENEW_JITTER * jitter.clamp(-1.0, 1.0);
    not_before + lifetime * share
}

/// Asks the instance for a certificate for a fresh key.
pub async fn request_certificate(
    instance: &Instance,
    ttl: Duration,
) -> Result<WorkloadCert, CertError> {
    let key = rcgen::KeyPair::generate().map_err(|e| CertError::Key(e.to_string()))?;
    let csr = csr_for(&key, None).map_err(|e| CertError::Key(e.to_string()))?;
    let channel = instance.connect().await?;
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr,
        validity_duration: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
        metadata: None,
    });
    request.set_timeout(Duration::from_secs(30));
    instance.authorize(&mut request)?;
    let chain = IstioCertificateServiceClient::new(channel)
        .create_certificate(request)
        .await
        .map_err(CertError::Refused)?
        .into_inner()
        .cert_chain;
    from_chain(&chain, &key)
}

/// Checks the answer: a chain whose first certificate carries our key and one URI SAN.
fn from_chain(chain: &[String], key: &rcgen::KeyPair) -> Result<WorkloadCert, CertError> {
    let bad = |m: String| CertError::BadChain(m);
    let (leaf_pem, rest) = chain.split_first().ok_or_else(|| bad("empty".into()))?;
    let leaf = certificates(leaf_pem)
        .map_err(|e| bad(e.to_string()))?
        .into_iter()
        .next()
        .ok_or_else(|| bad("no certificate first".into()))?;
    let parsed = leaf.parse().map_err(|e| bad(e.to_string()))?;
    if parsed.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(bad("the certificate is not for our key".into()));
    }
    let identity = match uri_sans(&parsed).as_slice() {
        [one] => one.clone(),
        other => return Err(bad(format!("expected one URI SAN, got {other:?}"))),
    };
    let (not_before, not_after) = validity(&parsed).map_err(|e| bad(e.to_string()))?;
    // Istio's order: issued certificate, intermediates, root last.
    let (root_pem, intermediates) = match rest.split_last() {
        Some((root, between)) => (root.clone(), between.to_vec()),
        None => (String::new(), Vec::new()),
    };
    let mut chain_pem = leaf.pem.clone();
    for i in intermediates {
        chain_pem.push_str(&i);
    }
    Ok(WorkloadCert {
        chain_pem,
        key_pem: key.serialize_pem(),
        root_pem,
        identity,
        not_before,
        not_after,
    })
}

async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
    }
}

/// Keeps a valid certificate in `secrets`, renewing it until `stop`.
pub async fn keep_certificate(
    instance: Instance,
    ttl: Duration,
    secrets: Arc<watch::Sender<Secrets>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let wait = match request_certificate(&instance, ttl).await {
            Ok(cert) => {
                backoff = MIN_BACKOFF;
                let at = renew_at(
                    cert.not_before,
                    cert.not_after,
                    OffsetDateTime::now_utc(),
                    rand::random_range(-1.0..=1.0),
                );
                tracing::info!(identity = %cert.identity, not_after = %cert.not_after, renew_at = %at, "workload certificate issued");
                secrets.send_modify(|s| s.cert = Some(Arc::new(cert)));
                let left = at - OffsetDateTime::now_utc();
                Duration::try_from(left).unwrap_or(Duration::ZERO)
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "no workload certificate");
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        if sleep_or_stop(wait, &mut stop).await {
            return;
        }
    }
}

/// Keeps the trust bundle in `secrets` equal to the bundle file, until `stop`.
pub async fn watch_bundle(
    instance: Instance,
    secrets: Arc<watch::Sender<Secrets>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match instance.bundle() {
            Ok(bundle) => {
                secrets.send_if_modified(|s| {
                    if s.bundle.as_deref() == Some(bundle.as_str()) {
                        return false;
                    }
                    tracing::info!(
                        roots = certificates(&bundle).map(|c| c.len()).unwrap_or(0),
                        "trust bundle loaded"
                    );
                    s.bundle = Some(bundle.clone());
                    true
                });
            }
            Err(e) => tracing::debug!(error = %e, "trust bundle not available"),
        }
        if sleep_or_stop(BUNDLE_POLL, &mut stop).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_at_about_half_life() {
        let from = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let to = from + time::Duration::hours(24);
        assert_eq!(
            renew_at(from, to, from, 0.0),
            from + time::Duration::hours(12)
        );
        let early = renew_at(from, to, from, -1.0);
        let late = renew_at(from, to, from, 1.0);
        assert!(
            early > from + time::Duration::hours(9) && early < from + time::Duration::hours(11)
        );
        assert!(late > from + time::Duration::hours(13) && late < from + time::Duration::hours(15));
        // Out-of-range jitter is clamped, never past expiry.
        assert_eq!(renew_at(from, to, from, 7.0), late);
    }

    #[test]
    fn a_short_lived_backdated_certificate_is_renewed_in_the_future() {
        // A 60 s certificate whose not_before the CA set 5 minutes back.
        let received = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let not_before = received - time::Duration::minutes(5);
        let not_after = received + time::Duration::seconds(60);
        let at = renew_at(not_before, not_after, received, 0.0);
        assert_eq!(at, received + time::Duration::seconds(30));
        for jitter in [-1.0, 1.0] {
            let at = renew_at(not_before, not_after, received, jitter);
            assert!(
                at > received && at < not_after,
                "{at} in ({received}, {not_after})"
            );
        }
        // Received after expiry (a stalled agent): renew at once, never in a loop of waits.
        assert_eq!(
            renew_at(
                not_before,
                not_after,
                not_after + time::Duration::seconds(1),
                0.0
            ),
            not_after
        );
    }

    #[test]
    fn an_answer_for_another_key_or_without_identity_is_refused() {
        use meshplane_ca::root::{generate_root, self_signed_files, DEFAULT_ROOT_VALIDITY};
        let now = OffsetDateTime::now_utc();
        let root = generate_root("blue", "cluster.local", now, DEFAULT_ROOT_VALIDITY).unwrap();
        let ca = meshplane_ca::Authority::load(&self_signed_files(&root), now).unwrap();
        let ours = rcgen::KeyPair::generate().unwrap();
        let theirs = rcgen::KeyPair::generate().unwrap();
        let id = meshplane_ca::SpiffeId::new("cluster.local", "shop", "web").unwrap();
        let issued = ca
            .issue_workload(
                &csr_for(&ours, None).unwrap(),
                &id,
                time::Duration::ZERO,
                now,
            )
            .unwrap();
        let cert = from_chain(&issued.chain, &ours).unwrap();
        assert_eq!(cert.identity, id.uri());
        assert_eq!(cert.root_pem, root.cert_pem);
        assert!(!cert.chain_pem.contains(root.cert_pem.trim()));
        assert!(matches!(
            from_chain(&issued.chain, &theirs),
            Err(CertError::BadChain(_))
        ));
        assert!(matches!(
            from_chain(&[], &ours),
            Err(CertError::BadChain(_))
        ));
    }
}
