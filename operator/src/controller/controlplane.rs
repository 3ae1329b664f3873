//! Reconcile of one `MeshControlPlane`: membership, desired objects, apply/prune, status,
//! Events; and, through the finalizer, ordered cleanup.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::{Resource, ResourceExt};
use meshplane_crds::membership::RevisionMembership;
use meshplane_crds::{names, MeshControlPlane, MeshControlPlaneStatus};
use serde_json::{json, Value};
use tracing::{info, instrument};

use super::{Context, Error, CONTROL_PLANE_CONTROLLER};
use crate::apply::{is_ours, plan};
use crate::ca::{self, CaSource};
use crate::render::{self, Kind, ObjectKey, Observed, RenderInput};
use crate::status::{self, types, InstanceFacts};
use crate::tls::{self, WebhookTls};

/// Entry point of the controller: wraps the work in the finalizer and records metrics.
#[instrument(skip_all, fields(control_plane = %mcp.name_any(), generation = mcp.metadata.generation))]
pub async fn reconcile_control_plane(
    mcp: Arc<MeshControlPlane>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let name = mcp.name_any();
    let api = Api::<MeshControlPlane>::all(ctx.client.clone());
    let result = finalizer(&api, names::FINALIZER, mcp, |event| async {
        match event {
            Finalizer::Apply(mcp) => apply(&mcp, &ctx).await,
            Finalizer::Cleanup(mcp) => cleanup(&mcp, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .record_reconcile(CONTROL_PLANE_CONTROLLER, started.elapsed().as_secs_f64());
    ctx.metrics
        .record_result(CONTROL_PLANE_CONTROLLER, result.is_ok());
    if result.is_ok() {
        ctx.succeeded(&format!("{CONTROL_PLANE_CONTROLLER}/{name}"));
    }
    result
}

fn reference(mcp: &MeshControlPlane) -> ObjectReference {
    mcp.object_ref(&())
}

fn condition<'a>(
    status: Option<&'a MeshControlPlaneStatus>,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status?.conditions.iter().find(|c| c.type_ == type_)
}

/// Writes the status by server-side apply, only when it differs from the observed one.
async fn write_status(
    mcp: &MeshControlPlane,
    status: &MeshControlPlaneStatus,
    ctx: &Context,
) -> Result<(), Error> {
    if mcp.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api = Api::<MeshControlPlane>::all(ctx.client.clone());
    let body = json!({
        "apiVersion": "meshplane.io/v1alpha1",
        "kind": "MeshControlPlane",
        "metadata": {"name": mcp.name_any()},
        "status": serde_json::to_value(status)?,
    });
    api.patch_status(
        &mcp.name_any(),
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(Error::kube("apply MeshControlPlane status"))?;
    ctx.metrics.record_write("MeshControlPlane/status", "apply");
    Ok(())
}

/// Everything this revision owns, by key: listed by our labels, kind by kind; the kinds the
/// operator may read only where it holds an access binding
/// ([`Kind::bound_per_namespace`]) in the namespaces of the access bindings found.
async fn observe(
    ctx: &Context,
    tenant: &str,
    revision: &str,
) -> Result<BTreeMap<ObjectKey, Value>, Error> {
    let selector = render::ownership_selector(tenant, revision);
    let mut observed = BTreeMap::new();
    for kind in Kind::ALL
        .into_iter()
        .filter(|k| *k != Kind::Namespace && !k.bound_per_namespace())
    {
        observed.extend(ctx.applier.list(kind, &selector).await?);
    }
    let namespaces = access_namespaces(&observed, ctx);
    observe_bound(ctx, &selector, &namespaces, &mut observed).await?;
    Ok(observed)
}

/// The namespaces where an observed access binding gives the operator its write powers.
fn access_namespaces(observed: &BTreeMap<ObjectKey, Value>, ctx: &Context) -> BTreeSet<String> {
    observed
        .iter()
        .filter(|(k, _)| k.kind == Kind::RoleBinding)
        .filter_map(|(_, o)| render::operator_access_namespace(o, &ctx.settings.operator_account))
        .collect()
}

/// Lists the per-namespace kinds in `namespaces` into `observed`.
async fn observe_bound(
    ctx: &Context,
    selector: &str,
    namespaces: &BTreeSet<String>,
    observed: &mut BTreeMap<ObjectKey, Value>,
) -> Result<(), Error> {
    for ns in namespaces {
        for kind in Kind::ALL.into_iter().filter(|k| k.bound_per_namespace()) {
            observed.extend(ctx.applier.list_in(kind, Some(ns), selector).await?);
        }
    }
    Ok(())
}

/// Whether `key` is one of the operator's access bindings: applied before, and removed after,
/// everything it grants rights on.
fn is_access_binding(
    key: &ObjectKey,
    observed: &BTreeMap<ObjectKey, Value>,
    ctx: &Context,
) -> bool {
    key.kind == Kind::RoleBinding
        && observed
            .get(key)
            .and_then(|o| render::operator_access_namespace(o, &ctx.settings.operator_account))
            .is_some()
}

/// Applies the control namespace and the operator's access bindings (missing or changed) before
/// anything else: until they exist the operator can neither read nor write the instance's
/// Secrets, Deployments, ServiceAccounts, PDBs and NetworkPolicies. Then lists those kinds in
/// the namespaces just gained.
async fn gain_access(
    ctx: &Context,
    input: &RenderInput<'_>,
    uid: &str,
    observed: &mut BTreeMap<ObjectKey, Value>,
) -> Result<(), Error> {
    let operator = &ctx.settings.operator_account;
    let desired: Vec<render::DesiredObject> = render::render(input)
        .into_iter()
        .filter(|d| {
            d.key.kind == Kind::Namespace
                || render::operator_access_namespace(&d.body, operator).is_some()
        })
        .collect();
    for d in &desired {
        if !observed.contains_key(&d.key) {
            if let Some(found) = ctx.applier.get(&d.key).await? {
                observed.insert(d.key.clone(), found);
            }
        }
    }
    let before = access_namespaces(observed, ctx);
    let by_key: BTreeMap<&ObjectKey, &render::DesiredObject> =
        desired.iter().map(|d| (&d.key, d)).collect();
    for k in plan(&desired, observed, uid).apply {
        if let Some(d) = by_key.get(&k) {
            let applied = ctx.applier.apply(d).await?;
            observed.insert(k, applied);
        }
    }
    let gained: BTreeSet<String> = access_namespaces(observed, ctx)
        .difference(&before)
        .cloned()
        .collect();
    let selector =
        render::ownership_selector(&input.revision.tenant, &input.control_plane.revision());
    observe_bound(ctx, &selector, &gained, observed).await
}

async fn apply(mcp: &MeshControlPlane, ctx: &Context) -> Result<Action, Error> {
    let snap = ctx.cluster_snapshot().await?;
    let name = mcp.name_any();
    let now = ctx.now();
    let conflicts = snap.membership.conflicts_of_control_plane(&name);
    let rev = match (
        conflicts.is_empty(),
        snap.membership.revision_of_control_plane(&name),
    ) {
        (true, Some(rev)) => rev.clone(),
        _ => {
            // A conflicting revision changes nothing: no object is written or pruned.
            let status = status::conflicted_status(mcp, &conflicts, &now);
            let was_degraded = condition(mcp.status.as_ref(), types::DEGRADED).is_some_and(|c| {
                c.status == "True"
                    && status
                        .conditions
                        .iter()
                        .any(|n| n.type_ == types::DEGRADED && n.reason == c.reason)
            });
            if !was_degraded {
                let note = conflicts
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join("; ");
                let reason = conflicts.first().map(|c| c.reason()).unwrap_or("Conflict");
                ctx.event(&reference(mcp), EventType::Warning, reason, note)
                    .await;
            }
            write_status(mcp, &status, ctx).await?;
            return Ok(Action::requeue(ctx.settings.resync));
        }
    };
    let tenant_members = snap.membership.tenant_members(&rev.tenant);
    let revision = mcp.revision();
    let uid = mcp.uid().unwrap_or_default();
    let mut observed = observe(ctx, &rev.tenant, &revision).await?;
    // The access bindings do not depend on the certificate: render them with none.
    let no_tls = WebhookTls {
        ca_bundle_pem: String::new(),
        cert_pem: String::new(),
        key_pem: String::new(),
    };
    let access_input = RenderInput {
        control_plane: mcp,
        revision: &rev,
        tenant_members: &tenant_members,
        tls: &no_tls,
        observed: &Observed::default(),
        operator: &ctx.settings.operator_account,
    };
    gain_access(ctx, &access_input, &uid, &mut observed).await?;

    // Webhook TLS: reuse the Secret's material until a third of its validity remains.
    let secret_key = key(
        Kind::Secret,
        Some(&rev.control_namespace),
        &names::webhook_tls_secret(&revision),
    );
    let existing_tls = observed
        .get(&secret_key)
        .filter(|s| is_ours(s, &uid))
        .and_then(|s| WebhookTls::from_secret_data(s.get("data")?));
    let host = names::service_host(&revision, &rev.control_namespace);
    let (tls, issued) = tls::ensure(
        existing_tls,
        &host,
        (ctx.clock)(),
        ctx.settings.tls_validity,
    )?;
    let service_key = key(
        Kind::Service,
        Some(&rev.control_namespace),
        &names::instance_name(&revision),
    );
    let cluster_ip = |observed: &BTreeMap<ObjectKey, Value>| {
        observed
            .get(&service_key)
            .and_then(|s| s.pointer("/spec/clusterIP")?.as_str().map(str::to_string))
    };
    // The tenant CA (contract 11) before the objects that carry its root. On the tenant's very
    // first reconcile the control namespace does not exist yet: the CA follows the first pass.
    let mut tenant_ca = ensure_ca(ctx, &snap, &rev).await?;
    // Up to three passes: creating the Service assigns its ClusterIP, and creating the control
    // namespace lets the CA be issued; the bootstrap ConfigMaps carry both (so a later resync
    // has nothing left to change).
    let mut todo = crate::apply::Plan::default();
    let mut applied_keys = BTreeSet::new();
    let mut pruned_keys = BTreeSet::new();
    for _pass in 0..3 {
        let ip_before = cluster_ip(&observed);
        let root_before = tenant_ca.as_ref().and_then(|ca| ca.trust_bundle.clone());
        let facts = Observed {
            service_cluster_ip: ip_before.clone(),
            root_cert: root_before.clone(),
        };
        let desired = render::render(&RenderInput {
            control_plane: mcp,
            revision: &rev,
            tenant_members: &tenant_members,
            tls: &tls,
            observed: &facts,
            operator: &ctx.settings.operator_account,
        });
        // Objects not found by label may still exist under our name (unlabelled, or another
        // owner's): read them so that we never overwrite them.
        for d in &desired {
            if !observed.contains_key(&d.key) {
                if let Some(found) = ctx.applier.get(&d.key).await? {
                    observed.insert(d.key.clone(), found);
                }
            }
        }
        todo = plan(&desired, &observed, &uid);
        // Access bindings go last: the objects they grant rights on are removed first.
        todo.prune
            .sort_by_key(|k| is_access_binding(k, &observed, ctx));
        let by_key: BTreeMap<&ObjectKey, &render::DesiredObject> =
            desired.iter().map(|d| (&d.key, d)).collect();
        for k in &todo.apply {
            if let Some(d) = by_key.get(k) {
                // A binding's roleRef cannot change: such a binding is replaced.
                let role_ref = |v: &Value| v.get("roleRef").cloned();
                if matches!(k.kind, Kind::RoleBinding | Kind::ClusterRoleBinding)
                    && observed
                        .get(k)
                        .and_then(role_ref)
                        .is_some_and(|r| Some(r) != role_ref(&d.body))
                {
                    ctx.applier.delete(k).await?;
                }
                let applied = ctx.applier.apply(d).await?;
                observed.insert(k.clone(), applied);
                applied_keys.insert(k.clone());
            }
        }
        for k in &todo.prune {
            ctx.applier.delete(k).await?;
            observed.remove(k);
            pruned_keys.insert(k.clone());
        }
        if tenant_ca.is_none() {
            tenant_ca = ensure_ca(ctx, &snap, &rev).await?;
        }
        let root_after = tenant_ca.as_ref().and_then(|ca| ca.trust_bundle.clone());
        if cluster_ip(&observed) == ip_before && root_after == root_before {
            break;
        }
    }
    if let Some(ca) = &tenant_ca {
        report_ca(mcp, ca, ctx).await;
    }
    if issued {
        ctx.event(
            &reference(mcp),
            EventType::Normal,
            "CertificateIssued",
            format!("issued the webhook serving certificate for {host}"),
        )
        .await;
    }

    let webhook_keys = [
        key(
            Kind::MutatingWebhookConfiguration,
            None,
            &names::injector_webhook(&revision),
        ),
        key(
            Kind::ValidatingWebhookConfiguration,
            None,
            &names::validator_webhook(&revision),
        ),
    ];
    let deployment_available = status::deployment_available(observed.get(&key(
        Kind::Deployment,
        Some(&rev.control_namespace),
        &names::instance_name(&revision),
    )));
    let webhooks_applied = webhook_keys
        .iter()
        .all(|k| observed.contains_key(k) && !todo.foreign.contains(k));
    if webhook_keys.iter().any(|k| applied_keys.contains(k)) {
        ctx.probes.forget(&revision);
    }
    let webhook_probe = if deployment_available && webhooks_applied {
        Some(
            ctx.probes
                .check(&ctx.client, &revision, &rev.control_namespace)
                .await,
        )
    } else {
        None
    };
    // Contract 3: only instance pods that exist count. The ConfigMap was read before the pods
    // are listed, so every key of a running pod is in the list; keys of pods that are gone (a
    // rollout, a crash) are removed.
    let proxies_key = key(
        Kind::ConfigMap,
        Some(&rev.control_namespace),
        &render::proxies_configmap(&revision),
    );
    let live_instances = instance_pods(ctx, &rev.control_namespace, &revision).await?;
    let stale = status::stale_proxy_keys(observed.get(&proxies_key), &live_instances);
    if !stale.is_empty() {
        forget_proxy_counts(ctx, &proxies_key, &stale).await?;
    }
    let instance = InstanceFacts {
        deployment_available,
        webhooks_applied,
        webhook_probe: webhook_probe.clone(),
        connected_proxies: status::connected_proxies(observed.get(&proxies_key), &live_instances),
        members_stale: status::members_stale(observed.get(&proxies_key), &live_instances),
        foreign_objects: todo.foreign.iter().map(ToString::to_string).collect(),
        ca_problem: tenant_ca
            .as_ref()
            .and_then(|ca| ca.problem.as_ref())
            .map(ToString::to_string),
        gateway_problem: render::misplaced_gateway_of(&RenderInput {
            control_plane: mcp,
            revision: &rev,
            tenant_members: &tenant_members,
            tls: &tls,
            observed: &Observed::default(),
            operator: &ctx.settings.operator_account,
        }),
    };
    let new_status = status::active_status(mcp, &rev, &instance, &now);
    warn_rejected(mcp, &rev, ctx).await;
    warn_members_stale(mcp, &new_status, ctx).await;
    if condition(mcp.status.as_ref(), types::DEGRADED).is_some_and(|c| c.status == "True")
        && instance.foreign_objects.is_empty()
        && instance.ca_problem.is_none()
    {
        ctx.event(
            &reference(mcp),
            EventType::Normal,
            "ConflictResolved",
            "the revision is active again".into(),
        )
        .await;
    }
    write_status(mcp, &new_status, ctx).await?;
    if !applied_keys.is_empty() || !pruned_keys.is_empty() {
        info!(
            applied = applied_keys.len(),
            pruned = pruned_keys.len(),
            members = tenant_members.len(),
            "reconciled"
        );
    }
    // A webhook that does not answer yet is probed again soon, not at the next resync.
    match webhook_probe {
        Some(crate::webhook_probe::ProbeResult::Failed(_)) => Ok(Action::requeue(
            crate::webhook_probe::PROBE_EVERY.min(ctx.settings.resync),
        )),
        _ => Ok(Action::requeue(ctx.settings.resync)),
    }
}

/// The tenant CA, kept as the tenant's setting says (the oldest revision's); `None` while the
/// control namespace does not exist yet.
async fn ensure_ca(
    ctx: &Context,
    snap: &super::Snapshot,
    rev: &RevisionMembership,
) -> Result<Option<ca::TenantCa>, Error> {
    let deciding = ca::tenant_ca_setting(&snap.control_planes, &rev.tenant);
    let source = deciding.map(CaSource::of).unwrap_or(CaSource::SelfSigned);
    let trust_domain = deciding
        .map(|m| m.spec.mesh_config.trust_domain.clone())
        .unwrap_or_else(|| names::DEFAULT_TRUST_DOMAIN.to_string());
    let args = ca::EnsureCa {
        tenant: &rev.tenant,
        control_namespace: &rev.control_namespace,
        trust_domain: &trust_domain,
        source: &source,
        policy: &ctx.settings.ca_rotation,
        now: (ctx.clock)(),
    };
    match ca::ensure_tenant_ca(&ctx.client, &args).await {
        Ok(tenant_ca) => {
            if let Some(how) = tenant_ca.written {
                ctx.metrics.record_write("Secret", how);
            }
            Ok(Some(tenant_ca))
        }
        Err(e) if e.is_namespace_missing() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Events about the tenant CA: issued, rotated, or refused (bad plugged material), each once.
async fn report_ca(mcp: &MeshControlPlane, tenant_ca: &ca::TenantCa, ctx: &Context) {
    if let Some(problem) = &tenant_ca.problem {
        let known = condition(mcp.status.as_ref(), types::DEGRADED)
            .is_some_and(|c| c.status == "True" && c.reason == status::CA_INVALID_REASON);
        if !known {
            ctx.event(
                &reference(mcp),
                EventType::Warning,
                status::CA_INVALID_REASON,
                format!("{problem}; the tenant keeps its current CA"),
            )
            .await;
        }
        return;
    }
    let Some(how) = tenant_ca.written else { return };
    let note = match (how, tenant_ca.phase.as_deref()) {
        ("created", _) => format!("issued the tenant CA Secret {}", names::TENANT_CA_SECRET),
        (_, Some(phase)) => format!(
            "tenant CA Secret {} updated; root rotation phase {phase}",
            names::TENANT_CA_SECRET
        ),
        _ => format!("tenant CA Secret {} updated", names::TENANT_CA_SECRET),
    };
    ctx.event(&reference(mcp), EventType::Normal, "TenantCAUpdated", note)
        .await;
}

/// A Warning Event on each namespace newly rejected by this revision, saying why.
async fn warn_rejected(mcp: &MeshControlPlane, rev: &RevisionMembership, ctx: &Context) {
    let known: BTreeSet<&str> = mcp
        .status
        .as_ref()
        .and_then(|s| s.rejected.as_ref())
        .map(|r| r.namespaces.iter().map(|n| n.name.as_str()).collect())
        .unwrap_or_default();
    for (ns, rejection) in rev
        .rejected
        .iter()
        .filter(|(ns, _)| !known.contains(ns.as_str()))
    {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Namespace".into()),
            name: Some(ns.clone()),
            ..Default::default()
        };
        ctx.event(
            &reference,
            EventType::Warning,
            rejection.reason.as_str(),
            rejection.message.clone(),
        )
        .await;
    }
}

/// A Warning Event when `MembersStale` turns True: an instance keeps serving the members it
/// last read because its members ConfigMap is deleted, unreadable or not the operator's
/// (contract 3 carries the instance's word for it).
async fn warn_members_stale(mcp: &MeshControlPlane, next: &MeshControlPlaneStatus, ctx: &Context) {
    fn stale(
        s: Option<&MeshControlPlaneStatus>,
    ) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
        condition(s, types::MEMBERS_STALE).filter(|c| c.status == "True")
    }
    if let (Some(c), None) = (stale(Some(next)), stale(mcp.status.as_ref())) {
        ctx.event(
            &reference(mcp),
            EventType::Warning,
            types::MEMBERS_STALE,
            c.message.clone(),
        )
        .await;
    }
}

/// Names of the instance pods of `revision` that exist (whatever their phase: a pod shutting
/// down still serves its proxies until it exits).
async fn instance_pods(
    ctx: &Context,
    control_namespace: &str,
    revision: &str,
) -> Result<BTreeSet<String>, Error> {
    let selector = format!(
        "app.kubernetes.io/name=meshplane-xds,{}={revision}",
        names::REVISION_LABEL
    );
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), control_namespace)
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube("list instance Pods"))?;
    Ok(pods.items.iter().map(|p| p.name_any()).collect())
}

/// Removes the proxy counts of instance pods that are gone from the proxies ConfigMap.
async fn forget_proxy_counts(ctx: &Context, cm: &ObjectKey, pods: &[String]) -> Result<(), Error> {
    let escape = |k: &str| k.replace('~', "~0").replace('/', "~1");
    let ops: Vec<Value> = pods
        .iter()
        .map(|p| json!({"op": "remove", "path": format!("/data/{}", escape(p))}))
        .collect();
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))?;
    Api::<ConfigMap>::namespaced(
        ctx.client.clone(),
        cm.namespace.as_deref().unwrap_or_default(),
    )
    .patch(&cm.name, &PatchParams::default(), &Patch::Json::<()>(patch))
    .await
    .map_err(Error::kube("remove stale proxy counts"))?;
    ctx.metrics.record_write("ConfigMap", "patch");
    info!(configmap = %cm, pods = ?pods, "removed the proxy counts of instance pods that are gone");
    Ok(())
}

