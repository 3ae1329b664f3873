//! The tenant's service registry: Services, EndpointSlices, ServiceEntries and Pods folded into
//! one model of hosts, ports and endpoints that translation reads.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use meshplane_crds::gateway_api;
use meshplane_crds::networking::{Location, Resolution, WorkloadEntry};
use meshplane_crds::{
    names, AuthorizationPolicy, DestinationRule, EnvoyFilter, Gateway, MeshConfig,
    PeerAuthentication, ServiceEntry, Sidecar, Telemetry, VirtualService,
};

pub use meshplane_crds::networking::DOMAIN_SUFFIX;

use super::cluster_id::{self, HostPort};

/// Application protocol of a port, as it decides the listener's filters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// HTTP/1.1 (HTTP connection manager, RDS).
    Http,
    /// HTTP/2 or gRPC (HTTP connection manager; upstream speaks HTTP/2).
    Http2,
    /// TLS (or HTTPS) not terminated by the proxy: TCP proxy, routable by SNI.
    Tls,
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
            "tls" | "https" => Some(Protocol::Tls),
            "" => None,
            _ => Some(Protocol::Tcp),
        };
        if let Some(p) = explicit.and_then(from) {
            return p;
        }
        let prefix = port_name.split('-').next().unwrap_or_default();
        match from(prefix) {
            Some(p @ (Protocol::Http | Protocol::Http2 | Protocol::Tls)) => p,
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
        /// `subjectAltNames`: the identities its servers must present under mutual TLS.
        subject_alt_names: Vec<String>,
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
    cluster_id::cluster_name(port, "", hostname)
}

/// Outbound cluster name of a subset of a host's port (`outbound|port|subset|host`); the
/// host's own cluster when `subset` is empty.
pub fn subset_cluster_name(port: u32, subset: &str, hostname: &str) -> String {
    cluster_id::cluster_name(port, subset, hostname)
}

/// Inbound cluster name of a workload's service port.
pub fn inbound_cluster_name(port: u32) -> String {
    format!("inbound|{port}||")
}

/// One endpoint of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointModel {
    pub address: String,
    pub port: u32,
    /// `region/zone/subzone` parts.
    pub region: String,
    pub zone: String,
    pub subzone: String,
    pub weight: Option<u32>,
    /// Labels of the workload behind the endpoint (its Pod's, or the ServiceEntry endpoint's):
    /// what DestinationRule subsets select. Not sent to Envoy.
    pub labels: BTreeMap<String, String>,
    /// The workload (namespace, name) of the Pod behind the endpoint, when known: sent as
    /// endpoint metadata, which the clients' request metrics read (`destination_workload`).
    pub workload: Option<(String, String)>,
}

