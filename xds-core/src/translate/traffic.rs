//! Which VirtualService, DestinationRule and Gateway apply to what a proxy sends, following
//! Istio's rules (docs/traffic.md has the user-facing statement):
//!
//! - **Visibility.** `exportTo` works as for Services (`*` default, `.`, `~`, namespace names)
//!   and never reaches past the tenant: the registry holds the tenant's objects only.
//! - **VirtualService per host, sidecars (`mesh`).** For a host, the VirtualServices bound to
//!   `mesh`, visible to the proxy and naming the host are candidates; one naming the host
//!   exactly beats one matching it by wildcard, then the oldest wins (creation time, then
//!   namespace and name). The others are not merged; they are reported as `HostConflict`.
//! - **VirtualServices on a gateway.** Those bound to the same gateway for the same host are
//!   merged in creation order when they come from one namespace (Istio merges them; catch-all
//!   routes go last); a host already claimed from another namespace is refused for the later
//!   namespace (meshplane's rule, so one team cannot take another's host on a shared gateway).
//! - **DestinationRule per host.** Looked up in the proxy's namespace, then the host's
//!   namespace, then the control namespace, then any other namespace that exports one to the
//!   proxy; within the first namespace that has one, the most specific host wins (exact, then
//!   the longest wildcard). Several rules for the same host in one namespace merge: subsets are
//!   united (the oldest keeps a duplicated name) and the oldest traffic policy applies.

use std::collections::BTreeMap;

use meshplane_crds::networking::destination_rule::{
    ClientTlsSettings, ConnectionPoolSettings, LoadBalancerSettings, OutlierDetection, Subset,
    TrafficPolicy,
};
use meshplane_crds::networking::resolve_host;
use meshplane_crds::networking::virtual_service::Destination;
use meshplane_crds::validation::traffic::MESH_GATEWAY;
use meshplane_crds::{DestinationRule, VirtualService};

use super::registry::Registry;

/// Whether an `exportTo` list (empty: everyone in the tenant) lets `proxy_namespace` see an
/// object of `namespace`.
pub fn exported_to(export_to: &[String], namespace: &str, proxy_namespace: &str) -> bool {
    export_to.is_empty()
        || export_to.iter().any(|e| match e.as_str() {
            "*" => true,
            "." => namespace == proxy_namespace,
            "~" => false,
            ns => ns == proxy_namespace,
        })
}

/// Whether a host pattern (`web.shop.svc.cluster.local`, `*.example.com`, `*`) covers
/// `hostname` (itself maybe a wildcard, covered when it is narrower).
pub fn host_matches(pattern: &str, hostname: &str) -> bool {
    if pattern == "*" || pattern.eq_ignore_ascii_case(hostname) {
        return true;
    }
    match pattern.strip_prefix('*') {
        Some(suffix) => {
            hostname.len() > suffix.len()
                && hostname
                    .to_ascii_lowercase()
                    .ends_with(&suffix.to_ascii_lowercase())
        }
        None => false,
    }
}

/// How specifically a pattern matches: exact beats any wildcard, longer wildcards beat
/// shorter ones.
fn specificity(pattern: &str, hostname: &str) -> Option<usize> {
    if pattern.eq_ignore_ascii_case(hostname) {
        Some(usize::MAX)
    } else if host_matches(pattern, hostname) {
        Some(pattern.len())
    } else {
        None
    }
}

fn namespace_of<K: kube_core::Resource>(o: &K) -> &str {
    o.meta().namespace.as_deref().unwrap_or_default()
}

fn name_of<K: kube_core::Resource>(o: &K) -> &str {
    o.meta().name.as_deref().unwrap_or_default()
}

/// A gateway a VirtualService (or one of its matches) binds to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GatewayRef {
    /// Every sidecar.
    Mesh,
    /// A Gateway object.
    Gateway { namespace: String, name: String },
}

/// `gateways` entries as references, relative to `namespace`; empty means `mesh`.
pub fn resolve_gateways(gateways: &[String], namespace: &str) -> Vec<GatewayRef> {
    if gateways.is_empty() {
        return vec![GatewayRef::Mesh];
    }
    gateways
        .iter()
        .map(|g| {
            if g == MESH_GATEWAY {
                return GatewayRef::Mesh;
            }
            match g.split_once('/') {
                Some((ns, name)) => GatewayRef::Gateway {
                    namespace: if ns == "." { namespace } else { ns }.to_string(),
                    name: name.to_string(),
                },
                None => GatewayRef::Gateway {
                    namespace: namespace.to_string(),
                    name: g.clone(),
                },
            }
        })
        .collect()
}

