//! A Service change spliced into the cached configurations of sidecar scopes.
//!
//! With 10,000 services, rendering a scope again for one new Service translates and encodes
//! 10,000 clusters, assignments and virtual hosts to change one of each. When the change can
//! alter nothing but the host's own resources, the index replaces those in the cached
//! configuration instead: its clusters and assignments, and its virtual host in the route
//! configuration of each of its ports, which is reassembled from the other virtual hosts'
//! encodings ([`super::super::route_encoding`]). The result equals a full render
//! (`cached_configurations_equal_fresh_renders_after_every_event`). That holds when:
//!
//! - one Service declares the host, before and after (no ServiceEntry shares its hostname),
//!   with HTTP ports only: TCP ports own filter chains of the port's listener;
//! - no other host claims one of its domains: a route configuration gives a domain to the
//!   first host that claims it, so a neighbour's virtual host could change with it;
//! - the scope is a sidecar's without EnvoyFilters, with the one catch-all egress listener
//!   (one route configuration per port, hosts in registry order: by hostname). In the host's
//!   own namespace too: the inbound side reads the Services selecting the workload only
//!   through the inbound ports, which are part of the scope's key (a proxy whose workload the
//!   Service starts or stops selecting moves to another scope), and the bare short name the
//!   host gains there is one of its claimable domains;
//! - each route configuration the host leaves or joins keeps another host's virtual host, so
//!   it and its listener exist before and after, unchanged but for that virtual host.
//!
//! Anything else drops the scope's configuration, which the next proxy of the scope renders.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use super::super::interner::Interner;
use super::super::route_encoding;
use super::{CachedConfig, EdsIndexMemo, ScopeKey};
use crate::model::{type_url, ProxyConfig, ProxyKind, Resource};
use crate::translate::cluster_id::OutboundCluster;
use crate::translate::registry::{Registry, ServiceModel};
use crate::translate::{self, scope, vhds};

/// A Service change that can be spliced.
pub(super) struct HostChange<'a> {
    hostname: &'a str,
    /// The host's model now, while the Service exists.
    after: Option<&'a ServiceModel>,
    /// Ports of its models, before and after.
    ports: BTreeSet<u32>,
}

impl<'a> HostChange<'a> {
    /// The change whose models before and after are `models` (in `registry`, the state after
    /// it), if it can be spliced.
    pub(super) fn new(registry: &'a Registry, models: &'a [ServiceModel]) -> Option<Self> {
        let hostname = models.first()?.hostname.as_str();
        let mut declared = registry.services_named(hostname);
        let after = declared.next();
        if declared.next().is_some() || models.iter().any(|m| m.hostname != hostname) {
            return None;
        }
        let all: Vec<&ServiceModel> = models.iter().chain(after).collect();
        if all
            .iter()
            .any(|m| m.ports.iter().any(|sp| !sp.protocol.is_http()))
        {
            return None;
        }
        let ports: BTreeSet<u32> = all
            .iter()
            .flat_map(|m| m.ports.iter().map(|sp| sp.port))
            .collect();
        // Its domains as they appear in route configurations: bare, and with each port. One
        // with a colon (IPv6) could equal another's `<domain>:<port>`: not spliced.
        let mut own: HashSet<String> = HashSet::new();
        for m in &all {
            for d in translate::claimable_domains(m) {
                if d.contains(':') {
                    return None;
                }
                own.extend(ports.iter().map(|p| format!("{d}:{p}")));
                own.insert(d);
            }
        }
        let collides = registry
            .services
            .iter()
            .filter(|s| s.hostname != hostname)
            .any(|s| translate::claims_any(s, &own));
        if collides {
            return None;
        }
        Some(HostChange {
            hostname,
            after,
            ports,
        })
    }

    /// Whether `resource` is one of the host's clusters or assignments.
    fn owns(&self, resource: &Resource) -> bool {
        // The host is the name's last part: a name that does not end with it cannot be the
        // host's, which spares parsing the other 9,999 names of a 10,000-service scope.
        resource.name.ends_with(self.hostname)
            && OutboundCluster::parse(&resource.name)
                .is_some_and(|c| c.service.host == self.hostname)
    }
}

