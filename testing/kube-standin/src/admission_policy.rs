//! ValidatingAdmissionPolicy (`admissionregistration.k8s.io/v1`): the in-process CEL policies
//! of the validating phase, evaluated with kube's CEL engine.
//!
//! Like the real API server: a policy takes part only through a binding that names it; a
//! request is checked by every (policy, binding) pair whose `matchConstraints` and the
//! binding's `matchResources` (resource rules, exclusions, namespace and object selectors)
//! take it and whose `matchConditions` all hold; a validation that is false refuses the
//! request when the binding's `validationActions` include `Deny`, answered as
//! `ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>`
//! with the code of the validation's `reason` (422 `Invalid` by default). An expression that
//! fails to compile or evaluate follows the policy's `failurePolicy` (default `Fail`).
//! The variables are `object`, `oldObject`, `request` and `namespaceObject`.
//!
//! Not implemented: `paramKind`/`paramRef` (a policy with parameters fails, under its failure
//! policy), `variables`, `auditAnnotations`, `authorizer`, the `Warn` and `Audit` actions
//! (they never refuse, as in the real API, but no warning header is sent).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, RuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use kube::core::cel::cel::{Context, Program, Value as CelValue};
use kube::core::cel::KubeCelExt;
use serde_json::{json, Value};

use super::admission::{rule_matches, AdmissionDenied, AdmissionInput};
use super::lookup::{label_selector_matches, object_labels, ObjectLookup};

const ADMISSION_REGISTRATION: &str = "admissionregistration.k8s.io/v1";

/// Checks `req` against every bound policy; Err with the first refusal.
pub fn check(
    lookup: &dyn ObjectLookup,
    req: &AdmissionInput,
    namespace_labels: &Option<BTreeMap<String, String>>,
) -> Result<(), AdmissionDenied> {
    let mut bindings: Vec<ValidatingAdmissionPolicyBinding> = lookup
        .list(
            ADMISSION_REGISTRATION,
            "ValidatingAdmissionPolicyBinding",
            None,
        )
        .into_iter()
        .filter_map(|b| serde_json::from_value(b).ok())
        .collect();
    if bindings.is_empty() {
        return Ok(());
    }
    bindings.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    // Built once, and only when a policy takes the request.
    let variables = std::cell::OnceCell::new();
    let variables = || variables.get_or_init(|| Variables::of(lookup, req));
    for binding in bindings {
        let spec = &binding.spec;
        let policy_name = spec.policy_name.as_str();
        let Some(policy) = lookup
            .get(
                ADMISSION_REGISTRATION,
                "ValidatingAdmissionPolicy",
                None,
                policy_name,
            )
            .and_then(|p| serde_json::from_value::<ValidatingAdmissionPolicy>(p).ok())
        else {
            continue;
        };
        let Some(policy_spec) = policy.spec.as_ref() else {
            continue;
        };
        let constraints_take = policy_spec
            .match_constraints
            .as_ref()
            .is_some_and(|m| resources_match(m, req, namespace_labels));
        let binding_takes = spec
            .match_resources
            .as_ref()
            .is_none_or(|m| resources_match(m, req, namespace_labels));
        if !constraints_take || !binding_takes {
            continue;
        }
        let deny = spec.validation_actions.iter().any(|a| a == "Deny");
        let fail_closed = policy_spec.failure_policy.as_deref() != Some("Ignore");
        let binding_name = binding.metadata.name.as_deref().unwrap_or_default();
        let refuse = |message: String, code: u16| denied(policy_name, binding_name, message, code);
        if policy_spec.param_kind.is_some() {
            if fail_closed && deny {
                return Err(refuse("policy parameters are not supported".into(), 500));
            }
            continue;
        }
        let mut matched = true;
        for condition in policy_spec.match_conditions.iter().flatten() {
            match variables().eval(&condition.expression) {
                Ok(true) => {}
                Ok(false) => matched = false,
                Err(error) if fail_closed && deny => return Err(refuse(error, 500)),
                Err(_) => matched = false,
            }
        }
        if !matched || !deny {
            continue;
        }
        for validation in policy_spec.validations.iter().flatten() {
            let message = match variables().eval(&validation.expression) {
                Ok(true) => continue,
                Err(_) if !fail_closed => continue,
                Err(error) => error,
                Ok(false) => validation
                    .message_expression
                    .as_deref()
                    .and_then(|e| variables().eval_string(e))
                    .or_else(|| validation.message.clone())
                    .unwrap_or_else(|| format!("failed expression: {}", validation.expression)),
            };
            return Err(refuse(message, reason_code(validation.reason.as_deref())));
        }
    }
    Ok(())
}

