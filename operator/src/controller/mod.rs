//! The kube-runtime controllers: one for `MeshControlPlane`, one for `MeshRevisionTag`, one for
//! `MeshRevisionMigration`, sharing one [`Context`].

mod access;
mod controlplane;
mod migration;
mod tag;
pub mod triggers;

use std::collections::HashMap;
use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use std::fmt::Debug;

use futures::{Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, reflector, ObjectRef, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::{finalizer, watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use meshplane_crds::membership::{self, ControlPlaneFacts, Membership, NamespaceFacts, TagFacts};
use meshplane_crds::{names, MeshControlPlane, MeshRevisionMigration, MeshRevisionTag};
use serde::de::DeserializeOwned;
use time::OffsetDateTime;
use tracing::{info, warn};

use crate::apply::{Applier, ApplyError};
use crate::metrics::Metrics;
use crate::tls::TlsError;

pub use controlplane::reconcile_control_plane;
pub use migration::reconcile_migration;
pub use tag::reconcile_tag;

/// Name of the controllers in Events and metrics.
pub const CONTROL_PLANE_CONTROLLER: &str = "meshcontrolplane";
pub const TAG_CONTROLLER: &str = "meshrevisiontag";
pub const MIGRATION_CONTROLLER: &str = "meshrevisionmigration";

/// Retry after a finalizer patch lost a race with the controller's own previous write.
const FINALIZER_RACE_RETRY: Duration = Duration::from_millis(500);

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("{action}: {source}")]
    Kube {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Ca(#[from] crate::ca::StoreError),
    #[error("serializing status: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("deletion waits: {pods} pod(s) injected by the revision still run")]
    InUse { pods: usize },
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    #[error("the controller's caches stopped")]
    CacheClosed,
}

impl Error {
    /// Short reason for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Apply(_) => "ApplyFailed",
            Error::Kube { .. } => "ApiError",
            Error::Tls(_) => "TlsIssueFailed",
            Error::Ca(_) => "TenantCaFailed",
            Error::Serialize(_) => "SerializeFailed",
            Error::InUse { .. } => "InUse",
            Error::CacheClosed => "CacheClosed",
            Error::Finalizer(e) => match e.as_ref() {
                finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => {
                    inner.reason()
                }
                _ => "FinalizerFailed",
            },
        }
    }

    pub(crate) fn kube(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Kube { action, source }
    }
}

/// Tunables of the controllers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Validity of issued webhook certificates.
    pub tls_validity: time::Duration,
    /// Periodic resync of every object (also catches certificate rotation deadlines).
    pub resync: Duration,
    /// How often a deletion blocked by running injected pods is retried.
    pub in_use_retry: Duration,
    /// Timing of the self-signed tenant roots' rotation.
    pub ca_rotation: meshplane_ca::rotation::RotationPolicy,
    /// The operator's ServiceAccount, bound per member namespace to restart workloads.
    pub operator_account: crate::render::OperatorAccount,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            tls_validity: crate::tls::DEFAULT_VALIDITY,
            resync: Duration::from_secs(300),
            in_use_retry: Duration::from_secs(15),
            ca_rotation: meshplane_ca::rotation::RotationPolicy::default(),
            operator_account: crate::render::OperatorAccount::default(),
        }
    }
}

/// The clock; injected so tests and rotation logic can control time.
pub type Clock = Arc<dyn Fn() -> OffsetDateTime + Send + Sync>;

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub applier: Applier,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub clock: Clock,
    /// Consecutive failures per object, for the error backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// Recent results of the revisions' webhook probes (`WebhooksReady`).
    pub probes: crate::webhook_probe::WebhookProbes,
    /// The control-plane controller's caches, once [`run`] started it; before that (tests,
    /// tools) reconciles list from the API server.
    caches: OnceLock<ClusterCaches>,
}

