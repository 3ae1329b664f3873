//! The xDS protocol state of one ADS stream, per resource type, as pure logic: which request
//! is an ACK or a NACK, what each proxy holds, and what to send next. No I/O; the stream tasks
//! in [`super::sotw`] and [`super::delta`] feed it requests and snapshots.
//!
//! Rules kept here (see the xDS protocol):
//! - a nonce per response; a request answers the latest nonce of its type, older ones are stale;
//! - a NACK (request with `error_detail`) restores what the proxy had and blocks that type
//!   until its desired content changes;
//! - at most one un-ACKed response per type; newer state waits and is coalesced;
//! - an ACK is never answered with unchanged resources;
//! - additions go out in CDS → EDS → LDS → RDS order. Listeners and routes wait while a type
//!   they depend on ([`DEPENDS_ON`]) has a response awaiting its ACK or a change the proxy
//!   rejected, so they never name a cluster the proxy has not accepted. Endpoints go only for
//!   clusters already sent on the stream, without waiting for the CDS ACK: Envoy holds that ACK
//!   until its new clusters warmed, which takes their endpoints;
//! - a cluster that changes is re-created by Envoy, and the new one warms until an EDS
//!   response carries its assignment (Envoy does not hand it the one it holds, it waits out
//!   its initial fetch): so the assignment of every cluster a CDS response changes or adds goes
//!   (again) after it;
//! - removals only once nothing is in flight, one type at a time in reverse order (make before
//!   break), each after the types that depend on it are settled;
//! - a SotW response of endpoints carries what changed, as an incremental one would
//!   ([`carries_whole_state`]; xDS keeps state of the world for listeners and clusters only):
//!   an assignment left out stays with the proxy until it unsubscribes (Envoy hands each
//!   assignment to the watch of its cluster and drops it with the watch);
//! - what a proxy lacks is found from the names its snapshot records as changed since its
//!   predecessor when the proxy holds that predecessor whole ([`super::map_diff::diff`]), so a
//!   settled stream plans in the size of the change; otherwise by a walk over both;
//! - a delta Envoy ([`StreamState::with_vhds`]) gets route configurations as VHDS stubs and
//!   their virtual hosts as a fifth type after them, once the clusters and the routes are
//!   ACKed. A subscribed name covers every virtual host named `<name>/<vhost>` (namespace
//!   matching), but Envoy 1.40 subscribes with no names (a wildcard) and drops virtual hosts of a
//!   route configuration it has not processed yet (no watch takes them): so virtual hosts go
//!   only for the route configurations the proxy holds, and those of a configuration it drops
//!   are forgotten with it (a new one gets them again). Other streams do not serve the type.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;

use super::map_diff::{names_within, walked};
use super::payload::Resources;
use super::snapshot::{
    diff, set_version, type_index, ResourceMap, Snapshot, TypeSnapshot, TYPE_COUNT, VHDS,
};
use crate::model::{type_url, Resource};

pub mod status;

#[cfg(test)]
mod dependency_order;
#[cfg(test)]
mod tracker_model;

/// Wildcard resource name of xDS subscriptions.
const WILDCARD: &str = "*";

/// Positions of the types in [`type_url::ORDER`].
const CDS: usize = 0;
const EDS: usize = 1;
const LDS: usize = 2;
const RDS: usize = 3;

/// The types a type's resources name and must wait for: a response of the type goes only when
/// these are settled on the stream (nothing awaiting an ACK, no rejected change). Clusters
/// before listeners; listeners and clusters before routes. Endpoints are not gated by the CDS
/// ACK (Envoy sends it only once the new clusters got their endpoints) but offered only for
/// clusters already sent ([`StreamState::next_responses`]). A type the proxy has not
/// subscribed to gates nothing: proxyless gRPC clients discover clusters from routes, and Envoy
/// subscribes CDS first on its own. Virtual hosts name clusters, and Envoy takes them only for
/// route configurations it already processed.
pub const DEPENDS_ON: [&[usize]; TYPE_COUNT] = [&[], &[], &[CDS], &[CDS, LDS], &[CDS, RDS]];

/// Whether a state-of-the-world response of the type carries every resource the proxy
/// subscribed to. xDS requires it of listeners and clusters only; endpoints carry what changed
/// (an endpoint change sends one assignment, not the scope's thousands). Routes stay whole
/// although xDS would allow less: the removal of a route configuration is sequenced against
/// the clusters it names (make before break), and only a whole response expresses it.
pub fn carries_whole_state(type_url: &str) -> bool {
    type_url != type_url::ENDPOINT
}

/// Which ADS variant a stream speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// State of the world: every response carries the full set of the type.
    Sotw,
    /// Incremental: responses carry changed resources and removed names.
    Delta,
}

impl Protocol {
    /// Label value for metrics and debug output.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Sotw => "sotw",
            Protocol::Delta => "delta",
        }
    }
}

/// A response the stream must send, before protocol encoding.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub type_url: &'static str,
    pub nonce: String,
    /// SotW `version_info`; delta `system_version_info`.
    pub version: String,
    pub resources: Resources,
    /// Delta only: names the proxy must drop.
    pub removed: Vec<String>,
    /// When the change behind this response was first seen.
    pub changed_at: Instant,
}

/// A rejected response, as reported by the proxy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Nack {
    pub version: String,
    pub message: String,
    #[serde(with = "unix_seconds")]
    pub at: SystemTime,
}

mod unix_seconds {
    use std::time::SystemTime;
    pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let secs = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        s.serialize_u64(secs)
    }
}

