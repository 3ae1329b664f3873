//! Planning for state-of-the-world streams. A response of listeners or clusters carries every
//! resource the proxy subscribed to, and what it leaves out the proxy deletes (xDS protocol,
//! "Grouping Resources into Responses", "Deleting Resources"): so resources removed from the
//! config are kept in responses until the final phase, after what names them moved on (make
//! before break). Endpoints carry what changed ([`carries_whole_state`]).

use std::sync::Arc;

use super::tracker::{Planned, Scope, TypeTracker};
use crate::ads::map_diff::ResourceMap;
use crate::ads::payload::Resources;
use crate::ads::snapshot::{diff, set_version};
use crate::model::{type_url, Resource};

/// Whether a state-of-the-world response of the type carries every resource the proxy
/// subscribed to. xDS requires it of listeners and clusters only; endpoints carry what changed
/// (an endpoint change sends one assignment, not the scope's thousands). Routes stay whole
/// although xDS would allow less: the removal of a route configuration is sequenced against
/// the clusters it names (make before break), and only a whole response expresses it.
pub fn carries_whole_state(type_url: &str) -> bool {
    type_url != type_url::ENDPOINT
}

impl TypeTracker {
    /// Step 3 of a state-of-the-world stream's plan ([`TypeTracker::plan`]).
    pub(super) fn plan_sotw(&mut self, type_url: &str, s: Scope<'_>) -> Option<Planned> {
        if carries_whole_state(type_url) {
            self.plan_sotw_whole(s)
        } else {
            self.plan_sotw_changes(s)
        }
    }

    /// A type that does not carry its whole state (endpoints): what changed goes; what is gone
    /// needs no response (the proxy forgets an assignment with its cluster). The proxy is then
    /// taken to hold exactly the subscribed part, so the version is that of the scope, as a
    /// whole response's would be: a reconnecting proxy reports it and is resumed by it.
    fn plan_sotw_changes(&mut self, s: Scope<'_>) -> Option<Planned> {
        let upserts: Vec<Arc<Resource>> = diff(&self.ex.sent, &s.scoped, s.desired)
            .changed
            .into_iter()
            .cloned()
            .collect();
        let version = if s.whole {
            s.desired.version.clone()
        } else {
            set_version(s.scoped.values())
        };
        let settled = s.restrict.is_none().then(|| s.desired.version.clone());
        if self.resumes(&s.scoped, &version, settled.clone()) {
            return None;
        }
        if self.ex.responded && upserts.is_empty() {
            self.ex.sent = s.scoped;
            self.force = false;
            self.settled = settled;
            return None;
        }
        // All of them (a first response): framed once for every stream.
        let resources = if s.whole && upserts.len() == s.scoped.len() {
            s.desired.whole()
        } else {
            Resources::Listed(upserts)
        };
        Some(Planned {
            next_sent: s.scoped,
            version,
            resources,
            removed: Vec::new(),
            complete: true,
        })
    }

    /// A type that carries its whole state: the subscribed part, plus, until the final phase,
    /// what the proxy holds that the config dropped.
    fn plan_sotw_whole(&mut self, s: Scope<'_>) -> Option<Planned> {
        let kept: Vec<(&String, &Arc<Resource>)> = if s.final_phase {
            Vec::new()
        } else {
            // Keep resources removed from the config until the additions are ACKed.
            let diff = diff(&self.ex.sent, &s.scoped, s.desired);
            let gone = diff.gone.len();
            let kept: Vec<_> = diff
                .gone
                .into_iter()
                .filter(|(n, _)| self.in_scope(n) && s.restrict.is_none_or(|r| r.contains_key(*n)))
                .collect();
            if !kept.is_empty()
                && kept.len() == gone
                && diff.changed.is_empty()
                && self.ex.responded
                && !self.force
                && self.ex.resume_version.is_none()
            {
                // Only removals: with them kept, the proxy already holds the target (a
                // removal waits for the final phase). Found without copying the map or
                // hashing it, which for 10,000 clusters cost more than sending.
                self.settled = None;
                return None;
            }
            kept
        };
        let complete = kept.is_empty();
        let (target, version): (Arc<ResourceMap>, String) = if complete {
            let version = if s.whole {
                s.desired.version.clone()
            } else {
                set_version(s.scoped.values())
            };
            (s.scoped, version)
        } else {
            let mut target = (*s.scoped).clone();
            for (n, r) in kept {
                target.insert(n.clone(), Arc::clone(r));
            }
            let version = set_version(target.values());
            (Arc::new(target), version)
        };
        let settled = (complete && s.restrict.is_none()).then(|| s.desired.version.clone());
        if self.resumes(&target, &version, settled) {
            return None;
        }
        if self.ex.responded && !self.force && self.ex.sent_version.as_ref() == Some(&version) {
            self.settled = (complete && s.restrict.is_none()).then(|| s.desired.version.clone());
            return None;
        }
        let resources = if complete && s.whole {
            // The snapshot's own map: framed once for every stream that sends it.
            s.desired.whole()
        } else {
            Resources::Listed(target.values().cloned().collect())
        };
        Some(Planned {
            next_sent: target,
            version,
            resources,
            removed: Vec::new(),
            complete,
        })
    }
}
