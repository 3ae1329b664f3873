//! The protocol state of one stream ([`StreamState`]): a [`TypeTracker`] per type, and the
//! folding of each request into the type it names.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::subscription::Folded;
use super::tracker::{in_scope, TypeTracker};
use super::{Protocol, RequestOutcome};
use crate::ads::map_diff::{walked, ResourceMap};
use crate::ads::snapshot::{type_index, TypeSnapshot, TYPE_COUNT, VHDS};
use crate::model::{type_url, Resource};

/// Protocol state of one ADS stream.
#[derive(Clone, Debug)]
pub struct StreamState {
    pub(super) protocol: Protocol,
    /// Routes as VHDS stubs, virtual hosts as their own type.
    pub(super) vhds: bool,
    pub(super) types: [TypeTracker; TYPE_COUNT],
    pub(super) nonce: u64,
    /// An EDS map whose names were found within a CDS map (the EDS restriction of
    /// [`StreamState::next_responses`]).
    pub(super) eds_checked: SubsetMemo,
}

impl StreamState {
    pub fn new(protocol: Protocol) -> Self {
        let mut types: [TypeTracker; TYPE_COUNT] = Default::default();
        types[VHDS] = TypeTracker::namespaced();
        Self {
            protocol,
            vhds: false,
            types,
            nonce: 0,
            eds_checked: Default::default(),
        }
    }

