//! Contract 3: the proxy count ConfigMap `meshplane-<revision>-proxies` in the control
//! namespace.
//!
//! The operator creates it without data. Each instance pod server-side-applies its keys under
//! the field manager [`field_manager`] (so pods never take each other's keys):
//! - `<pod>`: its connected proxy count in decimal;
//! - `<pod>.members-stale` ([`members_stale_key`]), only while the pod serves members it could
//!   not confirm (its members ConfigMap is deleted, missing, breaks contract 2 or cannot be
//!   listed): `<RFC 3339 time> <reason>`, since when and why ([`MembersStale`]). The pod
//!   applies without it once the members are readable again, and server-side apply removes a
//!   key its manager no longer applies;
//! - `<pod>.refused-watches` ([`refused_watches_key`]), only while the API server refuses (403)
//!   some of the pod's watches before they first listed, so that it serves without those
//!   objects: the refused watches as `<namespace>/<Kind>` lines (`<Kind>.<group>` for a kind
//!   whose name another group also uses), sorted, at most
//!   [`REFUSED_LISTED_MAX`], then `+<n> more` when more are refused ([`RefusedWatches`]);
//!   `*` stands for all namespaces (a cluster-wide watch, Shared isolation). The pod applies
//!   without it once every watch lists.
//!
//! The operator sums the counts of the instance pods that exist into
//! `status.connectedProxies`, turns the marks of those pods into the `MembersStale` and
//! `WatchesRefused` conditions, and removes every key of pods that are gone
//! ([`keys_left_behind`]): a count or a mark of a gone pod is stale and does not count. A
//! ConfigMap with only `<pod>` keys (before the marks existed) reads the same as before.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::ContractError;
use crate::Data;

const CONTRACT: &str = "3 (proxy count ConfigMap)";

/// Suffix of a pod's members-stale key. Instance pods are named by their ReplicaSet
/// (`meshplane-<rev>-<hash>-<id>`, no dot), so no pod name ends with it.
pub const MEMBERS_STALE_SUFFIX: &str = ".members-stale";

/// Suffix of a pod's refused-watches key (no pod name ends with it either).
pub const REFUSED_WATCHES_SUFFIX: &str = ".refused-watches";

/// Most refused watches a mark lists; the rest are counted (`+<n> more`).
pub const REFUSED_LISTED_MAX: usize = 20;

/// Longest reason kept from a mark (it ends up in a condition message).
const REASON_MAX: usize = 256;

/// Name of the proxy count ConfigMap of `revision`.
pub fn configmap_name(revision: &str) -> String {
    format!("meshplane-{revision}-proxies")
}

/// The field manager instance pod `pod` applies its keys with.
pub fn field_manager(pod: &str) -> String {
    format!("meshplane-xds/{pod}")
}

/// The count entry instance pod `pod` applies: its key and value.
pub fn entry(pod: &str, connected: u64) -> (String, String) {
    (pod.to_string(), connected.to_string())
}

/// Key of the members-stale mark of instance pod `pod`.
pub fn members_stale_key(pod: &str) -> String {
    format!("{pod}{MEMBERS_STALE_SUFFIX}")
}

/// Key of the refused-watches mark of instance pod `pod`.
pub fn refused_watches_key(pod: &str) -> String {
    format!("{pod}{REFUSED_WATCHES_SUFFIX}")
}

/// Everything instance pod `pod` applies: its count, its members-stale mark while its members
/// are stale, and its refused-watches mark while some watch is refused.
pub fn entries(
    pod: &str,
    connected: u64,
    stale: Option<&MembersStale>,
    refused: Option<&RefusedWatches>,
) -> Data {
    let mut data = Data::from([entry(pod, connected)]);
    if let Some(mark) = stale {
        data.insert(members_stale_key(pod), mark.to_value());
    }
    if let Some(mark) = refused {
        data.insert(refused_watches_key(pod), mark.to_value());
    }
    data
}

/// The pod name a key of the ConfigMap belongs to (a count's key is the pod name).
fn pod_of(key: &str) -> &str {
    key.strip_suffix(MEMBERS_STALE_SUFFIX)
        .or_else(|| key.strip_suffix(REFUSED_WATCHES_SUFFIX))
        .unwrap_or(key)
}

