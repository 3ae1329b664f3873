//! Reconcile of one `MeshControlPlane`: observe, plan, act, report; and, through the finalizer,
//! ordered cleanup. Every decision is the pure [`plan`]'s; this module reads the cluster,
//! performs what is planned and writes the status from the outcome:
//!
//! 1. observe: membership (the controllers' caches) and every object carrying the revision's
//!    ownership labels (contract 8), the per-namespace kinds only where an access binding lets
//!    the operator read them;
//! 2. the control namespace and the access bindings first, then the kinds they open up;
//! 3. the webhook certificate (contract 4) and the tenant CA (contract 11), then up to three
//!    passes of render, compare, apply and prune, until what a render depends on settles;
//! 4. the webhook probe (contract 5), the instance pods and their proxy counts (contract 3),
//!    then Events and the status.

mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::{Resource, ResourceExt};
use meshplane_crds::gateway_api::{Gateway, GatewayClass};
use meshplane_crds::membership::{ControlPlaneFacts, RevisionMembership};
use meshplane_crds::{names, MeshControlPlane, MeshControlPlaneStatus};
use serde_json::{json, Value};
use tracing::{info, instrument};

use super::{Context, Error, CONTROL_PLANE_CONTROLLER};
use crate::ca::{self, CaSource};
use crate::gateway_api;
use crate::render::{self, DesiredObject, Kind, ObjectKey, OperatorAccount, RenderInput};
use crate::status;
use crate::tls::{self, WebhookTls};
use meshplane_contracts::webhook_tls::ClientAuthData;
use plan::{Decision, Named, Notice, Regarding, Writes};

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

/// Publishes planned Events, in order. An Event regarding a namespace carries its uid (as
/// `kubectl describe namespace` looks Events up by it); one regarding a namespace that no
/// longer exists is not published.
async fn publish(
    mcp: &MeshControlPlane,
    notices: &[Notice],
    snap: &super::Snapshot,
    ctx: &Context,
) {
    for notice in notices {
        let reference = match &notice.regarding {
            Regarding::ControlPlane => mcp.object_ref(&()),
            Regarding::Namespace(name) => {
                let Some(uid) = snap.namespace_uids.get(name) else {
                    continue;
                };
                ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Namespace".into()),
                    name: Some(name.clone()),
                    uid: Some(uid.clone()),
                    ..Default::default()
                }
            }
        };
        let type_ = if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(&reference, type_, &notice.reason, notice.message.clone())
            .await;
    }
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

async fn apply(mcp: &MeshControlPlane, ctx: &Context) -> Result<Action, Error> {
    let snap = ctx.cluster_snapshot().await?;
    let now = ctx.now();
    match plan::decide(mcp, &snap.membership, &now) {
        Decision::Conflicted(report) => {
            publish(mcp, &report.notices, &snap, ctx).await;
            write_status(mcp, &report.status, ctx).await?;
            Ok(Action::requeue(ctx.settings.resync))
        }
        Decision::Active {
            revision,
            tenant_members,
            status_writer,
        } => {
            // A read that fails for another reason than the kind not being served stops
            // here, before anything is written, so running gateway proxies are never pruned
            // for want of the Gateways they run for.
            let gateways = read_gateways(ctx, &snap.membership, revision, &mcp.revision()).await?;
            let target = Target {
                control_plane: mcp,
                revision,
                tenant_members: &tenant_members,
                status_writer,
                operator: &ctx.settings.operator_account,
                client_auth: ctx
                    .settings
                    .apiserver_client
                    .as_ref()
                    .and_then(|a| a.data()),
                uid: mcp.uid().unwrap_or_default(),
                managed_gateways: gateways.managed,
                gateway_classes: gateways.classes,
            };
            reconcile_active(&target, &snap, &now, ctx).await
        }
    }
}

/// The GatewayClasses (cluster-wide) and, when the tenant has a class, the Gateways of the
/// tenant's namespaces (members and control namespace), read into what `revision` renders. A
/// kind the API server does not serve (Gateway API CRDs not installed) reads as none.
async fn read_gateways(
    ctx: &Context,
    membership: &meshplane_crds::membership::Membership,
    revision: &RevisionMembership,
    revision_name: &str,
) -> Result<gateway_api::RevisionGateways, Error> {
    let tenant = &revision.tenant;
    let classes = match Api::<GatewayClass>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) if gateway_api::not_served(&e) => return Ok(Default::default()),
        Err(e) => return Err(Error::kube("list GatewayClasses")(e)),
    };
    if gateway_api::classes_of_tenant(tenant, &classes, membership).is_empty() {
        return Ok(Default::default());
    }
    let mut namespaces = membership.tenant_members(tenant);
    if let Some(t) = membership.tenants.get(tenant) {
        namespaces.insert(t.control_namespace.clone());
    }
    let mut gateways = Vec::new();
    for ns in &namespaces {
        match Api::<Gateway>::namespaced(ctx.client.clone(), ns)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => gateways.extend(list.items),
            Err(e) if gateway_api::not_served(&e) => {
                gateways.clear();
                break;
            }
            Err(e) => return Err(Error::kube("list Gateways")(e)),
        }
    }
    Ok(gateway_api::revision_gateways(
        tenant,
        revision_name,
        &classes,
        &gateways,
        membership,
    ))
}

