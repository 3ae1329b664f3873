//! Semantic rules of `VirtualService`, `DestinationRule` and `Gateway` that the schema cannot
//! express. Tenant-boundary rules (which namespaces a reference may name) live in the
//! validating webhook; what cannot apply because of other objects (an unknown subset, a host
//! claimed twice) is reported by the instance as a status condition.

use std::collections::BTreeSet;

use super::{
    validate_dns1123_label, validate_export_to, validate_host, validate_ip, validate_ip_or_cidr,
    validate_label_key, validate_label_value, validate_port, ValidationError, ValidationErrors,
};
use crate::networking::destination_rule::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, DestinationRuleSpec,
    LoadBalancerSettings, OutlierDetection, TrafficPolicy,
};
use crate::networking::gateway::{GatewaySpec, ServerTlsMode};
use crate::networking::virtual_service::{
    CorsPolicy, Destination, HeaderOperations, Headers, HttpMatchRequest, HttpRoute, StringMatch,
    VirtualServiceSpec,
};
use crate::networking::Port;

/// The reserved gateway name meaning every sidecar of the tenant.
pub const MESH_GATEWAY: &str = "mesh";

/// Envoy's retry conditions (HTTP and gRPC) that `retries.retryOn` may name besides status
/// codes.
pub const RETRY_ON: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

/// gRPC status names a fault abort may use.
pub const GRPC_STATUS: &[&str] = &[
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ValidationError {
    ValidationError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A regular expression in RE2 syntax (what Envoy compiles). The Rust `regex` crate accepts the
/// same language, without backreferences or look-around.
pub fn validate_regex(re: &str, field: &str) -> Result<(), ValidationError> {
    regex::Regex::new(re).map(|_| ()).map_err(|e| {
        invalid(
            field,
            format!("{re:?} is not an RE2 regular expression: {e}"),
        )
    })
}

/// A string match sets at most one of `exact`, `prefix`, `regex` (`required`: exactly one).
fn validate_string_match(
    m: &StringMatch,
    field: &str,
    required: bool,
    errs: &mut ValidationErrors,
) {
    let set = [m.exact.is_some(), m.prefix.is_some(), m.regex.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if set > 1 {
        errs.0
            .push(invalid(field, "set only one of exact, prefix and regex"));
    } else if set == 0 && required {
        errs.0
            .push(invalid(field, "set one of exact, prefix or regex"));
    }
    if let Some(re) = &m.regex {
        errs.check(validate_regex(re, &format!("{field}.regex")));
    }
}

/// An HTTP header name as a match or header operation may name it: a lowercase token.
fn validate_header_name(name: &str, field: &str) -> Result<(), ValidationError> {
    let token = !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        });
    if token {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("header name {name:?} must be a lowercase HTTP token"),
        ))
    }
}

fn validate_gateway_ref(entry: &str, field: &str) -> Result<(), ValidationError> {
    if entry == MESH_GATEWAY {
        return Ok(());
    }
    let (ns, name) = entry.split_once('/').unwrap_or((".", entry));
    let bad = || {
        invalid(
            field,
            format!("{entry:?} must be `mesh`, `<gateway>` or `<namespace>/<gateway>`"),
        )
    };
    if ns != "." && validate_dns1123_label(ns, field).is_err() {
        return Err(bad());
    }
    let name_ok = !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|l| validate_dns1123_label(l, field).is_ok());
    if name_ok {
        Ok(())
    } else {
        Err(bad())
    }
}

/// Whether a VirtualService applies to sidecars (`gateways` empty or naming `mesh`).
pub fn binds_mesh(gateways: &[String]) -> bool {
    gateways.is_empty() || gateways.iter().any(|g| g == MESH_GATEWAY)
}

fn validate_destination(d: &Destination, field: &str, errs: &mut ValidationErrors) {
    errs.check(validate_host(&d.host, &format!("{field}.host"), false));
    if !d.subset.is_empty() {
        errs.check(validate_dns1123_label(
            &d.subset,
            &format!("{field}.subset"),
        ));
    }
    if let Some(p) = &d.port {
        if p.number == 0 || p.number > 65535 {
            errs.0.push(ValidationError::InvalidPort {
                field: format!("{field}.port"),
                reason: format!("number {} is outside 1-65535", p.number),
            });
        }
    }
}

fn validate_labels(
    labels: &std::collections::BTreeMap<String, String>,
    field: &str,
    errs: &mut ValidationErrors,
) {
    for (k, v) in labels {
        errs.check(validate_label_key(k, field));
        errs.check(validate_label_value(v, field));
    }
}

fn validate_percent(value: f64, field: &str, errs: &mut ValidationErrors) {
    if !(0.0..=100.0).contains(&value) || value.is_nan() {
        errs.0
            .push(invalid(field, format!("{value} is outside 0-100")));
    }
}

