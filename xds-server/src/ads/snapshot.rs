//! A proxy's rendered configuration as the ADS streams see it: resources per type, keyed by
//! name, with a content-hash version per type.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

pub use super::map_diff::ResourceMap;
use super::map_diff::{from_changes, names_within, walk, MapDiff};
use super::payload::{AnyFields, Resources};
use crate::model::{list_key, same_resources, type_url, ListKey, ProxyConfig, Resource};
// Content hashing is the core's; re-exported here for the ADS code.
pub use meshplane_xds_core::hash::{content_version, hex, PairHasher};

/// Number of resource types served over ADS.
pub const TYPE_COUNT: usize = type_url::ORDER.len();

/// Position of a type URL in push order, if it is one we serve.
pub fn type_index(type_url: &str) -> Option<usize> {
    type_url::ORDER.iter().position(|t| *t == type_url)
}

/// Position of route configurations in [`type_url::ORDER`].
pub const RDS: usize = 3;
/// Position of virtual hosts (VHDS) in [`type_url::ORDER`].
pub const VHDS: usize = 4;

/// Short name of a type for metrics and logs (`cds`, `eds`, `lds`, `rds`, `vhds`).
pub fn short_name(index: usize) -> &'static str {
    ["cds", "eds", "lds", "rds", "vhds"]
        .get(index)
        .copied()
        .unwrap_or("unknown")
}

/// Content hash of a set of resources: sha256 over sorted `(name, version)` pairs, so it is
/// the same for the same content in every process and across restarts.
pub fn set_version<'a>(resources: impl IntoIterator<Item = &'a Arc<Resource>>) -> String {
    let mut pairs: Vec<(&str, &str)> = resources
        .into_iter()
        .map(|r| (r.name.as_str(), r.version.as_str()))
        .collect();
    if !pairs.is_sorted() {
        pairs.sort_unstable();
    }
    let mut hasher = PairHasher::default();
    for (name, version) in pairs {
        hasher.pair(name, version);
    }
    hasher.finish()
}

/// The resources of one type for one proxy. Built once per rendered config and shared (by
/// `Arc`) by every stream and snapshot holding the same content, so the per-type hash is
/// computed once, not per stream wake-up.
#[derive(Clone, Debug, Default)]
pub struct TypeSnapshot {
    pub resources: Arc<ResourceMap>,
    /// [`set_version`] of `resources`.
    pub version: String,
    /// Encoded bytes of the resources.
    pub bytes: usize,
    /// What changed since the snapshot of the type this one succeeded in its scope.
    since: Option<Since>,
    /// The resources framed for a SotW response, once a stream sent them all; shared by the
    /// snapshots of the same map.
    any_fields: Arc<OnceLock<Arc<AnyFields>>>,
}

/// The names that differ between a type snapshot and its predecessor: computed once per push
/// and type, so that the streams holding the predecessor need not each walk both.
#[derive(Clone, Debug)]
struct Since {
    /// The predecessor's resources. Weak: a snapshot does not keep the one it replaced alive,
    /// and the allocation outlives the map while this lives, so no other map takes its address.
    base: Weak<ResourceMap>,
    /// Names added or changed (in `resources`) or removed (not in them), in name order.
    changed: Vec<String>,
}

impl PartialEq for TypeSnapshot {
    /// Same content; how it was reached does not matter.
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version && self.resources == other.resources
    }
}

impl Eq for TypeSnapshot {}

impl TypeSnapshot {
    /// The snapshot of a resource list.
    pub fn new(list: &[Arc<Resource>]) -> Self {
        let resources: ResourceMap = list
            .iter()
            .map(|r| (r.name.clone(), Arc::clone(r)))
            .collect();
        let version = set_version(resources.values());
        let bytes = resources.values().map(|r| r.encoded.len()).sum();
        Self {
            resources: Arc::new(resources),
            version,
            bytes,
            since: None,
            any_fields: Arc::default(),
        }
    }

    /// Every resource, framed for a SotW response on first use and then shared by every
    /// stream that sends them all ([`super::payload`]).
    pub fn whole(&self) -> Resources {
        let fields = self
            .any_fields
            .get_or_init(|| Arc::new(super::frames::any_fields(self.resources.values())));
        Resources::Whole(Arc::clone(&self.resources), Arc::clone(fields))
    }

