//! EnvoyFilter patches, applied to a proxy's translated resources.
//!
//! Which filters apply: those of the proxy's namespace and of the tenant control namespace
//! whose `workloadSelector` matches the proxy's labels (absent selector: every proxy). Order:
//! control namespace first, then `priority` (lower first), creation time, name; the patches of
//! one filter in their order.
//!
//! Supported (`applyTo` × operation):
//!
//! | applyTo | ops |
//! |---|---|
//! | `CLUSTER`, `LISTENER`, `ROUTE_CONFIGURATION` | `ADD`, `MERGE`, `REMOVE`, `REPLACE` |
//! | `FILTER_CHAIN`, `VIRTUAL_HOST` | `ADD`, `MERGE`, `REMOVE`, `REPLACE` |
//! | `NETWORK_FILTER`, `HTTP_FILTER`, `HTTP_ROUTE` | all of the above and `INSERT_BEFORE`, `INSERT_AFTER`, `INSERT_FIRST` |
//!
//! `HTTP_ROUTE` patches the routes of the virtual hosts that `routeConfiguration` and
//! `vhost.name` select, narrowed by `vhost.route.name` (a VirtualService's `http[].name`) and
//! `vhost.route.action` (`ANY`, `ROUTE`, `REDIRECT`, `DIRECT_RESPONSE`); Istio's per-route
//! local rate limit is a `MERGE` of `typed_per_filter_config`.
//!
//! `INSERT_BEFORE` and `INSERT_AFTER` insert next to the filter the match names
//! (`filter.name` for a network filter, `filter.subFilter.name` for an HTTP filter); without
//! one, first and last, as Istio does.
//!
//! Matching: `context`, as Istio reads it: `GATEWAY` patches gateways (router proxies) only and
//! `SIDECAR_*` sidecars only (`SIDECAR_INBOUND`: `virtualInbound`, bound ingress listeners,
//! `inbound|` clusters and the inline route configurations of inbound connection managers;
//! `SIDECAR_OUTBOUND`: the rest), `ANY` both. Then listener
//! `portNumber`/`name`/`filterChain.name`/`filter.name`/`filter.subFilter.name`, route
//! configuration `portNumber` (the port in its name: `9080`, `inbound|9080||`, `http.8080`,
//! `https.443.…`)/`name`/`vhost.name`, cluster `portNumber`/`service`/`name`. An inbound route
//! configuration is part of its listener, so `ROUTE_CONFIGURATION` patches reach it by `MERGE`
//! only.
//!
//! `MERGE` merges field by field: values the patch names replace scalars (an explicit `false`
//! included), messages merge, lists append; a filter's `typed_config` of the same `@type` is
//! merged field by field, as Istio does. Values are proto-JSON of any Envoy message, read by
//! [`crate::translate::protojson`] from envoy-types' descriptor set. A patch that cannot be
//! applied is skipped and reported; the others still apply.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfigType;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::route::Action as EnvoyRouteAction;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
};
use meshplane_crds::networking::{
    ApplyTo, ClusterMatch, EnvoyConfigObjectMatch, EnvoyConfigObjectPatch, FilterChainMatch,
    ListenerMatch, PatchContext, PatchOperation, RouteAction, RouteConfigurationMatch, RouteMatch,
};
use meshplane_crds::EnvoyFilter;
use prost::Message;
use serde_json::Value;

use crate::model::{ProxyKind, ProxyNode};
use crate::translate::envoy::filter_name::HTTP_CONNECTION_MANAGER;
use crate::translate::protojson::{self, ProtoJsonError};
use crate::translate::{Registry, Translated};
use crate::translate::{INBOUND_PASSTHROUGH_CLUSTER, VIRTUAL_INBOUND_LISTENER};

const CLUSTER: &str = "envoy.config.cluster.v3.Cluster";
const LISTENER: &str = "envoy.config.listener.v3.Listener";
const FILTER_CHAIN: &str = "envoy.config.listener.v3.FilterChain";
const NETWORK_FILTER: &str = "envoy.config.listener.v3.Filter";
const HTTP_FILTER: &str = "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter";
const ROUTE_CONFIGURATION: &str = "envoy.config.route.v3.RouteConfiguration";
const VIRTUAL_HOST: &str = "envoy.config.route.v3.VirtualHost";
const HTTP_ROUTE: &str = "envoy.config.route.v3.Route";

