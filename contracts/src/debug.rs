//! Contract 12: who may read an instance's `/debug/*` endpoints.
//!
//! The monitoring port (15014) serves `/metrics`, `/healthz` and `/readyz` to anyone (scrapers
//! and probes), but `/debug/*` (pod names, addresses, NACK texts, whole configs) only to a peer
//! on the instance's loopback or to a caller that presents a token of the control namespace's
//! ServiceAccount [`SERVICE_ACCOUNT`] issued for [`audience`] of the tenant.
//!
//! - The operator keeps that ServiceAccount (no RBAC of its own) in each control namespace.
//! - A reader (meshctl, the operator's migration gates) asks the API server for a short-lived
//!   token of it (TokenRequest, [`TOKEN_LIFETIME_SECONDS`]) and sends it in [`TOKEN_HEADER`].
//!   Kubernetes RBAC decides who may: `create` on `serviceaccounts/token` with
//!   `resourceNames: [meshplane-debug]` in the control namespace.
//! - The header is custom because the API server's `pods/proxy` drops `Authorization` after
//!   authenticating the caller; `Authorization: Bearer` is accepted too, for direct calls.
//! - The instance verifies the token by TokenReview for exactly [`audience`] and accepts only
//!   the username [`username`] of its own control namespace.

/// Name of the debug ServiceAccount in every control namespace.
pub const SERVICE_ACCOUNT: &str = "meshplane-debug";

/// Request header that carries the debug token (HTTP header names are case-insensitive).
pub const TOKEN_HEADER: &str = "x-meshplane-debug-token";

/// Lifetime readers ask for (the API server's minimum is 10 minutes).
pub const TOKEN_LIFETIME_SECONDS: i64 = 600;

/// Path prefix of the protected endpoints.
pub const PATH_PREFIX: &str = "/debug/";

/// The audience debug tokens of tenant `tenant` are issued for (never the proxies' audience,
/// so a debug token cannot open an ADS stream and a proxy token cannot read `/debug`).
pub fn audience(tenant: &str) -> String {
    format!("meshplane-{tenant}-debug")
}

/// The username TokenReview reports for the debug ServiceAccount of `control_namespace`.
pub fn username(control_namespace: &str) -> String {
    format!("system:serviceaccount:{control_namespace}:{SERVICE_ACCOUNT}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_tokens_have_their_own_audience_and_account() {
        assert_eq!(audience("blue"), "meshplane-blue-debug");
        assert_ne!(audience("blue"), crate::node::token_audience("blue"));
        assert_eq!(
            username("meshplane-blue"),
            "system:serviceaccount:meshplane-blue:meshplane-debug"
        );
        assert!(crate::is_dns1123_subdomain(SERVICE_ACCOUNT));
        assert_eq!(TOKEN_HEADER, TOKEN_HEADER.to_ascii_lowercase());
    }
}
