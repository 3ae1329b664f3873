//! The tracker as it was before per-snapshot versions and shared maps: the model the
//! incremental [`super`] must match response for response (see its tests). It folds requests
//! with the protocol's own [`Subscription`] and [`Exchange`] (what a request subscribes to and
//! answers is not what is modelled); what it recomputes on every call is the scope, the plan of
//! each branch and the order of types.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::ack::Exchange;
use super::subscription::{Folded, Subscription};
use super::{Outgoing, Protocol, RequestOutcome, DEPENDS_ON};
use crate::ads::snapshot::{set_version, type_index, Snapshot, TypeSnapshot, TYPE_COUNT, VHDS};
use crate::model::{type_url, Resource};

/// Protocol state of one resource type on one stream.
#[derive(Clone, Debug, Default)]
pub struct TypeTracker {
    sub: Subscription,
    ex: Exchange,
    /// VHDS: the route configurations the proxy holds; only their virtual hosts are in scope.
    held_routes: Option<BTreeSet<String>>,
    /// A changed subscription asks for an answer even when the content is unchanged.
    force: bool,
}

impl TypeTracker {
    /// Version of the last response sent.
    pub fn sent_version(&self) -> Option<&str> {
        self.ex.sent_version.as_deref()
    }
    /// Version of the last response ACKed.
    pub fn acked_version(&self) -> Option<&str> {
        self.ex.acked_version.as_deref()
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
    /// Whether the proxy subscribed to this type.
    pub fn subscribed(&self) -> bool {
        self.sub.requested()
    }

    fn in_scope(&self, name: &str) -> bool {
        in_scope(&self.sub, self.held_routes.as_ref(), name)
    }

    fn unsettled(&self, desired: &TypeSnapshot) -> bool {
        self.sub.requested() && self.ex.unsettled(&desired.version)
    }

    /// Plans the next response of this type, if one is due.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &mut self,
        type_url: &'static str,
        desired: &TypeSnapshot,
        final_phase: bool,
        restrict: Option<&BTreeMap<String, Arc<Resource>>>,
        protocol: Protocol,
        nonce: &mut u64,
        changed_at: Instant,
    ) -> Option<Outgoing> {
        if !self.sub.requested() || !self.ex.may_offer(&desired.version) {
            return None;
        }
        let final_phase = final_phase && restrict.is_none();
        let scoped: BTreeMap<String, Arc<Resource>> = desired
            .resources
            .iter()
            .filter(|(n, _)| self.in_scope(n) && restrict.is_none_or(|r| r.contains_key(*n)))
            .map(|(n, r)| (n.clone(), Arc::clone(r)))
            .collect();
        let (next_sent, version, resources, removed) = match protocol {
            Protocol::Sotw if type_url == type_url::ENDPOINT => {
                // Endpoints are not state of the world: a response carries what changed, and
                // nothing is ever removed by one.
                let version = set_version(scoped.values());
                let scoped = Arc::new(scoped);
                if self.ex.resumes(&scoped, &version) {
                    return None;
                }
                let upserts: Vec<Arc<Resource>> = scoped
                    .values()
                    .filter(|r| self.ex.sent.get(&r.name).map(|s| &s.version) != Some(&r.version))
                    .cloned()
                    .collect();
                if self.ex.responded && upserts.is_empty() {
                    self.ex.sent = scoped;
                    self.force = false;
                    return None;
                }
                (scoped, version, upserts, Vec::new())
            }
            Protocol::Sotw => {
                let mut target = scoped;
                if !final_phase {
                    // Keep resources removed from the config until the additions are ACKed.
                    for (n, r) in self.ex.sent.iter() {
                        if self.in_scope(n)
                            && !target.contains_key(n)
                            && restrict.is_none_or(|x| x.contains_key(n))
                        {
                            target.insert(n.clone(), Arc::clone(r));
                        }
                    }
                }
                let version = set_version(target.values());
                let target = Arc::new(target);
                if self.ex.resumes(&target, &version) {
                    return None;
                }
                if self.ex.responded
                    && !self.force
                    && self.ex.sent_version.as_ref() == Some(&version)
                {
                    return None;
                }
                let resources = target.values().cloned().collect();
                (target, version, resources, Vec::new())
            }
            Protocol::Delta => {
                let upserts: Vec<Arc<Resource>> = scoped
                    .values()
                    .filter(|r| self.ex.sent.get(&r.name).map(|s| &s.version) != Some(&r.version))
                    .cloned()
                    .collect();
                let removed: Vec<String> = if final_phase {
                    self.ex
                        .sent
                        .keys()
                        .filter(|n| !scoped.contains_key(*n))
                        .cloned()
                        .collect()
                } else {
                    Vec::new()
                };
                if self.ex.responded && upserts.is_empty() && removed.is_empty() {
                    return None;
                }
                let mut next = (*self.ex.sent).clone();
                for r in &upserts {
                    next.insert(r.name.clone(), Arc::clone(r));
                }
                for n in &removed {
                    next.remove(n);
                }
                (Arc::new(next), desired.version.clone(), upserts, removed)
            }
        };
        *nonce += 1;
        let nonce = nonce.to_string();
        self.ex.offer(
            nonce.clone(),
            version.clone(),
            next_sent,
            desired.version.clone(),
        );
        self.force = false;
        Some(Outgoing {
            type_url,
            nonce,
            version,
            resources: resources.into(),
            removed,
            changed_at,
        })
    }
}

