//! `proxy-config … --diff`: what a proxy accepted (its config dump) against what its instance
//! intends it to hold (the instance's `/debug/intended`, the proxy's current snapshot in the
//! admin's form), resource by resource and field by field. Static resources (the bootstrap's)
//! and draining listeners are the proxy's own business and not compared.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::dump::{name_of, ConfigDump, Entry, Held};
use crate::output::{Report, Table};

/// The types a config dump shows, by the instance's short names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DumpedType {
    Cds,
    Lds,
    Rds,
}

impl DumpedType {
    pub const ALL: [DumpedType; 3] = [DumpedType::Cds, DumpedType::Lds, DumpedType::Rds];

    pub fn short_name(self) -> &'static str {
        match self {
            DumpedType::Cds => "cds",
            DumpedType::Lds => "lds",
            DumpedType::Rds => "rds",
        }
    }

    /// What the proxy holds of this type from xDS.
    fn held<'a>(self, dump: &'a ConfigDump) -> Vec<Entry<'a>> {
        let entries = match self {
            DumpedType::Cds => dump.clusters(),
            DumpedType::Lds => dump.listeners(),
            DumpedType::Rds => dump.routes(),
        };
        entries
            .into_iter()
            .filter(|e| matches!(e.held, Held::Active | Held::Warming))
            .collect()
    }
}

/// One resource of the instance's `/debug/intended`.
#[derive(Clone, Debug, Deserialize)]
pub struct IntendedResource {
    pub name: String,
    #[serde(default)]
    pub version: String,
    pub config: Value,
}

/// One type of the instance's `/debug/intended`.
#[derive(Clone, Debug, Deserialize)]
pub struct IntendedType {
    #[serde(rename = "type")]
    pub type_name: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resources: Vec<IntendedResource>,
}

/// The instance's `/debug/intended` answer.
#[derive(Clone, Debug, Deserialize)]
pub struct Intended {
    pub id: String,
    #[serde(default)]
    pub rendered: bool,
    #[serde(default)]
    pub types: Vec<IntendedType>,
}

/// How a resource differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DiffState {
    /// Intended, and the proxy does not hold it (a NACK, or not pushed yet).
    NotAccepted,
    /// Intended, held only as warming (a cluster initialising, a listener awaiting routes).
    Warming,
    /// Held by the proxy, no longer intended.
    NotIntended,
    /// Held with other content than intended.
    Differs,
}

impl DiffState {
    fn as_str(self) -> &'static str {
        match self {
            DiffState::NotAccepted => "NOT ACCEPTED",
            DiffState::Warming => "WARMING",
            DiffState::NotIntended => "NOT INTENDED",
            DiffState::Differs => "DIFFERS",
        }
    }
}

/// One resource that is not as intended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Difference {
    #[serde(rename = "type")]
    pub type_name: DumpedType,
    pub name: String,
    pub state: DiffState,
    /// The first fields that differ (`filter_chains[0].filters[0].name`), for `DIFFERS`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

/// The comparison of one proxy.
#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    pub pod: String,
    /// `pod.namespace` of the instance serving the proxy.
    pub instance: String,
    pub proxy: String,
    /// Resources compared per type (intended ones).
    pub compared: BTreeMap<DumpedType, usize>,
    pub differences: Vec<Difference>,
}

/// How many differing fields are named per resource.
const MAX_FIELDS: usize = 5;