/// What a request meant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestOutcome {
    /// A type we do not serve.
    UnknownType(String),
    /// The request answers an older response: ignored.
    Stale,
    /// The latest response of the type was accepted.
    Ack {
        type_url: &'static str,
        version: String,
    },
    /// The latest response of the type was rejected.
    Nack { type_url: &'static str, nack: Nack },
    /// A (re)subscription, nothing pending was answered.
    Subscribe { type_url: &'static str },
}

#[derive(Clone, Debug)]
struct Pending {
    nonce: String,
    version: String,
    prev_sent: Arc<ResourceMap>,
    prev_sent_version: Option<String>,
    /// Desired version of the type when sent: a NACK blocks exactly this content.
    desired_version: String,
}

/// Protocol state of one resource type on one stream.
#[derive(Clone, Debug, Default)]
pub struct TypeTracker {
    requested: bool,
    wildcard: bool,
    names: BTreeSet<String>,
    /// Bytes of `names` ([`super::budget`] bounds them).
    name_bytes: usize,
    /// Names are namespaces (VHDS): one covers every resource named `<name>/<...>`.
    namespaced: bool,
    /// VHDS: the route configurations the proxy holds; only their namespaces are in scope.
    held_routes: Option<Arc<ResourceMap>>,
    /// The `sent` map last found within `held_routes` (a wake-up then skips the walk).
    sent_within_held: Option<Arc<ResourceMap>>,
    /// What the proxy holds (or will hold once the pending response is ACKed). Shares the
    /// snapshot's map when the proxy holds exactly what it subscribed to.
    sent: Arc<ResourceMap>,
    sent_version: Option<String>,
    acked_version: Option<String>,
    last_nonce: Option<String>,
    pending: Option<Pending>,
    nack_block: Option<String>,
    last_nack: Option<Nack>,
    /// A changed subscription asks for an answer even when the content is unchanged.
    force: bool,
    responded: bool,
    /// SotW reconnect: the version the proxy already holds.
    resume_version: Option<String>,
    /// Desired version for which `sent` is exactly the subscribed part of the desired
    /// resources: until the content or the subscription changes there is nothing to plan, so a
    /// wake-up costs a string comparison instead of a walk over every resource.
    settled: Option<String>,
    /// A snapshot map whose every name is in the current scope: set when the subscribed part
    /// of a snapshot was all of it, dropped when the subscription or the held routes change.
    /// Whether its successor is all in scope too then takes a look per changed name.
    whole_in_scope: Option<Arc<ResourceMap>>,
}

impl TypeTracker {
    /// Version of the last response sent.
    pub fn sent_version(&self) -> Option<&str> {
        self.sent_version.as_deref()
    }
    /// Version of the last response ACKed.
    pub fn acked_version(&self) -> Option<&str> {
        self.acked_version.as_deref()
    }
    /// Last NACK of this type, if any.
    pub fn last_nack(&self) -> Option<&Nack> {
        self.last_nack.as_ref()
    }
    /// Whether the proxy rejected the latest content it was offered of this type and nothing
    /// newer has been offered since: it runs on older config (or none) until the content
    /// changes. [`Self::last_nack`] alone is history; this is the current state.
    pub fn rejected(&self) -> bool {
        self.nack_block.is_some()
    }
    /// Whether a response waits for its ACK.
    pub fn awaiting_ack(&self) -> bool {
        self.pending.is_some()
    }
    /// Names and versions of what the proxy holds.
    pub fn held(&self) -> impl Iterator<Item = (&str, &str)> {
        self.sent
            .iter()
            .map(|(n, r)| (n.as_str(), r.version.as_str()))
    }
    /// What the proxy holds, shared (cheap to keep for the debug endpoints).
    pub fn held_map(&self) -> &Arc<ResourceMap> {
        &self.sent
    }
    /// Whether the proxy subscribed to this type.
    pub fn subscribed(&self) -> bool {
        self.requested
    }

    fn in_scope(&self, name: &str) -> bool {
        (self.wildcard || covers(&self.names, self.namespaced, name))
            && self
                .held_routes
                .as_ref()
                .is_none_or(|routes| in_route(routes, name))
    }

    /// VHDS: limits the scope to the namespaces of the route configurations in `routes` (what
    /// the proxy holds of them); virtual hosts of others are forgotten (the proxy dropped them
    /// with their configuration). Walks `sent` only when it or `routes` changed.
    fn hold_routes(&mut self, routes: &Arc<ResourceMap>) {
        let same_routes = self
            .held_routes
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, routes));
        let same_sent = self
            .sent_within_held
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &self.sent));
        if same_routes && same_sent {
            return;
        }
        walked();
        if self.sent.keys().any(|n| !in_route(routes, n)) {
            Arc::make_mut(&mut self.sent).retain(|n, _| in_route(routes, n));
        }
        if !same_routes {
            self.held_routes = Some(Arc::clone(routes));
            self.settled = None;
            self.whole_in_scope = None;
        }
        self.sent_within_held = Some(Arc::clone(&self.sent));
    }

    /// The proxy dropped these resources with what named them: they count as not sent (on a
    /// NACK of the pending response too).
    fn forget(&mut self, names: &[&String]) {
        if names.is_empty() {
            return;
        }
        // A reconnecting SotW proxy holds what its version says: no longer all of it.
        if self.resume_version.take().is_some() {
            self.settled = None;
        }
        if !names.iter().any(|n| self.sent.contains_key(*n)) {
            return;
        }
        let sent = Arc::make_mut(&mut self.sent);
        for n in names {
            sent.remove(*n);
        }
        if let Some(p) = &mut self.pending {
            let prev = Arc::make_mut(&mut p.prev_sent);
            for n in names {
                prev.remove(*n);
            }
        }
        self.settled = None;
    }

    /// SotW reconnect: whether the proxy reported holding `version`, the version of `target`.
    /// Then it holds `target` and nothing is sent; either way the report is used up.
    fn resumes(
        &mut self,
        target: &Arc<ResourceMap>,
        version: &str,
        settled: Option<String>,
    ) -> bool {
        if self.resume_version.take().as_deref() != Some(version) {
            return false;
        }
        self.sent = Arc::clone(target);
        self.sent_version = Some(version.to_string());
        self.acked_version = Some(version.to_string());
        self.responded = true;
        self.settled = settled;
        true
    }

    /// Settles the pending response named by `nonce`; returns the outcome if it was one.
    fn settle(
        &mut self,
        type_url: &'static str,
        nonce: &str,
        error: Option<&str>,
    ) -> Option<RequestOutcome> {
        if self.pending.as_ref().map(|p| p.nonce.as_str()) != Some(nonce) {
            return None;
        }
        let pending = self.pending.take()?;
        match error {
            Some(message) => {
                // The proxy keeps its previous config: so do we, and we do not offer the same
                // content again until it changes.
                self.sent = pending.prev_sent;
                self.sent_version = pending.prev_sent_version;
                self.settled = None;
                self.nack_block = Some(pending.desired_version);
                let nack = Nack {
                    version: pending.version,
                    message: message.to_string(),
                    at: SystemTime::now(),
                };
                self.last_nack = Some(nack.clone());
                Some(RequestOutcome::Nack { type_url, nack })
            }
            None => {
                self.acked_version = Some(pending.version.clone());
                Some(RequestOutcome::Ack {
                    type_url,
                    version: pending.version,
                })
            }
        }
    }

    /// Whether `nonce` answers something other than our latest response of the type.
    fn is_stale(&self, nonce: &str) -> bool {
        match &self.last_nonce {
            // Nothing sent on this stream yet: a nonce from a previous stream is just noise.
            None => false,
            Some(last) => !nonce.is_empty() && nonce != last,
        }
    }

    /// Whether the proxy may not hold what this type's desired content names yet: a response
    /// awaits its ACK, or the proxy rejected this very content (blocked until it changes).
    fn unsettled(&self, desired: &TypeSnapshot) -> bool {
        self.requested
            && (self.pending.is_some()
                || self.nack_block.as_deref() == Some(desired.version.as_str()))
    }

    /// Whether a plan now would find nothing to send without looking at the resources.
    fn settled_on(&self, desired: &TypeSnapshot) -> bool {
        self.responded
            && !self.force
            && self.resume_version.is_none()
            && self.pending.is_none()
            && self.settled.as_ref() == Some(&desired.version)
    }

    /// The subscribed part of `desired` (within `restrict` when given): its own map (no copy)
    /// when everything is subscribed.
    fn scoped(&self, desired: &TypeSnapshot, restrict: Option<&ResourceMap>) -> Arc<ResourceMap> {
        if self.wildcard && restrict.is_none() && self.held_routes.is_none() {
            return Arc::clone(&desired.resources);
        }
        if restrict.is_none() && self.still_whole(desired) {
            return Arc::clone(&desired.resources);
        }
        walked();
        let keep = |n: &String| self.in_scope(n) && restrict.is_none_or(|r| r.contains_key(n));
        if desired.resources.keys().all(keep) {
            return Arc::clone(&desired.resources);
        }
        Arc::new(
            desired
                .resources
                .iter()
                .filter(|(n, _)| keep(n))
                .map(|(n, r)| (n.clone(), Arc::clone(r)))
                .collect(),
        )
    }

    /// Whether every resource of `desired` is in scope, known from its predecessor being all
    /// in scope ([`Self::whole_in_scope`]): only the names added or changed need a look.
    fn still_whole(&self, desired: &TypeSnapshot) -> bool {
        self.whole_in_scope.as_ref().is_some_and(|base| {
            desired.changed_since(base).is_some_and(|names| {
                names
                    .iter()
                    .all(|n| !desired.resources.contains_key(n) || self.in_scope(n))
            })
        })
    }

    /// Plans the next response of this type, if one is due. With `restrict`, only resources
    /// named there are offered and nothing is removed (EDS: endpoints of the clusters sent).
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &mut self,
        type_url: &'static str,
        desired: &TypeSnapshot,
        final_phase: bool,
        restrict: Option<&ResourceMap>,
        protocol: Protocol,
        nonce: &mut u64,
        changed_at: Instant,
    ) -> Option<Outgoing> {
        if !self.requested || self.pending.is_some() {
            return None;
        }
        match &self.nack_block {
            Some(blocked) if *blocked == desired.version => return None,
            Some(_) => self.nack_block = None,
            None => {}
        }
        if restrict.is_none()
            && self.responded
            && !self.force
            && self.resume_version.is_none()
            && self.settled.as_ref() == Some(&desired.version)
        {
            return None;
        }
        let final_phase = final_phase && restrict.is_none();
        let scoped = self.scoped(desired, restrict);
        let whole = Arc::ptr_eq(&scoped, &desired.resources);
        if whole {
            self.whole_in_scope = Some(Arc::clone(&scoped));
        }
        // Whether the proxy will hold exactly `scoped` (nothing kept for make-before-break).
        let complete;
        let (next_sent, version, resources, removed) = match protocol {
            Protocol::Sotw if !carries_whole_state(type_url) => {
                // What changed goes; what is gone needs no response (the proxy forgets an
                // assignment with its cluster). The proxy is then taken to hold exactly the
                // subscribed part, so the version is that of `scoped`, as a whole response's
                // would be: a reconnecting proxy reports it and is resumed by it.
                let upserts: Vec<Arc<Resource>> = diff(&self.sent, &scoped, desired)
                    .changed
                    .into_iter()
                    .cloned()
                    .collect();
                complete = true;
                let version = if whole {
                    desired.version.clone()
                } else {
                    set_version(scoped.values())
                };
                let settled = restrict.is_none().then(|| desired.version.clone());
                if self.resumes(&scoped, &version, settled.clone()) {
                    return None;
                }
                if self.responded && upserts.is_empty() {
                    self.sent = scoped;
                    self.force = false;
                    self.settled = settled;
                    return None;
                }
                // All of them (a first response): framed once for every stream.
                let upserts = if whole && upserts.len() == scoped.len() {
                    desired.whole()
                } else {
                    Resources::Listed(upserts)
                };
                (scoped, version, upserts, Vec::new())
            }
            Protocol::Sotw => {
                let kept: Vec<(&String, &Arc<Resource>)> = if final_phase {
                    Vec::new()
                } else {
                    // Keep resources removed from the config until the additions are ACKed.
                    let diff = diff(&self.sent, &scoped, desired);
                    let gone = diff.gone.len();
                    let kept: Vec<_> = diff
                        .gone
                        .into_iter()
                        .filter(|(n, _)| {
                            self.in_scope(n) && restrict.is_none_or(|r| r.contains_key(*n))
                        })
                        .collect();
                    if !kept.is_empty()
                        && kept.len() == gone
                        && diff.changed.is_empty()
                        && self.responded
                        && !self.force
                        && self.resume_version.is_none()
                    {
                        // Only removals: with them kept, the proxy already holds the target
                        // (a removal waits for the final phase). Found without copying the
                        // map or hashing it, which for 10,000 clusters cost more than sending.
                        self.settled = None;
                        return None;
                    }
                    kept
                };
                complete = kept.is_empty();
                let (target, version) = if complete {
                    let version = if whole {
                        desired.version.clone()
                    } else {
                        set_version(scoped.values())
                    };
                    (scoped, version)
                } else {
                    let mut target = (*scoped).clone();
                    for (n, r) in kept {
                        target.insert(n.clone(), Arc::clone(r));
                    }
                    let version = set_version(target.values());
                    (Arc::new(target), version)
                };
                let settled = (complete && restrict.is_none()).then(|| desired.version.clone());
                if self.resumes(&target, &version, settled) {
                    return None;
                }
                if self.responded && !self.force && self.sent_version.as_ref() == Some(&version) {
                    self.settled =
                        (complete && restrict.is_none()).then(|| desired.version.clone());
                    return None;
                }
                let resources = if complete && whole {
                    // The snapshot's own map: framed once for every stream that sends it.
                    desired.whole()
                } else {
                    Resources::Listed(target.values().cloned().collect())
                };
                (target, version, resources, Vec::new())
            }
            Protocol::Delta => {
                let diff = diff(&self.sent, &scoped, desired);
                let upserts: Vec<Arc<Resource>> = diff.changed.into_iter().cloned().collect();
                let stale: Vec<String> = diff.gone.into_iter().map(|(n, _)| n.clone()).collect();
                complete = final_phase || stale.is_empty();
                let removed = if final_phase { stale } else { Vec::new() };
                if self.responded && upserts.is_empty() && removed.is_empty() {
                    self.settled =
                        (complete && restrict.is_none()).then(|| desired.version.clone());
                    return None;
                }
                // Holding exactly `scoped`: share it rather than patching a copy.
                let next = if complete {
                    scoped
                } else {
                    let mut next = (*self.sent).clone();
                    for r in &upserts {
                        next.insert(r.name.clone(), Arc::clone(r));
                    }
                    Arc::new(next)
                };
                (next, desired.version.clone(), upserts.into(), removed)
            }
        };
        *nonce += 1;
        let nonce = nonce.to_string();
        let complete = complete && restrict.is_none();
        self.pending = Some(Pending {
            nonce: nonce.clone(),
            version: version.clone(),
            prev_sent: std::mem::replace(&mut self.sent, next_sent),
            prev_sent_version: self.sent_version.replace(version.clone()),
            desired_version: desired.version.clone(),
        });
        self.settled = complete.then(|| desired.version.clone());
        if complete && self.held_routes.is_some() {
            // What it now holds is the subscribed part, all within the held routes.
            self.sent_within_held = Some(Arc::clone(&self.sent));
        }
        self.last_nonce = Some(nonce.clone());
        self.responded = true;
        self.force = false;
        Some(Outgoing {
            type_url,
            nonce,
            version,
            resources,
            removed,
            changed_at,
        })
    }
}