/// An instance pod serves without some objects: the watches (one kind in one namespace) the
/// API server refuses it, by `<namespace>/<Kind>`, sorted, at most [`REFUSED_LISTED_MAX`], and
/// how many more are refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedWatches {
    /// `<namespace>/<Kind>` (`*/<Kind>`: a cluster-wide watch), sorted, without repeats.
    pub listed: Vec<String>,
    /// Refused watches left out of `listed`.
    pub more: usize,
}

impl RefusedWatches {
    /// The mark of the refused watches `watches` (`(namespace, kind)`, `None`: cluster-wide);
    /// `None` when there are none. Repeats count once.
    pub fn of<'a>(watches: impl IntoIterator<Item = (Option<&'a str>, &'a str)>) -> Option<Self> {
        let all: BTreeSet<String> = watches
            .into_iter()
            .map(|(namespace, kind)| format!("{}/{kind}", namespace.unwrap_or("*")))
            .collect();
        if all.is_empty() {
            return None;
        }
        let more = all.len().saturating_sub(REFUSED_LISTED_MAX);
        Some(Self {
            listed: all.into_iter().take(REFUSED_LISTED_MAX).collect(),
            more,
        })
    }

    /// The key's value: one `<namespace>/<Kind>` per line, then `+<n> more` if any are left out.
    pub fn to_value(&self) -> String {
        let mut lines = self.listed.clone();
        if self.more > 0 {
            lines.push(format!("+{} more", self.more));
        }
        lines.join("\n")
    }

    /// Reads a mark: at least one `<namespace>/<Kind>` line (a namespace name or `*`, a kind
    /// name), sorted without repeats, at most [`REFUSED_LISTED_MAX`], optionally followed by
    /// `+<n> more` (n ≥ 1) as the last line, and only once the list is full.
    pub fn from_value(value: &str) -> Result<Self, ContractError> {
        let invalid =
            |why: &str| ContractError::invalid(CONTRACT, "refused-watches mark", value, why);
        let mut lines: Vec<&str> = value.trim().lines().map(str::trim).collect();
        let more = match lines.last().and_then(|l| l.strip_prefix('+')) {
            Some(rest) => {
                let n = rest
                    .strip_suffix(" more")
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| *n > 0)
                    .ok_or_else(|| invalid("the last line is not `+<n> more`"))?;
                lines.pop();
                if lines.len() != REFUSED_LISTED_MAX {
                    return Err(invalid("`+<n> more` before the list is full"));
                }
                n
            }
            None => 0,
        };
        if lines.is_empty() || lines == [""] {
            return Err(invalid("no refused watch"));
        }
        if lines.len() > REFUSED_LISTED_MAX {
            return Err(invalid("too many lines"));
        }
        for line in &lines {
            let Some((namespace, kind)) = line.split_once('/') else {
                return Err(invalid("a line is not `<namespace>/<Kind>`"));
            };
            if !(namespace == "*" || crate::kube_names::is_dns1123_label(namespace)) {
                return Err(invalid("a namespace is not a namespace name or `*`"));
            }
            if !is_kind_name(kind) {
                return Err(invalid("a kind is not a kind name"));
            }
        }
        if lines.windows(2).any(|w| w[0] >= w[1]) {
            return Err(invalid("the lines are not sorted without repeats"));
        }
        Ok(Self {
            listed: lines.into_iter().map(str::to_string).collect(),
            more,
        })
    }
}

impl std::fmt::Display for RefusedWatches {
    /// `a/Service, b/Service` and `(+n more)`: for a condition message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.listed.join(", "))?;
        if self.more > 0 {
            write!(f, " (+{} more)", self.more)?;
        }
        Ok(())
    }
}

/// A kind's name as in a manifest (an upper-case ASCII letter, then letters and digits),
/// followed by `.<group>` where two groups have a kind of the same name
/// (`Gateway.gateway.networking.k8s.io` beside meshplane's `Gateway`).
fn is_kind_name(s: &str) -> bool {
    let (kind, group) = match s.split_once('.') {
        Some((kind, group)) => (kind, Some(group)),
        None => (s, None),
    };
    kind.len() <= 63
        && kind.starts_with(|c: char| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric())
        && group.is_none_or(crate::kube_names::is_dns1123_subdomain)
}

/// An instance pod keeps serving members it could not confirm: since when (RFC 3339, UTC) and
/// why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembersStale {
    pub since: String,
    pub reason: String,
}

impl MembersStale {
    /// The key's value: the time, one space, the reason.
    pub fn to_value(&self) -> String {
        format!("{} {}", self.since, self.reason)
    }