/// Compares what `dump` holds with `intended`, for `types`.
pub fn compare(
    dump: &ConfigDump,
    intended: &Intended,
    types: &[DumpedType],
) -> (BTreeMap<DumpedType, usize>, Vec<Difference>) {
    let mut compared = BTreeMap::new();
    let mut differences = Vec::new();
    for &t in types {
        let wanted: BTreeMap<&str, &Value> = intended
            .types
            .iter()
            .filter(|it| it.type_name == t.short_name())
            .flat_map(|it| it.resources.iter())
            .map(|r| (r.name.as_str(), &r.config))
            .collect();
        compared.insert(t, wanted.len());
        let mut held: BTreeMap<&str, Vec<Entry<'_>>> = BTreeMap::new();
        for entry in t.held(dump) {
            held.entry(name_of(entry.config)).or_default().push(entry);
        }
        for (name, config) in &wanted {
            let config = &comparable(t, config);
            let entries = held.get(name).map(Vec::as_slice).unwrap_or_default();
            let active = entries
                .iter()
                .find(|e| e.held == Held::Active)
                .map(|e| comparable(t, e.config));
            let warming = entries
                .iter()
                .find(|e| e.held == Held::Warming)
                .map(|e| comparable(t, e.config));
            let mut push = |state, fields| {
                differences.push(Difference {
                    type_name: t,
                    name: name.to_string(),
                    state,
                    fields,
                })
            };
            match (active, warming) {
                (_, Some(w)) if same(&w, config) => push(DiffState::Warming, Vec::new()),
                (Some(a), _) => {
                    let mut fields = Vec::new();
                    field_diff(&a, config, String::new(), &mut fields);
                    if !fields.is_empty() {
                        push(DiffState::Differs, fields);
                    }
                }
                (None, Some(w)) => {
                    let mut fields = Vec::new();
                    field_diff(&w, config, String::new(), &mut fields);
                    push(DiffState::Differs, fields);
                }
                (None, None) => push(DiffState::NotAccepted, Vec::new()),
            }
        }
        for name in held.keys().filter(|n| !wanted.contains_key(*n)) {
            differences.push(Difference {
                type_name: t,
                name: name.to_string(),
                state: DiffState::NotIntended,
                fields: Vec::new(),
            });
        }
    }
    (compared, differences)
}

/// A resource in the form compared: a route configuration's virtual hosts by name, since a
/// VHDS client's dump lists them in the order Envoy merged them, not the order sent.
fn comparable(t: DumpedType, config: &Value) -> Cow<'_, Value> {
    if t != DumpedType::Rds || config.get("virtual_hosts").is_none() {
        return Cow::Borrowed(config);
    }
    let mut config = config.clone();
    if let Some(hosts) = config
        .get_mut("virtual_hosts")
        .and_then(Value::as_array_mut)
    {
        hosts.sort_by(|a, b| name_of(a).cmp(name_of(b)));
    }
    Cow::Owned(config)
}

/// Whether two admin-form documents are the same (numbers by value: `1` is `1.0`).
fn same(held: &Value, intended: &Value) -> bool {
    let mut fields = Vec::new();
    field_diff(held, intended, String::new(), &mut fields);
    fields.is_empty()
}

/// Appends the paths where `held` and `intended` differ, up to [`MAX_FIELDS`].
fn field_diff(held: &Value, intended: &Value, path: String, out: &mut Vec<String>) {
    if out.len() >= MAX_FIELDS {
        return;
    }
    let here = || {
        if path.is_empty() {
            "(whole resource)".to_string()
        } else {
            path.clone()
        }
    };
    match (held, intended) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => field_diff(x, y, child, out),
                    _ => out.push(child),
                }
                if out.len() >= MAX_FIELDS {
                    return;
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                out.push(format!(
                    "{} (length {} held, {} intended)",
                    here(),
                    a.len(),
                    b.len()
                ));
                return;
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                field_diff(x, y, format!("{path}[{i}]"), out);
                if out.len() >= MAX_FIELDS {
                    return;
                }
            }
        }
        (Value::Number(x), Value::Number(y)) => {
            if x.as_f64() != y.as_f64() {
                out.push(here());
            }
        }
        (x, y) => {
            if x != y {
                out.push(here());
            }
        }
    }
}