    /// The same content, recording what changed since `previous`.
    fn succeeding(mut self, previous: &TypeSnapshot) -> Self {
        let diff = walk(&previous.resources, &self.resources);
        let mut changed: Vec<String> = diff
            .changed
            .iter()
            .map(|r| r.name.clone())
            .chain(diff.gone.iter().map(|(n, _)| (*n).clone()))
            .collect();
        changed.sort_unstable();
        self.since = Some(Since {
            base: Arc::downgrade(&previous.resources),
            changed,
        });
        self
    }

    /// The names added, changed or removed since `held`, if `held` is the very map of the
    /// snapshot this one succeeded (none if it is this one's own).
    pub fn changed_since(&self, held: &Arc<ResourceMap>) -> Option<&[String]> {
        if Arc::ptr_eq(held, &self.resources) {
            return Some(&[]);
        }
        let since = self.since.as_ref()?;
        std::ptr::eq(since.base.as_ptr(), Arc::as_ptr(held)).then_some(since.changed.as_slice())
    }

    /// Whether this snapshot was built from exactly these resources (the same `Arc`s, in name
    /// order): then it can be reused without hashing anything.
    pub fn built_from(&self, list: &[Arc<Resource>]) -> bool {
        same_resources(self.resources.values(), list)
    }
}

/// How `held` differs from `target`. From the names `desired` records as changed when `target`
/// is its resources and `held` its predecessor's (the usual case of a stream that took the
/// last snapshot whole); by [`walk`] otherwise.
pub fn diff<'a>(
    held: &'a Arc<ResourceMap>,
    target: &'a Arc<ResourceMap>,
    desired: &TypeSnapshot,
) -> MapDiff<'a> {
    if Arc::ptr_eq(target, &desired.resources) {
        if let Some(names) = desired.changed_since(held) {
            #[cfg(test)]
            super::map_diff::tests::count_diff_from_changes();
            return from_changes(held, target, names);
        }
    }
    walk(held, target)
}

/// Type snapshots built during one push, found again by the resources they were built from.
///
/// Scopes often hold the same resources of a type: every unscoped namespace has the same
/// clusters and assignments, interned to the same `Arc`s. Without the memo each scope built its
/// own map and hash of them (in a 10,000-service tenant of 20 namespaces, 20 maps of 10,000
/// entries per type at every change); with it they share one.
#[derive(Debug, Default)]
pub struct TypeMemo {
    /// By length and the addresses of the first and last resource; the candidates are then
    /// compared in full ([`TypeSnapshot::built_from`]). The snapshots hold the resources, so
    /// no address is reused while the memo lives.
    built: HashMap<ListKey, Vec<Arc<TypeSnapshot>>>,
}

impl TypeMemo {
    /// The snapshot of `list` succeeding `previous`: one built before from the same resources
    /// (its map and hash shared), else a new one. Scopes with another predecessor get their own
    /// record of what changed, around the shared map.
    pub fn snapshot(
        &mut self,
        list: &[Arc<Resource>],
        previous: Option<&TypeSnapshot>,
    ) -> Arc<TypeSnapshot> {
        let candidates = self.built.entry(list_key(list)).or_default();
        let base = previous.map(|p| Arc::as_ptr(&p.resources));
        let mut same_resources = None;
        for t in candidates.iter().filter(|t| t.built_from(list)) {
            let t_base = t.since.as_ref().map(|s| s.base.as_ptr());
            if t_base == base {
                return Arc::clone(t);
            }
            same_resources = Some(t);
        }
        let built = match same_resources {
            Some(t) => TypeSnapshot {
                resources: Arc::clone(&t.resources),
                version: t.version.clone(),
                bytes: t.bytes,
                since: None,
                any_fields: Arc::clone(&t.any_fields),
            },
            None => TypeSnapshot::new(list),
        };
        let t = Arc::new(match previous {
            Some(p) => built.succeeding(p),
            None => built,
        });
        candidates.push(Arc::clone(&t));
        t
    }
}

