//! Reconcile of one `MeshRevisionMigration`: gathers what the step function needs (the tag,
//! both revisions, the batch's workloads and pods, the new revision's `/debug/proxies`, the
//! proxies' `/stats/prometheus`), runs [`crate::migration::step::step`], then writes: status
//! first (so the operator resumes from it after a restart), then the tag and the restarts,
//! then Events. Pods and instances are read through the API server's `pods/proxy`, with the
//! operator's rights in the namespace (the per-namespace RoleBinding of
//! [`names::WORKLOAD_RESTARTER_ROLE`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};
use meshplane_crds::names::{self, ports};
use meshplane_crds::selector::label_selector_matches;
use meshplane_crds::{MeshControlPlane, MeshRevisionMigration, MeshRevisionTag};
use serde_json::json;
use tracing::{info, instrument};

use super::{Context, Error, MIGRATION_CONTROLLER};
use crate::migration::proxies::{parse_debug_proxies, ConnectedProxy};
use crate::migration::stats::{parse_prometheus, ProxyTraffic};
use crate::migration::step::{self, Effect, RevisionState, TagState, World};
use crate::migration::workloads::{self, WorkloadKind, WorkloadState};
use crate::status::types;

/// The instance pods' `app.kubernetes.io/name`.
const INSTANCE_APP: &str = "meshplane-xds";

#[instrument(skip_all, fields(migration = %m.name_any()))]
pub async fn reconcile_migration(
    m: Arc<MeshRevisionMigration>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile(&m, &ctx).await;
    ctx.metrics
        .record_reconcile(MIGRATION_CONTROLLER, started.elapsed().as_secs_f64());
    ctx.metrics
        .record_result(MIGRATION_CONTROLLER, result.is_ok());
    if result.is_ok() {
        ctx.succeeded(&format!("{MIGRATION_CONTROLLER}/{}", m.name_any()));
    }
    result
}

fn revision_state(mcp: &MeshControlPlane) -> RevisionState {
    let status = mcp.status.as_ref();
    RevisionState {
        tenant: mcp.spec.tenant.clone(),
        ready: status
            .into_iter()
            .flat_map(|s| &s.conditions)
            .any(|c| c.type_ == types::READY && c.status == "True"),
        tags: status.map(|s| s.tags.clone()).unwrap_or_default(),
    }
}