/// The hosts of a VirtualService, short names resolved in its namespace.
pub fn vs_hosts(vs: &VirtualService) -> Vec<String> {
    let ns = namespace_of(vs);
    vs.spec.hosts.iter().map(|h| resolve_host(h, ns)).collect()
}

/// Every destination a VirtualService sends to: its HTTP routes and mirrors, its TCP and TLS
/// routes.
pub fn vs_destinations(vs: &VirtualService) -> impl Iterator<Item = &Destination> {
    let http = vs.spec.http.iter().flat_map(|r| {
        r.route
            .iter()
            .map(|d| &d.destination)
            .chain(r.mirror.iter())
            .chain(r.mirrors.iter().map(|m| &m.destination))
    });
    let tcp = vs
        .spec
        .tcp
        .iter()
        .flat_map(|r| r.route.iter().map(|d| &d.destination));
    let tls = vs
        .spec
        .tls
        .iter()
        .flat_map(|r| r.route.iter().map(|d| &d.destination));
    http.chain(tcp).chain(tls)
}

/// Whether a VirtualService names `hostname`, among its hosts or its destinations (short names
/// resolved in its namespace, wildcards covering it): whether what it renders may depend on
/// that host.
pub fn vs_names_host(vs: &VirtualService, hostname: &str) -> bool {
    let ns = namespace_of(vs);
    vs_hosts(vs).iter().any(|h| host_matches(h, hostname))
        || vs_destinations(vs).any(|d| host_matches(&resolve_host(&d.host, ns), hostname))
}

/// The VirtualService bound to `mesh` that routes `hostname` for proxies of
/// `proxy_namespace`, if any.
pub fn mesh_virtual_service<'a>(
    registry: &'a Registry,
    proxy_namespace: &str,
    hostname: &str,
) -> Option<&'a VirtualService> {
    mesh_candidates(registry, proxy_namespace, hostname)
        .into_iter()
        .next()
}

/// Every VirtualService bound to `mesh` naming `hostname` and visible to `proxy_namespace`,
/// the winner first.
pub fn mesh_candidates<'a>(
    registry: &'a Registry,
    proxy_namespace: &str,
    hostname: &str,
) -> Vec<&'a VirtualService> {
    let mut found: Vec<(usize, usize, &VirtualService)> = registry
        .virtual_services
        .iter()
        .enumerate()
        .filter(|(_, vs)| {
            resolve_gateways(&vs.spec.gateways, namespace_of(*vs)).contains(&GatewayRef::Mesh)
                && exported_to(&vs.spec.export_to, namespace_of(*vs), proxy_namespace)
        })
        .filter_map(|(i, vs)| {
            vs_hosts(vs)
                .iter()
                .filter_map(|h| specificity(h, hostname))
                .max()
                .map(|s| (s, i, vs))
        })
        .collect();
    // Most specific first, then registry order (oldest first).
    found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    // Mesh routes of the Gateway API for exactly this host come first (consumer routes before
    // producer routes): they win over VirtualServices (see `gamma`).
    let gamma = registry
        .gateway_api
        .mesh
        .virtual_services
        .iter()
        .filter(|vs| {
            exported_to(&vs.spec.export_to, namespace_of(*vs), proxy_namespace)
                && vs.spec.hosts.iter().any(|h| h == hostname)
        });
    gamma
        .chain(found.into_iter().map(|(_, _, vs)| vs))
        .collect()
}

/// The DestinationRule(s) that apply to `hostname` (declared in `host_namespace`) for proxies
/// of `proxy_namespace`, merged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AppliedRule {
    /// Namespace of the rules.
    pub namespace: String,
    /// Names of the merged rules, oldest first.
    pub names: Vec<String>,
    /// The oldest traffic policy of the merged rules.
    pub traffic_policy: Option<TrafficPolicy>,
    /// Subsets of all merged rules (first definition of a name wins).
    pub subsets: Vec<Subset>,
}

impl AppliedRule {
    /// A subset by name.
    pub fn subset(&self, name: &str) -> Option<&Subset> {
        self.subsets.iter().find(|s| s.name == name)
    }
}