/// What membership is computed from, as the control-plane controller's reflectors hold it. Each
/// store is fed by the same watch that triggers reconciles on its changes, so a reconcile never
/// reads a store older than its trigger.
#[derive(Clone)]
pub struct ClusterCaches {
    pub control_planes: Store<MeshControlPlane>,
    pub tags: Store<MeshRevisionTag>,
    pub namespaces: Store<Namespace>,
    /// True once the tag and namespace stores have seen their first complete list (the control
    /// plane store is ready before any reconcile runs). Reconciles wait on this rather
    /// than on `Store::wait_until_ready`, whose one-shot channel wakes only the last of several
    /// concurrent waiters (the others would hang).
    pub ready: tokio::sync::watch::Receiver<bool>,
}

impl ClusterCaches {
    /// Caches over the three stores, and the task that marks them ready (the one waiter on
    /// the tag and namespace stores).
    pub fn new(
        control_planes: Store<MeshControlPlane>,
        tags: Store<MeshRevisionTag>,
        namespaces: Store<Namespace>,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        // The control plane store is not waited on here: the controller itself waits for its
        // main store before any reconcile, and a second waiter would take its wake-up.
        let stores = (tags.clone(), namespaces.clone());
        let mark_ready = async move {
            let (t, n) = stores;
            if t.wait_until_ready().await.is_ok() && n.wait_until_ready().await.is_ok() {
                let _ = ready_tx.send(true);
            }
        };
        let caches = Self {
            control_planes,
            tags,
            namespaces,
            ready,
        };
        (caches, mark_ready)
    }
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, settings: Settings, clock: Clock) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "meshplane-operator".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Self {
            applier: Applier::new(client.clone(), metrics.clone()),
            client,
            recorder,
            metrics,
            settings,
            clock,
            failures: Mutex::default(),
            probes: Default::default(),
            caches: OnceLock::new(),
        }
    }

    /// Membership and the objects it was computed from: from the caches when the controllers
    /// run (no API reads), else listed from the API server.
    pub async fn cluster_snapshot(&self) -> Result<Snapshot, Error> {
        match self.caches.get() {
            Some(caches) => caches.snapshot().await,
            None => snapshot(&self.client).await,
        }
    }

    /// `now` as a Kubernetes timestamp.
    pub fn now(&self) -> Time {
        let now = (self.clock)();
        Time(Timestamp::from_second(now.unix_timestamp()).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    /// Publishes an Event; a failure is logged, never fatal (Events are best effort).
    pub async fn event(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        match self.recorder.publish(&ev, reference).await {
            Ok(()) => self.metrics.record_write("Event", "create"),
            Err(e) => warn!(error = %e, reason, "publishing event failed"),
        }
    }

    fn backoff(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key.to_string()).or_default();
        *n = n.saturating_add(1);
        let secs = 5u64.saturating_mul(1u64 << (*n - 1).min(6));
        Duration::from_secs(secs.min(300))
    }

    fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// The cluster state membership is computed from.
pub struct Snapshot {
    pub control_planes: Vec<MeshControlPlane>,
    pub tags: Vec<MeshRevisionTag>,
    pub membership: Membership,
}

/// Lists control planes, tags and labelled namespaces, and computes membership.
pub async fn snapshot(client: &Client) -> Result<Snapshot, Error> {
    let control_planes = Api::<MeshControlPlane>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list MeshControlPlanes"))?
        .items;
    let tags = Api::<MeshRevisionTag>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list MeshRevisionTags"))?
        .items;
    // Every namespace: labelled ones can be members or rejected, and any may be named as a
    // control namespace.
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list Namespaces"))?
        .items;
    let by_name: HashMap<String, &Namespace> =
        namespaces.iter().map(|n| (n.name_any(), n)).collect();
    Ok(Snapshot::compute(
        control_planes,
        tags,
        namespace_facts(namespaces.iter()),
        |name| by_name.get(name).map(|n| facts_of(n)),
    ))
}

fn facts_of(n: &Namespace) -> NamespaceFacts {
    NamespaceFacts {
        name: n.name_any(),
        labels: n.labels().clone(),
    }
}

/// Membership inputs of the labelled namespaces (only they can be members or rejected).
fn namespace_facts<'a>(namespaces: impl Iterator<Item = &'a Namespace>) -> Vec<NamespaceFacts> {
    namespaces
        .filter(|n| n.labels().contains_key(names::REV_LABEL))
        .map(facts_of)
        .collect()
}

