//! Authorization on the inbound side of a workload: the AuthorizationPolicies that apply to it
//! ([`meshplane_crds::security::authorization::applicable_policies`]) as Envoy RBAC filters,
//! pure functions over Envoy messages (docs/authorization.md).
//!
//! Istio's evaluation order, one RBAC filter per action, in this order on every inbound chain
//! of a workload with policies:
//! 1. AUDIT: an RBAC filter with action LOG (marks matching requests for the access log,
//!    never denies);
//! 2. DENY: a request matching any rule of any DENY policy is denied;
//! 3. ALLOW: present when at least one ALLOW policy applies; a request matching no rule of any
//!    ALLOW policy is denied (an ALLOW policy without rules allows nothing).
//!
//! No policy: no filter, everything is allowed. HTTP chains get the HTTP filters before the
//! router; TCP chains (and the opaque passthrough-TLS chains) get the network filters before
//! the TCP proxy.
//!
//! End-user identity (`requestPrincipals`, `request.auth.*`) is what the workload's
//! RequestAuthentications validated ([`super::jwt`]): the token's payload in the request's
//! dynamic metadata, matched claim by claim. A request principal `iss/sub` matches when the
//! payload's `iss` and `sub` joined by `/` would; without a validated token nothing matches.
//!
//! What a chain cannot know fails closed. A rule's condition that the chain cannot evaluate
//! (the peer's identity on a chain without mutual TLS; hosts, methods, paths, headers and JWT
//! attributes on a TCP chain) is taken as *not matching*
//! in ALLOW and AUDIT rules and as *matching* in DENY rules. So a plaintext caller never passes
//! an ALLOW rule on principals or namespaces, and never escapes a DENY rule on them.
//!
//! Principals match the SPIFFE URI SAN of the peer's certificate
//! (`authenticated.principal_name`): `td/ns/N/sa/S` is `spiffe://td/ns/N/sa/S`; `*` is any
//! authenticated peer, `prefix*` and `*suffix` match by prefix and suffix. A namespace `N` is the
//! prefix `spiffe://<tenant trust domain>/ns/N/sa/`. Policy names in the filters read
//! `ns[<namespace>]-policy[<name>]-rule[<index>]`, so a denial's response code details say
//! `rbac_access_denied_matched_policy[ns[shop]-policy[deny-admin]-rule[0]]`; denied HTTP
//! requests get that reason in the 403 body too ([`explain_denials`]).

use std::collections::HashMap;

use envoy_types::pb::envoy::config::accesslog::v3::access_log_filter::FilterSpecifier;
use envoy_types::pb::envoy::config::accesslog::v3::comparison_filter::Op;
use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLogFilter, ComparisonFilter, ResponseFlagFilter, StatusCodeFilter,
};
use envoy_types::pb::envoy::config::core::v3::substitution_format_string::Format;
use envoy_types::pb::envoy::config::core::v3::{
    data_source::Specifier as DataSpecifier, CidrRange, DataSource, RuntimeUInt32,
    SubstitutionFormatString,
};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use envoy_types::pb::envoy::config::listener::v3::Filter;
use envoy_types::pb::envoy::config::rbac::v3::permission::{Rule as PermRule, Set as PermSet};
use envoy_types::pb::envoy::config::rbac::v3::principal::{
    Authenticated, Identifier, Set as PrincipalSet,
};
use envoy_types::pb::envoy::config::rbac::v3::rbac::Action as RbacAction;
use envoy_types::pb::envoy::config::rbac::v3::{
    MetadataSource, Permission, Policy, Principal, Rbac, SourcedMetadata,
};
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::HeaderMatcher;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, LocalReplyConfig, ResponseMapper,
};
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::r#type::matcher::v3::path_matcher::Rule as PathRule;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::metadata_matcher::{
    path_segment::Segment, PathSegment,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    list_matcher, value_matcher, ListMatcher, MetadataMatcher, PathMatcher, RegexMatcher,
    StringMatcher, ValueMatcher,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;
use meshplane_crds::security::authorization::{
    is_dry_run, AuthorizationAction, AuthorizationPolicy, AuthorizationRule, Condition,
    Operation, Source,
};
use meshplane_crds::validation::authorization::{
    claim_path, header_key, validate_authorization_policy,
};
use prost::Message;

pub use super::ext_authz::CustomProviders;

/// Name of Envoy's RBAC HTTP filter.
pub const HTTP_RBAC_FILTER: &str = "envoy.filters.http.rbac";
/// Name of Envoy's RBAC network filter.
pub const NETWORK_RBAC_FILTER: &str = "envoy.filters.network.rbac";
/// Stat prefix of the network filters (`tcp.rbac.denied`, ...); the HTTP filters count under
/// their connection manager's prefix (`http.inbound|8080||.rbac.denied`).
pub const NETWORK_STAT_PREFIX: &str = "tcp.";
/// Body of a denied HTTP request: Envoy's text, then the policy that decided it.
pub const DENIAL_BODY: &str = "RBAC: access denied (%RESPONSE_CODE_DETAILS%)\n";

