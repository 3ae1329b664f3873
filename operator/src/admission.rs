//! The operator's own admission check of `MeshControlPlane` and `MeshRevisionTag`: the same
//! membership rules as the status conditions, applied at `kubectl apply` time. [`review`] is
//! pure; [`handle`] reads the current objects and calls it, and says how the request ended for
//! the metrics (`meshplane_operator_webhook_*`, [`DENIAL_REASONS`]).

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::Client;
use meshplane_crds::membership::{self, Conflict, ControlPlaneFacts, NamespaceFacts, TagFacts};
use meshplane_crds::providers::foreign_provider_namespaces;
use meshplane_crds::selector::Selector;
use meshplane_crds::validation::{validate_mesh_control_plane, validate_revision_tag};
use meshplane_crds::{MeshControlPlane, MeshRevisionTag};
use meshplane_webhooks::metrics::Outcome;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

/// Path the operator serves the check on (contract 9).
pub const PATH: &str = meshplane_contracts::operator_tls::ADMISSION_PATH;

fn decode<T: DeserializeOwned>(obj: &DynamicObject) -> Result<T, String> {
    serde_json::to_value(obj)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("cannot decode the object: {e}"))
}

/// Every `reason` the check denies with, in `meshplane_operator_webhook_denials_total`:
/// `malformed` (the object does not decode), `invalid` (a rule of the object alone),
/// `provider_outside_tenant` (an extension provider naming a namespace of another tenant), and the
/// conflict with other control planes or tags (the condition reasons, in snake case).
pub const DENIAL_REASONS: [&str; 12] = [
    "malformed",
    "invalid",
    "provider_outside_tenant",
    "revision_conflict",
    "invalid_selector",
    "control_namespace_mismatch",
    "control_namespace_taken",
    "control_namespace_not_owned",
    "trust_domain_mismatch",
    "trust_domain_taken",
    "tag_named_like_revision",
    "tag_moved_across_tenants",
];

/// The `reason` label of a denial for `conflict` (one of [`DENIAL_REASONS`]).
fn conflict_reason(conflict: &Conflict) -> &'static str {
    match conflict {
        Conflict::DuplicateRevision { .. } => "revision_conflict",
        Conflict::InvalidSelector { .. } => "invalid_selector",
        Conflict::ControlNamespaceMismatch { .. } => "control_namespace_mismatch",
        Conflict::ControlNamespaceTaken { .. } => "control_namespace_taken",
        Conflict::ControlNamespaceNotOwned { .. } => "control_namespace_not_owned",
        Conflict::TrustDomainMismatch { .. } => "trust_domain_mismatch",
        Conflict::TrustDomainTaken { .. } => "trust_domain_taken",
        Conflict::TagNamedLikeRevision { .. } => "tag_named_like_revision",
        Conflict::TagMovedAcrossTenants { .. } => "tag_moved_across_tenants",
        // Only ever a warning: a tag may be created before its revision.
        Conflict::TagRevisionNotFound { .. } => "invalid",
    }
}

fn deny_conflicts(
    resp: AdmissionResponse,
    conflicts: &[&Conflict],
) -> (AdmissionResponse, Outcome) {
    let msg = conflicts
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join("; ");
    let reason = conflicts.first().map_or("invalid", |c| conflict_reason(c));
    (resp.deny(msg), Outcome::Denied(reason))
}

/// Decides one request against the existing control planes and tags, and (for a control
/// plane) its control namespace as it exists (`None`: it does not exist yet).
pub fn review(
    req: &AdmissionRequest<DynamicObject>,
    control_planes: &[MeshControlPlane],
    tags: &[MeshRevisionTag],
    control_namespace: Option<&NamespaceFacts>,
) -> AdmissionResponse {
    judge(req, control_planes, tags, control_namespace).0
}

/// [`review`], with how the request ended for the metrics.
pub fn judge(
    req: &AdmissionRequest<DynamicObject>,
    control_planes: &[MeshControlPlane],
    tags: &[MeshRevisionTag],
    control_namespace: Option<&NamespaceFacts>,
) -> (AdmissionResponse, Outcome) {
    judge_in(req, control_planes, tags, control_namespace, &[])
}

/// Why namespace `ns` is not a namespace of the candidate control plane's tenant, or `None`
/// when it is one or may still join it: another tenant's control namespace or member, a
/// namespace the candidate's `namespaceSelector` excludes, or a system namespace that is not
/// a member.
fn provider_namespace_refusal(
    ns: &str,
    mcp: &MeshControlPlane,
    m: &membership::Membership,
    namespaces: &[NamespaceFacts],
) -> Option<String> {
    let tenant = &mcp.spec.tenant;
    if ns == mcp.control_namespace() || m.tenant_members(tenant).contains(ns) {
        return None;
    }
    for (other, t) in m.tenants.iter().filter(|(t, _)| *t != tenant) {
        if t.control_namespace == ns {
            return Some(format!("the control namespace of tenant {other:?}"));
        }
        if t.members.contains(ns) {
            return Some(format!("a namespace of tenant {other:?}"));
        }
    }
    if membership::RESERVED_NAMESPACES.contains(&ns) {
        return Some("a system namespace that is not a member of the tenant".into());
    }
    let facts = namespaces.iter().find(|n| n.name == ns)?;
    let selector = mcp.spec.namespace_selector.as_ref()?;
    let selector = Selector::from_label_selector(selector, "spec.namespaceSelector").ok()?;
    (!selector.matches(&facts.labels)).then(|| {
        "outside the control plane's namespaceSelector, so it can never join the tenant".into()
    })
}

