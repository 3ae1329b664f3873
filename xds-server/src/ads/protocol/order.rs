//! Which types go when on one stream. xDS leaves the order to the server and asks it to make
//! before break (xDS protocol, "Eventual consistency considerations"): additions go in
//! CDS → EDS → LDS → RDS (→ VHDS) order, a type waiting while a type it names ([`DEPENDS_ON`])
//! has a response awaiting its ACK or a change the proxy rejected; removals go last, one type
//! at a time in reverse order. A cluster warms until its endpoints arrive ("Resource
//! warming"), so endpoints go for clusters already sent without waiting for the CDS ACK, and
//! every cluster a CDS response changes or adds gets its assignment again after it (without
//! it, the re-created cluster waits out Envoy's initial fetch timeout of 15 s).

use std::sync::Arc;

use super::stream_state::StreamState;
use super::Outgoing;
use crate::ads::map_diff::{names_within, ResourceMap};
use crate::ads::snapshot::{diff, Snapshot, TypeSnapshot, TYPE_COUNT, VHDS};
use crate::model::type_url;

/// Positions of the types in [`type_url::ORDER`].
pub(super) const CDS: usize = 0;
pub(super) const EDS: usize = 1;
pub(super) const LDS: usize = 2;
pub(super) const RDS: usize = 3;

/// The types a type's resources name and must wait for: a response of the type goes only when
/// these are settled on the stream (nothing awaiting an ACK, no rejected change). Clusters
/// before listeners; listeners and clusters before routes. Endpoints are not gated by the CDS
/// ACK (Envoy sends it only once the new clusters got their endpoints) but offered only for
/// clusters already sent ([`StreamState::next_responses`]). A type the proxy has not
/// subscribed to gates nothing: proxyless gRPC clients discover clusters from routes, and Envoy
/// subscribes CDS first on its own. Virtual hosts name clusters, and Envoy takes them only for
/// route configurations it already processed.
pub const DEPENDS_ON: [&[usize]; TYPE_COUNT] = [&[], &[], &[CDS], &[CDS, LDS], &[CDS, RDS]];

/// Whether `clusters` adds none of the names of `inner` to `sent`, its predecessor: then
/// whatever of `inner` is within `clusters` is within `sent` too (a look per changed name).
fn adds_none_of(clusters: &TypeSnapshot, sent: &Arc<ResourceMap>, inner: &ResourceMap) -> bool {
    clusters.changed_since(sent).is_some_and(|names| {
        names
            .iter()
            .all(|n| sent.contains_key(n) || !inner.contains_key(n))
    })
}

/// Whether what `desired` removed from `held`, its predecessor, is within `sent`: then, with
/// `desired` within `sent`, so is `held` (a look per changed name).
fn removes_within(desired: &TypeSnapshot, held: &Arc<ResourceMap>, sent: &ResourceMap) -> bool {
    desired.changed_since(held).is_some_and(|names| {
        names
            .iter()
            .all(|n| desired.resources.contains_key(n) || sent.contains_key(n))
    })
}

