//! The tracker as it was before per-snapshot versions and shared maps: the model the
//! incremental [`super`] must match response for response (see its tests).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;

use super::{Nack, Outgoing, Protocol, RequestOutcome, DEPENDS_ON};
use crate::ads::snapshot::{set_version, type_index, Snapshot, TypeSnapshot, TYPE_COUNT, VHDS};
use crate::model::{type_url, Resource};

const WILDCARD: &str = "*";

#[derive(Clone, Debug)]
struct Pending {
    nonce: String,
    version: String,
    prev_sent: BTreeMap<String, Arc<Resource>>,
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
    /// Subscribed names are VHDS namespaces.
    namespaced: bool,
    /// VHDS: the route configurations the proxy holds; only their virtual hosts are in scope.
    held_routes: Option<BTreeSet<String>>,
    /// What the proxy holds (or will hold once the pending response is ACKed).
    sent: BTreeMap<String, Arc<Resource>>,
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
    /// Whether the proxy subscribed to this type.
    pub fn subscribed(&self) -> bool {
        self.requested
    }

    fn in_scope(&self, name: &str) -> bool {
        let held = self
            .held_routes
            .as_ref()
            .is_none_or(|routes| in_held_route(routes, name));
        held && (self.wildcard || self.subscribed_to(name))
    }

