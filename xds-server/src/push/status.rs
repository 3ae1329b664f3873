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

    /// Takes what changed in `t` in place: a stream publishes at every message, and most
    /// messages change a flag or nothing, so versions are copied only when they differ.
    pub(super) fn update(&mut self, t: &TypeTracker) {
        fn set(slot: &mut Option<String>, value: Option<&str>) {
            if slot.as_deref() != value {
                *slot = value.map(str::to_string);
            }
        }
        self.subscribed = t.subscribed();
        set(&mut self.sent_version, t.sent_version());
        set(&mut self.acked_version, t.acked_version());
        self.awaiting_ack = t.awaiting_ack();
        if self.last_nack.as_ref() != t.last_nack() {
            self.last_nack = t.last_nack().cloned();
        }
        self.rejected = t.rejected();
        if !Arc::ptr_eq(&self.held, t.held_map()) {
            self.held = Arc::clone(t.held_map());
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use bytes::Bytes;

    use super::*;
    use crate::ads::snapshot::{content_version, Snapshot};
    use crate::ads::tracker::{Protocol, StreamState};
    use crate::model::{type_url, ProxyConfig, Resource};

    fn mk_config(tag: &str) -> ProxyConfig {
        let res = |type_url: &'static str, name: &str| {
            let encoded = Bytes::from(format!("{name}:{tag}"));
            Arc::new(Resource {
                name: name.to_string(),
                type_url,
                version: content_version(&encoded),
                packed: Default::default(),
                encoded,
            })
        };
        ProxyConfig {
            clusters: vec![res(type_url::CLUSTER, "c1")],
            endpoints: vec![res(type_url::ENDPOINT, "c1")],
            listeners: vec![res(type_url::LISTENER, "l1")],
            routes: vec![res(type_url::ROUTE, "r1")],
            vhds: None,
        }
    }

    fn statuses(types: &[TypeState]) -> serde_json::Value {
        let list: Vec<TypeStatus> = types
            .iter()
            .enumerate()
            .map(|(i, t)| t.status(i, true))
            .collect();
        serde_json::to_value(list).expect("serializable")
    }

    /// Updated in place at every step, the published state is what a fresh copy would be:
    /// subscriptions, sent and ACKed versions, a NACK, and the held resources.
    #[test]
    fn updating_in_place_equals_taking_a_fresh_copy() {
        let mut state = StreamState::new(Protocol::Sotw);
        let mut published: Vec<TypeState> = state.types().map(|(_, t)| TypeState::of(t)).collect();
        let mut steps = 0;
        let mut check = |state: &StreamState, published: &mut Vec<TypeState>| {
            for (slot, (_, t)) in published.iter_mut().zip(state.types()) {
                slot.update(t);
            }
            let fresh: Vec<TypeState> = state.types().map(|(_, t)| TypeState::of(t)).collect();
            assert_eq!(statuses(published), statuses(&fresh), "step {steps}");
            steps += 1;
        };
        check(&state, &mut published);
        for (tag, reject) in [("a", false), ("b", true), ("c", false)] {
            let snapshot = Snapshot::new(&mk_config(tag), Instant::now());
            state.on_sotw_request(type_url::CLUSTER, "", "", &[], None);
            check(&state, &mut published);
            for out in state.next_responses(&snapshot) {
                check(&state, &mut published);
                let error = reject.then_some("rejected");
                state.on_sotw_request(out.type_url, &out.nonce, &out.version, &[], error);
                check(&state, &mut published);
            }
        }
        assert!(
            statuses(&published)[0]["last_nack"].is_object(),
            "the NACK was published: {}",
            statuses(&published)
        );
    }
}