fn validate_header_ops(ops: &HeaderOperations, field: &str, errs: &mut ValidationErrors) {
    let names = ops
        .set
        .keys()
        .map(|k| (k, "set"))
        .chain(ops.add.keys().map(|k| (k, "add")))
        .chain(ops.remove.iter().map(|k| (k, "remove")));
    for (name, op) in names {
        let f = format!("{field}.{op}");
        let lower = name.to_ascii_lowercase();
        if lower.starts_with(':') || lower == "host" {
            errs.0.push(invalid(
                &f,
                format!("{name:?} cannot be changed by header rules; use rewrite.authority"),
            ));
            continue;
        }
        errs.check(validate_header_name(&lower, &f));
    }
}

fn validate_headers(h: &Headers, field: &str, errs: &mut ValidationErrors) {
    if let Some(r) = &h.request {
        validate_header_ops(r, &format!("{field}.request"), errs);
    }
    if let Some(r) = &h.response {
        validate_header_ops(r, &format!("{field}.response"), errs);
    }
}

fn validate_match(m: &HttpMatchRequest, field: &str, errs: &mut ValidationErrors) {
    for (name, value) in [
        ("uri", &m.uri),
        ("scheme", &m.scheme),
        ("method", &m.method),
        ("authority", &m.authority),
    ] {
        if let Some(v) = value {
            validate_string_match(v, &format!("{field}.{name}"), true, errs);
        }
    }
    for (kind, map) in [
        ("headers", &m.headers),
        ("withoutHeaders", &m.without_headers),
    ] {
        for (name, v) in map {
            let f = format!("{field}.{kind}[{name}]");
            errs.check(validate_header_name(name, &f));
            validate_string_match(v, &f, false, errs);
        }
    }
    for (name, v) in &m.query_params {
        let f = format!("{field}.queryParams[{name}]");
        if name.is_empty() {
            errs.0.push(invalid(&f, "query parameter name is empty"));
        }
        if v.prefix.is_some() {
            errs.0.push(invalid(
                &f,
                "query parameters match by exact or regex only (as in Istio)",
            ));
        }
        validate_string_match(v, &f, false, errs);
    }
    validate_labels(&m.source_labels, &format!("{field}.sourceLabels"), errs);
    for (i, g) in m.gateways.iter().enumerate() {
        errs.check(validate_gateway_ref(g, &format!("{field}.gateways[{i}]")));
    }
    if !m.source_namespace.is_empty() {
        errs.check(validate_dns1123_label(
            &m.source_namespace,
            &format!("{field}.sourceNamespace"),
        ));
    }
}

fn validate_retry_on(retry_on: &str, field: &str) -> Result<(), ValidationError> {
    for cond in retry_on.split(',').map(str::trim) {
        if cond.is_empty() || RETRY_ON.contains(&cond) {
            continue;
        }
        match cond.parse::<u32>() {
            Ok(code) if (100..=599).contains(&code) => {}
            _ => {
                return Err(invalid(
                    field,
                    format!(
                        "{cond:?} is neither a status code nor one of {}",
                        RETRY_ON.join(", ")
                    ),
                ))
            }
        }
    }
    Ok(())
}

fn validate_cors(c: &CorsPolicy, field: &str, errs: &mut ValidationErrors) {
    for (i, o) in c.allow_origins.iter().enumerate() {
        validate_string_match(o, &format!("{field}.allowOrigins[{i}]"), true, errs);
    }
    for (kind, list) in [
        ("allowHeaders", &c.allow_headers),
        ("exposeHeaders", &c.expose_headers),
    ] {
        for (i, h) in list.iter().enumerate() {
            if h != "*" {
                errs.check(validate_header_name(
                    &h.to_ascii_lowercase(),
                    &format!("{field}.{kind}[{i}]"),
                ));
            }
        }
    }
    for (i, m) in c.allow_methods.iter().enumerate() {
        if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic() || b == b'*') {
            errs.0.push(invalid(
                format!("{field}.allowMethods[{i}]"),
                format!("{m:?} is not an HTTP method"),
            ));
        }
    }
}

