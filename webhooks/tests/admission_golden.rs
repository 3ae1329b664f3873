//! Golden tests of the AdmissionReview responses of `/inject` and `/validate`.
//!
//! Each golden file in `tests/golden/` holds the HTTP status and the response review; the
//! base64 `patch` is shown decoded under `patchDecoded` for readability. Rewrite them with
//! `UPDATE_GOLDEN=1 cargo test -p meshplane-webhooks --test admission_golden`.

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use meshplane_crds::envoyfilter_policy::EnvoyFilterPolicy;
use meshplane_webhooks::inject::{CaptureMode, InjectionConfig};
use meshplane_webhooks::tenant::StaticTenant;
use meshplane_webhooks::{Reply, Webhooks};
use serde_json::{json, Value};

fn webhooks_injection() -> InjectionConfig {
    InjectionConfig {
        tenant: "blue".into(),
        revision: "blue-v1".into(),
        proxy_image: "ghcr.io/meshplane/proxy:1.40.0".into(),
        trust_domain: "blue.example".into(),
        default_capture_mode: CaptureMode::Default,
    }
}

fn webhooks() -> Webhooks {
    Webhooks::new(
        webhooks_injection(),
        Arc::new(StaticTenant::new(
            "blue",
            "meshplane-blue",
            ["shop", "payments"],
        )),
    )
}

fn review(
    uid: &str,
    kind: (&str, &str, &str),
    resource: &str,
    namespace: &str,
    operation: &str,
    object: Value,
) -> Vec<u8> {
    let (group, version, kind) = kind;
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": object,
            "oldObject": null,
            "dryRun": false
        }
    }))
    .unwrap()
}

fn pod_review(uid: &str, namespace: &str, pod: Value) -> Vec<u8> {
    review(uid, ("", "v1", "Pod"), "pods", namespace, "CREATE", pod)
}

fn config_review(uid: &str, kind: &str, resource: &str, namespace: &str, object: Value) -> Vec<u8> {
    review(
        uid,
        ("networking.meshplane.io", "v1alpha1", kind),
        resource,
        namespace,
        "CREATE",
        object,
    )
}

/// The reply as stored in a golden file: patch decoded.
fn readable(reply: &Reply) -> Value {
    let mut body = reply.body.clone();
    if let Some(response) = body.get_mut("response").and_then(Value::as_object_mut) {
        if let Some(Value::String(b64)) = response.remove("patch") {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .expect("patch is base64");
            let patch: Value = serde_json::from_slice(&bytes).expect("patch is JSON");
            response.insert("patchDecoded".into(), patch);
        }
    }
    json!({ "httpStatus": reply.status.as_u16(), "review": body })
}

fn assert_golden(name: &str, reply: &Reply) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"));
    let actual = format!(
        "{}\n",
        serde_json::to_string_pretty(&readable(reply)).unwrap()
    );
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    assert_eq!(
        actual,
        expected,
        "{} differs; rerun with UPDATE_GOLDEN=1 if the change is intended",
        path.display()
    );
}

/// Applies the reply's patch to `pod`, proving the operations are valid for that pod.
fn apply_patch(reply: &Reply, pod: &Value) -> Value {
    let b64 = reply.body["response"]["patch"].as_str().expect("a patch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut doc = pod.clone();
    json_patch::patch(&mut doc, &patch).expect("patch applies to the pod");
    doc
}

fn deployment_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-5d9f8c7b6-",
            "namespace": "shop",
            "labels": {"pod-template-hash": "5d9f8c7b6"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d9f8c7b6", "uid": "rs-1", "controller": true}]
        },
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 8080}]}]}
    })
}

