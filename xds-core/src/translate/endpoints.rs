//! Load assignments of outbound EDS clusters: a host's endpoints, and for a subset cluster
//! (`outbound|port|subset|host`) only those whose workload carries the subset's labels.
//!
//! One function serves the full render and the endpoint-only patch of the index, so a patched
//! configuration equals a fresh one. What an assignment depends on besides the registry and
//! its cluster's name is said once, by [`AssignmentScope`].

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;

use super::cluster_id::OutboundCluster;
use super::envoy::load_assignment;
use super::mtls::mark_meshed_endpoints;
use super::registry::{EndpointModel, Registry};
use super::traffic::{destination_rule, labels_match};
use crate::model::{ProxyKind, ProxyNode};

/// What the assignment of an EDS cluster depends on besides the registry and the cluster's
/// name: the proxy's namespace (the DestinationRule defining a subset cluster's endpoints) and
/// whether the endpoints carry the mutual TLS marks (every proxy but a proxyless gRPC client;
/// `translate` applies `mtls` to the others). Proxies of equal scopes get the same assignment
/// of every cluster: the index's endpoint patch shares assignments by it
/// ([`AssignmentScope::key`]), the push loop shares an endpoint push's result by it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AssignmentScope {
    pub namespace: String,
    pub marks_meshed: bool,
}

impl AssignmentScope {
    /// The scope of proxies of `kind` in `namespace`.
    pub fn new(namespace: &str, kind: ProxyKind) -> Self {
        AssignmentScope {
            namespace: namespace.to_string(),
            marks_meshed: marks_meshed(kind),
        }
    }

    /// The scope of `node`.
    pub fn of(node: &ProxyNode) -> Self {
        Self::new(&node.namespace, node.kind)
    }

    /// Whether `node` is of this scope.
    pub fn holds(&self, node: &ProxyNode) -> bool {
        self.namespace == node.namespace && self.marks_meshed == marks_meshed(node.kind)
    }

    /// What the assignment of `cluster` is the same for: only a subset cluster's depends on
    /// the namespace.
    pub fn key(&self, cluster: OutboundCluster) -> AssignmentKey {
        AssignmentKey {
            namespace: cluster.is_subset().then(|| self.namespace.clone()),
            marks_meshed: self.marks_meshed,
            cluster,
        }
    }

    /// The assignment of `cluster` for proxies of this scope, as the full render builds it.
    pub fn load_assignment(
        &self,
        registry: &Registry,
        cluster: &OutboundCluster,
    ) -> ClusterLoadAssignment {
        let mut cla = outbound_load_assignment(registry, &self.namespace, cluster);
        if self.marks_meshed {
            mark_meshed_endpoints(registry, &mut cla);
        }
        cla
    }
}

/// Whether proxies of `kind` get the mutual TLS marks on their endpoints.
fn marks_meshed(kind: ProxyKind) -> bool {
    kind != ProxyKind::Grpc
}

/// One cluster's assignment as far as it can differ between proxies ([`AssignmentScope::key`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AssignmentKey {
    /// The namespace of the proxies, for a subset cluster only.
    namespace: Option<String>,
    marks_meshed: bool,
    cluster: OutboundCluster,
}

impl AssignmentKey {
    /// The cluster whose assignment it is.
    pub fn cluster(&self) -> &OutboundCluster {
        &self.cluster
    }
}

/// The load assignment of EDS cluster `cluster` for proxies of `proxy_namespace` (subsets are
/// defined by the DestinationRule that applies to that namespace).
pub fn outbound_load_assignment(
    registry: &Registry,
    proxy_namespace: &str,
    cluster: &OutboundCluster,
) -> ClusterLoadAssignment {
    let endpoints = subset_endpoints(registry, proxy_namespace, cluster);
    load_assignment(&cluster.name(), &endpoints)
}

/// The endpoints of an outbound cluster (see [`outbound_load_assignment`]).
pub fn subset_endpoints(
    registry: &Registry,
    proxy_namespace: &str,
    cluster: &OutboundCluster,
) -> Vec<EndpointModel> {
    let all = registry.endpoints_of(&cluster.service);
    if !cluster.is_subset() {
        return all.to_vec();
    }
    let host = &cluster.service.host;
    let Some(labels) = subset_labels(registry, proxy_namespace, host, &cluster.subset) else {
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
    // Route destinations name their clusters: the one place translation reads a name back.
    let cluster = OutboundCluster::parse(cluster_name)?;
    let host = cluster.service.host.as_str();
    let host_namespace = host_namespace(registry, proxy_namespace, host);
    let rule = destination_rule(registry, proxy_namespace, host, host_namespace)?;
    let subset = cluster.is_subset().then_some(cluster.subset.as_str());
    super::traffic::effective_policy(&rule, cluster.service.port, subset)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_depends_on_the_namespace_only_for_a_subset_cluster_and_on_the_marks() {
        let web = super::super::cluster_id::HostPort::new("web.shop.svc.cluster.local", 80);
        let plain = || OutboundCluster::from(web.clone());
        let subset = || OutboundCluster::new(web.clone(), "v1");
        let shop = AssignmentScope::new("shop", ProxyKind::Sidecar);
        let other = AssignmentScope::new("other", ProxyKind::Sidecar);
        assert_eq!(shop.key(plain()), other.key(plain()));
        assert_ne!(shop.key(subset()), other.key(subset()));
        // Gateways get the marks as sidecars do; proxyless gRPC clients do not.
        let gateway = AssignmentScope::new("shop", ProxyKind::Router);
        let grpc = AssignmentScope::new("shop", ProxyKind::Grpc);
        assert_eq!(shop, gateway);
        assert_ne!(shop.key(plain()), grpc.key(plain()));
        let node = ProxyNode {
            namespace: "shop".into(),
            kind: ProxyKind::Router,
            ..ProxyNode::default()
        };
        assert!(shop.holds(&node) && !other.holds(&node) && !grpc.holds(&node));
        assert_eq!(AssignmentScope::of(&node), shop);
    }
}
