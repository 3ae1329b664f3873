//! The Gateway API CRDs generated into `config/crd/` behave like the specification's on the
//! stand-in: its defaults are applied and its CEL rules refuse what the specification refuses.

use meshplane_kube_standin::schema::validate_custom_resource;
use serde_json::{json, Value};

fn crd(plural: &str) -> Value {
    let path = format!(
        "{}/../../config/crd/gateway.networking.k8s.io_{plural}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

fn object(kind: &str, version: &str, spec: Value) -> Value {
    json!({"apiVersion": format!("gateway.networking.k8s.io/{version}"), "kind": kind,
        "metadata": {"name": "r", "namespace": "shop", "uid": "u1"}, "spec": spec})
}

fn admit(plural: &str, kind: &str, version: &str, spec: Value) -> Result<Value, Vec<String>> {
    let mut obj = object(kind, version, spec);
    validate_custom_resource(&crd(plural), version, &mut obj, None).map(|()| obj)
}

fn refused(plural: &str, kind: &str, version: &str, spec: Value, expect: &str) {
    match admit(plural, kind, version, spec.clone()) {
        Ok(_) => panic!("{kind} {spec} admitted, expected: {expect}"),
        Err(errors) => assert!(
            errors.iter().any(|e| e.contains(expect)),
            "{kind} {spec}: {errors:?} lacks {expect:?}"
        ),
    }
}

#[test]
fn httproute_defaults_follow_the_specification() {
    let route = admit(
        "httproutes",
        "HTTPRoute",
        "v1",
        json!({"parentRefs": [{"group": "", "kind": "Service", "name": "web", "port": 80}]}),
    )
    .unwrap();
    assert_eq!(
        route["spec"]["rules"],
        json!([{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}])
    );
    let route = admit(
        "httproutes",
        "HTTPRoute",
        "v1",
        json!({
            "parentRefs": [{"name": "edge"}],
            "rules": [{
                "matches": [{"headers": [{"name": "x-canary", "value": "1"}]}],
                "backendRefs": [{"name": "web-v2", "port": 80}],
            }, {
                "backendRefs": [{"name": "web-v1", "port": 80, "weight": 0}],
            }],
        }),
    )
    .unwrap();
    let spec = &route["spec"];
    assert_eq!(
        spec["parentRefs"][0],
        json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"})
    );
    let first = &spec["rules"][0];
    assert_eq!(
        first["matches"][0],
        json!({"path": {"type": "PathPrefix", "value": "/"},
               "headers": [{"name": "x-canary", "value": "1", "type": "Exact"}]})
    );
    assert_eq!(
        first["backendRefs"][0],
        json!({"group": "", "kind": "Service", "name": "web-v2", "port": 80, "weight": 1})
    );
    assert_eq!(spec["rules"][1]["backendRefs"][0]["weight"], 0);
    assert_eq!(
        spec["rules"][1]["matches"],
        json!([{"path": {"type": "PathPrefix", "value": "/"}}])
    );
}

#[test]
fn httproute_cel_rules_refuse_what_the_specification_refuses() {
    let h = |spec: Value, expect: &str| refused("httproutes", "HTTPRoute", "v1", spec, expect);
    h(
        json!({"rules": [{"backendRefs": [{"name": "web"}]}]}),
        "Must have port for Service reference",
    );
    h(
        json!({"rules": [{"matches": [{"path": {"type": "Exact", "value": "shop"}}]}]}),
        "starts with '/'",
    );
    h(
        json!({"rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/a//b"}}]}]}),
        "has no '//'",
    );
    h(
        json!({"rules": [{"filters": [{"type": "RequestHeaderModifier"}]}]}),
        "requestHeaderModifier is set exactly when type is RequestHeaderModifier",
    );
    h(
        json!({"rules": [{"filters": [
            {"type": "URLRewrite", "urlRewrite": {"hostname": "a.example"}},
            {"type": "RequestRedirect", "requestRedirect": {"hostname": "b.example"}}]}]}),
        "RequestRedirect and URLRewrite filters cannot be used together",
    );
    h(
        json!({"rules": [{
            "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}],
            "backendRefs": [{"name": "web", "port": 80}]}]}),
        "a rule with a RequestRedirect filter has no backendRefs",
    );
    h(
        json!({"rules": [{
            "matches": [{"path": {"type": "Exact", "value": "/a"}}],
            "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/b"}}}]}]}),
        "ReplacePrefixMatch needs exactly one match, of path type PathPrefix",
    );
    h(
        json!({"rules": [{"filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath"}}}]}]}),
        "replaceFullPath is set exactly when type is ReplaceFullPath",
    );
    h(
        json!({"rules": [{"timeouts": {"request": "1s", "backendRequest": "2s"}}]}),
        "backendRequest must not be longer than request",
    );
    h(
        json!({"rules": [{"timeouts": {"request": "1.5s"}}]}),
        "spec.rules[0].timeouts.request",
    );
    h(
        json!({"parentRefs": [{"name": "edge"}, {"name": "edge"}]}),
        "each parentRef (with its sectionName) must be unique",
    );
    h(
        json!({"parentRefs": [{"name": "edge", "sectionName": "http"}, {"name": "edge"}]}),
        "sectionName must be given on every parentRef",
    );
    // Valid: the same parent twice by section, a rewrite of a prefix match, a request timeout
    // of 0s (none) beside a backend timeout.
    admit(
        "httproutes",
        "HTTPRoute",
        "v1",
        json!({
            "parentRefs": [{"name": "edge", "sectionName": "http"}, {"name": "edge", "sectionName": "https"},
                           {"name": "edge", "namespace": "infra", "sectionName": "http"}],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}],
                "backendRefs": [{"name": "web", "port": 80}],
                "timeouts": {"request": "0s", "backendRequest": "500ms"},
            }],
        }),
    )
    .unwrap();
}