/// [`judge`], knowing the cluster's namespaces: a control plane whose extension providers name
/// a namespace outside its tenant is refused ([`provider_namespace_refusal`]); one naming a
/// namespace that has not joined yet is admitted with a warning.
pub fn judge_in(
    req: &AdmissionRequest<DynamicObject>,
    control_planes: &[MeshControlPlane],
    tags: &[MeshRevisionTag],
    control_namespace: Option<&NamespaceFacts>,
    namespaces: &[NamespaceFacts],
) -> (AdmissionResponse, Outcome) {
    let resp = AdmissionResponse::from(req);
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return (resp, Outcome::Allowed);
    }
    let Some(obj) = req.object.as_ref() else {
        return (resp.deny("the request carries no object"), Outcome::Error);
    };
    match req.kind.kind.as_str() {
        "MeshControlPlane" => {
            let mcp: MeshControlPlane = match decode(obj) {
                Ok(m) => m,
                Err(e) => return (resp.deny(e), Outcome::Denied("malformed")),
            };
            if let Err(errs) = validate_mesh_control_plane(&mcp) {
                return (resp.deny(errs), Outcome::Denied("invalid"));
            }
            let name = mcp.metadata.name.clone().unwrap_or_default();
            let mut candidate = ControlPlaneFacts::from(&mcp);
            // What the operator recorded lives in the status of the stored object.
            if let Some(stored) = control_planes
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(&name))
            {
                let recorded = ControlPlaneFacts::from(stored);
                candidate.control_namespace_uid = recorded.control_namespace_uid;
                candidate.legacy_claim = recorded.legacy_claim;
            }
            let mut cps: Vec<ControlPlaneFacts> = control_planes
                .iter()
                .filter(|c| c.metadata.name.as_deref() != Some(&name))
                .map(ControlPlaneFacts::from)
                .collect();
            let trust_domain_conflict = membership::trust_domain_conflict(&candidate, &cps);
            cps.push(candidate);
            // The tenant's other control planes may vouch for an existing control namespace.
            let taken: Vec<Conflict> = membership::control_namespace_claims(&cps, |n| {
                control_namespace.filter(|ns| ns.name == n).cloned()
            })
            .into_iter()
            .filter(|c| c.control_plane() == Some(name.as_str()))
            .collect();
            if !taken.is_empty() {
                return deny_conflicts(resp, &taken.iter().collect::<Vec<_>>());
            }
            let tag_facts: Vec<TagFacts> = tags.iter().map(TagFacts::from).collect();
            let m = membership::compute(&[], &cps, &tag_facts);
            let conflicts: Vec<&Conflict> = m
                .conflicts
                .iter()
                .filter(|c| match c {
                    Conflict::TagNamedLikeRevision { control_plane, .. } => *control_plane == name,
                    other => other.control_plane() == Some(name.as_str()),
                })
                .collect();
            if !conflicts.is_empty() {
                return deny_conflicts(resp, &conflicts);
            }
            // A trust domain is one tenant's, whoever is older: membership alone would let an
            // older tenant take a younger one's. An update that keeps it is judged by
            // membership above (an older tenant keeps what it has).
            let old_trust_domain = req
                .old_object
                .as_ref()
                .and_then(|o| decode::<MeshControlPlane>(o).ok())
                .map(|m| m.trust_domain());
            if old_trust_domain.as_deref() != Some(mcp.trust_domain().as_str()) {
                if let Some(c) = &trust_domain_conflict {
                    return deny_conflicts(resp, &[c]);
                }
            }
            let with_namespaces = membership::compute(namespaces, &cps, &tag_facts);
            let providers = &mcp.spec.mesh_config.extension_providers;
            let foreign = foreign_provider_namespaces(providers, "spec.meshConfig", &|ns| {
                provider_namespace_refusal(ns, &mcp, &with_namespaces, namespaces)
            });
            if !foreign.is_empty() {
                let msg = foreign
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                return (resp.deny(msg), Outcome::Denied("provider_outside_tenant"));
            }
            let not_yet = foreign_provider_namespaces(providers, "spec.meshConfig", &|ns| {
                let member = ns == mcp.control_namespace()
                    || with_namespaces
                        .tenant_members(&mcp.spec.tenant)
                        .contains(ns);
                (!member).then(|| "not a namespace of the tenant yet".to_string())
            });
            let mut resp = resp;
            if !not_yet.is_empty() {
                resp.warnings = Some(
                    not_yet
                        .iter()
                        .map(|f| {
                            format!(
                                "{}: {:?} is in namespace {:?}, which is not a namespace of the tenant yet: the provider is not used until it joins",
                                f.field, f.service, f.namespace
                            )
                        })
                        .collect(),
                );
            }
            (resp, Outcome::Allowed)
        }
        "MeshRevisionTag" => {
            let tag: MeshRevisionTag = match decode(obj) {
                Ok(t) => t,
                Err(e) => return (resp.deny(e), Outcome::Denied("malformed")),
            };
            if let Err(errs) = validate_revision_tag(&tag) {
                return (resp.deny(errs), Outcome::Denied("invalid"));
            }
            let name = tag.metadata.name.clone().unwrap_or_default();
            // The sticky tenant lives in the status of the stored object.
            let stored_status = tags
                .iter()
                .find(|t| t.metadata.name.as_deref() == Some(&name))
                .and_then(|t| t.status.clone())
                .or_else(|| {
                    req.old_object
                        .as_ref()
                        .and_then(|o| decode::<MeshRevisionTag>(o).ok())
                        .and_then(|t| t.status)
                });
            let mut candidate = TagFacts::from(&tag);
            candidate.recorded_tenant = stored_status.as_ref().and_then(|s| s.tenant.clone());
            candidate.recorded_revision = stored_status.as_ref().and_then(|s| s.revision.clone());
            let mut tag_facts: Vec<TagFacts> = tags
                .iter()
                .filter(|t| t.metadata.name.as_deref() != Some(&name))
                .map(TagFacts::from)
                .collect();
            tag_facts.push(candidate);
            let cps: Vec<ControlPlaneFacts> =
                control_planes.iter().map(ControlPlaneFacts::from).collect();
            let m = membership::compute(&[], &cps, &tag_facts);
            let conflicts = m.conflicts_of_tag(&name);
            let (refused, warnings): (Vec<&Conflict>, Vec<&Conflict>) = conflicts
                .into_iter()
                .partition(|c| !matches!(c, Conflict::TagRevisionNotFound { .. }));
            if !refused.is_empty() {
                return deny_conflicts(resp, &refused);
            }
            let mut resp = resp;
            if !warnings.is_empty() {
                // A tag may be created before its revision; say so instead of refusing.
                resp.warnings = Some(warnings.iter().map(|c| c.to_string()).collect());
            }
            (resp, Outcome::Allowed)
        }
        other => (
            resp.deny(format!("unexpected kind {other:?}")),
            Outcome::Error,
        ),
    }
}