/// Whether subscribed `names` cover resource `name`: the name itself, or with `namespaced`
/// (VHDS) its namespace, everything before its last `/`.
fn covers(names: &BTreeSet<String>, namespaced: bool, name: &str) -> bool {
    if namespaced {
        name.rsplit_once('/')
            .is_some_and(|(namespace, _)| names.contains(namespace))
    } else {
        names.contains(name)
    }
}

/// Whether virtual host `name` (`<route configuration>/<vhost>`) belongs to one of `routes`.
fn in_route(routes: &ResourceMap, name: &str) -> bool {
    name.rsplit_once('/')
        .is_some_and(|(route, _)| routes.contains_key(route))
}

/// Protocol state of one ADS stream.
#[derive(Clone, Debug)]
pub struct StreamState {
    protocol: Protocol,
    /// Routes as VHDS stubs, virtual hosts as their own type.
    vhds: bool,
    types: [TypeTracker; TYPE_COUNT],
    nonce: u64,
    /// An EDS map whose names were found within a CDS map ([`Self::eds_restriction`]).
    eds_checked: SubsetMemo,
}

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

/// One verified "the names of this map are within that map", kept by the maps' `Arc`s (which
/// also keeps their addresses from being reused): a stream holds the snapshot's maps, so the
/// same check on the next push finds them again without a walk.
#[derive(Clone, Debug, Default)]
struct SubsetMemo(Option<(Arc<ResourceMap>, Arc<ResourceMap>)>);

