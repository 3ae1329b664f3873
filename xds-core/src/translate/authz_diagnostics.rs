//! The verdict on the tenant's AuthorizationPolicies for their `Accepted` condition: what the
//! admission webhook would have refused (a policy written while it was down, or from a
//! directory source), and peers that could never authenticate to the tenant.

use meshplane_crds::security::authorization::{
    is_dry_run, AuthorizationAction, AuthorizationPolicy,
};
use meshplane_crds::validation::authorization::{
    foreign_references, validate_authorization_policy,
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
    let dry_run = is_dry_run(policy);
    let valid = validate_authorization_policy(&policy.spec).is_ok();
    if policy.spec.action == AuthorizationAction::Custom && valid {
        let name = policy
            .spec
            .provider
            .as_ref()
            .map(|p| p.name.as_str())
            .unwrap_or_default();
        if dry_run {
            findings.push(Finding {
                reason: "DryRunUnsupported",
                message: "a dry-run CUSTOM policy is not applied: its authorizer is never called and nothing is logged".into(),
            });
        } else if let Err(why) = super::ext_authz::resolve(registry, name) {
            findings.push(Finding {
                reason: "ProviderUnavailable",
                message: format!(
                    "{why}; until it is, the workloads the policy selects deny every request"
                ),
            });
        }
    }
    if let Err(errors) = validate_authorization_policy(&policy.spec) {
        let effect = if dry_run {
            "the dry-run policy is not evaluated"
        } else {
            "the policy denies every request of the workloads it selects"
        };
        for e in errors.0 {
            findings.push(Finding {
                reason: "Invalid",
                message: format!("{e}; until it is fixed {effect}"),
            });
        }
    }
    for r in foreign_references(&policy.spec, Some(registry.trust_domain()), in_tenant) {
        findings.push(Finding {
            reason: "NeverAuthenticates",
            message: r.to_string(),
        });
    }
    findings
}

/// The findings on one RequestAuthentication (empty: it applies as written): what the
/// admission webhook would have refused. Such a one gives its workloads no provider, so tokens
/// of its issuers are refused.
pub fn request_authentication(ra: &meshplane_crds::RequestAuthentication) -> Vec<Finding> {
    match meshplane_crds::validation::validate_request_authentication(&ra.spec) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .0
            .into_iter()
            .map(|e| Finding {
                reason: "Invalid",
                message: format!(
                    "{e}; until it is fixed its rules are not applied and tokens of its issuers are refused"
                ),
            })
            .collect(),
    }
}
