//! `AuthorizationPolicy`: who may call the selected workloads, and what (Istio's
//! `security.istio.io/v1` AuthorizationPolicy, field for field where supported).
//!
//! Which policies apply to a workload is decided here ([`applicable_policies`]); what they
//! mean for one inbound connection or request is the instance's translation
//! (`xds-core/src/translate/authz.rs`, docs/authorization.md).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::LabelsSelector;
use crate::networking::status::ConfigStatus;

/// What a policy does with the requests its rules match.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuthorizationAction {
    /// Requests matching a rule are allowed; once a workload has an ALLOW policy, requests
    /// that match none of its ALLOW policies are denied.
    #[default]
    Allow,
    /// Requests matching a rule are denied, whatever the ALLOW policies say.
    Deny,
    /// Requests matching a rule are marked for auditing (access log); nothing is denied.
    Audit,
    /// Requests matching a rule are sent to the external authorizer named by `provider.name`
    /// (an extension provider of the tenant's `meshConfig`), which allows or denies them.
    /// Evaluated before DENY and ALLOW.
    Custom,
}

impl AuthorizationAction {
    /// The action's spelling in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthorizationAction::Allow => "ALLOW",
            AuthorizationAction::Deny => "DENY",
            AuthorizationAction::Audit => "AUDIT",
            AuthorizationAction::Custom => "CUSTOM",
        }
    }
}

/// Why a CUSTOM policy without a provider is refused (the CEL rule and the webhook say it).
pub const CUSTOM_NEEDS_PROVIDER: &str = "action CUSTOM needs provider.name: an extension provider (envoyExtAuthzHttp or envoyExtAuthzGrpc) of the tenant's spec.meshConfig.extensionProviders";

/// Why a provider without action CUSTOM is refused.
pub const PROVIDER_NEEDS_CUSTOM: &str = "provider is used only with action CUSTOM";

/// The annotation that makes a policy dry-run: evaluated and logged, never enforced.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// meshplane's spelling of [`DRY_RUN_ANNOTATION`], honoured too.
pub const MESHPLANE_DRY_RUN_ANNOTATION: &str = "meshplane.io/dry-run";

/// Whether a policy is dry-run ([`DRY_RUN_ANNOTATION`] or [`MESHPLANE_DRY_RUN_ANNOTATION`]
/// set to `true`).
pub fn is_dry_run(policy: &AuthorizationPolicy) -> bool {
    policy.metadata.annotations.as_ref().is_some_and(|a| {
        [DRY_RUN_ANNOTATION, MESHPLANE_DRY_RUN_ANNOTATION]
            .iter()
            .any(|k| a.get(*k).is_some_and(|v| v.eq_ignore_ascii_case("true")))
    })
}

/// Why `targetRef`/`targetRefs` are refused.
pub const TARGET_REF_UNSUPPORTED: &str = "targetRef and targetRefs are not supported by meshplane sidecars; select workloads with spec.selector.matchLabels";

/// The external authorizer of an `action: CUSTOM` policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionProvider {
    /// Name of an `envoyExtAuthzHttp` or `envoyExtAuthzGrpc` provider of the tenant's
    /// `spec.meshConfig.extensionProviders`.
    #[serde(default)]
    pub name: String,
}

/// A reference to a resource a policy attaches to (Istio's `targetRef`), kept so that the
/// schema can refuse it with a clear message instead of pruning it silently.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTargetReference {
    /// API group of the target (refused).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// Kind of the target (refused).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Name of the target (refused).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Namespace of the target (refused).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// Who may call the selected workloads (or the whole namespace, or the whole tenant from the
