//! `proxy-config cluster`: the clusters a proxy holds, one row each, with istioctl's columns
//! (service FQDN, port, subset, direction, type). Mesh cluster names are read back as the
//! instance made them (`outbound|<port>|<subset>|<host>`, `inbound|<port>||`).

use clap::ValueEnum;
use meshplane_xds_core::translate::cluster_id::OutboundCluster;
use serde_json::Value;

use super::dump::{name_of, ConfigDump};
use super::ConfigReport;
use crate::output::{or_dash, Table};

/// A cluster's traffic direction, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Direction {
    Inbound,
    Outbound,
}

/// `--fqdn`, `--port`, `--subset`, `--direction`: a cluster is shown when it matches them all.
#[derive(Clone, Debug, Default)]
pub struct ClusterFilter {
    pub fqdn: Option<String>,
    pub port: Option<u32>,
    pub subset: Option<String>,
    pub direction: Option<Direction>,
}

/// What the table shows of one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRow {
    /// The service host, or the cluster's whole name when it is not a mesh cluster.
    pub fqdn: String,
    pub port: Option<u32>,
    pub subset: String,
    pub direction: Option<Direction>,
    /// Envoy's discovery type (`EDS`, `STATIC`, `ORIGINAL_DST`, …).
    pub kind: String,
}

impl ClusterRow {
    pub fn of(config: &Value) -> Self {
        let name = name_of(config);
        let kind = config
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| {
                config
                    .pointer("/cluster_type/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            // An absent enum is its zero value.
            .unwrap_or_else(|| "STATIC".to_string());
        if let Some(cluster) = OutboundCluster::parse(name) {
            return ClusterRow {
                fqdn: cluster.service.host,
                port: Some(cluster.service.port),
                subset: cluster.subset,
                direction: Some(Direction::Outbound),
                kind,
            };
        }
        let inbound_port = name
            .strip_prefix("inbound|")
            .and_then(|rest| rest.split('|').next())
            .and_then(|p| p.parse().ok());
        match inbound_port {
            Some(port) => ClusterRow {
                fqdn: String::new(),
                port: Some(port),
                subset: String::new(),
                direction: Some(Direction::Inbound),
                kind,
            },
            None => ClusterRow {
                fqdn: name.to_string(),
                port: None,
                subset: String::new(),
                direction: None,
                kind,
            },
        }
    }

    pub fn matches(&self, filter: &ClusterFilter) -> bool {
        filter.fqdn.as_ref().is_none_or(|f| {
            // A short name matches the FQDN it starts (`reviews` or `reviews.shop`).
            self.fqdn == *f || self.fqdn.starts_with(&format!("{f}."))
        }) && filter.port.is_none_or(|p| self.port == Some(p))
            && filter.subset.as_ref().is_none_or(|s| self.subset == *s)
            && filter.direction.is_none_or(|d| self.direction == Some(d))
    }
}

pub fn report(dump: &ConfigDump, filter: &ClusterFilter) -> ConfigReport {
    let mut table = Table::new([
        "SERVICE FQDN",
        "PORT",
        "SUBSET",
        "DIRECTION",
        "TYPE",
        "STATE",
    ]);
    let mut configs = Vec::new();
    for entry in dump.clusters() {
        let row = ClusterRow::of(entry.config);
        if !row.matches(filter) {
            continue;
        }
        table.row([
            or_dash(&row.fqdn),
            row.port.map_or_else(|| "-".to_string(), |p| p.to_string()),
            or_dash(&row.subset),
            match row.direction {
                Some(Direction::Inbound) => "inbound".to_string(),
                Some(Direction::Outbound) => "outbound".to_string(),
                None => "-".to_string(),
            },
            row.kind,
            entry.held.as_str().to_string(),
        ]);
        configs.push(entry.config.clone());
    }
    ConfigReport::new(table, configs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mesh_cluster_names_read_back_as_service_port_subset_and_direction() {
        let row = ClusterRow::of(
            &json!({"name": "outbound|9080|v2|reviews.shop.svc.cluster.local", "type": "EDS"}),
        );
        assert_eq!(
            row,
            ClusterRow {
                fqdn: "reviews.shop.svc.cluster.local".into(),
                port: Some(9080),
                subset: "v2".into(),
                direction: Some(Direction::Outbound),
                kind: "EDS".into(),
            }
        );
        let inbound = ClusterRow::of(&json!({"name": "inbound|8080||", "type": "ORIGINAL_DST"}));
        assert_eq!(
            (inbound.port, inbound.direction),
            (Some(8080), Some(Direction::Inbound))
        );
        let other = ClusterRow::of(&json!({"name": "xds-grpc"}));
        assert_eq!(
            (other.fqdn.as_str(), other.kind.as_str(), other.direction),
            ("xds-grpc", "STATIC", None)
        );
    }

    #[test]
    fn filters_select_by_fqdn_prefix_port_subset_and_direction() {
        let row =
            ClusterRow::of(&json!({"name": "outbound|9080|v2|reviews.shop.svc.cluster.local"}));
        let with = |f: ClusterFilter| row.matches(&f);
        assert!(with(ClusterFilter::default()));
        assert!(with(ClusterFilter {
            fqdn: Some("reviews.shop".into()),
            port: Some(9080),
            subset: Some("v2".into()),
            direction: Some(Direction::Outbound),
        }));
        assert!(!with(ClusterFilter {
            fqdn: Some("review".into()),
            ..ClusterFilter::default()
        }));
        assert!(!with(ClusterFilter {
            port: Some(80),
            ..ClusterFilter::default()
        }));
        assert!(!with(ClusterFilter {
            subset: Some("v1".into()),
            ..ClusterFilter::default()
        }));
        assert!(!with(ClusterFilter {
            direction: Some(Direction::Inbound),
            ..ClusterFilter::default()
        }));
    }
}