    /// Reads a mark; the time must be RFC 3339 (`2026-12-02T03:40:00Z`), the reason may be
    /// empty and is cut to 256 characters.
    pub fn from_value(value: &str) -> Result<Self, ContractError> {
        let value = value.trim();
        let (since, reason) = value.split_once(' ').unwrap_or((value, ""));
        if !is_rfc3339(since) {
            return Err(ContractError::invalid(
                CONTRACT,
                "members-stale mark",
                value,
                "does not start with an RFC 3339 time",
            ));
        }
        Ok(Self {
            since: since.to_string(),
            reason: reason.trim().chars().take(REASON_MAX).collect(),
        })
    }
}

/// `YYYY-MM-DDTHH:MM:SS`, optional fraction, then `Z` or `±HH:MM`: the shape, not the calendar.
fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let head = digits(0..4)
        && at(4, b'-')
        && digits(5..7)
        && at(7, b'-')
        && digits(8..10)
        && (at(10, b'T') || at(10, b't'))
        && digits(11..13)
        && at(13, b':')
        && digits(14..16)
        && at(16, b':')
        && digits(17..19);
    if !head {
        return false;
    }
    let mut i = 19;
    if at(i, b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match b.get(i) {
        Some(b'Z' | b'z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            i + 6 == b.len() && digits(i + 1..i + 3) && at(i + 3, b':') && digits(i + 4..i + 6)
        }
        _ => false,
    }
}

/// The counts and marks in the ConfigMap, by pod name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyCounts {
    pub by_pod: BTreeMap<String, u64>,
    /// Pods that serve members they could not confirm.
    pub members_stale: BTreeMap<String, MembersStale>,
    /// Pods that serve without what the API server refuses them to read.
    pub refused_watches: BTreeMap<String, RefusedWatches>,
}

impl ProxyCounts {
    /// Reads the ConfigMap `data`; a value that is not a count (or a mark) is an error naming
    /// its key.
    pub fn from_data(data: &Data) -> Result<Self, ContractError> {
        let (counts, mut errors) = Self::read(data);
        match errors.is_empty() {
            true => Ok(counts),
            false => Err(errors.remove(0)),
        }
    }

    /// Reads what is readable and says what is not: one bad key (another writer's, a newer
    /// format) does not hide the other pods' counts.
    pub fn read(data: &Data) -> (Self, Vec<ContractError>) {
        let mut out = Self::default();
        let mut errors = Vec::new();
        for (key, value) in data {
            if let Some(pod) = key.strip_suffix(MEMBERS_STALE_SUFFIX) {
                match MembersStale::from_value(value) {
                    Ok(mark) => {
                        out.members_stale.insert(pod.to_string(), mark);
                    }
                    Err(e) => errors.push(e),
                }
                continue;
            }
            if let Some(pod) = key.strip_suffix(REFUSED_WATCHES_SUFFIX) {
                match RefusedWatches::from_value(value) {
                    Ok(mark) => {
                        out.refused_watches.insert(pod.to_string(), mark);
                    }
                    Err(e) => errors.push(e),
                }
                continue;
            }
            match value.trim().parse::<u64>() {
                Ok(count) => {
                    out.by_pod.insert(key.clone(), count);
                }
                Err(_) => errors.push(ContractError::invalid(
                    CONTRACT,
                    "count",
                    value,
                    format!("key {key:?} is not a count"),
                )),
            }
        }
        (out, errors)
    }

    /// The sum over the pods in `live` (the instance pods that exist).
    pub fn total(&self, live: &BTreeSet<String>) -> u64 {
        self.by_pod
            .iter()
            .filter(|(pod, _)| live.contains(*pod))
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add)
    }

    /// The marks of the pods in `live`: a gone pod's mark says nothing about what is served.
    pub fn members_stale_of<'a>(
        &'a self,
        live: &'a BTreeSet<String>,
    ) -> impl Iterator<Item = (&'a str, &'a MembersStale)> {
        self.members_stale
            .iter()
            .filter(|(pod, _)| live.contains(*pod))
            .map(|(pod, mark)| (pod.as_str(), mark))
    }

    /// The refused-watches marks of the pods in `live`.
    pub fn refused_watches_of<'a>(
        &'a self,
        live: &'a BTreeSet<String>,
    ) -> impl Iterator<Item = (&'a str, &'a RefusedWatches)> {
        self.refused_watches
            .iter()
            .filter(|(pod, _)| live.contains(*pod))
            .map(|(pod, mark)| (pod.as_str(), mark))
    }
}