async fn reconcile(m: &MeshRevisionMigration, ctx: &Context) -> Result<Action, Error> {
    if m.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if m.status.as_ref().is_some_and(|s| s.phase.is_final()) {
        return Ok(Action::await_change());
    }
    let snap = ctx.cluster_snapshot().await?;
    let spec = &m.spec;
    let status = m.status.clone().unwrap_or_default();
    let find_revision = |rev: &str| {
        snap.control_planes
            .iter()
            .find(|c| c.revision() == rev)
            .cloned()
    };
    let target_cp = find_revision(&spec.revision);
    let previous_cp = status.from_revision.as_deref().and_then(find_revision);
    let tag = snap
        .tags
        .iter()
        .find(|t| t.name_any() == spec.tag)
        .map(|t| {
            let members = snap
                .membership
                .tags
                .get(&spec.tag)
                .map(|r| {
                    r.namespaces
                        .iter()
                        .filter(|n| !snap.membership.rejected.contains_key(*n))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            TagState {
                revision: t.spec.revision.clone(),
                tenant: t.status.as_ref().and_then(|s| s.tenant.clone()),
                members,
            }
        });
    let target_proxies = match &target_cp {
        Some(cp) => instance_proxies(&ctx.client, cp).await,
        None => Err(format!("revision {} not found", spec.revision)),
    };
    let mut workloads = BTreeMap::new();
    for (namespace, with_stats) in step::namespaces_to_observe(&status) {
        let observed = namespace_workloads(&ctx.client, &namespace, with_stats).await?;
        workloads.insert(namespace, observed);
    }
    let now_time = ctx.now();
    let world = World {
        now: now_time.0,
        tag,
        target: target_cp.as_ref().map(revision_state),
        previous: previous_cp.as_ref().map(revision_state),
        workloads,
        target_proxies,
    };
    let mut out = step::step(spec, m.status.as_ref(), &world);
    out.status.observed_generation = m.metadata.generation;
    let name = m.name_any();
    if m.status.as_ref() != Some(&out.status) {
        let body = json!({
            "apiVersion": "meshplane.io/v1alpha1",
            "kind": "MeshRevisionMigration",
            "metadata": {"name": name},
            "status": serde_json::to_value(&out.status)?,
        });
        Api::<MeshRevisionMigration>::all(ctx.client.clone())
            .patch_status(
                &name,
                &PatchParams::apply(names::FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(Error::kube("apply MeshRevisionMigration status"))?;
        ctx.metrics
            .record_write("MeshRevisionMigration/status", "apply");
    }
    for effect in &out.effects {
        perform(ctx, &spec.tag, effect).await?;
    }
    let reference = m.object_ref(&());
    for notice in out.notices {
        info!(reason = notice.reason, message = %notice.message, "migration");
        let kind = if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(&reference, kind, notice.reason, notice.message)
            .await;
    }
    Ok(match out.requeue {
        Some(d) => Action::requeue(d.max(std::time::Duration::from_millis(200))),
        None => Action::await_change(),
    })
}

async fn perform(ctx: &Context, tag: &str, effect: &Effect) -> Result<(), Error> {
    match effect {
        Effect::MoveTag { revision } => {
            Api::<MeshRevisionTag>::all(ctx.client.clone())
                .patch(
                    tag,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"revision": revision}})),
                )
                .await
                .map_err(Error::kube("move MeshRevisionTag"))?;
            ctx.metrics.record_write("MeshRevisionTag", "patch");
            info!(tag, revision, "moved tag");
        }
        Effect::Restart {
            workloads,
            restarted_at,
        } => {
            // What `kubectl rollout restart` sends: a strategic-merge (here: merge) patch of
            // the pod template's annotation.
            let patch = Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
                names::RESTARTED_AT_ANNOTATION: restarted_at}}}}}));
            let params = PatchParams::default();
            for (kind, namespace, name) in workloads {
                let result = match kind {
                    WorkloadKind::Deployment => {
                        Api::<Deployment>::namespaced(ctx.client.clone(), namespace)
                            .patch(name, &params, &patch)
                            .await
                            .map(|_| ())
                    }
                    WorkloadKind::StatefulSet => {
                        Api::<StatefulSet>::namespaced(ctx.client.clone(), namespace)
                            .patch(name, &params, &patch)
                            .await
                            .map(|_| ())
                    }
                    WorkloadKind::DaemonSet => {
                        Api::<DaemonSet>::namespaced(ctx.client.clone(), namespace)
                            .patch(name, &params, &patch)
                            .await
                            .map(|_| ())
                    }
                };
                match result {
                    Ok(()) => {}
                    // Deleted meanwhile: nothing to restart.
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(Error::kube("restart workload")(e)),
                }
                ctx.metrics.record_write(kind.as_str(), "patch");
                info!(kind = kind.as_str(), %namespace, %name, %restarted_at, "restarted workload");
            }
        }
    }
    Ok(())
}

/// `GET path` through the API server, as text, with `debug_token` in the header the
/// instances' `/debug` endpoints read (contract 12).
async fn get_text(
    client: &Client,
    path: &str,
    debug_token: Option<&str>,
) -> Result<String, String> {
    let mut request = http::Request::get(path);
    if let Some(token) = debug_token {
        request = request.header(names::debug::TOKEN_HEADER, token);
    }
    let request = request.body(Vec::new()).map_err(|e| e.to_string())?;
    client.request_text(request).await.map_err(|e| match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    })
}

/// A short-lived token of the control namespace's debug ServiceAccount (contract 12), requested
/// with the operator's rights there (the per-namespace RoleBinding of
/// [`names::WORKLOAD_RESTARTER_ROLE`]).
async fn debug_token(client: &Client, cp: &MeshControlPlane) -> Result<String, String> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let namespace = cp.control_namespace();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![names::debug::audience(&cp.spec.tenant)]),
            expiration_seconds: Some(names::debug::TOKEN_LIFETIME_SECONDS),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(client.clone(), &namespace)
        .create_token_request(
            names::debug::SERVICE_ACCOUNT,
            &kube::api::PostParams::default(),
            &request,
        )
        .await
        .map_err(|e| {
            format!(
                "requesting a token of {namespace}/{}: {e}",
                names::debug::SERVICE_ACCOUNT
            )
        })?;
    issued
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("the TokenRequest in {namespace} answered no token"))
}

