//! Workload identity served by the instance (contract 11 of docs/architecture.md).
//!
//! - [`ca_dir`]: the tenant CA mounted from its Secret (Istio's `cacerts` layout), reloaded
//!   when the files change.
//! - [`serving`]: the instance's own serving certificate for its TLS port, issued by that CA
//!   for the instance Service's names and re-issued at half-life or when the CA changes.
//! - [`service`]: `istio.v1.auth.IstioCertificateService/CreateCertificate`: a CSR and a
//!   ServiceAccount token in, a certificate for the token's identity (as TokenReview reports
//!   it, never the CSR's) out.
//! - [`secure`]: the TLS listener carrying ADS and the certificate service (Istio's 15012).

pub mod ca_dir;
pub mod secure;
pub mod service;
pub mod serving;

pub use ca_dir::CaDirectory;
pub use secure::serve_secure;
pub use service::CertificateServer;
pub use serving::ServingCert;
