//! Generated-input tests of the admission surface: AdmissionReview bodies
//! for `/inject` and `/validate`, from raw bytes and from well-formed reviews carrying random
//! objects. 10,000 inputs per property; no body may panic a handler, every answer is a review
//! the API server can match (its uid), every refusal carries a message, and every injection
//! patch applies to the pod it was computed for.

use std::sync::Arc;

use base64::Engine;
use meshplane_webhooks::inject::{CaptureMode, InjectionConfig};
use meshplane_webhooks::tenant::StaticTenant;
use meshplane_webhooks::{Reply, Webhooks};
use proptest::prelude::*;
use serde_json::{json, Value};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 10_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn webhooks() -> Webhooks {
    Webhooks::new(
        InjectionConfig {
            tenant: "blue".into(),
            revision: "blue-v1".into(),
            proxy_image: "ghcr.io/meshplane/proxy:1.40.0".into(),
            trust_domain: "blue.example".into(),
            default_capture_mode: CaptureMode::Default,
        },
        Arc::new(StaticTenant::new(
            "blue",
            "meshplane-blue",
            ["shop", "payments"],
        )),
    )
}

/// Checks what every answer must be: a review with the request's uid (or none for a body that
/// had none), `allowed` a boolean, and a refusal with a code and a message.
fn check_reply(reply: &Reply, uid: Option<&str>) -> Result<(), TestCaseError> {
    let response = &reply.body["response"];
    prop_assert_eq!(
        reply.body["apiVersion"].as_str(),
        Some("admission.k8s.io/v1")
    );
    prop_assert_eq!(reply.body["kind"].as_str(), Some("AdmissionReview"));
    match uid {
        Some(uid) => {
            prop_assert_eq!(reply.status.as_u16(), 200);
            prop_assert_eq!(response["uid"].as_str(), Some(uid));
        }
        None => prop_assert!(matches!(reply.status.as_u16(), 200 | 400)),
    }
    let allowed = response["allowed"].as_bool();
    prop_assert!(allowed.is_some(), "{}", reply.body);
    if allowed == Some(false) {
        let code = response["status"]["code"].as_u64();
        prop_assert!(matches!(code, Some(400) | Some(403)), "{}", reply.body);
        let message = response["status"]["message"].as_str().unwrap_or_default();
        prop_assert!(
            !message.trim().is_empty(),
            "a refusal without a message: {}",
            reply.body
        );
    }
    Ok(())
}

/// JSON trees with the keys real objects use, so that random values land in real fields.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1.0e6f64..1.0e6).prop_map(|f| json!(f)),
        "\\PC{0,16}".prop_map(Value::String),
        prop::sample::select(vec![
            "shop",
            "garden",
            "*",
            "mesh",
            "web.shop.svc.cluster.local",
            "STRICT",
            "ISTIO_MUTUAL",
            "80",
            "-1",
            "spiffe://blue.example/ns/shop/sa/web",
            "10s",
            "1.2.3.4/33",
            "",
        ])
        .prop_map(|s| Value::String(s.to_string())),
    ];
    let keys = prop::sample::select(vec![
        "hosts",
        "gateways",
        "http",
        "route",
        "destination",
        "host",
        "subset",
        "port",
        "number",
        "weight",
        "match",
        "uri",
        "prefix",
        "exportTo",
        "subsets",
        "labels",
        "trafficPolicy",
        "tls",
        "mode",
        "selector",
        "matchLabels",
        "servers",
        "credentialName",
        "workloadSelector",
        "configPatches",
        "applyTo",
        "patch",
        "operation",
        "value",
        "egress",
        "ingress",
        "rules",
        "from",
        "source",
        "principals",
        "namespaces",
        "to",
        "when",
        "key",
        "values",
        "action",
        "mtls",
        "portLevelMtls",
        "endpoints",
        "address",
        "resolution",
        "location",
        "ports",
        "containers",
        "name",
        "image",
        "annotations",
        "metadata",
        "spec",
        "x",
    ]);
    leaf.prop_recursive(4, 40, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(keys.clone().prop_map(String::from), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// The kinds the validating webhook serves, and others it must let through unchanged.
fn kind() -> impl Strategy<Value = (&'static str, &'static str, &'static str)> {
    prop::sample::select(vec![
        (
            "networking.meshplane.io",
            "VirtualService",
            "virtualservices",
        ),
        (
            "networking.meshplane.io",
            "DestinationRule",
            "destinationrules",
        ),
        ("networking.meshplane.io", "Gateway", "gateways"),
        ("networking.meshplane.io", "ServiceEntry", "serviceentries"),
        ("networking.meshplane.io", "Sidecar", "sidecars"),
        ("networking.meshplane.io", "EnvoyFilter", "envoyfilters"),
        (
            "security.meshplane.io",
            "PeerAuthentication",
            "peerauthentications",
        ),
        (
            "security.meshplane.io",
            "AuthorizationPolicy",
            "authorizationpolicies",
        ),
        ("networking.meshplane.io", "Unknown", "unknowns"),
        ("", "Pod", "pods"),
        ("apps", "Deployment", "deployments"),
    ])
}

fn review(
    uid: &str,
    (group, kind, resource): (&str, &str, &str),
    namespace: &str,
    operation: &str,
    dry_run: bool,
    object: &Value,
) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": "v1alpha1", "kind": kind},
            "resource": {"group": group, "version": "v1alpha1", "resource": resource},
            "namespace": namespace,
            "operation": operation,
            "dryRun": dry_run,
            "userInfo": {"username": "kubernetes-admin"},
            "object": object,
        }
    }))
    .unwrap_or_default()
}

