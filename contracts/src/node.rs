//! Contract 7: a proxy's identity on the ADS stream.
//!
//! The injector starts the launcher with the node id [`NodeId::injector_template`] (the kubelet
//! expands the `$(VAR)`s from the downward API env [`env`]) and the node metadata of [`meta`].
//! The launcher adds `authorization: Bearer <projected token>` (audience [`token_audience`]) to
//! the ADS stream. The instance parses the node id with [`NodeId::parse`] and refuses a stream
//! whose id does not parse. What a proxy *claims* ends there: its pod name is checked against
//! its token, and its labels come from its Pod in the tenant's index, never from metadata.

use std::fmt;
use std::net::IpAddr;

use crate::error::ContractError;
use crate::{is_dns1123_label, is_dns1123_subdomain};

const CONTRACT: &str = "7 (proxy identity)";

/// Longest node id accepted: a 253-character pod name, two 63-character namespaces, an IPv6
/// address and a long cluster domain fit well inside.
pub const MAX_NODE_ID_LEN: usize = 1024;
/// Cluster domain of the injector's template.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// Node metadata keys (string values).
pub mod meta {
    /// The workload's namespace; must agree with the node id.
    pub const NAMESPACE: &str = "NAMESPACE";
    /// The workload's pod name; must agree with the node id.
    pub const POD_NAME: &str = "POD_NAME";
    /// The tenant the injector belongs to; a proxy of another tenant is refused.
    pub const TENANT: &str = "TENANT";
    /// The revision that injected the proxy.
    pub const REVISION: &str = "REVISION";
    /// `DEFAULT` or `NONE` (the pod's `sidecar.meshplane.io/captureMode`).
    pub const CAPTURE_MODE: &str = "CAPTURE_MODE";
    /// Set only by the local test pod runner, where pods share the host's loopback: the address
    /// standing for the pod's own `127.0.0.1`.
    pub const LOOPBACK_ADDR: &str = "LOOPBACK_ADDR";
}

/// Downward API environment of the proxy container, expanded into the node id.
pub mod env {
    pub const POD_NAME: &str = "POD_NAME";
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    pub const POD_IP: &str = "POD_IP";
}

/// Audience of the projected ServiceAccount token a proxy presents to its tenant's instance.
pub fn token_audience(tenant: &str) -> String {
    format!("meshplane-{tenant}")
}

/// What runs the proxy: Istio's node types, which meshplane keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// A workload's sidecar.
    Sidecar,
    /// A gateway (a proxy that is the workload).
    Router,
}

impl NodeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Sidecar => "sidecar",
            NodeKind::Router => "router",
        }
    }
}

/// A parsed node id: `KIND~IP~POD.NAMESPACE~NAMESPACE.svc.CLUSTER_DOMAIN`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeId {
    pub kind: NodeKind,
    pub ip: IpAddr,
    pub pod: String,
    pub namespace: String,
    pub cluster_domain: String,
}

impl NodeId {
    /// A sidecar's node id in the default cluster domain.
    pub fn sidecar(ip: IpAddr, pod: &str, namespace: &str) -> Self {
        Self {
            kind: NodeKind::Sidecar,
            ip,
            pod: pod.to_string(),
            namespace: namespace.to_string(),
            cluster_domain: CLUSTER_DOMAIN.to_string(),
        }
    }

    /// The node id the injector renders, before the kubelet expands the `$(VAR)`s.
    pub fn injector_template() -> String {
        format!(
            "{}~$({ip})~$({pod}).$({ns})~$({ns}).svc.{CLUSTER_DOMAIN}",
            NodeKind::Sidecar.as_str(),
            ip = env::POD_IP,
            pod = env::POD_NAME,
            ns = env::POD_NAMESPACE,
        )
    }

