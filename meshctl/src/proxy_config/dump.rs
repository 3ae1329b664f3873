//! Reading an Envoy config dump (`/config_dump`, `envoy.admin.v3.ConfigDump`): its sections by
//! type, and in each the resources the proxy holds, static and dynamic, with the state Envoy
//! reports them in. Field names are Envoy's (the admin prints proto field names).

use serde::Serialize;
use serde_json::Value;

/// The section types of a config dump.
const BOOTSTRAP: &str = "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump";
const CLUSTERS: &str = "type.googleapis.com/envoy.admin.v3.ClustersConfigDump";
const LISTENERS: &str = "type.googleapis.com/envoy.admin.v3.ListenersConfigDump";
const ROUTES: &str = "type.googleapis.com/envoy.admin.v3.RoutesConfigDump";
const SECRETS: &str = "type.googleapis.com/envoy.admin.v3.SecretsConfigDump";

/// How the proxy holds a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Held {
    /// From the bootstrap.
    Static,
    /// From xDS, in use.
    Active,
    /// From xDS, not in use yet (a cluster initialising, a listener waiting for its routes).
    Warming,
    /// From xDS, being replaced or removed.
    Draining,
}

impl Held {
    pub fn as_str(self) -> &'static str {
        match self {
            Held::Static => "STATIC",
            Held::Active => "ACTIVE",
            Held::Warming => "WARMING",
            Held::Draining => "DRAINING",
        }
    }
}

/// One resource of a config dump.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry<'a> {
    pub held: Held,
    /// The xDS version it came with (none for static resources).
    pub version: Option<&'a str>,
    /// The resource as Envoy prints it.
    pub config: &'a Value,
}

/// A parsed `/config_dump` document.
#[derive(Clone, Debug)]
pub struct ConfigDump {
    doc: Value,
}

impl ConfigDump {
    /// Parses the admin's answer; an error names what is not a config dump.
    pub fn parse(bytes: &[u8]) -> anyhow::Result<Self> {
        let doc: Value = serde_json::from_slice(bytes)
            .map_err(|e| anyhow::anyhow!("the config dump is not JSON: {e}"))?;
        if !doc.get("configs").is_some_and(Value::is_array) {
            anyhow::bail!("not an Envoy config dump (no \"configs\" list)");
        }
        Ok(ConfigDump { doc })
    }

    /// The whole document.
    pub fn document(&self) -> &Value {
        &self.doc
    }

    fn section(&self, type_url: &str) -> Option<&Value> {
        self.doc
            .get("configs")?
            .as_array()?
            .iter()
            .find(|c| c.get("@type").and_then(Value::as_str) == Some(type_url))
    }

    /// The bootstrap the proxy started with.
    pub fn bootstrap(&self) -> Option<&Value> {
        self.section(BOOTSTRAP)?.get("bootstrap")
    }

    /// Every cluster: static, then active, then warming.
    pub fn clusters(&self) -> Vec<Entry<'_>> {
        let Some(section) = self.section(CLUSTERS) else {
            return Vec::new();
        };
        let mut out = entries(section, "static_clusters", "cluster", Held::Static);
        out.extend(entries(
            section,
            "dynamic_active_clusters",
            "cluster",
            Held::Active,
        ));
        out.extend(entries(
            section,
            "dynamic_warming_clusters",
            "cluster",
            Held::Warming,
        ));
        out
    }

    /// Every listener: static, then each dynamic one in its active, warming and draining states.
    pub fn listeners(&self) -> Vec<Entry<'_>> {
        let Some(section) = self.section(LISTENERS) else {
            return Vec::new();
        };
        let mut out = entries(section, "static_listeners", "listener", Held::Static);
        for dynamic in list(section, "dynamic_listeners") {
            for (state, held) in [
                ("active_state", Held::Active),
                ("warming_state", Held::Warming),
                ("draining_state", Held::Draining),
            ] {
                if let Some(config) = dynamic.get(state).and_then(|s| s.get("listener")) {
                    out.push(Entry {
                        held,
                        version: dynamic
                            .get(state)
                            .and_then(|s| s.get("version_info"))
                            .and_then(Value::as_str),
                        config,
                    });
                }
            }
        }
        out
    }

    /// Every route configuration: static, then dynamic (RDS).
    pub fn routes(&self) -> Vec<Entry<'_>> {
        let Some(section) = self.section(ROUTES) else {
            return Vec::new();
        };
        let mut out = entries(
            section,
            "static_route_configs",
            "route_config",
            Held::Static,
        );
        out.extend(entries(
            section,
            "dynamic_route_configs",
            "route_config",
            Held::Active,
        ));
        out
    }

    /// Every secret: static, then active, then warming.
    pub fn secrets(&self) -> Vec<Entry<'_>> {
        let Some(section) = self.section(SECRETS) else {
            return Vec::new();
        };
        let mut out = entries(section, "static_secrets", "secret", Held::Static);
        out.extend(entries(
            section,
            "dynamic_active_secrets",
            "secret",
            Held::Active,
        ));
        out.extend(entries(
            section,
            "dynamic_warming_secrets",
            "secret",
            Held::Warming,
        ));
        out
    }
}