/// Why one patch was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("EnvoyFilter {filter} configPatches[{index}]: {reason}")]
pub struct PatchError {
    /// `namespace/name` of the EnvoyFilter.
    pub filter: String,
    pub index: usize,
    pub reason: String,
}

/// Identity of an EnvoyFilter (`namespace/name`).
pub fn filter_id(f: &EnvoyFilter) -> String {
    format!(
        "{}/{}",
        f.metadata.namespace.as_deref().unwrap_or_default(),
        f.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The EnvoyFilters applying to a proxy, in application order.
pub fn applicable<'a>(registry: &'a Registry, node: &ProxyNode) -> Vec<&'a EnvoyFilter> {
    let selects = |f: &&EnvoyFilter| {
        f.spec
            .workload_selector
            .as_ref()
            .is_none_or(|s| s.labels.iter().all(|(k, v)| node.labels.get(k) == Some(v)))
    };
    let ordered = |ns: &str| {
        let mut v: Vec<&EnvoyFilter> = registry
            .envoy_filters
            .get(ns)
            .into_iter()
            .flatten()
            .filter(selects)
            .collect();
        v.sort_by(|a, b| {
            (
                a.spec.priority,
                &a.metadata.creation_timestamp,
                &a.metadata.name,
            )
                .cmp(&(
                    b.spec.priority,
                    &b.metadata.creation_timestamp,
                    &b.metadata.name,
                ))
        });
        v
    };
    let mut out = ordered(&registry.control_namespace);
    if node.namespace != registry.control_namespace {
        out.extend(ordered(&node.namespace));
    }
    out
}

/// Applies the filters' patches to the resources of a `proxy` in order; returns the patches that
/// could not be applied.
pub fn apply(filters: &[&EnvoyFilter], proxy: ProxyKind, out: &mut Translated) -> Vec<PatchError> {
    let mut errors = Vec::new();
    for f in filters {
        for (index, patch) in f.spec.config_patches.iter().enumerate() {
            if let Err(reason) = apply_patch(patch, proxy, out) {
                errors.push(PatchError {
                    filter: filter_id(f),
                    index,
                    reason,
                });
            }
        }
    }
    out.sort();
    errors
}

fn err(e: ProtoJsonError) -> String {
    e.to_string()
}

fn value(patch: &EnvoyConfigObjectPatch) -> Result<&Value, String> {
    patch
        .patch
        .value
        .as_ref()
        .ok_or_else(|| format!("operation {:?} needs patch.value", patch.patch.operation))
}

fn decode<M: Message + Default>(
    type_name: &str,
    patch: &EnvoyConfigObjectPatch,
) -> Result<M, String> {
    protojson::decode_message(type_name, value(patch)?).map_err(err)
}

/// MERGE: see [`protojson::merge`] (explicit values replace, messages merge, lists append,
/// typed configs of the same `@type` merge field by field).
fn merge<M: Message + Default>(
    existing: &mut M,
    type_name: &str,
    patch: &EnvoyConfigObjectPatch,
) -> Result<(), String> {
    *existing = protojson::merge_message(existing, type_name, value(patch)?).map_err(err)?;
    Ok(())
}

fn unsupported(patch: &EnvoyConfigObjectPatch) -> String {
    format!(
        "operation {:?} is not supported for applyTo {:?}",
        patch.patch.operation, patch.apply_to
    )
}