/// See the module documentation for the lookup order.
pub fn destination_rule(
    registry: &Registry,
    proxy_namespace: &str,
    hostname: &str,
    host_namespace: &str,
) -> Option<AppliedRule> {
    let visible: Vec<&DestinationRule> = registry
        .destination_rules
        .iter()
        .filter(|dr| exported_to(&dr.spec.export_to, namespace_of(*dr), proxy_namespace))
        .collect();
    let in_namespace = |ns: &str| -> Option<AppliedRule> {
        let matching: Vec<(usize, &DestinationRule)> = visible
            .iter()
            .filter(|dr| namespace_of(**dr) == ns)
            .filter_map(|dr| {
                specificity(&resolve_host(&dr.spec.host, ns), hostname).map(|s| (s, *dr))
            })
            .collect();
        let best = matching.iter().map(|(s, _)| *s).max()?;
        let mut rule = AppliedRule {
            namespace: ns.to_string(),
            ..AppliedRule::default()
        };
        for (_, dr) in matching.iter().filter(|(s, _)| *s == best) {
            rule.names.push(name_of(*dr).to_string());
            if rule.traffic_policy.is_none() {
                rule.traffic_policy = dr.spec.traffic_policy.clone();
            }
            for subset in &dr.spec.subsets {
                if rule.subset(&subset.name).is_none() {
                    rule.subsets.push(subset.clone());
                }
            }
        }
        Some(rule)
    };
    let mut order: Vec<&str> = vec![proxy_namespace, host_namespace, &registry.control_namespace];
    for dr in &visible {
        let ns = namespace_of(*dr);
        if !order.contains(&ns) {
            order.push(ns);
        }
    }
    order.into_iter().find_map(in_namespace)
}

/// The parts of a traffic policy in effect for one port (and subset): port-level settings
/// override the rule's, the subset's override both.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EffectivePolicy {
    pub load_balancer: Option<LoadBalancerSettings>,
    pub connection_pool: Option<ConnectionPoolSettings>,
    pub outlier_detection: Option<OutlierDetection>,
    pub tls: Option<ClientTlsSettings>,
}

impl EffectivePolicy {
    fn overlay(&mut self, p: &TrafficPolicy, port: u32) {
        fn set<T: Clone>(slot: &mut Option<T>, v: &Option<T>) {
            if v.is_some() {
                slot.clone_from(v);
            }
        }
        set(&mut self.load_balancer, &p.load_balancer);
        set(&mut self.connection_pool, &p.connection_pool);
        set(&mut self.outlier_detection, &p.outlier_detection);
        set(&mut self.tls, &p.tls);
        if let Some(pl) = p
            .port_level_settings
            .iter()
            .find(|pl| pl.port.number == port)
        {
            set(&mut self.load_balancer, &pl.load_balancer);
            set(&mut self.connection_pool, &pl.connection_pool);
            set(&mut self.outlier_detection, &pl.outlier_detection);
            set(&mut self.tls, &pl.tls);
        }
    }

    /// Whether no setting applies.
    pub fn is_empty(&self) -> bool {
        *self == EffectivePolicy::default()
    }
}

/// The policy for `port` of the rule's host, and of `subset` when given.
pub fn effective_policy(rule: &AppliedRule, port: u32, subset: Option<&str>) -> EffectivePolicy {
    let mut out = EffectivePolicy::default();
    if let Some(p) = &rule.traffic_policy {
        out.overlay(p, port);
    }
    if let Some(p) = subset
        .and_then(|s| rule.subset(s))
        .and_then(|s| s.traffic_policy.as_ref())
    {
        out.overlay(p, port);
    }
    out
}

/// Whether `labels` carry every label of `selector`.
pub fn labels_match(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns() {
        assert!(host_matches("*", "a.b"));
        assert!(host_matches("*.example.com", "api.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(host_matches(
            "Web.Shop.svc.cluster.local",
            "web.shop.svc.cluster.local"
        ));
        assert_eq!(
            specificity("a.example.com", "a.example.com"),
            Some(usize::MAX)
        );
        assert!(
            specificity("*.a.example.com", "x.a.example.com")
                > specificity("*.example.com", "x.a.example.com")
        );
    }

    #[test]
    fn gateway_references_resolve_in_the_namespace() {
        assert_eq!(resolve_gateways(&[], "shop"), vec![GatewayRef::Mesh]);
        assert_eq!(
            resolve_gateways(&["gw".into(), "edge/pub".into(), "mesh".into()], "shop"),
            vec![
                GatewayRef::Gateway {
                    namespace: "shop".into(),
                    name: "gw".into()
                },
                GatewayRef::Gateway {
                    namespace: "edge".into(),
                    name: "pub".into()
                },
                GatewayRef::Mesh,
            ]
        );
    }

    #[test]
    fn export_to() {
        assert!(exported_to(&[], "a", "b"));
        assert!(exported_to(&[".".into()], "a", "a"));
        assert!(!exported_to(&[".".into()], "a", "b"));
        assert!(exported_to(&["b".into()], "a", "b"));
        assert!(!exported_to(&["~".into()], "a", "a"));
    }
}
