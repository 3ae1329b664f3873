//! Contract 9: the operator's own admission certificate.
//!
//! It lives in the Secret [`SECRET_NAME`] (type and keys of contract 4) in the operator's
//! namespace: the first replica creates it, the others adopt it (a create that loses the race
//! re-reads the winner's), every replica serves it on [`ADMISSION_PATH`] and keeps the
//! `caBundle` of the ValidatingWebhookConfiguration [`WEBHOOK_CONFIGURATION`] equal to its
//! `ca.crt`; `/readyz` waits for both.

/// The shared Secret in the operator's namespace.
pub const SECRET_NAME: &str = "meshplane-operator-webhook-tls";
/// The operator's ValidatingWebhookConfiguration.
pub const WEBHOOK_CONFIGURATION: &str = "meshplane-operator";
/// Path of the operator's admission check of the meshplane API.
pub const ADMISSION_PATH: &str = "/validate-meshplane";

/// DNS name of the operator's Service in `namespace`: the certificate's subject.
pub fn service_host(namespace: &str) -> String {
    format!("meshplane-operator.{namespace}.svc")
}