/// What one inbound filter chain knows about a connection, which decides how conditions
/// evaluate on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainFacts {
    /// The chain terminates mutual TLS: the peer's SPIFFE ID is known.
    pub identity: bool,
    /// The chain runs an HTTP connection manager (hosts, methods, paths, headers are known).
    pub http: bool,
    /// The workload port every connection of the chain reaches, when the chain matches one
    /// (`ports` conditions then evaluate here, not in Envoy); `None` for the passthrough chain
    /// of ports no Service names.
    pub port: Option<u32>,
}

/// A boolean condition tree with constants folded away as it is built.
#[derive(Clone, Debug, PartialEq)]
enum Expr<L> {
    Const(bool),
    Leaf(L),
    All(Vec<Expr<L>>),
    Any(Vec<Expr<L>>),
    Not(Box<Expr<L>>),
}

impl<L> Expr<L> {
    fn all(items: impl IntoIterator<Item = Expr<L>>) -> Self {
        let mut kept = Vec::new();
        for e in items {
            match e {
                Expr::Const(true) => {}
                Expr::Const(false) => return Expr::Const(false),
                e => kept.push(e),
            }
        }
        match kept.len() {
            0 => Expr::Const(true),
            1 => kept.pop().unwrap_or(Expr::Const(true)),
            _ => Expr::All(kept),
        }
    }

    fn any(items: impl IntoIterator<Item = Expr<L>>) -> Self {
        let mut kept = Vec::new();
        for e in items {
            match e {
                Expr::Const(false) => {}
                Expr::Const(true) => return Expr::Const(true),
                e => kept.push(e),
            }
        }
        match kept.len() {
            0 => Expr::Const(false),
            1 => kept.pop().unwrap_or(Expr::Const(false)),
            _ => Expr::Any(kept),
        }
    }

    fn not(e: Expr<L>) -> Self {
        match e {
            Expr::Const(b) => Expr::Const(!b),
            Expr::Not(inner) => *inner,
            e => Expr::Not(Box::new(e)),
        }
    }
}

type PrincipalExpr = Expr<Principal>;
type PermissionExpr = Expr<Permission>;

/// Where a `when` condition goes in an Envoy policy.
enum Side {
    Principal(PrincipalExpr),
    Permission(PermissionExpr),
}

fn lower_principal(e: PrincipalExpr) -> Principal {
    let identifier = match e {
        Expr::Const(true) => Identifier::Any(true),
        Expr::Const(false) => Identifier::NotId(Box::new(Principal {
            identifier: Some(Identifier::Any(true)),
        })),
        Expr::Leaf(p) => return p,
        Expr::All(v) => Identifier::AndIds(PrincipalSet {
            ids: v.into_iter().map(lower_principal).collect(),
        }),
        Expr::Any(v) => Identifier::OrIds(PrincipalSet {
            ids: v.into_iter().map(lower_principal).collect(),
        }),
        Expr::Not(e) => Identifier::NotId(Box::new(lower_principal(*e))),
    };
    Principal {
        identifier: Some(identifier),
    }
}

fn lower_permission(e: PermissionExpr) -> Permission {
    let rule = match e {
        Expr::Const(true) => PermRule::Any(true),
        Expr::Const(false) => PermRule::NotRule(Box::new(Permission {
            rule: Some(PermRule::Any(true)),
        })),
        Expr::Leaf(p) => return p,
        Expr::All(v) => PermRule::AndRules(PermSet {
            rules: v.into_iter().map(lower_permission).collect(),
        }),
        Expr::Any(v) => PermRule::OrRules(PermSet {
            rules: v.into_iter().map(lower_permission).collect(),
        }),
        Expr::Not(e) => PermRule::NotRule(Box::new(lower_permission(*e))),
    };
    Permission { rule: Some(rule) }
}

/// How one rule is evaluated: the chain's facts, the policy's action (which decides what an
/// unknown condition means) and the tenant's trust domain.
struct RuleContext<'a> {
    facts: ChainFacts,
    action: AuthorizationAction,
    trust_domain: &'a str,
}

