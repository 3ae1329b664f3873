//! The instance's serving certificate for its TLS port: issued by the tenant CA itself for the
//! instance Service's DNS names (what every proxy verifies) and the instance's SPIFFE identity,
//! re-issued at half its lifetime and whenever the CA changes (root rotation, new plug-in).

use std::sync::{Arc, Mutex, MutexGuard};

use meshplane_ca::{Authority, SpiffeId};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use time::{Duration, OffsetDateTime};

use super::ca_dir::CaDirectory;

/// Lifetime of the instance's serving certificate.
pub const SERVING_TTL: Duration = Duration::hours(24);

struct Current {
    authority: Arc<Authority>,
    key: Arc<CertifiedKey>,
    renew_at: OffsetDateTime,
}

/// Resolves the serving certificate of every TLS handshake.
pub struct ServingCert {
    ca: Arc<CaDirectory>,
    dns_names: Vec<String>,
    identity: Option<SpiffeId>,
    provider: Arc<CryptoProvider>,
    current: Mutex<Option<Current>>,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("dns_names", &self.dns_names)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ServingCert {
    pub fn new(
        ca: Arc<CaDirectory>,
        dns_names: Vec<String>,
        identity: Option<SpiffeId>,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        Self {
            ca,
            dns_names,
            identity,
            provider,
            current: Mutex::new(None),
        }
    }

    /// The certificate to serve now, issuing a new one when needed. `None` (the handshake
    /// fails) only while no CA has ever loaded.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        let authority = match self.ca.authority() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "no serving certificate: the tenant CA is not loaded");
                return None;
            }
        };
        let now = OffsetDateTime::now_utc();
        let mut current = lock(&self.current);
        if let Some(c) = current.as_ref() {
            if Arc::ptr_eq(&c.authority, &authority) && now < c.renew_at {
                return Some(Arc::clone(&c.key));
            }
        }
        match self.issue(&authority, now) {
            Ok(next) => {
                let key = Arc::clone(&next.key);
                *current = Some(next);
                Some(key)
            }
            Err(e) => {
                tracing::error!(error = %e, "issuing the instance's serving certificate");
                current.as_ref().map(|c| Arc::clone(&c.key))
            }
        }
    }

    fn issue(&self, authority: &Arc<Authority>, now: OffsetDateTime) -> Result<Current, String> {
        let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let issued = authority
            .issue_serving(
                &key,
                &self.dns_names,
                self.identity.as_ref(),
                SERVING_TTL,
                now,
            )
            .map_err(|e| e.to_string())?;
        let chain = meshplane_ca::pem::certificates(&issued.presented_chain_pem())
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|c| CertificateDer::from(c.der))
            .collect::<Vec<_>>();
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = self
            .provider
            .key_provider
            .load_private_key(der)
            .map_err(|e| e.to_string())?;
        let lifetime = issued.not_after - now;
        Ok(Current {
            authority: Arc::clone(authority),
            key: Arc::new(CertifiedKey::new(chain, signing)),
            renew_at: now + lifetime / 2,
        })
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}