/// Everything translation reads, built from the tenant's member-filtered objects.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    pub control_namespace: String,
    pub mesh_config: MeshConfig,
    /// Hosts sorted by (hostname, namespace).
    pub services: Vec<ServiceModel>,
    /// Endpoints of the EDS clusters of hosts' ports (a subset's are a part of its host's).
    pub endpoints: BTreeMap<HostPort, Vec<EndpointModel>>,
    /// Sidecars by namespace, oldest first (ties by name).
    pub sidecars: BTreeMap<String, Vec<Sidecar>>,
    /// EnvoyFilters by namespace.
    pub envoy_filters: BTreeMap<String, Vec<EnvoyFilter>>,
    /// Named container ports of pods, by (namespace, pod name).
    pub pod_ports: BTreeMap<(String, String), BTreeMap<String, u32>>,
    /// PeerAuthentications of the member and control namespaces.
    pub peer_authentications: Vec<PeerAuthentication>,
    /// AuthorizationPolicies of the member and control namespaces.
    pub authorization_policies: Vec<AuthorizationPolicy>,
    /// Telemetries of the member and control namespaces.
    pub telemetries: Vec<Telemetry>,
    /// RequestAuthentications of the member and control namespaces.
    pub request_authentications: Vec<meshplane_crds::RequestAuthentication>,
    /// The key sets the instance fetched for the `jwksUri`s of this tenant's
    /// RequestAuthentications, by URL (this tenant's own cache, never another's).
    pub jwks: BTreeMap<String, crate::model::FetchedKeys>,
    /// Addresses of the tenant's pods that have a sidecar (injected): clients originate mutual
    /// TLS to them.
    pub meshed_addresses: BTreeSet<String>,
    /// ServiceAccount (namespace, name) of each of those pods, by address: the identity its
    /// sidecar's certificate carries (the certificate service takes it from the pod's token).
    pub meshed_accounts: BTreeMap<String, (String, String)>,
    /// The ServiceAccounts of the meshed pods behind each host's endpoints, by hostname (hosts
    /// without any are absent): the identities clients accept from the host's servers
    /// (Istio's rule). It changes only when the set of accounts does, not on every endpoint
    /// change, so most endpoint changes stay EDS-only.
    pub service_accounts: BTreeMap<String, BTreeSet<(String, String)>>,
    /// VirtualServices, oldest first (ties by namespace, then name): the order Istio's
    /// precedence rules read them in.
    pub virtual_services: Vec<VirtualService>,
    /// DestinationRules, oldest first.
    pub destination_rules: Vec<DestinationRule>,
    /// Gateways, oldest first.
    pub gateways: Vec<Gateway>,
    /// The programmed listeners of the tenant's Kubernetes Gateway API Gateways as one-server
    /// Gateways (`translate::gateway_api_gateways`): internal, never reported on.
    pub gateway_api_gateways: Vec<Gateway>,
    /// The routes attached to them as VirtualServices bound to those listeners: internal.
    pub gateway_api_routes: Vec<VirtualService>,
    /// Certificates of `kubernetes.io/tls` Secrets in the namespaces of the tenant's gateways,
    /// by (namespace, name): what a Gateway server's `credentialName` names.
    pub tls_secrets: BTreeMap<(String, String), TlsSecret>,
    /// The tenant's gateway proxies and the namespaces each trusts (from the operator).
    pub gateway_deployments: Vec<meshplane_crds::controlplane::GatewayDeployment>,
    /// The tenant's Gateway API objects.
    pub gateway_api: GatewayApiConfig,
    /// Verdicts reached while the registry was built, on objects that leave no object of their
    /// own in it: every ServiceEntry read (accepted; its hosts are in `services`), and the
    /// EnvoyFilters the tenant's EnvoyFilter policy keeps out.
    pub judged: BTreeMap<super::finding::ConfigRef, (Option<i64>, Vec<super::finding::Finding>)>,
}

/// The tenant's Gateway API objects (`gateway.networking.k8s.io`), each list oldest first
/// (ties by namespace, then name): the order the specification's precedence rules end with.
#[derive(Clone, Debug, Default)]
pub struct GatewayApiConfig {
    pub http_routes: Vec<gateway_api::HTTPRoute>,
    pub grpc_routes: Vec<gateway_api::GRPCRoute>,
    pub tls_routes: Vec<gateway_api::TLSRoute>,
    pub tcp_routes: Vec<gateway_api::TCPRoute>,
    pub reference_grants: Vec<gateway_api::ReferenceGrant>,
    pub gateways: Vec<gateway_api::Gateway>,
    pub gateway_classes: Vec<gateway_api::GatewayClass>,
    /// The mesh (GAMMA) routes compiled from the HTTPRoutes and GRPCRoutes above.
    pub mesh: MeshRoutes,
}

impl GatewayApiConfig {
    /// Puts every list in its order.
    pub fn sort(&mut self) {
        sort_oldest_first(&mut self.http_routes);
        sort_oldest_first(&mut self.grpc_routes);
        sort_oldest_first(&mut self.tls_routes);
        sort_oldest_first(&mut self.tcp_routes);
        sort_oldest_first(&mut self.reference_grants);
        sort_oldest_first(&mut self.gateways);
        sort_oldest_first(&mut self.gateway_classes);
    }
}