fn validate_http_route(r: &HttpRoute, field: &str, errs: &mut ValidationErrors) {
    let actions = [
        !r.route.is_empty(),
        r.redirect.is_some(),
        r.direct_response.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if actions != 1 {
        errs.0.push(invalid(
            field,
            "set exactly one of route, redirect and directResponse",
        ));
    }
    for (i, m) in r.match_.iter().enumerate() {
        validate_match(m, &format!("{field}.match[{i}]"), errs);
    }
    let mut total: i64 = 0;
    for (i, d) in r.route.iter().enumerate() {
        let f = format!("{field}.route[{i}]");
        validate_destination(&d.destination, &format!("{f}.destination"), errs);
        let w = d.weight.unwrap_or(0);
        if w < 0 {
            errs.0
                .push(invalid(format!("{f}.weight"), "must not be negative"));
        }
        total += i64::from(w.max(0));
        if let Some(h) = &d.headers {
            validate_headers(h, &format!("{f}.headers"), errs);
        }
    }
    if r.route.len() > 1 && total == 0 {
        errs.0.push(invalid(
            format!("{field}.route"),
            "several destinations need weights (that add up to 100)",
        ));
    }
    if let Some(red) = &r.redirect {
        if let Some(code) = red.redirect_code {
            if ![301, 302, 303, 307, 308].contains(&code) {
                errs.0.push(invalid(
                    format!("{field}.redirect.redirectCode"),
                    format!("{code} is not a redirect status (301, 302, 303, 307, 308)"),
                ));
            }
        }
        if red.port.is_some() && red.derive_port.is_some() {
            errs.0.push(invalid(
                format!("{field}.redirect"),
                "set port or derivePort, not both",
            ));
        }
        if !red.scheme.is_empty() && !matches!(red.scheme.as_str(), "http" | "https") {
            errs.0.push(invalid(
                format!("{field}.redirect.scheme"),
                "must be http or https",
            ));
        }
        if r.rewrite.is_some() {
            errs.0.push(invalid(
                format!("{field}.rewrite"),
                "cannot be combined with redirect",
            ));
        }
    }
    if let Some(dr) = &r.direct_response {
        if let Some(body) = &dr.body {
            if body.string.is_some() == body.bytes.is_some() {
                errs.0.push(invalid(
                    format!("{field}.directResponse.body"),
                    "set exactly one of string and bytes",
                ));
            }
            if let Some(b) = &body.bytes {
                if !is_base64(b) {
                    errs.0.push(invalid(
                        format!("{field}.directResponse.body.bytes"),
                        "must be base64",
                    ));
                }
            }
        }
    }
    if let Some(rw) = &r.rewrite {
        if !rw.uri.is_empty() && rw.uri_regex_rewrite.is_some() {
            errs.0.push(invalid(
                format!("{field}.rewrite"),
                "set uri or uriRegexRewrite, not both",
            ));
        }
        if let Some(rr) = &rw.uri_regex_rewrite {
            errs.check(validate_regex(
                &rr.match_,
                &format!("{field}.rewrite.uriRegexRewrite.match"),
            ));
        }
    }
    if let Some(retry) = &r.retries {
        if retry.attempts < 0 {
            errs.0.push(invalid(
                format!("{field}.retries.attempts"),
                "must not be negative",
            ));
        }
        errs.check(validate_retry_on(
            &retry.retry_on,
            &format!("{field}.retries.retryOn"),
        ));
    }
    if let Some(fault) = &r.fault {
        if fault.delay.is_none() && fault.abort.is_none() {
            errs.0.push(invalid(
                format!("{field}.fault"),
                "set delay, abort or both",
            ));
        }
        if let Some(p) = fault.delay.as_ref().and_then(|d| d.percentage) {
            validate_percent(p.value, &format!("{field}.fault.delay.percentage"), errs);
        }
        if let Some(p) = fault.delay.as_ref().and_then(|d| d.percent) {
            validate_percent(f64::from(p), &format!("{field}.fault.delay.percent"), errs);
        }
        if let Some(a) = &fault.abort {
            let f = format!("{field}.fault.abort");
            match (&a.http_status, &a.grpc_status) {
                (Some(_), Some(_)) | (None, None) => errs
                    .0
                    .push(invalid(&f, "set exactly one of httpStatus and grpcStatus")),
                (None, Some(g)) => {
                    let known = GRPC_STATUS.contains(&g.as_str())
                        || g.parse::<u32>().is_ok_and(|n| n <= 16);
                    if !known {
                        errs.0.push(invalid(
                            format!("{f}.grpcStatus"),
                            format!("{g:?} is not a gRPC status name or number"),
                        ));
                    }
                }
                (Some(_), None) => {}
            }
            if let Some(p) = a.percentage {
                validate_percent(p.value, &format!("{f}.percentage"), errs);
            }
        }
    }
    if let Some(m) = &r.mirror {
        validate_destination(m, &format!("{field}.mirror"), errs);
        if !r.mirrors.is_empty() {
            errs.0.push(invalid(
                format!("{field}.mirrors"),
                "set mirror or mirrors, not both",
            ));
        }
    } else if r.mirror_percentage.is_some() {
        errs.0
            .push(invalid(format!("{field}.mirrorPercentage"), "needs mirror"));
    } else if r.mirror_percent.is_some() {
        errs.0
            .push(invalid(format!("{field}.mirrorPercent"), "needs mirror"));
    }
    if r.mirror_percent.is_some_and(|p| p > 100) {
        errs.0.push(invalid(
            format!("{field}.mirrorPercent"),
            "must be at most 100",
        ));
    }
    if let Some(p) = r.mirror_percentage {
        validate_percent(p.value, &format!("{field}.mirrorPercentage"), errs);
    }
    for (i, m) in r.mirrors.iter().enumerate() {
        let f = format!("{field}.mirrors[{i}]");
        validate_destination(&m.destination, &format!("{f}.destination"), errs);
        if let Some(p) = m.percentage {
            validate_percent(p.value, &format!("{f}.percentage"), errs);
        }
    }
    if let Some(c) = &r.cors_policy {
        validate_cors(c, &format!("{field}.corsPolicy"), errs);
    }
    if let Some(h) = &r.headers {
        validate_headers(h, &format!("{field}.headers"), errs);
    }
}

fn is_base64(s: &str) -> bool {
    let trimmed = s.trim_end_matches('=');
    s.len().is_multiple_of(4)
        && s.len() - trimmed.len() <= 2
        && trimmed
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

fn validate_l4_common(
    subnets: &[String],
    source_labels: &std::collections::BTreeMap<String, String>,
    gateways: &[String],
    source_namespace: &str,
    field: &str,
    errs: &mut ValidationErrors,
) {
    for (i, s) in subnets.iter().enumerate() {
        errs.check(validate_ip_or_cidr(
            s,
            &format!("{field}.destinationSubnets[{i}]"),
        ));
    }
    validate_labels(source_labels, &format!("{field}.sourceLabels"), errs);
    for (i, g) in gateways.iter().enumerate() {
        errs.check(validate_gateway_ref(g, &format!("{field}.gateways[{i}]")));
    }
    if !source_namespace.is_empty() {
        errs.check(validate_dns1123_label(
            source_namespace,
            &format!("{field}.sourceNamespace"),
        ));
    }
}

fn validate_l4_route(
    route: &[crate::networking::virtual_service::RouteDestination],
    field: &str,
    errs: &mut ValidationErrors,
) {
    if route.is_empty() {
        errs.0
            .push(invalid(field, "needs at least one destination"));
    }
    let mut total = 0i64;
    for (i, d) in route.iter().enumerate() {
        validate_destination(&d.destination, &format!("{field}[{i}].destination"), errs);
        let w = d.weight.unwrap_or(0);
        if w < 0 {
            errs.0.push(invalid(
                format!("{field}[{i}].weight"),
                "must not be negative",
            ));
        }
        total += i64::from(w.max(0));
    }
    if route.len() > 1 && total == 0 {
        errs.0.push(invalid(
            field,
            "several destinations need weights (that add up to 100)",
        ));
    }
}

/// Validates a VirtualService spec.
pub fn validate_virtual_service(spec: &VirtualServiceSpec) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    let mesh = binds_mesh(&spec.gateways);
    if spec.hosts.is_empty() {
        errs.0.push(ValidationError::Empty {
            field: "spec.hosts".into(),
        });
    }
    for (i, h) in spec.hosts.iter().enumerate() {
        // `*` alone makes sense only on a gateway: a sidecar cannot route "every host".
        errs.check(validate_host(h, &format!("spec.hosts[{i}]"), !mesh));
        if h.parse::<std::net::IpAddr>().is_ok() && mesh {
            errs.0.push(invalid(
                format!("spec.hosts[{i}]"),
                "IP addresses are allowed only for gateways",
            ));
        }
    }
    for (i, g) in spec.gateways.iter().enumerate() {
        errs.check(validate_gateway_ref(g, &format!("spec.gateways[{i}]")));
    }
    if spec.http.is_empty() && spec.tls.is_empty() && spec.tcp.is_empty() {
        errs.0
            .push(invalid("spec", "set at least one of http, tls and tcp"));
    }
    for (i, r) in spec.http.iter().enumerate() {
        validate_http_route(r, &format!("spec.http[{i}]"), &mut errs);
    }
    for (i, r) in spec.tls.iter().enumerate() {
        let field = format!("spec.tls[{i}]");
        for (j, m) in r.match_.iter().enumerate() {
            let f = format!("{field}.match[{j}]");
            if m.sni_hosts.is_empty() {
                errs.0.push(ValidationError::Empty {
                    field: format!("{f}.sniHosts"),
                });
            }
            for (k, h) in m.sni_hosts.iter().enumerate() {
                errs.check(validate_host(h, &format!("{f}.sniHosts[{k}]"), true));
            }
            validate_l4_common(
                &m.destination_subnets,
                &m.source_labels,
                &m.gateways,
                &m.source_namespace,
                &f,
                &mut errs,
            );
        }
        if r.match_.is_empty() {
            errs.0.push(ValidationError::Empty {
                field: format!("{field}.match"),
            });
        }
        validate_l4_route(&r.route, &format!("{field}.route"), &mut errs);
    }
    for (i, r) in spec.tcp.iter().enumerate() {
        let field = format!("spec.tcp[{i}]");
        for (j, m) in r.match_.iter().enumerate() {
            validate_l4_common(
                &m.destination_subnets,
                &m.source_labels,
                &m.gateways,
                &m.source_namespace,
                &format!("{field}.match[{j}]"),
                &mut errs,
            );
        }
        validate_l4_route(&r.route, &format!("{field}.route"), &mut errs);
    }
    errs.check(validate_export_to(&spec.export_to, "spec.exportTo"));
    errs.into_result()
}

fn validate_load_balancer(lb: &LoadBalancerSettings, field: &str, errs: &mut ValidationErrors) {
    if lb.simple.is_some() && lb.consistent_hash.is_some() {
        errs.0
            .push(invalid(field, "set simple or consistentHash, not both"));
    }
    if let Some(ch) = &lb.consistent_hash {
        let f = format!("{field}.consistentHash");
        let keys = [
            ch.http_header_name.is_some(),
            ch.http_cookie.is_some(),
            ch.use_source_ip == Some(true),
            ch.http_query_parameter_name.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if keys != 1 {
            errs.0.push(invalid(
                &f,
                "set exactly one of httpHeaderName, httpCookie, useSourceIp and httpQueryParameterName",
            ));
        }
        if ch.ring_hash.is_some() && ch.maglev.is_some() {
            errs.0.push(invalid(&f, "set ringHash or maglev, not both"));
        }
        if let Some(h) = &ch.http_header_name {
            errs.check(validate_header_name(
                &h.to_ascii_lowercase(),
                &format!("{f}.httpHeaderName"),
            ));
        }
    }
}

fn validate_connection_pool(cp: &ConnectionPoolSettings, field: &str, errs: &mut ValidationErrors) {
    if let Some(tcp) = &cp.tcp {
        if tcp
            .connect_timeout
            .as_ref()
            .is_some_and(|d| d.get().is_zero())
        {
            errs.0.push(invalid(
                format!("{field}.tcp.connectTimeout"),
                "must be greater than 0",
            ));
        }
    }
}

fn validate_outlier(od: &OutlierDetection, field: &str, errs: &mut ValidationErrors) {
    if od.consecutive_errors.is_some_and(|n| n < 0) {
        errs.0.push(invalid(
            format!("{field}.consecutiveErrors"),
            "cannot be negative",
        ));
    }
    if od
        .interval
        .as_ref()
        .is_some_and(|d| d.get().as_millis() < 1)
    {
        errs.0
            .push(invalid(format!("{field}.interval"), "must be at least 1ms"));
    }
    if od
        .base_ejection_time
        .as_ref()
        .is_some_and(|d| d.get().as_millis() < 1)
    {
        errs.0.push(invalid(
            format!("{field}.baseEjectionTime"),
            "must be at least 1ms",
        ));
    }
}

fn validate_client_tls(tls: &ClientTlsSettings, field: &str, errs: &mut ValidationErrors) {
    if !tls.credential_name.is_empty() {
        errs.0.push(invalid(
            format!("{field}.credentialName"),
            "not supported: give certificate files (caCertificates, clientCertificate, privateKey) instead",
        ));
    }
    match tls.mode {
        ClientTlsMode::Mutual
            if tls.client_certificate.is_empty() || tls.private_key.is_empty() =>
        {
            errs.0.push(invalid(
                field,
                "MUTUAL needs clientCertificate and privateKey",
            ));
        }
        ClientTlsMode::Disable | ClientTlsMode::IstioMutual
            if !(tls.client_certificate.is_empty()
                && tls.private_key.is_empty()
                && tls.ca_certificates.is_empty()) =>
        {
            errs.0.push(invalid(
                field,
                "certificate files apply only to SIMPLE and MUTUAL",
            ));
        }
        _ => {}
    }
    if tls.insecure_skip_verify == Some(true) && !tls.ca_certificates.is_empty() {
        errs.0.push(invalid(
            field,
            "insecureSkipVerify cannot be combined with caCertificates",
        ));
    }
    for (i, san) in tls.subject_alt_names.iter().enumerate() {
        if san.is_empty() {
            errs.0.push(ValidationError::Empty {
                field: format!("{field}.subjectAltNames[{i}]"),
            });
        }
    }
}

fn validate_traffic_policy(p: &TrafficPolicy, field: &str, errs: &mut ValidationErrors) {
    if let Some(lb) = &p.load_balancer {
        validate_load_balancer(lb, &format!("{field}.loadBalancer"), errs);
    }
    if let Some(cp) = &p.connection_pool {
        validate_connection_pool(cp, &format!("{field}.connectionPool"), errs);
    }
    if let Some(od) = &p.outlier_detection {
        validate_outlier(od, &format!("{field}.outlierDetection"), errs);
    }
    if let Some(tls) = &p.tls {
        validate_client_tls(tls, &format!("{field}.tls"), errs);
    }
    let mut ports = BTreeSet::new();
    for (i, pl) in p.port_level_settings.iter().enumerate() {
        let f = format!("{field}.portLevelSettings[{i}]");
        if pl.port.number == 0 || pl.port.number > 65535 {
            errs.0.push(ValidationError::InvalidPort {
                field: format!("{f}.port"),
                reason: format!("number {} is outside 1-65535", pl.port.number),
            });
        }
        if !ports.insert(pl.port.number) {
            errs.0.push(ValidationError::InvalidPort {
                field: format!("{f}.port"),
                reason: format!("port {} has two entries", pl.port.number),
            });
        }
        if let Some(lb) = &pl.load_balancer {
            validate_load_balancer(lb, &format!("{f}.loadBalancer"), errs);
        }
        if let Some(cp) = &pl.connection_pool {
            validate_connection_pool(cp, &format!("{f}.connectionPool"), errs);
        }
        if let Some(od) = &pl.outlier_detection {
            validate_outlier(od, &format!("{f}.outlierDetection"), errs);
        }
        if let Some(tls) = &pl.tls {
            validate_client_tls(tls, &format!("{f}.tls"), errs);
        }
    }
}

/// Validates a DestinationRule spec.
pub fn validate_destination_rule(spec: &DestinationRuleSpec) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    errs.check(validate_host(&spec.host, "spec.host", false));
    if let Some(p) = &spec.traffic_policy {
        validate_traffic_policy(p, "spec.trafficPolicy", &mut errs);
    }
    let mut names = BTreeSet::new();
    for (i, s) in spec.subsets.iter().enumerate() {
        let f = format!("spec.subsets[{i}]");
        errs.check(validate_dns1123_label(&s.name, &format!("{f}.name")));
        if !names.insert(s.name.as_str()) {
            errs.0.push(invalid(
                format!("{f}.name"),
                format!("subset {:?} is declared twice", s.name),
            ));
        }
        validate_labels(&s.labels, &format!("{f}.labels"), &mut errs);
        if let Some(p) = &s.traffic_policy {
            validate_traffic_policy(p, &format!("{f}.trafficPolicy"), &mut errs);
        }
    }
    errs.check(validate_export_to(&spec.export_to, "spec.exportTo"));
    errs.into_result()
}

/// Protocols a Gateway server may declare.
pub const GATEWAY_PROTOCOLS: &[&str] = &[
    "HTTP", "HTTPS", "HTTP2", "GRPC", "GRPC-WEB", "TLS", "TCP", "MONGO", "MYSQL", "REDIS",
];

/// A Gateway server host `[namespace/]host`.
pub fn validate_gateway_host(entry: &str, field: &str) -> Result<(), ValidationError> {
    let (ns, host) = entry.split_once('/').unwrap_or(("*", entry));
    match ns {
        "." | "*" => {}
        other => {
            if validate_dns1123_label(other, field).is_err() {
                return Err(ValidationError::InvalidHost {
                    field: field.into(),
                    value: entry.into(),
                    reason: "namespace part must be '.', '*' or a namespace name".into(),
                });
            }
        }
    }
    if host.parse::<std::net::IpAddr>().is_ok() {
        return validate_ip(host, field);
    }
    validate_host(host, field, true)
}

/// Validates a Gateway spec.
pub fn validate_gateway(spec: &GatewaySpec) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if spec.servers.is_empty() {
        errs.0.push(ValidationError::Empty {
            field: "spec.servers".into(),
        });
    }
    validate_labels(&spec.selector, "spec.selector", &mut errs);
    let mut names = BTreeSet::new();
    let mut protocols: Vec<(u32, String)> = Vec::new();
    for (i, s) in spec.servers.iter().enumerate() {
        let f = format!("spec.servers[{i}]");
        errs.check(validate_server_port(&s.port, &format!("{f}.port")));
        let proto = s.port.protocol.to_ascii_uppercase();
        if let Some((_, other)) = protocols
            .iter()
            .find(|(n, p)| *n == s.port.number && !same_family(p, &proto))
        {
            errs.0.push(ValidationError::InvalidPort {
                field: format!("{f}.port"),
                reason: format!(
                    "port {} is already declared with protocol {other}; one port serves one protocol",
                    s.port.number
                ),
            });
        }
        protocols.push((s.port.number, proto.clone()));
        if !s.name.is_empty() && !names.insert(s.name.as_str()) {
            errs.0.push(invalid(
                format!("{f}.name"),
                format!("server name {:?} is used twice", s.name),
            ));
        }
        if s.hosts.is_empty() {
            errs.0.push(ValidationError::Empty {
                field: format!("{f}.hosts"),
            });
        }
        for (j, h) in s.hosts.iter().enumerate() {
            errs.check(validate_gateway_host(h, &format!("{f}.hosts[{j}]")));
        }
        if !s.bind.is_empty() {
            errs.check(validate_ip(&s.bind, &format!("{f}.bind")));
        }
        let tls_protocol = matches!(proto.as_str(), "HTTPS" | "TLS");
        match &s.tls {
            None if tls_protocol => errs.0.push(invalid(
                format!("{f}.tls"),
                format!("a {proto} server needs tls settings"),
            )),
            None => {}
            Some(tls) => {
                let tf = format!("{f}.tls");
                if tls.https_redirect && proto != "HTTP" {
                    errs.0.push(invalid(
                        format!("{tf}.httpsRedirect"),
                        "applies only to HTTP servers",
                    ));
                }
                match tls.mode {
                    None if tls_protocol => errs.0.push(invalid(
                        format!("{tf}.mode"),
                        "set the TLS mode",
                    )),
                    Some(mode) if !tls_protocol => errs.0.push(invalid(
                        format!("{tf}.mode"),
                        format!("TLS mode {mode:?} needs protocol HTTPS or TLS"),
                    )),
                    Some(ServerTlsMode::Simple) | Some(ServerTlsMode::Mutual)
                    | Some(ServerTlsMode::OptionalMutual) => {
                        let files = !tls.server_certificate.is_empty()
                            && !tls.private_key.is_empty();
                        if tls.credential_name.is_empty() && !files {
                            errs.0.push(invalid(
                                &tf,
                                "terminating TLS needs credentialName or serverCertificate and privateKey",
                            ));
                        }
                        if tls.mode != Some(ServerTlsMode::Simple)
                            && tls.credential_name.is_empty()
                            && tls.ca_certificates.is_empty()
                        {
                            errs.0.push(invalid(
                                &tf,
                                "MUTUAL needs caCertificates or a credentialName Secret with ca.crt",
                            ));
                        }
                    }
                    Some(ServerTlsMode::Passthrough) if proto == "HTTPS" || proto == "TLS" => {}
                    Some(ServerTlsMode::AutoPassthrough) => errs.0.push(invalid(
                        format!("{tf}.mode"),
                        "AUTO_PASSTHROUGH (multi-cluster SNI routing) is not supported; use PASSTHROUGH with a VirtualService tls route",
                    )),
                    _ => {}
                }
                if let (Some(min), Some(max)) = (tls.min_protocol_version, tls.max_protocol_version)
                {
                    if min > max {
                        errs.0.push(invalid(
                            &tf,
                            "minProtocolVersion is above maxProtocolVersion",
                        ));
                    }
                }
            }
        }
    }
    errs.into_result()
}