fn apply_patch(
    patch: &EnvoyConfigObjectPatch,
    proxy: ProxyKind,
    out: &mut Translated,
) -> Result<(), String> {
    let m = patch.match_.clone().unwrap_or_default();
    let rc_match = m.route_configuration.as_ref();
    match patch.apply_to {
        ApplyTo::Invalid => Err("applyTo must be set".to_string()),
        ApplyTo::Cluster => patch_list(&mut out.clusters, patch, CLUSTER, |c| {
            cluster_matches(c, &m, proxy)
        }),
        ApplyTo::Listener => patch_list(&mut out.listeners, patch, LISTENER, |l| {
            listener_matches(l, &m, proxy)
                && m.listener
                    .as_ref()
                    .is_none_or(|lm| lm.filter_chain.is_none() || any_chain_matches(l, lm))
        }),
        ApplyTo::RouteConfiguration => {
            if context_matches(m.context, proxy, false) {
                patch_list(&mut out.routes, patch, ROUTE_CONFIGURATION, |r| {
                    route_matches(r, rc_match)
                })?;
            }
            let inline = context_matches(m.context, proxy, true)
                && patch.patch.operation == PatchOperation::Merge;
            if inline {
                for_inbound_routes(out, rc_match, |r| merge(r, ROUTE_CONFIGURATION, patch))?;
            }
            Ok(())
        }
        ApplyTo::VirtualHost => {
            let vhost_name = rc_match
                .and_then(|r| r.vhost.as_ref())
                .map(|v| v.name.clone())
                .unwrap_or_default();
            for_route_configurations(out, &m, proxy, |route| {
                patch_list(
                    &mut route.virtual_hosts,
                    patch,
                    VIRTUAL_HOST,
                    |v: &VirtualHost| vhost_name.is_empty() || v.name == vhost_name,
                )
            })
        }
        ApplyTo::HttpRoute => {
            let vhost = rc_match.and_then(|r| r.vhost.clone()).unwrap_or_default();
            let wanted = vhost.route.clone().unwrap_or_default();
            for_route_configurations(out, &m, proxy, |route| {
                for host in route
                    .virtual_hosts
                    .iter_mut()
                    .filter(|v| vhost.name.is_empty() || v.name == vhost.name)
                {
                    patch_filters(
                        &mut host.routes,
                        patch,
                        HTTP_ROUTE,
                        !wanted.name.is_empty(),
                        |r: &Route| http_route_matches(r, &wanted),
                    )?;
                }
                Ok(())
            })
        }
        ApplyTo::FilterChain => {
            let lm = m.listener.clone().unwrap_or_default();
            for l in out.listeners.iter_mut() {
                if !listener_matches(l, &m, proxy) {
                    continue;
                }
                if patch.patch.operation == PatchOperation::Add {
                    l.filter_chains.push(decode(FILTER_CHAIN, patch)?);
                    continue;
                }
                patch_list(&mut l.filter_chains, patch, FILTER_CHAIN, |c| {
                    chain_matches(c, lm.filter_chain.as_ref())
                })?;
            }
            Ok(())
        }
        ApplyTo::NetworkFilter => {
            let lm = m.listener.clone().unwrap_or_default();
            let filter_name = lm
                .filter_chain
                .as_ref()
                .and_then(|fc| fc.filter.as_ref())
                .map(|f| f.name.clone())
                .unwrap_or_default();
            for l in out.listeners.iter_mut() {
                if !listener_matches(l, &m, proxy) {
                    continue;
                }
                for chain in l.filter_chains.iter_mut() {
                    if !chain_matches(chain, lm.filter_chain.as_ref()) {
                        continue;
                    }
                    patch_filters(
                        &mut chain.filters,
                        patch,
                        NETWORK_FILTER,
                        !filter_name.is_empty(),
                        |f: &Filter| filter_name.is_empty() || f.name == filter_name,
                    )?;
                }
            }
            Ok(())
        }
        ApplyTo::HttpFilter => {
            let lm = m.listener.clone().unwrap_or_default();
            let sub_name = lm
                .filter_chain
                .as_ref()
                .and_then(|fc| fc.filter.as_ref())
                .and_then(|f| f.sub_filter.as_ref())
                .map(|s| s.name.clone())
                .unwrap_or_default();
            for l in out.listeners.iter_mut() {
                if !listener_matches(l, &m, proxy) {
                    continue;
                }
                for chain in l.filter_chains.iter_mut() {
                    if !chain_matches(chain, lm.filter_chain.as_ref()) {
                        continue;
                    }
                    for f in chain
                        .filters
                        .iter_mut()
                        .filter(|f| f.name == HTTP_CONNECTION_MANAGER)
                    {
                        let Some(FilterConfigType::TypedConfig(any)) = &mut f.config_type else {
                            continue;
                        };
                        let mut hcm = HttpConnectionManager::decode(any.value.as_slice())
                            .map_err(|e| format!("HTTP connection manager does not decode: {e}"))?;
                        patch_filters(
                            &mut hcm.http_filters,
                            patch,
                            HTTP_FILTER,
                            !sub_name.is_empty(),
                            |h: &HttpFilter| sub_name.is_empty() || h.name == sub_name,
                        )?;
                        any.value = hcm.encode_to_vec();
                    }
                }
            }
            Ok(())
        }
    }
}