/// What became of one parentRef of a route: the status entry its controller writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Kind of the route (`HTTPRoute`, `GRPCRoute`).
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub generation: Option<i64>,
    /// Index of the parentRef in the route.
    pub parent: usize,
    /// `Accepted`: `None` when true, else the reason and message.
    pub not_accepted: Option<(&'static str, String)>,
    /// `ResolvedRefs`: `None` when true, else the reason and message.
    pub unresolved: Option<(&'static str, String)>,
}

/// The mesh routes of the Gateway API compiled into VirtualServices (`translate::gamma`), and
/// the verdicts reached on the way.
#[derive(Clone, Debug, Default)]
pub struct MeshRoutes {
    /// One VirtualService per (Service host, audience), consumer ones first.
    pub virtual_services: Vec<VirtualService>,
    pub verdicts: Vec<Verdict>,
}

/// A TLS certificate from a Secret (`tls.crt`, `tls.key`, optional `ca.crt`).
#[derive(Clone, PartialEq, Eq)]
pub struct TlsSecret {
    pub certificate: Vec<u8>,
    pub private_key: Vec<u8>,
    pub ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSecret")
            .field(
                "certificate",
                &format_args!("{} bytes", self.certificate.len()),
            )
            .field("private_key", &"<redacted>")
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .finish()
    }
}

/// The certificate of a `kubernetes.io/tls` Secret (or any Secret with `tls.crt` and
/// `tls.key`), with `ca.crt` when present. Secrets meshplane keeps itself (contract 8: the
/// webhook serving certificate, the tenant CA) are never a gateway's credential, whatever a
/// Gateway names.
pub fn tls_secret(secret: &k8s_openapi::api::core::v1::Secret) -> Option<TlsSecret> {
    let managed = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(meshplane_contracts::ownership::MANAGED_BY_LABEL))
        .is_some_and(|v| v == meshplane_contracts::ownership::MANAGED_BY_VALUE);
    if managed {
        return None;
    }
    // `stringData` as written in a manifest (the directory source), `data` as the API serves it.
    let get = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(k))
                    .map(|s| s.clone().into_bytes())
            })
            .filter(|b| !b.is_empty())
    };
    Some(TlsSecret {
        certificate: get("tls.crt")?,
        private_key: get("tls.key")?,
        ca: get("ca.crt"),
    })
}

/// Sorts namespaced config objects oldest first, then by namespace and name.
pub fn sort_oldest_first<K: kube_core::Resource>(list: &mut [K]) {
    list.sort_by(|a, b| {
        let key = |o: &K| {
            (
                o.meta().creation_timestamp.clone(),
                o.meta().namespace.clone(),
                o.meta().name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
}

/// Whether two lists hold the same objects in the same order: namespace, name, creation time,
/// generation and spec (the one definition of "the same config object" the index uses).
fn same_objects<K: kube_core::Resource>(
    a: &[K],
    b: &[K],
    same_spec: impl Fn(&K, &K) -> bool,
) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.meta().name == y.meta().name
                && x.meta().namespace == y.meta().namespace
                && x.meta().creation_timestamp == y.meta().creation_timestamp
                && x.meta().generation == y.meta().generation
                && same_spec(x, y)
        })
}

/// [`same_objects`] for lists kept by namespace.
fn same_objects_by_namespace<K: kube_core::Resource>(
    a: &BTreeMap<String, Vec<K>>,
    b: &BTreeMap<String, Vec<K>>,
    same_spec: impl Fn(&K, &K) -> bool,
) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((na, xa), (nb, xb))| na == nb && same_objects(xa, xb, &same_spec))
}

impl Registry {
    /// The endpoints of a host's port (none when it has none).
    pub fn endpoints_of(&self, service: &HostPort) -> &[EndpointModel] {
        self.endpoints
            .get(service)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The ports of `host` that have endpoints, with them, by port.
    pub fn host_endpoints(
        &self,
        host: &str,
    ) -> std::collections::btree_map::Range<'_, HostPort, Vec<EndpointModel>> {
        self.endpoints
            .range(HostPort::first_of(host)..=HostPort::last_of(host))
    }

    /// The tenant's trust domain, which every mesh identity a proxy accepts must be of. The
    /// index always resolves it; a bare registry has none and then accepts no identity.
    pub fn trust_domain(&self) -> &str {
        self.mesh_config.trust_domain.as_deref().unwrap_or_default()
    }