impl RuleContext<'_> {
    /// The value of a condition this chain cannot evaluate: fail closed (a CUSTOM rule then
    /// sends the request to its authorizer).
    fn unknown<L>(&self) -> Expr<L> {
        Expr::Const(matches!(
            self.action,
            AuthorizationAction::Deny | AuthorizationAction::Custom
        ))
    }

    /// `values` (any) and `not_values` (none) of one attribute, each value through `leaf`.
    fn field<L>(
        &self,
        values: &[String],
        not_values: &[String],
        leaf: impl Fn(&str) -> Expr<L>,
    ) -> Expr<L> {
        let mut parts = Vec::new();
        if !values.is_empty() {
            parts.push(Expr::any(values.iter().map(|v| leaf(v))));
        }
        if !not_values.is_empty() {
            parts.push(Expr::not(Expr::any(not_values.iter().map(|v| leaf(v)))));
        }
        Expr::all(parts)
    }

    /// Like [`Self::field`] for an attribute the chain may not know: unknown when it does not
    /// and the field is used.
    fn known_field<L>(
        &self,
        known: bool,
        values: &[String],
        not_values: &[String],
        leaf: impl Fn(&str) -> Expr<L>,
    ) -> Expr<L> {
        if values.is_empty() && not_values.is_empty() {
            Expr::Const(true)
        } else if !known {
            self.unknown()
        } else {
            self.field(values, not_values, leaf)
        }
    }

    fn principal(&self, value: &str) -> PrincipalExpr {
        let name = if value == "*" {
            None
        } else if let Some(prefix) = value.strip_suffix('*') {
            Some(MatchPattern::Prefix(format!("spiffe://{prefix}")))
        } else if let Some(suffix) = value.strip_prefix('*') {
            Some(MatchPattern::Suffix(suffix.to_string()))
        } else {
            Some(MatchPattern::Exact(format!("spiffe://{value}")))
        };
        Expr::Leaf(Principal {
            identifier: Some(Identifier::Authenticated(Authenticated {
                principal_name: name.map(string_matcher),
            })),
        })
    }

    fn namespace(&self, value: &str) -> PrincipalExpr {
        let td = self.trust_domain;
        let pattern = if value == "*" {
            MatchPattern::Prefix(format!("spiffe://{td}/ns/"))
        } else if let Some(prefix) = value.strip_suffix('*') {
            MatchPattern::Prefix(format!("spiffe://{td}/ns/{prefix}"))
        } else if let Some(suffix) = value.strip_prefix('*') {
            MatchPattern::SafeRegex(RegexMatcher {
                regex: format!(
                    "spiffe://{}/ns/[^/]*{}/sa/.*",
                    regex_escape(td),
                    regex_escape(suffix)
                ),
                ..Default::default()
            })
        } else {
            MatchPattern::Prefix(format!("spiffe://{td}/ns/{value}/sa/"))
        };
        Expr::Leaf(Principal {
            identifier: Some(Identifier::Authenticated(Authenticated {
                principal_name: Some(string_matcher(pattern)),
            })),
        })
    }

    fn port(&self, value: &str) -> PermissionExpr {
        let Ok(port) = value.parse::<u32>() else {
            // Refused at admission; an unparsable port matches no connection.
            return Expr::Const(false);
        };
        match self.facts.port {
            Some(p) => Expr::Const(p == port),
            None => Expr::Leaf(Permission {
                rule: Some(PermRule::DestinationPort(port)),
            }),
        }
    }

    fn source(&self, s: &Source) -> PrincipalExpr {
        let identity = self.facts.identity;
        let http = self.facts.http;
        Expr::all([
            self.known_field(identity, &s.principals, &s.not_principals, |v| {
                self.principal(v)
            }),
            self.known_field(identity, &s.namespaces, &s.not_namespaces, |v| {
                self.namespace(v)
            }),
            // Known where a request is: on HTTP chains, from the validated token.
            self.known_field(
                http,
                &s.request_principals,
                &s.not_request_principals,
                request_principal,
            ),
            self.field(&s.ip_blocks, &s.not_ip_blocks, |v| {
                cidr(v).map_or(Expr::Const(false), |c| {
                    Expr::Leaf(Principal {
                        identifier: Some(Identifier::DirectRemoteIp(c)),
                    })
                })
            }),
            self.known_field(http, &s.remote_ip_blocks, &s.not_remote_ip_blocks, |v| {
                cidr(v).map_or(Expr::Const(false), |c| {
                    Expr::Leaf(Principal {
                        identifier: Some(Identifier::RemoteIp(c)),
                    })
                })
            }),
        ])
    }

    fn operation(&self, o: &Operation) -> PermissionExpr {
        let http = self.facts.http;
        Expr::all([
            self.known_field(http, &o.hosts, &o.not_hosts, |v| {
                header_permission(":authority", v, true)
            }),
            self.field(&o.ports, &o.not_ports, |v| self.port(v)),
            self.known_field(http, &o.methods, &o.not_methods, |v| {
                header_permission(":method", v, false)
            }),
            self.known_field(http, &o.paths, &o.not_paths, |v| {
                Expr::Leaf(Permission {
                    rule: Some(PermRule::UrlPath(PathMatcher {
                        rule: Some(PathRule::Path(string_matcher(glob(v)))),
                    })),
                })
            }),
        ])
    }

    /// A `when` condition, on the principal side or the permission side.
    fn condition(&self, c: &Condition) -> Side {
        let f = &self.facts;
        let key = c.key.as_str();
        match key {
            "source.principal" => {
                Side::Principal(
                    self.known_field(f.identity, &c.values, &c.not_values, |v| self.principal(v)),
                )
            }
            "source.namespace" => {
                Side::Principal(
                    self.known_field(f.identity, &c.values, &c.not_values, |v| self.namespace(v)),
                )
            }
            "source.ip" => Side::Principal(self.field(&c.values, &c.not_values, |v| {
                cidr(v).map_or(Expr::Const(false), |c| {
                    Expr::Leaf(Principal {
                        identifier: Some(Identifier::DirectRemoteIp(c)),
                    })
                })
            })),
            "remote.ip" => {
                Side::Principal(self.known_field(f.http, &c.values, &c.not_values, |v| {
                    cidr(v).map_or(Expr::Const(false), |c| {
                        Expr::Leaf(Principal {
                            identifier: Some(Identifier::RemoteIp(c)),
                        })
                    })
                }))
            }
            "destination.ip" => Side::Permission(self.field(&c.values, &c.not_values, |v| {
                cidr(v).map_or(Expr::Const(false), |c| {
                    Expr::Leaf(Permission {
                        rule: Some(PermRule::DestinationIp(c)),
                    })
                })
            })),
            "destination.port" => {
                Side::Permission(self.field(&c.values, &c.not_values, |v| self.port(v)))
            }
            "connection.sni" => Side::Permission(self.field(&c.values, &c.not_values, |v| {
                Expr::Leaf(Permission {
                    rule: Some(PermRule::RequestedServerName(string_matcher(glob(v)))),
                })
            })),
            _ => {
                if let Some(name) = header_key(key) {
                    return Side::Principal(self.known_field(
                        f.http,
                        &c.values,
                        &c.not_values,
                        |v| {
                            Expr::Leaf(Principal {
                                identifier: Some(Identifier::Header(header_matcher(
                                    name, v, false,
                                ))),
                            })
                        },
                    ));
                }
                let claim: Option<Vec<&str>> = match key {
                    "request.auth.principal" => {
                        return Side::Principal(self.known_field(
                            f.http,
                            &c.values,
                            &c.not_values,
                            request_principal,
                        ))
                    }
                    "request.auth.audiences" => Some(vec!["aud"]),
                    "request.auth.presenter" => Some(vec!["azp"]),
                    _ => claim_path(key),
                };
                match claim {
                    Some(path) => {
                        Side::Principal(self.known_field(f.http, &c.values, &c.not_values, |v| {
                            claim_matches(&path, v)
                        }))
                    }
                    // Any other key is refused at admission and fails closed here.
                    None => Side::Principal(self.unknown()),
                }
            }
        }
    }

    /// The rule as an Envoy policy, or `None` when it can never match on this chain.
    fn rule(&self, rule: &AuthorizationRule) -> Option<Policy> {
        let mut principals = vec![if rule.from.is_empty() {
            Expr::Const(true)
        } else {
            Expr::any(rule.from.iter().map(|f| self.source(&f.source)))
        }];
        let mut permissions = vec![if rule.to.is_empty() {
            Expr::Const(true)
        } else {
            Expr::any(rule.to.iter().map(|t| self.operation(&t.operation)))
        }];
        for c in &rule.when {
            match self.condition(c) {
                Side::Principal(p) => principals.push(p),
                Side::Permission(p) => permissions.push(p),
            }
        }
        let principals = Expr::all(principals);
        let permissions = Expr::all(permissions);
        if principals == Expr::Const(false) || permissions == Expr::Const(false) {
            return None;
        }
        Some(Policy {
            permissions: vec![lower_permission(permissions)],
            principals: vec![lower_principal(principals)],
            ..Default::default()
        })
    }
}