/// The configuration of the scope `key` after `change`, or `None` when the scope must be
/// rendered anew.
pub(super) fn splice(
    registry: &Registry,
    key: &ScopeKey,
    cached: &CachedConfig,
    change: &HostChange<'_>,
    interner: &mut Interner,
    indexes: &mut EdsIndexMemo,
) -> Option<CachedConfig> {
    if key.traffic.kind() != ProxyKind::Sidecar || !key.envoy_filters.is_empty() {
        return None;
    }
    let sidecar = key
        .sidecar
        .as_ref()
        .and_then(|k| scope::sidecar_by_key(registry, k));
    let scopes = scope::egress_scopes(sidecar);
    let [egress] = scopes.as_slice() else {
        return None;
    };
    if egress.port.is_some() {
        return None;
    }
    let imported = change.after.filter(|m| {
        m.visible_from(&key.namespace, &registry.mesh_config) && egress.imports(m, &key.namespace)
    });
    let host = imported
        .map(|m| translate::host_outbound(registry, &cached.node, m))
        .unwrap_or_default();

    let mut config = ProxyConfig::clone(&cached.config);
    let mut routes = cached.routes.clone();
    for &port in &change.ports {
        let route_name = port.to_string();
        let vhost_name = vhds::resource_name(
            &route_name,
            &translate::virtual_host_name(change.hostname, port),
        );
        let joining = host
            .virtual_hosts
            .iter()
            .find(|(p, _)| *p == port)
            .map(|(_, vh)| vh.clone());
        let Some(at) = routes.iter().position(|r| r.name == route_name) else {
            if joining.is_some() {
                return None;
            }
            continue;
        };
        let parts = &mut routes[at];
        let leaving = parts
            .virtual_hosts
            .iter()
            .position(|v| v.name == vhost_name);
        if leaving.is_none() && joining.is_none() {
            continue;
        }
        // Besides the catch-all (last) and the host's own, another host's virtual host.
        let others = parts
            .virtual_hosts
            .len()
            .saturating_sub(1 + usize::from(leaving.is_some()));
        if others == 0 {
            return None;
        }
        if let Some(i) = leaving {
            parts.virtual_hosts.remove(i);
        }
        let joined =
            joining.map(|vh| route_encoding::encode_virtual_host(interner, &route_name, vh));
        if let Some(vh) = &joined {
            let catch_all = parts.virtual_hosts.len().saturating_sub(1);
            let suffix = format!(":{port}");
            let at_host = parts.virtual_hosts[..catch_all].partition_point(|v| {
                let name = vhds::inline_name(&route_name, &v.name).unwrap_or_default();
                name.strip_suffix(suffix.as_str()).unwrap_or(&name) < change.hostname
            });
            parts.virtual_hosts.insert(at_host, Arc::clone(vh));
        }
        let inline = route_encoding::assemble(interner, parts);
        if let Some(r) = config.routes.get_mut(at) {
            *r = inline;
        }
        if let Some(v) = &mut config.vhds {
            // Sorted by name: a search, not a comparison with each of 10,000 names.
            if let Ok(i) = v
                .virtual_hosts
                .binary_search_by(|r| r.name.as_str().cmp(vhost_name.as_str()))
            {
                v.virtual_hosts.remove(i);
            }
            if let Some(vh) = joined {
                insert_sorted(&mut v.virtual_hosts, vh);
            }
        }
    }

    config.clusters.retain(|r| !change.owns(r));
    for c in &host.clusters {
        let r = interner.intern(type_url::CLUSTER, c.name.clone(), c);
        insert_sorted(&mut config.clusters, r);
    }
    config.endpoints.retain(|r| !change.owns(r));
    for e in &host.endpoints {
        let r = interner.intern(type_url::ENDPOINT, e.cluster_name.clone(), e);
        insert_sorted(&mut config.endpoints, r);
    }
    Some(CachedConfig::indexed(
        Arc::new(config),
        cached.node.clone(),
        routes,
        indexes,
    ))
}

/// Inserts `r` into `list`, sorted by name.
fn insert_sorted(list: &mut Vec<Arc<Resource>>, r: Arc<Resource>) {
    let at = list.partition_point(|x| x.name < r.name);
    list.insert(at, r);
}