/// An active revision as the reconcile works on it.
struct Target<'a> {
    control_plane: &'a MeshControlPlane,
    revision: &'a RevisionMembership,
    /// Member namespaces of the whole tenant.
    tenant_members: &'a BTreeSet<String>,
    /// Whether it writes the status of the control namespace's config.
    status_writer: bool,
    operator: &'a OperatorAccount,
    /// The API server's admission client CA for the webhook TLS Secret (contract 4), as read
    /// at the start of this reconcile.
    client_auth: Option<ClientAuthData>,
    /// The control plane's uid, which its objects' owner references carry.
    uid: String,
    /// The Gateway API Gateways this revision runs proxies for.
    managed_gateways: Vec<render::ManagedGateway>,
    /// The tenant's GatewayClasses.
    gateway_classes: BTreeSet<String>,
}

impl Target<'_> {
    fn render_input<'s>(
        &'s self,
        tls: &'s WebhookTls,
        observed: &'s render::Observed,
    ) -> RenderInput<'s> {
        RenderInput {
            control_plane: self.control_plane,
            revision: self.revision,
            tenant_members: self.tenant_members,
            status_writer: self.status_writer,
            tls,
            observed,
            operator: self.operator,
            client_auth: self.client_auth.as_ref(),
            managed_gateways: &self.managed_gateways,
            gateway_classes: &self.gateway_classes,
        }
    }
}

/// What the writes did.
struct Written {
    /// The webhook serving certificate the objects carry.
    tls: WebhookTls,
    tenant_ca: Option<ca::TenantCa>,
    applied: BTreeSet<ObjectKey>,
    pruned: BTreeSet<ObjectKey>,
    /// Desired objects another owner holds, as of the last pass.
    foreign: Vec<ObjectKey>,
}

async fn reconcile_active(
    target: &Target<'_>,
    snap: &super::Snapshot,
    now: &Time,
    ctx: &Context,
) -> Result<Action, Error> {
    let rev = target.revision;
    let revision = target.control_plane.revision();
    let named = Named::new(&revision, &rev.control_namespace);
    let mut observed = observe(ctx, &rev.tenant, &revision).await?;
    let members_before = plan::members_before(
        &observed,
        &named,
        &target.uid,
        target.control_plane.status.as_ref(),
    );
    gain_access(ctx, target, snap, &named, &mut observed).await?;
    let written = write_objects(ctx, target, snap, &named, &mut observed).await;
    // Whatever the writes got to: a members ConfigMap written before a later write failed
    // is told now, as the next reconcile finds it written.
    let changes = plan::membership_notices(
        &revision,
        &rev.tenant,
        &members_before,
        plan::written_members(&observed, &named, &target.uid).as_ref(),
    );
    publish(target.control_plane, &changes, snap, ctx).await;
    report_outcome(ctx, target, snap, &named, &observed, &written?, now).await
}

/// The webhook certificate, the tenant CA and the revision's objects, in up to three passes;
/// then the Events about what was issued.
async fn write_objects(
    ctx: &Context,
    target: &Target<'_>,
    snap: &super::Snapshot,
    named: &Named,
    observed: &mut BTreeMap<ObjectKey, Value>,
) -> Result<Written, Error> {
    let mcp = target.control_plane;
    let rev = target.revision;
    // Webhook TLS: reuse the Secret's material until a third of its validity remains.
    let host = names::service_host(&mcp.revision(), &rev.control_namespace);
    let existing = plan::webhook_tls(observed, named, &target.uid);
    let had_material = existing.is_some();
    let (tls, issued) = tls::ensure(existing, &host, (ctx.clock)(), ctx.settings.tls_validity)?;
    // The tenant CA (contract 11) before the objects that carry its root. On the tenant's very
    // first reconcile the control namespace does not exist yet: the CA follows the first pass.
    let tenant_ca = ensure_ca(ctx, snap, rev).await?;
    let mut written = Written {
        tls,
        tenant_ca,
        applied: BTreeSet::new(),
        pruned: BTreeSet::new(),
        foreign: Vec::new(),
    };
    // Up to three passes: creating the Service assigns its ClusterIP, and creating the control
    // namespace lets the CA be issued; the bootstrap ConfigMaps carry both (so a later resync
    // has nothing left to change).
    for _pass in 0..3 {
        let before = plan::render_facts(observed, named, written.tenant_ca.as_ref());
        let desired = render::render(&target.render_input(&written.tls, &before));
        read_unobserved(ctx, &desired, observed).await?;
        let writes = plan::writes(desired, observed, &target.uid, target.operator);
        perform(ctx, &writes, observed, &mut written).await?;
        written.foreign = writes.foreign;
        if written.tenant_ca.is_none() {
            written.tenant_ca = ensure_ca(ctx, snap, rev).await?;
        }
        if plan::render_facts(observed, named, written.tenant_ca.as_ref()) == before {
            break;
        }
    }
    let certificate = plan::Certificate::of(had_material, issued);
    let notices = plan::write_notices(mcp, written.tenant_ca.as_ref(), certificate, &host);
    publish(mcp, &notices, snap, ctx).await;
    Ok(written)
}