/// control namespace), and what.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "security.meshplane.io",
    version = "v1alpha1",
    kind = "AuthorizationPolicy",
    doc = "Who may call the selected workloads, and what: ALLOW, DENY, AUDIT and CUSTOM (external authorizer) rules on peer identity, namespace, address, host, port, method, path and headers (Istio-compatible).",
    namespaced,
    shortname = "ap",
    status = "ConfigStatus",
    printcolumn = r#"{"name":"Action","type":"string","jsonPath":".spec.action"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.action) || self.action != 'CUSTOM' || (has(self.provider) && has(self.provider.name) && size(self.provider.name) > 0)", "message": "action CUSTOM needs provider.name: an extension provider (envoyExtAuthzHttp or envoyExtAuthzGrpc) of the tenant's spec.meshConfig.extensionProviders"},
    {"rule": "!has(self.provider) || (has(self.action) && self.action == 'CUSTOM')", "message": "provider is used only with action CUSTOM"},
    {"rule": "!has(self.targetRef) && !has(self.targetRefs)", "message": "targetRef and targetRefs are not supported by meshplane sidecars; select workloads with spec.selector.matchLabels"}
]))]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    /// Workloads of the namespace this policy applies to; absent: every workload of the
    /// namespace. In the control namespace: absent means every workload of the tenant, and a
    /// selector selects matching workloads in every namespace of the tenant (as in Istio's
    /// root namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelsSelector>,
    /// Not supported (refused): Istio's attachment to a Gateway or Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    /// Not supported (refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<PolicyTargetReference>,
    /// `ALLOW` (default), `DENY`, `AUDIT` or `CUSTOM` (an external authorizer decides the
    /// requests the rules match).
    #[serde(default)]
    pub action: AuthorizationAction,
    /// The external authorizer of a CUSTOM policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ExtensionProvider>,
    /// The rules; a request matches the policy when it matches any rule. No rules: an ALLOW
    /// policy matches nothing (so it denies every request), a DENY or AUDIT policy matches
    /// nothing. A rule `{}` matches every request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 512))]
    pub rules: Vec<AuthorizationRule>,
}

/// One rule: a request matches when it matches `from`, `to` and every `when` condition.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationRule {
    /// Sources; any one matching is enough. Empty: any source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<RuleFrom>,
    /// Operations; any one matching is enough. Empty: any operation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<RuleTo>,
    /// Further conditions, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Condition>,
}

/// A source of a rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleFrom {
    /// The peer's attributes.
    #[serde(default)]
    pub source: Source,
}

/// The peer's attributes; every field given must match (values of one field: any of them).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// Peer identities from its mutual TLS certificate, `<trust domain>/ns/<ns>/sa/<sa>`;
    /// `*` (any authenticated peer), `prefix*` and `*suffix` match as in Istio.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<String>,
    /// Identities that must not match (same forms as `principals`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<String>,
    /// End-user principals `iss/sub` of the token a RequestAuthentication validated (`*`: any
    /// validated token; `prefix*`, `*suffix`). A request without one matches none (HTTP only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_principals: Vec<String>,
    /// End-user principals that must not match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_request_principals: Vec<String>,
    /// Namespaces of the peer, from its mutual TLS identity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Namespaces the peer must not be in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<String>,
    /// The peer's address (the connection's source), IPs or CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_blocks: Vec<String>,
    /// Peer addresses that must not match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ip_blocks: Vec<String>,
    /// The original client's address (`X-Forwarded-For`, as trusted by the proxy), IPs or
    /// CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_ip_blocks: Vec<String>,
    /// Original client addresses that must not match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_remote_ip_blocks: Vec<String>,
}

/// An operation of a rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleTo {
    /// The request's attributes.
    #[serde(default)]
    pub operation: Operation,
}

/// The request's attributes; every field given must match. `hosts`, `methods` and `paths`
/// exist only for HTTP: on a TCP port an ALLOW rule using them never matches, and a DENY rule
/// matches without them (both fail closed).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// `Host` header values (case-insensitive; `*`, `prefix*`, `*suffix`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// `Host` values that must not match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_hosts: Vec<String>,
    /// Workload ports (the port the application listens on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self.all(p, p.matches('^[0-9]+$') && int(p) >= 1 && int(p) <= 65535)", "message": "ports must be port numbers (1-65535)"}]))]
    pub ports: Vec<String>,
    /// Workload ports that must not match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self.all(p, p.matches('^[0-9]+$') && int(p) >= 1 && int(p) <= 65535)", "message": "notPorts must be port numbers (1-65535)"}]))]
    pub not_ports: Vec<String>,
    /// HTTP methods (`GET`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// HTTP methods that must not match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_methods: Vec<String>,
    /// Request paths without the query (`*`, `prefix*`, `*suffix`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Paths that must not match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_paths: Vec<String>,
}