impl StreamState {
    /// Responses due now for `snapshot`, in the order they must be sent.
    ///
    /// Additions and updates go in push order; a type is held while a type it depends on
    /// ([`DEPENDS_ON`]) is unsettled, including by a response planned in this very call, so a
    /// dependent goes out only after the ACK of what it names; EDS names only clusters sent.
    /// Removals (the final phase) go once nothing is in flight or held, one type per call,
    /// dependents first.
    pub fn next_responses(&mut self, snapshot: &Snapshot) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let mut unsettled = [false; TYPE_COUNT];
        for i in 0..TYPE_COUNT {
            let desired = snapshot.desired(i, self.vhds);
            if DEPENDS_ON[i].iter().any(|&d| unsettled[d]) {
                unsettled[i] = self.types[i].sub.requested();
                continue;
            }
            if i == VHDS && self.vhds {
                let routes = Arc::clone(&self.types[RDS].ex.sent);
                self.types[VHDS].hold_routes(&routes);
            }
            let restrict = if i == EDS {
                self.eds_restriction(snapshot)
            } else {
                None
            };
            if let Some(o) = self.plan(i, desired, false, restrict.as_deref(), snapshot) {
                out.push(o);
            }
            unsettled[i] = self.types[i].unsettled(desired) || restrict.is_some();
        }
        if !out.is_empty() || self.types.iter().any(|t| t.ex.pending.is_some()) {
            return out;
        }
        // Nothing in flight: remove what is gone, dependents before what they name, one type at
        // a time (the next after this one's ACK). A type goes only when what it depends on and
        // what depends on it are settled (a proxy that rejected a route update still names the
        // clusters of its old routes).
        for i in (0..TYPE_COUNT).rev() {
            let held = unsettled[i]
                || DEPENDS_ON[i].iter().any(|&d| unsettled[d])
                || (0..TYPE_COUNT).any(|j| unsettled[j] && DEPENDS_ON[j].contains(&i));
            if held {
                continue;
            }
            if let Some(o) = self.plan(i, snapshot.desired(i, self.vhds), true, None, snapshot) {
                out.push(o);
                break;
            }
        }
        out
    }

    /// The clusters sent on a wildcard CDS subscription, when the desired or held endpoints
    /// name others (a CDS change not sent yet, one the proxy rejected, or a cluster removed):
    /// EDS offers only these.
    fn eds_restriction(&mut self, snapshot: &Snapshot) -> Option<Arc<ResourceMap>> {
        let cds = &self.types[CDS];
        if !cds.sub.requested() || !cds.sub.wildcard() {
            return None;
        }
        // Nothing to look at when both types hold what they should and the snapshot is
        // consistent (the wake-up of a settled stream stays cheap).
        if snapshot.endpoints_within_clusters
            && cds.settled_on(&snapshot.types[CDS])
            && self.types[EDS].settled_on(&snapshot.types[EDS])
        {
            return None;
        }
        let desired = &snapshot.types[EDS].resources;
        let held = &self.types[EDS].ex.sent;
        let clusters = &snapshot.types[CDS];
        let sent = &cds.ex.sent;
        // Each check below is cheaper than the next: the last ones walk every name.
        let desired_within = (snapshot.endpoints_within_clusters
            && (Arc::ptr_eq(sent, &clusters.resources) || adds_none_of(clusters, sent, desired)))
            || self.eds_checked.holds(desired, sent)
            || names_within(desired, sent);
        let within = desired_within
            && (Arc::ptr_eq(held, desired)
                || removes_within(&snapshot.types[EDS], held, sent)
                || self.eds_checked.holds(held, sent)
                || (Arc::ptr_eq(sent, &clusters.resources)
                    && self.eds_checked.holds_after(held, clusters))
                || names_within(held, sent));
        if !within {
            return Some(Arc::clone(&cds.ex.sent));
        }
        // The held EDS of the next push is this desired one: remember it is within.
        self.eds_checked.record(desired, &cds.ex.sent);
        None
    }

    /// Plans type `i`; a CDS response makes the assignments of the clusters it changes or adds
    /// due again, after it (the re-created or new clusters warm on them).
    fn plan(
        &mut self,
        i: usize,
        desired: &TypeSnapshot,
        final_phase: bool,
        restrict: Option<&ResourceMap>,
        snapshot: &Snapshot,
    ) -> Option<Outgoing> {
        let before = (i == CDS).then(|| Arc::clone(&self.types[CDS].ex.sent));
        let out = self.types[i].plan(
            type_url::ORDER[i],
            desired,
            final_phase,
            restrict,
            self.protocol,
            &mut self.nonce,
            snapshot.changed_at,
        )?;
        if let Some(before) = before {
            let after = Arc::clone(&self.types[CDS].ex.sent);
            // Added ones too: an assignment sent ahead of its cluster (whose CDS response
            // the proxy then rejected, or on a new stream, where the proxy's clusters are
            // unknown) was taken by no cluster.
            let recreated: Vec<&String> = diff(&before, &after, desired)
                .changed
                .into_iter()
                .map(|r| &r.name)
                .collect();
            self.types[EDS].forget(&recreated);
        }
        Some(out)
    }
}
