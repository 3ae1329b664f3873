//! The tenant's service registry: Services, EndpointSlices, ServiceEntries and Pods folded into
//! one model of hosts, ports and endpoints that translation reads.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use meshplane_crds::networking::{Location, Resolution, WorkloadEntry};
use meshplane_crds::{names, EnvoyFilter, MeshConfig, PeerAuthentication, ServiceEntry, Sidecar};

/// DNS suffix of Kubernetes Service hosts.
pub const DOMAIN_SUFFIX: &str = "svc.cluster.local";

/// Application protocol of a port, as it decides the listener's filters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// HTTP/1.1 (HTTP connection manager, RDS).
    Http,
    /// HTTP/2 or gRPC (HTTP connection manager; upstream speaks HTTP/2).
    Http2,
    /// Anything else: TCP proxy.
    Tcp,
}

impl Protocol {
    /// Protocol from an explicit protocol string, else from the port name prefix
    /// (`http-web`, `grpc`), as Istio does; TCP when neither says.
    pub fn detect(explicit: Option<&str>, port_name: &str) -> Protocol {
        let from = |p: &str| match p.to_ascii_lowercase().as_str() {
            "http" => Some(Protocol::Http),
            "http2" | "grpc" | "grpc-web" | "h2c" | "kubernetes.io/h2c" => Some(Protocol::Http2),
            "" => None,
            _ => Some(Protocol::Tcp),
        };
        if let Some(p) = explicit.and_then(from) {
            return p;
        }
        let prefix = port_name.split('-').next().unwrap_or_default();
        match from(prefix) {
            Some(p @ (Protocol::Http | Protocol::Http2)) => p,
            _ => Protocol::Tcp,
        }
    }

    /// Whether the port is routed by an HTTP connection manager.
    pub fn is_http(self) -> bool {
        matches!(self, Protocol::Http | Protocol::Http2)
    }
}

/// The port a service port forwards to on its endpoints.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TargetPort {
    Number(u32),
    Named(String),
}

/// One port of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub port: u32,
    pub target_port: TargetPort,
    pub protocol: Protocol,
}

/// Where a service comes from, and how its endpoints are found.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceSource {
    /// A Kubernetes Service: endpoints over EDS from EndpointSlices.
    Kubernetes {
        /// Pod selector (for the inbound side of the selected workloads).
        selector: BTreeMap<String, String>,
    },
    /// A ServiceEntry.
    Entry {
        resolution: Resolution,
        location: Option<Location>,
        endpoints: Vec<WorkloadEntry>,
        /// Pods backing the entry (endpoints over EDS from their addresses).
        workload_selector: Option<BTreeMap<String, String>>,
    },
}

/// One host of the registry, with its ports and visibility.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceModel {
    /// FQDN (`web.shop.svc.cluster.local`) or a ServiceEntry host (maybe `*.example.com`).
    pub hostname: String,
    /// Namespace of the Service or ServiceEntry.
    pub namespace: String,
    /// Name of the Kubernetes Service (short name), none for ServiceEntries.
    pub short_name: Option<String>,
    /// ClusterIPs or ServiceEntry addresses (no CIDRs).
    pub addresses: Vec<String>,
    pub ports: Vec<ServicePort>,
    /// `exportTo` as declared (empty: the mesh default).
    pub export_to: Vec<String>,
    pub source: ServiceSource,
}

impl ServiceModel {
    /// Whether a proxy in `namespace` may see this host (before any Sidecar narrows it).
    pub fn visible_from(&self, namespace: &str, mesh: &MeshConfig) -> bool {
        let export_to = if self.export_to.is_empty() {
            &mesh.default_export_to
        } else {
            &self.export_to
        };
        export_to.iter().any(|e| match e.as_str() {
            "*" => true,
            "." => self.namespace == namespace,
            "~" => false,
            ns => ns == namespace,
        })
    }

    /// Whether clusters of this host get endpoints over EDS.
    pub fn uses_eds(&self) -> bool {
        match &self.source {
            ServiceSource::Kubernetes { .. } => true,
            ServiceSource::Entry {
                resolution,
                workload_selector,
                ..
            } => *resolution == Resolution::Static && workload_selector.is_some(),
        }
    }
}

/// Outbound cluster name of a host's port, Istio-style.
pub fn outbound_cluster_name(port: u32, hostname: &str) -> String {
    format!("outbound|{port}||{hostname}")
}

/// Inbound cluster name of a workload's service port.
pub fn inbound_cluster_name(port: u32) -> String {
    format!("inbound|{port}||")
}

