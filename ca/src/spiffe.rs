//! SPIFFE identities of workloads: `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
//!
//! The identity is always built from what the API server reports for a token (the
//! ServiceAccount username `system:serviceaccount:NS:NAME`), never from what a workload asks for.

use std::fmt;

/// Why a string is not a workload identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpiffeError {
    #[error(
        "trust domain {0:?} is not a lowercase DNS-like name (letters, digits, '.', '-', '_')"
    )]
    TrustDomain(String),
    #[error("{0:?} is not a Kubernetes ServiceAccount username (system:serviceaccount:NS:NAME)")]
    NotAServiceAccount(String),
    #[error("{0:?} is not a workload SPIFFE ID (spiffe://TRUST_DOMAIN/ns/NS/sa/SA)")]
    NotAWorkloadId(String),
}

/// A workload's SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpiffeId {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

/// Checks a trust domain the way SPIFFE does: non-empty, at most 255 bytes, lowercase letters,
/// digits, `.`, `-` and `_`.
pub fn validate_trust_domain(trust_domain: &str) -> Result<(), SpiffeError> {
    let ok = !trust_domain.is_empty()
        && trust_domain.len() <= 255
        && trust_domain
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(SpiffeError::TrustDomain(trust_domain.to_owned()))
    }
}

/// A Kubernetes name segment (namespace or ServiceAccount): non-empty, no `/`.
fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

impl SpiffeId {
    /// The identity of ServiceAccount `service_account` in `namespace`.
    pub fn new(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<Self, SpiffeError> {
        validate_trust_domain(trust_domain)?;
        if !valid_segment(namespace) || !valid_segment(service_account) {
            return Err(SpiffeError::NotAWorkloadId(format!(
                "spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"
            )));
        }
        Ok(Self {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        })
    }

    /// The identity of the ServiceAccount a TokenReview reported (`system:serviceaccount:NS:NAME`).
    pub fn from_service_account_username(
        trust_domain: &str,
        username: &str,
    ) -> Result<Self, SpiffeError> {
        let not_sa = || SpiffeError::NotAServiceAccount(username.to_owned());
        let rest = username
            .strip_prefix("system:serviceaccount:")
            .ok_or_else(not_sa)?;
        let (namespace, name) = rest.split_once(':').ok_or_else(not_sa)?;
        if name.contains(':') {
            return Err(not_sa());
        }
        Self::new(trust_domain, namespace, name)
    }

    /// Parses `spiffe://TD/ns/NS/sa/SA`.
    pub fn parse(uri: &str) -> Result<Self, SpiffeError> {
        let bad = || SpiffeError::NotAWorkloadId(uri.to_owned());
        let rest = uri.strip_prefix("spiffe://").ok_or_else(bad)?;
        let mut parts = rest.split('/');
        let (Some(td), Some("ns"), Some(ns), Some("sa"), Some(sa), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        Self::new(td, ns, sa).map_err(|_| bad())
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn service_account(&self) -> &str {
        &self.service_account
    }

    /// The URI form, as it appears in a certificate's URI SAN.
    pub fn uri(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// The URI prefix every identity of `trust_domain` starts with (`spiffe://TD/`), for SAN
/// prefix matches that refuse other trust domains.
pub fn trust_domain_prefix(trust_domain: &str) -> String {
    format!("spiffe://{trust_domain}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_from_a_service_account_username() {
        let id = SpiffeId::from_service_account_username(
            "cluster.local",
            "system:serviceaccount:shop:web",
        )
        .unwrap();
        assert_eq!(id.uri(), "spiffe://cluster.local/ns/shop/sa/web");
        assert_eq!(id.namespace(), "shop");
        assert_eq!(id.service_account(), "web");
        assert_eq!(SpiffeId::parse(&id.uri()).unwrap(), id);
    }

    #[test]
    fn refuses_what_is_not_a_service_account_or_a_workload_id() {
        for username in [
            "alice",
            "system:serviceaccount:shop",
            "system:serviceaccount::web",
            "system:serviceaccount:shop:web:extra",
            "system:serviceaccount:sh/op:web",
        ] {
            assert!(
                SpiffeId::from_service_account_username("cluster.local", username).is_err(),
                "{username}"
            );
        }
        for uri in [
            "spiffe://cluster.local/ns/shop",
            "spiffe://cluster.local/ns/shop/sa/web/x",
            "https://cluster.local/ns/shop/sa/web",
            "spiffe://Cluster.Local/ns/shop/sa/web",
            "spiffe:///ns/shop/sa/web",
        ] {
            assert!(SpiffeId::parse(uri).is_err(), "{uri}");
        }
        assert!(validate_trust_domain("blue.example.org").is_ok());
        assert!(validate_trust_domain("has space").is_err());
        assert!(validate_trust_domain("").is_err());
    }
}
