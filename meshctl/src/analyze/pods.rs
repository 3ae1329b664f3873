//! Pods and the revision that injected them (`sidecar.meshplane.io/revision`) against where
//! their namespace belongs now: pods still on an old revision, pods whose tenant is gone, pods
//! of member namespaces without a sidecar.

use meshplane_crds::names;

use super::codes;
use super::{Context, Finding};
use crate::state::placement;

pub(super) fn check(cx: &Context<'_>, out: &mut Vec<Finding>) {
    let m = &cx.membership;
    for pod in cx.state.pods() {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let object = format!("Pod {ns}/{name}");
        let labels = cx.state.namespace_labels(&ns).unwrap_or_default();
        let place = placement(m, &labels, &ns);
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let injected_by = annotations.get(names::INJECTED_REVISION_ANNOTATION);
        let finding = match injected_by {
            Some(rev) => match (m.revisions.get(rev), &place) {
                (None, _) => Some(Finding::new(
                    codes::POD_REVISION_NOT_FOUND,
                    object,
                    format!("its sidecar was injected by revision {rev:?}, which no active MeshControlPlane provides; its proxy gets no configuration until the pod is re-created"),
                )),
                (Some(r), None) => Some(Finding::new(
                    codes::POD_OUTSIDE_TENANT,
                    object,
                    format!("its sidecar was injected by revision {rev:?} of tenant {:?}, but namespace {ns:?} belongs to no tenant now; the instance refuses its proxy", r.tenant),
                )),
                (Some(r), Some(p)) if p.tenant != r.tenant => Some(Finding::new(
                    codes::POD_OUTSIDE_TENANT,
                    object,
                    format!("its sidecar was injected by revision {rev:?} of tenant {:?}, but namespace {ns:?} now belongs to tenant {:?}; restart the pod", r.tenant, p.tenant),
                )),
                (Some(_), Some(p)) if p.revision != *rev => Some(Finding::new(
                    codes::POD_REVISION_MISMATCH,
                    object,
                    format!(
                        "it runs the sidecar of revision {rev:?} while namespace {ns:?} is attached to revision {:?}{}; restart the pod to move it",
                        p.revision,
                        p.tag.as_ref().map(|t| format!(" (through tag {t:?})")).unwrap_or_default()
                    ),
                )),
                _ => None,
            },
            None => {
                let opted_out = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(names::INJECT_LABEL))
                    .is_some_and(|v| v == "false");
                let member = place.as_ref().is_some_and(|p| p.control_namespace != ns);
                (member && !opted_out).then(|| {
                    Finding::new(
                        codes::POD_WITHOUT_SIDECAR,
                        object,
                        format!(
                            "namespace {ns:?} is a member of tenant {:?} (revision {:?}) but the pod has no sidecar; it was created before the namespace joined, or injection failed: restart it",
                            place.as_ref().map(|p| p.tenant.as_str()).unwrap_or_default(),
                            place.as_ref().map(|p| p.revision.as_str()).unwrap_or_default()
                        ),
                    )
                })
            }
        };
        if let Some(f) = finding {
            let origin = cx
                .state
                .entries
                .iter()
                .rev()
                .find(|e| e.kind() == "Pod" && e.namespace() == Some(&ns) && e.name() == name)
                .map(|e| e.origin.clone());
            out.push(match origin {
                Some(o) => f.at(o),
                None => f,
            });
        }
    }
}
