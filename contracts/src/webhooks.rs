//! Contract 5: the webhook paths on the instance's HTTPS port ([`crate::ports::HTTPS_WEBHOOK`]).
//!
//! Both configurations of a revision select the namespaces whose `meshplane.io/rev` is the
//! revision or one of its tags.

/// Mutating: Pods CREATE (sidecar injection).
pub const INJECT_PATH: &str = "/inject";
/// Validating: `networking.meshplane.io` config CREATE/UPDATE.
pub const VALIDATE_PATH: &str = "/validate";
/// Liveness of the webhook server.
pub const HEALTHZ_PATH: &str = "/healthz";

/// The revision's MutatingWebhookConfiguration.
pub fn injector_configuration(revision: &str) -> String {
    format!("meshplane-{revision}-injector")
}

/// The revision's ValidatingWebhookConfiguration.
pub fn validator_configuration(revision: &str) -> String {
    format!("meshplane-{revision}-validator")
}

/// The instance Service (and Deployment, ServiceAccount, PDB) of `revision`.
pub fn instance_name(revision: &str) -> String {
    format!("meshplane-{revision}")
}

/// In-cluster DNS name of the instance Service: the subject of its serving certificate
/// (contract 4) and the ADS host of the bootstrap (contract 6) until a ClusterIP is known.
pub fn service_host(revision: &str, control_namespace: &str) -> String {
    format!("{}.{control_namespace}.svc", instance_name(revision))
}