#[test]
fn inject_pod_without_annotations_init_containers_or_volumes() {
    let pod = deployment_pod();
    let reply = webhooks().inject(&pod_review("u-inject-1", "shop", pod.clone()));
    assert_golden("inject_minimal_pod", &reply);
    let patched = apply_patch(&reply, &pod);
    assert_eq!(
        patched["metadata"]["annotations"]["sidecar.meshplane.io/revision"],
        "blue-v1"
    );
    assert_eq!(patched["spec"]["containers"][1]["name"], "meshplane-proxy");
    assert_eq!(
        patched["spec"]["initContainers"][0]["name"],
        "meshplane-init"
    );
    assert_eq!(
        patched["spec"]["volumes"][2]["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        "meshplane-blue"
    );
}

#[test]
fn inject_pod_with_existing_lists_and_capture_none() {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "reviews",
            "labels": {"app": "reviews"},
            "annotations": {"sidecar.meshplane.io/captureMode": "NONE", "team": "books"}
        },
        "spec": {
            "initContainers": [{"name": "migrate", "image": "migrate:1"}],
            "containers": [{"name": "reviews", "image": "reviews:2"}],
            "volumes": [{"name": "cache", "emptyDir": {}}]
        }
    });
    let reply = webhooks().inject(&pod_review("u-inject-2", "payments", pod.clone()));
    assert_golden("inject_existing_lists_capture_none", &reply);
    let patched = apply_patch(&reply, &pod);
    assert_eq!(
        patched["spec"]["initContainers"].as_array().unwrap().len(),
        1,
        "no capture init container"
    );
    assert_eq!(patched["metadata"]["annotations"]["team"], "books");
}

#[test]
fn inject_skips_opted_out_and_injected_pods() {
    let opted_out = json!({"metadata": {"name": "a", "labels": {"sidecar.meshplane.io/inject": "false"}}, "spec": {"containers": [{"name": "a"}]}});
    assert_golden(
        "inject_opted_out",
        &webhooks().inject(&pod_review("u-inject-3", "shop", opted_out)),
    );
    let injected = json!({"metadata": {"name": "b", "annotations": {"sidecar.meshplane.io/revision": "blue-v0"}}, "spec": {"containers": [{"name": "b"}]}});
    assert_golden(
        "inject_already_injected",
        &webhooks().inject(&pod_review("u-inject-4", "shop", injected)),
    );
}

#[test]
fn inject_denies_an_unknown_capture_mode() {
    let pod = json!({"metadata": {"name": "c", "annotations": {"sidecar.meshplane.io/captureMode": "REDIRECT"}}, "spec": {"containers": [{"name": "c"}]}});
    assert_golden(
        "inject_invalid_capture_mode",
        &webhooks().inject(&pod_review("u-inject-5", "shop", pod)),
    );
}

#[test]
fn inject_renders_capture_annotations_as_the_init_containers_arguments() {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "orders",
            "labels": {"app": "orders"},
            "annotations": {
                "sidecar.meshplane.io/includeInboundPorts": "8080, 9090",
                "sidecar.meshplane.io/excludeInboundPorts": "9091",
                "sidecar.meshplane.io/excludeOutboundPorts": "5432",
                "sidecar.meshplane.io/includeOutboundPorts": "443",
                "sidecar.meshplane.io/includeOutboundIPRanges": "198.18.0.0/15,2001:db8::/32",
                "sidecar.meshplane.io/excludeOutboundIPRanges": "198.18.200.7"
            }
        },
        "spec": {"containers": [{"name": "orders", "image": "orders:3"}]}
    });
    let reply = webhooks().inject(&pod_review("u-inject-7", "shop", pod.clone()));
    assert_golden("inject_capture_annotations", &reply);
    let patched = apply_patch(&reply, &pod);
    let init = &patched["spec"]["initContainers"][0];
    assert_eq!(
        init["command"],
        json!(["/usr/local/bin/meshplane-proxy", "capture"])
    );
    assert_eq!(
        init["args"],
        json!([
            "--proxy-uid=1337",
            "--proxy-gid=1337",
            "--outbound-port=15001",
            "--inbound-port=15006",
            "--include-inbound-ports=8080,9090",
            "--exclude-inbound-ports=9091",
            "--include-outbound-ports=443",
            "--exclude-outbound-ports=5432",
            "--include-outbound-ip-ranges=198.18.0.0/15,2001:db8::/32",
            "--exclude-outbound-ip-ranges=198.18.200.7/32"
        ])
    );
}

#[test]
fn inject_denies_a_malformed_capture_annotation() {
    let pod = json!({"metadata": {"name": "e", "annotations": {"sidecar.meshplane.io/excludeOutboundIPRanges": "198.18.0.0/15,198.19.0.0/40"}}, "spec": {"containers": [{"name": "e"}]}});
    let reply = webhooks().inject(&pod_review("u-inject-8", "shop", pod));
    assert_eq!(reply.body["response"]["allowed"], false);
    assert_eq!(
        reply.body["response"]["status"]["message"],
        r#"metadata.annotations["sidecar.meshplane.io/excludeOutboundIPRanges"]: "198.19.0.0/40" is not a CIDR; use comma-separated CIDRs like "198.18.0.0/15,2001:db8::/32""#
    );
    assert_golden("inject_invalid_capture_annotation", &reply);
}

