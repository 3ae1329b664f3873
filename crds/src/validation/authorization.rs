//! Semantic rules of `AuthorizationPolicy` that the schema cannot express. Which trust domain
//! and namespaces a rule may name is the tenant's business: the validating webhook checks it
//! ([`principal_parts`] tells it what a principal names).

use super::{
    validate_ip_or_cidr, validate_label_key, validate_label_value, ValidationError,
    ValidationErrors,
};
use crate::security::authorization::{
    AuthorizationAction, AuthorizationPolicySpec, Condition, CUSTOM_NEEDS_PROVIDER,
    PROVIDER_NEEDS_CUSTOM, TARGET_REF_UNSUPPORTED,
};

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ValidationError {
    ValidationError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The `when` keys meshplane evaluates, besides `request.headers[<name>]` and the JWT keys.
pub const CONDITION_KEYS: &[&str] = &[
    "source.ip",
    "remote.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
    "connection.sni",
];

/// Whether `key` is a JWT attribute (`request.auth.*`): it holds what a token validated by a
/// RequestAuthentication says.
pub fn is_jwt_key(key: &str) -> bool {
    matches!(
        key,
        "request.auth.principal" | "request.auth.audiences" | "request.auth.presenter"
    ) || (key.starts_with("request.auth.claims[") && key.ends_with(']'))
}

/// The claim path of a `request.auth.claims[<name>]` key: one name, or several for a nested
/// claim (`request.auth.claims[realm][role]`). `None` when the key is not of that form or a
/// name is empty or holds a bracket.
pub fn claim_path(key: &str) -> Option<Vec<&str>> {
    let rest = key
        .strip_prefix("request.auth.claims[")?
        .strip_suffix(']')?;
    let names: Vec<&str> = rest.split("][").collect();
    names
        .iter()
        .all(|n| !n.is_empty() && !n.contains('[') && !n.contains(']'))
        .then_some(names)
}

/// The header name of a `request.headers[<name>]` key.
pub fn header_key(key: &str) -> Option<&str> {
    key.strip_prefix("request.headers[")
        .and_then(|k| k.strip_suffix(']'))
        .filter(|k| !k.is_empty())
}

/// A string match value: exact, `*` (any non-empty), `prefix*` or `*suffix`; one `*` at most,
/// at an end.
fn check_glob(value: &str, field: &str, errs: &mut ValidationErrors) {
    if value.is_empty() {
        errs.0.push(ValidationError::Empty {
            field: field.into(),
        });
        return;
    }
    let stars = value.matches('*').count();
    let at_end = value.starts_with('*') || value.ends_with('*');
    if stars > 1 || (stars == 1 && !at_end) {
        errs.0.push(invalid(
            field,
            format!("{value:?}: '*' may appear once, at the start or the end (\"*\", \"prefix*\", \"*suffix\")"),
        ));
    }
}

fn check_globs(values: &[String], field: &str, errs: &mut ValidationErrors) {
    for (i, v) in values.iter().enumerate() {
        check_glob(v, &format!("{field}[{i}]"), errs);
    }
}

fn check_cidrs(values: &[String], field: &str, errs: &mut ValidationErrors) {
    for (i, v) in values.iter().enumerate() {
        errs.check(validate_ip_or_cidr(v, &format!("{field}[{i}]")));
    }
}

fn check_ports(values: &[String], field: &str, errs: &mut ValidationErrors) {
    for (i, v) in values.iter().enumerate() {
        if !v.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p)) {
            errs.0.push(ValidationError::InvalidPort {
                field: format!("{field}[{i}]"),
                reason: format!("{v:?} is not a port number (1-65535)"),
            });
        }
    }
}

fn check_condition(c: &Condition, field: &str, errs: &mut ValidationErrors) {
    if c.values.is_empty() && c.not_values.is_empty() {
        errs.0
            .push(invalid(field, "a condition needs values or notValues"));
    }
    let values = |suffix: &str| format!("{field}.{suffix}");
    match c.key.as_str() {
        "source.ip" | "remote.ip" | "destination.ip" => {
            check_cidrs(&c.values, &values("values"), errs);
            check_cidrs(&c.not_values, &values("notValues"), errs);
        }
        "destination.port" => {
            check_ports(&c.values, &values("values"), errs);
            check_ports(&c.not_values, &values("notValues"), errs);
        }
        "source.namespace" | "source.principal" | "connection.sni" => {
            check_globs(&c.values, &values("values"), errs);
            check_globs(&c.not_values, &values("notValues"), errs);
        }
        key if header_key(key).is_some() => {
            check_globs(&c.values, &values("values"), errs);
            check_globs(&c.not_values, &values("notValues"), errs);
        }
        key if is_jwt_key(key) => {
            if key.starts_with("request.auth.claims[") && claim_path(key).is_none() {
                errs.0.push(invalid(
                    format!("{field}.key"),
                    format!("{key:?}: write request.auth.claims[<name>] or, for a nested claim, request.auth.claims[<name>][<name>]"),
                ));
            }
            check_globs(&c.values, &values("values"), errs);
            check_globs(&c.not_values, &values("notValues"), errs);
        }
        key => errs.0.push(invalid(
            format!("{field}.key"),
            format!(
                "unsupported key {key:?}: use {}, request.headers[<name>] or request.auth.*",
                CONDITION_KEYS.join(", ")
            ),
        )),
    }
}