/// Every proxy connected to a running instance pod of `cp` (contract: `/debug/proxies` on the
/// monitoring port, contract 12 for the token).
async fn instance_proxies(
    client: &Client,
    cp: &MeshControlPlane,
) -> Result<Vec<ConnectedProxy>, String> {
    let namespace = cp.control_namespace();
    let selector = format!(
        "app.kubernetes.io/name={INSTANCE_APP},{}={}",
        names::REVISION_LABEL,
        cp.revision()
    );
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("listing the instance pods in {namespace}: {e}"))?;
    let running_pods: Vec<&Pod> = pods
        .items
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .collect();
    if running_pods.is_empty() {
        return Err(format!("no running instance pod in {namespace}"));
    }
    let token = tokio::time::timeout(STATS_READ_TIMEOUT, debug_token(client, cp))
        .await
        .map_err(|_| format!("no debug token from {namespace} within {STATS_READ_TIMEOUT:?}"))??;
    let mut out = Vec::new();
    for pod in running_pods {
        let name = pod.name_any();
        let path = format!(
            "/api/v1/namespaces/{namespace}/pods/{name}:{}/proxy/debug/proxies",
            ports::HTTP_MONITORING
        );
        let text = tokio::time::timeout(STATS_READ_TIMEOUT, get_text(client, &path, Some(&token)))
            .await
            .map_err(|_| {
                format!("instance {namespace}/{name}: no answer within {STATS_READ_TIMEOUT:?}")
            })?
            .map_err(|e| format!("instance {namespace}/{name}: {e}"))?;
        out.extend(
            parse_debug_proxies(&text)
                .map_err(|e| format!("instance {namespace}/{name} answered no proxy list: {e}"))?,
        );
    }
    Ok(out)
}

/// How long one read through `pods/proxy` (an instance's proxy list, a proxy's statistics) may
/// take: the client retries a 503 (a pod that does not answer) with backoff, which must not
/// hold up the gates of the whole batch.
const STATS_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// A proxy's inbound statistics through the readiness listener (contract 6).
async fn proxy_traffic(client: &Client, namespace: &str, pod: &str) -> Option<ProxyTraffic> {
    let path = format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}:{}/proxy{}",
        ports::PROXY_READY,
        meshplane_contracts::bootstrap::STATS_PATH
    );
    tokio::time::timeout(STATS_READ_TIMEOUT, get_text(client, &path, None))
        .await
        .ok()?
        .ok()
        .map(|t| parse_prometheus(&t))
}

fn selected<'a>(
    pods: &'a [Pod],
    selector: Option<&LabelSelector>,
) -> impl Iterator<Item = &'a Pod> + 'a {
    let selector = selector.cloned();
    pods.iter().filter(move |p| {
        p.metadata.deletion_timestamp.is_none()
            && selector
                .as_ref()
                .is_some_and(|s| label_selector_matches(s, p.labels()))
    })
}

/// The Deployments, StatefulSets and DaemonSets of `namespace` that do not opt out of
/// injection, each with its pods (and their statistics when `with_stats`).
async fn namespace_workloads(
    client: &Client,
    namespace: &str,
    with_stats: bool,
) -> Result<Vec<WorkloadState>, Error> {
    let lp = ListParams::default();
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(Error::kube("list pods of a migrating namespace"))?
        .items;
    let mut out = Vec::new();
    let mut push = |kind, name: String, template, selector: Option<&LabelSelector>, rolled_out| {
        if workloads::opts_out(template) {
            return;
        }
        out.push((
            WorkloadState {
                kind,
                namespace: namespace.to_string(),
                name,
                restarted_at: workloads::restarted_at(template),
                rolled_out,
                pods: selected(&pods, selector)
                    .map(workloads::pod_state)
                    .collect(),
            },
            selected(&pods, selector)
                .map(|p| {
                    (
                        p.name_any(),
                        p.status.as_ref().and_then(|s| s.pod_ip.clone()),
                    )
                })
                .collect::<Vec<_>>(),
        ));
    };
    let deployments = Api::<Deployment>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(Error::kube("list Deployments of a migrating namespace"))?;
    for d in &deployments.items {
        push(
            WorkloadKind::Deployment,
            d.name_any(),
            &d.spec.template,
            Some(&d.spec.selector),
            workloads::deployment_rolled_out(d),
        );
    }
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(Error::kube("list StatefulSets of a migrating namespace"))?;
    for s in &statefulsets.items {
        push(
            WorkloadKind::StatefulSet,
            s.name_any(),
            &s.spec.template,
            Some(&s.spec.selector),
            workloads::statefulset_rolled_out(s),
        );
    }
    let daemonsets = Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(Error::kube("list DaemonSets of a migrating namespace"))?;
    for d in &daemonsets.items {
        push(
            WorkloadKind::DaemonSet,
            d.name_any(),
            &d.spec.template,
            Some(&d.spec.selector),
            workloads::daemonset_rolled_out(d),
        );
    }
    let mut result = Vec::with_capacity(out.len());
    for (mut w, addresses) in out {
        if with_stats {
            for (pod, (name, ip)) in w.pods.iter_mut().zip(addresses) {
                // A pod not Ready yet has no statistics worth reading (its proxy may not even
                // listen), and the gates judge traffic only once every pod is Ready.
                if pod.ready && pod.revision.is_some() && ip.is_some() {
                    pod.traffic = proxy_traffic(client, namespace, &name).await;
                }
            }
        }
        result.push(w);
    }
    Ok(result)
}
