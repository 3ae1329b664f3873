//! Readable one-line descriptions of routes and cluster policies for golden files.

use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::HeaderValueOption;
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::query_parameter_matcher::QueryParameterMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy::PolicySpecifier;
use envoy_types::pb::envoy::config::route::v3::route_action::{
    ClusterSpecifier, HostRewriteSpecifier,
};
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteMatch};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::fault_delay::FaultDelaySecifier;
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::fault_abort::ErrorType;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher;
use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
use envoy_types::pb::google::protobuf::Duration;
use prost::Message;

fn dur(d: &Option<Duration>) -> String {
    match d {
        Some(d) if d.nanos == 0 => format!("{}s", d.seconds),
        Some(d) => format!("{}ms", d.seconds * 1000 + i64::from(d.nanos / 1_000_000)),
        None => "-".into(),
    }
}

fn pct(p: &Option<FractionalPercent>) -> String {
    p.as_ref()
        .map(|p| format!("{}%", f64::from(p.numerator) / 10_000.0))
        .unwrap_or_else(|| "100%".into())
}

fn string_matcher(m: &Option<StringMatcher>) -> String {
    match m.as_ref().and_then(|m| m.match_pattern.as_ref()) {
        Some(MatchPattern::Exact(e)) => format!("={e}"),
        Some(MatchPattern::Prefix(p)) => format!("^{p}"),
        Some(MatchPattern::SafeRegex(r)) => format!("~{}", r.regex),
        _ => "?".into(),
    }
}

fn describe_match(m: &RouteMatch) -> String {
    let mut parts = vec![match &m.path_specifier {
        Some(PathSpecifier::Prefix(p)) => format!("prefix={p}"),
        Some(PathSpecifier::Path(p)) => format!("path={p}"),
        Some(PathSpecifier::SafeRegex(r)) => format!("regex={}", r.regex),
        _ => "?".into(),
    }];
    if m.case_sensitive.as_ref().is_some_and(|c| !c.value) {
        parts.push("nocase".into());
    }
    for h in &m.headers {
        let v = match &h.header_match_specifier {
            Some(HeaderMatchSpecifier::StringMatch(sm)) => string_matcher(&Some(sm.clone())),
            Some(HeaderMatchSpecifier::PresentMatch(_)) => "(present)".into(),
            _ => "?".into(),
        };
        parts.push(format!(
            "{}{}{v}",
            if h.invert_match { "!" } else { "" },
            h.name
        ));
    }
    for q in &m.query_parameters {
        let v = match &q.query_parameter_match_specifier {
            Some(QueryParameterMatchSpecifier::StringMatch(sm)) => {
                string_matcher(&Some(sm.clone()))
            }
            Some(QueryParameterMatchSpecifier::PresentMatch(_)) => "(present)".into(),
            None => "?".into(),
        };
        parts.push(format!("?{}{v}", q.name));
    }
    parts.join(" ")
}

fn headers(prefix: &str, add: &[HeaderValueOption], remove: &[String]) -> Vec<String> {
    let mut out: Vec<String> = add
        .iter()
        .filter_map(|h| h.header.as_ref().map(|v| (v, h.append_action)))
        .map(|(v, a)| {
            format!(
                "{prefix}{}{}={}",
                if a == 0 { "+" } else { "=" },
                v.key,
                v.value
            )
        })
        .collect();
    out.extend(remove.iter().map(|r| format!("{prefix}-{r}")));
    out
}