/// Reads the current objects and reviews one AdmissionReview; an answer that could not read
/// them is an [`Outcome::Error`].
pub async fn handle(
    client: &Client,
    review_in: AdmissionReview<DynamicObject>,
) -> (AdmissionReview<DynamicObject>, Outcome) {
    let req: AdmissionRequest<DynamicObject> = match review_in.try_into() {
        Ok(r) => r,
        Err(e) => {
            return (
                AdmissionResponse::invalid(e.to_string()).into_review(),
                Outcome::Error,
            )
        }
    };
    let cps = Api::<MeshControlPlane>::all(client.clone())
        .list(&ListParams::default())
        .await;
    let tags = Api::<MeshRevisionTag>::all(client.clone())
        .list(&ListParams::default())
        .await;
    let control_namespace = match control_namespace_of(client, &req).await {
        Ok(ns) => ns,
        Err(e) => {
            warn!(error = %e, "admission: reading the control namespace failed");
            let resp = AdmissionResponse::from(&req).deny(format!(
                "meshplane admission could not read the control namespace: {e}"
            ));
            return (resp.into_review(), Outcome::Error);
        }
    };
    let namespaces = if req.kind.kind == "MeshControlPlane" {
        Api::<Namespace>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .map(|n| NamespaceFacts::of(&n.metadata))
                    .collect()
            })
    } else {
        Ok(Vec::new())
    };
    let (resp, outcome) = match (cps, tags, namespaces) {
        (Ok(cps), Ok(tags), Ok(namespaces)) => judge_in(
            &req,
            &cps.items,
            &tags.items,
            control_namespace.as_ref(),
            &namespaces,
        ),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            warn!(error = %e, "admission: listing meshplane objects failed");
            let resp = AdmissionResponse::from(&req).deny(format!(
                "meshplane admission could not read the current objects: {e}"
            ));
            (resp, Outcome::Error)
        }
    };
    info!(kind = %req.kind.kind, name = %req.name, allowed = resp.allowed, outcome = outcome.as_str(), "admission review");
    (resp.into_review(), outcome)
}

/// The control namespace a MeshControlPlane request names, as it exists now (`None`: it does
/// not exist, or the request is not a control plane).
async fn control_namespace_of(
    client: &Client,
    req: &AdmissionRequest<DynamicObject>,
) -> Result<Option<NamespaceFacts>, kube::Error> {
    let Some(mcp) = (req.kind.kind == "MeshControlPlane")
        .then_some(req.object.as_ref())
        .flatten()
        .and_then(|o| decode::<MeshControlPlane>(o).ok())
    else {
        return Ok(None);
    };
    let ns = Api::<Namespace>::all(client.clone())
        .get_opt(&mcp.control_namespace())
        .await?;
    Ok(ns.map(|n| NamespaceFacts::of(&n.metadata)))
}
