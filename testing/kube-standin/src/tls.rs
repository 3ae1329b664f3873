//! The stand-in's serving certificate. kubectl sends bearer tokens only over HTTPS, so the API
//! is served with TLS from a CA made at start, whose certificate goes into the kubeconfigs.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::store::KUBERNETES_SERVICE_IP;

/// Why the serving certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("issuing the serving certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error("configuring TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A CA and the server configuration serving a certificate it signed for 127.0.0.1, localhost
/// and the in-cluster names of the API (the `kubernetes` Service's ClusterIP and DNS names), so
/// that pods reaching it through the Service verify it as they would a real API server.
pub struct ServingTls {
    pub ca_pem: String,
    pub config: Arc<rustls::ServerConfig>,
}

pub fn serving_tls() -> Result<ServingTls, TlsError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-standin test fixture CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let names = [
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        KUBERNETES_SERVICE_IP.to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
    ];
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-standin");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(ServingTls {
        ca_pem: ca_cert.pem(),
        config: Arc::new(config),
    })
}