/// A condition on the validated token's payload at `path` (claim names, nested for a nested
/// claim).
fn payload(path: &[&str], value: value_matcher::MatchPattern) -> PrincipalExpr {
    let path = std::iter::once(super::jwt::PAYLOAD_METADATA)
        .chain(path.iter().copied())
        .map(|k| PathSegment {
            segment: Some(Segment::Key(k.to_string())),
        })
        .collect();
    Expr::Leaf(Principal {
        identifier: Some(Identifier::SourcedMetadata(SourcedMetadata {
            metadata_matcher: Some(MetadataMatcher {
                filter: super::jwt::JWT_AUTHN_FILTER.to_string(),
                path,
                value: Some(ValueMatcher {
                    match_pattern: Some(value),
                }),
                invert: false,
            }),
            metadata_source: MetadataSource::Dynamic as i32,
        })),
    })
}

/// A string claim matching `pattern`.
fn string_claim(name: &str, pattern: MatchPattern) -> PrincipalExpr {
    payload(
        &[name],
        value_matcher::MatchPattern::StringMatch(string_matcher(pattern)),
    )
}

/// A claim (string, or list of strings) holding `value` (`*`: present; `prefix*`, `*suffix`).
fn claim_matches(path: &[&str], value: &str) -> PrincipalExpr {
    if value == "*" {
        return payload(path, value_matcher::MatchPattern::PresentMatch(true));
    }
    let string = || value_matcher::MatchPattern::StringMatch(string_matcher(glob(value)));
    Expr::any([
        payload(path, string()),
        payload(
            path,
            value_matcher::MatchPattern::ListMatch(Box::new(ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(ValueMatcher {
                    match_pattern: Some(string()),
                }))),
            })),
        ),
    ])
}

