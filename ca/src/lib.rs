//! A tenant's certificate authority, pure: no I/O, the clock passed in.
//!
//! - [`spiffe`]: workload identities `spiffe://TD/ns/NS/sa/SA`, built from the ServiceAccount a
//!   TokenReview reported.
//! - [`authority`]: the `cacerts` layout (Istio's plugged-in CA files) loaded and checked, and
//!   what it issues: workload certificates from a CSR (the identity is the caller's, never the
//!   CSR's) and the instance's serving certificate.
//! - [`root`]: self-signed tenant roots and intermediates of an organisation root.
//! - [`rotation`]: the root rotation of a self-signed CA, two roots trusted during the overlap.
//! - [`verify`]: chain verification with rustls, as a TLS peer of the mesh does it.
//! - [`pem`]: PEM bundles and the facts read back from certificates (x509-parser).
//! - [`sds`]: the SDS names the node agent and the instance's translation share.
//!
//! Certificates are built with rcgen and read with x509-parser; nothing here encodes ASN.1 by
//! hand.

pub mod authority;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod pem;
pub mod root;
pub mod rotation;
pub mod sds;
pub mod spiffe;
pub mod verify;

pub use authority::{Authority, CaFiles, IssuedCert, DEFAULT_WORKLOAD_TTL, MAX_WORKLOAD_TTL};
pub use spiffe::SpiffeId;

use time::OffsetDateTime;

/// Why CA material could not be loaded or a certificate not issued or verified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaError {
    #[error("the CA material has no {0}")]
    MissingKey(&'static str),
    #[error("{0} holds no certificate")]
    Empty(&'static str),
    #[error("not PEM: {0}")]
    BadPem(String),
    #[error("not an X.509 certificate: {0}")]
    BadCertificate(String),
    #[error("ca-key.pem is not a usable private key (PKCS#8 or SEC1 PEM, EC P-256/P-384, RSA or Ed25519): {0}")]
    BadKey(String),
    #[error("{0} is not a CA certificate (basicConstraints CA:TRUE)")]
    NotACa(&'static str),
    #[error("ca-key.pem is not the key of ca-cert.pem")]
    KeyMismatch,
    #[error("{what} is valid from {not_before} to {not_after}, not now")]
    NotValidNow {
        what: &'static str,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    },
    #[error("ca-cert.pem does not chain through cert-chain.pem to a root of root-cert.pem")]
    Unanchored,
    #[error("the signing certificate has expired")]
    Expired,
    #[error("not a usable certificate signing request: {0}")]
    BadCsr(String),
    #[error("issuing: {0}")]
    Issue(String),
    #[error("not trusted: {0}")]
    Untrusted(String),
}