/// Pods injected by `revision` still running in `namespaces`.
async fn injected_pods(
    ctx: &Context,
    namespaces: &BTreeSet<String>,
    revision: &str,
) -> Result<usize, Error> {
    let mut count = 0;
    for ns in namespaces {
        let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("list Pods"))?;
        count += pods
            .items
            .iter()
            .filter(|p| {
                p.annotations()
                    .get(names::INJECTED_REVISION_ANNOTATION)
                    .map(String::as_str)
                    == Some(revision)
            })
            .count();
    }
    Ok(count)
}

async fn cleanup(mcp: &MeshControlPlane, ctx: &Context) -> Result<Action, Error> {
    let revision = mcp.revision();
    let tenant = mcp.spec.tenant.clone();
    let uid = mcp.uid().unwrap_or_default();
    let forced = mcp
        .annotations()
        .get(names::FORCE_DELETE_ANNOTATION)
        .map(String::as_str)
        == Some("true");
    let snap = ctx.cluster_snapshot().await?;
    // A conflicting control plane (e.g. a duplicate revision's loser) injected nothing: pods
    // annotated with its revision name belong to the winner and must not block its deletion.
    let active = snap
        .membership
        .revision_of_control_plane(&mcp.name_any())
        .is_some();
    if !forced && active {
        let mut namespaces = snap.membership.tenant_members(&tenant);
        namespaces.extend(
            mcp.status
                .iter()
                .flat_map(|s| s.members.iter())
                .flat_map(|m| m.names.iter().cloned()),
        );
        let pods = injected_pods(ctx, &namespaces, &revision).await?;
        if pods > 0 {
            let now = ctx.now();
            let status = status::in_use_status(mcp, pods, &now);
            if condition(mcp.status.as_ref(), types::IN_USE).is_none() {
                ctx.event(&reference(mcp), EventType::Warning, "InUse", format!(
                    "deletion waits for {pods} pod(s) injected by revision {revision:?}; annotate {}=\"true\" to delete anyway",
                    names::FORCE_DELETE_ANNOTATION
                ))
                .await;
            }
            write_status(mcp, &status, ctx).await?;
            return Err(Error::InUse { pods });
        }
    }
    // Webhooks first, then per-namespace objects and RBAC, then the instance, and the
    // operator's access bindings last (they grant the rights to delete the instance).
    let observed = observe(ctx, &tenant, &revision).await?;
    let mut doomed: Vec<&ObjectKey> = Vec::new();
    for kind in Kind::DELETE_ORDER {
        for (k, o) in observed.iter().filter(|(k, _)| k.kind == kind) {
            let owned = o
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|os| {
                    os.iter()
                        .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid.as_str()))
                });
            if owned {
                doomed.push(k);
            }
        }
    }
    doomed.sort_by_key(|k| is_access_binding(k, &observed, ctx));
    for k in doomed {
        ctx.applier.delete(k).await?;
    }
    info!(revision, "cleaned up");
    Ok(Action::await_change())
}

fn key(kind: Kind, namespace: Option<&str>, name: &str) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    }
}