/// Runs `f` on every route configuration the match's context and `routeConfiguration` select:
/// the RDS ones (a sidecar's outbound side, a gateway's) and the inline ones of inbound
/// connection managers (a sidecar's inbound side).
fn for_route_configurations(
    out: &mut Translated,
    m: &EnvoyConfigObjectMatch,
    proxy: ProxyKind,
    mut f: impl FnMut(&mut RouteConfiguration) -> Result<(), String>,
) -> Result<(), String> {
    let rc_match = m.route_configuration.as_ref();
    if context_matches(m.context, proxy, false) {
        for route in out.routes.iter_mut() {
            if route_matches(route, rc_match) {
                f(route)?;
            }
        }
    }
    if context_matches(m.context, proxy, true) {
        for_inbound_routes(out, rc_match, f)?;
    }
    Ok(())
}

/// Runs `f` on the inline route configurations of inbound listeners' connection managers that
/// `m` selects, writing each changed manager back.
fn for_inbound_routes(
    out: &mut Translated,
    m: Option<&RouteConfigurationMatch>,
    mut f: impl FnMut(&mut RouteConfiguration) -> Result<(), String>,
) -> Result<(), String> {
    for l in out.listeners.iter_mut().filter(|l| is_inbound_listener(l)) {
        for chain in l.filter_chains.iter_mut() {
            for filter in chain
                .filters
                .iter_mut()
                .filter(|f| f.name == HTTP_CONNECTION_MANAGER)
            {
                let Some(FilterConfigType::TypedConfig(any)) = &mut filter.config_type else {
                    continue;
                };
                let mut hcm = HttpConnectionManager::decode(any.value.as_slice())
                    .map_err(|e| format!("HTTP connection manager does not decode: {e}"))?;
                let Some(RouteSpecifier::RouteConfig(route)) = &mut hcm.route_specifier else {
                    continue;
                };
                if !route_matches(route, m) {
                    continue;
                }
                f(route)?;
                any.value = hcm.encode_to_vec();
            }
        }
    }
    Ok(())
}

/// ADD, REMOVE, MERGE and REPLACE on a list of resources.
fn patch_list<M: Message + Default + Clone>(
    list: &mut Vec<M>,
    patch: &EnvoyConfigObjectPatch,
    type_name: &str,
    matches: impl Fn(&M) -> bool,
) -> Result<(), String> {
    match patch.patch.operation {
        PatchOperation::Add => list.push(decode(type_name, patch)?),
        PatchOperation::Remove => list.retain(|x| !matches(x)),
        PatchOperation::Merge => {
            for x in list.iter_mut().filter(|x| matches(x)) {
                merge(x, type_name, patch)?;
            }
        }
        PatchOperation::Replace => {
            let replacement: M = decode(type_name, patch)?;
            for x in list.iter_mut().filter(|x| matches(x)) {
                *x = replacement.clone();
            }
        }
        _ => return Err(unsupported(patch)),
    }
    Ok(())
}

/// Every operation on a list of (network or HTTP) filters. `named` says whether the match names
/// a filter: without one, INSERT_BEFORE inserts first and INSERT_AFTER last, as Istio does.
fn patch_filters<F: Message + Default + Clone>(
    filters: &mut Vec<F>,
    patch: &EnvoyConfigObjectPatch,
    type_name: &str,
    named: bool,
    matches: impl Fn(&F) -> bool,
) -> Result<(), String> {
    let op = patch.patch.operation;
    match op {
        PatchOperation::Add => filters.push(decode(type_name, patch)?),
        PatchOperation::InsertFirst => filters.insert(0, decode(type_name, patch)?),
        PatchOperation::InsertBefore if !named => filters.insert(0, decode(type_name, patch)?),
        PatchOperation::InsertAfter if !named => filters.push(decode(type_name, patch)?),
        PatchOperation::InsertBefore | PatchOperation::InsertAfter => {
            let new: F = decode(type_name, patch)?;
            if let Some(i) = filters.iter().position(&matches) {
                let at = if op == PatchOperation::InsertBefore {
                    i
                } else {
                    i + 1
                };
                filters.insert(at, new);
            }
        }
        PatchOperation::Remove => filters.retain(|f| !matches(f)),
        PatchOperation::Replace => {
            let new: F = decode(type_name, patch)?;
            for f in filters.iter_mut().filter(|f| matches(f)) {
                *f = new.clone();
            }
        }
        PatchOperation::Merge => {
            for f in filters.iter_mut().filter(|f| matches(f)) {
                merge(f, type_name, patch)?;
            }
        }
        PatchOperation::Invalid => return Err(unsupported(patch)),
    }
    Ok(())
}

fn is_inbound_listener(l: &Listener) -> bool {
    l.name == VIRTUAL_INBOUND_LISTENER
        || l.filter_chains
            .first()
            .is_some_and(|c| c.name.starts_with("inbound|"))
}