/// Whether every assignment of `types` names one of its clusters. From what changed since
/// `previous` when that held there: each assignment added or changed names a cluster, and no
/// cluster removed has an assignment (a look per changed name); by a walk otherwise.
fn endpoints_within_clusters(
    types: &[Arc<TypeSnapshot>; TYPE_COUNT],
    previous: Option<&Snapshot>,
) -> bool {
    let (clusters, endpoints) = (&types[0], &types[1]);
    if let Some(p) = previous.filter(|p| p.endpoints_within_clusters) {
        let e = endpoints.changed_since(&p.types[1].resources);
        let c = clusters.changed_since(&p.types[0].resources);
        if let (Some(e), Some(c)) = (e, c) {
            return e.iter().all(|n| {
                !endpoints.resources.contains_key(n) || clusters.resources.contains_key(n)
            }) && c.iter().all(|n| {
                clusters.resources.contains_key(n) || !endpoints.resources.contains_key(n)
            });
        }
    }
    names_within(&endpoints.resources, &clusters.resources)
}

/// A proxy's whole configuration, indexed by push order ([`type_url::ORDER`]): routes inline
/// in `types[RDS]`, as VHDS clients get them in `vhds_routes` beside the virtual hosts of
/// `types[VHDS]` ([`crate::model::VhdsRoutes`]).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub types: [Arc<TypeSnapshot>; TYPE_COUNT],
    /// Route configurations for VHDS clients: the same `Arc` as `types[RDS]` when the
    /// configuration has no VHDS form.
    pub vhds_routes: Arc<TypeSnapshot>,
    /// When the change that produced this snapshot was first seen (push latency).
    pub changed_at: Instant,
    /// Total encoded bytes of the configuration with its routes inline.
    pub bytes: usize,
    /// Which configuration generation of the hub it was rendered from (None: not rendered).
    pub epoch: Option<u64>,
    /// Whether every ClusterLoadAssignment names a cluster of the snapshot (translation keeps
    /// it so; a stream then need not check what it offers on EDS against what CDS sent).
    pub endpoints_within_clusters: bool,
}

impl Snapshot {
    /// Builds the snapshot of a rendered configuration.
    pub fn new(config: &ProxyConfig, changed_at: Instant) -> Self {
        Self::reusing(config, changed_at, None)
    }

    /// Like [`Snapshot::new`], taking each type from `previous` when it was built from the
    /// same resources.
    pub fn reusing(config: &ProxyConfig, changed_at: Instant, previous: Option<&Snapshot>) -> Self {
        Self::reusing_in(config, changed_at, previous, &mut TypeMemo::default())
    }

    /// Like [`Snapshot::reusing`], taking each type that `previous` does not hold from `memo`
    /// (the types built so far in this push), where it is built otherwise.
    pub fn reusing_in(
        config: &ProxyConfig,
        changed_at: Instant,
        previous: Option<&Snapshot>,
        memo: &mut TypeMemo,
    ) -> Self {
        let types: [Arc<TypeSnapshot>; TYPE_COUNT] = std::array::from_fn(|i| {
            let list = config.of_type(type_url::ORDER[i]);
            match previous.map(|p| &p.types[i]) {
                Some(t) if t.built_from(list) => Arc::clone(t),
                previous => memo.snapshot(list, previous.map(|t| &**t)),
            }
        });
        let vhds_routes = match (&config.vhds, previous) {
            (None, _) => Arc::clone(&types[RDS]),
            (Some(v), Some(p)) if p.vhds_routes.built_from(&v.routes) => Arc::clone(&p.vhds_routes),
            (Some(v), p) => memo.snapshot(&v.routes, p.map(|p| &*p.vhds_routes)),
        };
        Self::from_types(types, vhds_routes, changed_at, None, previous)
    }

    /// A snapshot of already built types.
    fn from_types(
        types: [Arc<TypeSnapshot>; TYPE_COUNT],
        vhds_routes: Arc<TypeSnapshot>,
        changed_at: Instant,
        epoch: Option<u64>,
        previous: Option<&Snapshot>,
    ) -> Self {
        let bytes = types[..VHDS].iter().map(|t| t.bytes).sum();
        let endpoints_within_clusters = endpoints_within_clusters(&types, previous);
        Self {
            types,
            vhds_routes,
            changed_at,
            bytes,
            epoch,
            endpoints_within_clusters,
        }
    }

