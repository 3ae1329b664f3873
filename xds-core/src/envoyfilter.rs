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
//! Matching: `context` (`SIDECAR_INBOUND`: `virtualInbound`, bound ingress listeners and
//! `inbound|` clusters; `SIDECAR_OUTBOUND`: the rest; `GATEWAY`: nothing), listener
//! `portNumber`/`name`/`filterChain.name`/`filter.name`/`filter.subFilter.name`, route
//! configuration `portNumber` (outbound route configurations are named by port)/`name`/
//! `vhost.name`, cluster `portNumber`/`service`/`name`. `ROUTE_CONFIGURATION` and
//! `VIRTUAL_HOST` patches reach RDS route configurations only, not the inline routes of
//! inbound listeners.
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

use crate::model::ProxyNode;
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

/// Applies the filters' patches in order; returns the patches that could not be applied.
pub fn apply(filters: &[&EnvoyFilter], out: &mut Translated) -> Vec<PatchError> {
    let mut errors = Vec::new();
    for f in filters {
        for (index, patch) in f.spec.config_patches.iter().enumerate() {
            if let Err(reason) = apply_patch(patch, out) {
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

fn apply_patch(patch: &EnvoyConfigObjectPatch, out: &mut Translated) -> Result<(), String> {
    let m = patch.match_.clone().unwrap_or_default();
    if m.context == PatchContext::Gateway {
        return Ok(());
    }
    match patch.apply_to {
        ApplyTo::Invalid => Err("applyTo must be set".to_string()),
        ApplyTo::Cluster => patch_list(&mut out.clusters, patch, CLUSTER, |c| {
            cluster_matches(c, &m)
        }),
        ApplyTo::Listener => patch_list(&mut out.listeners, patch, LISTENER, |l| {
            listener_matches(l, &m)
                && m.listener
                    .as_ref()
                    .is_none_or(|lm| lm.filter_chain.is_none() || any_chain_matches(l, lm))
        }),
        ApplyTo::RouteConfiguration => {
            patch_list(&mut out.routes, patch, ROUTE_CONFIGURATION, |r| {
                m.context != PatchContext::SidecarInbound
                    && route_matches(r, m.route_configuration.as_ref())
            })
        }
        ApplyTo::VirtualHost => {
            let vhost_name = m
                .route_configuration
                .as_ref()
                .and_then(|r| r.vhost.as_ref())
                .map(|v| v.name.clone())
                .unwrap_or_default();
            for route in out.routes.iter_mut() {
                if m.context == PatchContext::SidecarInbound
                    || !route_matches(route, m.route_configuration.as_ref())
                {
                    continue;
                }
                patch_list(
                    &mut route.virtual_hosts,
                    patch,
                    VIRTUAL_HOST,
                    |v: &VirtualHost| vhost_name.is_empty() || v.name == vhost_name,
                )?;
            }
            Ok(())
        }
        ApplyTo::HttpRoute => {
            let vhost = m
                .route_configuration
                .as_ref()
                .and_then(|r| r.vhost.clone())
                .unwrap_or_default();
            let wanted = vhost.route.clone().unwrap_or_default();
            for route in out.routes.iter_mut() {
                if m.context == PatchContext::SidecarInbound
                    || !route_matches(route, m.route_configuration.as_ref())
                {
                    continue;
                }
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
            }
            Ok(())
        }
        ApplyTo::FilterChain => {
            let lm = m.listener.clone().unwrap_or_default();
            for l in out.listeners.iter_mut() {
                if !listener_matches(l, &m) {
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
                if !listener_matches(l, &m) {
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
                if !listener_matches(l, &m) {
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

fn context_matches(context: PatchContext, inbound: bool) -> bool {
    match context {
        PatchContext::Any => true,
        PatchContext::SidecarInbound => inbound,
        PatchContext::SidecarOutbound => !inbound,
        PatchContext::Gateway => false,
    }
}

fn listener_matches(l: &Listener, m: &EnvoyConfigObjectMatch) -> bool {
    if !context_matches(m.context, is_inbound_listener(l)) {
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
    m.port_number.is_none_or(|p| r.name == p.to_string()) && (m.name.is_empty() || m.name == r.name)
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

fn cluster_matches(c: &Cluster, m: &EnvoyConfigObjectMatch) -> bool {
    let inbound = c.name.starts_with("inbound|") || c.name == INBOUND_PASSTHROUGH_CLUSTER;
    if !context_matches(m.context, inbound) {
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
        apply_patch(&patch, &mut out).expect("applies");
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
        apply_patch(&by_action, &mut out).expect("applies");
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
        apply_patch(&insert, &mut out).expect("applies");
        let names: Vec<&str> = out.routes[0].virtual_hosts[0]
            .routes
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(names, ["health", "limited", "default"]);
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