    /// The same stream taking virtual hosts over VHDS (delta only: Envoy's VHDS client is
    /// incremental).
    pub fn with_vhds(mut self) -> Self {
        self.vhds = self.protocol == Protocol::Delta;
        self
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Whether the stream takes virtual hosts over VHDS.
    pub fn vhds(&self) -> bool {
        self.vhds
    }

    /// Position of a type this stream serves.
    pub(super) fn served(&self, type_url: &str) -> Option<usize> {
        type_index(type_url).filter(|&i| i != VHDS || self.vhds)
    }

    /// Per-type state, in push order.
    pub fn types(&self) -> impl Iterator<Item = (&'static str, &TypeTracker)> {
        type_url::ORDER.iter().copied().zip(self.types.iter())
    }

    /// Which types are blocked on a rejection, one bit per type in push order: a plan that
    /// sends nothing can still lift a block (the content went back to what the proxy holds), and
    /// the published state must follow.
    pub fn rejected_mask(&self) -> u32 {
        self.types
            .iter()
            .enumerate()
            .filter(|(_, t)| t.rejected())
            .fold(0, |mask, (i, _)| mask | (1 << i))
    }

    /// Subscribed names over every type: (count, bytes).
    pub fn names_held(&self) -> (usize, usize) {
        self.types.iter().fold((0, 0), |(n, b), t| {
            let (names, bytes) = t.sub.held();
            (n + names, b + bytes)
        })
    }

    /// Whether the stream already requested `type_url` (its first request came).
    pub fn requested(&self, type_url: &str) -> bool {
        self.served(type_url)
            .is_some_and(|i| self.types[i].sub.requested())
    }

    /// What the stream would subscribe to were a state-of-the-world request naming `names`
    /// folded: (names of the type, names over every type, their bytes). `None`: a type not
    /// served (the request changes nothing).
    pub fn names_after_sotw(
        &self,
        type_url: &str,
        names: &[String],
    ) -> Option<(usize, usize, usize)> {
        let t = &self.types[self.served(type_url)?];
        Some(t.sub.after_sotw(self.names_held(), names))
    }

    /// [`Self::names_after_sotw`] for an incremental request. Names both subscribed and
    /// unsubscribed, or subscribed twice, count as added (an upper bound).
    pub fn names_after_delta(
        &self,
        type_url: &str,
        subscribe: &[String],
        unsubscribe: &[String],
    ) -> Option<(usize, usize, usize)> {
        let t = &self.types[self.served(type_url)?];
        Some(t.sub.after_delta(self.names_held(), subscribe, unsubscribe))
    }

    /// Folds a state-of-the-world request.
    pub fn on_sotw_request(
        &mut self,
        type_url: &str,
        nonce: &str,
        version_info: &str,
        resource_names: &[String],
        error: Option<&str>,
    ) -> RequestOutcome {
        let Some(i) = self.served(type_url) else {
            return RequestOutcome::UnknownType(type_url.to_string());
        };
        let url = type_url::ORDER[i];
        let t = &mut self.types[i];
        if t.ex.is_stale(nonce) {
            return RequestOutcome::Stale;
        }
        let outcome = t.settle(url, nonce, error);
        let Folded { first, changed } = t.sub.fold_sotw(resource_names);
        if !first && changed {
            t.force = true;
        }
        if first || changed {
            t.settled = None;
            t.whole_in_scope = None;
        }
        if first && !version_info.is_empty() {
            t.ex.resume_version = Some(version_info.to_string());
        }
        outcome.unwrap_or(RequestOutcome::Subscribe { type_url: url })
    }

    /// Folds an incremental request.
    pub fn on_delta_request(
        &mut self,
        type_url: &str,
        nonce: &str,
        subscribe: &[String],
        unsubscribe: &[String],
        initial_versions: &HashMap<String, String>,
        error: Option<&str>,
    ) -> RequestOutcome {
        let Some(i) = self.served(type_url) else {
            return RequestOutcome::UnknownType(type_url.to_string());
        };
        let url = type_url::ORDER[i];
        let t = &mut self.types[i];
        if t.ex.is_stale(nonce) {
            return RequestOutcome::Stale;
        }
        let outcome = t.settle(url, nonce, error);
        if !t.sub.requested() {
            for (name, version) in initial_versions {
                // Only the version matters for what the proxy already holds.
                Arc::make_mut(&mut t.ex.sent).insert(
                    name.clone(),
                    Arc::new(Resource {
                        name: name.clone(),
                        type_url: url,
                        encoded: Bytes::new(),
                        version: version.clone(),
                        packed: Default::default(),
                    }),
                );
            }
        }
        let (held_routes, sent) = (&t.held_routes, &mut t.ex.sent);
        let Folded { first, changed } = t.sub.fold_delta(subscribe, unsubscribe, |sub, name| {
            if !in_scope(sub, held_routes.as_ref(), name) && sent.contains_key(name) {
                // The proxy forgets it on its own: no removal needed.
                Arc::make_mut(sent).remove(name);
            }
        });
        if first || changed {
            t.settled = None;
            t.whole_in_scope = None;
        }
        // Only a narrowed subscription (or what a new stream said it holds) can leave held
        // names uncovered: an ACK need not walk them.
        let narrowed = first || !unsubscribe.is_empty();
        if narrowed && !t.sub.wildcard() {
            walked();
            let sub = &t.sub;
            if t.ex.sent.keys().any(|n| !sub.covers(n)) {
                Arc::make_mut(&mut t.ex.sent).retain(|n, _| sub.covers(n));
                t.settled = None;
            }
        }
        outcome.unwrap_or(RequestOutcome::Subscribe { type_url: url })
    }
}

/// One verified "the names of this map are within that map", kept by the maps' `Arc`s (which
/// also keeps their addresses from being reused): a stream holds the snapshot's maps, so the
/// same check on the next push finds them again without a walk.
#[derive(Clone, Debug, Default)]
pub(super) struct SubsetMemo(Option<(Arc<ResourceMap>, Arc<ResourceMap>)>);

impl SubsetMemo {
    pub(super) fn holds(&self, inner: &Arc<ResourceMap>, outer: &Arc<ResourceMap>) -> bool {
        self.0
            .as_ref()
            .is_some_and(|(i, o)| Arc::ptr_eq(i, inner) && Arc::ptr_eq(o, outer))
    }

    /// Whether `inner` is within `outer`'s resources because it was found within the map
    /// `outer` succeeded, and none of the names `outer` removed is one of `inner`'s (a look per
    /// changed name instead of a walk over both).
    pub(super) fn holds_after(&self, inner: &Arc<ResourceMap>, outer: &TypeSnapshot) -> bool {
        self.0.as_ref().is_some_and(|(i, o)| {
            Arc::ptr_eq(i, inner)
                && outer.changed_since(o).is_some_and(|names| {
                    names
                        .iter()
                        .all(|n| outer.resources.contains_key(n) || !inner.contains_key(n))
                })
        })
    }

    pub(super) fn record(&mut self, inner: &Arc<ResourceMap>, outer: &Arc<ResourceMap>) {
        if !self.holds(inner, outer) {
            self.0 = Some((Arc::clone(inner), Arc::clone(outer)));
        }
    }
}