/// What the writes left: the webhook probe when due, the instance pods and their proxy counts
/// (contract 3), then the Events and the status of [`plan::report`].
async fn report_outcome(
    ctx: &Context,
    target: &Target<'_>,
    snap: &super::Snapshot,
    named: &Named,
    observed: &BTreeMap<ObjectKey, Value>,
    written: &Written,
    now: &Time,
) -> Result<Action, Error> {
    let mcp = target.control_plane;
    let rev = target.revision;
    let revision = mcp.revision();
    // A rewritten webhook configuration answers anew: its last probe result says nothing.
    if named.webhooks.iter().any(|k| written.applied.contains(k)) {
        ctx.probes.forget(&revision);
    }
    let webhook_probe = if plan::probe_due(observed, named, &written.foreign) {
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
    let live_instances = instance_pods(ctx, &rev.control_namespace, &revision).await?;
    let stale = status::stale_proxy_keys(observed.get(&named.proxies), &live_instances);
    if !stale.is_empty() {
        forget_proxy_counts(ctx, &named.proxies, &stale).await?;
    }
    let no_facts = render::Observed::default();
    let outcome = plan::Outcome {
        observed,
        named,
        foreign: &written.foreign,
        tenant_ca: written.tenant_ca.as_ref(),
        webhook_probe,
        live_instances: &live_instances,
        gateway_problem: render::misplaced_gateway_of(
            &target.render_input(&written.tls, &no_facts),
        ),
    };
    let report = plan::report(mcp, rev, &outcome, now);
    publish(mcp, &report.notices, snap, ctx).await;
    write_status(mcp, &report.status, ctx).await?;
    if !written.applied.is_empty() || !written.pruned.is_empty() {
        info!(
            applied = written.applied.len(),
            pruned = written.pruned.len(),
            members = target.tenant_members.len(),
            "reconciled"
        );
    }
    Ok(Action::requeue(plan::requeue_after(
        outcome.webhook_probe.as_ref(),
        outcome.watches_refused(),
        ctx.settings.resync,
    )))
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
    let grants = plan::access_grants(&observed, &ctx.settings.operator_account);
    observe_bound(ctx, &selector, &grants, &mut observed).await?;
    Ok(observed)
}

/// Lists the per-namespace kinds each grant covers into `observed`.
async fn observe_bound(
    ctx: &Context,
    selector: &str,
    grants: &BTreeMap<String, render::AccessGrant>,
    observed: &mut BTreeMap<ObjectKey, Value>,
) -> Result<(), Error> {
    for (ns, grant) in grants {
        for kind in Kind::ALL.into_iter().filter(|k| grant.covers(*k)) {
            observed.extend(ctx.applier.list_in(kind, Some(ns), selector).await?);
        }
    }
    Ok(())
}

/// Reads by name the rendered objects not found by label ([`plan::unobserved`]).
async fn read_unobserved(
    ctx: &Context,
    desired: &[DesiredObject],
    observed: &mut BTreeMap<ObjectKey, Value>,
) -> Result<(), Error> {
    for key in plan::unobserved(desired, observed) {
        if let Some(found) = ctx.applier.get(key).await? {
            observed.insert(key.clone(), found);
        }
    }
    Ok(())
}

/// Applies the control namespace and the operator's access bindings (missing or changed) before
/// anything else: until they exist the operator can neither read nor write the instance's
/// Secrets, Deployments, ServiceAccounts, PDBs and NetworkPolicies. Then lists those kinds in
/// the namespaces just gained.
async fn gain_access(
    ctx: &Context,
    target: &Target<'_>,
    snap: &super::Snapshot,
    named: &Named,
    observed: &mut BTreeMap<ObjectKey, Value>,
) -> Result<(), Error> {
    let operator = target.operator;
    let access = plan::access_objects(
        target.control_plane,
        target.revision,
        target.tenant_members,
        operator,
        &target.managed_gateways,
    );
    read_unobserved(ctx, &access, observed).await?;
    claim_control_namespace(ctx, target, snap, named, &access, observed).await?;
    let before = plan::access_grants(observed, operator);
    for object in plan::access_writes(&access, observed, &target.uid) {
        let applied = ctx.applier.apply(object).await?;
        observed.insert(object.key.clone(), applied);
    }
    let gained: BTreeMap<String, render::AccessGrant> = plan::access_grants(observed, operator)
        .into_iter()
        .filter(|(ns, grant)| before.get(ns) != Some(grant))
        .collect();
    let selector =
        render::ownership_selector(&target.revision.tenant, &target.control_plane.revision());
    observe_bound(ctx, &selector, &gained, observed).await
}

/// Makes sure the control namespace is the tenant's before anything is written into it: creates
/// it when it does not exist and records its UID in the status at once (so a crash before the
/// full status write cannot orphan it), and refuses one that is not the tenant's.
async fn claim_control_namespace(
    ctx: &Context,
    target: &Target<'_>,
    snap: &super::Snapshot,
    named: &Named,
    access: &[DesiredObject],
    observed: &mut BTreeMap<ObjectKey, Value>,
) -> Result<(), Error> {
    let rev = target.revision;
    let claimants: Vec<ControlPlaneFacts> = snap
        .control_planes
        .iter()
        .filter(|c| c.spec.tenant == rev.tenant && c.control_namespace() == rev.control_namespace)
        .map(ControlPlaneFacts::from)
        .collect();
    match plan::control_namespace_step(
        &rev.control_namespace,
        observed.get(&named.namespace),
        &claimants,
    ) {
        plan::ControlNamespaceStep::Ours => Ok(()),
        plan::ControlNamespaceStep::Refused(why) => Err(Error::ControlNamespaceNotOwned {
            namespace: rev.control_namespace.clone(),
            why,
        }),
        plan::ControlNamespaceStep::Create => {
            let Some(desired) = access.iter().find(|d| d.key == named.namespace) else {
                return Ok(());
            };
            let created = ctx.applier.create(desired).await?;
            if let Some(uid) = created.pointer("/metadata/uid").and_then(Value::as_str) {
                record_control_namespace_uid(target.control_plane, uid, ctx).await?;
            }
            observed.insert(named.namespace.clone(), created);
            Ok(())
        }
    }
}

/// Records the control namespace's UID in the status by merge patch (the rest of the status
/// is written at the end of the reconcile).
async fn record_control_namespace_uid(
    mcp: &MeshControlPlane,
    uid: &str,
    ctx: &Context,
) -> Result<(), Error> {
    let api = Api::<MeshControlPlane>::all(ctx.client.clone());
    let body = json!({
        "metadata": {"name": mcp.name_any()},
        "status": {"controlNamespaceUID": uid},
    });
    api.patch_status(
        &mcp.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&body),
    )
    .await
    .map_err(Error::kube(
        "record the control namespace in MeshControlPlane status",
    ))?;
    ctx.metrics.record_write("MeshControlPlane/status", "patch");
    Ok(())
}

