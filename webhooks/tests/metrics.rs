//! The webhooks' metrics move with their answers: a request is counted by outcome (allowed,
//! denied, error) and timed, a denial is counted by its reason, an injection as injected or
//! skipped by reason; read the way Prometheus reads them, from the registry's text.

use std::sync::Arc;

use meshplane_webhooks::inject::{CaptureMode, InjectionConfig};
use meshplane_webhooks::metrics::{self, WebhookMetrics};
use meshplane_webhooks::tenant::StaticTenant;
use meshplane_webhooks::Webhooks;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

fn webhooks() -> (Webhooks, Registry) {
    let mut registry = Registry::with_prefix("meshplane_xds");
    let metrics = WebhookMetrics::register(&mut registry, &metrics::INSTANCE_WEBHOOKS);
    let injection = InjectionConfig {
        tenant: "blue".into(),
        revision: "blue-v1".into(),
        proxy_image: "proxy:test".into(),
        trust_domain: "cluster.local".into(),
        default_capture_mode: CaptureMode::Default,
    };
    let webhooks = Webhooks::new(
        injection,
        Arc::new(StaticTenant::new("blue", "meshplane-blue", ["shop"])),
    )
    .with_metrics(metrics);
    (webhooks, registry)
}

fn scrape(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encodes");
    out
}

/// The value of the series `series` (name and labels as printed) in `text`.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
        .parse()
        .expect("a number")
}

fn review(kind: (&str, &str), namespace: &str, object: Value) -> Vec<u8> {
    let (group, kind) = kind;
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": "things"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": object,
            "dryRun": false
        }
    }))
    .expect("JSON")
}

fn pod(labels: Value, annotations: Value) -> Vec<u8> {
    review(
        ("", "Pod"),
        "shop",
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "labels": labels, "annotations": annotations},
            "spec": {"containers": [{"name": "web", "image": "web:1"}]}
        }),
    )
}

fn service_entry(export_to: &[&str]) -> Vec<u8> {
    review(
        ("networking.meshplane.io", "ServiceEntry"),
        "shop",
        json!({
            "apiVersion": "networking.meshplane.io/v1alpha1",
            "kind": "ServiceEntry",
            "metadata": {"name": "api", "namespace": "shop"},
            "spec": {
                "hosts": ["api.example.com"],
                "ports": [{"number": 443, "name": "https", "protocol": "TLS"}],
                "resolution": "DNS",
                "exportTo": export_to
            }
        }),
    )
}

const INJECT_ALLOWED: &str =
    r#"meshplane_xds_webhook_requests_total{webhook="inject",outcome="allowed"}"#;
const INJECT_DENIED: &str =
    r#"meshplane_xds_webhook_requests_total{webhook="inject",outcome="denied"}"#;
const INJECT_ERROR: &str =
    r#"meshplane_xds_webhook_requests_total{webhook="inject",outcome="error"}"#;
const INJECT_COUNT: &str = r#"meshplane_xds_webhook_duration_seconds_count{webhook="inject"}"#;
const INJECTED: &str = "meshplane_xds_sidecar_injections_total";