fn list<'a>(section: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    section
        .get(field)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn entries<'a>(section: &'a Value, field: &str, inner: &str, held: Held) -> Vec<Entry<'a>> {
    list(section, field)
        .filter_map(|item| {
            Some(Entry {
                held,
                version: item.get("version_info").and_then(Value::as_str),
                config: item.get(inner)?,
            })
        })
        .collect()
}

/// An Envoy `Address` as text and port: a socket address, or a pipe's path (no port).
pub fn address_of(address: Option<&Value>) -> (String, Option<u32>) {
    let socket = address.and_then(|a| a.get("socket_address"));
    let text = socket
        .and_then(|s| s.get("address"))
        .or_else(|| address.and_then(|a| a.pointer("/pipe/path")))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let port = socket
        .and_then(|s| s.get("port_value"))
        .and_then(Value::as_u64)
        .and_then(|p| u32::try_from(p).ok());
    (text, port)
}

/// The resource's `name`, or "" when it has none.
pub fn name_of(config: &Value) -> &str {
    config
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A dump shaped like Envoy's: one resource in each state the accessors read.
    pub fn sample() -> ConfigDump {
        ConfigDump::parse(
            json!({"configs": [
                {"@type": BOOTSTRAP, "bootstrap": {"node": {"id": "sidecar~198.18.0.5~web-1.shop~shop.svc.cluster.local"}}},
                {"@type": CLUSTERS, "version_info": "v2",
                 "static_clusters": [{"cluster": {"name": "xds-grpc", "type": "STRICT_DNS"}}],
                 "dynamic_active_clusters": [{"version_info": "v2", "cluster": {"name": "outbound|8080||reviews.shop.svc.cluster.local", "type": "EDS"}}],
                 "dynamic_warming_clusters": [{"version_info": "v3", "cluster": {"name": "outbound|9080|v2|ratings.shop.svc.cluster.local", "type": "EDS"}}]},
                {"@type": LISTENERS,
                 "dynamic_listeners": [{"name": "virtualOutbound",
                    "active_state": {"version_info": "v1", "listener": {"name": "virtualOutbound"}},
                    "warming_state": {"version_info": "v2", "listener": {"name": "virtualOutbound"}}}]},
                {"@type": ROUTES, "dynamic_route_configs": [{"version_info": "v1", "route_config": {"name": "8080"}}]},
                {"@type": SECRETS, "dynamic_active_secrets": [{"name": "default", "version_info": "c1", "secret": {"name": "default"}}]},
            ]})
            .to_string()
            .as_bytes(),
        )
        .expect("a config dump")
    }

    #[test]
    fn each_section_lists_static_then_dynamic_resources_with_their_state() {
        let dump = sample();
        let clusters: Vec<(Held, &str, Option<&str>)> = dump
            .clusters()
            .iter()
            .map(|e| (e.held, name_of(e.config), e.version))
            .collect();
        assert_eq!(
            clusters,
            [
                (Held::Static, "xds-grpc", None),
                (
                    Held::Active,
                    "outbound|8080||reviews.shop.svc.cluster.local",
                    Some("v2")
                ),
                (
                    Held::Warming,
                    "outbound|9080|v2|ratings.shop.svc.cluster.local",
                    Some("v3")
                ),
            ]
        );
        let listeners: Vec<(Held, Option<&str>)> = dump
            .listeners()
            .iter()
            .map(|e| (e.held, e.version))
            .collect();
        assert_eq!(
            listeners,
            [(Held::Active, Some("v1")), (Held::Warming, Some("v2"))]
        );
        assert_eq!(name_of(dump.routes()[0].config), "8080");
        assert_eq!(name_of(dump.secrets()[0].config), "default");
        assert!(dump.bootstrap().is_some_and(|b| b.get("node").is_some()));
    }

    #[test]
    fn documents_that_are_not_config_dumps_are_refused() {
        assert!(ConfigDump::parse(b"not json").is_err());
        assert!(ConfigDump::parse(b"{\"clusters\": []}").is_err());
    }
}
