//! What one proxy sees: its Sidecar (workload-selected, else namespace default, else the tenant
//! default in the control namespace), the hosts each egress listener imports, and the outbound
//! traffic policy.

use std::collections::BTreeMap;

use meshplane_crds::controlplane::OutboundTrafficMode;
use meshplane_crds::networking::{CaptureMode, IstioEgressListener, IstioIngressListener, Port};
use meshplane_crds::Sidecar;

use super::registry::{Registry, ServiceModel};

/// Identity of the Sidecar that applies to a proxy.
pub type SidecarKey = (String, String);

/// One egress listener of the proxy's scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressScope {
    /// Port of the listener; none: every other port (the catch-all).
    pub port: Option<Port>,
    pub bind: String,
    pub capture_mode: CaptureMode,
    /// Imports as (namespace part, host part).
    pub hosts: Vec<(String, String)>,
}

/// The proxy's Sidecar, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyScope {
    pub namespace: String,
    pub sidecar: Option<SidecarKey>,
    pub egress: Vec<EgressScope>,
    pub ingress: Vec<IstioIngressListener>,
    pub outbound_policy: OutboundTrafficMode,
}

fn selects(sidecar: &Sidecar, labels: &BTreeMap<String, String>) -> bool {
    sidecar
        .spec
        .workload_selector
        .as_ref()
        .is_some_and(|s| s.labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The Sidecar applying to a proxy of `namespace` with `labels`.
pub fn select_sidecar<'a>(
    registry: &'a Registry,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Option<&'a Sidecar> {
    let own = registry
        .sidecars
        .get(namespace)
        .map(Vec::as_slice)
        .unwrap_or_default();
    own.iter()
        .find(|s| selects(s, labels))
        .or_else(|| own.iter().find(|s| s.spec.workload_selector.is_none()))
        .or_else(|| {
            registry
                .sidecars
                .get(&registry.control_namespace)
                .and_then(|all| all.iter().find(|s| s.spec.workload_selector.is_none()))
        })
}

/// Resolves the scope of a proxy.
pub fn proxy_scope(
    registry: &Registry,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> ProxyScope {
    let sidecar = select_sidecar(registry, namespace, labels);
    ProxyScope {
        namespace: namespace.to_string(),
        egress: egress_scopes(sidecar),
        sidecar: sidecar.map(|s| {
            (
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default(),
            )
        }),
        ingress: sidecar.map(|s| s.spec.ingress.clone()).unwrap_or_default(),
        outbound_policy: sidecar
            .and_then(|s| s.spec.outbound_traffic_policy.as_ref())
            .unwrap_or(&registry.mesh_config.outbound_traffic_policy)
            .mode,
    }
}

/// The egress listeners of a proxy under `sidecar`: its egress section, else one catch-all
/// listener importing every host (`*/*`).
pub fn egress_scopes(sidecar: Option<&Sidecar>) -> Vec<EgressScope> {
    match sidecar {
        Some(s) if !s.spec.egress.is_empty() => s.spec.egress.iter().map(egress_scope).collect(),
        _ => vec![EgressScope {
            port: None,
            bind: String::new(),
            capture_mode: CaptureMode::Default,
            hosts: vec![("*".into(), "*".into())],
        }],
    }
}

/// The Sidecar of the registry that `key` names.
pub fn sidecar_by_key<'a>(registry: &'a Registry, key: &SidecarKey) -> Option<&'a Sidecar> {
    let (namespace, name) = key;
    registry
        .sidecars
        .get(namespace)?
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(name.as_str()))
}

fn egress_scope(l: &IstioEgressListener) -> EgressScope {
    EgressScope {
        port: l.port.clone(),
        bind: l.bind.clone(),
        capture_mode: l.capture_mode,
        hosts: l
            .hosts
            .iter()
            .filter_map(|h| h.split_once('/'))
            .map(|(ns, host)| (ns.to_string(), host.to_string()))
            .collect(),
    }
}

/// Whether a host pattern of a Sidecar import matches a registry host.
fn host_matches(pattern: &str, hostname: &str) -> bool {
    if pattern == "*" || pattern == hostname {
        return true;
    }
    match pattern.strip_prefix('*') {
        // `*.example.com` covers `a.example.com`, and the narrower wildcard `*.b.example.com`.
        Some(suffix) => hostname.ends_with(suffix) && hostname.len() > suffix.len(),
        None => false,
    }
}

impl EgressScope {
    /// Whether this listener imports `svc` for a proxy of `proxy_namespace`.
    pub fn imports(&self, svc: &ServiceModel, proxy_namespace: &str) -> bool {
        self.hosts.iter().any(|(ns, host)| {
            let ns_ok = match ns.as_str() {
                "*" => true,
                "." => svc.namespace == proxy_namespace,
                "~" => false,
                other => svc.namespace == other,
            };
            ns_ok && host_matches(host, &svc.hostname)
        })
    }
}

impl ProxyScope {
    /// Hosts visible to and imported by this proxy, one model per hostname (the proxy's own
    /// namespace wins a hostname conflict, then namespace order).
    pub fn imported<'a>(
        &self,
        registry: &'a Registry,
        egress: &EgressScope,
    ) -> Vec<&'a ServiceModel> {
        let mut out: Vec<&ServiceModel> = Vec::new();
        for svc in &registry.services {
            if !svc.visible_from(&self.namespace, &registry.mesh_config)
                || !egress.imports(svc, &self.namespace)
            {
                continue;
            }
            match out.last_mut() {
                Some(prev) if prev.hostname == svc.hostname => {
                    if svc.namespace == self.namespace && prev.namespace != self.namespace {
                        *prev = svc;
                    }
                }
                _ => out.push(svc),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_host_patterns() {
        assert!(host_matches("*", "a.b"));
        assert!(host_matches("*.example.com", "api.example.com"));
        assert!(host_matches("*.example.com", "*.x.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(host_matches(
            "web.shop.svc.cluster.local",
            "web.shop.svc.cluster.local"
        ));
        assert!(!host_matches(
            "web.shop.svc.cluster.local",
            "web2.shop.svc.cluster.local"
        ));
    }
}
