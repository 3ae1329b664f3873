//! Config that cannot apply, found tenant-wide (independent of any one proxy): what the
//! instance writes into the `Accepted` condition of the tenant's networking and security
//! config (every kind of [`ConfigKind`]). Each finding names the object it concerns, a stable
//! reason and a message saying what to change.

use std::collections::{BTreeMap, BTreeSet};

use meshplane_crds::networking::gateway::ServerTlsMode;
use meshplane_crds::networking::resolve_host;
use meshplane_crds::validation::traffic::gateway_istio_mutual_fields;
use meshplane_crds::{Gateway, VirtualService};

use super::endpoints::subset_labels;
use super::gateway::served_hosts_for;
use super::registry::Registry;
use super::traffic::{
    exported_to, labels_match, resolve_gateways, vs_destinations, vs_hosts, GatewayRef,
};

pub use super::finding::{ConfigKind, ConfigRef, Finding};

/// The verdict on every VirtualService, DestinationRule and Gateway of the registry (an
/// empty list: accepted). The generation is the one judged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics {
    pub objects: BTreeMap<ConfigRef, (Option<i64>, Vec<Finding>)>,
}

fn meta<K: kube_core::Resource>(o: &K) -> (&str, &str, Option<i64>) {
    (
        o.meta().namespace.as_deref().unwrap_or_default(),
        o.meta().name.as_deref().unwrap_or_default(),
        o.meta().generation,
    )
}

/// Whether two `exportTo` scopes can reach a common namespace of the tenant.
fn scopes_overlap(a: &VirtualService, b: &VirtualService, namespaces: &BTreeSet<String>) -> bool {
    let (an, bn) = (meta(a).0, meta(b).0);
    namespaces
        .iter()
        .any(|ns| exported_to(&a.spec.export_to, an, ns) && exported_to(&b.spec.export_to, bn, ns))
}

fn tenant_namespaces(registry: &Registry) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = registry
        .services
        .iter()
        .map(|s| s.namespace.clone())
        .collect();
    out.insert(registry.control_namespace.clone());
    for vs in &registry.virtual_services {
        out.insert(meta(vs).0.to_string());
    }
    for dr in &registry.destination_rules {
        out.insert(meta(dr).0.to_string());
    }
    for ap in &registry.authorization_policies {
        out.insert(meta(ap).0.to_string());
    }
    for pa in &registry.peer_authentications {
        out.insert(meta(pa).0.to_string());
    }
    out
}

