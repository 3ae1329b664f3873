//! Reconcile of one `MeshRevisionTag`: its status (resolved revision, sticky tenant, members,
//! conditions). The objects a tag affects (webhook selectors, bootstrap ConfigMaps) belong to
//! the control planes, which the tag's changes trigger.

use std::sync::Arc;
use std::time::Instant;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use meshplane_crds::{names, MeshRevisionTag};
use serde_json::json;
use tracing::instrument;

use super::{Context, Error, TAG_CONTROLLER};
use crate::status::{self, types};

#[instrument(skip_all, fields(tag = %tag.name_any()))]
pub async fn reconcile_tag(tag: Arc<MeshRevisionTag>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile(&tag, &ctx).await;
    ctx.metrics
        .record_reconcile(TAG_CONTROLLER, started.elapsed().as_secs_f64());
    ctx.metrics.record_result(TAG_CONTROLLER, result.is_ok());
    if result.is_ok() {
        ctx.succeeded(&format!("{TAG_CONTROLLER}/{}", tag.name_any()));
    }
    result
}

async fn reconcile(tag: &MeshRevisionTag, ctx: &Context) -> Result<Action, Error> {
    if tag.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // From the caches: they are fed by the same watches as this controller's triggers, and
    // hold each change before it triggers anything.
    let snap = ctx.cluster_snapshot().await?;
    let name = tag.name_any();
    let conflicts = snap.membership.conflicts_of_tag(&name);
    let new_status =
        status::tag_status(tag, snap.membership.tags.get(&name), &conflicts, &ctx.now());
    if tag.status.as_ref() == Some(&new_status) {
        return Ok(Action::requeue(ctx.settings.resync));
    }
    let was_degraded = tag
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == types::DEGRADED))
        .is_some_and(|c| c.status == "True");
    if let (Some(c), false) = (conflicts.first(), was_degraded) {
        ctx.event(
            &tag.object_ref(&()),
            EventType::Warning,
            c.reason(),
            c.to_string(),
        )
        .await;
    }
    let body = json!({
        "apiVersion": "meshplane.io/v1alpha1",
        "kind": "MeshRevisionTag",
        "metadata": {"name": name},
        "status": serde_json::to_value(&new_status)?,
    });
    Api::<MeshRevisionTag>::all(ctx.client.clone())
        .patch_status(
            &name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(Error::kube("apply MeshRevisionTag status"))?;
    ctx.metrics.record_write("MeshRevisionTag/status", "apply");
    Ok(Action::requeue(ctx.settings.resync))
}