#[test]
fn injection_counts_injected_skipped_denied_and_malformed_requests() {
    let (webhooks, registry) = webhooks();
    let before = scrape(&registry);
    assert_eq!(value(&before, INJECT_ALLOWED), 0.0);
    assert_eq!(value(&before, INJECT_COUNT), 0.0);

    let reply = webhooks.inject(&pod(json!({}), json!({})));
    assert_eq!(
        reply.body["response"]["patchType"], "JSONPatch",
        "{reply:?}"
    );
    let text = scrape(&registry);
    assert_eq!(value(&text, INJECT_ALLOWED), 1.0);
    assert_eq!(value(&text, INJECTED), 1.0);
    assert_eq!(value(&text, INJECT_COUNT), 1.0);
    // A pure decision answers well within the last bucket.
    assert_eq!(
        value(
            &text,
            r#"meshplane_xds_webhook_duration_seconds_bucket{le="10.0",webhook="inject"}"#
        ),
        1.0
    );

    let reply = webhooks.inject(&pod(
        json!({"sidecar.meshplane.io/inject": "false"}),
        json!({}),
    ));
    assert_eq!(reply.body["response"]["allowed"], true);
    assert!(reply.body["response"].get("patch").is_none());
    let text = scrape(&registry);
    assert_eq!(value(&text, INJECT_ALLOWED), 2.0);
    assert_eq!(value(&text, INJECTED), 1.0);
    assert_eq!(
        value(
            &text,
            r#"meshplane_xds_sidecar_injection_skips_total{reason="opted_out"}"#
        ),
        1.0
    );

    let reply = webhooks.inject(&pod(
        json!({}),
        json!({"sidecar.meshplane.io/certTTL": "2s"}),
    ));
    assert_eq!(reply.body["response"]["allowed"], false);
    let text = scrape(&registry);
    assert_eq!(value(&text, INJECT_DENIED), 1.0);
    assert_eq!(
        value(
            &text,
            r#"meshplane_xds_webhook_denials_total{webhook="inject",reason="invalid_cert_ttl"}"#
        ),
        1.0
    );

    let reply = webhooks.inject(b"not a review");
    assert_eq!(reply.status, http::StatusCode::BAD_REQUEST);
    let text = scrape(&registry);
    assert_eq!(value(&text, INJECT_ERROR), 1.0);
    assert_eq!(value(&text, INJECT_COUNT), 4.0);
    // Nothing of the validating webhook moved, and no series names the pod or its namespace.
    assert_eq!(
        value(
            &text,
            r#"meshplane_xds_webhook_duration_seconds_count{webhook="validate"}"#
        ),
        0.0
    );
    assert!(
        !text.contains(r#""web""#) && !text.contains(r#""shop""#),
        "{text}"
    );
}

#[test]
fn validation_counts_allowed_and_denied_config_by_reason() {
    let (webhooks, registry) = webhooks();
    let reply = webhooks.validate(&service_entry(&["."]));
    assert_eq!(reply.body["response"]["allowed"], true, "{reply:?}");
    let reply = webhooks.validate(&service_entry(&["green"]));
    assert_eq!(reply.body["response"]["allowed"], false, "{reply:?}");
    let reply = webhooks.validate(&review(
        ("networking.meshplane.io", "ServiceEntry"),
        "shop",
        json!({"apiVersion": "networking.meshplane.io/v1alpha1", "kind": "ServiceEntry", "metadata": {"name": "x"}, "spec": {"hosts": 3}}),
    ));
    assert_eq!(reply.body["response"]["allowed"], false, "{reply:?}");
    let text = scrape(&registry);
    for (series, expected) in [
        (
            r#"meshplane_xds_webhook_requests_total{webhook="validate",outcome="allowed"}"#,
            1.0,
        ),
        (
            r#"meshplane_xds_webhook_requests_total{webhook="validate",outcome="denied"}"#,
            2.0,
        ),
        (
            r#"meshplane_xds_webhook_requests_total{webhook="validate",outcome="error"}"#,
            0.0,
        ),
        (
            r#"meshplane_xds_webhook_denials_total{webhook="validate",reason="foreign_namespace"}"#,
            1.0,
        ),
        (
            r#"meshplane_xds_webhook_denials_total{webhook="validate",reason="malformed"}"#,
            1.0,
        ),
        (
            r#"meshplane_xds_webhook_duration_seconds_count{webhook="validate"}"#,
            3.0,
        ),
        (INJECT_COUNT, 0.0),
    ] {
        assert_eq!(value(&text, series), expected, "{series} in\n{text}");
    }
    // The namespace named in the refusal is in the answer, never in a label.
    assert!(!text.contains(r#""green""#), "{text}");
}