/// Pods with random containers, annotations and labels (what the injector reads).
fn pod() -> impl Strategy<Value = Value> {
    let annotation = prop::sample::select(vec![
        "sidecar.istio.io/inject",
        "sidecar.meshplane.io/inject",
        "sidecar.meshplane.io/captureMode",
        "traffic.sidecar.istio.io/includeOutboundIPRanges",
        "traffic.sidecar.istio.io/excludeOutboundPorts",
        "traffic.sidecar.istio.io/excludeInboundPorts",
        "proxy.istio.io/config",
        "other",
    ]);
    let annotation_value = prop::sample::select(vec![
        "true",
        "false",
        "NONE",
        "IPTABLES",
        "*",
        "198.18.0.0/15",
        "15000,x",
        "",
        "80",
        "{}",
    ]);
    (
        prop::collection::btree_map(annotation, annotation_value, 0..4),
        prop::collection::vec(
            (
                "[a-z][a-z0-9-]{0,8}",
                prop::collection::vec((0u32..70_000, prop::sample::select(vec!["TCP", "UDP", ""])), 0..3),
            ),
            0..3,
        ),
        any::<bool>(),
    )
        .prop_map(|(annotations, containers, host_network)| {
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "web-", "namespace": "shop", "annotations": annotations, "labels": {"app": "web"}},
                "spec": {
                    "hostNetwork": host_network,
                    "containers": containers.iter().map(|(name, ports)| json!({
                        "name": name,
                        "image": "web:1",
                        "ports": ports.iter().map(|(p, proto)| json!({"containerPort": p, "protocol": proto})).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                },
            })
        })
}

proptest! {
    #![proptest_config(config())]

    /// Raw bytes, JSON or not: always an answer, never a panic.
    #[test]
    fn any_body_gets_an_answer(body in prop::collection::vec(any::<u8>(), 0..256)) {
        let hooks = webhooks();
        check_reply(&hooks.validate(&body), None)?;
        check_reply(&hooks.inject(&body), None)?;
    }

    /// Reviews of every kind, namespace and operation with random objects: the uid comes back,
    /// refusals say why.
    #[test]
    fn reviews_with_random_objects_are_answered(
        uid in "[a-f0-9-]{1,36}",
        kind in kind(),
        namespace in prop::sample::select(vec!["shop", "payments", "meshplane-blue", "garden", "", "kube-system"]),
        operation in prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT", "PATCH"]),
        dry_run in any::<bool>(),
        name in "[a-z][a-z0-9-]{0,10}",
        spec in json_value(),
    ) {
        let object = json!({
            "apiVersion": format!("{}/v1alpha1", kind.0),
            "kind": kind.1,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        });
        let body = review(&uid, kind, namespace, operation, dry_run, &object);
        let hooks = webhooks();
        check_reply(&hooks.validate(&body), Some(&uid))?;
        check_reply(&hooks.inject(&body), Some(&uid))?;
    }

    /// Pod CREATEs with random annotations and containers: an injection is a JSON patch that
    /// applies to that very pod and yields a Pod that still decodes.
    #[test]
    fn injection_patches_apply_to_their_pod(
        uid in "[a-f0-9-]{1,36}",
        namespace in prop::sample::select(vec!["shop", "payments", "garden"]),
        pod in pod(),
    ) {
        let body = review(&uid, ("", "Pod", "pods"), namespace, "CREATE", false, &pod);
        let reply = webhooks().inject(&body);
        check_reply(&reply, Some(&uid))?;
        if let Some(b64) = reply.body["response"]["patch"].as_str() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| TestCaseError::fail(format!("patch is not base64: {e}")))?;
            let patch: json_patch::Patch = serde_json::from_slice(&bytes)
                .map_err(|e| TestCaseError::fail(format!("patch is not a JSON patch: {e}")))?;
            let mut doc = pod.clone();
            json_patch::patch(&mut doc, &patch)
                .map_err(|e| TestCaseError::fail(format!("patch does not apply: {e}")))?;
            let injected: Result<k8s_openapi::api::core::v1::Pod, _> = serde_json::from_value(doc);
            prop_assert!(injected.is_ok(), "{:?}", injected.err());
        }
    }
}
