//! Pure membership computation: which namespaces belong to which revision and tenant, which are
//! refused and why, and which control planes or tags conflict.
//!
//! The operator (status conditions and rendered objects), its admission check and the
//! xds-server's directory mode all call [`compute`], so one set of rules decides membership.
//!
//! Rules, in the order they are applied:
//! 1. Control planes are ranked oldest first (`creationTimestamp`, then name; an object not yet
//!    created ranks last). The first claimant of a revision name wins; later ones get
//!    [`Conflict::DuplicateRevision`].
//! 2. A winner with an invalid `namespaceSelector` is [`Conflict::InvalidSelector`]; a winner whose
//!    control namespace differs from the tenant's oldest revision is
//!    [`Conflict::ControlNamespaceMismatch`]; a control namespace already used by another tenant is
//!    [`Conflict::ControlNamespaceTaken`]; likewise a trust domain other than the tenant's oldest
//!    revision's is [`Conflict::TrustDomainMismatch`] and one another tenant already uses is
//!    [`Conflict::TrustDomainTaken`]. Such a revision is *inactive*: it keeps its name
//!    reserved, but attaches nothing.
//! 3. Tags: a tag named like any revision is [`Conflict::TagNamedLikeRevision`]; a tag whose
//!    target lives in another tenant than the one recorded in its status is
//!    [`Conflict::TagMovedAcrossTenants`] and keeps resolving to its recorded revision; a tag whose
//!    target is not an active revision is [`Conflict::TagRevisionNotFound`].
//! 4. A namespace labelled `meshplane.io/rev=V` attaches to the active revision `V`, or to the
//!    revision of the resolved tag `V`, if that revision's selector admits it and it is not
//!    another tenant's control namespace; otherwise it is rejected with a [`RejectionReason`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};

use crate::controlplane::{MeshControlPlane, MeshRevisionTag};
use crate::names::REV_LABEL;
use crate::selector::Selector;

/// A namespace as membership sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceFacts {
    /// Namespace name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// `metadata.uid`; `None` where only the labels matter (membership of member namespaces).
    pub uid: Option<String>,
}

impl NamespaceFacts {
    /// A namespace with the given labels.
    pub fn new(name: &str, labels: &[(&str, &str)]) -> Self {
        Self {
            name: name.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            uid: None,
        }
    }

    /// A namespace as its metadata says (a `Namespace`, or a metadata-only watch's object).
    pub fn of(meta: &ObjectMeta) -> Self {
        Self {
            name: meta.name.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
        }
    }

    /// The same namespace with its `metadata.uid`.
    pub fn with_uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_string());
        self
    }
}

/// Namespaces no control plane may take, whether they exist or not.
pub const RESERVED_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Why `name` (as it exists, `None`: it does not) cannot be the control namespace of the
/// tenant of `claimants` (that tenant's control planes naming it); `None` when it can: it does
/// not exist yet (the operator creates it), or its UID is one a claimant vouches for (recorded
/// in `status.controlNamespaceUID` by the operator that created it, or handed over by the
/// platform admin's `meshplane.io/adopt-control-namespace` annotation). Labels prove nothing:
/// anyone who can create a namespace can set them, and the operator writes the tenant CA's
/// private key there. The one exception is a control plane reconciled by an operator that
/// recorded no UID ([`ControlPlaneFacts::legacy_claim`]): its namespace already holds what
/// the operator wrote, so meshplane's labels for the tenant still count, until the UID is
/// recorded on its next reconcile.
pub fn control_namespace_refusal(
    name: &str,
    existing: Option<&NamespaceFacts>,
    claimants: &[&ControlPlaneFacts],
) -> Option<String> {
    use crate::names::ADOPT_CONTROL_NAMESPACE_ANNOTATION;
    use meshplane_contracts::ownership::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, TENANT_LABEL};
    if RESERVED_NAMESPACES.contains(&name) {
        return Some("is a system namespace".to_string());
    }
    let ns = existing?;
    if let Some(uid) = ns.uid.as_deref() {
        let vouched = claimants.iter().any(|cp| {
            cp.control_namespace_uid.as_deref() == Some(uid)
                || cp.handed_namespace_uid.as_deref() == Some(uid)
        });
        if vouched {
            return None;
        }
    }
    let label = |k: &str| ns.labels.get(k).map(String::as_str);
    let ours = label(MANAGED_BY_LABEL) == Some(MANAGED_BY_VALUE);
    let tenant = claimants.first().map(|cp| cp.tenant.as_str());
    let labelled_for_tenant = ours && label(TENANT_LABEL) == tenant;
    if labelled_for_tenant && claimants.iter().any(|cp| cp.legacy_claim) {
        return None;
    }
    let handover = format!(
        "to hand it over, annotate the MeshControlPlane {ADOPT_CONTROL_NAMESPACE_ANNOTATION}=<the namespace's metadata.uid>"
    );
    Some(match (ours, label(TENANT_LABEL)) {
        (true, Some(t)) if Some(t) == tenant => format!(
            "exists and carries meshplane's labels for this tenant, but no control plane of the tenant recorded creating it (labels anyone can set are not proof); {handover}"
        ),
        (true, Some(other)) => format!("was created by meshplane for tenant {other:?}"),
        _ => match label(REV_LABEL) {
            Some(rev) => format!(
                "exists and is not meshplane's: it is labelled {REV_LABEL}={rev} (a member namespace)"
            ),
            None => format!(
                "exists and was not created by meshplane (it may be another tool's, or the operator's own); {handover}"
            ),
        },
    })
}

/// The conflicts of control planes whose control namespace is not theirs to take
/// ([`control_namespace_refusal`]; the claimants of a namespace are the control planes of the
/// same tenant naming it); `lookup` finds a namespace by name. The operator drops these
/// control planes before [`compute`] (so they claim nothing, evict nothing) and reports the
/// conflicts; its admission check refuses them.
pub fn control_namespace_claims(
    control_planes: &[ControlPlaneFacts],
    lookup: impl Fn(&str) -> Option<NamespaceFacts>,
) -> Vec<Conflict> {
    control_planes
        .iter()
        .filter_map(|cp| {
            let existing = lookup(&cp.control_namespace);
            let claimants: Vec<&ControlPlaneFacts> = control_planes
                .iter()
                .filter(|c| c.tenant == cp.tenant && c.control_namespace == cp.control_namespace)
                .collect();
            control_namespace_refusal(&cp.control_namespace, existing.as_ref(), &claimants).map(
                |why| Conflict::ControlNamespaceNotOwned {
                    control_plane: cp.name.clone(),
                    namespace: cp.control_namespace.clone(),
                    why,
                },
            )
        })
        .collect()
}

