//! Per-key updates of the registry: a Service, EndpointSlice or Pod event changes only the
//! registry entries of the hosts it concerns, instead of rebuilding the registry from every
//! object. What it needs beside the registry ([`Keys`]) is built by the full build and kept
//! in step here; a test checks every step against a full build.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use crate::model::{Kind, Object, ObjectKey};
use crate::translate::cluster_id::HostPort;
use crate::translate::registry::{self, Registry, ServiceModel, ServiceSource};

/// Kinds an event of which updates the registry per key.
pub(super) const KINDS: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Pod];

/// Label naming an EndpointSlice's Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

const ENTRY: u8 = 0;
const SERVICE: u8 = 1;

/// Where a registry service comes from, in the order the registry lists services: by host and
/// namespace, ServiceEntries before Services, then by object name and host position.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Origin {
    hostname: String,
    namespace: String,
    rank: u8,
    name: String,
    index: usize,
}

impl Origin {
    /// Host `index` of ServiceEntry `name`.
    pub(super) fn entry(model: &ServiceModel, name: &str, index: usize) -> Self {
        Self::new(model, ENTRY, name, index)
    }
    /// Kubernetes Service `name`.
    pub(super) fn service(model: &ServiceModel, name: &str) -> Self {
        Self::new(model, SERVICE, name, 0)
    }
    fn new(model: &ServiceModel, rank: u8, name: &str, index: usize) -> Self {
        Origin {
            hostname: model.hostname.clone(),
            namespace: model.namespace.clone(),
            rank,
            name: name.to_string(),
            index,
        }
    }
}

/// What the index keeps beside the registry to update it per key.
#[derive(Clone, Debug, Default)]
pub(super) struct Keys {
    /// Origins of `Registry::services`, position by position.
    origins: Vec<Origin>,
    /// Kubernetes Services of the tenant by (namespace, name).
    pub(super) services: BTreeMap<(String, String), ServiceModel>,
    /// EndpointSlice names of the tenant by (namespace, Service name).
    pub(super) slices: BTreeMap<(String, String), BTreeSet<String>>,
}

impl Keys {
    /// Puts `models` into the registry's order; returns the services and keeps their origins.
    pub(super) fn order(&mut self, mut models: Vec<(Origin, ServiceModel)>) -> Vec<ServiceModel> {
        models.sort_by(|a, b| a.0.cmp(&b.0));
        let (origins, services) = models.into_iter().unzip();
        self.origins = origins;
        services
    }

    /// Positions of the registry services of `hostname`.
    fn host_range(&self, hostname: &str) -> Range<usize> {
        let start = self
            .origins
            .partition_point(|o| o.hostname.as_str() < hostname);
        let end = self
            .origins
            .partition_point(|o| o.hostname.as_str() <= hostname);
        start..end
    }

    fn insert_service(&mut self, reg: &mut Registry, origin: Origin, model: ServiceModel) {
        let at = self.origins.partition_point(|o| *o < origin);
        self.origins.insert(at, origin);
        reg.services.insert(at, model);
    }

    fn remove_service(&mut self, reg: &mut Registry, origin: &Origin) {
        if let Ok(at) = self.origins.binary_search(origin) {
            self.origins.remove(at);
            reg.services.remove(at);
        }
    }

    /// Applies the change of the Kubernetes Service `name` in `namespace` (now `model`):
    /// returns its models before and after (the hosts whose endpoints must be recomputed are
    /// theirs), or `None` when nothing changed.
    pub(super) fn set_service(
        &mut self,
        reg: &mut Registry,
        namespace: &str,
        name: &str,
        model: Option<ServiceModel>,
    ) -> Option<Vec<ServiceModel>> {
        let id = (namespace.to_string(), name.to_string());
        let old = self.services.get(&id).cloned();
        if old == model {
            return None;
        }
        if let Some(m) = &old {
            self.remove_service(reg, &Origin::service(m, name));
            self.services.remove(&id);
        }
        if let Some(m) = &model {
            self.insert_service(reg, Origin::service(m, name), m.clone());
            self.services.insert(id, m.clone());
        }
        Some(old.into_iter().chain(model).collect())
    }

    /// Applies an EndpointSlice change (`before` and `after` are its objects, in the tenant or
    /// not): returns the hosts of the Services it belonged to or belongs to.
    pub(super) fn set_slice(
        &mut self,
        namespace: &str,
        name: &str,
        before: Option<&Object>,
        after: Option<&Object>,
    ) -> BTreeSet<String> {
        let service_of = |o: Option<&Object>| match o {
            Some(Object::EndpointSlice(s)) => s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .cloned(),
            _ => None,
        };
        let (old, new) = (service_of(before), service_of(after));
        if let Some(svc) = &old {
            let id = (namespace.to_string(), svc.clone());
            if let Some(names) = self.slices.get_mut(&id) {
                names.remove(name);
                if names.is_empty() {
                    self.slices.remove(&id);
                }
            }
        }
        if let Some(svc) = &new {
            self.slices
                .entry((namespace.to_string(), svc.clone()))
                .or_default()
                .insert(name.to_string());
        }
        [old, new]
            .into_iter()
            .flatten()
            .filter_map(|svc| self.services.get(&(namespace.to_string(), svc)))
            .map(|m| m.hostname.clone())
            .collect()
    }

    /// Hosts of the ServiceEntries of `namespace` that take endpoints from its pods.
    pub(super) fn pod_selecting_hosts(&self, reg: &Registry, namespace: &str) -> BTreeSet<String> {
        self.origins
            .iter()
            .zip(&reg.services)
            .filter(|(o, svc)| {
                o.rank == ENTRY
                    && svc.namespace == namespace
                    && matches!(
                        svc.source,
                        ServiceSource::Entry {
                            workload_selector: Some(_),
                            ..
                        }
                    )
            })
            .map(|(_, svc)| svc.hostname.clone())
            .collect()
    }