/// Validates an AuthorizationPolicy spec.
pub fn validate_authorization_policy(
    spec: &AuthorizationPolicySpec,
) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    let custom = spec.action == AuthorizationAction::Custom;
    let provider = spec.provider.as_ref().map(|p| p.name.as_str());
    if custom && provider.is_none_or(str::is_empty) {
        errs.0
            .push(invalid("spec.provider.name", CUSTOM_NEEDS_PROVIDER));
    }
    if !custom && provider.is_some() {
        errs.0.push(invalid("spec.provider", PROVIDER_NEEDS_CUSTOM));
    }
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
    for (r, rule) in spec.rules.iter().enumerate() {
        let rf = format!("spec.rules[{r}]");
        for (f, from) in rule.from.iter().enumerate() {
            let s = &from.source;
            let sf = format!("{rf}.from[{f}].source");
            check_globs(&s.principals, &format!("{sf}.principals"), &mut errs);
            check_globs(&s.not_principals, &format!("{sf}.notPrincipals"), &mut errs);
            check_globs(
                &s.request_principals,
                &format!("{sf}.requestPrincipals"),
                &mut errs,
            );
            check_globs(
                &s.not_request_principals,
                &format!("{sf}.notRequestPrincipals"),
                &mut errs,
            );
            check_globs(&s.namespaces, &format!("{sf}.namespaces"), &mut errs);
            check_globs(&s.not_namespaces, &format!("{sf}.notNamespaces"), &mut errs);
            check_cidrs(&s.ip_blocks, &format!("{sf}.ipBlocks"), &mut errs);
            check_cidrs(&s.not_ip_blocks, &format!("{sf}.notIpBlocks"), &mut errs);
            check_cidrs(
                &s.remote_ip_blocks,
                &format!("{sf}.remoteIpBlocks"),
                &mut errs,
            );
            check_cidrs(
                &s.not_remote_ip_blocks,
                &format!("{sf}.notRemoteIpBlocks"),
                &mut errs,
            );
            if *s == Default::default() {
                errs.0
                    .push(invalid(sf, "a source needs at least one field"));
            }
        }
        for (t, to) in rule.to.iter().enumerate() {
            let o = &to.operation;
            let of = format!("{rf}.to[{t}].operation");
            check_globs(&o.hosts, &format!("{of}.hosts"), &mut errs);
            check_globs(&o.not_hosts, &format!("{of}.notHosts"), &mut errs);
            check_ports(&o.ports, &format!("{of}.ports"), &mut errs);
            check_ports(&o.not_ports, &format!("{of}.notPorts"), &mut errs);
            check_globs(&o.paths, &format!("{of}.paths"), &mut errs);
            check_globs(&o.not_paths, &format!("{of}.notPaths"), &mut errs);
            for (i, m) in o.methods.iter().chain(&o.not_methods).enumerate() {
                if m.is_empty()
                    || !m
                        .bytes()
                        .all(|b| b.is_ascii_alphabetic() || b == b'-' || b == b'_')
                {
                    errs.0.push(invalid(
                        format!("{of}.methods[{i}]"),
                        format!("{m:?} is not an HTTP method"),
                    ));
                }
            }
            if *o == Default::default() {
                errs.0
                    .push(invalid(of, "an operation needs at least one field"));
            }
        }
        for (w, c) in rule.when.iter().enumerate() {
            check_condition(c, &format!("{rf}.when[{w}]"), &mut errs);
        }
    }
    errs.into_result()
}

/// What a principal value names, as far as it can be read without matching: its trust domain
/// and its namespace when the value spells them out (`td/ns/<ns>/sa/<sa>`, or a `prefix*`
/// long enough to hold them). `*suffix` forms name neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrincipalParts<'a> {
    pub trust_domain: Option<&'a str>,
    pub namespace: Option<&'a str>,
}