/// HTTP, HTTP2 and GRPC share an HTTP listener; TLS-terminated HTTPS and passthrough TLS share
/// a TLS listener (by SNI).
fn same_family(a: &str, b: &str) -> bool {
    let family = |p: &str| match p {
        "HTTP" | "HTTP2" | "GRPC" | "GRPC-WEB" => "http",
        "HTTPS" | "TLS" => "tls",
        _ => "tcp",
    };
    family(a) == family(b)
}

fn validate_server_port(port: &Port, field: &str) -> Result<(), ValidationError> {
    validate_port(port, field)?;
    let proto = port.protocol.to_ascii_uppercase();
    if !GATEWAY_PROTOCOLS.contains(&proto.as_str()) {
        return Err(ValidationError::InvalidPort {
            field: field.into(),
            reason: format!(
                "protocol {:?} is not one a gateway serves; use one of {}",
                port.protocol,
                GATEWAY_PROTOCOLS.join(", ")
            ),
        });
    }
    if port.name.is_empty() {
        return Err(ValidationError::Empty {
            field: format!("{field}.name"),
        });
    }
    Ok(())
}

/// Fields of a DestinationRule that ask for `ISTIO_MUTUAL` (which needs the tenant's workload
/// identity).
pub fn istio_mutual_fields(spec: &DestinationRuleSpec) -> Vec<String> {
    let mut out = Vec::new();
    let mut visit = |p: &TrafficPolicy, field: &str| {
        if p.tls
            .as_ref()
            .is_some_and(|t| t.mode == ClientTlsMode::IstioMutual)
        {
            out.push(format!("{field}.tls.mode"));
        }
        for (i, pl) in p.port_level_settings.iter().enumerate() {
            if pl
                .tls
                .as_ref()
                .is_some_and(|t| t.mode == ClientTlsMode::IstioMutual)
            {
                out.push(format!("{field}.portLevelSettings[{i}].tls.mode"));
            }
        }
    };
    if let Some(p) = &spec.traffic_policy {
        visit(p, "spec.trafficPolicy");
    }
    for (i, s) in spec.subsets.iter().enumerate() {
        if let Some(p) = &s.traffic_policy {
            visit(p, &format!("spec.subsets[{i}].trafficPolicy"));
        }
    }
    out
}

