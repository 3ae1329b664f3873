//! What the debug endpoints show of connected proxies: per-type sync state and, on request,
//! what each proxy holds. Streams publish cheap shared references at every message; the lists
//! are built only when an endpoint asks.

use std::sync::Arc;

use serde::Serialize;

use super::hub::{lock, Hub};
use crate::ads::snapshot::{short_name, ResourceMap};
use crate::ads::tracker::{Nack, Protocol, TypeTracker};
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
    /// the content changes ([`TypeTracker::rejected`]); `last_nack` may be history.
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

/// What a stream last published about one type: cheap to take at every message (the held
/// resources are shared, not copied); turned into a [`TypeStatus`] only when asked.
#[derive(Clone, Debug)]
pub(super) struct TypeState {
    subscribed: bool,
    sent_version: Option<String>,
    acked_version: Option<String>,
    awaiting_ack: bool,
    last_nack: Option<Nack>,
    rejected: bool,
    held: Arc<ResourceMap>,
}

impl TypeState {
    pub(super) fn of(t: &TypeTracker) -> Self {
        TypeState {
            subscribed: t.subscribed(),
            sent_version: t.sent_version().map(str::to_string),
            acked_version: t.acked_version().map(str::to_string),
            awaiting_ack: t.awaiting_ack(),
            last_nack: t.last_nack().cloned(),
            rejected: t.rejected(),
            held: Arc::clone(t.held_map()),
        }
    }

    fn status(&self, index: usize, with_resources: bool) -> TypeStatus {
        TypeStatus {
            type_name: short_name(index),
            subscribed: self.subscribed,
            sent_version: self.sent_version.clone(),
            acked_version: self.acked_version.clone(),
            awaiting_ack: self.awaiting_ack,
            last_nack: self.last_nack.clone(),
            rejected: self.rejected,
            resources: if with_resources {
                self.held
                    .iter()
                    .map(|(n, r)| (n.clone(), r.version.clone()))
                    .collect()
            } else {
                Vec::new()
            },
        }
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
        let taken: Vec<(Arc<ProxyNode>, Protocol, usize, Vec<TypeState>)> = lock(&self.proxies)
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
                    .map(|(i, t)| t.status(i, with_resources))
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}