/// [`compute`] after dropping the control planes whose control namespace is not theirs to
/// take ([`control_namespace_claims`]; `lookup` finds any namespace by name): they claim
/// nothing and evict nothing, and carry a [`Conflict::ControlNamespaceNotOwned`] instead. The
/// operator's reconcile and `meshctl analyze` both call this, so they agree.
pub fn compute_guarded(
    namespaces: &[NamespaceFacts],
    control_planes: &[ControlPlaneFacts],
    tags: &[TagFacts],
    lookup: impl Fn(&str) -> Option<NamespaceFacts>,
) -> Membership {
    let refused = control_namespace_claims(control_planes, lookup);
    let refused_names: BTreeSet<&str> =
        refused.iter().filter_map(Conflict::control_plane).collect();
    let admitted: Vec<ControlPlaneFacts> = control_planes
        .iter()
        .filter(|c| !refused_names.contains(c.name.as_str()))
        .cloned()
        .collect();
    let mut membership = compute(namespaces, &admitted, tags);
    membership.conflicts.extend(refused);
    membership
}

/// Why `candidate` may not take its trust domain, whatever the ages: another tenant's control
/// plane uses it, or the tenant's other revisions use another one (the oldest's is expected).
/// [`compute`] decides by age, which would let an older control plane that changes its trust
/// domain take one a younger tenant holds; the admission check calls this on every create and
/// on every update that changes the trust domain.
pub fn trust_domain_conflict(
    candidate: &ControlPlaneFacts,
    others: &[ControlPlaneFacts],
) -> Option<Conflict> {
    let others: Vec<&ControlPlaneFacts> =
        others.iter().filter(|c| c.name != candidate.name).collect();
    if let Some(owner) = others
        .iter()
        .find(|c| c.tenant != candidate.tenant && c.trust_domain == candidate.trust_domain)
    {
        return Some(Conflict::TrustDomainTaken {
            control_plane: candidate.name.clone(),
            trust_domain: candidate.trust_domain.clone(),
            owner_tenant: owner.tenant.clone(),
        });
    }
    let oldest = others
        .iter()
        .filter(|c| c.tenant == candidate.tenant)
        .min_by_key(|c| rank(c))?;
    (oldest.trust_domain != candidate.trust_domain).then(|| Conflict::TrustDomainMismatch {
        control_plane: candidate.name.clone(),
        tenant: candidate.tenant.clone(),
        expected: oldest.trust_domain.clone(),
        found: candidate.trust_domain.clone(),
    })
}

/// A `MeshControlPlane` as membership sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlPlaneFacts {
    /// `metadata.name` of the control plane.
    pub name: String,
    /// `metadata.creationTimestamp`; `None` for an object being admitted.
    pub created: Option<Time>,
    /// `spec.tenant`.
    pub tenant: String,
    /// Effective revision.
    pub revision: String,
    /// Effective control namespace.
    pub control_namespace: String,
    /// Effective trust domain ([`MeshControlPlane::trust_domain`]).
    pub trust_domain: String,
    /// `spec.namespaceSelector`.
    pub namespace_selector: Option<LabelSelector>,
    /// `status.controlNamespaceUID`: the control namespace the operator created for it.
    pub control_namespace_uid: Option<String>,
    /// The `meshplane.io/adopt-control-namespace` annotation: a namespace the platform admin
    /// handed over.
    pub handed_namespace_uid: Option<String>,
    /// Reconciled before control namespaces were recorded by UID (a status naming its control
    /// namespace, no UID): the namespace's labels still count until the UID is recorded.
    pub legacy_claim: bool,
}

impl From<&MeshControlPlane> for ControlPlaneFacts {
    fn from(mcp: &MeshControlPlane) -> Self {
        let status = mcp.status.as_ref();
        Self {
            name: mcp.metadata.name.clone().unwrap_or_default(),
            created: mcp.metadata.creation_timestamp.clone(),
            tenant: mcp.spec.tenant.clone(),
            revision: mcp.revision(),
            control_namespace: mcp.control_namespace(),
            trust_domain: mcp.trust_domain(),
            namespace_selector: mcp.spec.namespace_selector.clone(),
            control_namespace_uid: status.and_then(|s| s.control_namespace_uid.clone()),
            handed_namespace_uid: mcp
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::names::ADOPT_CONTROL_NAMESPACE_ANNOTATION))
                .filter(|uid| !uid.is_empty())
                .cloned(),
            legacy_claim: status.is_some_and(|s| {
                s.control_namespace_uid.is_none()
                    && s.control_namespace.as_deref() == Some(mcp.control_namespace().as_str())
            }),
        }
    }
}

/// A `MeshRevisionTag` as membership sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagFacts {
    /// Tag name (the label value namespaces use).
    pub name: String,
    /// `spec.revision`: where the tag is asked to point.
    pub target: String,
    /// `status.tenant`: the tenant the tag was first resolved in (sticky).
    pub recorded_tenant: Option<String>,
    /// `status.revision`: the revision the tag last resolved to.
    pub recorded_revision: Option<String>,
}

impl From<&MeshRevisionTag> for TagFacts {
    fn from(tag: &MeshRevisionTag) -> Self {
        let status = tag.status.as_ref();
        Self {
            name: tag.metadata.name.clone().unwrap_or_default(),
            target: tag.spec.revision.clone(),
            recorded_tenant: status.and_then(|s| s.tenant.clone()),
            recorded_revision: status.and_then(|s| s.revision.clone()),
        }
    }
}

/// A conflict between meshplane objects. The object it names changes nothing while it lasts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// Two control planes claim one revision; `winner` is the older.
    DuplicateRevision {
        revision: String,
        winner: String,
        loser: String,
    },
    /// The control plane's `namespaceSelector` does not parse.
    InvalidSelector {
        control_plane: String,
        error: String,
    },
    /// Revisions of one tenant must share a control namespace; `expected` is the oldest's.
    ControlNamespaceMismatch {
        control_plane: String,
        tenant: String,
        expected: String,
        found: String,
    },
    /// The control namespace already belongs to another tenant.
    ControlNamespaceTaken {
        control_plane: String,
        namespace: String,
        owner_tenant: String,
    },
    /// The control namespace exists and meshplane did not create it for this tenant (another
    /// tenant's member, a system namespace, the operator's own): taking it would relabel it
    /// and evict it from where it belongs.
    ControlNamespaceNotOwned {
        control_plane: String,
        namespace: String,
        why: String,
    },
    /// Revisions of one tenant must share a trust domain; `expected` is the oldest's.
    TrustDomainMismatch {
        control_plane: String,
        tenant: String,
        expected: String,
        found: String,
    },
    /// The trust domain already belongs to another tenant (whose oldest revision is older):
    /// with a shared organisation root, the two tenants would accept each other's workloads.
    TrustDomainTaken {
        control_plane: String,
        trust_domain: String,
        owner_tenant: String,
    },
    /// A tag carries the name of a revision.
    TagNamedLikeRevision { tag: String, control_plane: String },
    /// A tag recorded in one tenant is pointed at a revision of another.
    TagMovedAcrossTenants {
        tag: String,
        recorded_tenant: String,
        target: String,
        target_tenant: String,
    },
    /// A tag points at no active revision.
    TagRevisionNotFound { tag: String, target: String },
}