#[test]
fn inject_renders_the_cert_ttl_annotation_and_refuses_a_bad_one() {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "payments",
            "labels": {"app": "payments"},
            "annotations": {"sidecar.meshplane.io/certTTL": "1h30m"}
        },
        "spec": {"containers": [{"name": "payments", "image": "payments:1"}]}
    });
    let reply = webhooks().inject(&pod_review("u-inject-9", "shop", pod.clone()));
    assert_golden("inject_cert_ttl", &reply);
    let patched = apply_patch(&reply, &pod);
    let args = patched["spec"]["containers"][1]["args"]
        .as_array()
        .expect("proxy args");
    let tail: Vec<&Value> = args.iter().rev().take(2).rev().collect();
    assert_eq!(tail, [&json!("--cert-ttl-seconds"), &json!("5400")]);

    let short = json!({"metadata": {"name": "f", "annotations": {"sidecar.meshplane.io/certTTL": "2s"}}, "spec": {"containers": [{"name": "f"}]}});
    let reply = webhooks().inject(&pod_review("u-inject-10", "shop", short));
    assert_eq!(reply.body["response"]["allowed"], false);
    assert_eq!(
        reply.body["response"]["status"]["message"],
        r#"metadata.annotations["sidecar.meshplane.io/certTTL"]: "2s" is not a certificate lifetime: shorter than 10s, which would renew more often than every 5s; write a Go duration of whole seconds between 10s and 168h, e.g. "1h" or "90s""#
    );
    assert_golden("inject_invalid_cert_ttl", &reply);
}

#[test]
fn malformed_reviews_get_clear_errors() {
    assert_golden("malformed_not_json", &webhooks().inject(b"{not json"));
    let missing_fields = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-bad"}}"#;
    assert_golden(
        "malformed_request_with_uid",
        &webhooks().validate(missing_fields),
    );
    let not_a_pod = pod_review(
        "u-inject-6",
        "shop",
        json!({"metadata": {"name": "d"}, "spec": {"containers": "nope"}}),
    );
    assert_golden("inject_object_not_a_pod", &webhooks().inject(&not_a_pod));
}

#[test]
fn validate_allows_tenant_config() {
    let se = json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "ServiceEntry",
        "metadata": {"name": "payments-api", "namespace": "shop"},
        "spec": {"hosts": ["api.payments.example"], "ports": [{"number": 443, "name": "https", "protocol": "TLS"}],
                 "resolution": "DNS", "location": "MESH_EXTERNAL", "exportTo": [".", "payments", "meshplane-blue"]}
    });
    assert_golden(
        "validate_service_entry_allowed",
        &webhooks().validate(&config_review(
            "u-val-1",
            "ServiceEntry",
            "serviceentries",
            "shop",
            se,
        )),
    );
    let ef = json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "EnvoyFilter",
        "metadata": {"name": "tenant-wide-buffer", "namespace": "meshplane-blue"},
        "spec": {"configPatches": [{
            "applyTo": "HTTP_FILTER",
            "match": {"context": "SIDECAR_INBOUND", "listener": {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}}},
            "patch": {"operation": "INSERT_FIRST", "value": {"name": "envoy.filters.http.buffer", "typedConfig": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer", "maxRequestBytes": 4096}}}
        }]}
    });
    assert_golden(
        "validate_envoy_filter_allowed",
        &webhooks().validate(&config_review(
            "u-val-2",
            "EnvoyFilter",
            "envoyfilters",
            "meshplane-blue",
            ef,
        )),
    );
}

/// The tenant's EnvoyFilter policy at admission: by default a Lua filter (even one named
/// without a typed config) and an added cluster are refused, each with the field and the
/// policy setting that would allow it; a tenant whose policy allows them admits the same object.
#[test]
fn validate_holds_envoy_filters_to_the_tenant_policy() {
    let ef = json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "EnvoyFilter",
        "metadata": {"name": "exfil", "namespace": "shop"},
        "spec": {"configPatches": [
            {"applyTo": "CLUSTER", "patch": {"operation": "ADD", "value": {"name": "metadata", "type": "STATIC"}}},
            {"applyTo": "HTTP_FILTER",
             "match": {"listener": {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}}},
             "patch": {"operation": "INSERT_FIRST", "value": {"name": "envoy.filters.http.lua"}}}
        ]}
    });
    let request = config_review("u-val-policy", "EnvoyFilter", "envoyfilters", "shop", ef);
    assert_golden(
        "validate_envoy_filter_beyond_policy",
        &webhooks().validate(&request),
    );
    let trusting = Webhooks::new(
        webhooks_injection(),
        Arc::new(
            StaticTenant::new("blue", "meshplane-blue", ["shop", "payments"])
                .with_envoy_filter_policy(EnvoyFilterPolicy::permissive()),
        ),
    );
    let reply = trusting.validate(&request);
    assert_eq!(reply.body["response"]["allowed"], true, "{}", reply.body);
}

