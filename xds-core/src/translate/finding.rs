//! The unit of a verdict on traffic and authorization config: why an object does not (fully)
//! apply. Both judges use it (`diagnostics` for routing config, `authz_diagnostics` for
//! AuthorizationPolicies), so it is neither's.

/// Why an object does not (fully) apply.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// Stable machine-readable reason: `HostConflict`, `UnknownSubset`, `HostNotFound`,
    /// `GatewayNotFound`, `NamespaceNotAllowed`, `CredentialNotFound`, `MutualTlsUnavailable`.
    pub reason: &'static str,
    pub message: String,
}