/// Servers of a Gateway that ask for `ISTIO_MUTUAL`.
pub fn gateway_istio_mutual_fields(spec: &GatewaySpec) -> Vec<String> {
    spec.servers
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            s.tls
                .as_ref()
                .is_some_and(|t| t.mode == Some(ServerTlsMode::IstioMutual))
        })
        .map(|(i, _)| format!("spec.servers[{i}].tls.mode"))
        .collect()
}

/// The deprecated fields of a VirtualService that Istio still accepts, one message each: the
/// field, and what meshplane reads it as. The admission webhook returns them as warnings.
pub fn deprecated_virtual_service_fields(spec: &VirtualServiceSpec) -> Vec<String> {
    let mut out = Vec::new();
    for (i, r) in spec.http.iter().enumerate() {
        if r.fault
            .as_ref()
            .and_then(|f| f.delay.as_ref())
            .is_some_and(|d| d.percent.is_some())
        {
            out.push(format!(
                "spec.http[{i}].fault.delay.percent is deprecated: read as fault.delay.percentage.value (which wins when both are set); write percentage instead"
            ));
        }
        if r.mirror_percent.is_some() {
            out.push(format!(
                "spec.http[{i}].mirrorPercent is deprecated: read as mirrorPercentage.value (which wins when both are set); write mirrorPercentage instead"
            ));
        }
    }
    out
}

