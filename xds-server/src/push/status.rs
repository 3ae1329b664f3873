//! What the debug endpoints show of connected proxies: per-type sync state and, on request,
//! what each proxy holds. Streams publish cheap shared references at every message; the lists
//! are built only when an endpoint asks.

use std::sync::Arc;

use serde::Serialize;

use super::hub::{lock, Hub};
use crate::ads::protocol::status::SyncState;
use crate::ads::protocol::{Nack, Protocol};
use crate::ads::snapshot::short_name;
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
