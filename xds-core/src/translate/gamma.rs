//! GAMMA: Gateway API HTTPRoutes and GRPCRoutes whose parent is a Service, compiled into the
//! same route model as VirtualServices (one VirtualService per Service host and audience), so
//! that sidecars and proxyless clients render them with the VirtualService machinery.
//!
//! - A *producer* route (in the Service's namespace) applies to every client of the tenant
//!   that sees the Service: it compiles into a VirtualService exported to `*`.
//! - A *consumer* route (in another namespace of the tenant) applies only to clients of its
//!   own namespace: it compiles into a VirtualService exported to `.` in that namespace, and
//!   there it takes precedence over the producer routes (they are not merged: the consumer's
//!   rules replace them, as the specification says).
//! - A Service named by GAMMA routes is routed by them for the clients they apply to; a
//!   VirtualService for the same host is then not used by those clients (the Gateway API wins,
//!   see [`super::traffic::mesh_candidates`] and the guide's "Gateway API" page).
//! - Within one compiled VirtualService the rules of all its routes are ordered by the
//!   specification's precedence: path `Exact` over `PathPrefix` over `RegularExpression`, a
//!   longer path first, a method match first, more header matches first, more query parameter
//!   matches first, then the oldest route, then route namespace and name, then rule and match
//!   order. A request matching none of them gets a 404, as for a VirtualService.
//! - A parent Service that is not in the registry, a backend that is not a Service, not found,
//!   or in another namespace without a ReferenceGrant there is left out ([`Verdict`] says why,
//!   for status); a rule left without any usable backend answers 500, as the specification
//!   requires. Routes come only from the tenant's registry, so references never leave the
//!   tenant: a Service of another tenant is simply not found.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use meshplane_crds::duration::Duration;
use meshplane_crds::gateway_api::grpcroute::{GRPCRouteFilterType, GRPCRouteRule};
use meshplane_crds::gateway_api::httproute::{
    HTTPPathModifier, HTTPPathModifierType, HTTPRouteFilter, HTTPRouteFilterType, HTTPRouteMatch,
    HTTPRouteRule, PathMatchType, RedirectScheme, StringMatchType,
};
use meshplane_crds::gateway_api::shared::{
    conditions, parse_duration, BackendObjectReference, HttpHeaderFilter, ParentReference,
};
use meshplane_crds::gateway_api::{GRPCRoute, HTTPRoute, GROUP};
use meshplane_crds::networking::virtual_service::{
    Destination, HeaderOperations, Headers, HttpDirectResponse, HttpMatchRequest, HttpMirrorPolicy,
    HttpRedirect, HttpRetry, HttpRewrite, HttpRoute, HttpRouteDestination, PortSelector,
    RegexRewrite, StringMatch,
};
use meshplane_crds::networking::VirtualServiceSpec;
use meshplane_crds::networking::DOMAIN_SUFFIX;
use meshplane_crds::VirtualService;

use super::registry::Registry;
pub use super::registry::{MeshRoutes, Verdict};

/// Label of the VirtualServices compiled from GAMMA routes (never stored in the cluster).
pub const COMPILED_FROM_LABEL: &str = "meshplane.io/compiled-from";

/// Why a reference cannot be used: a condition reason and a message.
type Problem = (&'static str, String);

/// The hostname of a Service.
fn service_host(name: &str, namespace: &str) -> String {
    format!("{name}.{namespace}.{DOMAIN_SUFFIX}")
}

/// One compiled rule with its precedence key.
struct Entry {
    key: PrecedenceKey,
    route: HttpRoute,
}

/// Orders entries the specification's way (smaller first).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct PrecedenceKey {
    path_kind: u8,
    path_len: Reverse<usize>,
    no_method: bool,
    headers: Reverse<usize>,
    queries: Reverse<usize>,
    created: Option<Time>,
    namespace: String,
    name: String,
    rule: usize,
    match_: usize,
}

/// A route of either kind, as compilation reads it.
struct RouteSource<'a> {
    kind: &'static str,
    meta: &'a ObjectMeta,
    parents: &'a [ParentReference],
}