/// Performs one pass's writes, keeping `observed` what the API returned.
async fn perform(
    ctx: &Context,
    writes: &Writes,
    observed: &mut BTreeMap<ObjectKey, Value>,
    written: &mut Written,
) -> Result<(), Error> {
    for apply in &writes.apply {
        let key = &apply.object.key;
        if apply.replace {
            ctx.applier.delete(key).await?;
        }
        let applied = ctx.applier.apply(&apply.object).await?;
        observed.insert(key.clone(), applied);
        written.applied.insert(key.clone());
    }
    for key in &writes.prune {
        ctx.applier.delete(key).await?;
        observed.remove(key);
        written.pruned.insert(key.clone());
    }
    Ok(())
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
        .map(|m| m.trust_domain())
        .unwrap_or_else(|| names::default_trust_domain(&rev.tenant));
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
            let report = plan::in_use(mcp, pods, &ctx.now());
            publish(mcp, &report.notices, &snap, ctx).await;
            write_status(mcp, &report.status, ctx).await?;
            return Err(Error::InUse { pods });
        }
    }
    let observed = observe(ctx, &tenant, &revision).await?;
    for key in plan::teardown(&observed, &uid, &ctx.settings.operator_account) {
        ctx.applier.delete(key).await?;
    }
    info!(revision, "cleaned up");
    Ok(Action::await_change())
}