impl Conflict {
    /// The `PascalCase` condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Conflict::DuplicateRevision { .. } => "RevisionConflict",
            Conflict::InvalidSelector { .. } => "InvalidSelector",
            Conflict::ControlNamespaceMismatch { .. } => "ControlNamespaceMismatch",
            Conflict::ControlNamespaceTaken { .. } => "ControlNamespaceTaken",
            Conflict::ControlNamespaceNotOwned { .. } => "ControlNamespaceNotOwned",
            Conflict::TrustDomainMismatch { .. } => "TrustDomainMismatch",
            Conflict::TrustDomainTaken { .. } => "TrustDomainTaken",
            Conflict::TagNamedLikeRevision { .. } => "TagNamedLikeRevision",
            Conflict::TagMovedAcrossTenants { .. } => "TagMovedAcrossTenants",
            Conflict::TagRevisionNotFound { .. } => "RevisionNotFound",
        }
    }

    /// The control plane this conflict disables, if it concerns one.
    pub fn control_plane(&self) -> Option<&str> {
        match self {
            Conflict::DuplicateRevision { loser, .. } => Some(loser),
            Conflict::InvalidSelector { control_plane, .. }
            | Conflict::ControlNamespaceMismatch { control_plane, .. }
            | Conflict::ControlNamespaceTaken { control_plane, .. }
            | Conflict::ControlNamespaceNotOwned { control_plane, .. }
            | Conflict::TrustDomainMismatch { control_plane, .. }
            | Conflict::TrustDomainTaken { control_plane, .. } => Some(control_plane),
            _ => None,
        }
    }

    /// The tag this conflict concerns, if any.
    pub fn tag(&self) -> Option<&str> {
        match self {
            Conflict::TagNamedLikeRevision { tag, .. }
            | Conflict::TagMovedAcrossTenants { tag, .. }
            | Conflict::TagRevisionNotFound { tag, .. } => Some(tag),
            _ => None,
        }
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::DuplicateRevision { revision, winner, loser } => write!(
                f,
                "revision {revision:?} of MeshControlPlane {loser:?} is already claimed by the older MeshControlPlane {winner:?}"
            ),
            Conflict::InvalidSelector { control_plane, error } => {
                write!(f, "MeshControlPlane {control_plane:?}: {error}")
            }
            Conflict::ControlNamespaceMismatch { control_plane, tenant, expected, found } => write!(
                f,
                "MeshControlPlane {control_plane:?} uses control namespace {found:?} but tenant {tenant:?} already runs in {expected:?}; all revisions of a tenant share one control namespace"
            ),
            Conflict::ControlNamespaceTaken { control_plane, namespace, owner_tenant } => write!(
                f,
                "MeshControlPlane {control_plane:?}: control namespace {namespace:?} already belongs to tenant {owner_tenant:?}"
            ),
            Conflict::ControlNamespaceNotOwned { control_plane, namespace, why } => write!(
                f,
                "MeshControlPlane {control_plane:?}: control namespace {namespace:?} {why}; name a namespace that does not exist yet (meshplane creates it) or one meshplane created for this tenant"
            ),
            Conflict::TrustDomainMismatch { control_plane, tenant, expected, found } => write!(
                f,
                "MeshControlPlane {control_plane:?} uses trust domain {found:?} but tenant {tenant:?} already uses {expected:?}; all revisions of a tenant share one trust domain (set spec.meshConfig.trustDomain: {expected})"
            ),
            Conflict::TrustDomainTaken { control_plane, trust_domain, owner_tenant } => write!(
                f,
                "MeshControlPlane {control_plane:?}: trust domain {trust_domain:?} already belongs to tenant {owner_tenant:?}; every tenant needs its own, or tenants sharing an organisation root would accept each other's workloads (leave spec.meshConfig.trustDomain unset for the tenant's default)"
            ),
            Conflict::TagNamedLikeRevision { tag, control_plane } => write!(
                f,
                "MeshRevisionTag {tag:?} has the name of the revision of MeshControlPlane {control_plane:?}; tag and revision names share the meshplane.io/rev label"
            ),
            Conflict::TagMovedAcrossTenants { tag, recorded_tenant, target, target_tenant } => write!(
                f,
                "MeshRevisionTag {tag:?} belongs to tenant {recorded_tenant:?} and cannot point at revision {target:?} of tenant {target_tenant:?}; a tag never moves across tenants"
            ),
            Conflict::TagRevisionNotFound { tag, target } => write!(
                f,
                "MeshRevisionTag {tag:?} points at revision {target:?}, which no active MeshControlPlane provides"
            ),
        }
    }
}

/// Why a namespace labelled for a revision was not joined.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RejectionReason {
    /// The revision's `namespaceSelector` does not match the namespace.
    OutsideSelector,
    /// The label names neither a revision nor a tag.
    UnknownRevision,
    /// The label names a revision or tag that is in conflict.
    RevisionConflicted,
    /// The namespace is the control namespace of another tenant.
    ControlNamespaceOfOtherTenant,
}

impl RejectionReason {
    /// The `PascalCase` reason used in status and Events.
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectionReason::OutsideSelector => "OutsideSelector",
            RejectionReason::UnknownRevision => "UnknownRevision",
            RejectionReason::RevisionConflicted => "RevisionConflicted",
            RejectionReason::ControlNamespaceOfOtherTenant => "ControlNamespaceOfOtherTenant",
        }
    }
}

/// A namespace refused by membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The value of its `meshplane.io/rev` label.
    pub label: String,
    /// The revision the label resolved to, when it resolved.
    pub revision: Option<String>,
    /// Why.
    pub reason: RejectionReason,
    /// A sentence for status and Events.
    pub message: String,
}