/// One line describing a route: match, action and policies.
pub fn describe_route(r: &Route) -> String {
    let mut s = format!(
        "route {} [{}]",
        if r.name.is_empty() { "-" } else { &r.name },
        r.r#match.as_ref().map(describe_match).unwrap_or_default()
    );
    match &r.action {
        Some(Action::Route(ra)) => {
            match &ra.cluster_specifier {
                Some(ClusterSpecifier::Cluster(c)) => s.push_str(&format!(" -> {c}")),
                Some(ClusterSpecifier::WeightedClusters(w)) => {
                    let parts: Vec<String> = w
                        .clusters
                        .iter()
                        .map(|c| {
                            let mut p = format!(
                                "{}={}",
                                c.name,
                                c.weight.as_ref().map(|w| w.value).unwrap_or(0)
                            );
                            let h = [
                                headers(
                                    "req",
                                    &c.request_headers_to_add,
                                    &c.request_headers_to_remove,
                                ),
                                headers(
                                    "resp",
                                    &c.response_headers_to_add,
                                    &c.response_headers_to_remove,
                                ),
                            ]
                            .concat();
                            if !h.is_empty() {
                                p.push_str(&format!("({})", h.join(" ")));
                            }
                            p
                        })
                        .collect();
                    s.push_str(&format!(" -> [{}]", parts.join(", ")));
                }
                _ => s.push_str(" -> ?"),
            }
            s.push_str(&format!(" timeout={}", dur(&ra.timeout)));
            match &ra.retry_policy {
                Some(rp) => s.push_str(&format!(
                    " retry={}x({}{}{})",
                    rp.num_retries.as_ref().map(|n| n.value).unwrap_or(1),
                    rp.retry_on,
                    if rp.retriable_status_codes.is_empty() {
                        String::new()
                    } else {
                        format!(";codes={:?}", rp.retriable_status_codes)
                    },
                    if rp.per_try_timeout.is_some() {
                        format!(";per_try={}", dur(&rp.per_try_timeout))
                    } else {
                        String::new()
                    }
                )),
                None => s.push_str(" retry=none"),
            }
            if !ra.prefix_rewrite.is_empty() {
                s.push_str(&format!(" rewrite={}", ra.prefix_rewrite));
            }
            if let Some(rr) = &ra.regex_rewrite {
                s.push_str(&format!(
                    " regex_rewrite={}=>{}",
                    rr.pattern.as_ref().map(|p| p.regex.as_str()).unwrap_or(""),
                    rr.substitution
                ));
            }
            if let Some(HostRewriteSpecifier::HostRewriteLiteral(h)) = &ra.host_rewrite_specifier {
                s.push_str(&format!(" authority={h}"));
            }
            for m in &ra.request_mirror_policies {
                s.push_str(&format!(
                    " mirror={}@{}",
                    m.cluster,
                    pct(&m.runtime_fraction.as_ref().and_then(|f| f.default_value))
                ));
            }
            for h in &ra.hash_policy {
                let k = match &h.policy_specifier {
                    Some(PolicySpecifier::Header(h)) => format!("header:{}", h.header_name),
                    Some(PolicySpecifier::Cookie(c)) => format!("cookie:{}", c.name),
                    Some(PolicySpecifier::ConnectionProperties(_)) => "source_ip".into(),
                    Some(PolicySpecifier::QueryParameter(q)) => format!("query:{}", q.name),
                    _ => "?".into(),
                };
                s.push_str(&format!(" hash={k}"));
            }
        }
        Some(Action::Redirect(rd)) => s.push_str(&format!(
            " redirect(code={} host={} port={} path={:?} scheme={:?})",
            rd.response_code,
            rd.host_redirect,
            rd.port_redirect,
            rd.path_rewrite_specifier,
            rd.scheme_rewrite_specifier
        )),
        Some(Action::DirectResponse(d)) => s.push_str(&format!(
            " direct({} {:?})",
            d.status,
            d.body.as_ref().and_then(|b| b.specifier.clone())
        )),
        _ => s.push_str(" ?"),
    }
    let mut filters: Vec<&String> = r.typed_per_filter_config.keys().collect();
    filters.sort();
    for name in filters {
        let any = &r.typed_per_filter_config[name];
        let fault = name
            .ends_with("fault")
            .then(|| HttpFault::decode(any.value.as_slice()).ok())
            .flatten();
        let cors = name
            .ends_with("cors")
            .then(|| CorsPolicy::decode(any.value.as_slice()).ok())
            .flatten();
        if let Some(f) = fault {
            if let Some(d) = &f.delay {
                let fixed = match &d.fault_delay_secifier {
                    Some(FaultDelaySecifier::FixedDelay(fd)) => dur(&Some(*fd)),
                    _ => "?".into(),
                };
                s.push_str(&format!(" delay={fixed}@{}", pct(&d.percentage)));
            }
            if let Some(a) = &f.abort {
                let e = match &a.error_type {
                    Some(ErrorType::HttpStatus(c)) => format!("http{c}"),
                    Some(ErrorType::GrpcStatus(c)) => format!("grpc{c}"),
                    _ => "?".into(),
                };
                s.push_str(&format!(" abort={e}@{}", pct(&a.percentage)));
            }
        } else if let Some(c) = cors {
            let origins: Vec<String> = c
                .allow_origin_string_match
                .iter()
                .map(|m| string_matcher(&Some(m.clone())))
                .collect();
            s.push_str(&format!(
                " cors(origins={origins:?} methods={} headers={} expose={} max_age={} creds={:?})",
                c.allow_methods,
                c.allow_headers,
                c.expose_headers,
                c.max_age,
                c.allow_credentials.map(|b| b.value)
            ));
        } else {
            s.push_str(&format!(" filter={name}"));
        }
    }
    let h = [
        headers(
            "req",
            &r.request_headers_to_add,
            &r.request_headers_to_remove,
        ),
        headers(
            "resp",
            &r.response_headers_to_add,
            &r.response_headers_to_remove,
        ),
    ]
    .concat();
    if !h.is_empty() {
        s.push_str(&format!(" headers({})", h.join(" ")));
    }
    s
}