impl RouteSource<'_> {
    fn namespace(&self) -> &str {
        self.meta.namespace.as_deref().unwrap_or_default()
    }
    fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }
}

/// The Service parents of a route that exist in the registry: (parentRef index, host, port),
/// and a verdict for every Service parent.
fn service_parents(
    registry: &Registry,
    src: &RouteSource<'_>,
    verdicts: &mut Vec<Verdict>,
) -> Vec<(String, Option<u32>, String)> {
    let mut out = Vec::new();
    for (i, p) in src.parents.iter().enumerate() {
        if !p.is_service() {
            continue;
        }
        let ns = p.namespace_or(src.namespace()).to_string();
        let host = service_host(&p.name, &ns);
        let mut verdict = Verdict {
            kind: src.kind,
            namespace: src.namespace().to_string(),
            name: src.name().to_string(),
            generation: src.meta.generation,
            parent: i,
            not_accepted: None,
            unresolved: None,
        };
        let service = registry.services_named(&host).find(|s| s.namespace == ns);
        let Some(service) = service else {
            verdict.not_accepted = Some((
                conditions::REASON_NO_MATCHING_PARENT,
                format!("Service {ns}/{} is not a Service of this tenant", p.name),
            ));
            verdicts.push(verdict);
            continue;
        };
        let port = match (p.port, p.section_name.as_deref()) {
            (Some(port), _) => {
                let port = u32::try_from(port).unwrap_or_default();
                if !service.ports.iter().any(|sp| sp.port == port) {
                    verdict.not_accepted = Some((
                        conditions::REASON_NO_MATCHING_PARENT,
                        format!("Service {ns}/{} has no port {port}", p.name),
                    ));
                    verdicts.push(verdict);
                    continue;
                }
                Some(port)
            }
            (None, Some(section)) => match service.ports.iter().find(|sp| sp.name == section) {
                Some(sp) => Some(sp.port),
                None => {
                    verdict.not_accepted = Some((
                        conditions::REASON_NO_MATCHING_PARENT,
                        format!("Service {ns}/{} has no port named {section}", p.name),
                    ));
                    verdicts.push(verdict);
                    continue;
                }
            },
            (None, None) => None,
        };
        verdicts.push(verdict);
        out.push((host, port, ns));
    }
    out
}

/// Whether a ReferenceGrant in `to_namespace` lets a route of `kind` in `from_namespace` name
/// the Service `name`.
fn granted(
    registry: &Registry,
    kind: &str,
    from_namespace: &str,
    to_namespace: &str,
    name: &str,
) -> bool {
    registry.gateway_api.reference_grants.iter().any(|g| {
        g.metadata.namespace.as_deref() == Some(to_namespace)
            && g.spec
                .permits(GROUP, kind, from_namespace, "", "Service", name)
    })
}

/// Resolves a backend reference: the destination, or why it cannot be used.
fn resolve_backend(
    registry: &Registry,
    kind: &str,
    route_namespace: &str,
    backend: &BackendObjectReference,
) -> Result<Destination, Problem> {
    if !backend.is_service() {
        return Err((
            conditions::REASON_INVALID_KIND,
            format!(
                "backend {}/{} {} is not a core Service",
                backend.group, backend.kind, backend.name
            ),
        ));
    }
    let ns = backend.namespace_or(route_namespace);
    if ns != route_namespace && !granted(registry, kind, route_namespace, ns, &backend.name) {
        return Err((
            conditions::REASON_REF_NOT_PERMITTED,
            format!(
                "backend Service {ns}/{} is in another namespace and no ReferenceGrant there allows it",
                backend.name
            ),
        ));
    }
    let host = service_host(&backend.name, ns);
    if !registry.services_named(&host).any(|s| s.namespace == ns) {
        return Err((
            conditions::REASON_BACKEND_NOT_FOUND,
            format!("backend Service {ns}/{} not found", backend.name),
        ));
    }
    Ok(Destination {
        host,
        subset: String::new(),
        port: backend
            .port
            .and_then(|p| u32::try_from(p).ok())
            .map(|number| PortSelector { number }),
    })
}

