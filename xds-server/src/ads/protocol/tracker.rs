//! The protocol state of one resource type on one stream ([`TypeTracker`]): its subscription,
//! its exchange with the proxy, and what is cached to keep a settled stream's wake-up cheap.
//! Planning a response goes in named steps: [`TypeTracker::due`] (may one go at all),
//! [`TypeTracker::scope`] (what the proxy should hold), the branch of its protocol
//! ([`super::plan_sotw`], [`super::plan_delta`]), and [`TypeTracker::commit`] (numbered and
//! recorded as awaiting its answer).

use std::sync::Arc;
use std::time::Instant;

use super::ack::{Exchange, Nack};
use super::subscription::Subscription;
use super::{Outgoing, Protocol, RequestOutcome};
use crate::ads::map_diff::{walked, ResourceMap};
use crate::ads::payload::Resources;
use crate::ads::snapshot::TypeSnapshot;

/// Protocol state of one resource type on one stream.
#[derive(Clone, Debug, Default)]
pub struct TypeTracker {
    pub(super) sub: Subscription,
    pub(super) ex: Exchange,
    /// VHDS: the route configurations the proxy holds; only their namespaces are in scope.
    pub(super) held_routes: Option<Arc<ResourceMap>>,
    /// The `sent` map last found within `held_routes` (a wake-up then skips the walk).
    pub(super) sent_within_held: Option<Arc<ResourceMap>>,
    /// A changed subscription asks for an answer even when the content is unchanged.
    pub(super) force: bool,
    /// Desired version for which `sent` is exactly the subscribed part of the desired
    /// resources: until the content or the subscription changes there is nothing to plan, so a
    /// wake-up costs a string comparison instead of a walk over every resource.
    pub(super) settled: Option<String>,
    /// A snapshot map whose every name is in the current scope: set when the subscribed part
    /// of a snapshot was all of it, dropped when the subscription or the held routes change.
    /// Whether its successor is all in scope too then takes a look per changed name.
    pub(super) whole_in_scope: Option<Arc<ResourceMap>>,
}

/// What a type's plan aims at: the subscribed part of the desired resources.
pub(super) struct Scope<'a> {
    pub(super) desired: &'a TypeSnapshot,
    /// The subscribed part of `desired` (within `restrict`).
    pub(super) scoped: Arc<ResourceMap>,
    /// `scoped` is the snapshot's own map.
    pub(super) whole: bool,
    /// Only these names may be offered, and nothing is removed (EDS: the clusters sent).
    pub(super) restrict: Option<&'a ResourceMap>,
    /// Removals go now (never within a restriction).
    pub(super) final_phase: bool,
}

/// A response planned for one type, before it is numbered and recorded.
pub(super) struct Planned {
    /// What the proxy holds once it takes the response.
    pub(super) next_sent: Arc<ResourceMap>,
    pub(super) version: String,
    pub(super) resources: Resources,
    /// Delta only: names the proxy must drop.
    pub(super) removed: Vec<String>,
    /// Whether the proxy will hold exactly the subscribed part (nothing kept for
    /// make-before-break).
    pub(super) complete: bool,
}

impl TypeTracker {
    /// The state of a type whose subscribed names are namespaces (VHDS).
    pub(super) fn namespaced() -> Self {
        Self {
            sub: Subscription::namespaced(),
            ..Self::default()
        }
    }

    /// Version of the last response sent.
    pub fn sent_version(&self) -> Option<&str> {
        self.ex.sent_version.as_deref()
    }
    /// Version of the last response ACKed.
    pub fn acked_version(&self) -> Option<&str> {
        self.ex.acked_version.as_deref()
    }
    /// Last NACK of this type, if any.
    pub fn last_nack(&self) -> Option<&Nack> {
        self.ex.last_nack.as_ref()
    }
    /// Whether the proxy rejected the latest content it was offered of this type and nothing
    /// newer has been offered since: it runs on older config (or none) until the content
    /// changes. [`Self::last_nack`] alone is history; this is the current state.
    pub fn rejected(&self) -> bool {
        self.ex.nack_block.is_some()
    }
    /// Whether a response waits for its ACK.
    pub fn awaiting_ack(&self) -> bool {
        self.ex.pending.is_some()
    }
    /// Names and versions of what the proxy holds.
    pub fn held(&self) -> impl Iterator<Item = (&str, &str)> {
        self.ex
            .sent
            .iter()
            .map(|(n, r)| (n.as_str(), r.version.as_str()))
    }
    /// What the proxy holds, shared (cheap to keep for the debug endpoints).
    pub fn held_map(&self) -> &Arc<ResourceMap> {
        &self.ex.sent
    }
    /// Whether the proxy subscribed to this type.
    pub fn subscribed(&self) -> bool {
        self.sub.requested()
    }

    pub(super) fn in_scope(&self, name: &str) -> bool {
        in_scope(&self.sub, self.held_routes.as_ref(), name)
    }

    /// Settles the pending response named by `nonce` (see [`Exchange::settle`]).
    pub(super) fn settle(
        &mut self,
        type_url: &'static str,
        nonce: &str,
        error: Option<&str>,
    ) -> Option<RequestOutcome> {
        let outcome = self.ex.settle(type_url, nonce, error);
        if let Some(RequestOutcome::Nack { .. }) = outcome {
            self.settled = None;
        }
        outcome
    }

