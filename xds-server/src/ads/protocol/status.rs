//! What a stream publishes about each type for the debug endpoints: a plain value (flags,
//! versions, the last NACK, the shared map of what the proxy holds), so that readers need
//! nothing of the protocol state itself. Cheap to take at every message: the held resources
//! are shared, not copied, and versions are copied only when they change.

use std::sync::Arc;

use super::{Nack, StreamState, TypeTracker};
use crate::ads::map_diff::ResourceMap;

/// The sync state of one type on one stream, as last published.
#[derive(Clone, Debug)]
pub struct SyncState {
    pub subscribed: bool,
    pub sent_version: Option<String>,
    pub acked_version: Option<String>,
    pub awaiting_ack: bool,
    pub last_nack: Option<Nack>,
    /// The proxy rejected the latest content offered and holds older config (or none) until
    /// the content changes; `last_nack` may be history.
    pub rejected: bool,
    /// What the proxy holds.
    pub held: Arc<ResourceMap>,
}

impl SyncState {
    pub(super) fn of(t: &TypeTracker) -> Self {
        SyncState {
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
}

/// What publishes per-type sync state: a stream's protocol state. Readers of the published
/// values (the hub, the debug endpoints) know only this.
pub trait Publishes {
    /// Publishes the state of every type into `into`, one entry per type in push order
    /// (filled on first use, then updated in place).
    fn publish_into(&self, into: &mut Vec<SyncState>);
}

impl Publishes for StreamState {
    fn publish_into(&self, into: &mut Vec<SyncState>) {
        if into.is_empty() {
            *into = self.types().map(|(_, t)| SyncState::of(t)).collect();
        } else {
            for (slot, (_, t)) in into.iter_mut().zip(self.types()) {
                slot.update(t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use bytes::Bytes;

    use super::*;
    use crate::ads::protocol::Protocol;
    use crate::ads::snapshot::{content_version, short_name, Snapshot};
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

    /// The published state as the debug endpoints show it (`push::status`).
    fn statuses(types: &[SyncState]) -> serde_json::Value {
        let list: Vec<serde_json::Value> = types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let resources: Vec<(&String, &String)> =
                    t.held.iter().map(|(n, r)| (n, &r.version)).collect();
                serde_json::json!({
                    "type": short_name(i),
                    "subscribed": t.subscribed,
                    "sent_version": t.sent_version,
                    "acked_version": t.acked_version,
                    "awaiting_ack": t.awaiting_ack,
                    "last_nack": t.last_nack,
                    "rejected": t.rejected,
                    "resources": resources,
                })
            })
            .collect();
        serde_json::Value::Array(list)
    }

    /// Updated in place at every step, the published state is what a fresh copy would be:
    /// subscriptions, sent and ACKed versions, a NACK, and the held resources.
    #[test]
    fn updating_in_place_equals_taking_a_fresh_copy() {
        let mut state = StreamState::new(Protocol::Sotw);
        let mut published: Vec<SyncState> = state.types().map(|(_, t)| SyncState::of(t)).collect();
        let mut steps = 0;
        let mut check = |state: &StreamState, published: &mut Vec<SyncState>| {
            for (slot, (_, t)) in published.iter_mut().zip(state.types()) {
                slot.update(t);
            }
            let fresh: Vec<SyncState> = state.types().map(|(_, t)| SyncState::of(t)).collect();
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