fn header_operations(f: &HttpHeaderFilter) -> HeaderOperations {
    HeaderOperations {
        set: f
            .set
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.clone()))
            .collect(),
        add: f
            .add
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.clone()))
            .collect(),
        remove: f.remove.iter().map(|h| h.to_ascii_lowercase()).collect(),
    }
}

fn string_match(kind: StringMatchType, value: &str) -> StringMatch {
    match kind {
        StringMatchType::Exact => StringMatch {
            exact: Some(value.to_string()),
            ..StringMatch::default()
        },
        StringMatchType::RegularExpression => StringMatch {
            regex: Some(value.to_string()),
            ..StringMatch::default()
        },
    }
}

/// A path match: `PathPrefix` matches whole segments (`/api` matches `/api` and `/api/x`, not
/// `/apix`), which Envoy's `path_separated_prefix` does; the VirtualService model has only a
/// plain prefix, so a prefix not ending in `/` becomes a regex of the same meaning.
fn path_match(kind: PathMatchType, value: &str) -> StringMatch {
    match kind {
        PathMatchType::Exact => StringMatch {
            exact: Some(value.to_string()),
            ..StringMatch::default()
        },
        PathMatchType::PathPrefix if value == "/" || value.ends_with('/') => StringMatch {
            prefix: Some(value.to_string()),
            ..StringMatch::default()
        },
        PathMatchType::PathPrefix => StringMatch {
            regex: Some(format!("{}(/.*)?", regex_escape(value))),
            ..StringMatch::default()
        },
        PathMatchType::RegularExpression => StringMatch {
            regex: Some(value.to_string()),
            ..StringMatch::default()
        },
    }
}

fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The path rewrite of a `URLRewrite` or the path of a `RequestRedirect` for a rule whose
/// match has the prefix `matched` (when it is a `PathPrefix`).
fn path_rewrite(m: &HTTPPathModifier, matched: Option<&str>) -> Option<RegexRewrite> {
    match m.type_ {
        HTTPPathModifierType::ReplaceFullPath => Some(RegexRewrite {
            match_: "^.*$".into(),
            rewrite: m.replace_full_path.clone().unwrap_or_else(|| "/".into()),
        }),
        HTTPPathModifierType::ReplacePrefixMatch => {
            let prefix = matched?.trim_end_matches('/');
            let replacement = m.replace_prefix_match.as_deref().unwrap_or("/");
            let replacement = replacement.trim_end_matches('/');
            if replacement.is_empty() {
                // `/v1/x` → `/x`, `/v1` → `/`.
                Some(RegexRewrite {
                    match_: format!("^{}/*", regex_escape(prefix)),
                    rewrite: "/".into(),
                })
            } else {
                Some(RegexRewrite {
                    match_: format!("^{}", regex_escape(prefix)),
                    rewrite: replacement.to_string(),
                })
            }
        }
    }
}

/// Filters and backends of a rule, shared by HTTP and gRPC rules.
#[derive(Default)]
struct RuleParts<'a> {
    request_headers: Option<&'a HttpHeaderFilter>,
    response_headers: Option<&'a HttpHeaderFilter>,
    mirrors: Vec<&'a BackendObjectReference>,
    redirect: Option<&'a meshplane_crds::gateway_api::httproute::HTTPRequestRedirectFilter>,
    rewrite: Option<&'a meshplane_crds::gateway_api::httproute::HTTPURLRewriteFilter>,
    unsupported: bool,
    /// (backend, weight, request headers, response headers)
    backends: Vec<(
        BackendObjectReference,
        i32,
        Option<&'a HttpHeaderFilter>,
        Option<&'a HttpHeaderFilter>,
    )>,
}