/// One active revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevisionMembership {
    /// Name of the `MeshControlPlane` providing it.
    pub control_plane: String,
    /// Its tenant.
    pub tenant: String,
    /// Its control namespace.
    pub control_namespace: String,
    /// Namespaces attached to it directly or through a tag.
    pub attached: BTreeSet<String>,
    /// Tags resolving to it.
    pub tags: BTreeSet<String>,
    /// Namespaces labelled for it (or its tags) but refused.
    pub rejected: BTreeMap<String, Rejection>,
}

/// One tenant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantMembership {
    /// The tenant's control namespace (of its oldest active revision).
    pub control_namespace: String,
    /// The tenant's trust domain (of its oldest active revision).
    pub trust_domain: String,
    /// Its active revisions.
    pub revisions: BTreeSet<String>,
    /// Union of the attached namespaces of its revisions.
    pub members: BTreeSet<String>,
    /// The revision that writes the status of the control namespace's config (contract 2,
    /// `statusWriter`): its oldest active revision, then the first by name, so a canary's new
    /// revision never takes it over while the old one runs.
    pub status_writer: String,
}

/// Where a tag resolves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagResolution {
    /// The revision namespaces carrying the tag join; `None` when it resolves nowhere.
    pub revision: Option<String>,
    /// The tenant of that revision (or the recorded one while refused).
    pub tenant: Option<String>,
    /// Namespaces carrying the tag.
    pub namespaces: BTreeSet<String>,
}

/// The result of [`compute`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// Active revisions by revision name.
    pub revisions: BTreeMap<String, RevisionMembership>,
    /// Tenants with at least one active revision.
    pub tenants: BTreeMap<String, TenantMembership>,
    /// Every tag by name.
    pub tags: BTreeMap<String, TagResolution>,
    /// Every rejected namespace, by name.
    pub rejected: BTreeMap<String, Rejection>,
    /// Every conflict, in a deterministic order.
    pub conflicts: Vec<Conflict>,
}

impl Membership {
    /// The active revision provided by control plane `name`.
    pub fn revision_of_control_plane(&self, name: &str) -> Option<&RevisionMembership> {
        self.revisions.values().find(|r| r.control_plane == name)
    }

    /// Conflicts that disable control plane `name`.
    pub fn conflicts_of_control_plane(&self, name: &str) -> Vec<&Conflict> {
        self.conflicts
            .iter()
            .filter(|c| c.control_plane() == Some(name))
            .collect()
    }

    /// Conflicts of tag `name`.
    pub fn conflicts_of_tag(&self, name: &str) -> Vec<&Conflict> {
        self.conflicts
            .iter()
            .filter(|c| c.tag() == Some(name))
            .collect()
    }

    /// Whether `revision` writes the status of its tenant's control-namespace config.
    pub fn is_status_writer(&self, revision: &str) -> bool {
        self.revisions
            .get(revision)
            .and_then(|r| self.tenants.get(&r.tenant))
            .is_some_and(|t| t.status_writer == revision)
    }

    /// Member namespaces of `tenant` (empty for an unknown tenant).
    pub fn tenant_members(&self, tenant: &str) -> BTreeSet<String> {
        self.tenants
            .get(tenant)
            .map(|t| t.members.clone())
            .unwrap_or_default()
    }
}

/// Ranks control planes: oldest first, then by name; not-yet-created objects last.
fn rank(cp: &ControlPlaneFacts) -> (bool, Option<Time>, String) {
    (cp.created.is_none(), cp.created.clone(), cp.name.clone())
}

/// Computes membership from a snapshot of the cluster. Pure and deterministic: the input order
/// does not matter.
pub fn compute(
    namespaces: &[NamespaceFacts],
    control_planes: &[ControlPlaneFacts],
    tags: &[TagFacts],
) -> Membership {
    let mut out = Membership::default();
    let mut ranked: Vec<&ControlPlaneFacts> = control_planes.iter().collect();
    ranked.sort_by_key(|cp| rank(cp));

    // Revision name -> the control plane that holds the name (active or not).
    let mut claimed: BTreeMap<&str, &ControlPlaneFacts> = BTreeMap::new();
    let mut selectors: BTreeMap<String, Selector> = BTreeMap::new();
    // Control namespace -> owning tenant.
    let mut control_namespaces: BTreeMap<String, String> = BTreeMap::new();
    // Trust domain -> owning tenant.
    let mut trust_domains: BTreeMap<String, String> = BTreeMap::new();
    for cp in ranked {
        if let Some(winner) = claimed.get(cp.revision.as_str()) {
            out.conflicts.push(Conflict::DuplicateRevision {
                revision: cp.revision.clone(),
                winner: winner.name.clone(),
                loser: cp.name.clone(),
            });
            continue;
        }
        claimed.insert(&cp.revision, cp);
        let selector = match &cp.namespace_selector {
            None => Selector::default(),
            Some(sel) => match Selector::from_label_selector(sel, "spec.namespaceSelector") {
                Ok(s) => s,
                Err(e) => {
                    out.conflicts.push(Conflict::InvalidSelector {
                        control_plane: cp.name.clone(),
                        error: e.to_string(),
                    });
                    continue;
                }
            },
        };
        if let Some(tenant) = out.tenants.get(&cp.tenant) {
            if tenant.control_namespace != cp.control_namespace {
                out.conflicts.push(Conflict::ControlNamespaceMismatch {
                    control_plane: cp.name.clone(),
                    tenant: cp.tenant.clone(),
                    expected: tenant.control_namespace.clone(),
                    found: cp.control_namespace.clone(),
                });
                continue;
            }
            if tenant.trust_domain != cp.trust_domain {
                out.conflicts.push(Conflict::TrustDomainMismatch {
                    control_plane: cp.name.clone(),
                    tenant: cp.tenant.clone(),
                    expected: tenant.trust_domain.clone(),
                    found: cp.trust_domain.clone(),
                });
                continue;
            }
        } else if let Some(owner) = control_namespaces.get(&cp.control_namespace) {
            out.conflicts.push(Conflict::ControlNamespaceTaken {
                control_plane: cp.name.clone(),
                namespace: cp.control_namespace.clone(),
                owner_tenant: owner.clone(),
            });
            continue;
        } else if let Some(owner) = trust_domains.get(&cp.trust_domain) {
            out.conflicts.push(Conflict::TrustDomainTaken {
                control_plane: cp.name.clone(),
                trust_domain: cp.trust_domain.clone(),
                owner_tenant: owner.clone(),
            });
            continue;
        }
        control_namespaces.insert(cp.control_namespace.clone(), cp.tenant.clone());
        trust_domains.insert(cp.trust_domain.clone(), cp.tenant.clone());
        let tenant = out.tenants.entry(cp.tenant.clone()).or_default();
        tenant.control_namespace = cp.control_namespace.clone();
        tenant.trust_domain = cp.trust_domain.clone();
        tenant.revisions.insert(cp.revision.clone());
        if tenant.status_writer.is_empty() {
            tenant.status_writer = cp.revision.clone();
        }
        selectors.insert(cp.revision.clone(), selector);
        out.revisions.insert(
            cp.revision.clone(),
            RevisionMembership {
                control_plane: cp.name.clone(),
                tenant: cp.tenant.clone(),
                control_namespace: cp.control_namespace.clone(),
                ..Default::default()
            },
        );
    }

    let mut sorted_tags: Vec<&TagFacts> = tags.iter().collect();
    sorted_tags.sort_by(|a, b| a.name.cmp(&b.name));
    for tag in sorted_tags {
        let resolution = resolve_tag(tag, &claimed, &out.revisions, &mut out.conflicts);
        if let Some(rev) = resolution
            .revision
            .as_ref()
            .and_then(|r| out.revisions.get_mut(r))
        {
            rev.tags.insert(tag.name.clone());
        }
        out.tags.insert(tag.name.clone(), resolution);
    }

    let mut sorted_namespaces: Vec<&NamespaceFacts> = namespaces.iter().collect();
    sorted_namespaces.sort_by(|a, b| a.name.cmp(&b.name));
    for ns in sorted_namespaces {
        let Some(label) = ns.labels.get(REV_LABEL) else {
            continue;
        };
        let verdict = attach(
            ns,
            label,
            &claimed,
            &selectors,
            &control_namespaces,
            &mut out,
        );
        if let Err(rejection) = verdict {
            if let Some(rev) = rejection
                .revision
                .as_ref()
                .and_then(|r| out.revisions.get_mut(r))
            {
                rev.rejected.insert(ns.name.clone(), rejection.clone());
            }
            out.rejected.insert(ns.name.clone(), rejection);
        }
    }
    out
}