/// One endpoint of a cluster.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointModel {
    pub address: String,
    pub port: u32,
    /// `region/zone/subzone` parts.
    pub region: String,
    pub zone: String,
    pub subzone: String,
    pub weight: Option<u32>,
}

/// Everything translation reads, built from the tenant's member-filtered objects.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    pub control_namespace: String,
    pub mesh_config: MeshConfig,
    /// Hosts sorted by (hostname, namespace).
    pub services: Vec<ServiceModel>,
    /// Endpoints of EDS clusters by cluster name.
    pub endpoints: BTreeMap<String, Vec<EndpointModel>>,
    /// Sidecars by namespace, oldest first (ties by name).
    pub sidecars: BTreeMap<String, Vec<Sidecar>>,
    /// EnvoyFilters by namespace.
    pub envoy_filters: BTreeMap<String, Vec<EnvoyFilter>>,
    /// Named container ports of pods, by (namespace, pod name).
    pub pod_ports: BTreeMap<(String, String), BTreeMap<String, u32>>,
    /// PeerAuthentications of the member and control namespaces.
    pub peer_authentications: Vec<PeerAuthentication>,
    /// Addresses of the tenant's pods that have a sidecar (injected): clients originate mutual
    /// TLS to them.
    pub meshed_addresses: BTreeSet<String>,
}

/// The address of a pod with a sidecar of the tenant (the injector's revision annotation),
/// once it has one.
pub fn meshed_pod_address(pod: &Pod) -> Option<String> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(names::INJECTED_REVISION_ANNOTATION)?;
    pod.status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())
}

/// Model of a Kubernetes Service.
pub fn service_model(svc: &Service) -> Option<ServiceModel> {
    let name = svc.metadata.name.clone()?;
    let namespace = svc.metadata.namespace.clone()?;
    let spec = svc.spec.as_ref()?;
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"))
        .filter_map(|p| {
            let port = u32::try_from(p.port).ok().filter(|p| *p > 0)?;
            let name = p.name.clone().unwrap_or_default();
            let target_port = match &p.target_port {
                Some(IntOrString::Int(n)) => {
                    TargetPort::Number(u32::try_from(*n).ok().filter(|n| *n > 0)?)
                }
                Some(IntOrString::String(s)) => match s.parse::<u32>() {
                    Ok(n) => TargetPort::Number(n),
                    Err(_) => TargetPort::Named(s.clone()),
                },
                None => TargetPort::Number(port),
            };
            Some(ServicePort {
                protocol: Protocol::detect(p.app_protocol.as_deref(), &name),
                name,
                port,
                target_port,
            })
        })
        .collect();
    let addresses = spec
        .cluster_ips
        .clone()
        .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
        .unwrap_or_default()
        .into_iter()
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
        .collect();
    let export_to = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::SERVICE_EXPORT_TO_ANNOTATION))
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    Some(ServiceModel {
        hostname: format!("{name}.{namespace}.{DOMAIN_SUFFIX}"),
        namespace,
        short_name: Some(name),
        addresses,
        ports,
        export_to,
        source: ServiceSource::Kubernetes {
            selector: spec.selector.clone().unwrap_or_default(),
        },
    })
}

/// Models of a ServiceEntry, one per host.
pub fn service_entry_models(se: &ServiceEntry) -> Vec<ServiceModel> {
    let Some(namespace) = se.metadata.namespace.clone() else {
        return Vec::new();
    };
    let spec = &se.spec;
    let ports: Vec<ServicePort> = spec
        .ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone(),
            port: p.number,
            target_port: TargetPort::Number(p.target_port.unwrap_or(p.number)),
            protocol: Protocol::detect(Some(&p.protocol), &p.name),
        })
        .collect();
    let addresses: Vec<String> = spec
        .addresses
        .iter()
        .filter(|a| a.parse::<std::net::IpAddr>().is_ok())
        .cloned()
        .collect();
    spec.hosts
        .iter()
        .map(|host| ServiceModel {
            hostname: host.clone(),
            namespace: namespace.clone(),
            short_name: None,
            addresses: addresses.clone(),
            ports: ports.clone(),
            export_to: spec.export_to.clone(),
            source: ServiceSource::Entry {
                resolution: spec.resolution,
                location: spec.location,
                endpoints: spec.endpoints.clone(),
                workload_selector: spec.workload_selector.as_ref().map(|s| s.labels.clone()),
            },
        })
        .collect()
}