fn listener_port(l: &Listener) -> Option<u32> {
    match l.address.as_ref()?.address.as_ref()? {
        AddressKind::SocketAddress(sa) => match sa.port_specifier.as_ref()? {
            PortSpecifier::PortValue(p) => Some(*p),
            PortSpecifier::NamedPort(_) => None,
        },
        _ => None,
    }
}

/// Whether a patch of `context` reaches the `inbound` (or outbound) side of a `proxy`: `GATEWAY`
/// only gateways, `SIDECAR_INBOUND`/`SIDECAR_OUTBOUND` only sidecars (and proxyless clients,
/// which have an outbound side only), `ANY` every proxy. A gateway has no inbound side.
fn context_matches(context: PatchContext, proxy: ProxyKind, inbound: bool) -> bool {
    let gateway = proxy == ProxyKind::Router;
    if gateway && inbound {
        return false;
    }
    match context {
        PatchContext::Any => true,
        PatchContext::Gateway => gateway,
        PatchContext::SidecarInbound => !gateway && inbound,
        PatchContext::SidecarOutbound => !gateway && !inbound,
    }
}

fn listener_matches(l: &Listener, m: &EnvoyConfigObjectMatch, proxy: ProxyKind) -> bool {
    if !context_matches(m.context, proxy, is_inbound_listener(l)) {
        return false;
    }
    let Some(lm) = &m.listener else { return true };
    lm.port_number.is_none_or(|p| listener_port(l) == Some(p))
        && (lm.name.is_empty() || lm.name == l.name)
}

fn any_chain_matches(l: &Listener, lm: &ListenerMatch) -> bool {
    l.filter_chains
        .iter()
        .any(|c| chain_matches(c, lm.filter_chain.as_ref()))
}

fn chain_matches(chain: &FilterChain, m: Option<&FilterChainMatch>) -> bool {
    let Some(m) = m else { return true };
    if !m.name.is_empty() && m.name != chain.name {
        return false;
    }
    let Some(fm) = &m.filter else { return true };
    chain.filters.iter().any(|f| {
        (fm.name.is_empty() || f.name == fm.name)
            && fm
                .sub_filter
                .as_ref()
                .is_none_or(|sub| sub.name.is_empty() || http_filter_names(f).contains(&sub.name))
    })
}

fn http_filter_names(f: &Filter) -> Vec<String> {
    if f.name != HTTP_CONNECTION_MANAGER {
        return Vec::new();
    }
    let Some(FilterConfigType::TypedConfig(any)) = &f.config_type else {
        return Vec::new();
    };
    HttpConnectionManager::decode(any.value.as_slice())
        .map(|hcm| hcm.http_filters.into_iter().map(|h| h.name).collect())
        .unwrap_or_default()
}

fn route_matches(r: &RouteConfiguration, m: Option<&RouteConfigurationMatch>) -> bool {
    let Some(m) = m else { return true };
    m.port_number.is_none_or(|p| route_port(&r.name) == Some(p))
        && (m.name.is_empty() || m.name == r.name)
}

/// The port a route configuration is named after: `9080` (a sidecar's outbound port),
/// `inbound|9080||` (a sidecar's inbound port), `http.8080` and `https.443.…` (a gateway's
/// server port), as Istio names them.
fn route_port(name: &str) -> Option<u32> {
    let digits = if let Some(rest) = name.strip_prefix("inbound|") {
        rest.split('|').next()
    } else if let Some(rest) = name
        .strip_prefix("http.")
        .or_else(|| name.strip_prefix("https."))
    {
        rest.split('.').next()
    } else {
        Some(name)
    };
    digits?.parse().ok()
}

fn http_route_matches(r: &Route, m: &RouteMatch) -> bool {
    let action = matches!(
        (&r.action, m.action),
        (_, RouteAction::Any)
            | (Some(EnvoyRouteAction::Route(_)), RouteAction::Route)
            | (Some(EnvoyRouteAction::Redirect(_)), RouteAction::Redirect)
            | (
                Some(EnvoyRouteAction::DirectResponse(_)),
                RouteAction::DirectResponse
            )
    );
    action && (m.name.is_empty() || m.name == r.name)
}

