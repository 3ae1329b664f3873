//! Bearer tokens shaped as projected ServiceAccount tokens, for fake API servers: their claims
//! pass the instance's own checks (a JWT for the audience, not expired), and a fake knows a
//! token by the name in its last segment, where a real token has its signature.
#![allow(dead_code)]

use base64::Engine as _;

/// The audience of the tenant `blue`'s proxies.
pub const BLUE: &str = "meshplane-blue";

fn encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A token named `name` whose claims say ServiceAccount `namespace/default` and `audience`,
/// valid for an hour. Claims are not identity: the fake API server answers from the name.
/// The expiry is fixed once per test process, so the same name and claims are the same token
/// however long a test runs (a test counting reviews per token must not see a second one
/// because the clock ticked between two calls).
pub fn jwt_for(name: &str, namespace: &str, audience: &str) -> String {
    static EXP: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let exp = *EXP.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
            + 3600
    });
    let claims = serde_json::json!({
        "aud": [audience],
        "exp": exp,
        "sub": format!("system:serviceaccount:{namespace}:default"),
    });
    format!(
        "{}.{}.{}",
        encode(br#"{"alg":"RS256"}"#),
        encode(claims.to_string().as_bytes()),
        encode(name.as_bytes())
    )
}

/// [`jwt_for`] audience [`BLUE`], claiming the namespace that starts `name` (`shop-token`:
/// `shop`).
pub fn jwt(name: &str) -> String {
    let namespace = name.split('-').next().unwrap_or(name);
    jwt_for(name, namespace, BLUE)
}

/// The name of a token made by [`jwt_for`]; other strings are their own name.
pub fn jwt_name(token: &str) -> String {
    token
        .rsplit_once('.')
        .and_then(|(_, last)| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(last)
                .ok()
        })
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| token.to_string())
}