/// A request principal `iss/sub` (`*`, `prefix*`, `*suffix`): the validated token's `iss` and
/// `sub` joined by `/` would match. An issuer holds slashes too, so each `/` of the value is
/// tried as the joint.
fn request_principal(value: &str) -> PrincipalExpr {
    let slashes = |s: &str| -> Vec<usize> {
        s.char_indices()
            .filter(|(_, c)| *c == '/')
            .map(|(i, _)| i)
            .collect()
    };
    if value == "*" {
        return payload(&["iss"], value_matcher::MatchPattern::PresentMatch(true));
    }
    if let Some(prefix) = value.strip_suffix('*') {
        // The prefix ends inside the issuer, or the issuer is its part before a `/`.
        let mut any = vec![string_claim(
            "iss",
            MatchPattern::Prefix(prefix.to_string()),
        )];
        for i in slashes(prefix) {
            any.push(Expr::all([
                string_claim("iss", MatchPattern::Exact(prefix[..i].to_string())),
                string_claim("sub", MatchPattern::Prefix(prefix[i + 1..].to_string())),
            ]));
        }
        return Expr::any(any);
    }
    if let Some(suffix) = value.strip_prefix('*') {
        let mut any = vec![string_claim(
            "sub",
            MatchPattern::Suffix(suffix.to_string()),
        )];
        for i in slashes(suffix) {
            any.push(Expr::all([
                string_claim("iss", MatchPattern::Suffix(suffix[..i].to_string())),
                string_claim("sub", MatchPattern::Exact(suffix[i + 1..].to_string())),
            ]));
        }
        return Expr::any(any);
    }
    Expr::any(slashes(value).into_iter().map(|i| {
        Expr::all([
            string_claim("iss", MatchPattern::Exact(value[..i].to_string())),
            string_claim("sub", MatchPattern::Exact(value[i + 1..].to_string())),
        ])
    }))
}

fn string_matcher(pattern: MatchPattern) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(pattern),
        ignore_case: false,
    }
}

/// `*` (any non-empty value), `prefix*`, `*suffix` or an exact value.
fn glob(value: &str) -> MatchPattern {
    if value == "*" {
        MatchPattern::SafeRegex(RegexMatcher {
            regex: ".+".to_string(),
            ..Default::default()
        })
    } else if let Some(prefix) = value.strip_suffix('*') {
        MatchPattern::Prefix(prefix.to_string())
    } else if let Some(suffix) = value.strip_prefix('*') {
        MatchPattern::Suffix(suffix.to_string())
    } else {
        MatchPattern::Exact(value.to_string())
    }
}

fn header_matcher(name: &str, value: &str, ignore_case: bool) -> HeaderMatcher {
    let specifier = if value == "*" {
        HeaderMatchSpecifier::PresentMatch(true)
    } else {
        HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(glob(value)),
            ignore_case,
        })
    };
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

fn header_permission(name: &str, value: &str, ignore_case: bool) -> PermissionExpr {
    Expr::Leaf(Permission {
        rule: Some(PermRule::Header(header_matcher(name, value, ignore_case))),
    })
}

