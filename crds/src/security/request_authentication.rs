//! `RequestAuthentication`: which end-user credentials (JWTs) the selected workloads accept
//! (Istio's `security.istio.io/v1` RequestAuthentication, field for field).
//!
//! A request without a token passes without an end-user identity; a request with a token that
//! no rule validates is refused (401). What a validated token says (`iss/sub`, claims,
//! audiences, presenter) is what AuthorizationPolicy `requestPrincipals` and `request.auth.*`
//! conditions match. Which RequestAuthentications apply to a workload is decided here
//! ([`applicable_request_authentications`]); the keys of a `jwksUri` are fetched by the
//! tenant's instance, never by the proxies (docs/guide/end-user-auth.md).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::authorization::PolicyTargetReference;
use super::LabelsSelector;
use crate::duration::Duration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Who accepts which tokens: JWT rules for the selected workloads (or the whole namespace, or
/// the whole tenant from the control namespace).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "security.meshplane.io",
    version = "v1alpha1",
    kind = "RequestAuthentication",
    doc = "Which end-user tokens (JWTs) the selected workloads accept: issuers, their keys, where the token is read from (Istio-compatible).",
    namespaced,
    shortname = "ra",
    status = "RequestAuthenticationStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.targetRef) && !has(self.targetRefs)", "message": "targetRef and targetRefs are not supported by meshplane sidecars; select workloads with spec.selector.matchLabels"}
]))]
#[serde(rename_all = "camelCase")]
pub struct RequestAuthenticationSpec {
    /// Workloads of the namespace this applies to; absent: every workload of the namespace. In
    /// the control namespace: absent means every workload of the tenant, and a selector selects
    /// matching workloads in every namespace of the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelsSelector>,
    /// Not supported (refused): Istio's attachment to a Gateway or Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    /// Not supported (refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<PolicyTargetReference>,
    /// The issuers whose tokens are accepted, one rule each. A token is valid when one rule
    /// validates it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub jwt_rules: Vec<JwtRule>,
}

/// How tokens of one issuer are found and validated.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JwtRule {
    /// The token's `iss` claim must equal this.
    #[schemars(length(min = 1, max = 2048))]
    pub issuer: String,
    /// Accepted audiences: the token's `aud` must hold one of them. Empty: any audience.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// Where the issuer's public keys (a JSON Web Key Set) are published. The tenant's instance
    /// fetches it, caches it per tenant and hands the keys to the proxies. Absent (and no
    /// `jwks`): the `jwks_uri` of the issuer's OpenID Connect discovery document.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == '' || self.startsWith('https://') || self.startsWith('http://')", "message": "jwksUri must be an http:// or https:// URL"}]))]
    pub jwks_uri: String,
    /// The key set inline (JSON); takes precedence over `jwksUri`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub jwks: String,
    /// Headers the token is read from; absent (and no `fromParams`, `fromCookies`):
    /// `Authorization: Bearer <token>` and the query parameter `access_token`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_headers: Vec<JwtHeader>,
    /// Query parameters the token is read from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_params: Vec<String>,
    /// Cookies the token is read from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_cookies: Vec<String>,
    /// A header the validated token's payload (base64url JSON) is written to, for the
    /// application.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output_payload_to_header: String,
    /// Keep the token in the request forwarded to the application (it is removed otherwise).
    #[serde(default)]
    pub forward_original_token: bool,
    /// Claims copied into request headers for the application.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// How long a key fetch of `jwksUri` may take (default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
}

/// A header a token is read from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JwtHeader {
    /// Header name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The prefix before the token in its value (`Bearer ` for `Authorization`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

/// A claim copied into a header.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimToHeader {
    /// The header to write.
    #[schemars(length(min = 1))]
    pub header: String,
    /// The claim whose value is written (a string, number or boolean claim).
    #[schemars(length(min = 1))]
    pub claim: String,
}

/// Observed state, written by the tenant's instances.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestAuthenticationStatus {
    /// Generation of the spec the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`: `True`, or `False` with a reason such as `Invalid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The last key fetch of each `jwksUri` of the rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jwks: Vec<JwksFetchStatus>,
}