    /// A subscribed name equals `name`, or (namespaced) is `name` without its last segment.
    fn subscribed_to(&self, name: &str) -> bool {
        self.names.iter().any(|n| {
            if self.namespaced {
                name.strip_prefix(n.as_str())
                    .and_then(|rest| rest.strip_prefix('/'))
                    .is_some_and(|last| !last.contains('/'))
            } else {
                n == name
            }
        })
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
    /// SotW reconnect: whether the proxy reported holding `version`, that of `target`; then it
    /// holds `target`. The report is used up either way.
    fn resumes(&mut self, target: &BTreeMap<String, Arc<Resource>>, version: &str) -> bool {
        if self.resume_version.take().as_deref() != Some(version) {
            return false;
        }
        self.sent = target.clone();
        self.sent_version = Some(version.to_string());
        self.acked_version = Some(version.to_string());
        self.responded = true;
        true
    }

    fn is_stale(&self, nonce: &str) -> bool {
        match &self.last_nonce {
            // Nothing sent on this stream yet: a nonce from a previous stream is just noise.
            None => false,
            Some(last) => !nonce.is_empty() && nonce != last,
        }
    }

    fn unsettled(&self, desired: &TypeSnapshot) -> bool {
        self.requested
            && (self.pending.is_some()
                || self.nack_block.as_deref() == Some(desired.version.as_str()))
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
        if !self.requested || self.pending.is_some() {
            return None;
        }
        match &self.nack_block {
            Some(blocked) if *blocked == desired.version => return None,
            Some(_) => self.nack_block = None,
            None => {}
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
                if self.resumes(&scoped, &version) {
                    return None;
                }
                let upserts: Vec<Arc<Resource>> = scoped
                    .values()
                    .filter(|r| self.sent.get(&r.name).map(|s| &s.version) != Some(&r.version))
                    .cloned()
                    .collect();
                if self.responded && upserts.is_empty() {
                    self.sent = scoped;
                    self.force = false;
                    return None;
                }
                (scoped, version, upserts, Vec::new())
            }
            Protocol::Sotw => {
                let mut target = scoped;
                if !final_phase {
                    // Keep resources removed from the config until the additions are ACKed.
                    for (n, r) in &self.sent {
                        if self.in_scope(n)
                            && !target.contains_key(n)
                            && restrict.is_none_or(|x| x.contains_key(n))
                        {
                            target.insert(n.clone(), Arc::clone(r));
                        }
                    }
                }
                let version = set_version(target.values());
                if self.resumes(&target, &version) {
                    return None;
                }
                if self.responded && !self.force && self.sent_version.as_ref() == Some(&version) {
                    return None;
                }
                let resources = target.values().cloned().collect();
                (target, version, resources, Vec::new())
            }
            Protocol::Delta => {
                let upserts: Vec<Arc<Resource>> = scoped
                    .values()
                    .filter(|r| self.sent.get(&r.name).map(|s| &s.version) != Some(&r.version))
                    .cloned()
                    .collect();
                let removed: Vec<String> = if final_phase {
                    self.sent
                        .keys()
                        .filter(|n| !scoped.contains_key(*n))
                        .cloned()
                        .collect()
                } else {
                    Vec::new()
                };
                if self.responded && upserts.is_empty() && removed.is_empty() {
                    return None;
                }
                let mut next = self.sent.clone();
                for r in &upserts {
                    next.insert(r.name.clone(), Arc::clone(r));
                }
                for n in &removed {
                    next.remove(n);
                }
                (next, desired.version.clone(), upserts, removed)
            }
        };
        *nonce += 1;
        let nonce = nonce.to_string();
        self.pending = Some(Pending {
            nonce: nonce.clone(),
            version: version.clone(),
            prev_sent: std::mem::replace(&mut self.sent, next_sent),
            prev_sent_version: self.sent_version.replace(version.clone()),
            desired_version: desired.version.clone(),
        });
        self.last_nonce = Some(nonce.clone());
        self.responded = true;
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
        types[VHDS].namespaced = true;
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
        if !first && (wildcard != t.wildcard || names != t.names) {
            t.force = true;
        }
        t.wildcard = wildcard;
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
        let Some(i) = type_index(type_url).filter(|&i| self.vhds || i != VHDS) else {
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
        if first {
            // An empty first subscription is the legacy wildcard.
            t.wildcard = subscribe.is_empty();
            for (name, version) in initial_versions {
                // Only the version matters for what the proxy already holds.
                t.sent.insert(
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
                t.names.insert(name.clone());
            }
        }
        for name in unsubscribe {
            if name == WILDCARD {
                t.wildcard = false;
            } else {
                t.names.remove(name);
            }
            if !t.in_scope(name) {
                // The proxy forgets it on its own: no removal needed.
                t.sent.remove(name);
            }
        }
        if !t.wildcard {
            let keep: BTreeSet<String> = t
                .sent
                .keys()
                .filter(|n| t.subscribed_to(n))
                .cloned()
                .collect();
            t.sent.retain(|n, _| keep.contains(n));
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
                unsettled[i] = self.types[i].requested;
                continue;
            }
            if i == VHDS && self.vhds {
                let routes: BTreeSet<String> = self.types[3].sent.keys().cloned().collect();
                let t = &mut self.types[VHDS];
                // The proxy drops virtual hosts with their route configuration.
                let dropped: Vec<String> = t
                    .sent
                    .keys()
                    .filter(|n| !in_held_route(&routes, n))
                    .cloned()
                    .collect();
                t.held_routes = Some(routes);
                for n in dropped {
                    t.sent.remove(&n);
                }
            }
            // EDS: only clusters sent on a wildcard CDS subscription.
            let cds = &self.types[0];
            let restrict = (i == 1
                && cds.requested
                && cds.wildcard
                && snapshot.types[1]
                    .resources
                    .keys()
                    .chain(self.types[1].sent.keys())
                    .any(|n| !cds.sent.contains_key(n)))
            .then(|| cds.sent.clone());
            if let Some(o) = self.plan(i, desired, false, restrict.as_ref(), snapshot) {
                out.push(o);
            }
            unsettled[i] = self.types[i].unsettled(desired) || restrict.is_some();
        }
        if !out.is_empty() || self.types.iter().any(|t| t.pending.is_some()) {
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
                .sent
                .iter()
                .filter(|(n, r)| before.get(*n) != Some(&r.version))
                .map(|(n, _)| n.clone())
                .collect();
            let eds = &mut self.types[1];
            if !changed.is_empty() {
                eds.resume_version = None;
            }
            for n in &changed {
                eds.sent.remove(n);
                if let Some(p) = &mut eds.pending {
                    p.prev_sent.remove(n);
                }
            }
        }
        Some(out)
    }
}