    /// Whether every proxy gets the same configuration from both registries, endpoints aside:
    /// the one comparison that tells a configuration change from an endpoint-only one.
    /// Addresses and accounts of meshed pods count through what translation reads of them
    /// (`meshed_addresses`, `service_accounts`).
    pub fn same_config(&self, other: &Registry) -> bool {
        self.control_namespace == other.control_namespace
            && self.mesh_config == other.mesh_config
            && self.services == other.services
            && same_objects_by_namespace(&self.sidecars, &other.sidecars, |a, b| a.spec == b.spec)
            && same_objects_by_namespace(&self.envoy_filters, &other.envoy_filters, |a, b| {
                a.spec == b.spec
            })
            && self.pod_ports == other.pod_ports
            && self.meshed_addresses == other.meshed_addresses
            && self.service_accounts == other.service_accounts
            && same_objects(
                &self.peer_authentications,
                &other.peer_authentications,
                |a, b| a.spec == b.spec,
            )
            && same_objects(
                &self.authorization_policies,
                &other.authorization_policies,
                |a, b| a.spec == b.spec,
            )
            && same_objects(&self.telemetries, &other.telemetries, |a, b| {
                a.spec == b.spec
            })
            && same_objects(
                &self.request_authentications,
                &other.request_authentications,
                |a, b| a.spec == b.spec,
            )
            && self.jwks == other.jwks
            && same_objects(&self.virtual_services, &other.virtual_services, |a, b| {
                a.spec == b.spec
            })
            && same_objects(&self.destination_rules, &other.destination_rules, |a, b| {
                a.spec == b.spec
            })
            && same_objects(&self.gateways, &other.gateways, |a, b| a.spec == b.spec)
            && same_objects(
                &self.gateway_api.mesh.virtual_services,
                &other.gateway_api.mesh.virtual_services,
                |a, b| a.spec == b.spec,
            )
            && same_objects(
                &self.gateway_api_gateways,
                &other.gateway_api_gateways,
                |a, b| a.spec == b.spec,
            )
            && same_objects(
                &self.gateway_api_routes,
                &other.gateway_api_routes,
                |a, b| a.spec == b.spec,
            )
            && self.gateway_deployments == other.gateway_deployments
            && self.tls_secrets == other.tls_secrets
            && self.judged == other.judged
    }

    /// Hosts of the registry with this hostname (one per namespace declaring it).
    pub fn services_named(&self, hostname: &str) -> std::slice::Iter<'_, ServiceModel> {
        // `services` is sorted by hostname.
        let start = self
            .services
            .partition_point(|s| s.hostname.as_str() < hostname);
        let len = self.services[start..].partition_point(|s| s.hostname == hostname);
        self.services[start..start + len].iter()
    }
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

/// The ServiceAccount (namespace, name) of a pod with a sidecar of the tenant: `default` when
/// the spec names none, as the API server's ServiceAccount admission sets it.
pub fn meshed_pod_account(pod: &Pod) -> Option<(String, String)> {
    meshed_pod_address(pod)?;
    let namespace = pod.metadata.namespace.clone()?;
    let spec = pod.spec.as_ref();
    let account = spec
        .and_then(|s| s.service_account_name.clone())
        .or_else(|| spec.and_then(|s| s.service_account.clone()))
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "default".to_string());
    Some((namespace, account))
}

/// The ServiceAccounts of the meshed pods among `hostname`'s endpoints (every port's cluster).
pub fn accounts_behind(reg: &Registry, hostname: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for svc in reg.services_named(hostname) {
        for port in &svc.ports {
            for ep in reg.endpoints_of(&HostPort::new(hostname, port.port)) {
                if let Some(account) = reg.meshed_accounts.get(&ep.address) {
                    out.insert(account.clone());
                }
            }
        }
    }
    out
}

/// Recomputes [`Registry::service_accounts`] of `hosts`; returns whether any set changed (the
/// clusters of those hosts then verify other identities: a configuration change).
pub fn refresh_service_accounts(
    reg: &mut Registry,
    hosts: impl IntoIterator<Item = String>,
) -> bool {
    let mut changed = false;
    for host in hosts {
        let accounts = accounts_behind(reg, &host);
        let old = if accounts.is_empty() {
            reg.service_accounts.remove(&host)
        } else {
            reg.service_accounts.insert(host, accounts.clone())
        };
        changed |= old.unwrap_or_default() != accounts;
    }
    changed
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
                subject_alt_names: spec.subject_alt_names.clone(),
            },
        })
        .collect()
}