/// Typed extensions beyond filters are held to the policy too: a Wasm access logger with inline
/// code, a gRPC access log exporting credentials, and a request header picking where the
/// passthrough cluster connects are each refused by default, nothing of the object admitted; a
/// policy that allows them admits it.
#[test]
fn validate_holds_every_typed_extension_to_the_tenant_policy() {
    let hcm = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
    let ef = json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "EnvoyFilter",
        "metadata": {"name": "loggers", "namespace": "shop"},
        "spec": {"configPatches": [
            {"applyTo": "NETWORK_FILTER",
             "match": {"listener": {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}}},
             "patch": {"operation": "MERGE", "value": {"typedConfig": {"@type": hcm, "accessLog": [
                {"name": "wasm", "typedConfig": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.wasm.v3.WasmAccessLog",
                    "config": {"vmConfig": {"runtime": "envoy.wasm.runtime.v8", "code": {"local": {"inlineBytes": "AGFzbQEAAAA="}}}}}},
                {"name": "grpc", "typedConfig": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
                    "commonConfig": {"logName": "x", "transportApiVersion": "V3",
                        "grpcService": {"envoyGrpc": {"clusterName": "outbound|80||collector.shop.svc.cluster.local"}}},
                    "additionalRequestHeadersToLog": ["authorization", "cookie"]}}]}}}},
            {"applyTo": "CLUSTER", "match": {"cluster": {"name": "PassthroughCluster"}},
             "patch": {"operation": "MERGE", "value": {"originalDstLbConfig": {"useHttpHeader": true}}}}
        ]}
    });
    let request = config_review("u-val-ext", "EnvoyFilter", "envoyfilters", "shop", ef);
    assert_golden(
        "validate_envoy_filter_extensions_beyond_policy",
        &webhooks().validate(&request),
    );
    let trusting = Webhooks::new(
        webhooks_injection(),
        Arc::new(
            StaticTenant::new("blue", "meshplane-blue", ["shop", "payments"])
                .with_envoy_filter_policy(EnvoyFilterPolicy::permissive()),
        ),
    );
    let reply = trusting.validate(&request);
    assert_eq!(reply.body["response"]["allowed"], true, "{}", reply.body);
}

#[test]
fn validate_denies_crossing_the_tenant_boundary() {
    let se = json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "ServiceEntry",
        "metadata": {"name": "leak", "namespace": "shop"},
        "spec": {"hosts": ["api.payments.example"], "exportTo": ["green"]}
    });
    let reply = webhooks().validate(&config_review(
        "u-val-3",
        "ServiceEntry",
        "serviceentries",
        "shop",
        se,
    ));
    assert_eq!(
        reply.body["response"]["status"]["message"],
        r#"spec.exportTo[0]: namespace "green" is not a member of tenant "blue"; exportTo may only name namespaces of the tenant"#
    );
    assert_golden("validate_service_entry_export_to_foreign", &reply);

    let sc = json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": "shop"},
        "spec": {"egress": [{"hosts": ["./*", "meshplane-blue/*", "green/*"]}]}
    });
    assert_golden(
        "validate_sidecar_egress_foreign",
        &webhooks().validate(&config_review("u-val-4", "Sidecar", "sidecars", "shop", sc)),
    );

    let ef = json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "EnvoyFilter",
        "metadata": {"name": "reach-out", "namespace": "shop"},
        "spec": {
            "targetRefs": [{"kind": "Service", "name": "web"}],
            "configPatches": [{
                "applyTo": "CLUSTER",
                "match": {"cluster": {"service": "checkout.green.svc.cluster.local"}},
                "patch": {"operation": "MERGE", "value": {"connect_timeout": "1s"}}
            }]
        }
    });
    assert_golden(
        "validate_envoy_filter_out_of_scope",
        &webhooks().validate(&config_review(
            "u-val-5",
            "EnvoyFilter",
            "envoyfilters",
            "shop",
            ef,
        )),
    );
}

