//! End-user authentication on the inbound side of a workload (and on gateways): the
//! RequestAuthentications that apply to it
//! ([`meshplane_crds::security::request_authentication::applicable_request_authentications`])
//! as one Envoy `jwt_authn` HTTP filter, placed before the RBAC filters (docs/guide/end-user-auth.md).
//!
//! - One provider per JWT rule, named `<namespace>/<name>/<index>`, its keys inline
//!   (`local_jwks`): the rule's `jwks`, or the key set the tenant's instance fetched for its
//!   `jwksUri` ([`FetchedKeys`], from the registry). Proxies never fetch keys themselves.
//! - One requirement for every path: any provider, or no token at all (Istio's semantics: a
//!   request without a token passes without an end-user identity; a token that no provider
//!   validates, of an unknown issuer, expired or badly signed, gets 401).
//! - A key set that could not be fetched (or not yet) is replaced by [`UNUSABLE_KEY_SET`], a
//!   well-formed key set whose private key exists nowhere: the listener keeps serving, requests
//!   without a token pass, and tokens of that issuer are refused.
//! - The validated token's payload goes to the request's dynamic metadata
//!   ([`PAYLOAD_METADATA`] under [`JWT_AUTHN_FILTER`]), where the RBAC filters read
//!   `requestPrincipals` and `request.auth.*` ([`super::authz`]).

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::data_source::Specifier as DataSpecifier;
use envoy_types::pb::envoy::config::core::v3::DataSource;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::RouteMatch;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_provider::JwksSourceSpecifier;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_requirement::RequiresType;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::requirement_rule::RequirementType;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementOrList, RequirementRule,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::google::protobuf::Empty;
use envoy_types::util::pack_any;
use meshplane_crds::security::request_authentication::{
    jwks_source, JwtRule, RequestAuthentication,
};
use meshplane_crds::validation::validate_request_authentication;

/// Name of Envoy's JWT authentication HTTP filter (also the dynamic metadata namespace it
/// writes the payload under).
pub const JWT_AUTHN_FILTER: &str = "envoy.filters.http.jwt_authn";
/// Key of the validated token's payload in the filter's dynamic metadata.
pub const PAYLOAD_METADATA: &str = "payload";

/// A JSON Web Key Set with one P-256 public key whose private key was discarded when it was
/// made: no token verifies against it. It stands in for a key set the instance could not
/// fetch, so the issuer's tokens are refused and the listener stays valid.
pub const UNUSABLE_KEY_SET: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","alg":"ES256","use":"sig","kid":"meshplane-unusable","x":"N64yg5Ui10CKiAZabGH7oyDaMX_phijk-o2PbHPPb5w","y":"rgB7S2sEwGNu-ZX5zS50bLG6pFKhubasVuPV6UepG6o"}]}"#;

pub use crate::model::FetchedKeys;

/// Where a provider's keys come from (for readers of rendered config).
pub use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_provider::JwksSourceSpecifier as JwksSource;
/// The `jwt_authn` filter's configuration message (for readers of rendered config).
pub use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication as JwtAuthenticationConfig;

/// How long a key fetch may take when a rule sets no `timeout`.
pub const DEFAULT_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How often a fetched key set is fetched again when the tenant sets no
/// `jwksFetch.refreshInterval`.
pub const DEFAULT_REFRESH: std::time::Duration = std::time::Duration::from_secs(20 * 60);

/// One rule that uses a fetched key set: the RequestAuthentication (namespace, name) and the
/// rule's issuer.
pub type JwksUser = (String, String, String);

/// What the instance fetches, from the tenant's RequestAuthentications and mesh config: every
/// key source of a valid rule without inline keys (its `jwksUri`, or its issuer's discovery
/// document), who uses it, and how.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JwksPlan {
    /// Fetches from link-local and metadata addresses are allowed (the tenant admin said so).
    pub allow_link_local: bool,
    /// How often a fetched key set is fetched again.
    pub refresh: std::time::Duration,
    /// By URL: the shortest timeout of the rules naming it, and those rules.
    pub uris: BTreeMap<String, (std::time::Duration, std::collections::BTreeSet<JwksUser>)>,
}