/// Labels of the tenant's pods, by (namespace, name) and by (namespace, address), for endpoint
/// labels. A slice's endpoints are pods of its own namespace.
#[derive(Default)]
pub struct PodLabels<'a> {
    by_name: BTreeMap<(&'a str, &'a str), PodFacts<'a>>,
    by_ip: BTreeMap<(&'a str, &'a str), PodFacts<'a>>,
}

/// A pod's workload and labels.
type PodFacts<'a> = (String, &'a BTreeMap<String, String>);

/// The labels of a pod without any.
static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl<'a> PodLabels<'a> {
    /// Indexes the labels and workloads of `pods`.
    pub fn new(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut out = PodLabels::default();
        for pod in pods {
            let labels = pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
            let Some(ns) = pod.metadata.namespace.as_deref() else {
                continue;
            };
            let Some(name) = pod.metadata.name.as_deref() else {
                continue;
            };
            let workload = meshplane_crds::telemetry::pod_workload(pod);
            out.by_name.insert((ns, name), (workload.clone(), labels));
            for ip in pod.status.iter().flat_map(|s| {
                s.pod_ips
                    .iter()
                    .flatten()
                    .map(|p| p.ip.as_str())
                    .chain(s.pod_ip.as_deref())
            }) {
                out.by_ip.insert((ns, ip), (workload.clone(), labels));
            }
        }
        out
    }

    /// The pod a slice endpoint targets (by `targetRef`, else by address): its workload and
    /// labels.
    fn pod(
        &self,
        namespace: &'a str,
        target: Option<&'a str>,
        address: &'a str,
    ) -> Option<&PodFacts<'a>> {
        target
            .and_then(|t| self.by_name.get(&(namespace, t)))
            .or_else(|| self.by_ip.get(&(namespace, address)))
    }
}

/// Adds the ready endpoints of one EndpointSlice to the clusters of its Service.
pub fn add_slice_endpoints(
    slice: &EndpointSlice,
    services: &BTreeMap<(String, String), ServiceModel>,
    pods: &PodLabels<'_>,
    out: &mut BTreeMap<HostPort, Vec<EndpointModel>>,
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
        let cluster = HostPort::new(&svc.hostname, sp.port);
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
            let target = ep
                .target_ref
                .as_ref()
                .filter(|t| t.kind.as_deref().is_none_or(|k| k == "Pod"))
                .and_then(|t| t.name.as_deref());
            for address in &ep.addresses {
                let pod = pods.pod(&svc.namespace, target, address);
                out.entry(cluster.clone()).or_default().push(EndpointModel {
                    address: address.clone(),
                    port,
                    zone: zone.clone(),
                    labels: pod.map(|(_, l)| (*l).clone()).unwrap_or_default(),
                    workload: pod.map(|(w, _)| (svc.namespace.clone(), w.clone())),
                    ..EndpointModel::default()
                });
            }
        }
    }
}

/// Adds endpoints of a ServiceEntry with a workload selector from the pods it selects.
pub fn add_entry_pod_endpoints<'a>(
    svc: &ServiceModel,
    pods: impl Iterator<Item = &'a Pod>,
    out: &mut BTreeMap<HostPort, Vec<EndpointModel>>,
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
            out.entry(HostPort::new(&svc.hostname, sp.port))
                .or_default()
                .push(EndpointModel {
                    address: ip.clone(),
                    port,
                    workload: Some((
                        svc.namespace.clone(),
                        meshplane_crds::telemetry::pod_workload(pod),
                    )),
                    labels: labels.clone(),
                    ..EndpointModel::default()
                });
        }
    }
}

/// The pod-network addresses a pod holds now: none for a pod on its node's network (the
/// node's address is no pod's own) or one that finished (its address is free for another
/// pod, perhaps of another tenant).
pub fn held_pod_addresses(pod: &Pod) -> BTreeSet<std::net::IpAddr> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let Some(status) = pod.status.as_ref() else {
        return BTreeSet::new();
    };
    let finished = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
    if host_network || finished {
        return BTreeSet::new();
    }
    status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .filter_map(|ip| ip.parse().ok())
        .collect()
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
