//! VirtualService, DestinationRule and Gateway: Istio-shaped manifests port by changing only
//! `apiVersion` (every field kept), and bad input is refused with the field and the rule.

use std::path::PathBuf;

use meshplane_crds::manifest::{parse_documents, parse_objects, Object};
use meshplane_crds::networking::{DestinationRuleSpec, GatewaySpec, VirtualServiceSpec};
use meshplane_crds::validation::{
    validate_destination_rule, validate_gateway, validate_virtual_service, ValidationErrors,
};
use serde_json::Value;

const ISTIO_API: &str = "networking.istio.io/v1";
const MESHPLANE_API: &str = "networking.meshplane.io/v1alpha1";

fn istio_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/istio")
}

/// Numbers compare by value (`10` and `10.0` are the same percentage).
fn normalize(v: &Value) -> Value {
    match v {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .unwrap_or_else(|| v.clone()),
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), normalize(v))).collect())
        }
        other => other.clone(),
    }
}

#[test]
fn istio_manifests_port_by_changing_only_the_api_version() {
    let mut seen = Vec::new();
    for file in [
        "virtual-services.yaml",
        "destination-rules.yaml",
        "gateways.yaml",
    ] {
        let text = std::fs::read_to_string(istio_dir().join(file)).expect("test data exists");
        assert!(
            text.contains(ISTIO_API),
            "{file} is written against Istio's API"
        );
        let ported = text.replace(ISTIO_API, MESHPLANE_API);
        let originals = parse_documents(&ported).expect("YAML");
        let objects = parse_objects(&ported).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(originals.len(), objects.len());
        for (original, obj) in originals.iter().zip(objects) {
            let name = original["metadata"]["name"]
                .as_str()
                .unwrap_or("?")
                .to_string();
            let (kind, spec, result) = match obj {
                Object::VirtualService(o) => (
                    "VirtualService",
                    serde_json::to_value(&o.spec),
                    validate_virtual_service(&o.spec),
                ),
                Object::DestinationRule(o) => (
                    "DestinationRule",
                    serde_json::to_value(&o.spec),
                    validate_destination_rule(&o.spec),
                ),
                Object::Gateway(o) => (
                    "Gateway",
                    serde_json::to_value(&o.spec),
                    validate_gateway(&o.spec),
                ),
                other => panic!("{file}: {name} decoded as {other:?}"),
            };
            result.unwrap_or_else(|e| panic!("{file}: {kind} {name} is invalid: {e}"));
            // Nothing the Istio manifest says is dropped or changed on the way in.
            assert_eq!(
                normalize(&spec.expect("serializes")),
                normalize(&original["spec"]),
                "{file}: {kind} {name} does not round-trip"
            );
            seen.push(kind);
        }
    }
    for kind in ["VirtualService", "DestinationRule", "Gateway"] {
        assert!(seen.contains(&kind), "no Istio-shaped {kind}");
    }
}

fn vs(yaml: &str) -> Result<(), ValidationErrors> {
    let spec: VirtualServiceSpec = serde_saphyr::from_str(yaml).expect("decodes");
    validate_virtual_service(&spec)
}

fn dr(yaml: &str) -> Result<(), ValidationErrors> {
    let spec: DestinationRuleSpec = serde_saphyr::from_str(yaml).expect("decodes");
    validate_destination_rule(&spec)
}

fn gw(yaml: &str) -> Result<(), ValidationErrors> {
    let spec: GatewaySpec = serde_saphyr::from_str(yaml).expect("decodes");
    validate_gateway(&spec)
}

/// Each case is refused, naming the field, with a message that says what to do.
fn refused(result: Result<(), ValidationErrors>, field: &str, words: &str) {
    let errs = result.expect_err("refused");
    let text = errs.to_string();
    assert!(
        errs.0.iter().any(|e| e.field() == field) && text.contains(words),
        "expected {field:?} with {words:?}, got: {text}"
    );
}