fn http_parts(rule: &HTTPRouteRule) -> RuleParts<'_> {
    let mut parts = RuleParts::default();
    for f in &rule.filters {
        apply_http_filter(&mut parts, f);
    }
    for b in &rule.backend_refs {
        let find = |t: HTTPRouteFilterType| {
            b.filters
                .iter()
                .find(|f| f.type_ == t)
                .and_then(|f| match t {
                    HTTPRouteFilterType::RequestHeaderModifier => {
                        f.request_header_modifier.as_ref()
                    }
                    _ => f.response_header_modifier.as_ref(),
                })
        };
        parts.backends.push((
            b.backend().object(),
            b.weight,
            find(HTTPRouteFilterType::RequestHeaderModifier),
            find(HTTPRouteFilterType::ResponseHeaderModifier),
        ));
    }
    parts
}

fn apply_http_filter<'a>(parts: &mut RuleParts<'a>, f: &'a HTTPRouteFilter) {
    match f.type_ {
        HTTPRouteFilterType::RequestHeaderModifier => {
            parts.request_headers = f.request_header_modifier.as_ref()
        }
        HTTPRouteFilterType::ResponseHeaderModifier => {
            parts.response_headers = f.response_header_modifier.as_ref()
        }
        HTTPRouteFilterType::RequestMirror => {
            if let Some(m) = &f.request_mirror {
                parts.mirrors.push(&m.backend_ref);
            }
        }
        HTTPRouteFilterType::RequestRedirect => parts.redirect = f.request_redirect.as_ref(),
        HTTPRouteFilterType::UrlRewrite => parts.rewrite = f.url_rewrite.as_ref(),
        HTTPRouteFilterType::ExtensionRef => parts.unsupported = true,
    }
}

fn grpc_parts(rule: &GRPCRouteRule) -> RuleParts<'_> {
    let mut parts = RuleParts::default();
    for f in &rule.filters {
        match f.type_ {
            GRPCRouteFilterType::RequestHeaderModifier => {
                parts.request_headers = f.request_header_modifier.as_ref()
            }
            GRPCRouteFilterType::ResponseHeaderModifier => {
                parts.response_headers = f.response_header_modifier.as_ref()
            }
            GRPCRouteFilterType::RequestMirror => {
                if let Some(m) = &f.request_mirror {
                    parts.mirrors.push(&m.backend_ref);
                }
            }
            GRPCRouteFilterType::ExtensionRef => parts.unsupported = true,
        }
    }
    for b in &rule.backend_refs {
        let find = |t: GRPCRouteFilterType| {
            b.filters
                .iter()
                .find(|f| f.type_ == t)
                .and_then(|f| match t {
                    GRPCRouteFilterType::RequestHeaderModifier => {
                        f.request_header_modifier.as_ref()
                    }
                    _ => f.response_header_modifier.as_ref(),
                })
        };
        parts.backends.push((
            b.backend().object(),
            b.weight,
            find(GRPCRouteFilterType::RequestHeaderModifier),
            find(GRPCRouteFilterType::ResponseHeaderModifier),
        ));
    }
    parts
}

fn headers_of(
    request: Option<&HttpHeaderFilter>,
    response: Option<&HttpHeaderFilter>,
) -> Option<Headers> {
    (request.is_some() || response.is_some()).then(|| Headers {
        request: request.map(header_operations),
        response: response.map(header_operations),
    })
}