    /// The same configuration with other endpoints (an endpoint-only push).
    pub fn with_endpoints(&self, endpoints: Arc<TypeSnapshot>, changed_at: Instant) -> Self {
        let mut types = self.types.clone();
        types[1] = endpoints;
        Self::from_types(
            types,
            Arc::clone(&self.vhds_routes),
            changed_at,
            self.epoch,
            Some(self),
        )
    }

    /// What a stream should hold of type `index` (position in [`type_url::ORDER`]); `vhds`:
    /// the stream takes virtual hosts over VHDS.
    pub fn desired(&self, index: usize, vhds: bool) -> &Arc<TypeSnapshot> {
        if vhds && index == RDS {
            &self.vhds_routes
        } else {
            &self.types[index]
        }
    }

    /// The same content, timed from `changed_at` (a proxy's first response shares the types
    /// of the snapshot its scope already has).
    pub fn retimed(&self, changed_at: Instant) -> Self {
        Self {
            changed_at,
            ..self.clone()
        }
    }

    /// An empty configuration (before the sources synced).
    pub fn empty() -> Self {
        Self::new(&ProxyConfig::default(), Instant::now())
    }

    /// Whether both snapshots hold the same content.
    pub fn same_content(&self, other: &Snapshot) -> bool {
        self.vhds_routes.version == other.vhds_routes.version
            && self
                .types
                .iter()
                .zip(other.types.iter())
                .all(|(a, b)| a.version == b.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::map_diff::tests::{diffs_from_changes, names, pick};
    use meshplane_xds_core::test_choices::for_choices;
    use meshplane_xds_core::testing::mk_resource;
    use std::cell::Cell;

    fn res(name: &str, body: &[u8]) -> Arc<Resource> {
        mk_resource(type_url::CLUSTER, name, body.to_vec())
    }

    #[test]
    fn set_version_is_order_independent_and_content_sensitive() {
        let a = res("a", b"1");
        let b = res("b", b"2");
        assert_eq!(set_version([&a, &b]), set_version([&b, &a]));
        assert_ne!(set_version([&a, &b]), set_version([&a, &res("b", b"3")]));
        assert_ne!(set_version([&a]), set_version([&a, &b]));
        // Known value: stable across processes and restarts.
        assert_eq!(
            set_version(std::iter::empty()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    /// Whether every assignment names a cluster, found from the changes since the previous
    /// snapshot, is what a walk finds, along random sequences of configurations.
    #[test]
    fn endpoints_within_clusters_follows_the_changes() {
        let names = ["a", "b", "c", "d", "e", "f"];
        let derived = Cell::new(0);
        for_choices(100, 1024, |mut rng| {
            let mut pick = |keep: &[Arc<Resource>]| -> Vec<Arc<Resource>> {
                names
                    .iter()
                    .filter_map(|n| {
                        let roll = rng.below(10);
                        let held = keep.iter().find(|r| r.name == *n);
                        match (roll, held) {
                            (0..=5, Some(r)) => Some(Arc::clone(r)),
                            (0..=2, None) | (6..=7, _) => Some(res(n, &[b'0' + (roll as u8)])),
                            _ => None,
                        }
                    })
                    .collect()
            };
            let mut config = ProxyConfig::default();
            let mut snapshot = Snapshot::new(&config, Instant::now());
            for step in 0..30 {
                config = ProxyConfig {
                    clusters: pick(&config.clusters),
                    endpoints: pick(&config.endpoints),
                    ..ProxyConfig::default()
                };
                let previous_within = snapshot.endpoints_within_clusters;
                snapshot = if step % 7 == 0 {
                    Snapshot::new(&config, Instant::now())
                } else {
                    Snapshot::reusing(&config, Instant::now(), Some(&snapshot))
                };
                derived.set(derived.get() + usize::from(previous_within && step % 7 != 0));
                let walked =
                    names_within(&snapshot.types[1].resources, &snapshot.types[0].resources);
                assert_eq!(snapshot.endpoints_within_clusters, walked, "step {step}");
            }
        });
        let derived = derived.get();
        assert!(derived > 300, "{derived} derived");
    }

    #[test]
    fn scopes_of_a_push_share_the_types_built_from_the_same_resources() {
        let (a, b, c) = (res("a", b"1"), res("b", b"2"), res("c", b"3"));
        let scope = |endpoints: Vec<Arc<Resource>>| ProxyConfig {
            clusters: vec![Arc::clone(&a), Arc::clone(&b), Arc::clone(&c)],
            endpoints,
            ..ProxyConfig::default()
        };
        let mut memo = TypeMemo::default();
        let now = Instant::now();
        let one = Snapshot::reusing_in(&scope(vec![Arc::clone(&a)]), now, None, &mut memo);
        let two = Snapshot::reusing_in(&scope(vec![Arc::clone(&b)]), now, None, &mut memo);
        // The same clusters: one build; other assignments: their own.
        assert!(Arc::ptr_eq(&one.types[0], &two.types[0]));
        assert!(!Arc::ptr_eq(&one.types[1], &two.types[1]));
        assert_ne!(one.types[1].version, two.types[1].version);
        // Same length and ends but another resource between them: not taken for the same.
        let between = ProxyConfig {
            clusters: vec![Arc::clone(&a), res("b", b"9"), Arc::clone(&c)],
            ..ProxyConfig::default()
        };
        let three = Snapshot::reusing_in(&between, now, None, &mut memo);
        assert!(!Arc::ptr_eq(&one.types[0], &three.types[0]));
        assert_ne!(one.types[0].version, three.types[0].version);
        // Whatever the memo gives equals a build of its own.
        for (snapshot, config) in [(&one, scope(vec![Arc::clone(&a)])), (&three, between)] {
            let alone = Snapshot::new(&config, now);
            assert!(snapshot.types.iter().zip(&alone.types).all(|(x, y)| x == y));
        }
    }

    #[test]
    fn types_are_reused_only_when_built_from_the_same_resources() {
        let a = res("a", b"1");
        let b = res("b", b"2");
        let config = ProxyConfig {
            clusters: vec![Arc::clone(&a), Arc::clone(&b)],
            endpoints: vec![Arc::clone(&a)],
            ..ProxyConfig::default()
        };
        let first = Snapshot::new(&config, Instant::now());
        assert_eq!(first.types[0].version, set_version([&a, &b]));
        assert_eq!(first.bytes, 3);
        // Same content in other `Arc`s, or other content: rebuilt; the same `Arc`s: shared.
        let next = ProxyConfig {
            clusters: vec![Arc::clone(&a), res("b", b"2")],
            endpoints: vec![res("a", b"9")],
            ..config.clone()
        };
        let second = Snapshot::reusing(&next, Instant::now(), Some(&first));
        assert!(!Arc::ptr_eq(&first.types[0], &second.types[0]));
        assert_eq!(first.types[0], second.types[0]);
        assert_ne!(first.types[1].version, second.types[1].version);
        assert!(Arc::ptr_eq(&first.types[2], &second.types[2]));
        let third = Snapshot::reusing(&config, Instant::now(), Some(&first));
        assert!(third
            .types
            .iter()
            .zip(&first.types)
            .all(|(x, y)| Arc::ptr_eq(x, y)));
        assert!(third.same_content(&first) && !second.same_content(&first));
    }

    /// A successor's recorded changes give what a walk gives, and are used only against the
    /// very map it succeeded (not another with the same content).
    #[test]
    fn a_successor_diffs_from_its_changes_exactly_as_a_walk() {
        let before = diffs_from_changes();
        let steps = Cell::new(0);
        for_choices(100, 1024, |mut rng| {
            let mut previous = TypeSnapshot::new(&[]);
            for _ in 0..20 {
                let next_map = pick(&mut rng, &previous.resources);
                let list: Vec<Arc<Resource>> = next_map.values().cloned().collect();
                let next = TypeMemo::default().snapshot(&list, Some(&previous));
                let held = &previous.resources;
                assert_eq!(
                    names(&diff(held, &next.resources, &next)),
                    names(&walk(held, &next.resources))
                );
                // A copy of the predecessor holds the same content in another map: walked.
                let copy = Arc::new((**held).clone());
                assert!(next.changed_since(&copy).is_none());
                assert_eq!(
                    names(&diff(&copy, &next.resources, &next)),
                    names(&walk(&copy, &next.resources))
                );
                previous = (*next).clone();
                steps.set(steps.get() + 1);
            }
        });
        assert_eq!(diffs_from_changes() - before, steps.get());
    }
}