#[test]
fn virtual_service_table() {
    let route = "route: [{destination: {host: web}}]";
    assert!(vs(&format!("hosts: [web]\nhttp: [{{{route}}}]")).is_ok());
    refused(vs(&format!("http: [{{{route}}}]")), "spec.hosts", "empty");
    refused(
        vs(&format!("hosts: ['*']\nhttp: [{{{route}}}]")),
        "spec.hosts[0]",
        "'*' alone",
    );
    assert!(
        vs(&format!(
            "hosts: ['*']\ngateways: [gw]\nhttp: [{{{route}}}]"
        ))
        .is_ok(),
        "a gateway may serve every host"
    );
    refused(vs("hosts: [web]"), "spec", "at least one of http");
    refused(
        vs("hosts: [web]\nhttp: [{redirect: {uri: /x}, route: [{destination: {host: web}}]}]"),
        "spec.http[0]",
        "exactly one of route, redirect",
    );
    refused(
        vs("hosts: [web]\nhttp: [{route: [{destination: {host: web, subset: v1}}, {destination: {host: web, subset: v2}}]}]"),
        "spec.http[0].route",
        "weights",
    );
    refused(
        vs(&format!(
            "hosts: [web]\nhttp: [{{match: [{{uri: {{exact: /a, prefix: /b}}}}], {route}}}]"
        )),
        "spec.http[0].match[0].uri",
        "only one of exact, prefix and regex",
    );
    refused(
        vs(&format!(
            "hosts: [web]\nhttp: [{{match: [{{uri: {{regex: '(a'}}}}], {route}}}]"
        )),
        "spec.http[0].match[0].uri.regex",
        "RE2",
    );
    refused(
        vs(&format!(
            "hosts: [web]\nhttp: [{{match: [{{headers: {{X-User: {{exact: a}}}}}}], {route}}}]"
        )),
        "spec.http[0].match[0].headers[X-User]",
        "lowercase",
    );
    refused(
        vs(&format!(
            "hosts: [web]\nhttp: [{{retries: {{attempts: 2, retryOn: 'oops'}}, {route}}}]"
        )),
        "spec.http[0].retries.retryOn",
        "neither a status code",
    );
    refused(
        vs(&format!("hosts: [web]\nhttp: [{{fault: {{abort: {{percentage: {{value: 150}}, httpStatus: 500}}}}, {route}}}]")),
        "spec.http[0].fault.abort.percentage",
        "outside 0-100",
    );
    refused(
        vs(&format!(
            "hosts: [web]\nhttp: [{{fault: {{abort: {{grpcStatus: NOPE}}}}, {route}}}]"
        )),
        "spec.http[0].fault.abort.grpcStatus",
        "not a gRPC status",
    );
    refused(
        vs(&format!(
            "hosts: [web]\nhttp: [{{headers: {{request: {{set: {{host: x}}}}}}, {route}}}]"
        )),
        "spec.http[0].headers.request.set",
        "rewrite.authority",
    );
    refused(
        vs("hosts: [web]\nhttp: [{redirect: {uri: /x, redirectCode: 200}}]"),
        "spec.http[0].redirect.redirectCode",
        "not a redirect status",
    );
    refused(
        vs(&format!(
            "hosts: [web]\ngateways: ['bad ns/gw']\nhttp: [{{{route}}}]"
        )),
        "spec.gateways[0]",
        "<namespace>/<gateway>",
    );
    refused(
        vs("hosts: [db]\ntcp: [{route: [{destination: {host: db}, weight: -1}]}]"),
        "spec.tcp[0].route[0].weight",
        "negative",
    );
    refused(
        vs("hosts: [db]\ntcp: [{match: [{destinationSubnets: [300.1.1.1]}], route: [{destination: {host: db}}]}]"),
        "spec.tcp[0].match[0].destinationSubnets[0]",
        "300.1.1.1",
    );
    refused(
        vs(&format!(
            "hosts: [web]\nexportTo: ['~', shop]\nhttp: [{{{route}}}]"
        )),
        "spec.exportTo",
        "cannot be combined",
    );
}

#[test]
fn malformed_durations_fail_to_decode_with_the_value() {
    let e = serde_saphyr::from_str::<VirtualServiceSpec>(
        "hosts: [web]\nhttp: [{timeout: 10 seconds, route: [{destination: {host: web}}]}]",
    )
    .expect_err("bad duration");
    assert!(e.to_string().contains("\"10 seconds\""), "{e}");
}