/// A condition on one attribute of the request (Istio's `when`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The attribute: `source.ip`, `remote.ip`, `source.namespace`, `source.principal`,
    /// `request.headers[<name>]`, `destination.ip`, `destination.port`, `connection.sni`, or
    /// from the validated token `request.auth.principal`, `request.auth.audiences`,
    /// `request.auth.presenter`, `request.auth.claims[<name>]` (nested: `[<name>][<name>]`).
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self in ['source.ip', 'remote.ip', 'source.namespace', 'source.principal', 'destination.ip', 'destination.port', 'connection.sni', 'request.auth.principal', 'request.auth.audiences', 'request.auth.presenter'] || (self.startsWith('request.headers[') && self.endsWith(']') && size(self) > 17) || (self.startsWith('request.auth.claims[') && self.endsWith(']'))", "message": "unsupported key: use source.ip, remote.ip, source.namespace, source.principal, request.headers[<name>], destination.ip, destination.port, connection.sni or request.auth.*"}]))]
    pub key: String,
    /// Values, any of which matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// Values none of which may match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_values: Vec<String>,
}

/// The policies that apply to a workload with `labels` in `namespace`, in a stable order
/// (namespace, then name): those of its own namespace without a selector or with a matching
/// one, and those of the control namespace (tenant-wide) likewise. Unlike PeerAuthentication,
/// authorization policies do not override each other: every applicable policy counts.
pub fn applicable_policies<'a>(
    policies: impl IntoIterator<Item = &'a AuthorizationPolicy>,
    control_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a AuthorizationPolicy> {
    super::in_workload_scope(
        policies,
        |p| &p.spec.selector,
        control_namespace,
        namespace,
        labels,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_policy(ns: &str, name: &str, selector: &[(&str, &str)]) -> AuthorizationPolicy {
        let mut p = AuthorizationPolicy::new(
            name,
            AuthorizationPolicySpec {
                selector: (!selector.is_empty()).then(|| LabelsSelector {
                    match_labels: selector
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                }),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some(ns.into());
        p
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const ROOT: &str = "meshplane-blue";

    #[test]
    fn namespace_selector_and_tenant_wide_policies_all_apply() {
        let policies = [
            mk_policy(ROOT, "mesh", &[]),
            mk_policy(ROOT, "mesh-web", &[("app", "web")]),
            mk_policy("shop", "ns", &[]),
            mk_policy("shop", "web", &[("app", "web")]),
            mk_policy("shop", "db", &[("app", "db")]),
            mk_policy("bank", "other", &[]),
        ];
        let names = |ns: &str, l: &[(&str, &str)]| -> Vec<String> {
            applicable_policies(&policies, ROOT, ns, &labels(l))
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect()
        };
        assert_eq!(
            names("shop", &[("app", "web")]),
            ["mesh", "mesh-web", "ns", "web"]
        );
        assert_eq!(names("shop", &[("app", "cart")]), ["mesh", "ns"]);
        assert_eq!(
            names("bank", &[("app", "web")]),
            ["other", "mesh", "mesh-web"]
        );
        assert_eq!(names("pay", &[]), ["mesh"]);
    }

    #[test]
    fn manifests_use_istio_field_names() {
        let p: AuthorizationPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "security.meshplane.io/v1alpha1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "action": "DENY",
                "rules": [{
                    "from": [{"source": {"principals": ["cluster.local/ns/shop/sa/cart"],
                                         "notNamespaces": ["bank"], "ipBlocks": ["198.18.0.0/16"],
                                         "remoteIpBlocks": ["198.19.0.0/16"]}}],
                    "to": [{"operation": {"methods": ["GET"], "notPaths": ["/health*"], "ports": ["8080"]}}],
                    "when": [{"key": "request.headers[x-tenant]", "values": ["a"], "notValues": ["b"]}]
                }]
            }
        }))
        .expect("parses");
        assert_eq!(p.spec.action, AuthorizationAction::Deny);
        let rule = &p.spec.rules[0];
        assert_eq!(rule.from[0].source.not_namespaces, ["bank"]);
        assert_eq!(rule.from[0].source.remote_ip_blocks, ["198.19.0.0/16"]);
        assert_eq!(rule.to[0].operation.not_paths, ["/health*"]);
        assert_eq!(rule.when[0].not_values, ["b"]);
        let empty: AuthorizationPolicySpec =
            serde_json::from_value(serde_json::json!({})).expect("parses");
        assert_eq!(empty.action, AuthorizationAction::Allow);
        assert!(empty.rules.is_empty());
    }
}