/// The last fetch of one key set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JwksFetchStatus {
    /// The rule's issuer.
    pub issuer: String,
    /// The URL fetched.
    pub jwks_uri: String,
    /// When the last fetch ended (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fetch_time: Option<String>,
    /// The key ids (`kid`) of the keys in use, as fetched last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_ids: Vec<String>,
    /// Why the last fetch failed; absent when it succeeded. While set, tokens of the issuer
    /// are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The RequestAuthentications that apply to a workload with `labels` in `namespace`, in a
/// stable order (namespace, then name): those of its namespace and of the control namespace
/// without a selector or with a matching one. Like Istio, every applicable one counts: their
/// rules are combined.
pub fn applicable_request_authentications<'a>(
    all: impl IntoIterator<Item = &'a RequestAuthentication>,
    control_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a RequestAuthentication> {
    super::in_workload_scope(
        all,
        |p| &p.spec.selector,
        control_namespace,
        namespace,
        labels,
    )
}

/// The path of an issuer's OpenID Connect discovery document, read for its `jwks_uri` when a
/// rule names no keys.
pub const OIDC_DISCOVERY_PATH: &str = "/.well-known/openid-configuration";

/// Where the keys of `rule` are fetched from: its `jwksUri`, or without one the issuer's
/// OpenID Connect discovery document (`<issuer>/.well-known/openid-configuration`); `None`
/// when the keys are inline (`jwks`).
pub fn jwks_source(rule: &JwtRule) -> Option<String> {
    if !rule.jwks.is_empty() {
        None
    } else if !rule.jwks_uri.is_empty() {
        Some(rule.jwks_uri.clone())
    } else {
        Some(format!(
            "{}{OIDC_DISCOVERY_PATH}",
            rule.issuer.trim_end_matches('/')
        ))
    }
}

/// The key ids (`kid`, empty when a key has none) of a JSON Web Key Set, or why the text is
/// not one: JSON with a non-empty `keys` array whose entries each name a key type (`kty`).
pub fn key_set_ids(text: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not a JSON Web Key Set: {e}"))?;
    let keys = value
        .get("keys")
        .and_then(serde_json::Value::as_array)
        .ok_or("not a JSON Web Key Set: no \"keys\" array")?;
    if keys.is_empty() {
        return Err("the key set holds no keys".into());
    }
    keys.iter()
        .enumerate()
        .map(|(i, k)| {
            if k.get("kty").and_then(serde_json::Value::as_str).is_none() {
                return Err(format!("keys[{i}] has no \"kty\""));
            }
            Ok(k.get("kid")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_string())
        })
        .collect()
}

/// A `jwksUri` taken apart: what the instance connects to and asks for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JwksUrl {
    /// `https` or `http`.
    pub tls: bool,
    /// Host name or address literal (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// Path and query, at least `/`.
    pub path: String,
}

impl JwksUrl {
    /// Parses an `http://` or `https://` URL without user info.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!("{url:?} is not an http:// or https:// URL"));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        if authority.contains('@') {
            return Err(format!(
                "{url:?}: user info is not allowed in a key set URL"
            ));
        }
        if path.contains('#') || path.contains(char::is_whitespace) {
            return Err(format!("{url:?}: a fragment or spaces are not allowed"));
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, tail) = v6
                .split_once(']')
                .ok_or_else(|| format!("{url:?}: unclosed [ in the host"))?;
            let port = match tail.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| format!("{url:?}: bad port"))?,
                None if tail.is_empty() => default_port,
                None => return Err(format!("{url:?}: bad host")),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse().map_err(|_| format!("{url:?}: bad port"))?,
                ),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b':')
        {
            return Err(format!("{url:?}: bad host"));
        }
        Ok(Self {
            tls,
            host: host.to_ascii_lowercase(),
            port,
            path,
        })
    }
}

