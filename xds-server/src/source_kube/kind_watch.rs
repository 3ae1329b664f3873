//! One watcher per kind: a relist becomes `Resync` + `Upsert`s + `Synced` in one batch, a
//! first listing releases readiness ([`InitialListing`]), and Shared mode filters to the
//! members in process.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use meshplane_contracts::proxies::RefusedWatches;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::kinds::{NamespacedKindVisitor, NamespacedObject, Read};
use crate::metrics::Metrics;
use crate::model::{Kind, Object, ObjectKey, SourceEvent};

/// Events that go onto the source's output together (a relist is one batch).
pub(super) type Batch = Vec<SourceEvent>;

/// Starts the watchers of every kind read per member namespace, in `namespace` (or
/// cluster-wide, filtered by `filter`); each first listing's release is pushed onto `initial`.
pub(super) fn spawn_kind_watchers(
    client: &Client,
    namespace: Option<&String>,
    out: &mpsc::Sender<Batch>,
    filter: Option<watch::Receiver<BTreeSet<String>>>,
    initial: &mut Vec<oneshot::Receiver<()>>,
    refusals: &Arc<Refusals>,
) -> Vec<JoinHandle<()>> {
    Kind::ALL
        .iter()
        .filter(|kind| kind.read() == Read::MemberNamespaces)
        .filter_map(|kind| {
            let (done_tx, done_rx) = oneshot::channel();
            initial.push(done_rx);
            kind.visit_namespaced(SpawnWatcher {
                client,
                namespace,
                out,
                filter: filter.clone(),
                listing: InitialListing::new(done_tx, Arc::clone(refusals), namespace, *kind),
            })
        })
        .collect()
}

/// Starts the watcher of one kind in one namespace (or cluster-wide, filtered).
struct SpawnWatcher<'a> {
    client: &'a Client,
    namespace: Option<&'a String>,
    out: &'a mpsc::Sender<Batch>,
    filter: Option<watch::Receiver<BTreeSet<String>>>,
    listing: InitialListing,
}

impl NamespacedKindVisitor for SpawnWatcher<'_> {
    type Output = JoinHandle<()>;
    fn visit<T: NamespacedObject>(self) -> JoinHandle<()> {
        let api = match self.namespace {
            Some(ns) => Api::<T>::namespaced(self.client.clone(), ns),
            None => Api::<T>::all(self.client.clone()),
        };
        tokio::spawn(watch_kind::<T>(
            api,
            self.namespace.cloned(),
            T::KIND,
            T::into_object,
            self.out.clone(),
            self.listing,
            self.filter,
        ))
    }
}

fn key_of<K: ResourceExt>(kind: Kind, o: &K) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: o.namespace(),
        name: o.name_any(),
    }
}

/// One watcher of one kind (in one namespace, or cluster-wide filtered by `filter`).
pub(super) async fn watch_kind<K>(
    api: Api<K>,
    namespace: Option<String>,
    kind: Kind,
    wrap: fn(K) -> Object,
    out: mpsc::Sender<Batch>,
    mut listing: InitialListing,
    mut filter: Option<watch::Receiver<BTreeSet<String>>>,
) where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut buffer: Batch = Vec::new();
    // Shared mode: everything seen, so a namespace that joins gets its objects at once.
    let mut cache: BTreeMap<ObjectKey, K> = BTreeMap::new();
    let mut allowed: BTreeSet<String> = filter
        .as_mut()
        .map(|f| f.borrow_and_update().clone())
        .unwrap_or_default();
    let visible = |allowed: &BTreeSet<String>, key: &ObjectKey, shared: bool| {
        !shared || key.namespace.as_ref().is_some_and(|n| allowed.contains(n))
    };
    let shared = filter.is_some();
    loop {
        let event = tokio::select! {
            event = stream.next() => match event {
                Some(e) => e,
                None => break,
            },
            changed = async {
                match filter.as_mut() {
                    Some(f) => f.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                if changed.is_err() {
                    break;
                }
                let next = filter.as_mut().map(|f| f.borrow_and_update().clone()).unwrap_or_default();
                let joined: Batch = cache
                    .iter()
                    .filter(|(k, _)| visible(&next, k, true) && !visible(&allowed, k, true))
                    .map(|(_, o)| SourceEvent::Upsert(wrap(o.clone())))
                    .collect();
                allowed = next;
                if !joined.is_empty() && out.send(joined).await.is_err() {
                    break;
                }
                continue;
            }
        };
        let batch = match event {
            Ok(Event::Init) => {
                cache.clear();
                buffer = vec![SourceEvent::Resync {
                    namespace: namespace.clone(),
                    kinds: vec![kind],
                }];
                continue;
            }
            Ok(Event::InitApply(o)) => {
                let key = key_of(kind, &o);
                if visible(&allowed, &key, shared) {
                    buffer.push(SourceEvent::Upsert(wrap(o.clone())));
                }
                if shared {
                    cache.insert(key, o);
                }
                continue;
            }
            Ok(Event::InitDone) => {
                buffer.push(SourceEvent::Synced);
                std::mem::take(&mut buffer)
            }
            Ok(Event::Apply(o)) => {
                let key = key_of(kind, &o);
                let show = visible(&allowed, &key, shared);
                let event = SourceEvent::Upsert(wrap(o.clone()));
                if shared {
                    cache.insert(key, o);
                }
                if !show {
                    continue;
                }
                vec![event]
            }
            Ok(Event::Delete(o)) => {
                let key = key_of(kind, &o);
                cache.remove(&key);
                if !visible(&allowed, &key, shared) {
                    continue;
                }
                vec![SourceEvent::Delete(key)]
            }
            Err(e) => {
                // Refused outright (a member namespace's admin removed the instance's reader
                // binding, say): readiness does not wait for it. The instance serves what it
                // can read; this kind of that namespace follows once the watch lists.
                if listing.pending() && is_forbidden(&e) {
                    tracing::warn!(
                        ?kind,
                        namespace = ?namespace,
                        error = %e,
                        "not allowed to list: serving without it until access returns"
                    );
                    listing.refused();
                } else if listing.pending() && is_not_served(&e) {
                    // The API server does not serve the kind: its CRD is not installed (the
                    // Gateway API is optional). Nothing of it exists to wait for; the watch
                    // keeps retrying and lists once the CRD appears.
                    tracing::info!(
                        ?kind,
                        namespace = ?namespace,
                        "kind not served by the API server (CRD not installed): serving without it"
                    );
                    listing.release();
                } else {
                    tracing::warn!(?kind, namespace = ?namespace, error = %e, "watch failed, retrying");
                }
                continue;
            }
        };
        let listed = matches!(batch.last(), Some(SourceEvent::Synced));
        if out.send(batch).await.is_err() {
            break;
        }
        if listed {
            listing.listed();
        }
    }
}