/// The [`JwksPlan`] of a registry.
pub fn jwks_plan(registry: &super::registry::Registry) -> JwksPlan {
    let fetch = &registry.mesh_config.jwks_fetch;
    let mut plan = JwksPlan {
        allow_link_local: fetch.allow_link_local,
        refresh: fetch
            .refresh_interval
            .as_ref()
            .map(|d| d.get())
            .filter(|d| !d.is_zero())
            .unwrap_or(DEFAULT_REFRESH),
        uris: BTreeMap::new(),
    };
    for ra in &registry.request_authentications {
        if validate_request_authentication(&ra.spec).is_err() {
            continue;
        }
        let ns = ra.metadata.namespace.clone().unwrap_or_default();
        let name = ra.metadata.name.clone().unwrap_or_default();
        for (rule, source) in ra
            .spec
            .jwt_rules
            .iter()
            .filter_map(|r| jwks_source(r).map(|s| (r, s)))
        {
            let timeout = rule
                .timeout
                .as_ref()
                .map(|t| t.get())
                .unwrap_or(DEFAULT_FETCH_TIMEOUT);
            let entry = plan
                .uris
                .entry(source)
                .or_insert((timeout, Default::default()));
            entry.0 = entry.0.min(timeout);
            entry
                .1
                .insert((ns.clone(), name.clone(), rule.issuer.clone()));
        }
    }
    plan
}

/// The key set a rule's provider carries: inline `jwks`, the fetched one, or
/// [`UNUSABLE_KEY_SET`].
pub fn provider_keys<'a>(rule: &'a JwtRule, fetched: &'a BTreeMap<String, FetchedKeys>) -> &'a str {
    let Some(source) = jwks_source(rule) else {
        return &rule.jwks;
    };
    match fetched.get(&source) {
        Some(FetchedKeys::Keys(keys)) => keys,
        _ => UNUSABLE_KEY_SET,
    }
}

/// The provider name of rule `index` of `ra`.
pub fn provider_name(ra: &RequestAuthentication, index: usize) -> String {
    format!(
        "{}/{}/{index}",
        ra.metadata.namespace.as_deref().unwrap_or_default(),
        ra.metadata.name.as_deref().unwrap_or_default()
    )
}

fn provider(rule: &JwtRule, keys: &str) -> JwtProvider {
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        from_headers: rule
            .from_headers
            .iter()
            .map(|h| JwtHeader {
                name: h.name.to_ascii_lowercase(),
                value_prefix: h.prefix.clone(),
            })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        forward_payload_header: rule.output_payload_to_header.to_ascii_lowercase(),
        payload_in_metadata: PAYLOAD_METADATA.to_string(),
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .map(|c| JwtClaimToHeader {
                header_name: c.header.to_ascii_lowercase(),
                claim_name: c.claim.clone(),
                ..Default::default()
            })
            .collect(),
        jwks_source_specifier: Some(JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(DataSpecifier::InlineString(keys.to_string())),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The `jwt_authn` configuration for a workload's RequestAuthentications, or `None` when none
/// applies (or none has a valid rule). Invalid RequestAuthentications (stored while the
/// webhook was down, read from a directory) give no provider: their issuers' tokens are
/// refused as of an unknown issuer.
pub fn jwt_authentication(
    ras: &[&RequestAuthentication],
    fetched: &BTreeMap<String, FetchedKeys>,
) -> Option<JwtAuthentication> {
    let mut providers = std::collections::HashMap::new();
    let mut names = Vec::new();
    for ra in ras {
        if validate_request_authentication(&ra.spec).is_err() {
            continue;
        }
        for (i, rule) in ra.spec.jwt_rules.iter().enumerate() {
            let name = provider_name(ra, i);
            providers.insert(name.clone(), provider(rule, provider_keys(rule, fetched)));
            names.push(name);
        }
    }
    if names.is_empty() {
        return None;
    }
    let mut any: Vec<JwtRequirement> = names
        .into_iter()
        .map(|n| JwtRequirement {
            requires_type: Some(RequiresType::ProviderName(n)),
        })
        .collect();
    any.push(JwtRequirement {
        requires_type: Some(RequiresType::AllowMissing(Empty {})),
    });
    Some(JwtAuthentication {
        providers,
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix("/".to_string())),
                ..Default::default()
            }),
            requirement_type: Some(RequirementType::Requires(JwtRequirement {
                requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
                    requirements: any,
                })),
            })),
        }],
        bypass_cors_preflight: true,
        ..Default::default()
    })
}