impl Report for DiffReport {
    fn human(&self, _wide: bool) -> String {
        let counts: Vec<String> = self
            .compared
            .iter()
            .map(|(t, n)| format!("{n} {}", t.short_name()))
            .collect();
        if self.differences.is_empty() {
            return format!(
                "{} holds what {} intends ({}).\n",
                self.pod,
                self.instance,
                counts.join(", ")
            );
        }
        let mut table = Table::new(["TYPE", "NAME", "STATE", "FIELDS"]);
        for d in &self.differences {
            table.row([
                d.type_name.short_name().to_string(),
                d.name.clone(),
                d.state.as_str().to_string(),
                if d.fields.is_empty() {
                    "-".to_string()
                } else {
                    d.fields.join(", ")
                },
            ]);
        }
        format!(
            "{} differs from what {} intends ({} compared):\n{}",
            self.pod,
            self.instance,
            counts.join(", "),
            table.render()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CLUSTERS: &str = "type.googleapis.com/envoy.admin.v3.ClustersConfigDump";

    fn dump(active: Value, warming: Value) -> ConfigDump {
        ConfigDump::parse(
            json!({"configs": [{"@type": CLUSTERS,
                "static_clusters": [{"cluster": {"name": "xds-grpc"}}],
                "dynamic_active_clusters": active,
                "dynamic_warming_clusters": warming}]})
            .to_string()
            .as_bytes(),
        )
        .expect("a dump")
    }

    fn intended(clusters: Value) -> Intended {
        serde_json::from_value(
            json!({"id": "sidecar~198.18.0.5~web-1.shop~shop.svc.cluster.local",
            "rendered": true, "types": [{"type": "cds", "version": "v", "resources": clusters}]}),
        )
        .expect("intended")
    }

    fn cluster(name: &str, timeout: Value) -> Value {
        json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": name,
               "type": "EDS", "connect_timeout": timeout, "circuit_breakers": {"thresholds": [{"max_retries": 3}]}})
    }

    #[test]
    fn a_synced_proxy_has_no_differences_and_static_resources_are_not_compared() {
        let a = cluster("outbound|80||a.shop.svc.cluster.local", json!("10s"));
        let held = dump(
            json!([{"version_info": "v", "cluster": a.clone()}]),
            json!([]),
        );
        let (compared, differences) = compare(
            &held,
            &intended(json!([{"name": "outbound|80||a.shop.svc.cluster.local", "config": a}])),
            &[DumpedType::Cds],
        );
        assert_eq!(compared[&DumpedType::Cds], 1);
        assert_eq!(differences, []);
    }

    #[test]
    fn rejected_changed_removed_and_warming_resources_are_told_apart() {
        let a_old = cluster("a", json!("10s"));
        let a_new = cluster("a", json!("-1s"));
        let mut c_numbers = cluster("c", json!("1s"));
        c_numbers["circuit_breakers"]["thresholds"][0]["max_retries"] = json!(3.0);
        let held = dump(
            json!([
                {"cluster": a_old},
                {"cluster": cluster("gone", json!("1s"))},
                {"cluster": cluster("c", json!("1s"))},
            ]),
            json!([{"cluster": cluster("w", json!("1s"))}]),
        );
        let wanted = intended(json!([
            {"name": "a", "config": a_new},
            {"name": "b", "config": cluster("b", json!("1s"))},
            {"name": "c", "config": c_numbers},
            {"name": "w", "config": cluster("w", json!("1s"))},
        ]));
        let (_, differences) = compare(&held, &wanted, &DumpedType::ALL);
        let states: Vec<(&str, DiffState, Vec<String>)> = differences
            .iter()
            .map(|d| (d.name.as_str(), d.state, d.fields.clone()))
            .collect();
        assert_eq!(
            states,
            [
                ("a", DiffState::Differs, vec!["connect_timeout".to_string()]),
                ("b", DiffState::NotAccepted, vec![]),
                ("w", DiffState::Warming, vec![]),
                ("gone", DiffState::NotIntended, vec![]),
            ]
        );
    }

    #[test]
    fn field_paths_name_list_positions_and_missing_fields() {
        let mut out = Vec::new();
        field_diff(
            &json!({"filter_chains": [{"filters": [{"name": "a"}]}], "extra": 1}),
            &json!({"filter_chains": [{"filters": [{"name": "b"}]}]}),
            String::new(),
            &mut out,
        );
        assert_eq!(out, ["extra", "filter_chains[0].filters[0].name"]);
        let mut out = Vec::new();
        field_diff(&json!([1, 2]), &json!([1]), "x".into(), &mut out);
        assert_eq!(out, ["x (length 2 held, 1 intended)"]);
    }
}