fn resolve_tag(
    tag: &TagFacts,
    claimed: &BTreeMap<&str, &ControlPlaneFacts>,
    active: &BTreeMap<String, RevisionMembership>,
    conflicts: &mut Vec<Conflict>,
) -> TagResolution {
    let unresolved = |tenant: Option<String>| TagResolution {
        revision: None,
        tenant,
        namespaces: BTreeSet::new(),
    };
    if let Some(cp) = claimed.get(tag.name.as_str()) {
        conflicts.push(Conflict::TagNamedLikeRevision {
            tag: tag.name.clone(),
            control_plane: cp.name.clone(),
        });
        return unresolved(tag.recorded_tenant.clone());
    }
    let Some(target) = active.get(&tag.target) else {
        conflicts.push(Conflict::TagRevisionNotFound {
            tag: tag.name.clone(),
            target: tag.target.clone(),
        });
        return unresolved(tag.recorded_tenant.clone());
    };
    match &tag.recorded_tenant {
        Some(recorded) if *recorded != target.tenant => {
            conflicts.push(Conflict::TagMovedAcrossTenants {
                tag: tag.name.clone(),
                recorded_tenant: recorded.clone(),
                target: tag.target.clone(),
                target_tenant: target.tenant.clone(),
            });
            // The refused move changes nothing: keep serving the last accepted revision if it
            // is still an active revision of the recorded tenant.
            let kept = tag
                .recorded_revision
                .as_ref()
                .filter(|r| active.get(*r).is_some_and(|rm| rm.tenant == *recorded));
            TagResolution {
                revision: kept.cloned(),
                tenant: Some(recorded.clone()),
                namespaces: BTreeSet::new(),
            }
        }
        _ => TagResolution {
            revision: Some(tag.target.clone()),
            tenant: Some(target.tenant.clone()),
            namespaces: BTreeSet::new(),
        },
    }
}