fn cidr(value: &str) -> Option<CidrRange> {
    let (ip, len) = match value.split_once('/') {
        Some((ip, len)) => (ip, Some(len.parse::<u32>().ok()?)),
        None => (value, None),
    };
    let addr: std::net::IpAddr = ip.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    (len <= max).then(|| CidrRange {
        address_prefix: addr.to_string(),
        prefix_len: Some(UInt32Value { value: len }),
    })
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$-".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The name of rule `index` of `policy` in the RBAC filters (Istio's spelling).
pub fn rule_name(policy: &AuthorizationPolicy, index: usize) -> String {
    format!(
        "ns[{}]-policy[{}]-rule[{index}]",
        policy.metadata.namespace.as_deref().unwrap_or_default(),
        policy.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Why a policy cannot be applied as written, if it cannot: values the admission webhook
/// refuses (a policy stored while it was down), or a CUSTOM policy whose provider cannot be
/// used (`custom` resolves the workload's providers). Such a policy denies every request of
/// the workloads it selects, as dropping it could open what it was meant to close (Istio
/// denies every request of a workload whose CUSTOM provider is invalid, too).
pub fn unenforceable(
    policy: &AuthorizationPolicy,
    custom: &CustomProviders<'_>,
) -> Option<&'static str> {
    if validate_authorization_policy(&policy.spec).is_err() {
        Some("invalid")
    } else if policy.spec.action == AuthorizationAction::Custom && custom.problem(policy).is_some()
    {
        Some("custom-provider-unavailable")
    } else {
        None
    }
}

/// What a policy contributes to a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Its rules are enforced with this action's semantics (`Custom` on a chain that cannot
    /// call the authorizer: its rules deny, failing closed).
    Enforce(AuthorizationAction),
    /// Dry-run: its rules are evaluated in the shadow rules of this action, never enforced.
    Shadow(AuthorizationAction),
    /// A CUSTOM policy on an HTTP chain: its rules select the requests sent to its provider.
    Custom,
    /// Unenforceable: denies every request.
    DenyAll(&'static str),
    /// Not applied (a dry-run policy that could not be applied anyway, or a dry-run CUSTOM).
    Skip,
}

fn role(policy: &AuthorizationPolicy, http: bool, custom: &CustomProviders<'_>) -> Role {
    let action = policy.spec.action;
    let broken = unenforceable(policy, custom);
    if is_dry_run(policy) {
        return match (action, broken) {
            (AuthorizationAction::Custom, _) | (_, Some(_)) => Role::Skip,
            // AUDIT enforces nothing anyway.
            (AuthorizationAction::Audit, None) => Role::Enforce(action),
            (_, None) => Role::Shadow(action),
        };
    }
    match (action, broken) {
        (_, Some(why)) => Role::DenyAll(why),
        (AuthorizationAction::Custom, None) if http || asks_over_grpc(policy, custom) => {
            Role::Custom
        }
        (AuthorizationAction::Custom, None) => Role::Enforce(AuthorizationAction::Custom),
        (a, None) => Role::Enforce(a),
    }
}

/// Whether `policy` (CUSTOM) names a usable gRPC provider: the only kind a chain without HTTP
/// can ask, with Envoy's network ext_authz filter.
fn asks_over_grpc(policy: &AuthorizationPolicy, custom: &CustomProviders<'_>) -> bool {
    policy
        .spec
        .provider
        .as_ref()
        .and_then(|p| custom.by_name.get(&p.name))
        .and_then(|r| r.as_ref().ok())
        .is_some_and(|r| matches!(r.kind, super::ext_authz::ExtAuthzKind::Grpc(_)))
}

fn deny_all_rule(policy: &AuthorizationPolicy, why: &str) -> (String, Policy) {
    (
        format!(
            "ns[{}]-policy[{}]-{why}",
            policy.metadata.namespace.as_deref().unwrap_or_default(),
            policy.metadata.name.as_deref().unwrap_or_default()
        ),
        Policy {
            permissions: vec![lower_permission(Expr::Const(true))],
            principals: vec![lower_principal(Expr::Const(true))],
            ..Default::default()
        },
    )
}

/// The rules of `policy` on this chain, evaluated with `action`'s meaning of an unknown
/// condition, named with `prefix` before Istio's rule names.
fn policy_rules(
    policy: &AuthorizationPolicy,
    action: AuthorizationAction,
    facts: ChainFacts,
    trust_domain: &str,
    prefix: &str,
    into: &mut HashMap<String, Policy>,
) {
    let ctx = RuleContext {
        facts,
        action,
        trust_domain,
    };
    for (i, rule) in policy.spec.rules.iter().enumerate() {
        if let Some(p) = ctx.rule(rule) {
            into.insert(format!("{prefix}{}", rule_name(policy, i)), p);
        }
    }
}

fn rbac_action(action: AuthorizationAction) -> RbacAction {
    match action {
        AuthorizationAction::Deny | AuthorizationAction::Custom => RbacAction::Deny,
        AuthorizationAction::Audit => RbacAction::Log,
        AuthorizationAction::Allow => RbacAction::Allow,
    }
}

/// The shadow rules' stat prefix of dry-run policies of `action` (Istio's).
pub fn dry_run_stat_prefix(action: AuthorizationAction) -> &'static str {
    match action {
        AuthorizationAction::Allow => "istio_dry_run_allow_",
        _ => "istio_dry_run_deny_",
    }
}

/// One RBAC filter of a chain: the enforced rules and the dry-run (shadow) rules of one action.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActionRules {
    /// Enforced rules; `None`: nothing is enforced (an empty ALLOW would deny everything).
    pub rules: Option<Rbac>,
    /// Dry-run rules: evaluated, counted (`<prefix>shadow_allowed`/`shadow_denied`) and
    /// written to the request's dynamic metadata, never enforced.
    pub shadow: Option<Rbac>,
}

/// The RBAC filter of `action` for a chain, or `None` when it needs none. Unenforceable
/// policies are DENY rules matching every request, named `ns[<ns>]-policy[<name>]-invalid` or
/// `...-custom-provider-unavailable`; CUSTOM policies of an HTTP provider on a chain without
/// HTTP are DENY rules;
/// dry-run policies are shadow rules ([`dry_run_stat_prefix`]).
pub fn action_rules(
    policies: &[&AuthorizationPolicy],
    action: AuthorizationAction,
    facts: ChainFacts,
    trust_domain: &str,
    custom: &CustomProviders<'_>,
) -> Option<ActionRules> {
    let mut enforced: HashMap<String, Policy> = HashMap::new();
    let mut shadow: HashMap<String, Policy> = HashMap::new();
    let (mut any_enforced, mut any_shadow) = (false, false);
    for policy in policies {
        match role(policy, facts.http, custom) {
            Role::DenyAll(why) if action == AuthorizationAction::Deny => {
                let (name, rule) = deny_all_rule(policy, why);
                enforced.insert(name, rule);
                any_enforced = true;
            }
            Role::Enforce(AuthorizationAction::Custom) if action == AuthorizationAction::Deny => {
                policy_rules(
                    policy,
                    AuthorizationAction::Custom,
                    facts,
                    trust_domain,
                    "",
                    &mut enforced,
                );
                any_enforced = true;
            }
            Role::Enforce(a) if a == action => {
                policy_rules(policy, action, facts, trust_domain, "", &mut enforced);
                any_enforced = true;
            }
            Role::Shadow(a) if a == action => {
                policy_rules(policy, action, facts, trust_domain, "", &mut shadow);
                any_shadow = true;
            }
            _ => {}
        }
    }
    let keep = |any: bool, rules: &HashMap<String, Policy>| {
        // An empty DENY or LOG set does nothing; an empty ALLOW set denies everything.
        any && (action == AuthorizationAction::Allow || !rules.is_empty())
    };
    let rbac = |policies: HashMap<String, Policy>| Rbac {
        action: rbac_action(action) as i32,
        policies,
        ..Default::default()
    };
    let out = ActionRules {
        rules: keep(any_enforced, &enforced).then(|| rbac(enforced)),
        shadow: keep(any_shadow, &shadow).then(|| rbac(shadow)),
    };
    (out.rules.is_some() || out.shadow.is_some()).then_some(out)
}

