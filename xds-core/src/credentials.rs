//! What the index asks while it renders a gateway: may this ServiceAccount read this Secret?
//! The answers come from outside (SubjectAccessReviews in Kubernetes mode, the xds-server's
//! `credential_access`); the index only reads what is known now, without I/O.

/// What is known of one ServiceAccount reading one Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Allowed,
    Denied,
    /// Not asked yet (or not answered): treated as refused until it is.
    Unknown,
}

/// Answers whether a gateway's ServiceAccount may read a credential Secret, as far as is
/// known now; an unknown answer is to be asked for by the implementation, never waited for.
pub trait CredentialDecider: Send + Sync + std::fmt::Debug {
    /// Whether the ServiceAccount `service_account` of `namespace` may get the Secret `secret`
    /// there.
    fn decide(&self, namespace: &str, service_account: &str, secret: &str) -> Access;
}