/// A refusal worded as the real API words it.
fn denied(policy: &str, binding: &str, message: String, code: u16) -> AdmissionDenied {
    AdmissionDenied {
        code,
        message: format!(
            "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"
        ),
    }
}

/// The HTTP code of a validation's `reason`.
fn reason_code(reason: Option<&str>) -> u16 {
    match reason {
        Some("Unauthorized") => 401,
        Some("Forbidden") => 403,
        Some("RequestEntityTooLarge") => 413,
        _ => 422,
    }
}

/// The CEL variables of one request: `object`, `oldObject`, `request`, `namespaceObject`
/// (null where the real API has none), with the Kubernetes CEL libraries.
struct Variables(Context<'static>);

impl Variables {
    fn of(lookup: &dyn ObjectLookup, req: &AdmissionInput) -> Self {
        let (group, version) = req
            .api_version
            .split_once('/')
            .unwrap_or(("", req.api_version.as_str()));
        let mut request = json!({
            "operation": req.operation,
            "name": req.name,
            "namespace": req.namespace.clone().unwrap_or_default(),
            "dryRun": req.dry_run,
            "kind": {"group": group, "version": version, "kind": req.kind},
            "resource": {"group": group, "version": version, "resource": req.resource},
            "userInfo": {"username": req.user.username, "groups": req.user.groups},
        });
        if let Some(sub) = &req.subresource {
            request["subResource"] = json!(sub);
        }
        let namespace = req
            .namespace
            .as_deref()
            .and_then(|ns| lookup.get("v1", "Namespace", None, ns))
            .unwrap_or(Value::Null);
        let mut context = Context::default();
        context.register_all();
        for (name, value) in [
            ("object", req.object.clone().unwrap_or(Value::Null)),
            ("oldObject", req.old_object.clone().unwrap_or(Value::Null)),
            ("request", request),
            ("namespaceObject", namespace),
        ] {
            // Map keys stay as they are (label keys hold dots and slashes); only a CRD
            // schema's property names are escaped in Kubernetes CEL.
            let value = kube::core::cel::cel::to_value(&value).unwrap_or(CelValue::Null);
            context.add_variable_from_value(name, value);
        }
        Variables(context)
    }

    /// A boolean expression; Err says why it did not give one.
    fn eval(&self, expression: &str) -> Result<bool, String> {
        let program = Program::compile(expression)
            .map_err(|e| format!("compilation failed: {expression}: {e}"))?;
        match program.execute(&self.0) {
            Ok(CelValue::Bool(b)) => Ok(b),
            Ok(other) => Err(format!(
                "expression {expression} gave {other:?}, not a bool"
            )),
            Err(e) => Err(format!("expression {expression} failed: {e}")),
        }
    }

    /// A `messageExpression`: a string, or None when it fails (the static message is used).
    fn eval_string(&self, expression: &str) -> Option<String> {
        match Program::compile(expression).ok()?.execute(&self.0) {
            Ok(CelValue::String(s)) => Some(s.to_string()),
            _ => None,
        }
    }
}

/// Whether `m` takes the request: a resource rule matches (with its resourceNames), no
/// exclusion does, and the selectors hold.
fn resources_match(
    m: &MatchResources,
    req: &AdmissionInput,
    namespace_labels: &Option<BTreeMap<String, String>>,
) -> bool {
    let exact = m.match_policy.as_deref() == Some("Exact");
    let named = |rule: &NamedRuleWithOperations| {
        let names_ok = rule
            .resource_names
            .as_ref()
            .is_none_or(|names| names.is_empty() || names.contains(&req.name));
        names_ok && rule_matches(&as_rule(rule), req, exact)
    };
    // No resourceRules: every resource (a binding that narrows only by selector).
    let included = m
        .resource_rules
        .as_ref()
        .is_none_or(|rules| rules.iter().any(named));
    let excluded = m.exclude_resource_rules.iter().flatten().any(named);
    if !included || excluded {
        return false;
    }
    if let (Some(selector), Some(labels)) = (&m.namespace_selector, namespace_labels) {
        if !label_selector_matches(selector, labels).unwrap_or(false) {
            return false;
        }
    }
    if let Some(selector) = &m.object_selector {
        let any = [req.object.as_ref(), req.old_object.as_ref()]
            .into_iter()
            .flatten()
            .any(|o| label_selector_matches(selector, &object_labels(o)).unwrap_or(false));
        if !any {
            return false;
        }
    }
    true
}

fn as_rule(rule: &NamedRuleWithOperations) -> RuleWithOperations {
    RuleWithOperations {
        api_groups: rule.api_groups.clone(),
        api_versions: rule.api_versions.clone(),
        operations: rule.operations.clone(),
        resources: rule.resources.clone(),
        scope: rule.scope.clone(),
    }
}
