//! Reconcile of one `MeshRevisionTag`: its status (resolved revision, sticky tenant, members,
//! conditions). The objects a tag affects (webhook selectors, bootstrap ConfigMaps) belong to
//! the control planes, which the tag's changes trigger.

use std::sync::Arc;
use std::time::Instant;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use meshplane_crds::membership::Conflict;
use meshplane_crds::{names, MeshRevisionTag, MeshRevisionTagStatus};
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
    for notice in notices(&name, tag.status.as_ref(), &new_status, &conflicts) {
        let type_ = if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(&tag.object_ref(&()), type_, notice.reason, notice.message)
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

/// Reason of the Event of a tag moving from one revision to another.
pub const TAG_MOVED: &str = "TagMoved";

/// An Event to publish on the tag.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Notice {
    warning: bool,
    reason: &'static str,
    message: String,
}

/// The Events a change of the tag's status brings, decided from the status it had
/// (`previous`) and the one about to be written: a Warning for its first conflict (not while
/// it is already Degraded), and `TagMoved` when the revision it resolves to changes (the
/// status keeps the last accepted revision while a move is refused, so a refused move is no
/// move). An unchanged status is never written, so it brings none.
fn notices(
    tag: &str,
    previous: Option<&MeshRevisionTagStatus>,
    new: &MeshRevisionTagStatus,
    conflicts: &[&Conflict],
) -> Vec<Notice> {
    let mut out = Vec::new();
    let was_degraded = previous
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == types::DEGRADED))
        .is_some_and(|c| c.status == "True");
    if let (Some(c), false) = (conflicts.first(), was_degraded) {
        out.push(Notice {
            warning: true,
            reason: c.reason(),
            message: c.to_string(),
        });
    }
    if let (Some(from), Some(to)) = (
        previous.and_then(|s| s.revision.as_deref()),
        new.revision.as_deref(),
    ) {
        if from != to {
            let namespaces = new.members.as_ref().map_or(0, |m| m.count);
            out.push(Notice {
                warning: false,
                reason: TAG_MOVED,
                message: format!(
                    "tag {tag} moved from revision {from} to {to}; the {namespaces} namespace(s) labelled with it follow, their new pods get {to}'s sidecar"
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use meshplane_crds::controlplane::NamespaceList;

    fn mk_status(revision: &str, degraded: bool, namespaces: i32) -> MeshRevisionTagStatus {
        MeshRevisionTagStatus {
            revision: Some(revision.into()),
            tenant: Some("blue".into()),
            conditions: vec![Condition {
                type_: types::DEGRADED.into(),
                status: if degraded { "True" } else { "False" }.into(),
                reason: "AsExpected".into(),
                message: String::new(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: Some(1),
            }],
            members: Some(NamespaceList {
                count: namespaces,
                names: Vec::new(),
            }),
            ..Default::default()
        }
    }

    fn reasons(notices: &[Notice]) -> Vec<&str> {
        notices.iter().map(|n| n.reason).collect()
    }

    #[test]
    fn a_move_is_told_once_with_where_from_and_where_to() {
        let before = mk_status("blue-v1", false, 2);
        let moved = mk_status("blue-v2", false, 2);
        let told = notices("blue-stable", Some(&before), &moved, &[]);
        assert_eq!(reasons(&told), [TAG_MOVED]);
        assert!(!told[0].warning);
        assert!(
            told[0].message.contains("from revision blue-v1 to blue-v2")
                && told[0].message.contains("the 2 namespace(s)"),
            "{}",
            told[0].message
        );
        // The next status compared with the one written: no move, nothing told.
        assert_eq!(notices("blue-stable", Some(&moved), &moved, &[]), []);
        // The first resolution is no move either.
        assert_eq!(notices("blue-stable", None, &moved, &[]), []);
    }

    #[test]
    fn a_refused_move_warns_once_and_is_no_move() {
        let before = mk_status("blue-v1", false, 1);
        let conflict = Conflict::TagMovedAcrossTenants {
            tag: "blue-stable".into(),
            recorded_tenant: "blue".into(),
            target: "red-v1".into(),
            target_tenant: "red".into(),
        };
        // The status keeps the last accepted revision while the move is refused.
        let refused = mk_status("blue-v1", true, 1);
        let told = notices("blue-stable", Some(&before), &refused, &[&conflict]);
        assert_eq!(reasons(&told), [conflict.reason()]);
        assert!(told[0].warning);
        assert_eq!(
            notices("blue-stable", Some(&refused), &refused, &[&conflict]),
            []
        );
    }
}