/// Keys of `data` left behind by instance pods not in `live` (their counts and their marks,
/// readable or not), which the operator removes.
pub fn keys_left_behind(data: &Data, live: &BTreeSet<String>) -> Vec<String> {
    data.keys()
        .filter(|key| !live.contains(pod_of(key)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(pods: &[&str]) -> BTreeSet<String> {
        pods.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn round_trips_and_counts_only_live_pods() {
        let data: Data = [entry("xds-a", 3), entry("xds-b", 4), entry("xds-gone", 9)]
            .into_iter()
            .collect();
        let counts = ProxyCounts::from_data(&data).expect("counts");
        let live = live(&["xds-a", "xds-b"]);
        assert_eq!(counts.total(&live), 7);
        assert_eq!(keys_left_behind(&data, &live), ["xds-gone"]);
        assert_eq!(field_manager("xds-a"), "meshplane-xds/xds-a");
        let err = ProxyCounts::from_data(&Data::from([("x".into(), "many".into())]))
            .expect_err("not a count");
        assert!(err.to_string().contains("\"x\""), "{err}");
    }

    /// An instance serving stale members says so next to its count; the mark
    /// round-trips, old-format data (counts only) reads as before, and a gone pod's mark goes
    /// with its count.
    #[test]
    fn members_stale_marks_round_trip_and_leave_with_their_pod() {
        let mark = MembersStale {
            since: "2026-12-02T03:40:00Z".into(),
            reason: "the members ConfigMap was deleted".into(),
        };
        let mut data = entries("xds-a", 3, Some(&mark), None);
        assert_eq!(
            data,
            Data::from([
                ("xds-a".into(), "3".into()),
                (
                    "xds-a.members-stale".into(),
                    "2026-12-02T03:40:00Z the members ConfigMap was deleted".into()
                ),
            ])
        );
        assert_eq!(
            entries("xds-a", 3, None, None),
            Data::from([entry("xds-a", 3)])
        );
        data.extend(entries("xds-gone", 1, Some(&mark), None));
        data.extend(entries("xds-b", 4, None, None));
        let counts = ProxyCounts::from_data(&data).expect("readable");
        let live = live(&["xds-a", "xds-b"]);
        assert_eq!(counts.total(&live), 7, "marks are not counts");
        assert_eq!(
            counts.members_stale_of(&live).collect::<Vec<_>>(),
            [("xds-a", &mark)]
        );
        assert_eq!(
            keys_left_behind(&data, &live),
            ["xds-gone", "xds-gone.members-stale"]
        );
        // Counts only (the format before marks): no pod is stale.
        let old = Data::from([entry("xds-a", 2)]);
        assert_eq!(
            ProxyCounts::from_data(&old).map(|c| c.members_stale.is_empty()),
            Ok(true)
        );
    }

    #[test]
    fn a_mark_needs_an_rfc3339_time_and_a_bad_key_hides_no_other() {
        for ok in [
            "2026-12-02T03:40:00Z",
            "2026-12-02T03:40:00.123Z why",
            "2026-12-02T03:40:00+01:00 why",
        ] {
            assert!(MembersStale::from_value(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "yesterday why",
            "2026-12-02 03:40:00Z",
            "2026-12-02T03:40:00",
        ] {
            assert!(MembersStale::from_value(bad).is_err(), "{bad:?}");
        }
        let long = format!("2026-12-02T03:40:00Z {}", "x".repeat(1000));
        let mark = MembersStale::from_value(&long).expect("long reason");
        assert_eq!(mark.reason.len(), REASON_MAX);
        let data = Data::from([
            ("xds-a".into(), "3".into()),
            ("xds-a.members-stale".into(), "soon".into()),
            ("xds-b".into(), "lots".into()),
        ]);
        let (counts, errors) = ProxyCounts::read(&data);
        assert_eq!(counts.by_pod, BTreeMap::from([("xds-a".into(), 3)]));
        assert_eq!(errors.len(), 2, "{errors:?}");
    }

    /// A pod that serves without what the API server refuses it says which namespaces and
    /// kinds, sorted and bounded; the mark round-trips, goes with its pod, and is read strictly.
    #[test]
    fn refused_watches_marks_round_trip_bounded_and_leave_with_their_pod() {
        let mark = RefusedWatches::of([
            (Some("shop"), "Service"),
            (Some("bank"), "Service"),
            (Some("bank"), "EndpointSlice"),
            (Some("bank"), "Service"),
        ])
        .expect("some refused");
        assert_eq!(
            mark.listed,
            ["bank/EndpointSlice", "bank/Service", "shop/Service"]
        );
        assert_eq!(mark.more, 0);
        assert_eq!(
            mark.to_string(),
            "bank/EndpointSlice, bank/Service, shop/Service"
        );
        let mut data = entries("xds-a", 3, None, Some(&mark));
        assert_eq!(
            data,
            Data::from([
                ("xds-a".into(), "3".into()),
                (
                    "xds-a.refused-watches".into(),
                    "bank/EndpointSlice\nbank/Service\nshop/Service".into()
                ),
            ])
        );
        assert_eq!(RefusedWatches::of([]), None, "nothing refused, no mark");
        data.extend(entries("xds-gone", 1, None, Some(&mark)));
        let counts = ProxyCounts::from_data(&data).expect("readable");
        let live = live(&["xds-a"]);
        assert_eq!(counts.total(&live), 3, "marks are not counts");
        assert_eq!(
            counts.refused_watches_of(&live).collect::<Vec<_>>(),
            [("xds-a", &mark)]
        );
        assert_eq!(
            keys_left_behind(&data, &live),
            ["xds-gone", "xds-gone.refused-watches"]
        );

        // Many refused (every kind of many namespaces, a cluster-wide watch): the first
        // REFUSED_LISTED_MAX are named, the rest counted, and that reads back the same.
        let namespaces: Vec<String> = (0..30).map(|i| format!("ns-{i:02}")).collect();
        let many = RefusedWatches::of(
            namespaces
                .iter()
                .map(|ns| (Some(ns.as_str()), "Service"))
                .chain([(None, "Sidecar")]),
        )
        .expect("some refused");
        assert_eq!(many.listed.len(), REFUSED_LISTED_MAX);
        assert_eq!(many.listed[0], "*/Sidecar", "cluster-wide sorts first");
        assert_eq!(many.more, 31 - REFUSED_LISTED_MAX);
        let value = many.to_value();
        assert!(value.ends_with("\n+11 more"), "{value}");
        assert_eq!(RefusedWatches::from_value(&value), Ok(many.clone()));
        assert!(many.to_string().ends_with(" (+11 more)"), "{many}");
    }

    #[test]
    fn a_refused_watches_mark_is_read_strictly() {
        for ok in [
            "shop/Service",
            "*/Sidecar\nshop/Service",
            " a/Service\nb/Service \n",
            "bank/Gateway\nbank/Gateway.gateway.networking.k8s.io",
        ] {
            assert!(RefusedWatches::from_value(ok).is_ok(), "{ok:?}");
        }
        let full: Vec<String> = (0..REFUSED_LISTED_MAX)
            .map(|i| format!("ns-{i:02}/Service"))
            .collect();
        let full = full.join("\n");
        for bad in [
            String::new(),
            "shop".into(),
            "shop/".into(),
            "/Service".into(),
            "Shop/Service".into(),
            "shop/service".into(),
            "shop/Ser vice".into(),
            "shop/Gateway.".into(),
            "shop/Gateway.Gateway.Networking".into(),
            "shop/Service\nbank/Service".into(),
            "shop/Service\nshop/Service".into(),
            "shop/Service\n+2 more".into(),
            format!("{full}\n+0 more"),
            format!("{full}\n+2"),
            format!("{full}\nzz/Service"),
        ] {
            assert!(RefusedWatches::from_value(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            RefusedWatches::from_value(&format!("{full}\n+2 more")).map(|m| m.more),
            Ok(2)
        );
        // A broken mark is an error of its own: the counts and other marks still read.
        let data = Data::from([
            ("xds-a".into(), "3".into()),
            ("xds-a.refused-watches".into(), "everything".into()),
            ("xds-b".into(), "1".into()),
            ("xds-b.refused-watches".into(), "shop/Service".into()),
        ]);
        let (counts, errors) = ProxyCounts::read(&data);
        assert_eq!(counts.by_pod.len(), 2);
        assert_eq!(counts.refused_watches.keys().collect::<Vec<_>>(), ["xds-b"]);
        assert_eq!(errors.len(), 1, "{errors:?}");
    }
}