#[test]
fn validate_denies_semantic_errors_with_all_violations() {
    let se = json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "ServiceEntry",
        "metadata": {"name": "bad", "namespace": "shop"},
        "spec": {"hosts": ["*.example.com"], "resolution": "STATIC", "ports": [{"number": 70000}]}
    });
    assert_golden(
        "validate_service_entry_invalid",
        &webhooks().validate(&config_review(
            "u-val-6",
            "ServiceEntry",
            "serviceentries",
            "shop",
            se,
        )),
    );
}

#[test]
fn validate_allows_deletes_and_other_kinds() {
    let se = json!({"metadata": {"name": "x"}, "spec": {"hosts": ["api.example.com"], "exportTo": ["green"]}});
    let delete = review(
        "u-val-7",
        ("networking.meshplane.io", "v1alpha1", "ServiceEntry"),
        "serviceentries",
        "shop",
        "DELETE",
        se,
    );
    let reply = webhooks().validate(&delete);
    assert_eq!(reply.body["response"]["allowed"], true);
}

/// The operator's dry-run probe (contract 5) is refused with the revision's known answer; the
/// same Sidecar stored for real, or naming another revision, is validated like any other.
#[test]
fn validate_answers_the_operators_probe_of_its_own_revision_only() {
    let probe = |revision: &str, dry_run: bool| {
        let object = json!({"apiVersion": "networking.meshplane.io/v1alpha1", "kind": "Sidecar",
            "metadata": {"name": "meshplane-webhook-probe", "namespace": "meshplane-blue",
                         "annotations": {"meshplane.io/webhook-probe": revision}},
            "spec": {"egress": [{"hosts": ["./*"]}]}});
        let mut body: Value = serde_json::from_slice(&config_review(
            "probe",
            "Sidecar",
            "sidecars",
            "meshplane-blue",
            object,
        ))
        .unwrap();
        body["request"]["dryRun"] = json!(dry_run);
        webhooks()
            .validate(&serde_json::to_vec(&body).unwrap())
            .body
    };
    let answered = probe("blue-v1", true);
    assert_eq!(answered["response"]["allowed"], false, "{answered}");
    assert_eq!(
        answered["response"]["status"]["message"],
        meshplane_crds::names::webhook_probe_answer("blue-v1"),
        "{answered}"
    );
    assert_eq!(probe("blue-v1", false)["response"]["allowed"], true);
    assert_eq!(probe("blue-v2", true)["response"]["allowed"], true);
}

fn peer_authentication_review(uid: &str, namespace: &str, spec: Value) -> Vec<u8> {
    review(
        uid,
        ("security.meshplane.io", "v1alpha1", "PeerAuthentication"),
        "peerauthentications",
        namespace,
        "CREATE",
        json!({"apiVersion": "security.meshplane.io/v1alpha1", "kind": "PeerAuthentication",
               "metadata": {"name": "default", "namespace": namespace}, "spec": spec}),
    )
}

#[test]
fn validate_peer_authentications_as_istio_does() {
    let answer = |name: &str, uid: &str, namespace: &str, spec: Value| {
        let reply = webhooks().validate(&peer_authentication_review(uid, namespace, spec));
        assert_golden(name, &reply);
        reply.body["response"]["allowed"].as_bool()
    };
    // A namespace-wide STRICT, a tenant-wide PERMISSIVE and a workload policy with ports pass.
    assert_eq!(
        answer(
            "validate_peer_authentication_allowed",
            "u-pa-1",
            "shop",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"},
                   "portLevelMtls": {"9090": {"mode": "DISABLE"}}}),
        ),
        Some(true)
    );
    let tenant_wide = webhooks().validate(&peer_authentication_review(
        "u-pa-2",
        "meshplane-blue",
        json!({"mtls": {"mode": "STRICT"}}),
    ));
    assert_eq!(tenant_wide.body["response"]["allowed"], true);
    // portLevelMtls without a selector would be ignored.
    assert_eq!(
        answer(
            "validate_peer_authentication_port_level_without_selector",
            "u-pa-3",
            "shop",
            json!({"mtls": {"mode": "PERMISSIVE"}, "portLevelMtls": {"8080": {"mode": "STRICT"}}}),
        ),
        Some(false)
    );
    // A selector in the control namespace would be ignored (the policy is tenant-wide).
    assert_eq!(
        answer(
            "validate_peer_authentication_selector_in_control_namespace",
            "u-pa-4",
            "meshplane-blue",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"}}),
        ),
        Some(false)
    );
    // A mode that does not exist.
    assert_eq!(
        answer(
            "validate_peer_authentication_unknown_mode",
            "u-pa-5",
            "shop",
            json!({"mtls": {"mode": "STRICTER"}}),
        ),
        Some(false)
    );
}