    /// VHDS: limits the scope to the namespaces of the route configurations in `routes` (what
    /// the proxy holds of them); virtual hosts of others are forgotten (the proxy dropped them
    /// with their configuration). Walks `sent` only when it or `routes` changed.
    pub(super) fn hold_routes(&mut self, routes: &Arc<ResourceMap>) {
        let same_routes = self
            .held_routes
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, routes));
        let same_sent = self
            .sent_within_held
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &self.ex.sent));
        if same_routes && same_sent {
            return;
        }
        walked();
        if self.ex.sent.keys().any(|n| !in_route(routes, n)) {
            Arc::make_mut(&mut self.ex.sent).retain(|n, _| in_route(routes, n));
        }
        if !same_routes {
            self.held_routes = Some(Arc::clone(routes));
            self.settled = None;
            self.whole_in_scope = None;
        }
        self.sent_within_held = Some(Arc::clone(&self.ex.sent));
    }

    /// The proxy dropped these resources with what named them: they count as not sent (on a
    /// NACK of the pending response too).
    pub(super) fn forget(&mut self, names: &[&String]) {
        if self.ex.forget(names) {
            self.settled = None;
        }
    }

    /// SotW reconnect: whether the proxy reported holding `version`, the version of `target`
    /// ([`Exchange::resumes`]); then the type is `settled` as given.
    pub(super) fn resumes(
        &mut self,
        target: &Arc<ResourceMap>,
        version: &str,
        settled: Option<String>,
    ) -> bool {
        if !self.ex.resumes(target, version) {
            return false;
        }
        self.settled = settled;
        true
    }

    /// Whether the proxy may not hold what this type's desired content names yet: a response
    /// awaits its ACK, or the proxy rejected this very content (blocked until it changes).
    pub(super) fn unsettled(&self, desired: &TypeSnapshot) -> bool {
        self.sub.requested() && self.ex.unsettled(&desired.version)
    }

    /// Whether a plan now would find nothing to send without looking at the resources.
    pub(super) fn settled_on(&self, desired: &TypeSnapshot) -> bool {
        self.ex.responded
            && !self.force
            && self.ex.resume_version.is_none()
            && self.ex.pending.is_none()
            && self.settled.as_ref() == Some(&desired.version)
    }

    /// Plans the next response of this type, if one is due. With `restrict`, only resources
    /// named there are offered and nothing is removed (EDS: endpoints of the clusters sent).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan(
        &mut self,
        type_url: &'static str,
        desired: &TypeSnapshot,
        final_phase: bool,
        restrict: Option<&ResourceMap>,
        protocol: Protocol,
        nonce: &mut u64,
        changed_at: Instant,
    ) -> Option<Outgoing> {
        if !self.due(desired, restrict) {
            return None;
        }
        let scope = self.scope(desired, final_phase, restrict);
        let planned = match protocol {
            Protocol::Sotw => self.plan_sotw(type_url, scope),
            Protocol::Delta => self.plan_delta(scope),
        }?;
        Some(self.commit(type_url, desired, restrict, planned, nonce, changed_at))
    }

    /// Step 1: whether a response may be due: the type is subscribed, nothing awaits its
    /// answer, the proxy did not reject this content, and it is not known to hold it already.
    fn due(&mut self, desired: &TypeSnapshot, restrict: Option<&ResourceMap>) -> bool {
        if !self.sub.requested() || !self.ex.may_offer(&desired.version) {
            return false;
        }
        restrict.is_some() || !self.settled_on(desired)
    }

    /// Step 2: what the proxy should hold, the subscribed part of `desired`.
    fn scope<'a>(
        &mut self,
        desired: &'a TypeSnapshot,
        final_phase: bool,
        restrict: Option<&'a ResourceMap>,
    ) -> Scope<'a> {
        let scoped = self.scoped(desired, restrict);
        let whole = Arc::ptr_eq(&scoped, &desired.resources);
        if whole {
            self.whole_in_scope = Some(Arc::clone(&scoped));
        }
        Scope {
            desired,
            scoped,
            whole,
            restrict,
            final_phase: final_phase && restrict.is_none(),
        }
    }

    /// The subscribed part of `desired` (within `restrict` when given): its own map (no copy)
    /// when everything is subscribed.
    fn scoped(&self, desired: &TypeSnapshot, restrict: Option<&ResourceMap>) -> Arc<ResourceMap> {
        if self.sub.wildcard() && restrict.is_none() && self.held_routes.is_none() {
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

    /// Last step: numbers the planned response and records it as awaiting its answer.
    fn commit(
        &mut self,
        type_url: &'static str,
        desired: &TypeSnapshot,
        restrict: Option<&ResourceMap>,
        planned: Planned,
        nonce: &mut u64,
        changed_at: Instant,
    ) -> Outgoing {
        *nonce += 1;
        let nonce = nonce.to_string();
        let complete = planned.complete && restrict.is_none();
        self.ex.offer(
            nonce.clone(),
            planned.version.clone(),
            planned.next_sent,
            desired.version.clone(),
        );
        self.settled = complete.then(|| desired.version.clone());
        if complete && self.held_routes.is_some() {
            // What it now holds is the subscribed part, all within the held routes.
            self.sent_within_held = Some(Arc::clone(&self.ex.sent));
        }
        self.force = false;
        Outgoing {
            type_url,
            nonce,
            version: planned.version,
            resources: planned.resources,
            removed: planned.removed,
            changed_at,
        }
    }
}

/// Whether resource `name` is in the scope of `sub`, within the route configurations the
/// proxy holds when those limit it (VHDS).
pub(super) fn in_scope(
    sub: &Subscription,
    held_routes: Option<&Arc<ResourceMap>>,
    name: &str,
) -> bool {
    sub.takes(name) && held_routes.is_none_or(|routes| in_route(routes, name))
}

/// Whether virtual host `name` (`<route configuration>/<vhost>`) belongs to one of `routes`.
fn in_route(routes: &ResourceMap, name: &str) -> bool {
    name.rsplit_once('/')
        .is_some_and(|(route, _)| routes.contains_key(route))
}
