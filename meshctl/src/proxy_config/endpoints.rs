//! `proxy-config endpoint`: every host of every cluster as the proxy sees it now (the admin's
//! `/clusters?format=json`), with istioctl's columns: endpoint, health status, whether outlier
//! detection ejected it, and the cluster.

use serde_json::Value;

use super::dump::address_of;
use super::ConfigReport;
use crate::output::Table;

/// `--cluster`, `--port`, `--status`: an endpoint is shown when it matches them all.
#[derive(Clone, Debug, Default)]
pub struct EndpointFilter {
    pub cluster: Option<String>,
    pub port: Option<u32>,
    pub status: Option<String>,
}

/// One host of one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointRow {
    pub address: String,
    pub port: Option<u32>,
    /// `HEALTHY`, `UNHEALTHY`, `DRAINING`, …
    pub status: String,
    pub outlier_ejected: bool,
    pub cluster: String,
}

/// Reads `/clusters?format=json`.
pub fn rows(doc: &Value) -> Vec<(EndpointRow, Value)> {
    let mut out = Vec::new();
    for cluster in doc
        .get("cluster_statuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = cluster
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        for host in cluster
            .get("host_statuses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (address, port) = address_of(host.get("address"));
            let health = host.get("health_status");
            let status = health
                .and_then(|h| h.get("eds_health_status"))
                .and_then(Value::as_str)
                // An absent enum is its zero value.
                .unwrap_or("UNKNOWN")
                .to_string();
            let outlier_ejected = health
                .and_then(|h| h.get("failed_outlier_check"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let mut json = host.clone();
            if let Some(object) = json.as_object_mut() {
                object.insert("cluster_name".into(), Value::from(name));
            }
            out.push((
                EndpointRow {
                    address,
                    port,
                    status,
                    outlier_ejected,
                    cluster: name.to_string(),
                },
                json,
            ));
        }
    }
    out
}

pub fn report(doc: &Value, filter: &EndpointFilter) -> ConfigReport {
    let mut table = Table::new(["ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"]);
    let mut configs = Vec::new();
    for (row, json) in rows(doc) {
        if filter.cluster.as_ref().is_some_and(|c| *c != row.cluster)
            || filter.port.is_some_and(|p| row.port != Some(p))
            || filter
                .status
                .as_ref()
                .is_some_and(|s| !s.eq_ignore_ascii_case(&row.status))
        {
            continue;
        }
        let endpoint = match row.port {
            Some(port) => format!("{}:{port}", row.address),
            None => row.address.clone(),
        };
        table.row([
            endpoint,
            row.status.clone(),
            if row.outlier_ejected { "FAILED" } else { "OK" }.to_string(),
            row.cluster.clone(),
        ]);
        configs.push(json);
    }
    ConfigReport::new(table, configs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hosts_are_read_with_health_and_outlier_state() {
        let doc = json!({"cluster_statuses": [{
        "name": "outbound|9080||reviews.shop.svc.cluster.local",
        "host_statuses": [
            {"address": {"socket_address": {"address": "198.18.0.7", "port_value": 9080}},
             "health_status": {"eds_health_status": "HEALTHY"}},
            {"address": {"socket_address": {"address": "198.18.0.8", "port_value": 9080}},
             "health_status": {"eds_health_status": "HEALTHY", "failed_outlier_check": true}},
        ]}]});
        let rows: Vec<EndpointRow> = rows(&doc).into_iter().map(|(r, _)| r).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (
                rows[0].address.as_str(),
                rows[0].port,
                rows[0].outlier_ejected
            ),
            ("198.18.0.7", Some(9080), false)
        );
        assert!(rows[1].outlier_ejected);
        let only_ejected = report(
            &doc,
            &EndpointFilter {
                port: Some(9080),
                status: Some("healthy".into()),
                ..EndpointFilter::default()
            },
        );
        assert_eq!(only_ejected.configs.len(), 2);
        let other_cluster = report(
            &doc,
            &EndpointFilter {
                cluster: Some("outbound|80||other".into()),
                ..EndpointFilter::default()
            },
        );
        assert!(other_cluster.configs.is_empty());
    }
}
