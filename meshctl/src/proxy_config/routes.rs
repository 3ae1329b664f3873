//! `proxy-config route`: one row per route of each virtual host of each route configuration a
//! proxy holds: the configuration's name, the virtual host, its domains, the route's match and
//! where it sends traffic.

use serde_json::Value;

use super::dump::{name_of, ConfigDump};
use super::ConfigReport;
use crate::output::{or_dash, Table};

/// `--name`: only this route configuration.
#[derive(Clone, Debug, Default)]
pub struct RouteFilter {
    pub name: Option<String>,
}

/// The domains of a virtual host, shortened as istioctl shortens them.
fn domains(vhost: &Value) -> String {
    let all: Vec<&str> = vhost
        .get("domains")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    match all.as_slice() {
        [] => "-".to_string(),
        [one] => one.to_string(),
        [first, rest @ ..] => format!("{first} +{} more...", rest.len()),
    }
}

/// A route's match: its path rule, and `(headers)` when headers are matched too.
pub fn describe_match(route: &Value) -> String {
    let Some(m) = route.get("match") else {
        return "-".to_string();
    };
    let mut out = if let Some(prefix) = m.get("prefix").and_then(Value::as_str) {
        format!("{prefix}*")
    } else if let Some(path) = m.get("path").and_then(Value::as_str) {
        path.to_string()
    } else if let Some(regex) = m.pointer("/safe_regex/regex").and_then(Value::as_str) {
        format!("regex {regex}")
    } else if let Some(template) = m
        .pointer("/path_match_policy/typed_config/path_template")
        .and_then(Value::as_str)
    {
        template.to_string()
    } else {
        "/*".to_string()
    };
    if m.get("headers")
        .and_then(Value::as_array)
        .is_some_and(|h| !h.is_empty())
    {
        out.push_str(" (headers)");
    }
    out
}

/// Where a route sends traffic: its cluster(s), a redirect or a direct response.
pub fn describe_destination(route: &Value) -> String {
    if let Some(action) = route.get("route") {
        if let Some(cluster) = action.get("cluster").and_then(Value::as_str) {
            return cluster.to_string();
        }
        let weighted: Vec<String> = action
            .pointer("/weighted_clusters/clusters")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| {
                let weight = c.get("weight").and_then(Value::as_u64).unwrap_or(0);
                format!("{} ({weight})", name_of(c))
            })
            .collect();
        if !weighted.is_empty() {
            return weighted.join(", ");
        }
        if let Some(header) = action.get("cluster_header").and_then(Value::as_str) {
            return format!("cluster from header {header}");
        }
    }
    if route.get("redirect").is_some() {
        return "redirect".to_string();
    }
    if let Some(status) = route
        .pointer("/direct_response/status")
        .and_then(Value::as_u64)
    {
        return format!("direct response {status}");
    }
    "-".to_string()
}

pub fn report(dump: &ConfigDump, filter: &RouteFilter) -> ConfigReport {
    let mut table = Table::new(["NAME", "VHOST NAME", "DOMAINS", "MATCH", "DESTINATION"]);
    let mut configs = Vec::new();
    for entry in dump.routes() {
        let name = name_of(entry.config);
        if filter.name.as_ref().is_some_and(|n| n != name) {
            continue;
        }
        for vhost in entry
            .config
            .get("virtual_hosts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for route in vhost
                .get("routes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                table.row([
                    or_dash(name),
                    or_dash(name_of(vhost)),
                    domains(vhost),
                    describe_match(route),
                    describe_destination(route),
                ]);
            }
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
    fn routes_show_their_match_and_destination() {
        let weighted = json!({
            "match": {"prefix": "/", "headers": [{"name": "end-user"}]},
            "route": {"weighted_clusters": {"clusters": [
                {"name": "outbound|9080|v1|reviews.shop.svc.cluster.local", "weight": 90},
                {"name": "outbound|9080|v2|reviews.shop.svc.cluster.local", "weight": 10}]}},
        });
        assert_eq!(describe_match(&weighted), "/* (headers)");
        assert_eq!(
            describe_destination(&weighted),
            "outbound|9080|v1|reviews.shop.svc.cluster.local (90), outbound|9080|v2|reviews.shop.svc.cluster.local (10)"
        );
        let exact = json!({"match": {"path": "/health"}, "direct_response": {"status": 200}});
        assert_eq!(describe_match(&exact), "/health");
        assert_eq!(describe_destination(&exact), "direct response 200");
        assert_eq!(
            domains(
                &json!({"domains": ["reviews.shop.svc.cluster.local", "reviews", "reviews.shop"]})
            ),
            "reviews.shop.svc.cluster.local +2 more..."
        );
    }
}