#[test]
fn inject_gives_proxyless_grpc_pods_the_agent_socket_and_a_bootstrap() {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "frontend",
            "labels": {"app": "frontend"},
            "annotations": {"sidecar.meshplane.io/proxylessGrpc": "true"}
        },
        "spec": {"containers": [
            {"name": "app", "image": "frontend:1", "env": [{"name": "MODE", "value": "prod"}]},
            {"name": "tools", "image": "tools:1", "env": [{"name": "GRPC_XDS_BOOTSTRAP", "value": "/etc/own.json"}]},
            {"name": "plain", "image": "plain:1"}
        ]}
    });
    let reply = webhooks().inject(&pod_review("u-inject-grpc-1", "shop", pod.clone()));
    assert_golden("inject_proxyless_grpc", &reply);
    let patched = apply_patch(&reply, &pod);
    assert!(
        patched["spec"].get("initContainers").is_none(),
        "capture defaults to NONE for proxyless clients"
    );
    let proxy = &patched["spec"]["containers"][3];
    assert_eq!(proxy["name"], "meshplane-proxy");
    let args: Vec<&str> = proxy["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.windows(2)
            .any(|w| w == ["--grpc-xds-socket", "meshplane-grpc-xds"]),
        "{args:?}"
    );
    assert!(args.contains(&"CAPTURE_MODE=NONE"), "{args:?}");
    // The app keeps its own variables and gets the bootstrap after the downward API values it
    // refers to (the kubelet expands only variables defined earlier).
    let env = patched["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env");
    let names: Vec<&str> = env.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "MODE",
            "MESHPLANE_POD_NAME",
            "MESHPLANE_POD_NAMESPACE",
            "MESHPLANE_POD_IP",
            "GRPC_XDS_BOOTSTRAP_CONFIG"
        ]
    );
    let expanded = env[4]["value"]
        .as_str()
        .expect("bootstrap")
        .replace("$(MESHPLANE_POD_NAME)", "frontend")
        .replace("$(MESHPLANE_POD_NAMESPACE)", "shop")
        .replace("$(MESHPLANE_POD_IP)", "198.18.0.7");
    let bootstrap: Value = serde_json::from_str(&expanded).expect("the bootstrap is JSON");
    assert_eq!(
        bootstrap["xds_servers"][0]["server_uri"],
        "unix-abstract:meshplane-grpc-xds"
    );
    assert_eq!(
        bootstrap["node"]["id"],
        "sidecar~198.18.0.7~frontend.shop~shop.svc.cluster.local"
    );
    assert_eq!(bootstrap["node"]["metadata"]["GENERATOR"], "grpc");
    assert_eq!(bootstrap["node"]["metadata"]["TENANT"], "blue");
    assert_eq!(bootstrap["node"]["cluster"], "frontend");
    // A container with its own bootstrap is left alone; one without env gets a new list.
    assert_eq!(
        patched["spec"]["containers"][1]["env"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        patched["spec"]["containers"][2]["env"]
            .as_array()
            .map(Vec::len),
        Some(4)
    );

    // An explicit capture mode still wins.
    let mut captured = pod.clone();
    captured["metadata"]["annotations"]["sidecar.meshplane.io/captureMode"] = json!("DEFAULT");
    let patched = apply_patch(
        &webhooks().inject(&pod_review("u-inject-grpc-2", "shop", captured.clone())),
        &captured,
    );
    assert_eq!(
        patched["spec"]["initContainers"][0]["name"],
        "meshplane-init"
    );
}

#[test]
fn inject_denies_a_proxyless_grpc_annotation_that_is_not_a_boolean() {
    let pod = json!({"metadata": {"name": "d", "annotations": {"sidecar.meshplane.io/proxylessGrpc": "yes"}}, "spec": {"containers": [{"name": "d"}]}});
    let reply = webhooks().inject(&pod_review("u-inject-grpc-3", "shop", pod));
    assert_golden("inject_invalid_proxyless_grpc", &reply);
    assert_eq!(reply.body["response"]["allowed"], false);
}
