//! What the debug endpoints show of connected proxies: per-type sync state and, on request,
//! what each proxy holds. Streams publish cheap shared references at every message; the lists
//! are built only when an endpoint asks.

use std::sync::Arc;

use serde::Serialize;

use super::hub::{lock, Hub};
use crate::ads::protocol::status::SyncState;
use crate::ads::protocol::{Nack, Protocol};
use crate::ads::snapshot::{short_name, Snapshot};
use crate::model::ProxyNode;

/// Per-type sync state of a proxy, for the debug endpoint.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TypeStatus {
    #[serde(rename = "type")]
    pub type_name: &'static str,
    pub subscribed: bool,
    pub sent_version: Option<String>,
    pub acked_version: Option<String>,
    pub awaiting_ack: bool,
    pub last_nack: Option<Nack>,
    /// The proxy rejected the latest content offered and holds older config (or none) until
    /// the content changes ([`SyncState::rejected`]); `last_nack` may be history.
    pub rejected: bool,
    /// Name → version of what the proxy holds.
    pub resources: Vec<(String, String)>,
}

/// A connected proxy as the debug endpoints show it.
#[derive(Clone, Debug, Serialize)]
pub struct ProxyStatus {
    pub id: String,
    pub namespace: String,
    pub pod_name: Option<String>,
    pub protocol: &'static str,
    pub config_bytes: usize,
    pub types: Vec<TypeStatus>,
}

/// What the debug endpoints show of a type's published state.
fn status(state: &SyncState, index: usize, with_resources: bool) -> TypeStatus {
    TypeStatus {
        type_name: short_name(index),
        subscribed: state.subscribed,
        sent_version: state.sent_version.clone(),
        acked_version: state.acked_version.clone(),
        awaiting_ack: state.awaiting_ack,
        last_nack: state.last_nack.clone(),
        rejected: state.rejected,
        resources: if with_resources {
            state
                .held
                .iter()
                .map(|(n, r)| (n.clone(), r.version.clone()))
                .collect()
        } else {
            Vec::new()
        },
    }
}
impl Hub {
    /// Every connected proxy with its sync state, including what each holds.
    pub fn proxy_statuses(&self) -> Vec<ProxyStatus> {
        self.statuses(None, true)
    }

    /// Every connected proxy with its sync state, without the held resources.
    pub fn proxy_overview(&self) -> Vec<ProxyStatus> {
        self.statuses(None, false)
    }

    /// One connected proxy with its sync state and what it holds.
    pub fn proxy_status(&self, id: &str) -> Option<ProxyStatus> {
        self.statuses(Some(id), true).pop()
    }

    /// The configuration the instance intends proxy `id` to hold (none when no such proxy is
    /// connected): its current snapshot, in the form its stream takes routes in.
    pub fn intended(&self, id: &str) -> Option<IntendedConfig> {
        let (snapshot, vhds) = lock(&self.proxies)
            .values()
            .find(|e| e.node.id == id)
            .map(|e| {
                let vhds = lock(&e.status)
                    .get(crate::ads::snapshot::VHDS)
                    .is_some_and(|s| s.subscribed);
                (Arc::clone(&e.snapshot.borrow()), vhds)
            })?;
        Some(IntendedConfig::of(id, &snapshot, vhds))
    }