/// Reads a principal value (see [`PrincipalParts`]).
pub fn principal_parts(value: &str) -> PrincipalParts<'_> {
    if value.starts_with('*') {
        return PrincipalParts {
            trust_domain: None,
            namespace: None,
        };
    }
    let literal = value.strip_suffix('*');
    let text = literal.unwrap_or(value);
    let mut parts = text.splitn(4, '/');
    let td = parts.next();
    // The trust domain is complete when a '/' follows it (or the value is exact).
    let td_complete = text.contains('/') || literal.is_none();
    let trust_domain = td.filter(|_| td_complete);
    let namespace = match (parts.next(), parts.next(), parts.next()) {
        (Some("ns"), Some(ns), Some(_)) if !ns.is_empty() => Some(ns),
        (Some("ns"), Some(ns), None) if literal.is_none() && !ns.is_empty() => Some(ns),
        _ => None,
    };
    PrincipalParts {
        trust_domain,
        namespace,
    }
}

/// A principal or namespace of a policy that no workload of the tenant can ever have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForeignReference {
    /// A principal under another trust domain than the tenant's.
    TrustDomain {
        field: String,
        value: String,
        trust_domain: String,
    },
    /// A principal or namespace naming a namespace outside the tenant.
    Namespace {
        field: String,
        value: String,
        namespace: String,
    },
}

impl ForeignReference {
    /// The field the reference is in.
    pub fn field(&self) -> &str {
        match self {
            ForeignReference::TrustDomain { field, .. }
            | ForeignReference::Namespace { field, .. } => field,
        }
    }
}

impl std::fmt::Display for ForeignReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForeignReference::TrustDomain {
                field,
                value,
                trust_domain,
            } => write!(
                f,
                "{field}: {value:?} names trust domain {trust_domain:?}, not the tenant's: no peer with that identity could ever authenticate to the tenant's workloads"
            ),
            ForeignReference::Namespace {
                field,
                value,
                namespace,
            } => write!(
                f,
                "{field}: {value:?} names namespace {namespace:?}, which is not a namespace of the tenant: no peer from it could ever authenticate to the tenant's workloads"
            ),
        }
    }
}