/// The enforced RBAC rules of one action for a chain (see [`action_rules`]), CUSTOM policies
/// counted as having no usable provider.
pub fn rbac_rules(
    policies: &[&AuthorizationPolicy],
    action: AuthorizationAction,
    facts: ChainFacts,
    trust_domain: &str,
) -> Option<Rbac> {
    action_rules(
        policies,
        action,
        facts,
        trust_domain,
        &CustomProviders::default(),
    )?
    .rules
}

/// The actions in the order their filters run.
const ORDER: [AuthorizationAction; 3] = [
    AuthorizationAction::Audit,
    AuthorizationAction::Deny,
    AuthorizationAction::Allow,
];

fn http_rbac_filter(rbac: HttpRbac) -> HttpFilter {
    HttpFilter {
        name: HTTP_RBAC_FILTER.to_string(),
        config_type: Some(HttpFilterConfig::TypedConfig(pack_any(rbac))),
        ..Default::default()
    }
}

/// The shadow RBAC filter and the ext_authz filter of each provider the chain's CUSTOM
/// policies name (module [`super::ext_authz`]).
fn custom_filters(
    policies: &[&AuthorizationPolicy],
    facts: ChainFacts,
    trust_domain: &str,
    custom: &CustomProviders<'_>,
) -> Vec<HttpFilter> {
    let mut out = Vec::new();
    for (index, provider) in custom.resolved().enumerate() {
        let shadow = custom_shadow_rules(policies, facts, trust_domain, custom, &provider.name);
        if shadow.is_empty() {
            // No rule can match here: the authorizer is never asked on this chain.
            continue;
        }
        let prefix = super::ext_authz::shadow_stat_prefix(index);
        out.push(http_rbac_filter(HttpRbac {
            shadow_rules: Some(Rbac {
                action: RbacAction::Allow as i32,
                policies: shadow,
                ..Default::default()
            }),
            shadow_rules_stat_prefix: prefix.clone(),
            ..Default::default()
        }));
        out.push(super::ext_authz::ext_authz_filter(provider, &prefix));
    }
    out
}

/// The authorization HTTP filters of a chain (to go before the router), in evaluation order:
/// AUDIT, CUSTOM (per provider: the shadow RBAC filter selecting the requests, then
/// ext_authz), DENY, ALLOW; dry-run policies as the shadow rules of their action's filter.
pub fn http_filters_with(
    policies: &[&AuthorizationPolicy],
    facts: ChainFacts,
    trust_domain: &str,
    custom: &CustomProviders<'_>,
) -> Vec<HttpFilter> {
    let mut out = Vec::new();
    for action in ORDER {
        if action == AuthorizationAction::Deny {
            out.extend(custom_filters(policies, facts, trust_domain, custom));
        }
        if let Some(r) = action_rules(policies, action, facts, trust_domain, custom) {
            let prefix = r.shadow.as_ref().map(|_| dry_run_stat_prefix(action));
            out.push(http_rbac_filter(HttpRbac {
                rules: r.rules,
                shadow_rules: r.shadow,
                shadow_rules_stat_prefix: prefix.unwrap_or_default().to_string(),
                ..Default::default()
            }));
        }
    }
    out
}

/// [`http_filters_with`] where no CUSTOM provider is usable.
pub fn http_filters(
    policies: &[&AuthorizationPolicy],
    facts: ChainFacts,
    trust_domain: &str,
) -> Vec<HttpFilter> {
    http_filters_with(policies, facts, trust_domain, &CustomProviders::default())
}

/// The RBAC network filters of a chain (to go before the TCP proxy), in evaluation order:
/// AUDIT, CUSTOM (per gRPC provider: the shadow RBAC filter selecting the connections, then
/// the network ext_authz filter), DENY, ALLOW. A CUSTOM policy whose provider is HTTP denies
/// the connections its rules match: an HTTP authorizer decides HTTP requests only.
pub fn network_filters_with(
    policies: &[&AuthorizationPolicy],
    facts: ChainFacts,
    trust_domain: &str,
    custom: &CustomProviders<'_>,
) -> Vec<Filter> {
    let mut out = Vec::new();
    for action in ORDER {
        if action == AuthorizationAction::Deny {
            out.extend(custom_network_filters(
                policies,
                facts,
                trust_domain,
                custom,
            ));
        }
        let Some(r) = action_rules(policies, action, facts, trust_domain, custom) else {
            continue;
        };
        let prefix = r.shadow.as_ref().map(|_| dry_run_stat_prefix(action));
        out.push(network_rbac_filter(NetworkRbac {
            rules: r.rules,
            shadow_rules: r.shadow,
            shadow_rules_stat_prefix: prefix.unwrap_or_default().to_string(),
            stat_prefix: NETWORK_STAT_PREFIX.to_string(),
            ..Default::default()
        }));
    }
    out
}

