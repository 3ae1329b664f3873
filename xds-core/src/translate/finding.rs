//! The unit of a verdict on traffic and authorization config: why an object does not (fully)
//! apply. Both judges use it (`diagnostics` for routing config, `authz_diagnostics` for
//! AuthorizationPolicies), so it is neither's; and the objects a verdict is on.

/// Why an object does not (fully) apply.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// Stable machine-readable reason: `HostConflict`, `UnknownSubset`, `HostNotFound`,
    /// `GatewayNotFound`, `NamespaceNotAllowed`, `CredentialNotFound`, `MutualTlsUnavailable`,
    /// `EnvoyFilterBeyondPolicy`.
    pub reason: &'static str,
    pub message: String,
}

/// The kinds that carry an `Accepted` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigKind {
    VirtualService,
    DestinationRule,
    Gateway,
    AuthorizationPolicy,
    ServiceEntry,
    Sidecar,
    EnvoyFilter,
    PeerAuthentication,
    RequestAuthentication,
}

impl ConfigKind {
    /// Every kind that carries an `Accepted` condition.
    pub const ALL: [ConfigKind; 9] = [
        ConfigKind::VirtualService,
        ConfigKind::DestinationRule,
        ConfigKind::Gateway,
        ConfigKind::AuthorizationPolicy,
        ConfigKind::ServiceEntry,
        ConfigKind::Sidecar,
        ConfigKind::EnvoyFilter,
        ConfigKind::PeerAuthentication,
        ConfigKind::RequestAuthentication,
    ];

    /// API group, kind name and plural of its resource.
    pub fn api(self) -> (&'static str, &'static str, &'static str) {
        const NET: &str = "networking.meshplane.io";
        const SEC: &str = "security.meshplane.io";
        match self {
            ConfigKind::VirtualService => (NET, "VirtualService", "virtualservices"),
            ConfigKind::DestinationRule => (NET, "DestinationRule", "destinationrules"),
            ConfigKind::Gateway => (NET, "Gateway", "gateways"),
            ConfigKind::ServiceEntry => (NET, "ServiceEntry", "serviceentries"),
            ConfigKind::Sidecar => (NET, "Sidecar", "sidecars"),
            ConfigKind::EnvoyFilter => (NET, "EnvoyFilter", "envoyfilters"),
            ConfigKind::AuthorizationPolicy => {
                (SEC, "AuthorizationPolicy", "authorizationpolicies")
            }
            ConfigKind::PeerAuthentication => (SEC, "PeerAuthentication", "peerauthentications"),
            ConfigKind::RequestAuthentication => {
                (SEC, "RequestAuthentication", "requestauthentications")
            }
        }
    }
}

/// An object of one of those kinds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigRef {
    pub kind: ConfigKind,
    pub namespace: String,
    pub name: String,
}
