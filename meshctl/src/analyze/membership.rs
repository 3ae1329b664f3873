//! Control planes, tags and namespaces: the conflicts and rejections of
//! `meshplane_crds::membership`, with the messages the operator puts in conditions and Events.

use meshplane_crds::membership::{Conflict, RejectionReason};

use super::codes::{self, Code};
use super::{Context, Finding};

fn conflict_code(c: &Conflict) -> Code {
    match c {
        Conflict::DuplicateRevision { .. } => codes::DUPLICATE_REVISION,
        Conflict::InvalidSelector { .. } => codes::INVALID_SELECTOR,
        Conflict::ControlNamespaceMismatch { .. } => codes::CONTROL_NAMESPACE_MISMATCH,
        Conflict::ControlNamespaceTaken { .. } => codes::CONTROL_NAMESPACE_TAKEN,
        Conflict::ControlNamespaceNotOwned { .. } => codes::CONTROL_NAMESPACE_NOT_OWNED,
        Conflict::TrustDomainMismatch { .. } => codes::TRUST_DOMAIN_MISMATCH,
        Conflict::TrustDomainTaken { .. } => codes::TRUST_DOMAIN_TAKEN,
        Conflict::TagNamedLikeRevision { .. } => codes::TAG_NAMED_LIKE_REVISION,
        Conflict::TagMovedAcrossTenants { .. } => codes::TAG_MOVED_ACROSS_TENANTS,
        Conflict::TagRevisionNotFound { .. } => codes::TAG_REVISION_NOT_FOUND,
    }
}

fn rejection_code(r: &RejectionReason) -> Code {
    match r {
        RejectionReason::OutsideSelector => codes::NAMESPACE_OUTSIDE_SELECTOR,
        RejectionReason::UnknownRevision => codes::NAMESPACE_UNKNOWN_REVISION,
        RejectionReason::RevisionConflicted => codes::NAMESPACE_REVISION_CONFLICTED,
        RejectionReason::ControlNamespaceOfOtherTenant => {
            codes::NAMESPACE_IS_OTHER_CONTROL_NAMESPACE
        }
    }
}

/// Where the object of `kind` named `name` was read.
fn origin_of(cx: &Context<'_>, kind: &str, name: &str) -> Option<String> {
    cx.state
        .entries
        .iter()
        .rev()
        .find(|e| e.kind() == kind && e.name() == name && e.namespace().is_none())
        .map(|e| e.origin.clone())
}

fn located(cx: &Context<'_>, finding: Finding, kind: &str, name: &str) -> Finding {
    match origin_of(cx, kind, name) {
        Some(origin) => finding.at(origin),
        None => finding,
    }
}

pub(super) fn check(cx: &Context<'_>, out: &mut Vec<Finding>) {
    let m = &cx.membership;
    for c in &m.conflicts {
        let (kind, name) = match (c.control_plane(), c.tag()) {
            (Some(cp), _) => ("MeshControlPlane", cp.to_string()),
            (None, Some(tag)) => ("MeshRevisionTag", tag.to_string()),
            (None, None) => continue,
        };
        let finding = Finding::new(conflict_code(c), format!("{kind} {name}"), c.to_string());
        out.push(located(cx, finding, kind, &name));
    }
    for (name, tag) in &m.tags {
        if tag.revision.is_some() && tag.namespaces.is_empty() {
            let finding = Finding::new(
                codes::TAG_UNUSED,
                format!("MeshRevisionTag {name}"),
                format!(
                    "no namespace is labelled meshplane.io/rev={name}; the tag points at revision {:?}",
                    tag.revision.as_deref().unwrap_or_default()
                ),
            );
            out.push(located(cx, finding, "MeshRevisionTag", name));
        }
    }
    for (namespace, r) in &m.rejected {
        let finding = Finding::new(
            rejection_code(&r.reason),
            format!("Namespace {namespace}"),
            r.message.clone(),
        );
        out.push(located(cx, finding, "Namespace", namespace));
    }
}