fn attach(
    ns: &NamespaceFacts,
    label: &str,
    claimed: &BTreeMap<&str, &ControlPlaneFacts>,
    selectors: &BTreeMap<String, Selector>,
    control_namespaces: &BTreeMap<String, String>,
    out: &mut Membership,
) -> Result<(), Rejection> {
    let reject = |revision: Option<&str>, reason: RejectionReason, message: String| Rejection {
        label: label.to_string(),
        revision: revision.map(str::to_string),
        reason,
        message,
    };
    let revision = if out.revisions.contains_key(label) {
        label.to_string()
    } else if let Some(tag) = out.tags.get_mut(label) {
        tag.namespaces.insert(ns.name.clone());
        match &tag.revision {
            Some(r) => r.clone(),
            None => {
                return Err(reject(
                    None,
                    RejectionReason::RevisionConflicted,
                    format!("namespace {:?} is labelled {REV_LABEL}={label}, a tag that resolves to no revision", ns.name),
                ))
            }
        }
    } else if claimed.contains_key(label) {
        return Err(reject(
            None,
            RejectionReason::RevisionConflicted,
            format!(
                "namespace {:?} is labelled {REV_LABEL}={label}, a revision that is in conflict",
                ns.name
            ),
        ));
    } else {
        return Err(reject(
            None,
            RejectionReason::UnknownRevision,
            format!(
                "namespace {:?} is labelled {REV_LABEL}={label}, which names no revision or tag",
                ns.name
            ),
        ));
    };
    let Some(rev) = out.revisions.get(&revision) else {
        return Err(reject(
            None,
            RejectionReason::UnknownRevision,
            format!(
                "namespace {:?}: revision {revision:?} is not active",
                ns.name
            ),
        ));
    };
    if let Some(owner) = control_namespaces
        .get(&ns.name)
        .filter(|t| **t != rev.tenant)
    {
        return Err(reject(
            Some(&revision),
            RejectionReason::ControlNamespaceOfOtherTenant,
            format!(
                "namespace {:?} is the control namespace of tenant {owner:?} and cannot join tenant {:?}",
                ns.name, rev.tenant
            ),
        ));
    }
    if !selectors
        .get(&revision)
        .is_some_and(|s| s.matches(&ns.labels))
    {
        return Err(reject(
            Some(&revision),
            RejectionReason::OutsideSelector,
            format!(
                "namespace {:?} is labelled for revision {revision:?} but is outside its namespaceSelector (tenant {:?} may not own it)",
                ns.name, rev.tenant
            ),
        ));
    }
    let tenant = rev.tenant.clone();
    if let Some(rev) = out.revisions.get_mut(&revision) {
        rev.attached.insert(ns.name.clone());
    }
    if let Some(t) = out.tenants.get_mut(&tenant) {
        t.members.insert(ns.name.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn cp(name: &str, tenant: &str, revision: &str, age_secs: i64) -> ControlPlaneFacts {
        ControlPlaneFacts {
            name: name.into(),
            created: Timestamp::from_second(1_000_000 - age_secs).ok().map(Time),
            tenant: tenant.into(),
            revision: revision.into(),
            control_namespace: format!("meshplane-{tenant}"),
            trust_domain: crate::names::default_trust_domain(tenant),
            namespace_selector: None,
            control_namespace_uid: None,
            handed_namespace_uid: None,
            legacy_claim: false,
        }
    }

    fn tag(name: &str, target: &str, recorded: Option<(&str, &str)>) -> TagFacts {
        TagFacts {
            name: name.into(),
            target: target.into(),
            recorded_tenant: recorded.map(|(t, _)| t.to_string()),
            recorded_revision: recorded.map(|(_, r)| r.to_string()),
        }
    }

    fn ns(name: &str, rev: &str) -> NamespaceFacts {
        NamespaceFacts::new(name, &[(REV_LABEL, rev)])
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn blue_green() -> Vec<ControlPlaneFacts> {
        vec![
            cp("blue-v1", "blue", "blue-v1", 300),
            cp("blue-v2", "blue", "blue-v2", 200),
            cp("green", "green", "green", 100),
        ]
    }

    #[test]
    fn namespaces_attach_directly_and_through_tags_and_tenant_members_are_the_union() {
        let m = compute(
            &[
                ns("shop", "blue-stable"),
                ns("cart", "blue-v2"),
                ns("bank", "green"),
                NamespaceFacts::new("plain", &[]),
            ],
            &blue_green(),
            &[tag("blue-stable", "blue-v1", None)],
        );
        assert!(m.conflicts.is_empty(), "{:?}", m.conflicts);
        assert_eq!(m.revisions["blue-v1"].attached, set(&["shop"]));
        assert_eq!(m.revisions["blue-v1"].tags, set(&["blue-stable"]));
        assert_eq!(m.revisions["blue-v2"].attached, set(&["cart"]));
        assert_eq!(m.tenant_members("blue"), set(&["cart", "shop"]));
        assert_eq!(m.tenant_members("green"), set(&["bank"]));
        assert_eq!(m.tags["blue-stable"].tenant.as_deref(), Some("blue"));
        assert_eq!(m.tags["blue-stable"].namespaces, set(&["shop"]));
        assert!(m.rejected.is_empty());
    }

    #[test]
    fn one_status_writer_per_tenant_the_oldest_active_revision() {
        // The canary's new revision, attached namespaces or not, never takes it over.
        let m = compute(&[ns("cart", "blue-v2")], &blue_green(), &[]);
        assert_eq!(m.tenants["blue"].status_writer, "blue-v1");
        assert!(m.is_status_writer("blue-v1"));
        assert!(!m.is_status_writer("blue-v2"));
        assert!(m.is_status_writer("green"));
        assert!(!m.is_status_writer("unknown"));
        // Whatever the input order: the same writer.
        let mut reversed = blue_green();
        reversed.reverse();
        assert_eq!(
            compute(&[], &reversed, &[]).tenants["blue"].status_writer,
            "blue-v1"
        );
        // Same age: the first by name. The old revision gone: the next oldest takes over.
        let twins = [
            cp("blue-b", "blue", "blue-b", 5),
            cp("blue-a", "blue", "blue-a", 5),
        ];
        assert_eq!(
            compute(&[], &twins, &[]).tenants["blue"].status_writer,
            "blue-a"
        );
        let after = compute(&[], &blue_green()[1..], &[]);
        assert_eq!(after.tenants["blue"].status_writer, "blue-v2");
    }

    #[test]
    fn every_conflict_class_is_detected_and_disables_only_its_object() {
        struct Case {
            name: &'static str,
            cps: Vec<ControlPlaneFacts>,
            tags: Vec<TagFacts>,
            want: Conflict,
            still_active: &'static [&'static str],
        }
        let mut bad_selector = cp("blue-v2", "blue", "blue-v2", 10);
        bad_selector.namespace_selector = Some(LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "team".into(),
                    operator: "Like".into(),
                    values: None,
                },
            ]),
            match_labels: None,
        });
        let mut other_ns = cp("blue-v2", "blue", "blue-v2", 10);
        other_ns.control_namespace = "elsewhere".into();
        let mut taken_ns = cp("red", "red", "red", 10);
        taken_ns.control_namespace = "meshplane-blue".into();
        let cases = vec![
            Case {
                name: "duplicate revision: the older wins",
                cps: vec![cp("b-new", "blue", "blue-v1", 10), cp("a-old", "green", "blue-v1", 20)],
                tags: vec![],
                want: Conflict::DuplicateRevision {
                    revision: "blue-v1".into(),
                    winner: "a-old".into(),
                    loser: "b-new".into(),
                },
                still_active: &["blue-v1"],
            },
            Case {
                name: "invalid selector",
                cps: vec![cp("blue-v1", "blue", "blue-v1", 20), bad_selector],
                tags: vec![],
                want: Conflict::InvalidSelector {
                    control_plane: "blue-v2".into(),
                    error: "spec.namespaceSelector.matchExpressions[0]: invalid label selector: unknown operator \"Like\"; use In, NotIn, Exists or DoesNotExist".into(),
                },
                still_active: &["blue-v1"],
            },
            Case {
                name: "control namespace disagreement",
                cps: vec![cp("blue-v1", "blue", "blue-v1", 20), other_ns],
                tags: vec![],
                want: Conflict::ControlNamespaceMismatch {
                    control_plane: "blue-v2".into(),
                    tenant: "blue".into(),
                    expected: "meshplane-blue".into(),
                    found: "elsewhere".into(),
                },
                still_active: &["blue-v1"],
            },
            Case {
                name: "control namespace of another tenant",
                cps: vec![cp("blue-v1", "blue", "blue-v1", 20), taken_ns],
                tags: vec![],
                want: Conflict::ControlNamespaceTaken {
                    control_plane: "red".into(),
                    namespace: "meshplane-blue".into(),
                    owner_tenant: "blue".into(),
                },
                still_active: &["blue-v1"],
            },
            Case {
                name: "tag named like a revision",
                cps: blue_green(),
                tags: vec![tag("green", "blue-v1", None)],
                want: Conflict::TagNamedLikeRevision { tag: "green".into(), control_plane: "green".into() },
                still_active: &["blue-v1", "blue-v2", "green"],
            },
            Case {
                name: "tag moved across tenants",
                cps: blue_green(),
                tags: vec![tag("stable", "green", Some(("blue", "blue-v1")))],
                want: Conflict::TagMovedAcrossTenants {
                    tag: "stable".into(),
                    recorded_tenant: "blue".into(),
                    target: "green".into(),
                    target_tenant: "green".into(),
                },
                still_active: &["blue-v1", "blue-v2", "green"],
            },
            Case {
                name: "tag to a missing revision",
                cps: blue_green(),
                tags: vec![tag("stable", "gone", None)],
                want: Conflict::TagRevisionNotFound { tag: "stable".into(), target: "gone".into() },
                still_active: &["blue-v1", "blue-v2", "green"],
            },
        ];
        for case in cases {
            let m = compute(&[], &case.cps, &case.tags);
            assert_eq!(m.conflicts, vec![case.want.clone()], "{}", case.name);
            let active: Vec<&str> = m.revisions.keys().map(String::as_str).collect();
            assert_eq!(active, case.still_active, "{}", case.name);
            // Input order never changes the verdict.
            let mut reversed = case.cps.clone();
            reversed.reverse();
            assert_eq!(
                compute(&[], &reversed, &case.tags),
                m,
                "{}: order",
                case.name
            );
        }
    }

    #[test]
    fn refused_tag_move_keeps_the_recorded_revision() {
        let m = compute(
            &[ns("shop", "stable")],
            &blue_green(),
            &[tag("stable", "green", Some(("blue", "blue-v1")))],
        );
        assert_eq!(m.tags["stable"].revision.as_deref(), Some("blue-v1"));
        assert_eq!(m.tags["stable"].tenant.as_deref(), Some("blue"));
        assert_eq!(m.revisions["blue-v1"].attached, set(&["shop"]));
        assert!(m.revisions["green"].attached.is_empty());
    }

    #[test]
    fn rejections_carry_a_reason() {
        let mut blue = cp("blue-v1", "blue", "blue-v1", 30);
        blue.namespace_selector = Some(LabelSelector {
            match_labels: Some([("team".to_string(), "blue".to_string())].into()),
            match_expressions: None,
        });
        let green = cp("green", "green", "green", 20);
        let dup = cp("late", "red", "green", 10);
        let m = compute(
            &[
                NamespaceFacts::new("ok", &[(REV_LABEL, "blue-v1"), ("team", "blue")]),
                ns("outside", "blue-v1"),
                ns("typo", "blue-v9"),
                ns("meshplane-green", "blue-v1"),
                ns("dangling", "old-tag"),
            ],
            &[blue, green, dup],
            &[tag("old-tag", "gone", None)],
        );
        let reasons: BTreeMap<&str, &RejectionReason> = m
            .rejected
            .iter()
            .map(|(k, v)| (k.as_str(), &v.reason))
            .collect();
        assert_eq!(
            reasons,
            BTreeMap::from([
                ("dangling", &RejectionReason::RevisionConflicted),
                (
                    "meshplane-green",
                    &RejectionReason::ControlNamespaceOfOtherTenant
                ),
                ("outside", &RejectionReason::OutsideSelector),
                ("typo", &RejectionReason::UnknownRevision),
            ])
        );
        assert_eq!(m.revisions["blue-v1"].attached, set(&["ok"]));
        assert_eq!(
            m.revisions["blue-v1"]
                .rejected
                .keys()
                .cloned()
                .collect::<BTreeSet<_>>(),
            set(&["meshplane-green", "outside"])
        );
        assert!(m.rejected["outside"]
            .message
            .contains("outside its namespaceSelector"));
    }

    #[test]
    fn a_namespace_moving_between_revisions_and_tenants() {
        let cps = blue_green();
        let tags = [tag("blue-stable", "blue-v1", None)];
        let steps: [(&str, &str, &str, &[&str]); 4] = [
            ("blue-stable", "blue-v1", "blue", &["shop"]),
            ("blue-v2", "blue-v2", "blue", &["shop"]),
            ("green", "green", "green", &[]),
            ("", "", "", &[]),
        ];
        for (label, revision, tenant, blue_members) in steps {
            let namespaces = if label.is_empty() {
                vec![NamespaceFacts::new("shop", &[])]
            } else {
                vec![ns("shop", label)]
            };
            let m = compute(&namespaces, &cps, &tags);
            for (name, rev) in &m.revisions {
                assert_eq!(
                    rev.attached.contains("shop"),
                    *name == revision,
                    "{label}: {name}"
                );
            }
            for (name, t) in &m.tenants {
                assert_eq!(
                    t.members.contains("shop"),
                    *name == tenant,
                    "{label}: {name}"
                );
            }
            assert_eq!(m.tenant_members("blue"), set(blue_members), "{label}");
        }
    }

    #[test]
    fn moving_a_tag_within_a_tenant_moves_its_namespaces() {
        let cps = blue_green();
        let before = compute(
            &[ns("shop", "stable")],
            &cps,
            &[tag("stable", "blue-v1", None)],
        );
        let after = compute(
            &[ns("shop", "stable")],
            &cps,
            &[tag("stable", "blue-v2", Some(("blue", "blue-v1")))],
        );
        assert!(after.conflicts.is_empty());
        assert_eq!(before.revisions["blue-v1"].attached, set(&["shop"]));
        assert_eq!(after.revisions["blue-v2"].attached, set(&["shop"]));
        assert!(after.revisions["blue-v1"].attached.is_empty());
        assert_eq!(after.revisions["blue-v2"].tags, set(&["stable"]));
    }

    #[test]
    fn a_trust_domain_belongs_to_one_tenant_and_is_shared_by_its_revisions() {
        let with_td = |mut c: ControlPlaneFacts, td: &str| {
            c.trust_domain = td.into();
            c
        };
        let m = compute(
            &[ns("shop", "blue-v1"), ns("cart", "red-v1")],
            &[
                with_td(cp("blue-v1", "blue", "blue-v1", 30), "org.example"),
                // A canary of the same tenant shares it.
                with_td(cp("blue-v2", "blue", "blue-v2", 20), "org.example"),
                // Another tenant naming it is refused, however it is spelt.
                with_td(cp("red-v1", "red", "red-v1", 10), "org.example"),
                // So is a canary that names another one than its tenant's.
                with_td(cp("blue-v3", "blue", "blue-v3", 5), "blue.example"),
            ],
            &[],
        );
        assert!(m.conflicts_of_control_plane("blue-v1").is_empty());
        assert!(m.conflicts_of_control_plane("blue-v2").is_empty());
        assert_eq!(
            m.conflicts_of_control_plane("red-v1"),
            vec![&Conflict::TrustDomainTaken {
                control_plane: "red-v1".into(),
                trust_domain: "org.example".into(),
                owner_tenant: "blue".into(),
            }]
        );
        assert_eq!(
            m.conflicts_of_control_plane("blue-v3")[0].reason(),
            "TrustDomainMismatch"
        );
        // The refused tenant attaches nothing; the owner's trust domain is recorded.
        assert!(!m.revisions.contains_key("red-v1"));
        assert_eq!(m.tenants["blue"].trust_domain, "org.example");
        // Defaults differ per tenant, so two tenants that set nothing never collide.
        let m = compute(
            &[],
            &[
                cp("blue-v1", "blue", "blue-v1", 2),
                cp("red-v1", "red", "red-v1", 1),
            ],
            &[],
        );
        assert!(m.conflicts.is_empty(), "{:?}", m.conflicts);
        assert_ne!(
            m.tenants["blue"].trust_domain,
            m.tenants["red"].trust_domain
        );
    }

    #[test]
    fn object_being_admitted_loses_ties_against_existing_ones() {
        let mut candidate = cp("a-candidate", "red", "blue-v1", 0);
        candidate.created = None;
        let m = compute(
            &[],
            &[cp("z-existing", "blue", "blue-v1", 1), candidate],
            &[],
        );
        assert_eq!(m.conflicts_of_control_plane("a-candidate").len(), 1);
        assert_eq!(m.revisions["blue-v1"].control_plane, "z-existing");
    }

    /// The namespace `meshplane-blue` as whoever created it left it.
    fn control_ns(uid: &str, labels: &[(&str, &str)]) -> NamespaceFacts {
        NamespaceFacts::new("meshplane-blue", labels).with_uid(uid)
    }

    fn refusal(ns: Option<&NamespaceFacts>, claimants: &[ControlPlaneFacts]) -> Option<String> {
        let claimants: Vec<&ControlPlaneFacts> = claimants.iter().collect();
        control_namespace_refusal("meshplane-blue", ns, &claimants)
    }

    #[test]
    fn labels_alone_never_make_a_namespace_the_tenants_control_namespace() {
        use meshplane_contracts::ownership::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, TENANT_LABEL};
        let mine = [(MANAGED_BY_LABEL, MANAGED_BY_VALUE), (TENANT_LABEL, "blue")];
        // Created in advance by someone who can create namespaces, with meshplane's labels.
        let planted = control_ns("uid-planted", &mine);
        let fresh = cp("blue-v1", "blue", "blue-v1", 10);
        let why = refusal(Some(&planted), std::slice::from_ref(&fresh)).expect("refused");
        assert!(why.contains("adopt-control-namespace"), "{why}");
        // Not existing yet: the operator creates it.
        assert_eq!(refusal(None, std::slice::from_ref(&fresh)), None);
        // The operator recorded creating it: that UID only.
        let recorded = ControlPlaneFacts {
            control_namespace_uid: Some("uid-created".into()),
            ..fresh.clone()
        };
        assert_eq!(
            refusal(
                Some(&control_ns("uid-created", &mine)),
                std::slice::from_ref(&recorded)
            ),
            None
        );
        // Deleted and planted again under the same name: a new UID, refused.
        assert!(refusal(Some(&planted), std::slice::from_ref(&recorded)).is_some());
        // Another revision of the tenant is vouched for by the first's record.
        let canary = cp("blue-v2", "blue", "blue-v2", 5);
        assert_eq!(
            refusal(
                Some(&control_ns("uid-created", &mine)),
                &[canary.clone(), recorded.clone()]
            ),
            None
        );
        // The platform admin hands an existing namespace over by its UID, labels or not.
        let handed = ControlPlaneFacts {
            handed_namespace_uid: Some("uid-theirs".into()),
            ..fresh.clone()
        };
        assert_eq!(
            refusal(
                Some(&control_ns("uid-theirs", &[])),
                std::slice::from_ref(&handed)
            ),
            None
        );
        // Reconciled before UIDs were recorded: meshplane's labels for the tenant still count.
        let legacy = ControlPlaneFacts {
            legacy_claim: true,
            ..fresh.clone()
        };
        assert_eq!(refusal(Some(&planted), std::slice::from_ref(&legacy)), None);
        let others = control_ns(
            "uid-red",
            &[(MANAGED_BY_LABEL, MANAGED_BY_VALUE), (TENANT_LABEL, "red")],
        );
        assert!(refusal(Some(&others), std::slice::from_ref(&legacy)).is_some());
    }

    #[test]
    fn another_tenants_record_vouches_for_nothing() {
        let red = ControlPlaneFacts {
            control_namespace_uid: Some("uid-1".into()),
            control_namespace: "meshplane-blue".into(),
            ..cp("red-v1", "red", "red-v1", 20)
        };
        let blue = cp("blue-v1", "blue", "blue-v1", 10);
        let conflicts = control_namespace_claims(&[red, blue], |_| Some(control_ns("uid-1", &[])));
        let refused: Vec<&str> = conflicts
            .iter()
            .filter_map(Conflict::control_plane)
            .collect();
        assert_eq!(refused, vec!["blue-v1"]);
    }

    #[test]
    fn the_status_and_the_annotation_become_the_facts() {
        let mcp: MeshControlPlane = serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1",
            "kind": "MeshControlPlane",
            "metadata": {"name": "blue-v1", "annotations": {
                crate::names::ADOPT_CONTROL_NAMESPACE_ANNOTATION: "uid-handed"}},
            "spec": {"tenant": "blue"},
            "status": {"controlNamespace": "meshplane-blue", "controlNamespaceUID": "uid-made"}
        }))
        .expect("control plane");
        let facts = ControlPlaneFacts::from(&mcp);
        assert_eq!(facts.control_namespace_uid.as_deref(), Some("uid-made"));
        assert_eq!(facts.handed_namespace_uid.as_deref(), Some("uid-handed"));
        assert!(!facts.legacy_claim);
        let mut old = mcp.clone();
        if let Some(s) = old.status.as_mut() {
            s.control_namespace_uid = None;
        }
        assert!(ControlPlaneFacts::from(&old).legacy_claim);
    }
}