impl SubsetMemo {
    fn holds(&self, inner: &Arc<ResourceMap>, outer: &Arc<ResourceMap>) -> bool {
        self.0
            .as_ref()
            .is_some_and(|(i, o)| Arc::ptr_eq(i, inner) && Arc::ptr_eq(o, outer))
    }

    /// Whether `inner` is within `outer`'s resources because it was found within the map
    /// `outer` succeeded, and none of the names `outer` removed is one of `inner`'s (a look per
    /// changed name instead of a walk over both).
    fn holds_after(&self, inner: &Arc<ResourceMap>, outer: &TypeSnapshot) -> bool {
        self.0.as_ref().is_some_and(|(i, o)| {
            Arc::ptr_eq(i, inner)
                && outer.changed_since(o).is_some_and(|names| {
                    names
                        .iter()
                        .all(|n| outer.resources.contains_key(n) || !inner.contains_key(n))
                })
        })
    }

    fn record(&mut self, inner: &Arc<ResourceMap>, outer: &Arc<ResourceMap>) {
        if !self.holds(inner, outer) {
            self.0 = Some((Arc::clone(inner), Arc::clone(outer)));
        }
    }
}

impl StreamState {
    pub fn new(protocol: Protocol) -> Self {
        let mut types: [TypeTracker; TYPE_COUNT] = Default::default();
        types[VHDS].namespaced = true;
        Self {
            protocol,
            vhds: false,
            types,
            nonce: 0,
            eds_checked: SubsetMemo::default(),
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
    fn served(&self, type_url: &str) -> Option<usize> {
        type_index(type_url).filter(|&i| i != VHDS || self.vhds)
    }

    /// Per-type state, in push order.
    pub fn types(&self) -> impl Iterator<Item = (&'static str, &TypeTracker)> {
        type_url::ORDER.iter().copied().zip(self.types.iter())
    }

    /// Subscribed names over every type: (count, bytes).
    pub fn names_held(&self) -> (usize, usize) {
        self.types
            .iter()
            .fold((0, 0), |(n, b), t| (n + t.names.len(), b + t.name_bytes))
    }

    /// Whether the stream already requested `type_url` (its first request came).
    pub fn requested(&self, type_url: &str) -> bool {
        self.served(type_url)
            .is_some_and(|i| self.types[i].requested)
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
        let (held, bytes) = self.names_held();
        let (count, added) = names
            .iter()
            .filter(|n| *n != WILDCARD)
            .fold((0, 0), |(c, b), n| (c + 1, b + n.len()));
        Some((
            count,
            held - t.names.len() + count,
            bytes - t.name_bytes + added,
        ))
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
        let (mut held, mut bytes) = self.names_held();
        let mut count = t.names.len();
        for n in subscribe {
            if n != WILDCARD && !t.names.contains(n) {
                count += 1;
                held += 1;
                bytes += n.len();
            }
        }
        let mut gone = BTreeSet::new();
        for n in unsubscribe {
            if t.names.contains(n) && gone.insert(n.as_str()) {
                count -= 1;
                held -= 1;
                bytes -= n.len();
            }
        }
        Some((count, held, bytes))
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
        if t.is_stale(nonce) {
            return RequestOutcome::Stale;
        }
        let outcome = t.settle(url, nonce, error);
        let first = !t.requested;
        t.requested = true;
        let explicit_wildcard = resource_names.iter().any(|n| n == WILDCARD);
        // An empty first request is the legacy wildcard; it stays wildcard while empty.
        let wildcard = explicit_wildcard || (resource_names.is_empty() && (first || t.wildcard));
        let names: BTreeSet<String> = resource_names
            .iter()
            .filter(|n| *n != WILDCARD)
            .cloned()
            .collect();
        let resubscribed = wildcard != t.wildcard || names != t.names;
        if !first && resubscribed {
            t.force = true;
        }
        if first || resubscribed {
            t.settled = None;
            t.whole_in_scope = None;
        }
        t.wildcard = wildcard;
        t.name_bytes = names.iter().map(String::len).sum();
        t.names = names;
        if first && !version_info.is_empty() {
            t.resume_version = Some(version_info.to_string());
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
        if t.is_stale(nonce) {
            return RequestOutcome::Stale;
        }
        let outcome = t.settle(url, nonce, error);
        let first = !t.requested;
        t.requested = true;
        if first || !subscribe.is_empty() || !unsubscribe.is_empty() {
            t.settled = None;
            t.whole_in_scope = None;
        }
        if first {
            // An empty first subscription is the legacy wildcard.
            t.wildcard = subscribe.is_empty();
            for (name, version) in initial_versions {
                // Only the version matters for what the proxy already holds.
                Arc::make_mut(&mut t.sent).insert(
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
        for name in subscribe {
            if name == WILDCARD {
                t.wildcard = true;
            } else {
                if t.names.insert(name.clone()) {
                    t.name_bytes += name.len();
                }
            }
        }
        for name in unsubscribe {
            if name == WILDCARD {
                t.wildcard = false;
            } else {
                if t.names.remove(name) {
                    t.name_bytes -= name.len();
                }
            }
            if !t.in_scope(name) && t.sent.contains_key(name) {
                // The proxy forgets it on its own: no removal needed.
                Arc::make_mut(&mut t.sent).remove(name);
            }
        }
        let namespaced = t.namespaced;
        // Only a narrowed subscription (or what a new stream said it holds) can leave held
        // names uncovered: an ACK need not walk them.
        let narrowed = first || !unsubscribe.is_empty();
        if narrowed && !t.wildcard {
            walked();
            if t.sent.keys().any(|n| !covers(&t.names, namespaced, n)) {
                let names = &t.names;
                Arc::make_mut(&mut t.sent).retain(|n, _| covers(names, namespaced, n));
                t.settled = None;
            }
        }
        outcome.unwrap_or(RequestOutcome::Subscribe { type_url: url })
    }

    /// The clusters sent on a wildcard CDS subscription, when the desired or held endpoints
    /// name others (a CDS change not sent yet, one the proxy rejected, or a cluster removed):
    /// EDS offers only these.
    fn eds_restriction(&mut self, snapshot: &Snapshot) -> Option<Arc<ResourceMap>> {
        let cds = &self.types[CDS];
        if !cds.requested || !cds.wildcard {
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
        let held = &self.types[EDS].sent;
        let clusters = &snapshot.types[CDS];
        let sent = &cds.sent;
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
            return Some(Arc::clone(&cds.sent));
        }
        // The held EDS of the next push is this desired one: remember it is within.
        self.eds_checked.record(desired, &cds.sent);
        None
    }

    /// Responses due now for `snapshot`, in the order they must be sent.
    ///
    /// Additions and updates go in push order; a type is held while a type it depends on
    /// ([`DEPENDS_ON`]) is unsettled, including by a response planned in this very call, so a
    /// dependent goes out only after the ACK of what it names; EDS names only clusters sent. Removals (the final phase) go once
    /// nothing is in flight or held, one type per call, dependents first.
    pub fn next_responses(&mut self, snapshot: &Snapshot) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let mut unsettled = [false; TYPE_COUNT];
        for i in 0..TYPE_COUNT {
            let desired = snapshot.desired(i, self.vhds);
            if DEPENDS_ON[i].iter().any(|&d| unsettled[d]) {
                unsettled[i] = self.types[i].requested;
                continue;
            }
            if i == VHDS && self.vhds {
                let routes = Arc::clone(&self.types[RDS].sent);
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
        if !out.is_empty() || self.types.iter().any(|t| t.pending.is_some()) {
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
        let before = (i == CDS).then(|| Arc::clone(&self.types[CDS].sent));
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
            let after = Arc::clone(&self.types[CDS].sent);
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

#[cfg(test)]
mod tests {
    use super::super::map_diff::tests::{diffs_from_changes, walks};
    use super::tracker_model;
    use super::*;
    use crate::test_rng::Rng;

    const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

    /// Resources of each type named from [`NAMES`] (virtual hosts `<name>/x` and `<name>/y`,
    /// in the namespaces of route names), with a VHDS form of the routes most of the time.
    fn random_config(rng: &mut Rng) -> crate::model::ProxyConfig {
        let mut lists: [Vec<Arc<Resource>>; TYPE_COUNT + 1] = Default::default();
        for (i, list) in lists.iter_mut().enumerate() {
            let names: Vec<String> = if i == VHDS {
                NAMES
                    .iter()
                    .flat_map(|n| [format!("{n}/x"), format!("{n}/y")])
                    .collect()
            } else {
                NAMES.iter().map(|n| n.to_string()).collect()
            };
            for name in names {
                if rng.chance(60) {
                    let body = format!("{name}{}", rng.below(3));
                    list.push(Arc::new(Resource {
                        type_url: type_url::ORDER[i.min(VHDS)],
                        name,
                        version: super::super::snapshot::content_version(body.as_bytes()),
                        packed: Default::default(),
                        encoded: Bytes::from(body),
                    }));
                }
            }
        }
        let [clusters, endpoints, listeners, routes, virtual_hosts, stubs] = lists;
        crate::model::ProxyConfig {
            clusters,
            endpoints,
            listeners,
            routes,
            vhds: rng.chance(80).then_some(crate::model::VhdsRoutes {
                routes: stubs
                    .into_iter()
                    .map(|r| {
                        Arc::new(Resource {
                            type_url: type_url::ROUTE,
                            ..(*r).clone()
                        })
                    })
                    .collect(),
                virtual_hosts,
            }),
        }
    }

    /// `config` with one resource of one type added, changed or removed, the others shared:
    /// the kind of change a push usually makes.
    fn successor(config: &crate::model::ProxyConfig, rng: &mut Rng) -> crate::model::ProxyConfig {
        let mut next = config.clone();
        let i = rng.below(TYPE_COUNT as u64) as usize;
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        let (list, name, url) = match i {
            0 => (&mut next.clusters, name.to_string(), type_url::CLUSTER),
            1 => (&mut next.endpoints, name.to_string(), type_url::ENDPOINT),
            2 => (&mut next.listeners, name.to_string(), type_url::LISTENER),
            3 => (&mut next.routes, name.to_string(), type_url::ROUTE),
            _ => match &mut next.vhds {
                Some(v) => (
                    &mut v.virtual_hosts,
                    format!("{name}/x"),
                    type_url::VIRTUAL_HOST,
                ),
                None => (&mut next.routes, name.to_string(), type_url::ROUTE),
            },
        };
        let at = list.partition_point(|r| r.name < name);
        let present = list.get(at).is_some_and(|r| r.name == name);
        if present && rng.chance(30) {
            list.remove(at);
        } else {
            let body = format!("{name}{}", rng.below(3));
            let r = Arc::new(Resource {
                type_url: url,
                name,
                version: super::super::snapshot::content_version(body.as_bytes()),
                packed: Default::default(),
                encoded: Bytes::from(body),
            });
            if present {
                list[at] = r;
            } else {
                list.insert(at, r);
            }
        }
        next
    }

    fn random_names(rng: &mut Rng) -> Vec<String> {
        let mut names: Vec<String> = NAMES
            .iter()
            .filter(|_| rng.chance(40))
            .map(|n| n.to_string())
            .collect();
        if rng.chance(15) {
            names.push(WILDCARD.to_string());
        }
        if rng.chance(10) {
            // A full virtual host name: no namespace of VHDS.
            names.push("a/x".to_string());
        }
        names
    }

    fn view(o: &Outgoing) -> (String, String, String, Vec<(String, String)>, Vec<String>) {
        (
            o.type_url.to_string(),
            o.nonce.clone(),
            o.version.clone(),
            o.resources
                .iter()
                .map(|r| (r.name.clone(), r.version.clone()))
                .collect(),
            o.removed.clone(),
        )
    }

    type TypeView = (
        bool,
        Option<String>,
        Option<String>,
        bool,
        Vec<(String, String)>,
    );

    fn state_view(s: &StreamState) -> Vec<TypeView> {
        s.types()
            .map(|(_, t)| {
                (
                    t.subscribed(),
                    t.sent_version().map(str::to_string),
                    t.acked_version().map(str::to_string),
                    t.awaiting_ack(),
                    t.held()
                        .map(|(n, v)| (n.to_string(), v.to_string()))
                        .collect(),
                )
            })
            .collect()
    }

    fn model_view(s: &tracker_model::StreamState) -> Vec<TypeView> {
        s.types()
            .map(|(_, t)| {
                (
                    t.subscribed(),
                    t.sent_version().map(str::to_string),
                    t.acked_version().map(str::to_string),
                    t.awaiting_ack(),
                    t.held()
                        .map(|(n, v)| (n.to_string(), v.to_string()))
                        .collect(),
                )
            })
            .collect()
    }

    /// Random protocol sessions (subscriptions, ACKs, NACKs, stale nonces, reconnects with a
    /// version, config changes and repeated wake-ups) give the same responses and state as the
    /// tracker that recomputed everything on every wake-up.
    fn matches_the_recomputing_model(protocol: Protocol, vhds: bool, seed: u64) {
        let mut rng = Rng(seed);
        let mut state = StreamState::new(protocol);
        let mut model = tracker_model::StreamState::new(protocol);
        if vhds {
            state = state.with_vhds();
            model = model.with_vhds();
        }
        let mut config = random_config(&mut rng);
        let mut snapshot = Snapshot::new(&config, Instant::now());
        let mut last: Vec<Outgoing> = Vec::new();
        for step in 0..60 {
            let type_url = type_url::ORDER[rng.below(TYPE_COUNT as u64) as usize];
            match rng.below(10) {
                0..=2 => {
                    // Mostly as the push loop builds them: recording what changed since the
                    // last one, which settled streams plan from.
                    config = if rng.chance(50) {
                        successor(&config, &mut rng)
                    } else {
                        random_config(&mut rng)
                    };
                    snapshot = if rng.chance(80) {
                        Snapshot::reusing(&config, Instant::now(), Some(&snapshot))
                    } else {
                        Snapshot::new(&config, Instant::now())
                    };
                }
                3..=6 => {
                    // Answer one of the last responses (or something stale), keeping or
                    // changing the subscription.
                    let (url, nonce, version) = match last.get(rng.below(4) as usize) {
                        Some(o) if !rng.chance(10) => {
                            (o.type_url, o.nonce.clone(), o.version.clone())
                        }
                        _ => (type_url, rng.below(50).to_string(), String::new()),
                    };
                    let error = rng.chance(20).then_some("rejected");
                    let names = if rng.chance(70) {
                        Vec::new()
                    } else {
                        random_names(&mut rng)
                    };
                    let (a, b) = match protocol {
                        Protocol::Sotw => (
                            state.on_sotw_request(url, &nonce, &version, &names, error),
                            model.on_sotw_request(url, &nonce, &version, &names, error),
                        ),
                        Protocol::Delta => {
                            let unsubscribe = if rng.chance(20) {
                                random_names(&mut rng)
                            } else {
                                Vec::new()
                            };
                            (
                                state.on_delta_request(
                                    url,
                                    &nonce,
                                    &names,
                                    &unsubscribe,
                                    &HashMap::new(),
                                    error,
                                ),
                                model.on_delta_request(
                                    url,
                                    &nonce,
                                    &names,
                                    &unsubscribe,
                                    &HashMap::new(),
                                    error,
                                ),
                            )
                        }
                    };
                    let strip = |o: RequestOutcome| match o {
                        RequestOutcome::Nack { type_url, nack } => {
                            (type_url.to_string(), nack.version, nack.message)
                        }
                        other => (format!("{other:?}"), String::new(), String::new()),
                    };
                    assert_eq!(strip(a), strip(b), "seed {seed} step {step}");
                }
                _ => {
                    // A first subscription (possibly resuming a version, or with initial
                    // versions) of a type not asked for yet.
                    let names = random_names(&mut rng);
                    let resume = if rng.chance(50) {
                        snapshot.types[rng.below(TYPE_COUNT as u64) as usize]
                            .version
                            .clone()
                    } else {
                        String::new()
                    };
                    let initial: HashMap<String, String> = snapshot.types[1]
                        .resources
                        .iter()
                        .filter(|_| rng.chance(50))
                        .map(|(n, r)| (n.clone(), r.version.clone()))
                        .collect();
                    match protocol {
                        Protocol::Sotw => {
                            state.on_sotw_request(type_url, "", &resume, &names, None);
                            model.on_sotw_request(type_url, "", &resume, &names, None);
                        }
                        Protocol::Delta => {
                            state.on_delta_request(type_url, "", &names, &[], &initial, None);
                            model.on_delta_request(type_url, "", &names, &[], &initial, None);
                        }
                    }
                }
            }
            // Wake up once or twice for the same snapshot.
            for _ in 0..=rng.below(2) {
                let ours = state.next_responses(&snapshot);
                let theirs = model.next_responses(&snapshot);
                assert_eq!(
                    ours.iter().map(view).collect::<Vec<_>>(),
                    theirs.iter().map(view).collect::<Vec<_>>(),
                    "seed {seed} step {step}"
                );
                if !ours.is_empty() {
                    last = ours;
                }
            }
            assert_eq!(
                state_view(&state),
                model_view(&model),
                "seed {seed} step {step}"
            );
        }
    }

    #[test]
    fn sotw_matches_the_recomputing_model() {
        let before = diffs_from_changes();
        for seed in 1..=400 {
            matches_the_recomputing_model(Protocol::Sotw, false, seed * 7919);
        }
        // The sequences reach the plans taken from a snapshot's recorded changes.
        assert!(diffs_from_changes() - before > 100);
    }

    #[test]
    fn delta_matches_the_recomputing_model() {
        let before = diffs_from_changes();
        for seed in 1..=400 {
            matches_the_recomputing_model(Protocol::Delta, false, seed * 7919);
        }
        // The sequences reach the plans taken from a snapshot's recorded changes.
        assert!(diffs_from_changes() - before > 100);
    }

    /// Delta Envoys with VHDS: route stubs, and virtual hosts subscribed by namespace.
    #[test]
    fn vhds_matches_the_recomputing_model() {
        let before = diffs_from_changes();
        for seed in 1..=400 {
            matches_the_recomputing_model(Protocol::Delta, true, seed * 7919);
        }
        // The sequences reach the plans taken from a snapshot's recorded changes.
        assert!(diffs_from_changes() - before > 100);
    }

    fn resource(url: &'static str, name: &str, body: &str) -> Arc<Resource> {
        Arc::new(Resource {
            name: name.into(),
            type_url: url,
            encoded: Bytes::from(body.to_string()),
            version: super::super::snapshot::content_version(body.as_bytes()),
            packed: Default::default(),
        })
    }

    /// SotW streams that send a snapshot's whole set share one framing of it: the first
    /// clusters, the first assignments (all of them) and the clusters after a change; a
    /// stream that subscribed to some names only gets those, listed.
    #[test]
    fn sotw_streams_share_the_framing_of_a_whole_snapshot() {
        let config = |n: usize| crate::model::ProxyConfig {
            clusters: (0..n)
                .map(|i| resource(type_url::CLUSTER, &format!("c{i}"), "c"))
                .collect(),
            endpoints: (0..n)
                .map(|i| resource(type_url::ENDPOINT, &format!("c{i}"), "e"))
                .collect(),
            ..Default::default()
        };
        let framing = |o: &Outgoing| match &o.resources {
            Resources::Whole(_, fields) => Some(Arc::clone(fields)),
            Resources::Listed(_) => None,
        };
        let ack = |s: &mut StreamState, o: &Outgoing, names: &[String]| {
            s.on_sotw_request(o.type_url, &o.nonce, &o.version, names, None);
        };
        let wildcard = vec![WILDCARD.to_string()];
        let mut snapshot = Snapshot::new(&config(3), Instant::now());
        let mut streams: Vec<StreamState> = (0..2)
            .map(|_| {
                let mut s = StreamState::new(Protocol::Sotw);
                s.on_sotw_request(type_url::CLUSTER, "", "", &[], None);
                s.on_sotw_request(type_url::ENDPOINT, "", "", &wildcard, None);
                s
            })
            .collect();
        for round in 0..2 {
            let mut framings = Vec::new();
            for s in &mut streams {
                let out = s.next_responses(&snapshot);
                let cds = out.iter().find(|o| o.type_url == type_url::CLUSTER);
                let cds = cds.expect("clusters");
                assert_eq!(cds.resources.len(), 3 + round);
                framings.push(framing(cds).expect("the whole set"));
                if round == 0 {
                    let eds = out.iter().find(|o| o.type_url == type_url::ENDPOINT);
                    let eds = eds.expect("every assignment");
                    assert!(framing(eds).is_some());
                    ack(s, eds, &wildcard);
                }
                ack(s, cds, &[]);
                let rest = s.next_responses(&snapshot);
                for o in &rest {
                    // After the change, the new assignment alone.
                    assert_eq!(o.type_url, type_url::ENDPOINT);
                    assert!(framing(o).is_none());
                    assert_eq!(o.resources.len(), 1);
                    ack(s, o, &wildcard);
                }
            }
            assert!(Arc::ptr_eq(&framings[0], &framings[1]), "framed once");
            snapshot = Snapshot::reusing(&config(4), Instant::now(), Some(&snapshot));
        }
        let mut named = StreamState::new(Protocol::Sotw);
        named.on_sotw_request(type_url::CLUSTER, "", "", &[], None);
        named.on_sotw_request(type_url::ENDPOINT, "", "", &["c1".to_string()], None);
        let out = named.next_responses(&snapshot);
        let eds = out.iter().find(|o| o.type_url == type_url::ENDPOINT);
        let eds = eds.expect("the named assignment");
        assert!(framing(eds).is_none());
        assert_eq!(
            eds.resources.iter().map(|r| &r.name).collect::<Vec<_>>(),
            ["c1"]
        );
    }

    /// A VHDS stream gets the route stubs, then the virtual hosts of the namespaces it
    /// subscribed and only those; a new virtual host goes alone, a removed one by name; a
    /// stream without VHDS gets the inline routes and does not serve the type.
    #[test]
    fn vhds_streams_get_stubs_and_the_virtual_hosts_of_their_namespaces() {
        let vh = |name: &str, body: &str| resource(type_url::VIRTUAL_HOST, name, body);
        let config = |hosts: Vec<Arc<Resource>>| crate::model::ProxyConfig {
            clusters: vec![resource(type_url::CLUSTER, "c", "c")],
            routes: vec![
                resource(type_url::ROUTE, "80", "inline 80"),
                resource(type_url::ROUTE, "8080", "inline 8080"),
            ],
            vhds: Some(crate::model::VhdsRoutes {
                routes: vec![
                    resource(type_url::ROUTE, "80", "stub 80"),
                    resource(type_url::ROUTE, "8080", "stub 8080"),
                ],
                virtual_hosts: hosts,
            }),
            ..Default::default()
        };
        let hosts = vec![vh("80/a", "a"), vh("80/b", "b"), vh("8080/a", "a2")];
        let snapshot = Snapshot::new(&config(hosts.clone()), Instant::now());
        let names =
            |o: &Outgoing| -> Vec<String> { o.resources.iter().map(|r| r.name.clone()).collect() };
        let bodies = |o: &Outgoing| -> Vec<Bytes> {
            o.resources.iter().map(|r| r.encoded.clone()).collect()
        };
        let ack = |s: &mut StreamState, o: &Outgoing| {
            s.on_delta_request(o.type_url, &o.nonce, &[], &[], &HashMap::new(), None)
        };

        let mut s = StreamState::new(Protocol::Delta).with_vhds();
        s.on_delta_request(type_url::CLUSTER, "", &[], &[], &HashMap::new(), None);
        let cds = s.next_responses(&snapshot);
        ack(&mut s, &cds[0]);
        let rds_names = vec!["80".to_string(), "8080".to_string()];
        s.on_delta_request(type_url::ROUTE, "", &rds_names, &[], &HashMap::new(), None);
        let rds = s.next_responses(&snapshot);
        assert_eq!(bodies(&rds[0]), ["stub 80", "stub 8080"]);
        ack(&mut s, &rds[0]);
        // Envoy subscribes one route configuration's virtual hosts.
        s.on_delta_request(
            type_url::VIRTUAL_HOST,
            "",
            &["80".into()],
            &[],
            &HashMap::new(),
            None,
        );
        let first = s.next_responses(&snapshot);
        assert_eq!(first.len(), 1);
        assert_eq!(names(&first[0]), ["80/a", "80/b"]);
        ack(&mut s, &first[0]);
        // A new virtual host goes alone; one of an unsubscribed namespace does not go.
        let grown = Snapshot::new(
            &config([hosts.clone(), vec![vh("80/c", "c"), vh("8080/b", "b2")]].concat()),
            Instant::now(),
        );
        let next = s.next_responses(&grown);
        assert_eq!(next.len(), 1);
        assert_eq!(names(&next[0]), ["80/c"]);
        assert!(next[0].removed.is_empty());
        ack(&mut s, &next[0]);
        // A removed one goes by name.
        let shrunk = Snapshot::new(
            &config(vec![vh("80/a", "a"), vh("80/c", "c")]),
            Instant::now(),
        );
        let removal = s.next_responses(&shrunk);
        assert_eq!(removal.len(), 1);
        assert!(removal[0].resources.is_empty());
        assert_eq!(removal[0].removed, ["80/b"]);
        ack(&mut s, &removal[0]);
        // Unsubscribing the namespace forgets its virtual hosts without a removal.
        s.on_delta_request(
            type_url::VIRTUAL_HOST,
            "",
            &[],
            &["80".into()],
            &HashMap::new(),
            None,
        );
        let (_, vhds) = s.types().nth(VHDS).expect("vhds tracker");
        assert_eq!(vhds.held().count(), 0);

        let mut plain = StreamState::new(Protocol::Delta);
        assert!(matches!(
            plain.on_delta_request(
                type_url::VIRTUAL_HOST,
                "",
                &["80".into()],
                &[],
                &HashMap::new(),
                None
            ),
            RequestOutcome::UnknownType(_)
        ));
        plain.on_delta_request(type_url::ROUTE, "", &rds_names, &[], &HashMap::new(), None);
        let inline = plain.next_responses(&snapshot);
        assert_eq!(bodies(&inline[0]), ["inline 80", "inline 8080"]);
        // VHDS is delta only.
        assert!(!StreamState::new(Protocol::Sotw).with_vhds().vhds());

        // Envoy 1.40 subscribes without names: only the virtual hosts of the route
        // configurations it holds go, those of one it gets later after that one's ACK.
        let mut envoy = StreamState::new(Protocol::Delta).with_vhds();
        envoy.on_delta_request(
            type_url::ROUTE,
            "",
            &["80".into()],
            &[],
            &HashMap::new(),
            None,
        );
        let rds = envoy.next_responses(&snapshot);
        assert_eq!(names(&rds[0]), ["80"]);
        envoy.on_delta_request(type_url::VIRTUAL_HOST, "", &[], &[], &HashMap::new(), None);
        assert!(
            envoy.next_responses(&snapshot).is_empty(),
            "routes not ACKed yet"
        );
        ack(&mut envoy, &rds[0]);
        let first = envoy.next_responses(&snapshot);
        assert_eq!(names(&first[0]), ["80/a", "80/b"]);
        ack(&mut envoy, &first[0]);
        envoy.on_delta_request(
            type_url::ROUTE,
            "",
            &["8080".into()],
            &[],
            &HashMap::new(),
            None,
        );
        let more = envoy.next_responses(&snapshot);
        assert_eq!(
            more.len(),
            1,
            "{:?}",
            more.iter().map(names).collect::<Vec<_>>()
        );
        assert_eq!(names(&more[0]), ["8080"]);
        ack(&mut envoy, &more[0]);
        let later = envoy.next_responses(&snapshot);
        assert_eq!(names(&later[0]), ["8080/a"]);
    }

    #[test]
    fn an_unchanged_wildcard_type_shares_the_snapshot_map() {
        let res = |name: &str| {
            Arc::new(Resource {
                name: name.into(),
                type_url: type_url::CLUSTER,
                encoded: Bytes::from(name.to_string()),
                version: name.into(),
                packed: Default::default(),
            })
        };
        let config = crate::model::ProxyConfig {
            clusters: vec![res("a"), res("b")],
            ..Default::default()
        };
        let snapshot = Snapshot::new(&config, Instant::now());
        let mut state = StreamState::new(Protocol::Sotw);
        state.on_sotw_request(type_url::CLUSTER, "", "", &[], None);
        let out = state.next_responses(&snapshot);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].version, snapshot.types[0].version);
        state.on_sotw_request(type_url::CLUSTER, &out[0].nonce, &out[0].version, &[], None);
        assert!(state.next_responses(&snapshot).is_empty());
        let (_, cds) = state.types().next().expect("cds tracker");
        assert!(Arc::ptr_eq(cds.held_map(), &snapshot.types[0].resources));
    }

    /// A stream that holds its whole configuration and gets a successor with one cluster, its
    /// assignment and its virtual host added plans it without a look at the other resources
    /// (the snapshot recorded what changed), and gets just those (all of CDS over SotW).
    #[test]
    fn a_settled_stream_plans_a_small_change_without_walking_its_resources() {
        let res = |url: &'static str, name: &str| resource(url, name, name);
        let config = |services: std::ops::Range<usize>| {
            let n = services.len();
            let names: Vec<String> = services.map(|i| format!("svc{i:03}")).collect();
            let of = |url| names.iter().map(|c| res(url, c)).collect::<Vec<_>>();
            crate::model::ProxyConfig {
                clusters: of(type_url::CLUSTER),
                endpoints: of(type_url::ENDPOINT),
                listeners: vec![res(type_url::LISTENER, "out")],
                routes: vec![resource(type_url::ROUTE, "80", &format!("{n} hosts"))],
                vhds: Some(crate::model::VhdsRoutes {
                    routes: vec![resource(type_url::ROUTE, "80", "stub")],
                    virtual_hosts: names
                        .iter()
                        .map(|c| res(type_url::VIRTUAL_HOST, &format!("80/{c}")))
                        .collect(),
                }),
            }
        };
        for (protocol, vhds) in [
            (Protocol::Delta, true),
            (Protocol::Delta, false),
            (Protocol::Sotw, false),
        ] {
            let mut s = StreamState::new(protocol);
            if vhds {
                s = s.with_vhds();
            }
            // SotW: the assignments by wildcard, as the bench's clients. (Envoy names them,
            // and a new cluster makes that a new subscription whose request lists every name:
            // the stream then looks at each, in the size of the request.)
            let sotw_names = |url: &str| match url {
                type_url::ENDPOINT => vec![WILDCARD.to_string()],
                type_url::ROUTE => vec!["80".to_string()],
                _ => Vec::new(),
            };
            // Answers every response with an ACK until nothing is due.
            let settle = |s: &mut StreamState, snapshot: &Snapshot| {
                let mut sent = Vec::new();
                loop {
                    let out = s.next_responses(snapshot);
                    if out.is_empty() {
                        return sent;
                    }
                    for o in out {
                        match protocol {
                            Protocol::Sotw => s.on_sotw_request(
                                o.type_url,
                                &o.nonce,
                                &o.version,
                                &sotw_names(o.type_url),
                                None,
                            ),
                            Protocol::Delta => s.on_delta_request(
                                o.type_url,
                                &o.nonce,
                                &[],
                                &[],
                                &HashMap::new(),
                                None,
                            ),
                        };
                        sent.push(o);
                    }
                }
            };
            let before = Snapshot::new(&config(0..50), Instant::now());
            let star = vec![WILDCARD.to_string()];
            match protocol {
                Protocol::Sotw => {
                    for url in &type_url::ORDER[..VHDS] {
                        s.on_sotw_request(url, "", "", &sotw_names(url), None);
                    }
                }
                Protocol::Delta => {
                    for url in &type_url::ORDER[..VHDS] {
                        s.on_delta_request(url, "", &star, &[], &HashMap::new(), None);
                    }
                    if vhds {
                        let ns = vec!["80".to_string()];
                        s.on_delta_request(
                            type_url::VIRTUAL_HOST,
                            "",
                            &ns,
                            &[],
                            &HashMap::new(),
                            None,
                        );
                    }
                }
            }
            settle(&mut s, &before);
            // Built as the push loop does, once for every stream (that walks, per type).
            let grown = Snapshot::reusing(&config(0..51), Instant::now(), Some(&before));
            let shrunk = Snapshot::reusing(&config(1..51), Instant::now(), Some(&grown));
            let walked = walks();
            let sent = settle(&mut s, &grown);
            let got: Vec<(&str, usize)> = sent
                .iter()
                .map(|o| (o.type_url, o.resources.len()))
                .collect();
            let mut want = vec![(type_url::CLUSTER, 1), (type_url::ENDPOINT, 1)];
            if protocol == Protocol::Sotw {
                want[0].1 = 51;
            }
            // The inline route configuration changed too; VHDS clients get the new host.
            want.push(match vhds {
                true => (type_url::VIRTUAL_HOST, 1),
                false => (type_url::ROUTE, 1),
            });
            assert_eq!(got, want, "{protocol:?} vhds {vhds}");
            // A service removed: what names it goes first, the cluster last.
            let sent = settle(&mut s, &shrunk);
            let got: Vec<(&str, usize, Vec<String>)> = sent
                .iter()
                .map(|o| (o.type_url, o.resources.len(), o.removed.clone()))
                .collect();
            let gone = || vec!["svc000".to_string()];
            let want = match (protocol, vhds) {
                (Protocol::Sotw, _) => vec![
                    (type_url::ROUTE, 1, vec![]),
                    (type_url::CLUSTER, 50, vec![]),
                ],
                (Protocol::Delta, true) => vec![
                    (type_url::VIRTUAL_HOST, 0, vec!["80/svc000".to_string()]),
                    (type_url::ENDPOINT, 0, gone()),
                    (type_url::CLUSTER, 0, gone()),
                ],
                (Protocol::Delta, false) => vec![
                    (type_url::ROUTE, 1, vec![]),
                    (type_url::ENDPOINT, 0, gone()),
                    (type_url::CLUSTER, 0, gone()),
                ],
            };
            assert_eq!(got, want, "{protocol:?} vhds {vhds}");
            assert_eq!(walks(), walked, "{protocol:?} vhds {vhds}: walked");
        }
    }
}
