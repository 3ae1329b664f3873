//! What never leaves the cluster in a bug report: private keys (PEM blocks, whatever their
//! kind), bearer tokens and anything shaped like a JWT (projected ServiceAccount tokens, the
//! proxies' ADS credentials in their bootstrap, OIDC tokens in logs). Every file of the report
//! passes through [`redact`] before it is written; Secrets are never read at all.

use std::sync::LazyLock;

use regex::Regex;

/// What a removed private key reads as.
pub const KEY_MARK: &str = "[redacted private key]";
/// What a removed token reads as.
pub const TOKEN_MARK: &str = "[redacted token]";

static PRIVATE_KEY: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----")
        .ok()
});
/// Three base64url segments, the first a JSON header (`{"` encodes as `eyJ`).
static JWT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*").ok());
static BEARER: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)(bearer)(\s+|%20)[A-Za-z0-9._~+/=-]+").ok());

/// `text` with private keys and tokens replaced; `None` when the patterns could not be built,
/// in which case the caller must leave the file out.
pub fn redact(text: &str) -> Option<String> {
    let (Some(key), Some(jwt), Some(bearer)) =
        (PRIVATE_KEY.as_ref(), JWT.as_ref(), BEARER.as_ref())
    else {
        return None;
    };
    let text = key.replace_all(text, KEY_MARK);
    let text = jwt.replace_all(&text, TOKEN_MARK);
    let text = bearer.replace_all(&text, format!("$1 {TOKEN_MARK}").as_str());
    Some(text.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_tokens_and_bearer_credentials_are_removed() {
        let key = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBx\n-----END EC PRIVATE KEY-----";
        let pkcs8 = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMG\n-----END PRIVATE KEY-----";
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl";
        let text = format!(
            "{key}\n{cert}\n{pkcs8}\n{{\"key\": \"authorization\", \"value\": \"Bearer abc.DEF-123\"}}\ntoken={jwt} end"
        );
        let out = redact(&text).expect("patterns build");
        assert!(!out.contains("PRIVATE KEY"), "{out}");
        assert!(
            !out.contains("MHcCAQEEIBx") && !out.contains("MIGHAgEAMBMG"),
            "{out}"
        );
        assert!(out.contains(cert), "certificates are kept: {out}");
        assert!(!out.contains(jwt) && !out.contains("abc.DEF-123"), "{out}");
        assert_eq!(out.matches(KEY_MARK).count(), 2, "{out}");
        assert!(out.contains("Bearer [redacted token]"), "{out}");
        assert!(out.ends_with("token=[redacted token] end"), "{out}");
    }

    #[test]
    fn ordinary_text_is_unchanged() {
        let text = "outbound|9080||reviews.shop.svc.cluster.local 198.18.0.7:9080 HEALTHY";
        assert_eq!(redact(text).expect("patterns build"), text);
    }
}