/// Judges every object of the registry.
pub fn diagnose(registry: &Registry) -> Diagnostics {
    let mut out = Diagnostics::default();
    let namespaces = tenant_namespaces(registry);
    for vs in &registry.virtual_services {
        let (ns, name, generation) = meta(vs);
        let findings = virtual_service(registry, vs, &namespaces);
        out.objects.insert(
            ConfigRef {
                kind: ConfigKind::VirtualService,
                namespace: ns.into(),
                name: name.into(),
            },
            (generation, findings),
        );
    }
    // Every DestinationRule applies as written (a subset without endpoints is not an error:
    // its pods may come later); listed so that each carries its Accepted condition.
    for dr in &registry.destination_rules {
        let (ns, name, generation) = meta(dr);
        out.objects.insert(
            ConfigRef {
                kind: ConfigKind::DestinationRule,
                namespace: ns.into(),
                name: name.into(),
            },
            (generation, Vec::new()),
        );
    }
    for gw in &registry.gateways {
        let (ns, name, generation) = meta(gw);
        out.objects.insert(
            ConfigRef {
                kind: ConfigKind::Gateway,
                namespace: ns.into(),
                name: name.into(),
            },
            (generation, gateway(registry, gw)),
        );
    }
    gateway_host_claims(registry, &mut out);
    let in_tenant = |ns: &str| namespaces.contains(ns);
    for ap in &registry.authorization_policies {
        let (ns, name, generation) = meta(ap);
        out.objects.insert(
            ConfigRef {
                kind: ConfigKind::AuthorizationPolicy,
                namespace: ns.into(),
                name: name.into(),
            },
            (
                generation,
                super::authz_diagnostics::authorization_policy(registry, ap, &in_tenant),
            ),
        );
    }
    for ra in &registry.request_authentications {
        let (ns, name, generation) = meta(ra);
        out.objects.insert(
            ConfigRef {
                kind: ConfigKind::RequestAuthentication,
                namespace: ns.into(),
                name: name.into(),
            },
            (
                generation,
                super::authz_diagnostics::request_authentication(ra),
            ),
        );
    }
    // Sidecars, admitted EnvoyFilters and PeerAuthentications apply as written.
    let applied = registry
        .sidecars
        .values()
        .flatten()
        .map(|o| (ConfigKind::Sidecar, meta(o)))
        .chain(
            registry
                .envoy_filters
                .values()
                .flatten()
                .map(|o| (ConfigKind::EnvoyFilter, meta(o))),
        )
        .chain(
            registry
                .peer_authentications
                .iter()
                .map(|o| (ConfigKind::PeerAuthentication, meta(o))),
        );
    for (kind, (ns, name, generation)) in applied {
        out.objects.insert(
            ConfigRef {
                kind,
                namespace: ns.into(),
                name: name.into(),
            },
            (generation, Vec::new()),
        );
    }
    out.objects
        .extend(registry.judged.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (_, findings) in out.objects.values_mut() {
        findings.sort();
        findings.dedup();
    }
    out
}

fn virtual_service(
    registry: &Registry,
    vs: &VirtualService,
    namespaces: &BTreeSet<String>,
) -> Vec<Finding> {
    let (ns, _, _) = meta(vs);
    let mut findings = Vec::new();
    let gateways = resolve_gateways(&vs.spec.gateways, ns);
    // Sidecar hosts: the oldest VirtualService of a host wins it.
    if gateways.contains(&GatewayRef::Mesh) {
        for host in vs_hosts(vs) {
            let older = registry
                .virtual_services
                .iter()
                .take_while(|o| !std::ptr::eq(*o, vs))
                .find(|o| {
                    resolve_gateways(&o.spec.gateways, meta(*o).0).contains(&GatewayRef::Mesh)
                        && vs_hosts(o).contains(&host)
                        && scopes_overlap(o, vs, namespaces)
                });
            if let Some(o) = older {
                let (on, oname, _) = meta(o);
                findings.push(Finding {
                    reason: "HostConflict",
                    message: format!(
                        "host {host} is already routed for sidecars by the older VirtualService {on}/{oname}; this one is ignored for it (merge the rules into one VirtualService, or narrow exportTo)"
                    ),
                });
            }
        }
    }
    // Gateways referenced must exist.
    for g in &gateways {
        if let GatewayRef::Gateway { namespace, name } = g {
            let exists = registry
                .gateways
                .iter()
                .any(|gw| meta(gw).0 == namespace && meta(gw).1 == name);
            if !exists {
                findings.push(Finding {
                    reason: "GatewayNotFound",
                    message: format!("gateway {namespace}/{name} does not exist in the tenant"),
                });
            }
        }
    }
    // Destinations: hosts in the registry, subsets defined.
    let dests = vs_destinations(vs);
    let mut seen = BTreeSet::new();
    for d in dests {
        let host = resolve_host(&d.host, ns);
        if !seen.insert((host.clone(), d.subset.clone())) {
            continue;
        }
        if registry.services_named(&host).next().is_none() {
            findings.push(Finding {
                reason: "HostNotFound",
                message: format!(
                    "destination host {host} is neither a Service nor a ServiceEntry of the tenant; requests to it fail"
                ),
            });
            continue;
        }
        if !d.subset.is_empty() && subset_labels(registry, ns, &host, &d.subset).is_none() {
            findings.push(Finding {
                reason: "UnknownSubset",
                message: format!(
                    "subset {:?} of {host} is not defined by a DestinationRule visible in namespace {ns}; requests to it fail with 503",
                    d.subset
                ),
            });
        }
    }
    // Gateways that do not take config from this namespace.
    for g in &gateways {
        let GatewayRef::Gateway { namespace, name } = g else {
            continue;
        };
        let Some(gw) = registry
            .gateways
            .iter()
            .find(|gw| meta(*gw).0 == namespace && meta(*gw).1 == name)
        else {
            continue;
        };
        for dep in &registry.gateway_deployments {
            if !labels_match(&gw.spec.selector, &dep.labels) {
                continue;
            }
            let trusted = dep.namespace == ns
                || registry.control_namespace == ns
                || dep.allowed_namespaces.iter().any(|a| a == ns);
            if !trusted {
                findings.push(Finding {
                    reason: "NamespaceNotAllowed",
                    message: format!(
                        "gateway {}/{} does not take VirtualServices from namespace {ns}: the tenant admin lists trusted namespaces in the MeshControlPlane's spec.ingressGateway.allowedNamespaces",
                        dep.namespace, dep.name
                    ),
                });
            }
        }
    }
    findings
}

fn gateway(registry: &Registry, gw: &Gateway) -> Vec<Finding> {
    let (ns, _, _) = meta(gw);
    let mut findings = Vec::new();
    let selected: Vec<_> = registry
        .gateway_deployments
        .iter()
        .filter(|d| labels_match(&gw.spec.selector, &d.labels))
        .collect();
    for dep in &selected {
        let trusted = dep.namespace == ns
            || registry.control_namespace == ns
            || dep.allowed_namespaces.iter().any(|a| a == ns);
        if !trusted {
            findings.push(Finding {
                reason: "NamespaceNotAllowed",
                message: format!(
                    "gateway {}/{} does not take Gateways from namespace {ns}; this one is ignored: the tenant admin lists trusted namespaces in the MeshControlPlane's spec.ingressGateway.allowedNamespaces",
                    dep.namespace, dep.name
                ),
            });
            continue;
        }
        for (i, server) in gw.spec.servers.iter().enumerate() {
            let Some(tls) = &server.tls else { continue };
            if tls.credential_name.is_empty() || tls.mode == Some(ServerTlsMode::Passthrough) {
                continue;
            }
            let key = (dep.namespace.clone(), tls.credential_name.clone());
            if !registry.tls_secrets.contains_key(&key) {
                findings.push(Finding {
                    reason: "CredentialNotFound",
                    message: format!(
                        "spec.servers[{i}].tls.credentialName: no TLS Secret {:?} (tls.crt, tls.key) in namespace {}, where gateway {} runs; the server is not served",
                        tls.credential_name, dep.namespace, dep.name
                    ),
                });
            }
        }
    }
    for field in gateway_istio_mutual_fields(&gw.spec) {
        findings.push(Finding {
            reason: "MutualTlsUnavailable",
            message: format!(
                "{field}: ISTIO_MUTUAL on a Gateway server (terminating the tenant's mutual TLS at the gateway) is not supported by meshplane's ingress gateway; the server is not served (use SIMPLE or MUTUAL with a credentialName)"
            ),
        });
    }
    findings
}

/// On each gateway, a host belongs to the namespace whose VirtualService claimed it first; the
/// VirtualServices of later namespaces are refused for it.
fn gateway_host_claims(registry: &Registry, out: &mut Diagnostics) {
    for dep in &registry.gateway_deployments {
        let trusted = |ns: &str| {
            dep.namespace == ns
                || registry.control_namespace == ns
                || dep.allowed_namespaces.iter().any(|a| a == ns)
        };
        // (port, host) -> (namespace, VirtualService name)
        let mut claims: BTreeMap<(u32, String), (String, String)> = BTreeMap::new();
        for vs in registry
            .virtual_services
            .iter()
            .filter(|vs| trusted(meta(*vs).0))
        {
            let (vs_ns, vs_name, _) = meta(vs);
            for g in resolve_gateways(&vs.spec.gateways, vs_ns) {
                let GatewayRef::Gateway { namespace, name } = &g else {
                    continue;
                };
                let Some(gw) = registry.gateways.iter().find(|gw| {
                    meta(*gw).0 == namespace
                        && meta(*gw).1 == name
                        && trusted(meta(*gw).0)
                        && labels_match(&gw.spec.selector, &dep.labels)
                }) else {
                    continue;
                };
                for server in &gw.spec.servers {
                    for host in served_hosts_for(vs, server, namespace) {
                        let key = (server.port.number, host.clone());
                        match claims.get(&key) {
                            None => {
                                claims.insert(key, (vs_ns.to_string(), vs_name.to_string()));
                            }
                            Some((owner_ns, owner)) if owner_ns != vs_ns => {
                                let finding = Finding {
                                    reason: "HostConflict",
                                    message: format!(
                                        "host {host} on port {} of gateway {}/{} is already served by VirtualService {owner_ns}/{owner} from another namespace; this one is refused for it",
                                        server.port.number, dep.namespace, dep.name
                                    ),
                                };
                                if let Some((_, f)) = out.objects.get_mut(&ConfigRef {
                                    kind: ConfigKind::VirtualService,
                                    namespace: vs_ns.to_string(),
                                    name: vs_name.to_string(),
                                }) {
                                    f.push(finding);
                                }
                            }
                            Some(_) => {}
                        }
                    }
                }
            }
        }
    }
}
