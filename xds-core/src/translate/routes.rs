//! Envoy routes from VirtualService HTTP rules, as pure functions of a rule and the context it
//! is rendered for (which proxy, which port, which gateway).
//!
//! Order is the VirtualService's: each `http[]` rule becomes one Envoy route per `match[]`
//! block that applies to the context (blocks restricted by `port`, `sourceLabels`,
//! `sourceNamespace` or `gateways` that do not apply are left out), in order, so the first
//! rule that matches a request wins, as in Istio. A rule without `match` matches everything.
//! Nothing is appended after the rules: a request that matches none is answered 404 by Envoy,
//! as Istio's sidecars do. Hosts without a VirtualService get [`default_route`].
//!
//! Grouping routes into route configurations (per port, per service, VHDS) is the caller's
//! concern; nothing here depends on it.

use std::collections::{BTreeMap, HashMap};

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{
    data_source::Specifier as DataSpecifier, DataSource, HeaderValue, HeaderValueOption,
    RuntimeFractionalPercent,
};
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::query_parameter_matcher::QueryParameterMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::redirect_action::{
    RedirectResponseCode, SchemeRewriteSpecifier,
};
use envoy_types::pb::envoy::config::route::v3::retry_policy::RetryHostPredicate;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::{
    ClusterSpecifier, HostRewriteSpecifier, RequestMirrorPolicy,
};
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::weighted_cluster::ClusterWeight;
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction, RetryPolicy, Route,
    RouteAction, RouteMatch, WeightedCluster,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::fault_delay::FaultDelaySecifier;
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::FaultDelay;
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy as EnvoyCors;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::fault_abort::ErrorType;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{FaultAbort, HttpFault};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher,
};
use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
use envoy_types::pb::google::protobuf::{Any, BoolValue, UInt32Value};
use envoy_types::util::pack_any;
use meshplane_crds::networking::resolve_host;
use meshplane_crds::networking::virtual_service::{
    CorsPolicy, Destination, HeaderOperations, Headers, HttpMatchRequest, HttpRedirect, HttpRoute,
    HttpRouteDestination, Percent, RedirectPortSelection, StringMatch, UnmatchedPreflights,
};
use meshplane_crds::validation::traffic::GRPC_STATUS;
use meshplane_crds::VirtualService;

use super::envoy::{duration, filter_name};
use super::registry::{subset_cluster_name, Registry};
use super::traffic::{
    destination_rule, effective_policy, labels_match, resolve_gateways, GatewayRef,
};

/// Istio's retry conditions when a rule gives `attempts` but no `retryOn`, and of the default
/// policy.
pub const DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";

/// What routes are rendered for.
#[derive(Clone, Copy, Debug)]
pub struct RouteContext<'a> {
    pub registry: &'a Registry,
    /// Namespace of the proxy (what `sourceNamespace` and DestinationRule lookup see).
    pub proxy_namespace: &'a str,
    /// Labels of the proxy's workload (what `sourceLabels` see).
    pub proxy_labels: &'a BTreeMap<String, String>,
    /// The gateway routed for: [`GatewayRef::Mesh`] for sidecars and proxyless clients.
    pub gateway: &'a GatewayRef,
    /// The port requests arrive on (a service port, or a gateway server's port).
    pub port: u32,
}

fn namespace_of(vs: &VirtualService) -> &str {
    vs.metadata.namespace.as_deref().unwrap_or_default()
}

/// Whether a match block applies to the context (the conditions on the caller, not on the
/// request).
fn applies(m: &HttpMatchRequest, vs_namespace: &str, ctx: &RouteContext<'_>) -> bool {
    m.port.is_none_or(|p| p == ctx.port)
        && labels_match(&m.source_labels, ctx.proxy_labels)
        && (m.source_namespace.is_empty() || m.source_namespace == ctx.proxy_namespace)
        && (m.gateways.is_empty()
            || resolve_gateways(&m.gateways, vs_namespace).contains(ctx.gateway))
}

/// The Envoy routes of a VirtualService's HTTP rules for `ctx`, in order.
pub fn http_routes(vs: &VirtualService, ctx: &RouteContext<'_>) -> Vec<Route> {
    let ns = namespace_of(vs);
    let mut out = Vec::new();
    for rule in &vs.spec.http {
        let blocks: Vec<Option<&HttpMatchRequest>> = if rule.match_.is_empty() {
            vec![None]
        } else {
            rule.match_
                .iter()
                .filter(|m| applies(m, ns, ctx))
                .map(Some)
                .collect()
        };
        for block in blocks {
            out.push(route(rule, block, ns, ctx));
        }
    }
    out
}