/// Adds the ready endpoints of one EndpointSlice to the clusters of its Service.
pub fn add_slice_endpoints(
    slice: &EndpointSlice,
    services: &BTreeMap<(String, String), ServiceModel>,
    out: &mut BTreeMap<String, Vec<EndpointModel>>,
) {
    let Some(namespace) = slice.metadata.namespace.clone() else {
        return;
    };
    let Some(svc_name) = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/service-name"))
        .cloned()
    else {
        return;
    };
    let Some(svc) = services.get(&(namespace, svc_name)) else {
        return;
    };
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return;
    }
    for sp in &svc.ports {
        // A slice port belongs to the service port of the same name (unnamed when single).
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or_default() == sp.name)
            .and_then(|p| p.port)
            .and_then(|p| u32::try_from(p).ok())
        else {
            continue;
        };
        let cluster = outbound_cluster_name(sp.port, &svc.hostname);
        for ep in slice.endpoints.iter().flatten() {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if !ready {
                continue;
            }
            let zone = ep
                .zone
                .clone()
                .or_else(|| {
                    ep.hints
                        .as_ref()
                        .and_then(|h| h.for_zones.as_ref())
                        .and_then(|z| z.first())
                        .map(|z| z.name.clone())
                })
                .unwrap_or_default();
            for address in &ep.addresses {
                out.entry(cluster.clone()).or_default().push(EndpointModel {
                    address: address.clone(),
                    port,
                    region: String::new(),
                    zone: zone.clone(),
                    subzone: String::new(),
                    weight: None,
                });
            }
        }
    }
}

/// Adds endpoints of a ServiceEntry with a workload selector from the pods it selects.
pub fn add_entry_pod_endpoints<'a>(
    svc: &ServiceModel,
    pods: impl Iterator<Item = &'a Pod>,
    out: &mut BTreeMap<String, Vec<EndpointModel>>,
) {
    let ServiceSource::Entry {
        workload_selector: Some(selector),
        ..
    } = &svc.source
    else {
        return;
    };
    for pod in pods {
        if pod.metadata.namespace.as_deref() != Some(svc.namespace.as_str()) {
            continue;
        }
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        if !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            continue;
        }
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        for sp in &svc.ports {
            let port = match &sp.target_port {
                TargetPort::Number(n) => *n,
                TargetPort::Named(_) => sp.port,
            };
            out.entry(outbound_cluster_name(sp.port, &svc.hostname))
                .or_default()
                .push(EndpointModel {
                    address: ip.clone(),
                    port,
                    region: String::new(),
                    zone: String::new(),
                    subzone: String::new(),
                    weight: None,
                });
        }
    }
}

/// Named container ports of a pod.
pub fn pod_named_ports(pod: &Pod) -> BTreeMap<String, u32> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| Some((p.name.clone()?, u32::try_from(p.container_port).ok()?)))
        .collect()
}

/// Splits a ServiceEntry locality `region/zone/subzone`.
pub fn split_locality(locality: &str) -> (String, String, String) {
    let mut parts = locality.splitn(3, '/').map(str::to_string);
    (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_from_explicit_value_or_port_name() {
        assert_eq!(Protocol::detect(None, "http-web"), Protocol::Http);
        assert_eq!(Protocol::detect(None, "grpc"), Protocol::Http2);
        assert_eq!(Protocol::detect(None, "httpish"), Protocol::Tcp);
        assert_eq!(Protocol::detect(Some("HTTP"), "db"), Protocol::Http);
        assert_eq!(Protocol::detect(Some("TCP"), "http"), Protocol::Tcp);
        assert_eq!(Protocol::detect(Some(""), "tcp-db"), Protocol::Tcp);
    }

    #[test]
    fn export_to_rules() {
        let mesh = MeshConfig::default();
        let mut svc = ServiceModel {
            hostname: "a.x.svc.cluster.local".into(),
            namespace: "x".into(),
            short_name: Some("a".into()),
            addresses: vec![],
            ports: vec![],
            export_to: vec![],
            source: ServiceSource::Kubernetes {
                selector: BTreeMap::new(),
            },
        };
        assert!(svc.visible_from("y", &mesh), "default is tenant-wide");
        svc.export_to = vec![".".into()];
        assert!(svc.visible_from("x", &mesh));
        assert!(!svc.visible_from("y", &mesh));
        svc.export_to = vec!["y".into()];
        assert!(svc.visible_from("y", &mesh));
        assert!(!svc.visible_from("x", &mesh));
        svc.export_to = vec!["~".into()];
        assert!(!svc.visible_from("x", &mesh));
        svc.export_to = vec![];
        let narrow = MeshConfig {
            default_export_to: vec![".".into()],
            ..MeshConfig::default()
        };
        assert!(!svc.visible_from("y", &narrow));
    }
}
