//! The controllers' builder chain: which watches trigger which controller, and the reflector
//! stores they feed.

use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use meshplane_crds::gateway_api::{Gateway, GatewayClass};
use meshplane_crds::membership::{ControlPlaneFacts, TagFacts};
use meshplane_crds::{names, MeshControlPlane, MeshRevisionMigration, MeshRevisionTag};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use super::caches::ClusterCaches;
use super::error::error_policy;
use super::triggers::{
    all_refs, control_plane_of_instance_pod, fact_changes, owning_control_plane,
};
use super::watches::SharedWatch;
use super::{access, backoff, triggers, Context};
use super::{reconcile_control_plane, reconcile_migration, reconcile_tag};
use super::{CONTROL_PLANE_CONTROLLER, MIGRATION_CONTROLLER, TAG_CONTROLLER};
use crate::gateway_api;

/// Runs the controllers until `shutdown` completes.
///
/// Every trigger watch backs off on its own (`watched`, `owned`, [`backoff::per_watch`]).
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

    // One watch per kind both controllers and the caches follow (`SharedWatch`), so that each
    // trigger finds the caches at least as new as itself. Sibling control planes and tags
    // re-trigger every control plane only when their membership facts change, not on each
    // status write, or 100 control planes would reconcile each other 10,000 times.
    let mut control_plane_watch = SharedWatch::<MeshControlPlane>::new();
    let mut tag_watch = SharedWatch::<MeshRevisionTag>::new();
    let mut namespace_watch = SharedWatch::<Namespace>::new();
    let _ = ctx.caches.set(ClusterCaches::new(
        (control_plane_watch.store(), control_plane_watch.ready()),
        (tag_watch.store(), tag_watch.ready()),
        (namespace_watch.store(), namespace_watch.ready()),
    ));
    let cp_store = control_plane_watch.store();
    let tag_store = tag_watch.store();
    let cp_controller = Controller::for_stream(
        control_plane_watch.subscribe().applied_objects(),
        cp_store.clone(),
    );
    let ns_index = Arc::new(Mutex::new(triggers::NamespaceIndex::default()));
    let (store_for_ns, store_for_tags) = (cp_store.clone(), cp_store.clone());
    let store_for_pods = cp_store.clone();
    // Instance pods (metadata only): a pod that is gone takes its key of the proxies
    // ConfigMap out of status.connectedProxies (contract 3).
    let instance_pods = watcher::Config::default().labels("app.kubernetes.io/name=meshplane-xds");
    let cp_index = ns_index.clone();
    let control_planes = backoff::per_watch(cp_controller)
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
        .watches_stream(namespace_watch.subscribe().touched_objects(), move |ns| {
            let mut index = cp_index.lock().unwrap_or_else(|p| p.into_inner());
            triggers::control_planes_for_namespace(&ns, &mut index, &store_for_ns.state())
        })
        .watches_stream(
            fact_changes(tag_watch.subscribe(), |t| TagFacts::from(t)),
            move |_| all_refs(&store_for_tags.state()),
        )
        // Gateway API: a GatewayClass or Gateway whose facts change (not a status write)
        // looks at every control plane, which reads the tenant's classes and Gateways anew.
        // Without the Gateway API CRDs these watches only retry with their backoff.
        .reconcile_all_on(
            fact_changes(watched::<GatewayClass>(&client, &all), |c| {
                gateway_api::class_facts(c)
            })
            .filter_map(|r| async move { r.ok().map(|_| ()) }),
        )
        .reconcile_all_on(
            fact_changes(
                watched::<Gateway>(&client, &all),
                gateway_api::gateway_facts,
            )
            .filter_map(|r| async move { r.ok().map(|_| ()) }),
        )
        .reconcile_all_on(
            fact_changes(control_plane_watch.subscribe(), |c| {
                ControlPlaneFacts::from(c)
            })
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
    let tag_controller =
        Controller::for_stream(tag_watch.subscribe().applied_objects(), tag_store.clone());
    let (tags_for_cp, tags_for_ns) = (tag_store.clone(), tag_store);
    let tag_index = Arc::new(Mutex::new(triggers::NamespaceIndex::default()));
    let tags = backoff::per_watch(tag_controller)
        .watches_stream(
            fact_changes(control_plane_watch.subscribe(), |c| {
                ControlPlaneFacts::from(c)
            }),
            move |_| all_refs(&tags_for_cp.state()),
        )
        .watches_stream(namespace_watch.subscribe().touched_objects(), move |ns| {
            let mut index = tag_index.lock().unwrap_or_else(|p| p.into_inner());
            triggers::tags_for_namespace(&ns, &mut index, &tags_for_ns.state())
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile_tag, error_policy(TAG_CONTROLLER), ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                warn!(error = %e, "tag controller");
            }
        });
    // Migrations requeue themselves while active (each step says when to look again).
    let (migration_store, migration_writer) = reflector::store::<MeshRevisionMigration>();
    let migrations = backoff::per_watch(Controller::for_stream(
        reflector(
            migration_writer,
            watched::<MeshRevisionMigration>(&client, &all),
        )
        .applied_objects(),
        migration_store,
    ))
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
    // Started once every consumer subscribed; dropped (ending the watches) when the
    // controllers stop.
    let _feeds = (
        control_plane_watch.start(
            "MeshControlPlane",
            watched::<MeshControlPlane>(&client, &all),
        ),
        tag_watch.start("MeshRevisionTag", watched::<MeshRevisionTag>(&client, &all)),
        namespace_watch.start("Namespace", watched::<Namespace>(&client, &all)),
    );
    info!("controllers started");
    futures::join!(control_planes, tags, migrations);
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
