//! Planning for incremental streams: a response carries the resources added or changed and,
//! in the final phase, the names the proxy must drop (xDS protocol, "Incremental xDS"). Until
//! then what the config dropped stays with the proxy (make before break).

use std::sync::Arc;

use super::tracker::{Planned, Scope, TypeTracker};
use crate::ads::snapshot::diff;
use crate::model::Resource;

impl TypeTracker {
    /// Step 3 of an incremental stream's plan ([`TypeTracker::plan`]).
    pub(super) fn plan_delta(&mut self, s: Scope<'_>) -> Option<Planned> {
        let diff = diff(&self.ex.sent, &s.scoped, s.desired);
        let upserts: Vec<Arc<Resource>> = diff.changed.into_iter().cloned().collect();
        let stale: Vec<String> = diff.gone.into_iter().map(|(n, _)| n.clone()).collect();
        let complete = s.final_phase || stale.is_empty();
        let removed = if s.final_phase { stale } else { Vec::new() };
        if self.ex.responded && upserts.is_empty() && removed.is_empty() {
            self.settled = (complete && s.restrict.is_none()).then(|| s.desired.version.clone());
            return None;
        }
        // Holding exactly the scope: share it rather than patching a copy.
        let next_sent = if complete {
            s.scoped
        } else {
            let mut next = (*self.ex.sent).clone();
            for r in &upserts {
                next.insert(r.name.clone(), Arc::clone(r));
            }
            Arc::new(next)
        };
        Some(Planned {
            next_sent,
            version: s.desired.version.clone(),
            resources: upserts.into(),
            removed,
            complete,
        })
    }
}