impl Snapshot {
    /// Membership, after dropping the control planes whose control namespace is not theirs
    /// to take (`control_namespace` finds a namespace by name): they claim nothing and evict
    /// nothing, and carry a `ControlNamespaceNotOwned` conflict instead.
    fn compute(
        control_planes: Vec<MeshControlPlane>,
        tags: Vec<MeshRevisionTag>,
        ns_facts: Vec<NamespaceFacts>,
        control_namespace: impl Fn(&str) -> Option<NamespaceFacts>,
    ) -> Self {
        let cp_facts: Vec<ControlPlaneFacts> =
            control_planes.iter().map(ControlPlaneFacts::from).collect();
        let tag_facts: Vec<TagFacts> = tags.iter().map(TagFacts::from).collect();
        let membership =
            membership::compute_guarded(&ns_facts, &cp_facts, &tag_facts, control_namespace);
        Snapshot {
            control_planes,
            tags,
            membership,
        }
    }
}

impl ClusterCaches {
    /// Membership from the stores, once each has seen its first complete list.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        let mut ready = self.ready.clone();
        match ready.wait_for(|ready| *ready).await {
            Ok(_) => {}
            Err(_) => return Err(Error::CacheClosed),
        }
        let namespaces = self.namespaces.state();
        Ok(Snapshot::compute(
            cloned(self.control_planes.state()),
            cloned(self.tags.state()),
            namespace_facts(namespaces.iter().map(Arc::as_ref)),
            |name| {
                self.namespaces
                    .get(&kube::runtime::reflector::ObjectRef::new(name))
                    .map(|n| facts_of(&n))
            },
        ))
    }
}

fn error_policy<K: Resource<DynamicType = ()>>(
    controller: &'static str,
) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |obj, err, ctx| {
        let key = format!(
            "{controller}/{}",
            obj.meta().name.clone().unwrap_or_default()
        );
        ctx.metrics.record_error(controller, err.reason());
        if err.reason() == "InUse" {
            return Action::requeue(ctx.settings.in_use_retry);
        }
        if let Error::Finalizer(e) = err {
            if matches!(
                e.as_ref(),
                finalizer::Error::AddFinalizer(_) | finalizer::Error::RemoveFinalizer(_)
            ) {
                // The cached object was older than our own finalizer write (its guard failed):
                // the watch catches up within moments, so retry soon, not with the backoff.
                return Action::requeue(FINALIZER_RACE_RETRY);
            }
        }
        let delay = ctx.backoff(&key);
        warn!(object = %key, error = %err, retry_in = ?delay, "reconcile failed");
        Action::requeue(delay)
    }
}

