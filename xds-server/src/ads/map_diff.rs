//! How two versions of a type's resources differ: by one ordered walk over both, or, when the
//! newer one's snapshot succeeded the older one in its scope, from the names that snapshot
//! recorded as changed ([`super::snapshot::TypeSnapshot::changed_since`], [`from_changes`]). The second is what keeps a settled
//! stream's wake-up in the size of the change: with 10,000 clusters, walking costs every
//! stream about as much as the change's whole render.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::Resource;

/// Resources of one type by name, shared between snapshots and the streams that hold them.
pub type ResourceMap = BTreeMap<String, Arc<Resource>>;

/// How what a proxy holds differs from what it should hold.
pub struct MapDiff<'a> {
    /// Resources of the target the proxy lacks or holds in another version, in name order.
    pub changed: Vec<&'a Arc<Resource>>,
    /// Entries held that the target no longer has, in name order.
    pub gone: Vec<(&'a String, &'a Arc<Resource>)>,
}

/// Marks a look at every resource of a type: counted in tests, which check that a settled
/// stream's wake-up for a small change takes none.
#[inline]
pub(crate) fn walked() {
    #[cfg(test)]
    tests::count_walk();
}

/// The diff of a successor from the names changed since its predecessor `held`: each one is
/// either in `target` (added or changed) or only in `held` (removed).
pub fn from_changes<'a>(
    held: &'a ResourceMap,
    target: &'a ResourceMap,
    names: &[String],
) -> MapDiff<'a> {
    let mut diff = MapDiff {
        changed: Vec::new(),
        gone: Vec::new(),
    };
    for name in names {
        if let Some(r) = target.get(name) {
            diff.changed.push(r);
        } else if let Some(entry) = held.get_key_value(name) {
            diff.gone.push(entry);
        }
    }
    diff
}

/// Compares `held` with `desired` in one walk over both (each is sorted by name), so a push
/// costs one pass rather than a tree search per resource; entries that are the same `Arc` are
/// equal without comparing anything.
pub fn walk<'a>(held: &'a ResourceMap, desired: &'a ResourceMap) -> MapDiff<'a> {
    let mut diff = MapDiff {
        changed: Vec::new(),
        gone: Vec::new(),
    };
    if std::ptr::eq(held, desired) {
        return diff;
    }
    walked();
    let mut h = held.iter().peekable();
    let mut d = desired.iter().peekable();
    loop {
        match (h.peek(), d.peek()) {
            (None, None) => break,
            (Some(_), None) => diff.gone.extend(h.by_ref()),
            (None, Some(_)) => diff.changed.extend(d.by_ref().map(|(_, r)| r)),
            (Some((hn, hr)), Some((dn, dr))) => {
                if Arc::ptr_eq(hr, dr) {
                    h.next();
                    d.next();
                    continue;
                }
                match hn.as_str().cmp(dn.as_str()) {
                    std::cmp::Ordering::Less => diff.gone.extend(h.next()),
                    std::cmp::Ordering::Greater => diff.changed.extend(d.next().map(|(_, r)| r)),
                    std::cmp::Ordering::Equal => {
                        if hr.version != dr.version {
                            diff.changed.push(dr);
                        }
                        h.next();
                        d.next();
                    }
                }
            }
        }
    }
    diff
}

/// Whether every name of `inner` is a name of `outer`, in one walk over both.
pub fn names_within(inner: &ResourceMap, outer: &ResourceMap) -> bool {
    if std::ptr::eq(inner, outer) {
        return true;
    }
    if inner.len() > outer.len() {
        return false;
    }
    walked();
    let mut o = outer.keys();
    'next: for name in inner.keys() {
        for candidate in o.by_ref() {
            match candidate.as_str().cmp(name.as_str()) {
                std::cmp::Ordering::Less => continue,
                std::cmp::Ordering::Equal => continue 'next,
                std::cmp::Ordering::Greater => return false,
            }
        }
        return false;
    }
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use bytes::Bytes;

    use super::*;
    use crate::model::type_url;
    use meshplane_xds_core::test_choices::{for_choices, Choices};

    thread_local! {
        static FROM_CHANGES: Cell<usize> = const { Cell::new(0) };
        static WALKS: Cell<usize> = const { Cell::new(0) };
    }

    pub(super) fn count_walk() {
        WALKS.with(|c| c.set(c.get() + 1));
    }

    /// How many looks at every resource of a type this thread took ([`walked`]).
    pub(crate) fn walks() -> usize {
        WALKS.with(Cell::get)
    }

    pub(crate) fn count_diff_from_changes() {
        FROM_CHANGES.with(|c| c.set(c.get() + 1));
    }

    /// How many diffs this thread took from recorded changes rather than a walk (tests check
    /// that their sequences exercise that path, not only that results agree).
    pub(crate) fn diffs_from_changes() -> usize {
        FROM_CHANGES.with(Cell::get)
    }

    fn res(name: &str, version: &str) -> Arc<Resource> {
        Arc::new(Resource {
            name: name.to_string(),
            type_url: type_url::CLUSTER,
            encoded: Bytes::from(version.to_string()),
            version: version.to_string(),
            packed: Default::default(),
        })
    }

    fn map(entries: &[(&str, &str)]) -> ResourceMap {
        entries
            .iter()
            .map(|(n, v)| (n.to_string(), res(n, v)))
            .collect()
    }

    const NAMES: [&str; 8] = ["a", "b", "c", "d", "e", "ab", "b0", ""];

    /// A random map over [`NAMES`], sharing the entries of `from` it keeps unchanged.
    pub(crate) fn pick(rng: &mut Choices, from: &ResourceMap) -> ResourceMap {
        let mut out = ResourceMap::new();
        for n in NAMES {
            if !rng.chance(60) {
                continue;
            }
            let entry = match from.get(n) {
                Some(r) if rng.chance(70) => Arc::clone(r),
                _ => res(n, &(rng.next() % 2).to_string()),
            };
            out.insert(n.to_string(), entry);
        }
        out
    }

    pub(crate) fn names<'a>(diff: &MapDiff<'a>) -> (Vec<&'a str>, Vec<&'a str>) {
        (
            diff.changed.iter().map(|r| r.name.as_str()).collect(),
            diff.gone.iter().map(|(n, _)| n.as_str()).collect(),
        )
    }

    /// The one-walk diff gives what per-name look-ups give, on random pairs of maps.
    #[test]
    fn the_ordered_walk_equals_per_name_lookups() {
        for_choices(2_000, 64, |mut rng| {
            let held = pick(&mut rng, &ResourceMap::new());
            let desired = pick(&mut rng, &held);
            let (changed, gone) = names(&walk(&held, &desired));
            let expect_changed: Vec<&str> = desired
                .values()
                .filter(|r| held.get(&r.name).map(|h| &h.version) != Some(&r.version))
                .map(|r| r.name.as_str())
                .collect();
            let expect_gone: Vec<&str> = held
                .keys()
                .filter(|n| !desired.contains_key(*n))
                .map(String::as_str)
                .collect();
            assert_eq!(changed, expect_changed);
            assert_eq!(gone, expect_gone);
            assert_eq!(
                names_within(&held, &desired),
                held.keys().all(|n| desired.contains_key(n))
            );
        });
        // The same map: nothing differs, without a look.
        let m = map(&[("a", "1")]);
        let (changed, gone) = names(&walk(&m, &m));
        assert!(changed.is_empty() && gone.is_empty());
        assert!(names_within(&m, &m) && names_within(&map(&[]), &m));
        assert!(!names_within(&map(&[("b", "1")]), &m));
    }
}
