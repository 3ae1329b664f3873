//! Request counter of the stand-in (test-fixture instrumentation): how many resource requests
//! it answered, by verb, and a bounded log of the latest writes with what they addressed.
//! Benchmarks read it from another process at `GET /standin/requests` (not a Kubernetes path;
//! served without authentication, like `/healthz`, since the stand-in listens on loopback only)
//! to check, for example, that a steady-state resync of the operator writes nothing.
//!
//! Only resource requests are counted (`/api/...`, `/apis/...` addressing a known resource),
//! after authentication and whatever their outcome: a write that RBAC, validation or a conflict
//! rejects is still a write request. Discovery and other non-resource paths are not counted.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// The verbs that ask the server to change state.
pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// How many of the latest writes the log keeps.
pub const WRITE_LOG_LIMIT: usize = 2000;

/// Whether `verb` is a write.
pub fn is_write(verb: &str) -> bool {
    WRITE_VERBS.contains(&verb)
}

/// One write request as the stand-in saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteRecord {
    /// 1 for the first write the stand-in answered, then counting up.
    pub seq: u64,
    pub verb: String,
    /// API group ("" for the core group).
    pub group: String,
    /// Plural resource name, with `/<subresource>` when one was addressed (`.../status`).
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// From the path, or for a create from the body's `metadata.name` when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Authenticated user (after impersonation).
    pub user: String,
    /// HTTP status of the answer.
    pub code: u16,
    #[serde(default)]
    pub dry_run: bool,
}

impl std::fmt::Display for WriteRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let resource = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        write!(f, "{} {resource}", self.verb)?;
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => write!(f, " {ns}/{name}")?,
            (Some(ns), None) => write!(f, " in {ns}")?,
            (None, Some(name)) => write!(f, " {name}")?,
            (None, None) => {}
        }
        write!(f, " by {} → {}", self.user, self.code)?;
        if self.dry_run {
            write!(f, " (dry run)")?;
        }
        Ok(())
    }
}

/// What `GET /standin/requests` answers: totals since the stand-in started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestCounts {
    /// Resource requests by verb (get, list, watch, create, update, patch, delete,
    /// deletecollection).
    pub by_verb: BTreeMap<String, u64>,
    /// All write requests (the sum of the write verbs).
    pub writes: u64,
    /// Write requests by `"<verb> <resource>[.<group>]"`.
    pub writes_by_resource: BTreeMap<String, u64>,
    /// The latest writes, oldest first (at most [`WRITE_LOG_LIMIT`]).
    pub recent_writes: Vec<WriteRecord>,
}

impl RequestCounts {
    /// Requests with `verb` so far.
    pub fn verb(&self, verb: &str) -> u64 {
        self.by_verb.get(verb).copied().unwrap_or(0)
    }

    /// Read requests (get, list, watch) so far.
    pub fn reads(&self) -> u64 {
        ["get", "list", "watch"].iter().map(|v| self.verb(v)).sum()
    }

    /// Per-verb increase since `earlier` (verbs that did not change are left out).
    pub fn verbs_since(&self, earlier: &RequestCounts) -> BTreeMap<String, u64> {
        self.by_verb
            .iter()
            .map(|(verb, n)| (verb.clone(), n.saturating_sub(earlier.verb(verb))))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Per-`"<verb> <resource>"` increase of writes since `earlier`.
    pub fn writes_by_resource_since(&self, earlier: &RequestCounts) -> BTreeMap<String, u64> {
        self.writes_by_resource
            .iter()
            .map(|(key, n)| {
                let before = earlier.writes_by_resource.get(key).copied().unwrap_or(0);
                (key.clone(), n.saturating_sub(before))
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// The logged writes that came after `earlier` was taken (the log may have lost older
    /// ones when more than [`WRITE_LOG_LIMIT`] happened in between).
    pub fn writes_after<'a>(&'a self, earlier: &RequestCounts) -> Vec<&'a WriteRecord> {
        self.recent_writes
            .iter()
            .filter(|w| w.seq > earlier.writes)
            .collect()
    }
}

/// Counts requests; shared by every connection of one stand-in.
#[derive(Debug, Default)]
pub struct RequestCounter {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    by_verb: BTreeMap<String, u64>,
    writes: u64,
    writes_by_resource: BTreeMap<String, u64>,
    log: VecDeque<WriteRecord>,
}

impl RequestCounter {
    /// Records one resource request. `name` is the object's name when known.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
        subresource: Option<&str>,
        namespace: Option<&str>,
        name: Option<&str>,
        user: &str,
        code: u16,
        dry_run: bool,
    ) {
        let mut counts = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        *counts.by_verb.entry(verb.to_string()).or_default() += 1;
        if !is_write(verb) {
            return;
        }
        counts.writes += 1;
        let resource = match subresource {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        };
        let key = if group.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}.{group}")
        };
        *counts.writes_by_resource.entry(key).or_default() += 1;
        let record = WriteRecord {
            seq: counts.writes,
            verb: verb.to_string(),
            group: group.to_string(),
            resource,
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            user: user.to_string(),
            code,
            dry_run,
        };
        tracing::debug!(target: "kube_standin::writes", write = %record, "write");
        if counts.log.len() >= WRITE_LOG_LIMIT {
            counts.log.pop_front();
        }
        counts.log.push_back(record);
    }

    /// A copy of the counts so far.
    pub fn snapshot(&self) -> RequestCounts {
        let counts = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        RequestCounts {
            by_verb: counts.by_verb.clone(),
            writes: counts.writes,
            writes_by_resource: counts.writes_by_resource.clone(),
            recent_writes: counts.log.iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_writes_by_verb_and_resource_and_keeps_a_bounded_log() {
        let counter = RequestCounter::default();
        counter.record(
            "get",
            "",
            "configmaps",
            None,
            Some("a"),
            Some("x"),
            "u",
            200,
            false,
        );
        counter.record("list", "", "configmaps", None, None, None, "u", 200, false);
        let before = counter.snapshot();
        counter.record(
            "patch",
            "",
            "configmaps",
            None,
            Some("a"),
            Some("x"),
            "u",
            200,
            false,
        );
        counter.record(
            "patch",
            "meshplane.io",
            "meshcontrolplanes",
            Some("status"),
            None,
            Some("blue"),
            "u",
            200,
            false,
        );
        let after = counter.snapshot();
        assert_eq!((after.reads(), after.writes), (2, 2));
        assert_eq!(
            after.verbs_since(&before),
            [("patch".to_string(), 2)].into()
        );
        assert_eq!(
            after.writes_by_resource_since(&before),
            [
                ("patch configmaps".to_string(), 1),
                ("patch meshcontrolplanes/status.meshplane.io".to_string(), 1)
            ]
            .into()
        );
        let logged: Vec<String> = after
            .writes_after(&before)
            .iter()
            .map(|w| w.to_string())
            .collect();
        assert_eq!(
            logged,
            [
                "patch configmaps a/x by u → 200",
                "patch meshcontrolplanes/status.meshplane.io blue by u → 200"
            ]
        );
        for _ in 0..WRITE_LOG_LIMIT {
            counter.record(
                "delete",
                "",
                "pods",
                None,
                Some("a"),
                Some("p"),
                "u",
                404,
                false,
            );
        }
        let full = counter.snapshot();
        assert_eq!(full.recent_writes.len(), WRITE_LOG_LIMIT);
        assert_eq!(full.recent_writes.last().map(|w| w.seq), Some(full.writes));
    }
}