/// Why the instance refuses to fetch keys from `ip` unless the tenant admin allows it
/// (`spec.meshConfig.jwksFetch.allowLinkLocal`): link-local addresses (169.254.0.0/16,
/// fe80::/10) and the cloud metadata services reached there or at their own addresses
/// (fd00:ec2::254, 100.100.100.200). `None` for any other address.
pub fn restricted_fetch_address(ip: std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            if v4.octets() == [100, 100, 100, 200] {
                Some("a cloud metadata address")
            } else if v4.is_link_local() {
                Some("a link-local address (169.254.0.0/16, where cloud metadata services answer)")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return restricted_fetch_address(IpAddr::V4(v4));
            }
            if v6 == std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
                Some("a cloud metadata address")
            } else if (v6.segments()[0] & 0xffc0) == 0xfe80 {
                Some("a link-local address (fe80::/10)")
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_request_authentication(
        ns: &str,
        name: &str,
        selector: &[(&str, &str)],
    ) -> RequestAuthentication {
        let mut p = RequestAuthentication::new(
            name,
            RequestAuthenticationSpec {
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

    #[test]
    fn namespace_selector_and_tenant_wide_rules_all_apply() {
        const ROOT: &str = "meshplane-blue";
        let all = [
            mk_request_authentication(ROOT, "mesh", &[]),
            mk_request_authentication("shop", "web", &[("app", "web")]),
            mk_request_authentication("shop", "db", &[("app", "db")]),
            mk_request_authentication("bank", "other", &[]),
        ];
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let names: Vec<_> = applicable_request_authentications(&all, ROOT, "shop", &labels)
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["mesh", "web"]);
    }

    #[test]
    fn key_sets_urls_and_restricted_addresses() {
        assert_eq!(
            key_set_ids(r#"{"keys":[{"kty":"EC","kid":"a"},{"kty":"RSA"}]}"#),
            Ok(vec!["a".to_string(), String::new()])
        );
        assert!(key_set_ids(r#"{"keys":[]}"#).is_err());
        assert!(key_set_ids(r#"{"keys":[{"kid":"a"}]}"#).is_err());
        assert!(key_set_ids("nope").is_err());
        let u = JwksUrl::parse("https://IdP.example.com/keys?v=1").expect("parses");
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.path.as_str()),
            (true, "idp.example.com", 443, "/keys?v=1")
        );
        let u = JwksUrl::parse("http://198.18.0.9:8081").expect("parses");
        assert_eq!((u.port, u.path.as_str()), (8081, "/"));
        let u = JwksUrl::parse("http://[fe80::1]:81/k").expect("parses");
        assert_eq!(u.host, "fe80::1");
        assert!(JwksUrl::parse("http://user@host/").is_err());
        assert!(JwksUrl::parse("file:///etc/passwd").is_err());
        for (ip, restricted) in [
            ("169.254.169.254", true),
            ("fe80::1", true),
            ("fd00:ec2::254", true),
            ("100.100.100.200", true),
            ("::ffff:169.254.169.254", true),
            ("198.18.0.9", false),
            ("127.0.0.1", false),
        ] {
            let ip: std::net::IpAddr = ip.parse().expect("ip");
            assert_eq!(restricted_fetch_address(ip).is_some(), restricted, "{ip}");
        }
    }

    #[test]
    fn manifests_use_istio_field_names() {
        let ra: RequestAuthentication = serde_json::from_value(serde_json::json!({
            "apiVersion": "security.meshplane.io/v1alpha1",
            "kind": "RequestAuthentication",
            "metadata": {"name": "jwt", "namespace": "shop"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "jwtRules": [{
                    "issuer": "https://idp.example.com",
                    "audiences": ["shop"],
                    "jwksUri": "https://idp.example.com/keys",
                    "fromHeaders": [{"name": "x-jwt", "prefix": "Token "}],
                    "fromParams": ["token"],
                    "fromCookies": ["session"],
                    "outputPayloadToHeader": "x-jwt-payload",
                    "forwardOriginalToken": true,
                    "outputClaimToHeaders": [{"header": "x-sub", "claim": "sub"}],
                    "timeout": "3s"
                }]
            }
        }))
        .expect("parses");
        let rule = &ra.spec.jwt_rules[0];
        assert_eq!(rule.from_headers[0].prefix, "Token ");
        assert_eq!(rule.output_claim_to_headers[0].claim, "sub");
        assert_eq!(
            rule.timeout.as_ref().map(Duration::get),
            Some(std::time::Duration::from_secs(3))
        );
        assert!(rule.forward_original_token);
    }
}