/// The watches refused now (one kind in one namespace, `None`: cluster-wide), counted in
/// `meshplane_xds_refused_watches` and published as the refused-watches mark that
/// [`crate::report::proxy_count`] applies next to the count (contract 3).
pub(super) struct Refusals {
    metrics: Arc<Metrics>,
    /// How many running watchers of each (namespace, kind) are refused now.
    refused: Mutex<BTreeMap<(Option<String>, Kind), usize>>,
    out: watch::Sender<Option<RefusedWatches>>,
}

impl Refusals {
    pub(super) fn new(metrics: Arc<Metrics>, out: watch::Sender<Option<RefusedWatches>>) -> Self {
        Self {
            metrics,
            refused: Mutex::new(BTreeMap::new()),
            out,
        }
    }

    /// One watcher of `kind` in `namespace` is refused now (`true`) or no longer (`false`).
    fn set(&self, namespace: &Option<String>, kind: Kind, refused: bool) {
        self.metrics.refused_watches(if refused { 1 } else { -1 });
        let mut all = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.clone(), kind);
        if refused {
            *all.entry(key).or_default() += 1;
        } else if let Some(n) = all.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                all.remove(&key);
            }
        }
        let mark = RefusedWatches::of(
            all.keys()
                .map(|(ns, kind)| (ns.as_deref(), kind.unique_name())),
        );
        self.out.send_if_modified(|old| {
            let differs = *old != mark;
            if differs {
                *old = mark;
            }
            differs
        });
    }
}

/// A watch's first listing: readiness waits for it (`done`) until the watch lists or is
/// refused (403) before it could. A refused watch is counted in
/// `meshplane_xds_refused_watches` and named in the refused-watches mark ([`Refusals`]) until
/// it lists, or until it ends (a namespace that left, a dropped task).
pub(super) struct InitialListing {
    done: Option<oneshot::Sender<()>>,
    refusals: Arc<Refusals>,
    namespace: Option<String>,
    kind: Kind,
    counted: bool,
}

impl InitialListing {
    pub(super) fn new(
        done: oneshot::Sender<()>,
        refusals: Arc<Refusals>,
        namespace: Option<&String>,
        kind: Kind,
    ) -> Self {
        Self {
            done: Some(done),
            refusals,
            namespace: namespace.cloned(),
            kind,
            counted: false,
        }
    }

    /// Whether readiness still waits for the first listing.
    fn pending(&self) -> bool {
        self.done.is_some()
    }

    fn release(&mut self) {
        if let Some(done) = self.done.take() {
            // Readiness may have stopped waiting (the source ended): nothing to tell.
            let _ = done.send(());
        }
    }

    fn count(&mut self, refused: bool) {
        if refused != self.counted {
            self.refusals.set(&self.namespace, self.kind, refused);
            self.counted = refused;
        }
    }

    /// Refused before the first listing: the watch is counted, then readiness stops waiting
    /// (so `Ready` comes after the refusal is published).
    fn refused(&mut self) {
        self.count(true);
        self.release();
    }

    /// Listed (or listed again after a refusal).
    fn listed(&mut self) {
        self.release();
        self.count(false);
    }
}

impl Drop for InitialListing {
    fn drop(&mut self) {
        self.count(false);
    }
}

/// Whether a watch failed because the API server refuses the instance (403), as opposed to a
/// transient failure.
fn is_forbidden(e: &watcher::Error) -> bool {
    status_code(e) == Some(403)
}

/// Whether a watch failed because the API server does not serve the resource (404 on the
/// list: no CRD for it).
fn is_not_served(e: &watcher::Error) -> bool {
    status_code(e) == Some(404)
}

fn status_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
        watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    }
}