/// The action part of a compiled rule (everything but `match`), and the first backend
/// problem found.
fn action(
    registry: &Registry,
    kind: &str,
    route_namespace: &str,
    parts: &RuleParts<'_>,
    matched_prefix: Option<&str>,
    problems: &mut Option<Problem>,
) -> HttpRoute {
    let mut out = HttpRoute {
        headers: headers_of(parts.request_headers, parts.response_headers),
        ..HttpRoute::default()
    };
    if parts.unsupported {
        problems.get_or_insert((
            conditions::REASON_UNSUPPORTED_VALUE,
            "ExtensionRef filters are not supported".into(),
        ));
        out.direct_response = Some(HttpDirectResponse {
            status: 500,
            body: None,
        });
        return out;
    }
    if let Some(r) = parts.redirect {
        out.redirect = Some(HttpRedirect {
            uri: String::new(),
            authority: r.hostname.clone().unwrap_or_default(),
            port: r.port.and_then(|p| u32::try_from(p).ok()),
            derive_port: None,
            scheme: match r.scheme {
                Some(RedirectScheme::Http) => "http".into(),
                Some(RedirectScheme::Https) => "https".into(),
                None => String::new(),
            },
            redirect_code: u32::try_from(r.status_code).ok(),
        });
        if let Some(path) = &r.path {
            match path.type_ {
                HTTPPathModifierType::ReplaceFullPath => {
                    if let Some(redirect) = out.redirect.as_mut() {
                        redirect.uri = path.replace_full_path.clone().unwrap_or_default();
                    }
                }
                HTTPPathModifierType::ReplacePrefixMatch => {
                    // The redirect model replaces whole paths only.
                    problems.get_or_insert((
                        conditions::REASON_UNSUPPORTED_VALUE,
                        "a RequestRedirect path of type ReplacePrefixMatch is not supported; the path is kept".into(),
                    ));
                }
            }
        }
        return out;
    }
    if let Some(rw) = parts.rewrite {
        out.rewrite = Some(HttpRewrite {
            uri: String::new(),
            authority: rw.hostname.clone().unwrap_or_default(),
            uri_regex_rewrite: rw
                .path
                .as_ref()
                .and_then(|p| path_rewrite(p, matched_prefix)),
        });
    }
    for m in &parts.mirrors {
        match resolve_backend(registry, kind, route_namespace, m) {
            Ok(destination) => out.mirrors.push(HttpMirrorPolicy {
                destination,
                percentage: None,
            }),
            Err(problem) => {
                problems.get_or_insert(problem);
            }
        }
    }
    let mut total_weight = 0i64;
    for (backend, weight, req, resp) in &parts.backends {
        match resolve_backend(registry, kind, route_namespace, backend) {
            Ok(destination) => {
                if *weight > 0 {
                    total_weight += i64::from(*weight);
                    out.route.push(HttpRouteDestination {
                        destination,
                        weight: Some(*weight),
                        headers: headers_of(*req, *resp),
                    });
                }
            }
            Err(problem) => {
                problems.get_or_insert(problem);
            }
        }
    }
    if out.route.is_empty() || total_weight == 0 {
        // No backend to send to: the specification's 500.
        out.route.clear();
        out.mirrors.clear();
        out.rewrite = None;
        out.direct_response = Some(HttpDirectResponse {
            status: 500,
            body: None,
        });
    }
    out
}

fn duration_of(text: Option<&str>) -> Option<Duration> {
    text.and_then(parse_duration).map(Duration::from_std)
}