/// Runs both controllers until `shutdown` completes.
///
/// Every trigger watch backs off on its own (`trigger`, `owned`). kube-runtime's `Controller::new`
/// and `.owns()` put one shared backoff on the merged trigger stream instead: when all watches
/// fail together (every one gets 410 Gone after the API server compacts its history), each
/// watch's error grows that one backoff, and no trigger is polled for minutes.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let client = ctx.client.clone();
    let all = watcher::Config::default();
    let managed = watcher::Config::default().labels(&format!(
        "{}={}",
        names::MANAGED_BY_LABEL,
        names::MANAGED_BY_VALUE
    ));

    // The control-plane controller's caches (see `ClusterCaches`). Sibling control planes and
    // tags re-trigger every control plane only when their membership facts change, not on each
    // status write, or 100 control planes would reconcile each other 10,000 times.
    let (cp_store, cp_writer) = reflector::store::<MeshControlPlane>();
    let (tag_cache, tag_cache_writer) = reflector::store::<MeshRevisionTag>();
    let (ns_cache, ns_cache_writer) = reflector::store::<Namespace>();
    let (caches, mark_ready) = ClusterCaches::new(cp_store.clone(), tag_cache, ns_cache);
    let _ = ctx.caches.set(caches);
    let caches_ready = tokio::spawn(mark_ready);
    let (sibling_tx, sibling_rx) = futures::channel::mpsc::unbounded();
    let control_plane_events = reflector(cp_writer, watched::<MeshControlPlane>(&client, &all))
        .inspect(move |event| {
            if let Ok(event) = event {
                let _ = sibling_tx.unbounded_send(Ok(event.clone()));
            }
        });
    let cp_controller =
        Controller::for_stream(control_plane_events.applied_objects(), cp_store.clone());
    let ns_index = Arc::new(Mutex::new(triggers::NamespaceIndex::default()));
    let (store_for_ns, store_for_tags) = (cp_store.clone(), cp_store.clone());
    let store_for_pods = cp_store.clone();
    // Instance pods (metadata only): a pod that is gone takes its key of the proxies
    // ConfigMap out of status.connectedProxies (contract 3).
    let instance_pods = watcher::Config::default().labels("app.kubernetes.io/name=meshplane-xds");
    let cp_index = ns_index.clone();
    let control_planes = cp_controller
        .trigger_backoff(NoSharedBackoff)
        .watches_stream(owned::<ConfigMap>(&client, &managed), owning_control_plane)
        .watches_stream(owned::<Service>(&client, &managed), owning_control_plane)
        // RoleBindings cluster-wide; Secrets, ServiceAccounts, Deployments, PDBs and
        // NetworkPolicies only in the namespaces of the operator's access bindings (it holds
        // no cluster-wide right on them).
        .reconcile_on(access::owned_triggers(
            client.clone(),
            managed.clone(),
            ctx.settings.operator_account.clone(),
        ))
        .watches_stream(owned::<Pod>(&client, &instance_pods), move |pod| {
            control_plane_of_instance_pod(&pod, &store_for_pods.state())
        })
        .watches_stream(owned::<Role>(&client, &managed), owning_control_plane)
        .watches_stream(
            owned::<ClusterRole>(&client, &managed),
            owning_control_plane,
        )
        .watches_stream(
            owned::<ClusterRoleBinding>(&client, &managed),
            owning_control_plane,
        )
        .watches_stream(
            owned::<MutatingWebhookConfiguration>(&client, &managed),
            owning_control_plane,
        )
        .watches_stream(
            owned::<ValidatingWebhookConfiguration>(&client, &managed),
            owning_control_plane,
        )
        .watches_stream(
            reflector(ns_cache_writer, watched::<Namespace>(&client, &all)).touched_objects(),
            move |ns| {
                let mut index = cp_index.lock().unwrap_or_else(|p| p.into_inner());
                triggers::control_planes_for_namespace(&ns, &mut index, &store_for_ns.state())
            },
        )
        .watches_stream(
            fact_changes(
                reflector(tag_cache_writer, watched::<MeshRevisionTag>(&client, &all)),
                |t| TagFacts::from(t),
            ),
            move |_| all_refs(&store_for_tags.state()),
        )
        .reconcile_all_on(
            fact_changes(sibling_rx, |c| ControlPlaneFacts::from(c))
                .filter_map(|r| async move { r.ok().map(|_| ()) }),
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(
            reconcile_control_plane,
            error_policy(CONTROL_PLANE_CONTROLLER),
            ctx.clone(),
        )
        .for_each(|res| async move {
            if let Err(e) = res {
                warn!(error = %e, "control plane controller");
            }
        });

    let (shutdown_migrations, ctx_migrations) = (shutdown.clone(), ctx.clone());
    let (tag_store, tag_writer) = reflector::store::<MeshRevisionTag>();
    let tag_controller = Controller::for_stream(
        reflector(tag_writer, watched::<MeshRevisionTag>(&client, &all)).applied_objects(),
        tag_store.clone(),
    );
    let (tags_for_cp, tags_for_ns) = (tag_store.clone(), tag_store);
    let tag_index = Arc::new(Mutex::new(triggers::NamespaceIndex::default()));
    let tags = tag_controller
        .trigger_backoff(NoSharedBackoff)
        .watches_stream(
            fact_changes(watched::<MeshControlPlane>(&client, &all), |c| {
                ControlPlaneFacts::from(c)
            }),
            move |_| all_refs(&tags_for_cp.state()),
        )
        .watches_stream(
            watched::<Namespace>(&client, &all).touched_objects(),
            move |ns| {
                let mut index = tag_index.lock().unwrap_or_else(|p| p.into_inner());
                triggers::tags_for_namespace(&ns, &mut index, &tags_for_ns.state())
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile_tag, error_policy(TAG_CONTROLLER), ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                warn!(error = %e, "tag controller");
            }
        });
    // Migrations requeue themselves while active (each step says when to look again).
    let (migration_store, migration_writer) = reflector::store::<MeshRevisionMigration>();
    let migrations = Controller::for_stream(
        reflector(
            migration_writer,
            watched::<MeshRevisionMigration>(&client, &all),
        )
        .applied_objects(),
        migration_store,
    )
    .trigger_backoff(NoSharedBackoff)
    .graceful_shutdown_on(shutdown_migrations)
    .run(
        reconcile_migration,
        error_policy(MIGRATION_CONTROLLER),
        ctx_migrations,
    )
    .for_each(|res| async move {
        if let Err(e) = res {
            warn!(error = %e, "migration controller");
        }
    });
    info!("controllers started");
    futures::join!(control_planes, tags, migrations);
    caches_ready.abort();
    info!("controllers stopped");
}