/// The DestinationRule-derived settings of a cluster, or nothing for Envoy defaults.
pub fn describe_cluster_policy(c: &Cluster) -> String {
    let mut parts = Vec::new();
    let original_dst = c.lb_policy == LbPolicy::ClusterProvided as i32
        && c.cluster_discovery_type
            == Some(
                envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(
                    envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType::OriginalDst
                        as i32,
                ),
            );
    if c.lb_policy != 0 && !original_dst {
        parts.push(format!(
            "lb={}",
            LbPolicy::try_from(c.lb_policy)
                .map(|p| p.as_str_name().to_string())
                .unwrap_or_default()
        ));
    }
    if let Some(cfg) = &c.lb_config {
        parts.push(format!("lb_config={cfg:?}").replace('\n', ""));
    }
    if let Some(cb) = &c.circuit_breakers {
        for t in &cb.thresholds {
            let v = |x: &Option<envoy_types::pb::google::protobuf::UInt32Value>| {
                x.as_ref()
                    .map(|v| v.value.to_string())
                    .unwrap_or("-".into())
            };
            parts.push(format!(
                "limits(conn={} pending={} req={} retries={})",
                v(&t.max_connections),
                v(&t.max_pending_requests),
                v(&t.max_requests),
                v(&t.max_retries)
            ));
        }
    }
    if c.connect_timeout
        .as_ref()
        .is_some_and(|d| d.seconds != 10 || d.nanos != 0)
    {
        parts.push(format!("connect_timeout={}", dur(&c.connect_timeout)));
    }
    if let Some(o) = &c.outlier_detection {
        let v = |x: &Option<envoy_types::pb::google::protobuf::UInt32Value>| {
            x.as_ref()
                .map(|v| v.value.to_string())
                .unwrap_or("-".into())
        };
        parts.push(format!(
            "outlier(5xx={} gw={} interval={} ejection={} max%={} enforce5xx={} enforce_sr={})",
            v(&o.consecutive_5xx),
            v(&o.consecutive_gateway_failure),
            dur(&o.interval),
            dur(&o.base_ejection_time),
            v(&o.max_ejection_percent),
            v(&o.enforcing_consecutive_5xx),
            v(&o.enforcing_success_rate),
        ));
    }
    if let Some(p) = c
        .common_lb_config
        .as_ref()
        .and_then(|l| l.healthy_panic_threshold.as_ref())
    {
        parts.push(format!("panic={}%", p.value));
    }
    if let Some(ts) = &c.transport_socket {
        let tls = match &ts.config_type {
            Some(
                envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
                    any,
                ),
            ) => UpstreamTlsContext::decode(any.value.as_slice()).ok(),
            _ => None,
        };
        let desc = tls
            .map(|t| {
                let ctx = t.common_tls_context.unwrap_or_default();
                format!(
                    "tls(sni={} certs={} validation={})",
                    t.sni,
                    ctx.tls_certificates.len(),
                    ctx.validation_context_type.is_some()
                )
            })
            .unwrap_or_else(|| ts.name.clone());
        parts.push(desc);
    }
    if let Some(uco) = &c.upstream_connection_options {
        parts.push(format!(
            "keepalive={:?}",
            uco.tcp_keepalive.as_ref().map(|k| (
                k.keepalive_probes.as_ref().map(|v| v.value),
                k.keepalive_time.as_ref().map(|v| v.value)
            ))
        ));
    }
    parts.join(" ")
}