/// The compiled rules of one HTTPRoute for one parent (port), with precedence keys.
fn http_entries(
    registry: &Registry,
    route: &HTTPRoute,
    port: Option<u32>,
    problems: &mut Option<Problem>,
) -> Vec<Entry> {
    let ns = route.metadata.namespace.as_deref().unwrap_or_default();
    let name = route.metadata.name.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    for (ri, rule) in route.spec.rules.iter().enumerate() {
        let parts = http_parts(rule);
        let default_match = [HTTPRouteMatch::default()];
        let matches: &[HTTPRouteMatch] = if rule.matches.is_empty() {
            &default_match
        } else {
            &rule.matches
        };
        for (mi, m) in matches.iter().enumerate() {
            let path = m.path.clone().unwrap_or_default();
            let prefix = (path.type_ == PathMatchType::PathPrefix).then_some(path.value.as_str());
            let mut compiled = action(registry, "HTTPRoute", ns, &parts, prefix, problems);
            compiled.name = format!("{ns}.{name}.{ri}.{mi}");
            if compiled.direct_response.is_none() && compiled.redirect.is_none() {
                if let Some(t) = &rule.timeouts {
                    compiled.timeout = duration_of(t.request.as_deref());
                    if let Some(per_try) = duration_of(t.backend_request.as_deref()) {
                        compiled.retries = Some(HttpRetry {
                            attempts: 2,
                            per_try_timeout: Some(per_try),
                            retry_on: String::new(),
                            retry_remote_localities: None,
                        });
                    }
                }
                if let Some(r) = &rule.retry {
                    let codes: Vec<String> = r.codes.iter().map(i32::to_string).collect();
                    let mut on = vec!["connect-failure".to_string(), "refused-stream".into()];
                    on.extend(codes);
                    let per_try = compiled
                        .retries
                        .as_ref()
                        .and_then(|x| x.per_try_timeout.clone());
                    compiled.retries = Some(HttpRetry {
                        attempts: r.attempts.unwrap_or(2),
                        per_try_timeout: per_try,
                        retry_on: on.join(","),
                        retry_remote_localities: None,
                    });
                }
            }
            compiled.match_ = vec![HttpMatchRequest {
                uri: Some(path_match(path.type_, &path.value)),
                method: m.method.map(|x| StringMatch {
                    exact: Some(x.as_str().into()),
                    ..StringMatch::default()
                }),
                headers: m
                    .headers
                    .iter()
                    .map(|h| (h.name.to_ascii_lowercase(), string_match(h.type_, &h.value)))
                    .collect(),
                query_params: m
                    .query_params
                    .iter()
                    .map(|q| (q.name.clone(), string_match(q.type_, &q.value)))
                    .collect(),
                port,
                ..HttpMatchRequest::default()
            }];
            out.push(Entry {
                key: PrecedenceKey {
                    path_kind: match path.type_ {
                        PathMatchType::Exact => 0,
                        PathMatchType::PathPrefix => 1,
                        PathMatchType::RegularExpression => 2,
                    },
                    path_len: Reverse(path.value.len()),
                    no_method: m.method.is_none(),
                    headers: Reverse(m.headers.len()),
                    queries: Reverse(m.query_params.len()),
                    created: route.metadata.creation_timestamp.clone(),
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    rule: ri,
                    match_: mi,
                },
                route: compiled,
            });
        }
    }
    out
}

/// The compiled rules of one GRPCRoute for one parent (port). gRPC calls are `POST
/// /<service>/<method>`: a method match is a path match (exact for a full name, a prefix for a
/// service, a regex otherwise), ranked like HTTP paths.
fn grpc_entries(
    registry: &Registry,
    route: &GRPCRoute,
    port: Option<u32>,
    problems: &mut Option<Problem>,
) -> Vec<Entry> {
    let ns = route.metadata.namespace.as_deref().unwrap_or_default();
    let name = route.metadata.name.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    let rules: Vec<GRPCRouteRule> = if route.spec.rules.is_empty() {
        Vec::new()
    } else {
        route.spec.rules.clone()
    };
    for (ri, rule) in rules.iter().enumerate() {
        let parts = grpc_parts(rule);
        let empty = [Default::default()];
        let matches: &[meshplane_crds::gateway_api::grpcroute::GRPCRouteMatch] =
            if rule.matches.is_empty() {
                &empty
            } else {
                &rule.matches
            };
        for (mi, m) in matches.iter().enumerate() {
            let (uri, kind, len) = match &m.method {
                None => (path_match(PathMatchType::PathPrefix, "/"), 1, 1),
                Some(mm) => match (mm.type_, mm.service.as_deref(), mm.method.as_deref()) {
                    (StringMatchType::Exact, Some(s), Some(me)) => {
                        let p = format!("/{s}/{me}");
                        let len = p.len();
                        (path_match(PathMatchType::Exact, &p), 0, len)
                    }
                    (StringMatchType::Exact, Some(s), None) => {
                        let p = format!("/{s}/");
                        let len = p.len();
                        (path_match(PathMatchType::PathPrefix, &p), 1, len)
                    }
                    (StringMatchType::Exact, None, Some(me)) => (
                        StringMatch {
                            regex: Some(format!("/[^/]+/{}", regex_escape(me))),
                            ..StringMatch::default()
                        },
                        2,
                        me.len(),
                    ),
                    (StringMatchType::RegularExpression, s, me) => {
                        let s = s.unwrap_or("[^/]+");
                        let me = me.unwrap_or("[^/]+");
                        (
                            StringMatch {
                                regex: Some(format!("/{s}/{me}")),
                                ..StringMatch::default()
                            },
                            2,
                            s.len() + me.len(),
                        )
                    }
                    (StringMatchType::Exact, None, None) => {
                        (path_match(PathMatchType::PathPrefix, "/"), 1, 1)
                    }
                },
            };
            let mut compiled = action(registry, "GRPCRoute", ns, &parts, None, problems);
            compiled.name = format!("{ns}.{name}.{ri}.{mi}");
            compiled.match_ = vec![HttpMatchRequest {
                uri: Some(uri),
                headers: m
                    .headers
                    .iter()
                    .map(|h| (h.name.to_ascii_lowercase(), string_match(h.type_, &h.value)))
                    .collect(),
                port,
                ..HttpMatchRequest::default()
            }];
            out.push(Entry {
                key: PrecedenceKey {
                    path_kind: kind,
                    path_len: Reverse(len),
                    no_method: true,
                    headers: Reverse(m.headers.len()),
                    queries: Reverse(0),
                    created: route.metadata.creation_timestamp.clone(),
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    rule: ri,
                    match_: mi,
                },
                route: compiled,
            });
        }
    }
    out
}