/// Every principal and namespace of `spec` (in `from`, `not*` forms and `when`) that names
/// another trust domain than `trust_domain` (when known) or a namespace for which `in_tenant`
/// is false. Glob values are checked as far as they spell a trust domain or namespace out.
pub fn foreign_references(
    spec: &AuthorizationPolicySpec,
    trust_domain: Option<&str>,
    in_tenant: &dyn Fn(&str) -> bool,
) -> Vec<ForeignReference> {
    let mut out = Vec::new();
    let principal = |value: &str, field: String, out: &mut Vec<ForeignReference>| {
        let parts = principal_parts(value);
        if let (Some(td), Some(tenant_td)) = (parts.trust_domain, trust_domain) {
            if td != tenant_td {
                out.push(ForeignReference::TrustDomain {
                    field,
                    value: value.into(),
                    trust_domain: td.into(),
                });
                return;
            }
        }
        if let Some(ns) = parts.namespace {
            if !in_tenant(ns) {
                out.push(ForeignReference::Namespace {
                    field,
                    value: value.into(),
                    namespace: ns.into(),
                });
            }
        }
    };
    let namespace = |value: &str, field: String, out: &mut Vec<ForeignReference>| {
        if !value.contains('*') && !in_tenant(value) {
            out.push(ForeignReference::Namespace {
                field,
                value: value.into(),
                namespace: value.into(),
            });
        }
    };
    for (r, rule) in spec.rules.iter().enumerate() {
        for (f, from) in rule.from.iter().enumerate() {
            let s = &from.source;
            let sf = format!("spec.rules[{r}].from[{f}].source");
            for (name, values) in [
                ("principals", &s.principals),
                ("notPrincipals", &s.not_principals),
            ] {
                for (i, v) in values.iter().enumerate() {
                    principal(v, format!("{sf}.{name}[{i}]"), &mut out);
                }
            }
            for (name, values) in [
                ("namespaces", &s.namespaces),
                ("notNamespaces", &s.not_namespaces),
            ] {
                for (i, v) in values.iter().enumerate() {
                    namespace(v, format!("{sf}.{name}[{i}]"), &mut out);
                }
            }
        }
        for (w, c) in rule.when.iter().enumerate() {
            let cf = format!("spec.rules[{r}].when[{w}]");
            for (name, values) in [("values", &c.values), ("notValues", &c.not_values)] {
                for (i, v) in values.iter().enumerate() {
                    match c.key.as_str() {
                        "source.principal" => principal(v, format!("{cf}.{name}[{i}]"), &mut out),
                        "source.namespace" => namespace(v, format!("{cf}.{name}[{i}]"), &mut out),
                        _ => {}
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> AuthorizationPolicySpec {
        serde_json::from_value(v).expect("spec decodes")
    }

    fn errors(v: serde_json::Value) -> Vec<String> {
        match validate_authorization_policy(&spec(v)) {
            Ok(()) => vec![],
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn valid_policies_pass() {
        assert_eq!(errors(serde_json::json!({})), Vec::<String>::new());
        assert_eq!(
            errors(serde_json::json!({"action": "DENY", "rules": [{
                "from": [{"source": {"principals": ["cluster.local/ns/shop/sa/*"], "ipBlocks": ["198.18.0.0/16"]}}],
                "to": [{"operation": {"methods": ["GET"], "paths": ["/admin*"], "ports": ["8080"]}}],
                "when": [{"key": "request.headers[x-user]", "values": ["*"]},
                         {"key": "destination.port", "notValues": ["9090"]}]
            }]})),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_broken_rule_is_reported_with_its_field() {
        let errs = errors(serde_json::json!({"action": "CUSTOM", "rules": [{
            "from": [{"source": {"principals": ["a*b*"], "ipBlocks": ["198.18.0.0/99"]}}, {"source": {}}],
            "to": [{"operation": {"ports": ["http"], "methods": ["GE T"]}}],
            "when": [{"key": "source.ip", "values": ["nope"]}, {"key": "request.size", "values": ["1"]},
                     {"key": "source.principal"}]
        }]}));
        let joined = errors_text(&errs);
        for needle in [
            "spec.provider.name: action CUSTOM needs provider.name",
            "spec.rules[0].from[0].source.principals[0]",
            "spec.rules[0].from[0].source.ipBlocks[0]",
            "spec.rules[0].from[1].source: a source needs at least one field",
            "spec.rules[0].to[0].operation.ports[0]",
            "spec.rules[0].to[0].operation.methods[0]",
            "spec.rules[0].when[0].values[0]",
            "spec.rules[0].when[1].key: unsupported key \"request.size\"",
            "spec.rules[0].when[2]: a condition needs values or notValues",
        ] {
            assert!(joined.contains(needle), "{needle:?} missing from {joined}");
        }
        assert_eq!(errs.len(), 9, "{joined}");
    }

    fn errors_text(errs: &[String]) -> String {
        errs.join("\n")
    }

    #[test]
    fn references_outside_the_tenant_are_found_in_every_form() {
        let policy = spec(serde_json::json!({"rules": [{
            "from": [{"source": {
                "principals": ["blue.example/ns/shop/sa/web", "green.example/ns/shop/sa/web",
                               "blue.example/ns/bank/sa/*", "*/sa/web", "blue.example/ns/pay/*"],
                "notNamespaces": ["shop", "bank", "sh*"]}}],
            "when": [{"key": "source.namespace", "values": ["bank"]},
                     {"key": "source.principal", "notValues": ["green.example/ns/shop/sa/x"]}]
        }]}));
        let in_tenant = |ns: &str| ns == "shop" || ns == "pay";
        let found: Vec<String> = foreign_references(&policy, Some("blue.example"), &in_tenant)
            .iter()
            .map(|f| f.field().to_string())
            .collect();
        assert_eq!(
            found,
            [
                "spec.rules[0].from[0].source.principals[1]",
                "spec.rules[0].from[0].source.principals[2]",
                "spec.rules[0].from[0].source.notNamespaces[1]",
                "spec.rules[0].when[0].values[0]",
                "spec.rules[0].when[1].notValues[0]",
            ]
        );
        let text = foreign_references(&policy, Some("blue.example"), &in_tenant)[0].to_string();
        assert!(text.contains("could ever authenticate"), "{text}");
        // Without a known trust domain, only namespaces are checked.
        assert_eq!(foreign_references(&policy, None, &in_tenant).len(), 3);
    }

    #[test]
    fn principal_parts_read_trust_domain_and_namespace() {
        let p = principal_parts;
        assert_eq!(
            p("cluster.local/ns/shop/sa/web"),
            PrincipalParts {
                trust_domain: Some("cluster.local"),
                namespace: Some("shop")
            }
        );
        assert_eq!(
            p("blue.example/ns/shop/*"),
            PrincipalParts {
                trust_domain: Some("blue.example"),
                namespace: Some("shop")
            }
        );
        assert_eq!(
            p("blue.example/ns/sh*"),
            PrincipalParts {
                trust_domain: Some("blue.example"),
                namespace: None
            }
        );
        assert_eq!(
            p("blue*"),
            PrincipalParts {
                trust_domain: None,
                namespace: None
            }
        );
        assert_eq!(
            p("*/ns/shop/sa/web"),
            PrincipalParts {
                trust_domain: None,
                namespace: None
            }
        );
        assert_eq!(
            p("*"),
            PrincipalParts {
                trust_domain: None,
                namespace: None
            }
        );
    }
}