/// Whether `name` is in scope: within a held route (VHDS) and subscribed to.
fn in_scope(sub: &Subscription, held_routes: Option<&BTreeSet<String>>, name: &str) -> bool {
    let held = held_routes.is_none_or(|routes| in_held_route(routes, name));
    held && (sub.wildcard() || subscribed_to(sub, name))
}

/// A subscribed name equals `name`, or (namespaced) is `name` without its last segment.
fn subscribed_to(sub: &Subscription, name: &str) -> bool {
    sub.names().iter().any(|n| {
        if sub.is_namespaced() {
            name.strip_prefix(n.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|last| !last.contains('/'))
        } else {
            n == name
        }
    })
}

/// Whether virtual host `name` is `<route>/<last>` for one of `routes`.
fn in_held_route(routes: &BTreeSet<String>, name: &str) -> bool {
    routes.iter().any(|r| {
        name.strip_prefix(r.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|last| !last.contains('/'))
    })
}

/// Protocol state of one ADS stream.
#[derive(Clone, Debug)]
pub struct StreamState {
    protocol: Protocol,
    vhds: bool,
    types: [TypeTracker; TYPE_COUNT],
    nonce: u64,
}

impl StreamState {
    pub fn new(protocol: Protocol) -> Self {
        let mut types: [TypeTracker; TYPE_COUNT] = Default::default();
        types[VHDS].sub = Subscription::namespaced();
        Self {
            protocol,
            vhds: false,
            types,
            nonce: 0,
        }
    }

    pub fn with_vhds(mut self) -> Self {
        self.vhds = self.protocol == Protocol::Delta;
        self
    }

