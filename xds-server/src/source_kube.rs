//! Kubernetes source: watches Services, EndpointSlices, Pods, ServiceEntries, EnvoyFilters and
//! Sidecars of the tenant's member namespaces and its control namespace, and reports the
//! instance's connected proxy count (contract 3).
//!
//! Strict isolation reads only what namespace-scoped RoleBindings allow: the members ConfigMap
//! (contract 2) in the control namespace, then one watcher per kind per member namespace,
//! started and stopped as members change. Shared isolation runs cluster-wide watchers and
//! filters in process. `kube::runtime::watcher` relists on 410 Gone and reconnects; each
//! relist becomes `Resync` + `Upsert`s + `Synced`, delivered as one uninterrupted batch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use meshplane_contracts::members::{self, MembersData};
use meshplane_contracts::proxies::{self, MembersStale};
use meshplane_contracts::ContractError;
use meshplane_crds::controlplane::GatewayDeployment;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::kinds::{NamespacedKindVisitor, NamespacedObject, Read};
use crate::metrics::Metrics;
use crate::model::{Kind, Object, ObjectKey, SourceEvent};

/// What the Kubernetes source watches.
#[derive(Clone, Debug)]
pub struct KubeSourceConfig {
    pub tenant: String,
    pub control_namespace: String,
    pub revision: String,
    /// Shared isolation: cluster-wide watchers filtered in process, reading only the listed
    /// members that membership confirms ([`crate::shared_members`]).
    pub shared: bool,
    /// Where `members_stale` and `members_unverified` are reported.
    pub metrics: Arc<Metrics>,
    /// Whether, since when and why the members in use are stale: what
    /// [`report_proxy_count`] applies next to the count (contract 3).
    pub members_stale: watch::Sender<Option<MembersStale>>,
}

/// The members ConfigMap's content (contract 2), or why it breaks the contract.
pub fn read_members(cm: &ConfigMap) -> Result<MembersData, ContractError> {
    MembersData::from_data(cm.data.as_ref().unwrap_or(&BTreeMap::new()))
}

/// Follows the members ConfigMap (contract 2) and fails safe. Once members are known, a
/// deleted, missing or unreadable ConfigMap (or a relist that fails) keeps them (nobody is
/// evicted and no connected proxy loses its config) and marks them stale, with since when and
/// why, which the instance reports to the operator (contract 3, the `MembersStale` condition);
/// only a readable ConfigMap changes them. Before any is known, an absent one means no
/// members, so a new revision still becomes ready.
#[derive(Debug, Default)]
pub struct MembersFollower {
    /// During a relist: the readable content seen so far, or why none is.
    relist: Option<Result<BTreeSet<String>, String>>,
    known: Option<BTreeSet<String>>,
    /// Why the known members are kept although the ConfigMap says otherwise, and since when.
    stale: Option<MembersStale>,
}

impl MembersFollower {
    /// Folds one watch event; returns the members when they change.
    pub fn on_event(&mut self, event: Event<ConfigMap>) -> Option<BTreeSet<String>> {
        self.on_event_at(event, now_rfc3339())
    }

    /// [`Self::on_event`] at `now` (RFC 3339), the time a stale mark starts.
    pub fn on_event_at(
        &mut self,
        event: Event<ConfigMap>,
        now: String,
    ) -> Option<BTreeSet<String>> {
        match event {
            Event::Init => {
                self.relist = Some(Err("the members ConfigMap does not exist".into()));
                None
            }
            Event::InitApply(cm) => {
                self.relist = Some(read(&cm));
                None
            }
            Event::InitDone => {
                let seen = self
                    .relist
                    .take()
                    .unwrap_or_else(|| Err("the members ConfigMap does not exist".into()));
                self.settle(seen, now)
            }
            Event::Apply(cm) => self.settle(read(&cm), now),
            Event::Delete(_) => self.settle(Err("the members ConfigMap was deleted".into()), now),
        }
    }

    /// Folds a watch error. Only a failed relist makes the members stale: the watcher recovers
    /// from it with a fresh list (which settles them again), while a watch that merely
    /// restarts resumes where it stopped and misses nothing.
    pub fn on_error(&mut self, error: &watcher::Error, now: String) {
        if let (watcher::Error::InitialListFailed(e), Some(known)) = (error, &self.known) {
            let why = format!("the members ConfigMap cannot be listed: {e}");
            tracing::warn!(reason = %why, kept = known.len(), "keeping the last known members");
            self.mark_stale(why, now);
        }
    }

