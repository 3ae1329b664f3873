//! Semantic rules of `RequestAuthentication` that the schema cannot express.

use super::{validate_label_key, validate_label_value, ValidationError, ValidationErrors};
use crate::security::authorization::TARGET_REF_UNSUPPORTED;
use crate::security::request_authentication::{key_set_ids, RequestAuthenticationSpec};

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ValidationError {
    ValidationError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Whether `name` is an HTTP header name (RFC 9110 token characters).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Validates a RequestAuthentication spec.
pub fn validate_request_authentication(
    spec: &RequestAuthenticationSpec,
) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if spec.target_ref.is_some() || !spec.target_refs.is_empty() {
        errs.0
            .push(invalid("spec.targetRef", TARGET_REF_UNSUPPORTED));
    }
    if let Some(sel) = &spec.selector {
        for (k, v) in &sel.match_labels {
            errs.check(validate_label_key(k, "spec.selector.matchLabels"));
            errs.check(validate_label_value(v, "spec.selector.matchLabels"));
        }
    }
    for (r, rule) in spec.jwt_rules.iter().enumerate() {
        let rf = format!("spec.jwtRules[{r}]");
        if rule.issuer.is_empty() {
            errs.0.push(ValidationError::Empty {
                field: format!("{rf}.issuer"),
            });
        }
        if rule.issuer.contains(char::is_whitespace) {
            errs.0
                .push(invalid(format!("{rf}.issuer"), "must not contain spaces"));
        }
        if !rule.jwks.is_empty() {
            if let Err(why) = key_set_ids(&rule.jwks) {
                errs.0.push(invalid(format!("{rf}.jwks"), why));
            }
        } else if !rule.jwks_uri.is_empty() {
            if let Err(why) =
                crate::security::request_authentication::JwksUrl::parse(&rule.jwks_uri)
            {
                errs.0.push(invalid(format!("{rf}.jwksUri"), why));
            }
        }
        for (i, h) in rule.from_headers.iter().enumerate() {
            if !is_header_name(&h.name) {
                errs.0.push(invalid(
                    format!("{rf}.fromHeaders[{i}].name"),
                    format!("{:?} is not an HTTP header name", h.name),
                ));
            }
        }
        for (i, p) in rule.from_params.iter().enumerate() {
            if p.is_empty() {
                errs.0.push(ValidationError::Empty {
                    field: format!("{rf}.fromParams[{i}]"),
                });
            }
        }
        for (i, c) in rule.from_cookies.iter().enumerate() {
            if !is_header_name(c) {
                errs.0.push(invalid(
                    format!("{rf}.fromCookies[{i}]"),
                    format!("{c:?} is not a cookie name"),
                ));
            }
        }
        if !rule.output_payload_to_header.is_empty()
            && !is_header_name(&rule.output_payload_to_header)
        {
            errs.0.push(invalid(
                format!("{rf}.outputPayloadToHeader"),
                format!(
                    "{:?} is not an HTTP header name",
                    rule.output_payload_to_header
                ),
            ));
        }
        for (i, c) in rule.output_claim_to_headers.iter().enumerate() {
            if !is_header_name(&c.header) || c.header.starts_with(':') {
                errs.0.push(invalid(
                    format!("{rf}.outputClaimToHeaders[{i}].header"),
                    format!("{:?} is not an HTTP header name", c.header),
                ));
            }
            if c.claim.is_empty() {
                errs.0.push(ValidationError::Empty {
                    field: format!("{rf}.outputClaimToHeaders[{i}].claim"),
                });
            }
        }
        if let Some(t) = &rule.timeout {
            if t.get().is_zero() || t.get() > std::time::Duration::from_secs(60) {
                errs.0.push(invalid(
                    format!("{rf}.timeout"),
                    "must be more than 0s and at most 60s",
                ));
            }
        }
    }
    errs.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::request_authentication::{JwtHeader, JwtRule};

    fn mk_rule(issuer: &str, jwks_uri: &str) -> JwtRule {
        JwtRule {
            issuer: issuer.into(),
            jwks_uri: jwks_uri.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_rule_needs_an_issuer_and_keys() {
        let ok = RequestAuthenticationSpec {
            jwt_rules: vec![mk_rule(
                "https://idp.example.com",
                "https://idp.example.com/keys",
            )],
            ..Default::default()
        };
        assert!(validate_request_authentication(&ok).is_ok());
        let bad = RequestAuthenticationSpec {
            jwt_rules: vec![
                mk_rule("", "https://idp.example.com/keys"),
                mk_rule("https://idp.example.com", "http://a b/"),
                mk_rule("https://idp.example.com", "ftp://idp.example.com/keys"),
                JwtRule {
                    jwks: "{not json".into(),
                    from_headers: vec![JwtHeader {
                        name: "bad header".into(),
                        prefix: String::new(),
                    }],
                    ..mk_rule("https://idp.example.com", "")
                },
            ],
            ..Default::default()
        };
        let text = validate_request_authentication(&bad)
            .expect_err("refused")
            .to_string();
        for needle in [
            "spec.jwtRules[0].issuer",
            "spec.jwtRules[1].jwksUri",
            "spec.jwtRules[2].jwksUri",
            "spec.jwtRules[3].jwks",
            "spec.jwtRules[3].fromHeaders[0].name",
        ] {
            assert!(text.contains(needle), "{needle:?} in {text}");
        }
    }
}
