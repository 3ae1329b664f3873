//! Semantic rules of `PeerAuthentication` that the schema cannot express, as Istio's
//! validation and analyzer apply them: `portLevelMtls` only with a `selector` (without one
//! Istio ignores it, and a silently ignored STRICT is worse than an error), and no `selector`
//! in the tenant's control namespace (its policy is tenant-wide; a selector there is ignored).

use super::{validate_label_key, validate_label_value, ValidationError, ValidationErrors};
use crate::security::PeerAuthenticationSpec;

/// Why `portLevelMtls` needs a selector.
pub const PORT_LEVEL_NEEDS_SELECTOR: &str = "portLevelMtls applies to the ports of selected workloads only: add spec.selector.matchLabels, or set spec.mtls for the whole namespace";
/// Why the control namespace takes no selector.
pub const CONTROL_NAMESPACE_SELECTOR: &str = "a policy in the tenant's control namespace applies to the whole tenant and its selector would be ignored: remove spec.selector, or put the policy in the workloads' namespace";

/// Checks a PeerAuthentication spec; `in_control_namespace` says whether it lives in the
/// tenant's control namespace.
pub fn validate_peer_authentication(
    spec: &PeerAuthenticationSpec,
    in_control_namespace: bool,
) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if let Some(selector) = &spec.selector {
        if in_control_namespace {
            errs.0.push(ValidationError::Invalid {
                field: "spec.selector".into(),
                reason: CONTROL_NAMESPACE_SELECTOR.into(),
            });
        }
        for (key, value) in &selector.match_labels {
            let field = format!("spec.selector.matchLabels[{key}]");
            errs.check(validate_label_key(key, &field));
            errs.check(validate_label_value(value, &field));
        }
    }
    let selects = spec
        .selector
        .as_ref()
        .is_some_and(|s| !s.match_labels.is_empty());
    if !spec.port_level_mtls.is_empty() && !selects {
        errs.0.push(ValidationError::Invalid {
            field: "spec.portLevelMtls".into(),
            reason: PORT_LEVEL_NEEDS_SELECTOR.into(),
        });
    }
    for port in spec.port_level_mtls.keys() {
        if !matches!(port.parse::<u32>(), Ok(1..=65535)) {
            errs.0.push(ValidationError::InvalidPort {
                field: format!("spec.portLevelMtls[{port}]"),
                reason: "keys must be port numbers (1-65535)".into(),
            });
        }
    }
    errs.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> PeerAuthenticationSpec {
        serde_json::from_value(value).expect("a PeerAuthentication spec")
    }

    fn fields(result: Result<(), ValidationErrors>) -> Vec<String> {
        result
            .err()
            .map(|e| {
                e.0.iter()
                    .map(|v| {
                        v.to_string()
                            .split(':')
                            .next()
                            .unwrap_or_default()
                            .to_string()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn namespace_and_workload_policies_pass() {
        let strict = spec(json!({"mtls": {"mode": "STRICT"}}));
        assert!(validate_peer_authentication(&strict, false).is_ok());
        assert!(validate_peer_authentication(&strict, true).is_ok());
        let ported = spec(json!({
            "selector": {"matchLabels": {"app": "web"}},
            "mtls": {"mode": "PERMISSIVE"},
            "portLevelMtls": {"8080": {"mode": "STRICT"}}
        }));
        assert!(validate_peer_authentication(&ported, false).is_ok());
    }

    #[test]
    fn port_level_mtls_needs_a_selector_and_port_numbers() {
        let no_selector = spec(json!({"portLevelMtls": {"8080": {"mode": "STRICT"}}}));
        assert_eq!(
            fields(validate_peer_authentication(&no_selector, false)),
            ["spec.portLevelMtls"]
        );
        let empty_selector =
            spec(json!({"selector": {}, "portLevelMtls": {"8080": {"mode": "DISABLE"}}}));
        assert_eq!(
            fields(validate_peer_authentication(&empty_selector, false)),
            ["spec.portLevelMtls"]
        );
        let bad_port = spec(json!({
            "selector": {"matchLabels": {"app": "web"}},
            "portLevelMtls": {"0": {"mode": "STRICT"}, "http": {"mode": "STRICT"}}
        }));
        assert_eq!(
            fields(validate_peer_authentication(&bad_port, false)),
            ["spec.portLevelMtls[0]", "spec.portLevelMtls[http]"]
        );
    }

    #[test]
    fn the_control_namespace_takes_no_selector() {
        let selected =
            spec(json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"}}));
        assert!(validate_peer_authentication(&selected, false).is_ok());
        let errs = validate_peer_authentication(&selected, true).expect_err("refused");
        assert_eq!(
            errs.0[0].to_string(),
            format!("spec.selector: {CONTROL_NAMESPACE_SELECTOR}")
        );
    }

    #[test]
    fn selector_labels_are_label_syntax() {
        let bad = spec(json!({"selector": {"matchLabels": {"-app": "web web"}}}));
        assert_eq!(
            fields(validate_peer_authentication(&bad, false)).len(),
            2,
            "the key and the value are both reported"
        );
    }
}
