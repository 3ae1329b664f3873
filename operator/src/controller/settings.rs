//! Tunables of the controllers.

use std::time::Duration;

/// Tunables of the controllers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Validity of issued webhook certificates.
    pub tls_validity: time::Duration,
    /// Periodic resync of every object (also catches certificate rotation deadlines).
    pub resync: Duration,
    /// How often a deletion blocked by running injected pods is retried.
    pub in_use_retry: Duration,
    /// Timing of the self-signed tenant roots' rotation.
    pub ca_rotation: meshplane_ca::rotation::RotationPolicy,
    /// The operator's ServiceAccount, bound per member namespace to restart workloads.
    pub operator_account: crate::render::OperatorAccount,
    /// The API server's admission client CA (`--apiserver-client-ca`), handed to every
    /// instance in its webhook TLS Secret (contract 4); `None`: admission is not authenticated.
    pub apiserver_client: Option<std::sync::Arc<meshplane_webhooks::client_auth::ClientAuth>>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            tls_validity: crate::tls::DEFAULT_VALIDITY,
            resync: Duration::from_secs(300),
            in_use_retry: Duration::from_secs(15),
            ca_rotation: meshplane_ca::rotation::RotationPolicy::default(),
            operator_account: crate::render::OperatorAccount::default(),
            apiserver_client: None,
        }
    }
}