/// The compiled rules of one route for a parent port.
type EntriesFn<'a> = dyn Fn(Option<u32>, &mut Option<Problem>) -> Vec<Entry> + 'a;

/// Compiles the tenant's GAMMA routes (see the module documentation).
pub fn compile(registry: &Registry) -> MeshRoutes {
    let mut verdicts = Vec::new();
    // (host, consumer namespace or None for producer) → (service namespace, entries)
    let mut groups: BTreeMap<(String, Option<String>), (String, Vec<Entry>)> = BTreeMap::new();
    let mut add = |verdicts: &mut Vec<Verdict>, src: RouteSource<'_>, entries: &EntriesFn<'_>| {
        let parents = service_parents(registry, &src, verdicts);
        let first_new = verdicts.len() - src.parents.iter().filter(|p| p.is_service()).count();
        for (host, port, svc_ns) in parents {
            let mut problem = None;
            let list = entries(port, &mut problem);
            let audience = (svc_ns != src.namespace()).then(|| src.namespace().to_string());
            groups
                .entry((host.clone(), audience))
                .or_insert_with(|| (svc_ns.clone(), Vec::new()))
                .1
                .extend(list);
            if let Some(problem) = problem {
                for v in verdicts[first_new..]
                    .iter_mut()
                    .filter(|v| v.not_accepted.is_none())
                {
                    v.unresolved.get_or_insert(problem.clone());
                }
            }
        }
    };
    for r in &registry.gateway_api.http_routes {
        let src = RouteSource {
            kind: "HTTPRoute",
            meta: &r.metadata,
            parents: &r.spec.parent_refs,
        };
        add(&mut verdicts, src, &|port, problem| {
            http_entries(registry, r, port, problem)
        });
    }
    for r in &registry.gateway_api.grpc_routes {
        let src = RouteSource {
            kind: "GRPCRoute",
            meta: &r.metadata,
            parents: &r.spec.parent_refs,
        };
        add(&mut verdicts, src, &|port, problem| {
            grpc_entries(registry, r, port, problem)
        });
    }
    let mut consumers = Vec::new();
    let mut producers = Vec::new();
    for ((host, audience), (svc_ns, mut entries)) in groups {
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        let (namespace, export_to) = match &audience {
            Some(consumer) => (consumer.clone(), vec![".".to_string()]),
            None => (svc_ns, vec!["*".to_string()]),
        };
        let vs = VirtualService {
            metadata: ObjectMeta {
                name: Some(format!("gamma.{host}")),
                namespace: Some(namespace),
                labels: Some([(COMPILED_FROM_LABEL.to_string(), "gateway-api".to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: VirtualServiceSpec {
                hosts: vec![host],
                gateways: vec!["mesh".into()],
                http: entries.into_iter().map(|e| e.route).collect(),
                export_to,
                ..VirtualServiceSpec::default()
            },
            status: None,
        };
        if audience.is_some() {
            consumers.push(vs);
        } else {
            producers.push(vs);
        }
    }
    consumers.extend(producers);
    MeshRoutes {
        virtual_services: consumers,
        verdicts,
    }
}