    /// Parses a node id; every part must be well formed.
    pub fn parse(id: &str) -> Result<Self, ContractError> {
        let bad = |why: &str| ContractError::invalid(CONTRACT, "node id", id, why.to_string());
        if id.len() > MAX_NODE_ID_LEN {
            return Err(bad(&format!("longer than {MAX_NODE_ID_LEN} bytes")));
        }
        let expected = "expected KIND~IP~POD.NAMESPACE~NAMESPACE.svc.CLUSTER_DOMAIN";
        let parts: Vec<&str> = id.split('~').collect();
        let [kind, ip, pod_ns, domain] = parts.as_slice() else {
            return Err(bad(expected));
        };
        let kind = match *kind {
            "sidecar" => NodeKind::Sidecar,
            "router" => NodeKind::Router,
            _ => return Err(bad("the kind is neither `sidecar` nor `router`")),
        };
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| bad("the second part is not an IP address"))?;
        let (namespace, cluster_domain) = domain
            .split_once(".svc.")
            .ok_or_else(|| bad("the last part is not NAMESPACE.svc.CLUSTER_DOMAIN"))?;
        if !is_dns1123_label(namespace) {
            return Err(bad("the namespace is not a DNS-1123 label"));
        }
        if !is_dns1123_subdomain(cluster_domain) {
            return Err(bad("the cluster domain is not a DNS name"));
        }
        let pod = pod_ns
            .strip_suffix(namespace)
            .and_then(|p| p.strip_suffix('.'))
            .ok_or_else(|| bad("the third part is not POD.NAMESPACE of the same namespace"))?;
        if !is_dns1123_subdomain(pod) {
            return Err(bad("the pod name is not a DNS-1123 subdomain"));
        }
        Ok(Self {
            kind,
            ip,
            pod: pod.to_string(),
            namespace: namespace.to_string(),
            cluster_domain: cluster_domain.to_string(),
        })
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}~{}~{}.{}~{}.svc.{}",
            self.kind.as_str(),
            self.ip,
            self.pod,
            self.namespace,
            self.namespace,
            self.cluster_domain
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for id in [
            NodeId::sidecar("198.18.0.7".parse().expect("ip"), "web-1", "shop"),
            NodeId {
                kind: NodeKind::Router,
                ip: "2001:db8::1".parse().expect("ip"),
                pod: "gw.with.dots".into(),
                namespace: "edge".into(),
                cluster_domain: "corp.example".into(),
            },
        ] {
            assert_eq!(NodeId::parse(&id.to_string()), Ok(id));
        }
        assert_eq!(
            NodeId::parse("sidecar~198.18.0.7~web-1.shop~shop.svc.cluster.local")
                .map(|n| (n.pod, n.namespace)),
            Ok(("web-1".into(), "shop".into()))
        );
    }

    #[test]
    fn the_template_expands_to_a_parsable_id() {
        let expanded = NodeId::injector_template()
            .replace("$(POD_IP)", "198.18.0.9")
            .replace("$(POD_NAME)", "web-1")
            .replace("$(POD_NAMESPACE)", "shop");
        assert_eq!(
            NodeId::parse(&expanded),
            Ok(NodeId::sidecar(
                "198.18.0.9".parse().expect("ip"),
                "web-1",
                "shop"
            ))
        );
    }

    #[test]
    fn refuses_malformed_ids_with_a_bounded_message() {
        for id in [
            "",
            "garbage",
            "sidecar~~web-1.shop~shop.svc.cluster.local",
            "sidecar~not-an-ip~web-1.shop~shop.svc.cluster.local",
            "proxy~198.18.0.1~web-1.shop~shop.svc.cluster.local",
            "sidecar~198.18.0.1~web-1.bank~shop.svc.cluster.local",
            "sidecar~198.18.0.1~web-1~shop.svc.cluster.local",
            "sidecar~198.18.0.1~.shop~shop.svc.cluster.local",
            "sidecar~198.18.0.1~web-1.Shop~Shop.svc.cluster.local",
            "sidecar~198.18.0.1~web-1.shop~shop.cluster.local",
            "sidecar~198.18.0.1~web-1.shop~shop.svc.cluster.local~x",
        ] {
            assert!(NodeId::parse(id).is_err(), "{id:?} parsed");
        }
        let huge = format!(
            "sidecar~198.18.0.1~{}.shop~shop.svc.cluster.local",
            "a".repeat(1 << 20)
        );
        let err = NodeId::parse(&huge).expect_err("too long").to_string();
        assert!(err.len() < 300, "{} bytes of error", err.len());
    }
}