/// The deprecated fields of a DestinationRule that Istio still accepts (see
/// [`deprecated_virtual_service_fields`]).
pub fn deprecated_destination_rule_fields<'a>(spec: &'a DestinationRuleSpec) -> Vec<String> {
    let mut policies: Vec<(String, &'a OutlierDetection)> = Vec::new();
    let mut add = |field: String, policy: Option<&'a TrafficPolicy>| {
        let Some(p) = policy else { return };
        if let Some(od) = &p.outlier_detection {
            policies.push((format!("{field}.outlierDetection"), od));
        }
        for (j, pl) in p.port_level_settings.iter().enumerate() {
            if let Some(od) = &pl.outlier_detection {
                policies.push((
                    format!("{field}.portLevelSettings[{j}].outlierDetection"),
                    od,
                ));
            }
        }
    };
    add("spec.trafficPolicy".into(), spec.traffic_policy.as_ref());
    for (i, s) in spec.subsets.iter().enumerate() {
        add(
            format!("spec.subsets[{i}].trafficPolicy"),
            s.traffic_policy.as_ref(),
        );
    }
    policies
        .into_iter()
        .filter(|(_, od)| od.consecutive_errors.is_some())
        .map(|(field, _)| format!(
            "{field}.consecutiveErrors is deprecated: read as consecutiveGatewayErrors with 5xx answers not counted, as Istio does (consecutiveGatewayErrors and consecutive5xxErrors win where set); write those instead"
        ))
        .collect()
}