/// A full watch of `K` that backs off on its own errors only.
fn watched<K>(
    client: &Client,
    config: &watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher(Api::<K>::all(client.clone()), config.clone()).default_backoff()
}

/// A metadata-only watch of the operator's objects of kind `K` (owner references are all the
/// controller needs), backing off on its own errors only.
fn owned<K>(
    client: &Client,
    config: &watcher::Config,
) -> impl Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher(
        Api::<PartialObjectMeta<K>>::all(client.clone()),
        config.clone(),
    )
    .default_backoff()
    .touched_objects()
}

/// The control plane whose instance runs in `pod` (by its revision label).
fn control_plane_of_instance_pod(
    pod: &PartialObjectMeta<Pod>,
    control_planes: &[Arc<MeshControlPlane>],
) -> Option<ObjectRef<MeshControlPlane>> {
    let revision = pod.labels().get(names::REVISION_LABEL)?;
    control_planes
        .iter()
        .find(|m| {
            m.revision() == *revision
                && m.control_namespace() == pod.namespace().unwrap_or_default()
        })
        .map(|m| ObjectRef::from_obj(m.as_ref()))
}

/// The control plane that owns an object. `Controller::owns` would key a cluster-scoped owner
/// by the namespace of each namespaced child, so one control plane would be reconciled under
/// many keys at once (racing itself on finalizers and applies).
fn owning_control_plane<K: Resource>(obj: K) -> Option<ObjectRef<MeshControlPlane>> {
    obj.owner_references()
        .iter()
        .find(|r| {
            r.kind == "MeshControlPlane" && r.api_version == MeshControlPlane::api_version(&())
        })
        .map(|r| ObjectRef::new(&r.name))
}

