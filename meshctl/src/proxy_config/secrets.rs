//! `proxy-config secret`: the certificates a proxy holds (SDS), one row per certificate, with
//! istioctl's columns and the workload identity: a certificate chain's leaf names the SPIFFE ID
//! the proxy presents; a validation context holds the roots it trusts. Envoy's admin redacts
//! private keys; JSON output is the secret as the admin printed it.

use base64::Engine as _;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::dump::{name_of, ConfigDump};
use super::ConfigReport;
use crate::output::{or_dash, Table};

/// One certificate of one secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRow {
    pub name: String,
    /// `Cert Chain` or `CA`.
    pub kind: &'static str,
    pub state: String,
    pub valid_now: bool,
    pub serial: String,
    pub identity: String,
    pub not_after: String,
    pub not_before: String,
}

/// The PEM text of a data source: `inline_bytes` (base64) or `inline_string`.
fn pem_of(source: Option<&Value>) -> Option<String> {
    let source = source?;
    if let Some(text) = source.get("inline_string").and_then(Value::as_str) {
        return Some(text.to_string());
    }
    let bytes = source.get("inline_bytes").and_then(Value::as_str)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(bytes)
        .ok()?;
    String::from_utf8(decoded).ok()
}

fn rfc3339(unix: i64) -> String {
    Timestamp::from_second(unix).map_or_else(|_| unix.to_string(), |t| t.to_string())
}

/// The rows of one secret: each certificate of its chain, then each trusted root.
pub fn rows(secret: &Value, state: &str, now: i64) -> Vec<SecretRow> {
    let name = name_of(secret).to_string();
    let sources = [
        (
            "Cert Chain",
            pem_of(secret.pointer("/tls_certificate/certificate_chain")),
        ),
        (
            "CA",
            pem_of(secret.pointer("/validation_context/trusted_ca")),
        ),
    ];
    let mut out = Vec::new();
    for (kind, pem) in sources {
        let Some(pem) = pem else { continue };
        let Ok(certs) = meshplane_ca::pem::certificates(&pem) else {
            out.push(SecretRow {
                name: name.clone(),
                kind,
                state: state.to_string(),
                valid_now: false,
                serial: "(not a certificate)".to_string(),
                identity: String::new(),
                not_after: String::new(),
                not_before: String::new(),
            });
            continue;
        };
        for cert in &certs {
            let Ok(parsed) = cert.parse() else { continue };
            let (from, to) = match meshplane_ca::pem::validity(&parsed) {
                Ok((from, to)) => (from.unix_timestamp(), to.unix_timestamp()),
                Err(_) => (0, 0),
            };
            out.push(SecretRow {
                name: name.clone(),
                kind,
                state: state.to_string(),
                valid_now: from <= now && now <= to,
                serial: parsed.raw_serial_as_string().replace(':', ""),
                identity: meshplane_ca::pem::uri_sans(&parsed).join(","),
                not_after: rfc3339(to),
                not_before: rfc3339(from),
            });
        }
    }
    out
}

pub fn report(dump: &ConfigDump, now: i64) -> ConfigReport {
    let mut table = Table::new([
        "RESOURCE NAME",
        "TYPE",
        "STATUS",
        "VALID CERT",
        "SERIAL NUMBER",
        "IDENTITY",
        "NOT AFTER",
        "NOT BEFORE",
    ]);
    let mut configs = Vec::new();
    for entry in dump.secrets() {
        for row in rows(entry.config, entry.held.as_str(), now) {
            table.row([
                row.name,
                row.kind.to_string(),
                row.state,
                row.valid_now.to_string(),
                row.serial,
                or_dash(&row.identity),
                row.not_after,
                row.not_before,
            ]);
        }
        configs.push(entry.config.clone());
    }
    ConfigReport::new(table, configs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn certificates_are_read_from_inline_bytes_with_identity_and_validity() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = vec![rcgen::SanType::URI(
            "spiffe://cluster.local/ns/shop/sa/web"
                .try_into()
                .expect("uri"),
        )];
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2026, 1, 2);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        let encoded = base64::engine::general_purpose::STANDARD.encode(cert.pem());
        let secret = json!({
            "name": "default",
            "tls_certificate": {
                "certificate_chain": {"inline_bytes": encoded},
                "private_key": {"inline_bytes": "W3JlZGFjdGVkXQ=="},
            },
        });
        let inside = 1_767_250_000; // 2026-01-01T06:46:40Z
        let rows = rows(&secret, "ACTIVE", inside);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].kind, "Cert Chain");
        assert_eq!(rows[0].identity, "spiffe://cluster.local/ns/shop/sa/web");
        assert!(rows[0].valid_now);
        assert_eq!(rows[0].not_after, "2026-01-02T00:00:00Z");
        assert!(!super::rows(&secret, "ACTIVE", 1_800_000_000)[0].valid_now);
        let roots = json!({"name": "ROOTCA", "validation_context": {"trusted_ca": {"inline_string": cert.pem()}}});
        assert_eq!(super::rows(&roots, "ACTIVE", inside)[0].kind, "CA");
    }
}