#[cfg(test)]
mod deprecated_tests {
    use super::*;

    fn vs(yaml: serde_json::Value) -> VirtualServiceSpec {
        serde_json::from_value(yaml).expect("a VirtualService spec")
    }

    #[test]
    fn deprecated_fields_are_named_read_as_their_replacements_and_checked() {
        let spec = vs(serde_json::json!({"hosts": ["r"], "http": [{
            "route": [{"destination": {"host": "r"}}],
            "fault": {"delay": {"percent": 50, "fixedDelay": "1s"}},
            "mirror": {"host": "m"}, "mirrorPercent": 10
        }]}));
        assert_eq!(validate_virtual_service(&spec), Ok(()));
        let warnings = deprecated_virtual_service_fields(&spec);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("spec.http[0].fault.delay.percent is deprecated"));
        assert!(warnings[1].starts_with("spec.http[0].mirrorPercent is deprecated"));
        let route = &spec.http[0];
        let delay = route
            .fault
            .as_ref()
            .and_then(|f| f.delay.as_ref())
            .expect("delay");
        assert_eq!(delay.effective_percentage().map(|p| p.value), Some(50.0));
        assert_eq!(
            route.effective_mirror_percentage().map(|p| p.value),
            Some(10.0)
        );
        // Both set: the replacement wins, as Istio reads them.
        let both = vs(serde_json::json!({"hosts": ["r"], "http": [{
            "route": [{"destination": {"host": "r"}}],
            "fault": {"delay": {"percent": 50, "percentage": {"value": 1.5}, "fixedDelay": "1s"}},
            "mirror": {"host": "m"}, "mirrorPercent": 10, "mirrorPercentage": {"value": 20.0}
        }]}));
        let route = &both.http[0];
        let delay = route
            .fault
            .as_ref()
            .and_then(|f| f.delay.as_ref())
            .expect("delay");
        assert_eq!(delay.effective_percentage().map(|p| p.value), Some(1.5));
        assert_eq!(
            route.effective_mirror_percentage().map(|p| p.value),
            Some(20.0)
        );
        // Out of range, or a mirror share without a mirror: refused.
        let bad = vs(serde_json::json!({"hosts": ["r"], "http": [{
            "route": [{"destination": {"host": "r"}}],
            "fault": {"delay": {"percent": 150, "fixedDelay": "1s"}},
            "mirrorPercent": 10
        }]}));
        let errors = validate_virtual_service(&bad)
            .expect_err("refused")
            .to_string();
        assert!(
            errors.contains("spec.http[0].fault.delay.percent"),
            "{errors}"
        );
        assert!(
            errors.contains("spec.http[0].mirrorPercent: needs mirror"),
            "{errors}"
        );
        let clean = vs(
            serde_json::json!({"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}]}),
        );
        assert!(deprecated_virtual_service_fields(&clean).is_empty());
    }

    #[test]
    fn deprecated_consecutive_errors_are_found_at_every_level() {
        let spec: DestinationRuleSpec = serde_json::from_value(serde_json::json!({
            "host": "r",
            "trafficPolicy": {"outlierDetection": {"consecutiveErrors": 1},
                "portLevelSettings": [{"port": {"number": 80}, "outlierDetection": {"consecutiveErrors": 2}}]},
            "subsets": [{"name": "v1", "labels": {"v": "1"},
                "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 2}}},
                {"name": "v2", "labels": {"v": "2"},
                "trafficPolicy": {"outlierDetection": {"consecutiveErrors": 3}}}]
        }))
        .expect("a DestinationRule spec");
        assert_eq!(validate_destination_rule(&spec), Ok(()));
        let fields: Vec<String> = deprecated_destination_rule_fields(&spec)
            .iter()
            .map(|w| w.split(' ').next().unwrap_or_default().to_string())
            .collect();
        assert_eq!(
            fields,
            [
                "spec.trafficPolicy.outlierDetection.consecutiveErrors",
                "spec.trafficPolicy.portLevelSettings[0].outlierDetection.consecutiveErrors",
                "spec.subsets[1].trafficPolicy.outlierDetection.consecutiveErrors",
            ]
        );
    }
}