    /// The members in use, once known.
    pub fn known(&self) -> Option<&BTreeSet<String>> {
        self.known.as_ref()
    }

    /// Why, and since when, the members in use are kept from before, if they are.
    pub fn stale(&self) -> Option<&MembersStale> {
        self.stale.as_ref()
    }

    fn mark_stale(&mut self, why: String, now: String) {
        match &mut self.stale {
            // Still stale: the mark keeps its start and takes the latest reason.
            Some(mark) => mark.reason = why,
            None => {
                self.stale = Some(MembersStale {
                    since: now,
                    reason: why,
                })
            }
        }
    }

    fn settle(
        &mut self,
        seen: Result<BTreeSet<String>, String>,
        now: String,
    ) -> Option<BTreeSet<String>> {
        match (seen, &self.known) {
            (Ok(members), _) => {
                self.stale = None;
                (self.known.as_ref() != Some(&members)).then(|| {
                    self.known = Some(members.clone());
                    members
                })
            }
            (Err(why), Some(known)) => {
                tracing::warn!(reason = %why, kept = known.len(), "members ConfigMap unusable: keeping the last known members");
                self.mark_stale(why, now);
                None
            }
            (Err(why), None) => {
                tracing::warn!(reason = %why, "no members ConfigMap yet: no members");
                self.stale = None;
                self.known = Some(BTreeSet::new());
                Some(BTreeSet::new())
            }
        }
    }
}

/// Now as RFC 3339 UTC, to the second.
fn now_rfc3339() -> String {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

fn read(cm: &ConfigMap) -> Result<BTreeSet<String>, String> {
    read_members(cm)
        .map(|m| m.members)
        .map_err(|e| format!("the members ConfigMap is unreadable: {e}"))
}

/// Member namespaces listed in the members ConfigMap (`data.members`, one per line); none when
/// it breaks contract 2 (logged).
pub fn parse_members(cm: &ConfigMap) -> BTreeSet<String> {
    read_members(cm)
        .map_err(|e| tracing::warn!(error = %e, "the members ConfigMap is unreadable"))
        .map(|m| m.members)
        .unwrap_or_default()
}

/// The revision's mesh config from the members ConfigMap (key `meshConfig`, JSON written by the
/// operator); `None` when absent or unreadable, so the instance keeps what it has.
pub fn parse_mesh_config(cm: &ConfigMap) -> Option<meshplane_crds::MeshConfig> {
    let text = cm.data.as_ref()?.get(members::MESH_CONFIG)?;
    serde_json::from_str(text)
        .map_err(
            |e| tracing::warn!(error = %e, "meshConfig in the members ConfigMap is unreadable"),
        )
        .ok()
}

/// The tenant's operator-run gateways from the members ConfigMap (key `gateways`, JSON written
/// by the operator); `None` when unreadable, so the instance keeps what it has.
pub fn parse_gateways(cm: &ConfigMap) -> Option<Vec<GatewayDeployment>> {
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(members::GATEWAYS)) else {
        return Some(Vec::new());
    };
    serde_json::from_str(text)
        .map_err(|e| tracing::warn!(error = %e, "gateways in the members ConfigMap are unreadable"))
        .ok()
}

type Batch = Vec<SourceEvent>;