/// The `jwt_authn` HTTP filter of a workload (to go before its RBAC filters), if any
/// RequestAuthentication applies.
pub fn http_filter(
    ras: &[&RequestAuthentication],
    fetched: &BTreeMap<String, FetchedKeys>,
) -> Option<HttpFilter> {
    jwt_authentication(ras, fetched).map(|config| HttpFilter {
        name: JWT_AUTHN_FILTER.to_string(),
        config_type: Some(HttpFilterConfig::TypedConfig(pack_any(config))),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshplane_crds::security::request_authentication::{
        ClaimToHeader, JwtHeader as CrdHeader, RequestAuthenticationSpec,
    };

    fn mk_request_authentication(
        ns: &str,
        name: &str,
        rules: Vec<JwtRule>,
    ) -> RequestAuthentication {
        let mut ra = RequestAuthentication::new(
            name,
            RequestAuthenticationSpec {
                jwt_rules: rules,
                ..Default::default()
            },
        );
        ra.metadata.namespace = Some(ns.into());
        ra
    }

    fn mk_rule(issuer: &str, uri: &str) -> JwtRule {
        JwtRule {
            issuer: issuer.into(),
            jwks_uri: uri.into(),
            ..Default::default()
        }
    }

    fn keys_of(p: &JwtProvider) -> &str {
        match &p.jwks_source_specifier {
            Some(JwksSourceSpecifier::LocalJwks(DataSource {
                specifier: Some(DataSpecifier::InlineString(s)),
                ..
            })) => s,
            other => panic!("inline keys expected, got {other:?}"),
        }
    }

    #[test]
    fn one_provider_per_rule_and_a_missing_token_passes() {
        let a = mk_request_authentication(
            "shop",
            "jwt",
            vec![
                JwtRule {
                    from_headers: vec![CrdHeader {
                        name: "X-Jwt".into(),
                        prefix: "Token ".into(),
                    }],
                    output_claim_to_headers: vec![ClaimToHeader {
                        header: "X-Sub".into(),
                        claim: "sub".into(),
                    }],
                    output_payload_to_header: "X-Payload".into(),
                    forward_original_token: true,
                    audiences: vec!["shop".into()],
                    ..mk_rule("https://a.example", "http://198.18.0.9/a")
                },
                mk_rule("https://b.example", "http://198.18.0.9/b"),
            ],
        );
        let fetched = BTreeMap::from([(
            "http://198.18.0.9/a".to_string(),
            FetchedKeys::Keys(r#"{"keys":[{"kty":"EC","kid":"a"}]}"#.to_string()),
        )]);
        let config = jwt_authentication(&[&a], &fetched).expect("a filter");
        assert_eq!(config.providers.len(), 2);
        let pa = &config.providers["shop/jwt/0"];
        assert_eq!(pa.issuer, "https://a.example");
        assert_eq!(pa.audiences, ["shop"]);
        assert!(pa.forward);
        assert_eq!(pa.from_headers[0].name, "x-jwt");
        assert_eq!(pa.from_headers[0].value_prefix, "Token ");
        assert_eq!(pa.claim_to_headers[0].header_name, "x-sub");
        assert_eq!(pa.forward_payload_header, "x-payload");
        assert_eq!(pa.payload_in_metadata, PAYLOAD_METADATA);
        assert!(keys_of(pa).contains("\"kid\":\"a\""));
        // Not fetched (yet, or failed): keys nobody holds.
        assert_eq!(keys_of(&config.providers["shop/jwt/1"]), UNUSABLE_KEY_SET);
        let Some(RequirementType::Requires(JwtRequirement {
            requires_type: Some(RequiresType::RequiresAny(any)),
        })) = &config.rules[0].requirement_type
        else {
            panic!("requires_any expected");
        };
        assert_eq!(any.requirements.len(), 3);
        assert_eq!(
            any.requirements[2].requires_type,
            Some(RequiresType::AllowMissing(Empty {}))
        );
    }

    #[test]
    fn inline_keys_win_and_invalid_or_absent_rules_give_no_filter() {
        let inline = mk_request_authentication(
            "shop",
            "inline",
            vec![JwtRule {
                jwks: r#"{"keys":[{"kty":"EC","kid":"i"}]}"#.into(),
                ..mk_rule("https://i.example", "http://198.18.0.9/i")
            }],
        );
        let config = jwt_authentication(&[&inline], &BTreeMap::new()).expect("a filter");
        assert!(keys_of(&config.providers["shop/inline/0"]).contains("\"kid\":\"i\""));
        let invalid = mk_request_authentication("shop", "bad", vec![mk_rule("", "")]);
        assert!(jwt_authentication(&[&invalid], &BTreeMap::new()).is_none());
        assert!(http_filter(&[], &BTreeMap::new()).is_none());
        assert!(crate::translate::jwt::UNUSABLE_KEY_SET.contains("meshplane-unusable"));
        assert_eq!(
            meshplane_crds::security::request_authentication::key_set_ids(UNUSABLE_KEY_SET),
            Ok(vec!["meshplane-unusable".to_string()])
        );
    }
}