#[test]
fn grpcroute_tlsroute_and_referencegrant_rules_hold() {
    refused(
        "grpcroutes",
        "GRPCRoute",
        "v1",
        json!({"rules": [{"matches": [{"method": {"type": "Exact"}}]}]}),
        "names a service, a method, or both",
    );
    refused(
        "grpcroutes",
        "GRPCRoute",
        "v1",
        json!({"rules": [{"matches": [{"method": {"service": "bad service"}}]}]}),
        "fully qualified gRPC service name",
    );
    let route = admit(
        "grpcroutes",
        "GRPCRoute",
        "v1",
        json!({"rules": [{"matches": [{"method": {"service": "helloworld.Greeter", "method": "SayHello"}}],
                          "backendRefs": [{"name": "greeter", "port": 50051}]}]}),
    )
    .unwrap();
    assert_eq!(
        route["spec"]["rules"][0]["matches"][0]["method"]["type"],
        "Exact"
    );
    refused(
        "tlsroutes",
        "TLSRoute",
        "v1alpha2",
        json!({"rules": []}),
        "spec.rules",
    );
    refused(
        "referencegrants",
        "ReferenceGrant",
        "v1beta1",
        json!({"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}], "to": [{"group": "", "kind": "Service"}]}),
        "spec.from[0].namespace",
    );
}

#[test]
fn gateway_listeners_follow_the_specification() {
    let gw = admit(
        "gateways",
        "Gateway",
        "v1",
        json!({"gatewayClassName": "blue", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}),
    )
    .unwrap();
    assert_eq!(
        gw["spec"]["listeners"][0]["allowedRoutes"],
        json!({"namespaces": {"from": "Same"}})
    );
    refused(
        "gateways",
        "Gateway",
        "v1",
        json!({"gatewayClassName": "blue", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP", "tls": {"certificateRefs": [{"name": "c"}]}}]}),
        "tls must not be set for HTTP, TCP and UDP listeners",
    );
    refused(
        "gateways",
        "Gateway",
        "v1",
        json!({"gatewayClassName": "blue", "listeners": [
            {"name": "a", "port": 80, "protocol": "HTTP"}, {"name": "b", "port": 80, "protocol": "HTTP"}]}),
        "port, protocol and hostname must be unique",
    );
}