    fn statuses(&self, id: Option<&str>, with_resources: bool) -> Vec<ProxyStatus> {
        // Take the shared state under the lock; build the lists outside it.
        let taken: Vec<(Arc<ProxyNode>, Protocol, usize, Vec<SyncState>)> = lock(&self.proxies)
            .values()
            .filter(|e| id.is_none_or(|id| e.node.id == id))
            .map(|e| {
                let bytes = e.snapshot.borrow().bytes;
                (
                    Arc::clone(&e.node),
                    e.protocol,
                    bytes,
                    lock(&e.status).clone(),
                )
            })
            .collect();
        let mut out: Vec<ProxyStatus> = taken
            .into_iter()
            .map(|(node, protocol, config_bytes, types)| ProxyStatus {
                id: node.id.clone(),
                namespace: node.namespace.clone(),
                pod_name: node.pod_name.clone(),
                protocol: protocol.as_str(),
                config_bytes,
                types: types
                    .iter()
                    .enumerate()
                    .map(|(i, t)| status(t, i, with_resources))
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

/// One resource the instance intends a proxy to hold, as Envoy's admin would print it.
#[derive(Clone, Debug, Serialize)]
pub struct IntendedResource {
    pub name: String,
    pub version: String,
    pub config: serde_json::Value,
}

/// One type of what the instance intends a proxy to hold.
#[derive(Clone, Debug, Serialize)]
pub struct IntendedType {
    #[serde(rename = "type")]
    pub type_name: &'static str,
    pub version: String,
    pub resources: Vec<IntendedResource>,
}

/// What the instance intends a proxy to hold, for the types Envoy's `/config_dump` shows
/// (clusters, listeners, route configurations with their virtual hosts inline), so that
/// `meshctl proxy-config --diff` compares it with what the proxy accepted.
#[derive(Clone, Debug, Serialize)]
pub struct IntendedConfig {
    pub id: String,
    /// False until the push loop rendered the proxy's first configuration.
    pub rendered: bool,
    pub types: Vec<IntendedType>,
}

/// Positions (in push order) of clusters and listeners.
const CDS: usize = 0;
const LDS: usize = 2;

/// One resource in the admin's form (an error in place of one that does not decode).
fn admin_json(r: &meshplane_xds_core::model::Resource) -> serde_json::Value {
    meshplane_xds_core::translate::protojson::to_admin_json(r.type_url, &r.encoded)
        .unwrap_or_else(|e| serde_json::json!({"@type": r.type_url, "error": e.to_string()}))
}

fn intended_type(index: usize, held: &crate::ads::snapshot::TypeSnapshot) -> IntendedType {
    IntendedType {
        type_name: short_name(index),
        version: held.version.clone(),
        resources: held
            .resources
            .values()
            .map(|r| IntendedResource {
                name: r.name.clone(),
                version: r.version.clone(),
                config: admin_json(r),
            })
            .collect(),
    }
}

impl IntendedConfig {
    /// `vhds`: the proxy takes virtual hosts over VHDS; Envoy's dump then shows each route
    /// configuration as its stub with the virtual hosts it received merged in, and so does this.
    pub fn of(id: &str, snapshot: &Snapshot, vhds: bool) -> Self {
        let rds = crate::ads::snapshot::RDS;
        let mut routes = intended_type(rds, snapshot.desired(rds, vhds));
        if vhds {
            let hosts = &snapshot.types[crate::ads::snapshot::VHDS].resources;
            for route in &mut routes.resources {
                let merged: Vec<serde_json::Value> = hosts
                    .values()
                    // Envoy's rule: a virtual host belongs to the configuration named by its
                    // resource name up to the last `/`.
                    .filter(|h| {
                        h.name
                            .rsplit_once('/')
                            .is_some_and(|(config, _)| config == route.name)
                    })
                    .map(|h| {
                        let mut host = admin_json(h);
                        if let Some(fields) = host.as_object_mut() {
                            fields.remove("@type");
                        }
                        host
                    })
                    .collect();
                if merged.is_empty() {
                    continue;
                }
                if let Some(config) = route.config.as_object_mut() {
                    let list = config
                        .entry("virtual_hosts")
                        .or_insert_with(|| serde_json::Value::Array(Vec::new()));
                    if let Some(list) = list.as_array_mut() {
                        list.extend(merged);
                    }
                }
            }
        }
        IntendedConfig {
            id: id.to_string(),
            rendered: snapshot.epoch.is_some(),
            types: vec![
                intended_type(CDS, &snapshot.types[CDS]),
                intended_type(LDS, &snapshot.types[LDS]),
                routes,
            ],
        }
    }
}