/// Runs the source until `out` closes. Sends [`SourceEvent::Ready`] once the members and every
/// initial namespace watch have been listed, or refused (403): one namespace the instance may
/// not read never keeps the whole instance unready.
pub async fn run(client: Client, config: KubeSourceConfig, out: mpsc::Sender<SourceEvent>) {
    let (batch_tx, mut batch_rx) = mpsc::channel::<Batch>(256);
    // One writer keeps each relist batch contiguous on the output channel.
    let funnel = tokio::spawn(async move {
        while let Some(batch) = batch_rx.recv().await {
            for event in batch {
                if out.send(event).await.is_err() {
                    return;
                }
            }
        }
    });
    let (allowed_tx, allowed_rx) =
        watch::channel(BTreeSet::from([config.control_namespace.clone()]));
    let mut watchers: HashMap<Option<String>, Vec<JoinHandle<()>>> = HashMap::new();
    let mut initial: Vec<oneshot::Receiver<()>> = Vec::new();
    if config.shared {
        let handles = spawn_kind_watchers(
            &client,
            None,
            &batch_tx,
            Some(allowed_rx.clone()),
            &mut initial,
            &config.metrics,
        );
        watchers.insert(None, handles);
    }

    let members_api: Api<ConfigMap> = Api::namespaced(client.clone(), &config.control_namespace);
    let name = meshplane_crds::names::members_configmap(&config.revision);
    let selector = format!("metadata.name={name}");
    let mut stream = watcher(members_api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    let mut follower = MembersFollower::default();
    let mut members: Option<BTreeSet<String>> = None;
    let mut mesh_config: Option<meshplane_crds::MeshConfig> = None;
    let mut gateways: Option<Vec<GatewayDeployment>> = None;
    // TLS Secrets are read only where a gateway of the tenant runs (credentialName).
    let mut secret_watchers: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut tags: Option<BTreeSet<String>> = None;
    let mut ready_spawned = false;
    // Shared isolation: the members membership confirms (None until it has listed).
    let mut confirmed = config
        .shared
        .then(|| crate::shared_members::spawn(client.clone(), config.tenant.clone()));
    let mut unverified: BTreeSet<String> = BTreeSet::new();
    loop {
        let event = tokio::select! {
            event = stream.next() => match event {
                Some(event) => Some(event),
                None => break,
            },
            changed = async {
                match confirmed.as_mut() {
                    Some(rx) => rx.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                if changed.is_err() {
                    break;
                }
                None
            }
        };
        if let Some(event) = event {
            let seen_gateways = match &event {
                Ok(Event::InitApply(cm)) | Ok(Event::Apply(cm)) => parse_gateways(cm),
                _ => None,
            };
            if let Some(gws) = seen_gateways.filter(|g| gateways.as_ref() != Some(g)) {
                tracing::info!(gateways = gws.len(), "tenant gateways changed");
                let namespaces: BTreeSet<String> =
                    gws.iter().map(|g| g.namespace.clone()).collect();
                secret_watchers.retain(|ns, handle| {
                    let keep = namespaces.contains(ns);
                    if !keep {
                        handle.abort();
                    }
                    keep
                });
                for ns in namespaces {
                    if let std::collections::hash_map::Entry::Vacant(slot) =
                        secret_watchers.entry(ns)
                    {
                        let ns = slot.key().clone();
                        let (done_tx, _) = oneshot::channel();
                        let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
                        slot.insert(tokio::spawn(watch_kind::<Secret>(
                            api,
                            Some(ns),
                            Kind::Secret,
                            |o| Object::Secret(Box::new(o)),
                            batch_tx.clone(),
                            InitialListing::new(done_tx, Arc::clone(&config.metrics)),
                            None,
                        )));
                    }
                }
                gateways = Some(gws.clone());
                if batch_tx
                    .send(vec![SourceEvent::GatewayDeployments(gws)])
                    .await
                    .is_err()
                {
                    break;
                }
            }
            let seen_mesh = match &event {
                Ok(Event::InitApply(cm)) | Ok(Event::Apply(cm)) => parse_mesh_config(cm),
                _ => None,
            };
            if let Some(mc) = seen_mesh.filter(|mc| mesh_config.as_ref() != Some(mc)) {
                tracing::info!("revision mesh config changed");
                mesh_config = Some(mc.clone());
                if batch_tx
                    .send(vec![SourceEvent::MeshConfig(Box::new(mc))])
                    .await
                    .is_err()
                {
                    break;
                }
            }
            let seen_tags = match &event {
                Ok(Event::InitApply(cm)) | Ok(Event::Apply(cm)) => {
                    read_members(cm).ok().map(|m| m.tags)
                }
                _ => None,
            };
            if let Some(t) = seen_tags.filter(|t| tags.as_ref() != Some(t)) {
                tracing::info!(tags = ?t, "tags of the revision changed");
                tags = Some(t.clone());
                if batch_tx.send(vec![SourceEvent::Tags(t)]).await.is_err() {
                    break;
                }
            }
            match event {
                Ok(event) => {
                    follower.on_event(event);
                }
                Err(e) => {
                    tracing::warn!(error = %e, configmap = %name, "members watch failed, retrying");
                    follower.on_error(&e, now_rfc3339());
                }
            }
            config.metrics.set_members_stale(follower.stale().is_some());
            let mark = follower.stale().cloned();
            config.members_stale.send_if_modified(|old| {
                let differs = *old != mark;
                if differs {
                    *old = mark;
                }
                differs
            });
        }
        let Some(listed) = follower.known() else {
            continue;
        };
        let next = match confirmed.as_mut() {
            None => listed.clone(),
            Some(rx) => {
                let Some(confirmed) = rx.borrow_and_update().clone() else {
                    continue;
                };
                let (read, dropped) = crate::shared_members::verify(listed, &confirmed);
                if dropped != unverified {
                    if !dropped.is_empty() {
                        tracing::warn!(
                            namespaces = ?dropped,
                            "the members ConfigMap lists namespaces that are not the tenant's by their labels and the cluster's control planes and tags: not read"
                        );
                    }
                    config.metrics.set_members_unverified(dropped.len());
                    unverified = dropped;
                }
                read
            }
        };
        if members.as_ref() != Some(&next) {
            tracing::info!(members = ?next, "tenant members changed");
            if batch_tx
                .send(vec![SourceEvent::Members(next.clone())])
                .await
                .is_err()
            {
                break;
            }
            let mut allowed = next.clone();
            allowed.insert(config.control_namespace.clone());
            if !config.shared {
                watchers.retain(|ns, handles| {
                    let keep = ns.as_ref().is_some_and(|n| allowed.contains(n));
                    if !keep {
                        handles.iter().for_each(JoinHandle::abort);
                    }
                    keep
                });
                for ns in &allowed {
                    if let std::collections::hash_map::Entry::Vacant(slot) =
                        watchers.entry(Some(ns.clone()))
                    {
                        slot.insert(spawn_kind_watchers(
                            &client,
                            Some(ns),
                            &batch_tx,
                            None,
                            &mut initial,
                            &config.metrics,
                        ));
                    }
                }
            }
            allowed_tx.send_replace(allowed);
            members = Some(next);
        }
        if !ready_spawned && members.is_some() {
            ready_spawned = true;
            let waits = std::mem::take(&mut initial);
            let ready = batch_tx.clone();
            tokio::spawn(async move {
                for w in waits {
                    // A watcher stopped before listing (namespace left) counts as done.
                    let _ = w.await;
                }
                tracing::info!("Kubernetes source synced");
                // Behind every initial listing on the one ordered channel.
                let _ = ready.send(vec![SourceEvent::Ready]).await;
            });
        }
        initial.clear();
    }
    watchers.values().flatten().for_each(JoinHandle::abort);
    secret_watchers.values().for_each(JoinHandle::abort);
    funnel.abort();
}

fn spawn_kind_watchers(
    client: &Client,
    namespace: Option<&String>,
    out: &mpsc::Sender<Batch>,
    filter: Option<watch::Receiver<BTreeSet<String>>>,
    initial: &mut Vec<oneshot::Receiver<()>>,
    metrics: &Arc<Metrics>,
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
                listing: InitialListing::new(done_tx, Arc::clone(metrics)),
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
async fn watch_kind<K>(
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

/// A watch's first listing: readiness waits for it (`done`) until the watch lists or is
/// refused (403) before it could. A refused watch is counted in
/// `meshplane_xds_refused_watches` until it lists, or until it ends (a namespace that left,
/// a dropped task).
struct InitialListing {
    done: Option<oneshot::Sender<()>>,
    metrics: Arc<Metrics>,
    counted: bool,
}

impl InitialListing {
    fn new(done: oneshot::Sender<()>, metrics: Arc<Metrics>) -> Self {
        Self {
            done: Some(done),
            metrics,
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
            self.metrics.refused_watches(if refused { 1 } else { -1 });
            self.counted = refused;
        }
    }

    /// Refused before the first listing: readiness stops waiting, the watch is counted.
    fn refused(&mut self) {
        self.release();
        self.count(true);
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
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 403,
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    }
}

/// Server-side-applies this pod's connected proxy count into `meshplane-R-proxies` (contract
/// 3), and its members-stale mark while `stale` holds one, whenever either changes, until
/// `shutdown`. Applying without the mark removes it (server-side apply drops a key its
/// manager stops applying).
pub async fn report_proxy_count(
    client: Client,
    control_namespace: String,
    revision: String,
    pod_name: String,
    mut count: watch::Receiver<usize>,
    mut stale: watch::Receiver<Option<MembersStale>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &control_namespace);
    let name = proxies::configmap_name(&revision);
    let params = PatchParams::apply(&proxies::field_manager(&pod_name));
    let mut reported: Option<(usize, Option<MembersStale>)> = None;
    // Without a source (it ended), the count is still reported.
    let mut stale_open = true;
    loop {
        let current = (
            *count.borrow_and_update(),
            stale.borrow_and_update().clone(),
        );
        if reported.as_ref() != Some(&current) {
            let data = proxies::entries(&pod_name, current.0 as u64, current.1.as_ref());
            let patch = serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": name, "namespace": control_namespace },
                "data": data,
            });
            match api.patch(&name, &params, &Patch::Apply(&patch)).await {
                Ok(_) => reported = Some(current),
                Err(e) => {
                    tracing::warn!(error = %e, configmap = %name, "cannot report proxy count, retrying");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(2)) => continue,
                        () = crate::ads::stream::shutting_down(&mut shutdown) => return,
                    }
                }
            }
        }
        tokio::select! {
            changed = count.changed() => if changed.is_err() { return },
            changed = async {
                match stale_open {
                    true => stale.changed().await,
                    false => std::future::pending().await,
                }
            } => stale_open = changed.is_ok(),
            () = crate::ads::stream::shutting_down(&mut shutdown) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_config_is_read_from_the_members_configmap_and_bad_json_is_ignored() {
        let cm = |text: &str| ConfigMap {
            data: Some(
                [
                    (members::MEMBERS.to_string(), String::new()),
                    (members::MESH_CONFIG.to_string(), text.to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let mc = parse_mesh_config(&cm(r#"{"trustDomain":"green.mesh.local","outboundTrafficPolicy":{"mode":"REGISTRY_ONLY"}}"#))
            .expect("valid meshConfig");
        assert_eq!(mc.trust_domain.as_deref(), Some("green.mesh.local"));
        assert_eq!(
            mc.outbound_traffic_policy.mode,
            meshplane_crds::controlplane::OutboundTrafficMode::RegistryOnly
        );
        assert!(parse_mesh_config(&cm("{not json")).is_none());
        assert!(parse_mesh_config(&ConfigMap::default()).is_none());
    }

    #[test]
    fn members_are_read_line_by_line() {
        let cm = ConfigMap {
            data: Some([(members::MEMBERS.to_string(), "bank\n\n shop \n".to_string())].into()),
            ..Default::default()
        };
        assert_eq!(
            parse_members(&cm),
            BTreeSet::from(["bank".to_string(), "shop".to_string()])
        );
        assert!(parse_members(&ConfigMap::default()).is_empty());
    }

    fn members_cm(text: &str) -> ConfigMap {
        ConfigMap {
            data: Some([(members::MEMBERS.to_string(), text.to_string())].into()),
            ..Default::default()
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// Issue 16 item 3: a deleted, missing or unreadable members ConfigMap no longer empties
    /// the tenant; the last known members stay, marked stale, until a readable one arrives.
    #[test]
    fn a_deleted_or_unreadable_members_configmap_keeps_the_last_known_members() {
        let mut f = MembersFollower::default();
        f.on_event(Event::Init);
        f.on_event(Event::InitApply(members_cm("bank\nshop\n")));
        assert_eq!(f.on_event(Event::InitDone), Some(set(&["bank", "shop"])));
        assert_eq!(f.stale(), None);

        assert_eq!(f.on_event(Event::Delete(members_cm(""))), None, "kept");
        assert!(f.stale().is_some_and(|w| w.reason.contains("deleted")));
        // A relist that finds no ConfigMap keeps them too.
        f.on_event(Event::Init);
        assert_eq!(f.on_event(Event::InitDone), None);
        assert!(f
            .stale()
            .is_some_and(|w| w.reason.contains("does not exist")));
        // So does one that breaks the contract (no `members` key, a bad name).
        assert_eq!(f.on_event(Event::Apply(ConfigMap::default())), None);
        assert_eq!(
            f.on_event(Event::Apply(members_cm("Not A Namespace\n"))),
            None
        );
        assert!(f.stale().is_some_and(|w| w.reason.contains("unreadable")));

        // A readable one decides again, including "fewer members".
        assert_eq!(
            f.on_event(Event::Apply(members_cm("shop\n"))),
            Some(set(&["shop"]))
        );
        assert_eq!(f.stale(), None);
        assert_eq!(f.on_event(Event::Apply(members_cm(""))), Some(set(&[])));
    }

    #[test]
    fn without_any_members_configmap_a_new_revision_starts_with_no_members() {
        let mut f = MembersFollower::default();
        f.on_event(Event::Init);
        assert_eq!(f.on_event(Event::InitDone), Some(BTreeSet::new()));
        assert_eq!(f.stale(), None);
        assert_eq!(
            f.on_event(Event::Apply(members_cm("shop\n"))),
            Some(set(&["shop"]))
        );
    }

    /// The stale mark (contract 3) keeps the time it started while the members stay stale,
    /// takes the latest reason, and goes once a readable ConfigMap arrives; a relist that
    /// fails makes known members stale too, while a watch that merely restarts does not.
    #[test]
    fn a_stale_mark_keeps_its_start_and_a_failed_relist_marks_known_members() {
        let at = |s: &str| s.to_string();
        let mut f = MembersFollower::default();
        let forbidden = || {
            watcher::Error::InitialListFailed(kube::Error::Api(
                kube::core::Status::failure("configmaps is forbidden", "Forbidden")
                    .with_code(403)
                    .boxed(),
            ))
        };
        f.on_error(&forbidden(), at("2026-12-02T03:00:00Z"));
        assert_eq!(f.stale(), None, "nothing known, nothing kept");
        f.on_event_at(
            Event::Apply(members_cm("shop\n")),
            at("2026-12-02T03:01:00Z"),
        );
        f.on_event_at(Event::Delete(members_cm("")), at("2026-12-02T03:02:00Z"));
        f.on_event_at(
            Event::Apply(members_cm("Not A Namespace\n")),
            at("2026-12-02T03:03:00Z"),
        );
        let mark = f.stale().cloned().expect("stale");
        assert_eq!(mark.since, "2026-12-02T03:02:00Z");
        assert!(mark.reason.contains("unreadable"), "{mark:?}");
        f.on_event_at(
            Event::Apply(members_cm("shop\n")),
            at("2026-12-02T03:04:00Z"),
        );
        assert_eq!(f.stale(), None);

        f.on_error(
            &watcher::Error::WatchFailed(kube::Error::LinesCodecMaxLineLengthExceeded),
            at("2026-12-02T03:05:00Z"),
        );
        assert_eq!(f.stale(), None, "a restarted watch misses nothing");
        f.on_error(&forbidden(), at("2026-12-02T03:06:00Z"));
        let mark = f.stale().cloned().expect("stale after a failed relist");
        assert_eq!(mark.since, "2026-12-02T03:06:00Z");
        assert!(mark.reason.contains("cannot be listed"), "{mark:?}");
        assert_eq!(f.known(), Some(&set(&["shop"])), "kept");
        // The relist that succeeds settles them.
        f.on_event_at(Event::Init, at("2026-12-02T03:07:00Z"));
        f.on_event_at(
            Event::InitApply(members_cm("shop\n")),
            at("2026-12-02T03:07:00Z"),
        );
        f.on_event_at(Event::InitDone, at("2026-12-02T03:07:00Z"));
        assert_eq!(f.stale(), None);
        // What the reporter applies parses on the operator's side.
        let data = proxies::entries("xds-0", 2, Some(&mark));
        let counts = proxies::ProxyCounts::from_data(&data).expect("contract 3");
        assert_eq!(counts.members_stale.get("xds-0"), Some(&mark));
        assert!(proxies::MembersStale::from_value(&now_rfc3339()).is_ok());
    }
}
