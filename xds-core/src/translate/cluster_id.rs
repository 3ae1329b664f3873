//! What an outbound cluster stands for, as typed keys: a host's port ([`HostPort`], the unit
//! the registry keeps endpoints by) and, for a DestinationRule subset, the subset's name
//! ([`OutboundCluster`]). Cluster names (Istio's `outbound|<port>|<subset>|<host>`, what Envoy
//! knows a cluster by) are made from these keys; the registry, the index's invalidations, the
//! render cache's EDS positions and the push loop carry the keys, not the names. A name is read
//! back only where nothing but an Envoy message is at hand ([`OutboundCluster::parse`]).

use std::fmt;

/// A host's port: its outbound cluster without subset, whose endpoints are all the host's on
/// that port. Ordered by host first, so one host's ports are one range of a sorted map.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPort {
    pub host: String,
    pub port: u32,
}

impl HostPort {
    pub fn new(host: &str, port: u32) -> Self {
        HostPort {
            host: host.to_string(),
            port,
        }
    }

    /// The name of the host's cluster for the port (`outbound|<port>||<host>`).
    pub fn cluster_name(&self) -> String {
        cluster_name(self.port, "", &self.host)
    }

    /// The first key of `host` in the sort order: with [`HostPort::last_of`], the range of a
    /// sorted map holding exactly the host's ports.
    pub fn first_of(host: &str) -> Self {
        Self::new(host, u32::MIN)
    }

    /// The last key of `host` in the sort order (see [`HostPort::first_of`]).
    pub fn last_of(host: &str) -> Self {
        Self::new(host, u32::MAX)
    }
}

/// An outbound cluster: a host's port, narrowed to a DestinationRule subset when `subset` is
/// not empty.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OutboundCluster {
    pub service: HostPort,
    /// The subset's name; empty for the host's own cluster.
    pub subset: String,
}

impl OutboundCluster {
    /// The cluster of subset `subset` of `service` (empty: the host's own cluster).
    pub fn new(service: HostPort, subset: &str) -> Self {
        OutboundCluster {
            service,
            subset: subset.to_string(),
        }
    }

    /// Whether the cluster is a subset's: its endpoints depend on the DestinationRule the
    /// proxy's namespace sees.
    pub fn is_subset(&self) -> bool {
        !self.subset.is_empty()
    }

    /// The name Envoy knows the cluster by.
    pub fn name(&self) -> String {
        cluster_name(self.service.port, &self.subset, &self.service.host)
    }

    /// Istio's SNI for mesh traffic to the cluster (`outbound_.<port>_.<subset>_.<host>`).
    pub fn sni(&self) -> String {
        format!(
            "outbound_.{}_.{}_.{}",
            self.service.port, self.subset, self.service.host
        )
    }

    /// The cluster a name stands for; `None` for a name of another form (inbound clusters,
    /// passthrough, a cluster an EnvoyFilter added).
    pub fn parse(name: &str) -> Option<Self> {
        let mut parts = name.splitn(4, '|');
        if parts.next()? != "outbound" {
            return None;
        }
        let port = parts.next()?.parse().ok()?;
        let subset = parts.next()?;
        let host = parts.next()?;
        Some(OutboundCluster::new(HostPort::new(host, port), subset))
    }
}

impl From<HostPort> for OutboundCluster {
    fn from(service: HostPort) -> Self {
        OutboundCluster {
            service,
            subset: String::new(),
        }
    }
}

impl fmt::Display for OutboundCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "outbound|{}|{}|{}",
            self.service.port, self.subset, self.service.host
        )
    }
}

/// The name of the cluster of `host:port`, narrowed to `subset` when not empty.
pub fn cluster_name(port: u32, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_name_reads_back_as_the_cluster_it_was_made_from() {
        let whole = OutboundCluster::from(HostPort::new("web.shop.svc.cluster.local", 8080));
        let subset = OutboundCluster::new(HostPort::new("web.shop.svc.cluster.local", 8080), "v1");
        assert_eq!(whole.name(), "outbound|8080||web.shop.svc.cluster.local");
        assert_eq!(subset.name(), "outbound|8080|v1|web.shop.svc.cluster.local");
        assert_eq!(subset.to_string(), subset.name());
        assert_eq!(whole.service.cluster_name(), whole.name());
        for cluster in [&whole, &subset] {
            assert_eq!(
                OutboundCluster::parse(&cluster.name()).as_ref(),
                Some(cluster)
            );
        }
        assert!(!whole.is_subset());
        assert!(subset.is_subset());
        assert_eq!(
            subset.sni(),
            "outbound_.8080_.v1_.web.shop.svc.cluster.local"
        );
    }

    #[test]
    fn names_of_other_forms_are_no_outbound_cluster() {
        for name in [
            "inbound|80||",
            "PassthroughCluster",
            "outbound|http||web",
            "outbound|80|v1",
            "",
        ] {
            assert_eq!(OutboundCluster::parse(name), None, "{name}");
        }
    }

    #[test]
    fn a_hosts_ports_are_one_range_of_a_sorted_map() {
        let map: BTreeMap<HostPort, ()> = [("a", 80), ("b", 1), ("b", 443), ("b", 80), ("ba", 1)]
            .into_iter()
            .map(|(h, p)| (HostPort::new(h, p), ()))
            .collect();
        let ports: Vec<u32> = map
            .range(HostPort::first_of("b")..=HostPort::last_of("b"))
            .map(|(k, _)| k.port)
            .collect();
        assert_eq!(ports, [1, 80, 443]);
    }
}