    /// Routes: the VHDS stubs on a VHDS stream.
    fn desired<'a>(&self, snapshot: &'a Snapshot, i: usize) -> &'a TypeSnapshot {
        if self.vhds && type_url::ORDER[i] == type_url::ROUTE {
            &snapshot.vhds_routes
        } else {
            &snapshot.types[i]
        }
    }

    /// Per-type state, in push order.
    pub fn types(&self) -> impl Iterator<Item = (&'static str, &TypeTracker)> {
        type_url::ORDER.iter().copied().zip(self.types.iter())
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
        let Some(i) = type_index(type_url).filter(|&i| self.vhds || i != VHDS) else {
            return RequestOutcome::UnknownType(type_url.to_string());
        };
        let url = type_url::ORDER[i];
        let t = &mut self.types[i];
        if t.ex.is_stale(nonce) {
            return RequestOutcome::Stale;
        }
        let outcome = t.ex.settle(url, nonce, error);
        let Folded { first, changed } = t.sub.fold_sotw(resource_names);
        if !first && changed {
            t.force = true;
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
        let Some(i) = type_index(type_url).filter(|&i| self.vhds || i != VHDS) else {
            return RequestOutcome::UnknownType(type_url.to_string());
        };
        let url = type_url::ORDER[i];
        let t = &mut self.types[i];
        if t.ex.is_stale(nonce) {
            return RequestOutcome::Stale;
        }
        let outcome = t.ex.settle(url, nonce, error);
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
        t.sub.fold_delta(subscribe, unsubscribe, |sub, name| {
            if !in_scope(sub, held_routes.as_ref(), name) {
                // The proxy forgets it on its own: no removal needed.
                Arc::make_mut(sent).remove(name);
            }
        });
        if !t.sub.wildcard() {
            let sub = &t.sub;
            Arc::make_mut(&mut t.ex.sent).retain(|n, _| subscribed_to(sub, n));
        }
        outcome.unwrap_or(RequestOutcome::Subscribe { type_url: url })
    }

    /// Responses due now for `snapshot`, in the order they must be sent.
    pub fn next_responses(&mut self, snapshot: &Snapshot) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let mut unsettled = [false; TYPE_COUNT];
        for i in 0..TYPE_COUNT {
            let desired = self.desired(snapshot, i);
            if DEPENDS_ON[i].iter().any(|&d| unsettled[d]) {
                unsettled[i] = self.types[i].sub.requested();
                continue;
            }
            if i == VHDS && self.vhds {
                let routes: BTreeSet<String> = self.types[3].ex.sent.keys().cloned().collect();
                let t = &mut self.types[VHDS];
                // The proxy drops virtual hosts with their route configuration.
                let dropped: Vec<String> =
                    t.ex.sent
                        .keys()
                        .filter(|n| !in_held_route(&routes, n))
                        .cloned()
                        .collect();
                t.held_routes = Some(routes);
                for n in dropped {
                    Arc::make_mut(&mut t.ex.sent).remove(&n);
                }
            }
            // EDS: only clusters sent on a wildcard CDS subscription.
            let cds = &self.types[0];
            let restrict = (i == 1
                && cds.sub.requested()
                && cds.sub.wildcard()
                && snapshot.types[1]
                    .resources
                    .keys()
                    .chain(self.types[1].ex.sent.keys())
                    .any(|n| !cds.ex.sent.contains_key(n)))
            .then(|| (*cds.ex.sent).clone());
            if let Some(o) = self.plan(i, desired, false, restrict.as_ref(), snapshot) {
                out.push(o);
            }
            unsettled[i] = self.types[i].unsettled(desired) || restrict.is_some();
        }
        if !out.is_empty() || self.types.iter().any(|t| t.ex.pending.is_some()) {
            return out;
        }
        for i in (0..TYPE_COUNT).rev() {
            let held = unsettled[i]
                || DEPENDS_ON[i].iter().any(|&d| unsettled[d])
                || (0..TYPE_COUNT).any(|j| unsettled[j] && DEPENDS_ON[j].contains(&i));
            if held {
                continue;
            }
            let desired = self.desired(snapshot, i);
            if let Some(o) = self.plan(i, desired, true, None, snapshot) {
                out.push(o);
                break;
            }
        }
        out
    }

    /// Plans type `i`; clusters a CDS response changes or adds are (re-)created by the proxy
    /// and need their endpoints after it: they leave what the proxy holds of EDS.
    fn plan(
        &mut self,
        i: usize,
        desired: &TypeSnapshot,
        final_phase: bool,
        restrict: Option<&BTreeMap<String, Arc<Resource>>>,
        snapshot: &Snapshot,
    ) -> Option<Outgoing> {
        let before: BTreeMap<String, String> = if i == 0 {
            self.types[0]
                .ex
                .sent
                .iter()
                .map(|(n, r)| (n.clone(), r.version.clone()))
                .collect()
        } else {
            BTreeMap::new()
        };
        let out = self.types[i].plan(
            type_url::ORDER[i],
            desired,
            final_phase,
            restrict,
            self.protocol,
            &mut self.nonce,
            snapshot.changed_at,
        )?;
        if i == 0 {
            let changed: Vec<String> = self.types[0]
                .ex
                .sent
                .iter()
                .filter(|(n, r)| before.get(*n) != Some(&r.version))
                .map(|(n, _)| n.clone())
                .collect();
            let eds = &mut self.types[1].ex;
            if !changed.is_empty() {
                eds.resume_version = None;
            }
            for n in &changed {
                Arc::make_mut(&mut eds.sent).remove(n);
                if let Some(p) = &mut eds.pending {
                    Arc::make_mut(&mut p.prev_sent).remove(n);
                }
            }
        }
        Some(out)
    }
}
