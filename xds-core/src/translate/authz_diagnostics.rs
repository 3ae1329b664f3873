//! The verdict on the tenant's AuthorizationPolicies for their `Accepted` condition: what the
//! admission webhook would have refused (a policy written while it was down, or from a
//! directory source), and rules that can never match in meshplane.

use meshplane_crds::security::authorization::{AuthorizationAction, AuthorizationPolicy};
use meshplane_crds::validation::authorization::{
    foreign_references, is_jwt_key, validate_authorization_policy,
};

use super::finding::Finding;
use super::registry::Registry;

/// The findings on one policy of `registry` (empty: it applies as written). `in_tenant` says
/// whether a namespace belongs to the tenant.
pub fn authorization_policy(
    registry: &Registry,
    policy: &AuthorizationPolicy,
    in_tenant: &dyn Fn(&str) -> bool,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    if policy.spec.action == AuthorizationAction::Custom {
        findings.push(Finding {
            reason: "Unsupported",
            message: "action CUSTOM is not supported: the selected workloads deny every request until the policy is changed or deleted".into(),
        });
    }
    if let Err(errors) = validate_authorization_policy(&policy.spec) {
        for e in errors.0 {
            if policy.spec.action == AuthorizationAction::Custom && e.field() == "spec.action" {
                continue;
            }
            findings.push(Finding {
                reason: "Invalid",
                message: format!(
                    "{e}; until it is fixed the policy denies every request of the workloads it selects"
                ),
            });
        }
    }
    for r in foreign_references(&policy.spec, Some(registry.trust_domain()), in_tenant) {
        findings.push(Finding {
            reason: "NeverAuthenticates",
            message: r.to_string(),
        });
    }
    for (i, rule) in policy.spec.rules.iter().enumerate() {
        let jwt = rule.from.iter().any(|f| {
            !f.source.request_principals.is_empty() || !f.source.not_request_principals.is_empty()
        }) || rule.when.iter().any(|c| is_jwt_key(&c.key));
        if jwt {
            let effect = if policy.spec.action == AuthorizationAction::Deny {
                "always matches (denies)"
            } else {
                "never matches"
            };
            findings.push(Finding {
                reason: "JwtNotValidated",
                message: format!(
                    "spec.rules[{i}]: requestPrincipals and request.auth.* need a validated JWT, which meshplane does not provide; the rule {effect}"
                ),
            });
        }
    }
    findings
}
