//! Chain verification with rustls' WebPKI verifier: what a TLS peer of the mesh would accept.

use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use time::OffsetDateTime;

use crate::pem;
use crate::spiffe::SpiffeId;
use crate::CaError;

/// The ring crypto provider, the one every meshplane TLS endpoint uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls root store holding every root of a PEM trust bundle.
pub fn root_store(bundle_pem: &str) -> Result<RootCertStore, CaError> {
    let mut store = RootCertStore::empty();
    for cert in pem::certificates(bundle_pem)? {
        store
            .add(CertificateDer::from(cert.der))
            .map_err(|e| CaError::BadCertificate(e.to_string()))?;
    }
    if store.is_empty() {
        return Err(CaError::Empty("trust bundle"));
    }
    Ok(store)
}

fn split_chain(
    chain_pem: &str,
) -> Result<(CertificateDer<'static>, Vec<CertificateDer<'static>>), CaError> {
    let mut certs = pem::certificates(chain_pem)?
        .into_iter()
        .map(|c| CertificateDer::from(c.der));
    let leaf = certs.next().ok_or(CaError::Empty("certificate chain"))?;
    Ok((leaf, certs.collect()))
}

fn unix(now: OffsetDateTime) -> UnixTime {
    UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        u64::try_from(now.unix_timestamp()).unwrap_or(0),
    ))
}

/// Verifies a client certificate chain (leaf first) against `bundle_pem` at `now` as a
/// mutual-TLS server would, and returns the leaf's SPIFFE identity.
pub fn verify_workload_chain(
    chain_pem: &str,
    bundle_pem: &str,
    now: OffsetDateTime,
) -> Result<SpiffeId, CaError> {
    let (leaf, intermediates) = split_chain(chain_pem)?;
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(root_store(bundle_pem)?), provider())
            .build()
            .map_err(|e| CaError::Untrusted(e.to_string()))?;
    verifier
        .verify_client_cert(&leaf, &intermediates, unix(now))
        .map_err(|e| CaError::Untrusted(e.to_string()))?;
    let parsed = pem::PemCert {
        pem: String::new(),
        der: leaf.to_vec(),
    };
    let cert = parsed.parse()?;
    let uris = pem::uri_sans(&cert);
    match uris.as_slice() {
        [one] => SpiffeId::parse(one).map_err(|e| CaError::Untrusted(e.to_string())),
        _ => Err(CaError::Untrusted(format!(
            "expected exactly one URI SAN, found {uris:?}"
        ))),
    }
}

/// Verifies a server certificate chain (leaf first) for `dns_name` against `bundle_pem` at
/// `now`, as a TLS client would.
pub fn verify_server_chain(
    chain_pem: &str,
    dns_name: &str,
    bundle_pem: &str,
    now: OffsetDateTime,
) -> Result<(), CaError> {
    let (leaf, intermediates) = split_chain(chain_pem)?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(root_store(bundle_pem)?),
        provider(),
    )
    .build()
    .map_err(|e| CaError::Untrusted(e.to_string()))?;
    let name =
        ServerName::try_from(dns_name.to_owned()).map_err(|e| CaError::Untrusted(e.to_string()))?;
    verifier
        .verify_server_cert(&leaf, &intermediates, &name, &[], unix(now))
        .map(|_| ())
        .map_err(|e| CaError::Untrusted(e.to_string()))
}
