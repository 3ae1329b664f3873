//! `proxy-config listener`: one row per filter chain of each listener a proxy holds, with
//! istioctl's columns: the listener's address and port, what the chain matches, and where it
//! sends traffic (an RDS route name, an inline route, or a TCP cluster).

use serde_json::Value;

use super::dump::{address_of, name_of, ConfigDump};
use super::ConfigReport;
use crate::output::{or_dash, Table};

/// `--port`, `--address`: a listener is shown when it matches both.
#[derive(Clone, Debug, Default)]
pub struct ListenerFilter {
    pub port: Option<u32>,
    pub address: Option<String>,
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// What a filter chain matches, in istioctl's words (`ALL` when it matches everything).
pub fn describe_match(chain: &Value) -> String {
    let Some(m) = chain.get("filter_chain_match") else {
        return "ALL".to_string();
    };
    let mut parts = Vec::new();
    let prefixes: Vec<String> = m
        .get("prefix_ranges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            let address = r
                .get("address_prefix")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match r.get("prefix_len").and_then(Value::as_u64) {
                Some(len) => format!("{address}/{len}"),
                None => address.to_string(),
            }
        })
        .collect();
    if !prefixes.is_empty() {
        parts.push(format!("Addr: {}", prefixes.join(",")));
    }
    if let Some(port) = m.get("destination_port").and_then(Value::as_u64) {
        parts.push(format!("Port: {port}"));
    }
    let sni = strings(m.get("server_names"));
    if !sni.is_empty() {
        parts.push(format!("SNI: {}", sni.join(",")));
    }
    if let Some(transport) = m.get("transport_protocol").and_then(Value::as_str) {
        parts.push(format!("Trans: {transport}"));
    }
    let alpn = strings(m.get("application_protocols"));
    if !alpn.is_empty() {
        parts.push(format!("App: {}", alpn.join(",")));
    }
    if parts.is_empty() {
        "ALL".to_string()
    } else {
        parts.join("; ")
    }
}

/// Where a filter chain sends traffic: its HTTP connection manager's routes, or its TCP proxy's
/// cluster(s); else the name of its last network filter.
pub fn describe_destination(chain: &Value) -> String {
    let filters: Vec<&Value> = chain
        .get("filters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    for filter in &filters {
        let config = filter.get("typed_config");
        let type_url = config
            .and_then(|c| c.get("@type"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if type_url.ends_with(".HttpConnectionManager") {
            let config = config.unwrap_or(&Value::Null);
            if let Some(name) = config
                .pointer("/rds/route_config_name")
                .and_then(Value::as_str)
            {
                return format!("Route: {name}");
            }
            let inline = config.get("route_config").map(name_of).unwrap_or_default();
            return format!("Inline Route: {}", or_dash(inline));
        }
        if type_url.ends_with(".TcpProxy") {
            let config = config.unwrap_or(&Value::Null);
            if let Some(cluster) = config.get("cluster").and_then(Value::as_str) {
                return format!("Cluster: {cluster}");
            }
            let weighted: Vec<&str> = config
                .pointer("/weighted_clusters/clusters")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(name_of)
                .collect();
            return format!("Clusters: {}", weighted.join(","));
        }
    }
    filters
        .last()
        .map(|f| name_of(f).to_string())
        .unwrap_or_else(|| "-".to_string())
}

pub fn report(dump: &ConfigDump, filter: &ListenerFilter) -> ConfigReport {
    let mut table = Table::new(["NAME", "ADDRESSES", "PORT", "MATCH", "DESTINATION", "STATE"]);
    let mut configs = Vec::new();
    for entry in dump.listeners() {
        let (address, port) = address_of(entry.config.get("address"));
        if filter.port.is_some_and(|p| port != Some(p))
            || filter.address.as_ref().is_some_and(|a| *a != address)
        {
            continue;
        }
        let port_cell = port.map_or_else(|| "-".to_string(), |p| p.to_string());
        let mut chains: Vec<&Value> = entry
            .config
            .get("filter_chains")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .collect();
        if let Some(default) = entry.config.get("default_filter_chain") {
            chains.push(default);
        }
        if chains.is_empty() {
            table.row([
                name_of(entry.config).to_string(),
                or_dash(&address),
                port_cell.clone(),
                "-".to_string(),
                "-".to_string(),
                entry.held.as_str().to_string(),
            ]);
        }
        for chain in chains {
            table.row([
                name_of(entry.config).to_string(),
                or_dash(&address),
                port_cell.clone(),
                describe_match(chain),
                describe_destination(chain),
                entry.held.as_str().to_string(),
            ]);
        }
        configs.push(entry.config.clone());
    }
    ConfigReport::new(table, configs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chains_are_described_by_what_they_match_and_where_they_send() {
        let http = json!({
            "filter_chain_match": {"destination_port": 9080, "transport_protocol": "tls",
                                   "application_protocols": ["istio-http/1.1", "istio"]},
            "filters": [{"name": "envoy.filters.network.http_connection_manager",
                         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                                          "rds": {"route_config_name": "9080"}}}],
        });
        assert_eq!(
            describe_match(&http),
            "Port: 9080; Trans: tls; App: istio-http/1.1,istio"
        );
        assert_eq!(describe_destination(&http), "Route: 9080");
        let tcp = json!({
            "filter_chain_match": {"prefix_ranges": [{"address_prefix": "198.19.0.7", "prefix_len": 32}]},
            "filters": [{"name": "envoy.filters.network.tcp_proxy",
                         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                                          "cluster": "outbound|5432||db.shop.svc.cluster.local"}}],
        });
        assert_eq!(describe_match(&tcp), "Addr: 198.19.0.7/32");
        assert_eq!(
            describe_destination(&tcp),
            "Cluster: outbound|5432||db.shop.svc.cluster.local"
        );
        assert_eq!(describe_match(&json!({})), "ALL");
        assert_eq!(describe_destination(&json!({})), "-");
    }
}
