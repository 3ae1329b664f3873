//! The kube-runtime controllers: one for `MeshControlPlane`, one for `MeshRevisionTag`, sharing
//! one [`Context`].

mod controlplane;
mod tag;
pub mod triggers;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::fmt::Debug;

use futures::{Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, reflector, ObjectRef};
use kube::runtime::utils::Backoff;
use kube::runtime::{finalizer, watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use meshplane_crds::membership::{self, ControlPlaneFacts, Membership, NamespaceFacts, TagFacts};
use meshplane_crds::{names, MeshControlPlane, MeshRevisionTag};
use serde::de::DeserializeOwned;
use time::OffsetDateTime;
use tracing::{info, warn};

use crate::apply::{Applier, ApplyError};
use crate::metrics::Metrics;
use crate::tls::TlsError;

pub use controlplane::reconcile_control_plane;
pub use tag::reconcile_tag;

/// Name of the controllers in Events and metrics.
pub const CONTROL_PLANE_CONTROLLER: &str = "meshcontrolplane";
pub const TAG_CONTROLLER: &str = "meshrevisiontag";

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
    #[error("serializing status: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("deletion waits: {pods} pod(s) injected by the revision still run")]
    InUse { pods: usize },
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

impl Error {
    /// Short reason for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Apply(_) => "ApplyFailed",
            Error::Kube { .. } => "ApiError",
            Error::Tls(_) => "TlsIssueFailed",
            Error::Serialize(_) => "SerializeFailed",
            Error::InUse { .. } => "InUse",
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
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            tls_validity: crate::tls::DEFAULT_VALIDITY,
            resync: Duration::from_secs(300),
            in_use_retry: Duration::from_secs(15),
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
    // Only labelled namespaces can be members or rejected.
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default().labels(names::REV_LABEL))
        .await
        .map_err(Error::kube("list Namespaces"))?
        .items;
    let ns_facts: Vec<NamespaceFacts> = namespaces
        .iter()
        .map(|n| NamespaceFacts {
            name: n.name_any(),
            labels: n.labels().clone(),
        })
        .collect();
    let cp_facts: Vec<ControlPlaneFacts> =
        control_planes.iter().map(ControlPlaneFacts::from).collect();
    let tag_facts: Vec<TagFacts> = tags.iter().map(TagFacts::from).collect();
    let membership = membership::compute(&ns_facts, &cp_facts, &tag_facts);
    Ok(Snapshot {
        control_planes,
        tags,
        membership,
    })
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

    let (cp_store, cp_writer) = reflector::store::<MeshControlPlane>();
    let cp_controller = Controller::for_stream(
        reflector(cp_writer, watched::<MeshControlPlane>(&client, &all)).applied_objects(),
        cp_store.clone(),
    );
    let ns_index = Arc::new(Mutex::new(triggers::NamespaceIndex::default()));
    let (store_for_ns, store_for_tags, store_for_siblings) =
        (cp_store.clone(), cp_store.clone(), cp_store.clone());
    let cp_index = ns_index.clone();
    let control_planes = cp_controller
        .trigger_backoff(NoSharedBackoff)
        .owns_stream(owned::<ConfigMap>(&client, &managed))
        .owns_stream(owned::<Secret>(&client, &managed))
        .owns_stream(owned::<Service>(&client, &managed))
        .owns_stream(owned::<ServiceAccount>(&client, &managed))
        .owns_stream(owned::<Deployment>(&client, &managed))
        .owns_stream(owned::<PodDisruptionBudget>(&client, &managed))
        .owns_stream(owned::<Role>(&client, &managed))
        .owns_stream(owned::<RoleBinding>(&client, &managed))
        .owns_stream(owned::<ClusterRole>(&client, &managed))
        .owns_stream(owned::<ClusterRoleBinding>(&client, &managed))
        .owns_stream(owned::<MutatingWebhookConfiguration>(&client, &managed))
        .owns_stream(owned::<ValidatingWebhookConfiguration>(&client, &managed))
        .watches_stream(
            watched::<Namespace>(&client, &all).touched_objects(),
            move |ns| {
                let mut index = cp_index.lock().unwrap_or_else(|p| p.into_inner());
                triggers::control_planes_for_namespace(&ns, &mut index, &store_for_ns.state())
            },
        )
        // Tags and sibling control planes change membership (duplicates, tags, tenant members).
        .watches_stream(
            watched::<MeshRevisionTag>(&client, &all).touched_objects(),
            move |_| all_refs(&store_for_tags.state()),
        )
        .watches_stream(
            watched::<MeshControlPlane>(&client, &all).touched_objects(),
            move |_| all_refs(&store_for_siblings.state()),
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
            watched::<MeshControlPlane>(&client, &all).touched_objects(),
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
    info!("controllers started");
    futures::join!(control_planes, tags);
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

fn all_refs<K: Resource<DynamicType = ()>>(objects: &[Arc<K>]) -> Vec<ObjectRef<K>> {
    objects
        .iter()
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}