    /// Hosts of the Kubernetes Services of `namespace` whose EndpointSlices hold an endpoint of
    /// the pod `before`/`after` (by `targetRef`, or by address).
    pub(super) fn hosts_with_pod(
        &self,
        objects: &BTreeMap<ObjectKey, Object>,
        namespace: &str,
        before: Option<&Object>,
        after: Option<&Object>,
    ) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut addresses = BTreeSet::new();
        for o in [before, after].into_iter().flatten() {
            if let Object::Pod(p) = o {
                names.extend(p.metadata.name.clone());
                if let Some(status) = &p.status {
                    addresses.extend(status.pod_ip.clone());
                    addresses.extend(status.pod_ips.iter().flatten().map(|i| i.ip.clone()));
                }
            }
        }
        let start = (namespace.to_string(), String::new());
        let mut hosts = BTreeSet::new();
        for ((ns, svc), slices) in self.slices.range(start..) {
            if ns != namespace {
                break;
            }
            let Some(model) = self.services.get(&(ns.clone(), svc.clone())) else {
                continue;
            };
            let holds_pod = slices.iter().any(|name| {
                let key = ObjectKey {
                    kind: Kind::EndpointSlice,
                    namespace: Some(ns.clone()),
                    name: name.clone(),
                };
                let Some(Object::EndpointSlice(slice)) = objects.get(&key) else {
                    return false;
                };
                slice.endpoints.iter().flatten().any(|ep| {
                    ep.target_ref
                        .as_ref()
                        .and_then(|t| t.name.as_ref())
                        .is_some_and(|n| names.contains(n))
                        || ep.addresses.iter().any(|a| addresses.contains(a))
                })
            });
            if holds_pod {
                hosts.insert(model.hostname.clone());
            }
        }
        hosts
    }

    /// Recomputes the endpoints of every port of `hosts` from the objects, as a full build
    /// would (slices in name order, then ServiceEntries' pods); returns the ports whose
    /// endpoints changed.
    pub(super) fn recompute_endpoints(
        &mut self,
        reg: &mut Registry,
        objects: &BTreeMap<ObjectKey, Object>,
        hosts: &BTreeSet<String>,
    ) -> BTreeSet<HostPort> {
        let mut fresh = BTreeMap::new();
        let mut pod_labels: BTreeMap<&str, registry::PodLabels<'_>> = BTreeMap::new();
        for host in hosts {
            let range = self.host_range(host);
            for o in &self.origins[range.clone()] {
                if o.rank != SERVICE {
                    continue;
                }
                let id = (o.namespace.clone(), o.name.clone());
                for name in self.slices.get(&id).into_iter().flatten() {
                    let key = ObjectKey {
                        kind: Kind::EndpointSlice,
                        namespace: Some(o.namespace.clone()),
                        name: name.clone(),
                    };
                    if let Some(Object::EndpointSlice(slice)) = objects.get(&key) {
                        let pods = pod_labels.entry(o.namespace.as_str()).or_insert_with(|| {
                            registry::PodLabels::new(pods_of(objects, &o.namespace))
                        });
                        registry::add_slice_endpoints(slice, &self.services, pods, &mut fresh);
                    }
                }
            }
            for (o, svc) in self.origins[range.clone()].iter().zip(&reg.services[range]) {
                if o.rank == ENTRY {
                    registry::add_entry_pod_endpoints(
                        svc,
                        pods_of(objects, &svc.namespace),
                        &mut fresh,
                    );
                }
            }
        }
        // The registry keeps a host's ports together: what the update may leave stale is one
        // range per host, found without scanning every port of the registry.
        let stale: Vec<HostPort> = hosts
            .iter()
            .flat_map(|h| reg.host_endpoints(h))
            .map(|(service, _)| service)
            .filter(|service| !fresh.contains_key(*service))
            .cloned()
            .collect();
        let mut changed = BTreeSet::new();
        for service in stale {
            reg.endpoints.remove(&service);
            changed.insert(service);
        }
        for (service, endpoints) in fresh {
            if reg.endpoints.get(&service) != Some(&endpoints) {
                reg.endpoints.insert(service.clone(), endpoints);
                changed.insert(service);
            }
        }
        changed
    }
}

/// Whether a Pod's labels or addresses differ between `before` and `after` (either absent).
pub(super) fn labels_or_addresses_changed(before: Option<&Object>, after: Option<&Object>) -> bool {
    let facts = |o: Option<&Object>| match o {
        Some(Object::Pod(p)) => Some((
            p.metadata.labels.clone().unwrap_or_default(),
            p.status
                .as_ref()
                .map(|s| (s.pod_ip.clone(), s.pod_ips.clone())),
        )),
        _ => None,
    };
    facts(before) != facts(after)
}

/// The host a cluster name ends with (`outbound|80||web.shop.svc.cluster.local`).
/// Pods of `namespace`, in name order.
fn pods_of<'a>(
    objects: &'a BTreeMap<ObjectKey, Object>,
    namespace: &'a str,
) -> impl Iterator<Item = &'a k8s_openapi::api::core::v1::Pod> + 'a {
    let start = ObjectKey {
        kind: Kind::Pod,
        namespace: Some(namespace.to_string()),
        name: String::new(),
    };
    objects
        .range(start..)
        .take_while(move |(k, _)| k.kind == Kind::Pod && k.namespace.as_deref() == Some(namespace))
        .filter_map(|(_, o)| match o {
            Object::Pod(p) => Some(p.as_ref()),
            _ => None,
        })
}