#[test]
fn destination_rule_table() {
    assert!(dr("host: reviews\nsubsets: [{name: v1, labels: {version: v1}}]").is_ok());
    refused(dr("host: ''"), "spec.host", "empty");
    refused(
        dr("host: r\nsubsets: [{name: v1}, {name: v1}]"),
        "spec.subsets[1].name",
        "declared twice",
    );
    refused(
        dr("host: r\nsubsets: [{name: V_1}]"),
        "spec.subsets[0].name",
        "DNS label",
    );
    refused(
        dr("host: r\ntrafficPolicy: {loadBalancer: {simple: RANDOM, consistentHash: {useSourceIp: true}}}"),
        "spec.trafficPolicy.loadBalancer",
        "not both",
    );
    refused(
        dr("host: r\ntrafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x, useSourceIp: true}}}"),
        "spec.trafficPolicy.loadBalancer.consistentHash",
        "exactly one of httpHeaderName",
    );
    refused(
        dr("host: r\ntrafficPolicy: {tls: {mode: MUTUAL}}"),
        "spec.trafficPolicy.tls",
        "clientCertificate and privateKey",
    );
    refused(
        dr("host: r\ntrafficPolicy: {tls: {mode: SIMPLE, credentialName: c}}"),
        "spec.trafficPolicy.tls.credentialName",
        "certificate files",
    );
    refused(
        dr("host: r\ntrafficPolicy: {portLevelSettings: [{port: {number: 80}}, {port: {number: 80}}]}"),
        "spec.trafficPolicy.portLevelSettings[1].port",
        "two entries",
    );
    refused(
        dr("host: r\ntrafficPolicy: {connectionPool: {tcp: {connectTimeout: 0s}}}"),
        "spec.trafficPolicy.connectionPool.tcp.connectTimeout",
        "greater than 0",
    );
}

#[test]
fn istio_mutual_is_found_wherever_it_is_asked_for() {
    let spec: DestinationRuleSpec = serde_saphyr::from_str(
        "host: r\ntrafficPolicy: {tls: {mode: ISTIO_MUTUAL}}\nsubsets: [{name: v1, trafficPolicy: {portLevelSettings: [{port: {number: 80}, tls: {mode: ISTIO_MUTUAL}}]}}]",
    )
    .expect("decodes");
    assert_eq!(
        meshplane_crds::validation::traffic::istio_mutual_fields(&spec),
        vec![
            "spec.trafficPolicy.tls.mode".to_string(),
            "spec.subsets[0].trafficPolicy.portLevelSettings[0].tls.mode".to_string(),
        ]
    );
}

#[test]
fn gateway_table() {
    let http = "{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}";
    assert!(gw(&format!("servers: [{http}]")).is_ok());
    refused(gw("servers: []"), "spec.servers", "empty");
    refused(
        gw("servers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: ['*']}]"),
        "spec.servers[0].tls",
        "needs tls settings",
    );
    refused(
        gw("servers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: ['*'], tls: {mode: SIMPLE}}]"),
        "spec.servers[0].tls",
        "credentialName or serverCertificate",
    );
    refused(
        gw("servers: [{port: {number: 443, name: tls, protocol: TLS}, hosts: ['*'], tls: {mode: AUTO_PASSTHROUGH}}]"),
        "spec.servers[0].tls.mode",
        "not supported",
    );
    refused(
        gw("servers: [{port: {number: 80, name: u, protocol: UDP}, hosts: ['*']}]"),
        "spec.servers[0].port",
        "protocol",
    );
    refused(
        gw(&format!(
            "servers: [{http}, {{port: {{number: 80, name: tcp, protocol: TCP}}, hosts: ['*']}}]"
        )),
        "spec.servers[1].port",
        "one port serves one protocol",
    );
    refused(
        gw("servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['Bad NS/x.example.com']}]"),
        "spec.servers[0].hosts[0]",
        "namespace part",
    );
    refused(
        gw("servers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: ['*'], tls: {httpsRedirect: true, mode: PASSTHROUGH}}]"),
        "spec.servers[0].tls.httpsRedirect",
        "only to HTTP",
    );
}