fn cluster_matches(c: &Cluster, m: &EnvoyConfigObjectMatch, proxy: ProxyKind) -> bool {
    let inbound = c.name.starts_with("inbound|") || c.name == INBOUND_PASSTHROUGH_CLUSTER;
    if !context_matches(m.context, proxy, inbound) {
        return false;
    }
    let Some(cm): Option<&ClusterMatch> = m.cluster.as_ref() else {
        return true;
    };
    if !cm.name.is_empty() && cm.name != c.name {
        return false;
    }
    // `outbound|<port>|<subset>|<host>`
    let mut parts = c.name.splitn(4, '|');
    let (_, port, _, host) = (parts.next(), parts.next(), parts.next(), parts.next());
    cm.port_number
        .is_none_or(|p| port == Some(p.to_string().as_str()))
        && (cm.service.is_empty() || host == Some(cm.service.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshplane_crds::networking::Patch;

    fn insert(op: PatchOperation, name: &str) -> EnvoyConfigObjectPatch {
        EnvoyConfigObjectPatch {
            apply_to: ApplyTo::HttpFilter,
            match_: None,
            patch: Patch {
                operation: op,
                value: Some(serde_json::json!({"name": name})),
            },
        }
    }

    fn names(filters: &[HttpFilter]) -> Vec<&str> {
        filters.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn http_route_patches_reach_the_routes_the_match_names() {
        use envoy_types::pb::envoy::config::route::v3::{
            DirectResponseAction, RouteAction as EnvoyRoute,
        };
        let route = |name: &str, action: EnvoyRouteAction| Route {
            name: name.into(),
            action: Some(action),
            ..Default::default()
        };
        let mut out = Translated {
            routes: vec![RouteConfiguration {
                name: "9080".into(),
                virtual_hosts: vec![VirtualHost {
                    name: "ratings.bookinfo.svc.cluster.local:9080".into(),
                    routes: vec![
                        route("limited", EnvoyRouteAction::Route(EnvoyRoute::default())),
                        route(
                            "default",
                            EnvoyRouteAction::DirectResponse(DirectResponseAction::default()),
                        ),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        // Istio's per-route local rate limit: typed_per_filter_config merged into the route.
        let patch: EnvoyConfigObjectPatch = serde_json::from_value(serde_json::json!({
            "applyTo": "HTTP_ROUTE",
            "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"portNumber": 9080,
                "vhost": {"name": "ratings.bookinfo.svc.cluster.local:9080",
                          "route": {"name": "limited", "action": "ROUTE"}}}},
            "patch": {"operation": "MERGE", "value": {"typed_per_filter_config": {
                "envoy.filters.http.local_ratelimit": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
                    "stat_prefix": "http_local_rate_limiter",
                    "token_bucket": {"max_tokens": 10, "tokens_per_fill": 10, "fill_interval": "60s"}}}}}
        }))
        .expect("a patch");
        apply_patch(&patch, ProxyKind::Sidecar, &mut out).expect("applies");
        let routes = &out.routes[0].virtual_hosts[0].routes;
        assert!(routes[0]
            .typed_per_filter_config
            .contains_key("envoy.filters.http.local_ratelimit"));
        assert!(
            routes[1].typed_per_filter_config.is_empty(),
            "other routes untouched"
        );
        // The action narrows: no ROUTE named "default" exists, so nothing changes.
        let mut by_action = patch.clone();
        if let Some(vh) = by_action
            .match_
            .as_mut()
            .and_then(|m| m.route_configuration.as_mut())
            .and_then(|r| r.vhost.as_mut())
        {
            vh.route = Some(RouteMatch {
                name: "default".into(),
                action: RouteAction::Route,
            });
        }
        apply_patch(&by_action, ProxyKind::Sidecar, &mut out).expect("applies");
        assert!(out.routes[0].virtual_hosts[0].routes[1]
            .typed_per_filter_config
            .is_empty());
        // INSERT_FIRST adds a route before the others.
        let insert: EnvoyConfigObjectPatch = serde_json::from_value(serde_json::json!({
            "applyTo": "HTTP_ROUTE",
            "match": {"routeConfiguration": {"vhost": {"name": "ratings.bookinfo.svc.cluster.local:9080"}}},
            "patch": {"operation": "INSERT_FIRST", "value": {"name": "health", "match": {"path": "/healthz"},
                "direct_response": {"status": 200}}}
        }))
        .expect("a patch");
        apply_patch(&insert, ProxyKind::Sidecar, &mut out).expect("applies");
        let names: Vec<&str> = out.routes[0].virtual_hosts[0]
            .routes
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(names, ["health", "limited", "default"]);
    }

    /// A sidecar's outbound route configuration and cluster, its inbound listener with an inline
    /// route configuration, and a gateway's route configuration.
    fn mk_resources() -> Translated {
        use envoy_types::pb::google::protobuf::Any;
        let vhost = |name: &str| VirtualHost {
            name: name.into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "default".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let hcm = HttpConnectionManager {
            route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
                name: "inbound|8080||".into(),
                virtual_hosts: vec![vhost("inbound|http")],
                ..Default::default()
            })),
            ..Default::default()
        };
        Translated {
            listeners: vec![Listener {
                name: VIRTUAL_INBOUND_LISTENER.into(),
                filter_chains: vec![FilterChain {
                    name: "inbound|8080||".into(),
                    filters: vec![Filter {
                        name: HTTP_CONNECTION_MANAGER.into(),
                        config_type: Some(FilterConfigType::TypedConfig(Any {
                            type_url: format!("type.googleapis.com/{HCM}"),
                            value: hcm.encode_to_vec(),
                        })),
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            routes: vec![
                RouteConfiguration {
                    name: "9080".into(),
                    virtual_hosts: vec![vhost("ratings:9080")],
                    ..Default::default()
                },
                RouteConfiguration {
                    name: "http.8080".into(),
                    virtual_hosts: vec![vhost("shop.example.com:80")],
                    ..Default::default()
                },
            ],
            clusters: vec![Cluster {
                name: "outbound|9080||ratings".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    const HCM: &str =
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

    /// The route configurations of `out` that carry a `x-patched` response header: RDS ones by
    /// name, the inbound listener's inline one as `inbound`.
    fn patched(out: &Translated) -> Vec<String> {
        let marked = |r: &RouteConfiguration| {
            r.response_headers_to_add
                .iter()
                .chain(
                    r.virtual_hosts
                        .iter()
                        .flat_map(|v| v.response_headers_to_add.iter()),
                )
                .chain(r.virtual_hosts.iter().flat_map(|v| {
                    v.routes
                        .iter()
                        .flat_map(|x| x.response_headers_to_add.iter())
                }))
                .any(|h| h.header.as_ref().is_some_and(|h| h.key == "x-patched"))
        };
        let mut names: Vec<String> = out
            .routes
            .iter()
            .filter(|r| marked(r))
            .map(|r| r.name.clone())
            .collect();
        for l in &out.listeners {
            for f in l.filter_chains.iter().flat_map(|c| c.filters.iter()) {
                let Some(FilterConfigType::TypedConfig(any)) = &f.config_type else {
                    continue;
                };
                let hcm = HttpConnectionManager::decode(any.value.as_slice()).expect("hcm");
                if let Some(RouteSpecifier::RouteConfig(r)) = &hcm.route_specifier {
                    if marked(r) {
                        names.push("inbound".into());
                    }
                }
            }
        }
        names
    }

    fn header_patch(apply_to: &str, context: &str, port: Option<u32>) -> EnvoyConfigObjectPatch {
        let mut rc = serde_json::json!({});
        if let Some(port) = port {
            rc["portNumber"] = port.into();
        }
        serde_json::from_value(serde_json::json!({
            "applyTo": apply_to,
            "match": {"context": context, "routeConfiguration": rc},
            "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [
                {"header": {"key": "x-patched", "value": "1"}}]}}
        }))
        .expect("a patch")
    }

    #[test]
    fn contexts_reach_the_proxies_and_sides_istio_says() {
        for (apply_to, context, port, proxy, want) in [
            (
                "ROUTE_CONFIGURATION",
                "GATEWAY",
                None,
                ProxyKind::Router,
                vec!["9080", "http.8080"],
            ),
            (
                "ROUTE_CONFIGURATION",
                "GATEWAY",
                None,
                ProxyKind::Sidecar,
                vec![],
            ),
            (
                "ROUTE_CONFIGURATION",
                "SIDECAR_OUTBOUND",
                None,
                ProxyKind::Router,
                vec![],
            ),
            (
                "ROUTE_CONFIGURATION",
                "SIDECAR_OUTBOUND",
                None,
                ProxyKind::Sidecar,
                vec!["9080", "http.8080"],
            ),
            (
                "ROUTE_CONFIGURATION",
                "SIDECAR_INBOUND",
                None,
                ProxyKind::Sidecar,
                vec!["inbound"],
            ),
            (
                "ROUTE_CONFIGURATION",
                "ANY",
                Some(8080),
                ProxyKind::Sidecar,
                vec!["http.8080", "inbound"],
            ),
            (
                "VIRTUAL_HOST",
                "SIDECAR_INBOUND",
                Some(8080),
                ProxyKind::Sidecar,
                vec!["inbound"],
            ),
            (
                "VIRTUAL_HOST",
                "SIDECAR_INBOUND",
                Some(9080),
                ProxyKind::Sidecar,
                vec![],
            ),
            (
                "HTTP_ROUTE",
                "SIDECAR_INBOUND",
                None,
                ProxyKind::Sidecar,
                vec!["inbound"],
            ),
            (
                "HTTP_ROUTE",
                "GATEWAY",
                Some(8080),
                ProxyKind::Router,
                vec!["http.8080"],
            ),
            (
                "HTTP_ROUTE",
                "GATEWAY",
                Some(8080),
                ProxyKind::Sidecar,
                vec![],
            ),
        ] {
            let mut out = mk_resources();
            apply_patch(&header_patch(apply_to, context, port), proxy, &mut out).expect("applies");
            let mut got = patched(&out);
            got.sort();
            assert_eq!(got, want, "{apply_to} {context} {port:?} on {proxy:?}");
        }
    }

    #[test]
    fn cluster_and_listener_patches_follow_the_context() {
        let patch = |apply_to: &str, context: &str| -> EnvoyConfigObjectPatch {
            serde_json::from_value(serde_json::json!({
                "applyTo": apply_to,
                "match": {"context": context},
                "patch": {"operation": "REMOVE"}
            }))
            .expect("a patch")
        };
        for (context, proxy, removed) in [
            ("GATEWAY", ProxyKind::Router, true),
            ("GATEWAY", ProxyKind::Sidecar, false),
            ("SIDECAR_OUTBOUND", ProxyKind::Router, false),
            ("SIDECAR_OUTBOUND", ProxyKind::Sidecar, true),
            ("ANY", ProxyKind::Router, true),
        ] {
            let mut out = mk_resources();
            apply_patch(&patch("CLUSTER", context), proxy, &mut out).expect("applies");
            assert_eq!(
                out.clusters.is_empty(),
                removed,
                "CLUSTER {context} on {proxy:?}"
            );
        }
        let mut out = mk_resources();
        apply_patch(
            &patch("LISTENER", "SIDECAR_INBOUND"),
            ProxyKind::Router,
            &mut out,
        )
        .expect("applies");
        assert_eq!(
            out.listeners.len(),
            1,
            "SIDECAR_INBOUND never reaches a gateway"
        );
        apply_patch(
            &patch("LISTENER", "SIDECAR_INBOUND"),
            ProxyKind::Sidecar,
            &mut out,
        )
        .expect("applies");
        assert!(
            out.listeners.is_empty(),
            "SIDECAR_INBOUND reaches virtualInbound"
        );
    }

    #[test]
    fn route_configurations_are_matched_by_the_port_in_their_name() {
        assert_eq!(route_port("9080"), Some(9080));
        assert_eq!(route_port("inbound|8080||"), Some(8080));
        assert_eq!(route_port("http.8080"), Some(8080));
        assert_eq!(route_port("https.443.web.shop-gw.shop"), Some(443));
        assert_eq!(route_port("ratings.bookinfo:9080"), None);
    }

    #[test]
    fn inserts_without_a_named_filter_go_first_or_last_as_istio_does() {
        let named = |n: &str| HttpFilter {
            name: n.into(),
            ..Default::default()
        };
        let mut filters = vec![named("a"), named("router")];
        let any = |_: &HttpFilter| true;
        patch_filters(
            &mut filters,
            &insert(PatchOperation::InsertBefore, "first"),
            HTTP_FILTER,
            false,
            any,
        )
        .expect("applies");
        patch_filters(
            &mut filters,
            &insert(PatchOperation::InsertAfter, "last"),
            HTTP_FILTER,
            false,
            any,
        )
        .expect("applies");
        assert_eq!(names(&filters), ["first", "a", "router", "last"]);
        // With a named filter, next to it; a name nobody has inserts nothing.
        let router = |f: &HttpFilter| f.name == "router";
        patch_filters(
            &mut filters,
            &insert(PatchOperation::InsertBefore, "rl"),
            HTTP_FILTER,
            true,
            router,
        )
        .expect("applies");
        patch_filters(
            &mut filters,
            &insert(PatchOperation::InsertAfter, "x"),
            HTTP_FILTER,
            true,
            |f: &HttpFilter| f.name == "nobody",
        )
        .expect("applies");
        assert_eq!(names(&filters), ["first", "a", "rl", "router", "last"]);
    }
}