/// Whether a route matches every request (a catch-all: `/` prefix and nothing else).
pub fn is_catch_all(route: &Route) -> bool {
    route.r#match.as_ref().is_some_and(|m| {
        matches!(&m.path_specifier, Some(PathSpecifier::Prefix(p)) if p == "/")
            && m.headers.is_empty()
            && m.query_parameters.is_empty()
    })
}

/// The route of a host without a VirtualService: everything to its cluster, Istio's default
/// retries, no timeout.
pub fn default_route(cluster: &str) -> Route {
    Route {
        name: "default".to_string(),
        r#match: Some(prefix("/")),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.to_string())),
            timeout: Some(duration(std::time::Duration::ZERO)),
            retry_policy: Some(default_retry_policy()),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn prefix(p: &str) -> RouteMatch {
    RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix(p.to_string())),
        ..Default::default()
    }
}

fn route(
    rule: &HttpRoute,
    block: Option<&HttpMatchRequest>,
    vs_namespace: &str,
    ctx: &RouteContext<'_>,
) -> Route {
    let name = match block.map(|m| m.name.as_str()).filter(|n| !n.is_empty()) {
        Some(m) if !rule.name.is_empty() => format!("{}.{m}", rule.name),
        Some(m) => m.to_string(),
        None => rule.name.clone(),
    };
    let mut typed_per_filter_config: HashMap<String, Any> = HashMap::new();
    if let Some(fault) = &rule.fault {
        typed_per_filter_config.insert(filter_name::FAULT.to_string(), pack_any(http_fault(fault)));
    }
    if let Some(cors) = &rule.cors_policy {
        typed_per_filter_config.insert(filter_name::CORS.to_string(), pack_any(cors_policy(cors)));
    }
    let mut out = Route {
        name,
        r#match: Some(block.map(route_match).unwrap_or_else(|| prefix("/"))),
        typed_per_filter_config,
        stat_prefix: block.map(|m| m.stat_prefix.clone()).unwrap_or_default(),
        ..Default::default()
    };
    let mut headers = rule.headers.clone().unwrap_or_default();
    out.action = Some(if let Some(r) = &rule.redirect {
        Action::Redirect(redirect(r))
    } else if let Some(d) = &rule.direct_response {
        Action::DirectResponse(DirectResponseAction {
            status: d.status,
            body: d.body.as_ref().map(|b| DataSource {
                specifier: Some(match (&b.string, &b.bytes) {
                    (Some(s), _) => DataSpecifier::InlineString(s.clone()),
                    (None, Some(bytes)) => {
                        DataSpecifier::InlineBytes(decode_base64(bytes).unwrap_or_default())
                    }
                    (None, None) => DataSpecifier::InlineString(String::new()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    } else {
        Action::Route(route_action(rule, vs_namespace, ctx, &mut headers))
    });
    apply_headers(&mut out, &headers);
    out
}

/// Resolves a destination to its cluster name. The port is the destination's, else the host's
/// only port, else the port the request arrived on.
pub fn destination_cluster(
    registry: &Registry,
    dest: &Destination,
    vs_namespace: &str,
    arrival_port: u32,
) -> String {
    let host = resolve_host(&dest.host, vs_namespace);
    let port = dest.port.map(|p| p.number).unwrap_or_else(|| {
        let mut ports = registry
            .services_named(&host)
            .flat_map(|s| s.ports.iter().map(|p| p.port));
        match (ports.next(), ports.next()) {
            (Some(only), None) => only,
            _ => arrival_port,
        }
    });
    subset_cluster_name(port, &dest.subset, &host)
}

fn route_action(
    rule: &HttpRoute,
    vs_namespace: &str,
    ctx: &RouteContext<'_>,
    headers: &mut Headers,
) -> RouteAction {
    // Destinations without weight share nothing when others have one; a lone destination
    // takes everything.
    let weighted: Vec<(&HttpRouteDestination, u32)> = if rule.route.len() == 1 {
        vec![(&rule.route[0], 100)]
    } else {
        rule.route
            .iter()
            .map(|d| (d, u32::try_from(d.weight.unwrap_or(0)).unwrap_or(0)))
            .filter(|(_, w)| *w > 0)
            .collect()
    };
    let cluster_of = |d: &Destination| destination_cluster(ctx.registry, d, vs_namespace, ctx.port);
    let cluster_specifier = match weighted.as_slice() {
        [(only, _)] => {
            // Istio folds a lone destination's header rules into the route's.
            if let Some(h) = &only.headers {
                merge_headers(headers, h);
            }
            ClusterSpecifier::Cluster(cluster_of(&only.destination))
        }
        many => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: many
                .iter()
                .map(|(d, w)| {
                    let mut cw = ClusterWeight {
                        name: cluster_of(&d.destination),
                        weight: Some(UInt32Value { value: *w }),
                        ..Default::default()
                    };
                    if let Some(h) = &d.headers {
                        if let Some(req) = &h.request {
                            cw.request_headers_to_add = header_options(req);
                            cw.request_headers_to_remove = req.remove.clone();
                        }
                        if let Some(resp) = &h.response {
                            cw.response_headers_to_add = header_options(resp);
                            cw.response_headers_to_remove = resp.remove.clone();
                        }
                    }
                    cw
                })
                .collect(),
            ..Default::default()
        }),
    };
    let mut action = RouteAction {
        cluster_specifier: Some(cluster_specifier),
        timeout: Some(duration(
            rule.timeout.as_ref().map(|t| t.get()).unwrap_or_default(),
        )),
        retry_policy: retry_policy(rule),
        hash_policy: hash_policy(rule, vs_namespace, ctx),
        ..Default::default()
    };
    if let Some(rw) = &rule.rewrite {
        if !rw.uri.is_empty() {
            action.prefix_rewrite = rw.uri.clone();
        }
        if let Some(rr) = &rw.uri_regex_rewrite {
            action.regex_rewrite = Some(RegexMatchAndSubstitute {
                pattern: Some(regex(&rr.match_)),
                substitution: rr.rewrite.clone(),
            });
        }
        if !rw.authority.is_empty() {
            action.host_rewrite_specifier = Some(HostRewriteSpecifier::HostRewriteLiteral(
                rw.authority.clone(),
            ));
        }
    }
    let mirrors = rule
        .mirror
        .iter()
        .map(|m| (m, rule.effective_mirror_percentage()))
        .chain(rule.mirrors.iter().map(|m| (&m.destination, m.percentage)));
    action.request_mirror_policies = mirrors
        .map(|(dest, pct)| RequestMirrorPolicy {
            cluster: cluster_of(dest),
            runtime_fraction: pct.map(|p| RuntimeFractionalPercent {
                default_value: Some(fraction(p)),
                runtime_key: String::new(),
            }),
            ..Default::default()
        })
        .collect();
    action
}

/// Istio's retries when a rule says nothing: 2 attempts on connect failures, refused streams,
/// gRPC cancelled/unavailable and 503, on another host each time.
pub fn default_retry_policy() -> RetryPolicy {
    RetryPolicy {
        retry_on: DEFAULT_RETRY_ON.to_string(),
        num_retries: Some(UInt32Value { value: 2 }),
        retriable_status_codes: vec![503],
        retry_host_predicate: vec![previous_hosts()],
        host_selection_retry_max_attempts: 5,
        ..Default::default()
    }
}

fn previous_hosts() -> RetryHostPredicate {
    RetryHostPredicate {
        name: filter_name::PREVIOUS_HOSTS.to_string(),
        config_type: Some(
            envoy_types::pb::envoy::config::route::v3::retry_policy::retry_host_predicate::ConfigType::TypedConfig(
                pack_any(PreviousHostsPredicate::default()),
            ),
        ),
    }
}

fn retry_policy(rule: &HttpRoute) -> Option<RetryPolicy> {
    let Some(r) = &rule.retries else {
        return Some(default_retry_policy());
    };
    if r.attempts == 0 {
        return None;
    }
    let mut codes = Vec::new();
    let mut conditions = Vec::new();
    let retry_on = if r.retry_on.trim().is_empty() {
        DEFAULT_RETRY_ON
    } else {
        r.retry_on.as_str()
    };
    for cond in retry_on.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        match cond.parse::<u32>() {
            Ok(code) => codes.push(code),
            Err(_) => conditions.push(cond.to_string()),
        }
    }
    if !codes.is_empty() && !conditions.iter().any(|c| c == "retriable-status-codes") {
        conditions.push("retriable-status-codes".to_string());
    }
    if r.retry_on.trim().is_empty() {
        codes.push(503);
    }
    Some(RetryPolicy {
        retry_on: conditions.join(","),
        num_retries: Some(UInt32Value {
            value: u32::try_from(r.attempts).unwrap_or(0),
        }),
        per_try_timeout: r.per_try_timeout.as_ref().map(|t| duration(t.get())),
        retriable_status_codes: codes,
        retry_host_predicate: vec![previous_hosts()],
        host_selection_retry_max_attempts: 5,
        ..Default::default()
    })
}

/// Consistent hashing configured on the destinations' DestinationRule (the same for all of
/// them, else none, as Envoy hashes once per route).
fn hash_policy(
    rule: &HttpRoute,
    vs_namespace: &str,
    ctx: &RouteContext<'_>,
) -> Vec<envoy_types::pb::envoy::config::route::v3::route_action::HashPolicy> {
    let mut policies = rule.route.iter().map(|d| {
        let host = resolve_host(&d.destination.host, vs_namespace);
        let host_ns = ctx
            .registry
            .services_named(&host)
            .next()
            .map(|s| s.namespace.clone())
            .unwrap_or_default();
        let port = d.destination.port.map(|p| p.number).unwrap_or(ctx.port);
        destination_rule(ctx.registry, ctx.proxy_namespace, &host, &host_ns)
            .map(|rule| {
                let subset =
                    (!d.destination.subset.is_empty()).then_some(d.destination.subset.as_str());
                effective_policy(&rule, port, subset)
            })
            .and_then(|p| p.load_balancer.and_then(|lb| lb.consistent_hash))
    });
    let Some(Some(first)) = policies.next() else {
        return Vec::new();
    };
    if policies.all(|p| p.as_ref() == Some(&first)) {
        super::policy::hash_policy(&first)
    } else {
        Vec::new()
    }
}

fn regex(re: &str) -> RegexMatcher {
    RegexMatcher {
        regex: re.to_string(),
        ..Default::default()
    }
}

fn string_matcher(m: &StringMatch) -> Option<StringMatcher> {
    let pattern = if let Some(e) = &m.exact {
        MatchPattern::Exact(e.clone())
    } else if let Some(p) = &m.prefix {
        MatchPattern::Prefix(p.clone())
    } else if let Some(r) = &m.regex {
        MatchPattern::SafeRegex(regex(r))
    } else {
        return None;
    };
    Some(StringMatcher {
        match_pattern: Some(pattern),
        ..Default::default()
    })
}

fn header_matcher(name: &str, m: &StringMatch, invert: bool) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        invert_match: invert,
        header_match_specifier: Some(match string_matcher(m) {
            Some(sm) => HeaderMatchSpecifier::StringMatch(sm),
            None => HeaderMatchSpecifier::PresentMatch(true),
        }),
        ..Default::default()
    }
}

/// The request conditions of a match block.
pub fn route_match(m: &HttpMatchRequest) -> RouteMatch {
    let path = match &m.uri {
        Some(StringMatch { exact: Some(e), .. }) => PathSpecifier::Path(e.clone()),
        Some(StringMatch {
            prefix: Some(p), ..
        }) => PathSpecifier::Prefix(p.clone()),
        Some(StringMatch { regex: Some(r), .. }) => PathSpecifier::SafeRegex(regex(r)),
        _ => PathSpecifier::Prefix("/".to_string()),
    };
    let mut headers: Vec<HeaderMatcher> = Vec::new();
    for (pseudo, value) in [
        (":method", &m.method),
        (":authority", &m.authority),
        (":scheme", &m.scheme),
    ] {
        if let Some(v) = value {
            headers.push(header_matcher(pseudo, v, false));
        }
    }
    headers.extend(m.headers.iter().map(|(k, v)| header_matcher(k, v, false)));
    headers.extend(
        m.without_headers
            .iter()
            .map(|(k, v)| header_matcher(k, v, true)),
    );
    let query_parameters = m
        .query_params
        .iter()
        .map(|(k, v)| QueryParameterMatcher {
            name: k.clone(),
            query_parameter_match_specifier: Some(
                match string_matcher(v).filter(|_| v.exact.as_deref() != Some("")) {
                    Some(sm) => QueryParameterMatchSpecifier::StringMatch(sm),
                    None => QueryParameterMatchSpecifier::PresentMatch(true),
                },
            ),
        })
        .collect();
    RouteMatch {
        path_specifier: Some(path),
        case_sensitive: m.ignore_uri_case.then_some(BoolValue { value: false }),
        headers,
        query_parameters,
        ..Default::default()
    }
}

fn redirect(r: &HttpRedirect) -> RedirectAction {
    let response_code = match r.redirect_code.unwrap_or(301) {
        302 => RedirectResponseCode::Found,
        303 => RedirectResponseCode::SeeOther,
        307 => RedirectResponseCode::TemporaryRedirect,
        308 => RedirectResponseCode::PermanentRedirect,
        _ => RedirectResponseCode::MovedPermanently,
    };
    let port_redirect = match (r.port, r.derive_port) {
        (Some(p), _) => p,
        (None, Some(RedirectPortSelection::FromProtocolDefault)) => {
            if r.scheme == "https" {
                443
            } else {
                80
            }
        }
        _ => 0,
    };
    RedirectAction {
        host_redirect: r.authority.clone(),
        port_redirect,
        response_code: response_code as i32,
        scheme_rewrite_specifier: (!r.scheme.is_empty())
            .then(|| SchemeRewriteSpecifier::SchemeRedirect(r.scheme.clone())),
        path_rewrite_specifier: (!r.uri.is_empty()).then(|| {
            envoy_types::pb::envoy::config::route::v3::redirect_action::PathRewriteSpecifier::PathRedirect(
                r.uri.clone(),
            )
        }),
        ..Default::default()
    }
}

/// A percentage as Envoy's fraction per million.
pub fn fraction(p: Percent) -> FractionalPercent {
    FractionalPercent {
        numerator: (p.value.clamp(0.0, 100.0) * 10_000.0).round() as u32,
        denominator: DenominatorType::Million as i32,
    }
}

fn http_fault(f: &meshplane_crds::networking::virtual_service::HttpFaultInjection) -> HttpFault {
    let all = Percent { value: 100.0 };
    HttpFault {
        delay: f.delay.as_ref().map(|d| FaultDelay {
            fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(duration(
                d.fixed_delay.get(),
            ))),
            percentage: Some(fraction(d.effective_percentage().unwrap_or(all))),
        }),
        abort: f.abort.as_ref().map(|a| FaultAbort {
            error_type: match (&a.http_status, &a.grpc_status) {
                (Some(code), _) => Some(ErrorType::HttpStatus(*code)),
                (None, Some(g)) => Some(ErrorType::GrpcStatus(grpc_code(g))),
                (None, None) => None,
            },
            percentage: Some(fraction(a.percentage.unwrap_or(all))),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn grpc_code(status: &str) -> u32 {
    status.parse::<u32>().unwrap_or_else(|_| {
        GRPC_STATUS
            .iter()
            .position(|s| *s == status)
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or(2)
    })
}

fn cors_policy(c: &CorsPolicy) -> EnvoyCors {
    EnvoyCors {
        allow_origin_string_match: c.allow_origins.iter().filter_map(string_matcher).collect(),
        allow_methods: c.allow_methods.join(","),
        allow_headers: c.allow_headers.join(","),
        expose_headers: c.expose_headers.join(","),
        max_age: c
            .max_age
            .as_ref()
            .map(|d| d.get().as_secs().to_string())
            .unwrap_or_default(),
        allow_credentials: c.allow_credentials.map(|value| BoolValue { value }),
        forward_not_matching_preflights: c.unmatched_preflights.map(|u| BoolValue {
            value: u != UnmatchedPreflights::Ignore,
        }),
        ..Default::default()
    }
}

fn header_options(ops: &HeaderOperations) -> Vec<HeaderValueOption> {
    let option = |k: &String, v: &String, action: HeaderAppendAction| HeaderValueOption {
        header: Some(HeaderValue {
            key: k.clone(),
            value: v.clone(),
            ..Default::default()
        }),
        append_action: action as i32,
        ..Default::default()
    };
    ops.set
        .iter()
        .map(|(k, v)| option(k, v, HeaderAppendAction::OverwriteIfExistsOrAdd))
        .chain(
            ops.add
                .iter()
                .map(|(k, v)| option(k, v, HeaderAppendAction::AppendIfExistsOrAdd)),
        )
        .collect()
}

fn merge_headers(into: &mut Headers, from: &Headers) {
    let merge = |into: &mut Option<HeaderOperations>, from: &Option<HeaderOperations>| {
        if let Some(f) = from {
            let target = into.get_or_insert_with(HeaderOperations::default);
            target.set.extend(f.set.clone());
            target.add.extend(f.add.clone());
            target.remove.extend(f.remove.iter().cloned());
        }
    };
    merge(&mut into.request, &from.request);
    merge(&mut into.response, &from.response);
}

fn apply_headers(route: &mut Route, headers: &Headers) {
    if let Some(req) = &headers.request {
        route.request_headers_to_add = header_options(req);
        route.request_headers_to_remove = req.remove.clone();
    }
    if let Some(resp) = &headers.response {
        route.response_headers_to_add = header_options(resp);
        route.response_headers_to_remove = resp.remove.clone();
    }
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}
