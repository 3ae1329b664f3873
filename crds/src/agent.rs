//! The grammar of the pod annotations that configure the node agent of an injected pod.
//!
//! - [`CERT_TTL_ANNOTATION`]: the lifetime of the workload certificates the agent asks for, a Go
//!   duration between [`MIN_CERT_TTL`] and [`MAX_CERT_TTL`], rendered by the injector as the
//!   agent's `--cert-ttl-seconds`. Bounds are checked at admission, so a pod never starts with a
//!   lifetime the certificate service would silently cut or the agent would renew in a storm.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::duration;
pub use crate::names::CERT_TTL_ANNOTATION;

/// Shortest certificate lifetime a pod may ask for. The agent renews at about half the
/// lifetime, so this bounds the renewal rate of one pod to one request every ~5 seconds.
pub const MIN_CERT_TTL: Duration = Duration::from_secs(10);
/// Longest certificate lifetime a pod may ask for: the certificate service's cap (7 days).
pub const MAX_CERT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why the certificate lifetime annotation is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "metadata.annotations[\"{annotation}\"]: {value:?} is not a certificate lifetime: {reason}; write a Go duration of whole seconds between 10s and 168h, e.g. \"1h\" or \"90s\"",
    annotation = CERT_TTL_ANNOTATION
)]
pub struct CertTtlError {
    pub value: String,
    pub reason: String,
}

/// The certificate lifetime a pod asks for, if it asks for one.
pub fn cert_ttl_from_annotations(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<Duration>, CertTtlError> {
    let Some(value) = annotations.and_then(|a| a.get(CERT_TTL_ANNOTATION)) else {
        return Ok(None);
    };
    let err = |reason: String| CertTtlError {
        value: value.clone(),
        reason,
    };
    let ttl = duration::parse(value.trim()).map_err(|e| err(e.reason.to_string()))?;
    if ttl.subsec_nanos() != 0 {
        return Err(err("the agent asks for whole seconds".into()));
    }
    if ttl < MIN_CERT_TTL {
        return Err(err(format!(
            "shorter than {}s, which would renew more often than every {}s",
            MIN_CERT_TTL.as_secs(),
            MIN_CERT_TTL.as_secs() / 2
        )));
    }
    if ttl > MAX_CERT_TTL {
        return Err(err("longer than the certificate service's 7-day cap".into()));
    }
    Ok(Some(ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ttl(value: &str) -> Result<Option<Duration>, CertTtlError> {
        let annotations = BTreeMap::from([(CERT_TTL_ANNOTATION.to_string(), value.to_string())]);
        cert_ttl_from_annotations(Some(&annotations))
    }

    #[test]
    fn go_durations_within_the_bounds_are_the_lifetime() {
        assert_eq!(ttl("10s"), Ok(Some(Duration::from_secs(10))));
        assert_eq!(ttl("1h30m"), Ok(Some(Duration::from_secs(5400))));
        assert_eq!(ttl("1.5m"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(ttl("168h"), Ok(Some(MAX_CERT_TTL)));
        assert_eq!(cert_ttl_from_annotations(None), Ok(None));
        assert_eq!(cert_ttl_from_annotations(Some(&BTreeMap::new())), Ok(None));
    }

    #[test]
    fn malformed_or_out_of_bounds_lifetimes_are_refused_with_the_reason() {
        for (value, reason) in [
            ("24", "a number needs a unit"),
            ("1d", "unknown unit"),
            ("-1h", "expected a number"),
            ("", "empty"),
            ("9s", "shorter than 10s"),
            ("0s", "shorter than 10s"),
            ("10.5s", "whole seconds"),
            ("169h", "7-day cap"),
        ] {
            let e = ttl(value).expect_err(value);
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!(
                    "metadata.annotations[\"sidecar.meshplane.io/certTTL\"]: {value:?} is not a certificate lifetime: "
                )) && msg.contains(reason),
                "{value}: {msg}"
            );
        }
    }
}