fn network_rbac_filter(rbac: NetworkRbac) -> Filter {
    Filter {
        name: NETWORK_RBAC_FILTER.to_string(),
        config_type: Some(FilterConfig::TypedConfig(pack_any(rbac))),
    }
}

/// On a chain without HTTP: for each gRPC provider the chain's CUSTOM policies name, the
/// network RBAC filter holding their rules as shadow rules, then Envoy's network ext_authz
/// filter, enabled for the connections those rules matched (Istio's way on TCP).
fn custom_network_filters(
    policies: &[&AuthorizationPolicy],
    facts: ChainFacts,
    trust_domain: &str,
    custom: &CustomProviders<'_>,
) -> Vec<Filter> {
    if facts.http {
        return Vec::new();
    }
    let mut out = Vec::new();
    let grpc = custom
        .resolved()
        .filter(|p| matches!(p.kind, super::ext_authz::ExtAuthzKind::Grpc(_)));
    for (index, provider) in grpc.enumerate() {
        let shadow = custom_shadow_rules(policies, facts, trust_domain, custom, &provider.name);
        if shadow.is_empty() {
            continue;
        }
        let prefix = super::ext_authz::shadow_stat_prefix(index);
        out.push(network_rbac_filter(NetworkRbac {
            shadow_rules: Some(Rbac {
                action: RbacAction::Allow as i32,
                policies: shadow,
                ..Default::default()
            }),
            shadow_rules_stat_prefix: prefix.clone(),
            stat_prefix: NETWORK_STAT_PREFIX.to_string(),
            ..Default::default()
        }));
        if let Some(filter) = super::ext_authz::network_ext_authz_filter(provider, &prefix) {
            out.push(filter);
        }
    }
    out
}

/// The rules of the CUSTOM policies naming provider `name`, as shadow rules named
/// `istio-ext-authz-...`.
fn custom_shadow_rules(
    policies: &[&AuthorizationPolicy],
    facts: ChainFacts,
    trust_domain: &str,
    custom: &CustomProviders<'_>,
    name: &str,
) -> HashMap<String, Policy> {
    let mut shadow = HashMap::new();
    for policy in policies {
        let named = policy.spec.provider.as_ref().map(|p| p.name.as_str());
        if role(policy, facts.http, custom) == Role::Custom && named == Some(name) {
            policy_rules(
                policy,
                AuthorizationAction::Custom,
                facts,
                trust_domain,
                super::ext_authz::SHADOW_POLICY_PREFIX,
                &mut shadow,
            );
        }
    }
    shadow
}

/// [`network_filters_with`] where no CUSTOM provider is usable.
pub fn network_filters(
    policies: &[&AuthorizationPolicy],
    facts: ChainFacts,
    trust_domain: &str,
) -> Vec<Filter> {
    network_filters_with(policies, facts, trust_domain, &CustomProviders::default())
}

/// Makes the connection manager's locally generated 403s (the RBAC filter's denials) say which
/// policy decided: Envoy's body, then its response code details. An external authorizer's
/// denial is left as the authorizer answered.
pub fn explain_denials(hcm: &mut HttpConnectionManager) {
    let mapper = ResponseMapper {
        filter: Some(AccessLogFilter {
            filter_specifier: Some(FilterSpecifier::StatusCodeFilter(StatusCodeFilter {
                comparison: Some(ComparisonFilter {
                    op: Op::Eq as i32,
                    value: Some(RuntimeUInt32 {
                        default_value: 403,
                        runtime_key: "meshplane.authz.denied_status".to_string(),
                    }),
                }),
            })),
        }),
        body_format_override: Some(SubstitutionFormatString {
            format: Some(Format::TextFormatSource(DataSource {
                specifier: Some(DataSpecifier::InlineString(DENIAL_BODY.to_string())),
                ..Default::default()
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    // An external authorizer's denial (response flag `UAEX`) keeps the authorizer's own
    // answer: the first matching mapper wins, and this one changes nothing.
    let authorizer = ResponseMapper {
        filter: Some(AccessLogFilter {
            filter_specifier: Some(FilterSpecifier::ResponseFlagFilter(ResponseFlagFilter {
                flags: vec!["UAEX".to_string()],
            })),
        }),
        ..Default::default()
    };
    let mappers = &mut hcm
        .local_reply_config
        .get_or_insert_with(LocalReplyConfig::default)
        .mappers;
    mappers.push(authorizer);
    mappers.push(mapper);
}

/// Inserts `filters` before the last HTTP filter (the router) of the connection manager
/// `filter`, with [`explain_denials`]; other filters, or no RBAC filters, leave it unchanged.
pub fn with_http_rbac(filter: Filter, filters: Vec<HttpFilter>) -> Filter {
    if filters.is_empty() {
        return filter;
    }
    let Some(FilterConfig::TypedConfig(any)) = &filter.config_type else {
        return filter;
    };
    let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
        return filter;
    };
    let at = hcm.http_filters.len().saturating_sub(1);
    hcm.http_filters.splice(at..at, filters);
    explain_denials(&mut hcm);
    Filter {
        name: filter.name,
        config_type: Some(FilterConfig::TypedConfig(pack_any(hcm))),
    }
}