/// The objects of a watch whose membership facts (`facts`, plus whether it is being deleted)
/// changed, that appeared, or that disappeared; status-only writes pass nothing on. The first
/// listing passes nothing either: every reconcile waits for the caches and sees it. A later
/// relist (after a 410) reports only what differs from before.
fn fact_changes<K, F>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    facts: fn(&K) -> F,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + Send + 'static,
    F: PartialEq + Send + 'static,
{
    let mut known: HashMap<String, ((F, bool), K)> = HashMap::new();
    let mut relisted: HashSet<String> = HashSet::new();
    let mut listed_once = false;
    events.flat_map(move |event| {
        let mut out = Vec::new();
        let key = |obj: &K| {
            format!(
                "{}/{}",
                obj.meta().namespace.as_deref().unwrap_or_default(),
                obj.meta().name.as_deref().unwrap_or_default()
            )
        };
        let observe = |obj: K, known: &mut HashMap<String, ((F, bool), K)>| {
            let current = (facts(&obj), obj.meta().deletion_timestamp.is_some());
            let changed = known
                .get(&key(&obj))
                .is_none_or(|(seen, _)| *seen != current);
            known.insert(key(&obj), (current, obj.clone()));
            changed.then_some(obj)
        };
        match event {
            Err(e) => out.push(Err(e)),
            Ok(watcher::Event::Init) => relisted.clear(),
            Ok(watcher::Event::InitApply(obj)) => {
                relisted.insert(key(&obj));
                if let Some(obj) = observe(obj, &mut known).filter(|_| listed_once) {
                    out.push(Ok(obj));
                }
            }
            Ok(watcher::Event::InitDone) => {
                let gone: Vec<String> = known
                    .keys()
                    .filter(|k| !relisted.contains(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    if let Some((_, obj)) = known.remove(&k) {
                        out.push(Ok(obj));
                    }
                }
                listed_once = true;
            }
            Ok(watcher::Event::Apply(obj)) => out.extend(observe(obj, &mut known).map(Ok)),
            Ok(watcher::Event::Delete(obj)) => {
                known.remove(&key(&obj));
                out.push(Ok(obj));
            }
        }
        futures::stream::iter(out)
    })
}

/// The controllers' shared trigger backoff, disabled: each watch has its own (see [`run`]).
struct NoSharedBackoff;

impl Iterator for NoSharedBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for NoSharedBackoff {
    fn reset(&mut self) {}
}

fn cloned<K: Clone>(objects: Vec<Arc<K>>) -> Vec<K> {
    objects.iter().map(|o| K::clone(o)).collect()
}

fn all_refs<K: Resource<DynamicType = ()>>(objects: &[Arc<K>]) -> Vec<ObjectRef<K>> {
    objects
        .iter()
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use watcher::Event as Ev;

    fn plane(name: &str, revision: &str, proxies: u32) -> MeshControlPlane {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1",
            "kind": "MeshControlPlane",
            "metadata": {"name": name},
            "spec": {"tenant": "blue", "revision": revision},
            "status": {"connectedProxies": proxies},
        }))
        .expect("a valid MeshControlPlane")
    }

    fn deleting(mut mcp: MeshControlPlane) -> MeshControlPlane {
        mcp.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        mcp
    }

    /// Names of the objects `fact_changes` passes on for `events`.
    async fn passed(events: Vec<Ev<MeshControlPlane>>) -> Vec<String> {
        let input = stream::iter(events.into_iter().map(Ok));
        fact_changes(input, |c| ControlPlaneFacts::from(c))
            .map(|r| r.map(|o| o.name_any()).unwrap_or_default())
            .collect()
            .await
    }

    #[tokio::test]
    async fn only_membership_facts_deletion_and_disappearance_pass() {
        let passed = passed(vec![
            // First listing: nothing (reconciles wait for the caches and see it).
            Ev::Init,
            Ev::InitApply(plane("a", "a1", 0)),
            Ev::InitApply(plane("b", "b1", 0)),
            Ev::InitDone,
            // A status write: nothing.
            Ev::Apply(plane("a", "a1", 3)),
            // A new control plane and a spec change pass.
            Ev::Apply(plane("c", "c1", 0)),
            Ev::Apply(plane("b", "b2", 0)),
            // Deletion starting and the object going both pass.
            Ev::Apply(deleting(plane("a", "a1", 3))),
            Ev::Delete(deleting(plane("a", "a1", 3))),
            // A relist after a 410: c vanished while disconnected, b changed, d is new.
            Ev::Init,
            Ev::InitApply(plane("b", "b3", 0)),
            Ev::InitApply(plane("d", "d1", 0)),
            Ev::InitDone,
        ])
        .await;
        assert_eq!(passed, ["c", "b", "a", "a", "b", "d", "c"]);
    }

    #[test]
    fn a_namespaced_child_maps_to_its_cluster_scoped_control_plane() {
        let child: PartialObjectMeta<ConfigMap> = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "meshplane-blue-v1-bootstrap",
                "namespace": "shop",
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": "1"},
                    {"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
                     "name": "blue-v1", "uid": "2"},
                ],
            },
        }))
        .expect("a valid ConfigMap");
        let owner = owning_control_plane(child).expect("owned by blue-v1");
        assert_eq!(owner, ObjectRef::<MeshControlPlane>::new("blue-v1"));
        assert_eq!(owner.namespace, None, "one key per control plane");
        let orphan: PartialObjectMeta<ConfigMap> = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "shop"},
        }))
        .expect("a valid ConfigMap");
        assert_eq!(owning_control_plane(orphan), None);
    }

    #[tokio::test]
    async fn every_concurrent_reconcile_sees_the_caches_become_ready() {
        let (control_planes, mut cp_writer) = reflector::store::<MeshControlPlane>();
        let (tags, mut tag_writer) = reflector::store::<MeshRevisionTag>();
        let (namespaces, mut ns_writer) = reflector::store::<Namespace>();
        // kube-runtime's Controller waits for its main store too: that wake-up must not be taken.
        let main_store = control_planes.clone();
        let controller = tokio::spawn(async move { main_store.wait_until_ready().await });
        let (caches, mark_ready) = ClusterCaches::new(control_planes, tags, namespaces);
        let marker = tokio::spawn(mark_ready);
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let caches = caches.clone();
                tokio::spawn(async move { caches.snapshot().await.map(|s| s.control_planes.len()) })
            })
            .collect();
        tokio::task::yield_now().await;
        cp_writer.apply_watcher_event(&Ev::Init);
        cp_writer.apply_watcher_event(&Ev::InitApply(plane("a", "a1", 0)));
        cp_writer.apply_watcher_event(&Ev::InitDone);
        tag_writer.apply_watcher_event(&Ev::Init);
        tag_writer.apply_watcher_event(&Ev::InitDone);
        ns_writer.apply_watcher_event(&Ev::Init);
        ns_writer.apply_watcher_event(&Ev::InitDone);
        for task in waiting {
            let seen = tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("every waiter wakes up")
                .expect("the task ran")
                .expect("a snapshot");
            assert_eq!(seen, 1);
        }
        marker.await.expect("the marker ran");
        tokio::time::timeout(Duration::from_secs(10), controller)
            .await
            .expect("the controller's wait wakes up")
            .expect("the task ran")
            .expect("the store is ready");
    }

    #[tokio::test]
    async fn a_relist_without_differences_passes_nothing() {
        let passed = passed(vec![
            Ev::Init,
            Ev::InitApply(plane("a", "a1", 0)),
            Ev::InitDone,
            Ev::Init,
            Ev::InitApply(plane("a", "a1", 7)),
            Ev::InitDone,
        ])
        .await;
        assert!(passed.is_empty(), "{passed:?}");
    }
}
