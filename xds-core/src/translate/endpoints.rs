//! Load assignments of outbound EDS clusters: a host's endpoints, and for a subset cluster
//! (`outbound|port|subset|host`) only those whose workload carries the subset's labels.
//!
//! One function serves the full render and the endpoint-only patch of the index, so a patched
//! configuration equals a fresh one.

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;

use super::envoy::load_assignment;
use super::registry::{
    outbound_cluster_name, parse_outbound_cluster_name, EndpointModel, Registry,
};
use super::traffic::{destination_rule, labels_match};

/// The load assignment of EDS cluster `cluster_name` for proxies of `proxy_namespace` (subsets
/// are defined by the DestinationRule that applies to that namespace).
pub fn outbound_load_assignment(
    registry: &Registry,
    proxy_namespace: &str,
    cluster_name: &str,
) -> ClusterLoadAssignment {
    let endpoints = subset_endpoints(registry, proxy_namespace, cluster_name);
    load_assignment(cluster_name, &endpoints)
}

/// The endpoints of an outbound cluster (see [`outbound_load_assignment`]).
pub fn subset_endpoints(
    registry: &Registry,
    proxy_namespace: &str,
    cluster_name: &str,
) -> Vec<EndpointModel> {
    let Some((port, subset, host)) = parse_outbound_cluster_name(cluster_name) else {
        return registry
            .endpoints
            .get(cluster_name)
            .cloned()
            .unwrap_or_default();
    };
    let all = registry
        .endpoints
        .get(&outbound_cluster_name(port, host))
        .map(Vec::as_slice)
        .unwrap_or_default();
    if subset.is_empty() {
        return all.to_vec();
    }
    let Some(labels) = subset_labels(registry, proxy_namespace, host, subset) else {
        // An unknown subset has no endpoints (requests to it fail with 503, as in Istio).
        return Vec::new();
    };
    all.iter()
        .filter(|ep| labels_match(&labels, &ep.labels))
        .cloned()
        .collect()
}

/// The TCP idle timeout (`connectionPool.tcp.idleTimeout`) of an outbound cluster for proxies
/// of `proxy_namespace`.
pub fn tcp_idle_timeout(
    registry: &Registry,
    proxy_namespace: &str,
    cluster_name: &str,
) -> Option<std::time::Duration> {
    let (port, subset, host) = parse_outbound_cluster_name(cluster_name)?;
    let host_namespace = host_namespace(registry, proxy_namespace, host);
    let rule = destination_rule(registry, proxy_namespace, host, host_namespace)?;
    let subset = (!subset.is_empty()).then_some(subset);
    super::traffic::effective_policy(&rule, port, subset)
        .connection_pool?
        .tcp?
        .idle_timeout
        .map(|d| d.get())
}

/// The namespace of `host` as a proxy of `proxy_namespace` imports it: its own namespace's
/// declaration first.
fn host_namespace<'a>(registry: &'a Registry, proxy_namespace: &str, host: &str) -> &'a str {
    registry
        .services_named(host)
        .find(|s| s.namespace == proxy_namespace)
        .or_else(|| registry.services_named(host).next())
        .map(|s| s.namespace.as_str())
        .unwrap_or_default()
}

/// Labels of `subset` of `host` for proxies of `proxy_namespace`.
pub fn subset_labels(
    registry: &Registry,
    proxy_namespace: &str,
    host: &str,
    subset: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    let host_namespace = host_namespace(registry, proxy_namespace, host);
    destination_rule(registry, proxy_namespace, host, host_namespace)?
        .subset(subset)
        .map(|s| s.labels.clone())
}
