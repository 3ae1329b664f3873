//! The pure core of a `MeshControlPlane` reconcile: from what the reconcile observed, what it
//! writes and what it reports. No I/O; the controller (the parent module) observes, performs
//! what is planned here and writes the status from the outcome, as `controller::migration`
//! does with `migration::step`.
//!
//! - [`decide`]: a revision in conflict changes nothing and only reports why; an active one
//!   is reconciled for its membership (docs/architecture.md, item 2).
//! - [`access_objects`], [`access_writes`]: the control namespace and the operator's access
//!   bindings, applied before anything they grant rights on ("Who may do what").
//! - [`writes`]: one pass over the rendered objects (contracts 1–6 and 8; item 3 of
//!   docs/architecture.md): what to apply (a binding whose roleRef changed is replaced), what
//!   another owner holds and what to prune (only objects carrying our labels, contract 8;
//!   access bindings last).
//!   [`render_facts`] are what a pass renders from, and the writes themselves can change them
//!   (the Service's ClusterIP, the root of the tenant CA of contract 11): another pass follows
//!   while they do.
//! - [`write_notices`], [`report`]: the Events about what was written and the status from the
//!   outcome (contract 3's proxy counts and members-stale marks through [`status`]).
//! - [`in_use`], [`teardown`]: a deletion held while injected pods run, and what deletion
//!   removes, in order.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use meshplane_crds::membership::{Membership, RevisionMembership};
use meshplane_crds::{names, MeshControlPlane, MeshControlPlaneStatus};
use serde_json::Value;

use crate::apply;
use crate::ca::TenantCa;
use crate::render::{self, DesiredObject, Kind, ObjectKey, Observed, OperatorAccount, RenderInput};
use crate::status::{self, types, InstanceFacts};
use crate::tls::WebhookTls;
use crate::webhook_probe::{ProbeResult, PROBE_EVERY};

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Regarding {
    /// The control plane reconciled.
    ControlPlane,
    /// A namespace, by name.
    Namespace(String),
}

/// An Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub regarding: Regarding,
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

impl Notice {
    fn on_control_plane(warning: bool, reason: &str, message: String) -> Self {
        Self {
            regarding: Regarding::ControlPlane,
            warning,
            reason: reason.to_string(),
            message,
        }
    }
}

/// A status to write and the Events that go with it (published first).
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub status: MeshControlPlaneStatus,
    pub notices: Vec<Notice>,
}

/// What a reconcile does with a control plane, given membership.
#[derive(Debug)]
pub enum Decision<'m> {
    /// In conflict (a duplicate revision, a control namespace not its own, ...): no object is
    /// written or pruned, only this is reported.
    Conflicted(Report),
    /// Active: its objects are reconciled for this membership.
    Active {
        revision: &'m RevisionMembership,
        /// Member namespaces of the whole tenant (every revision's attached namespaces).
        tenant_members: BTreeSet<String>,
        /// Whether it writes the status of the control namespace's config.
        status_writer: bool,
    },
}

fn condition<'s>(status: Option<&'s MeshControlPlaneStatus>, type_: &str) -> Option<&'s Condition> {
    status?.conditions.iter().find(|c| c.type_ == type_)
}

/// Whether control plane `mcp` is active in `membership`, and if not, its status and a
/// Warning Event, the latter only when it was not already Degraded for the same reason.
pub fn decide<'m>(mcp: &MeshControlPlane, membership: &'m Membership, now: &Time) -> Decision<'m> {
    let name = mcp.name_any();
    let conflicts = membership.conflicts_of_control_plane(&name);
    if let (true, Some(revision)) = (
        conflicts.is_empty(),
        membership.revision_of_control_plane(&name),
    ) {
        return Decision::Active {
            revision,
            tenant_members: membership.tenant_members(&revision.tenant),
            status_writer: membership.is_status_writer(&mcp.revision()),
        };
    }
    let status = status::conflicted_status(mcp, &conflicts, now);
    let was_degraded = condition(mcp.status.as_ref(), types::DEGRADED).is_some_and(|c| {
        c.status == "True"
            && status
                .conditions
                .iter()
                .any(|n| n.type_ == types::DEGRADED && n.reason == c.reason)
    });
    let mut notices = Vec::new();
    if !was_degraded {
        let message = conflicts
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        let reason = conflicts.first().map(|c| c.reason()).unwrap_or("Conflict");
        notices.push(Notice::on_control_plane(true, reason, message));
    }
    Decision::Conflicted(Report { status, notices })
}

/// The objects of one revision the reconcile looks at by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// The control namespace.
    pub namespace: ObjectKey,
    /// The webhook TLS Secret (contract 4).
    pub webhook_tls: ObjectKey,
    /// The instance Service, whose ClusterIP the bootstrap ConfigMaps carry (contract 6).
    pub service: ObjectKey,
    /// The instance Deployment.
    pub deployment: ObjectKey,
    /// The proxies ConfigMap (contract 3).
    pub proxies: ObjectKey,
    /// The members ConfigMap (contract 2): which namespaces the revision serves, as written.
    pub members: ObjectKey,
    /// The mutating and the validating webhook configurations (contract 5).
    pub webhooks: [ObjectKey; 2],
}

impl Named {
    pub fn new(revision: &str, control_namespace: &str) -> Self {
        let instance = names::instance_name(revision);
        Self {
            namespace: key(Kind::Namespace, None, control_namespace),
            webhook_tls: key(
                Kind::Secret,
                Some(control_namespace),
                &names::webhook_tls_secret(revision),
            ),
            service: key(Kind::Service, Some(control_namespace), &instance),
            deployment: key(Kind::Deployment, Some(control_namespace), &instance),
            proxies: key(
                Kind::ConfigMap,
                Some(control_namespace),
                &render::proxies_configmap(revision),
            ),
            members: key(
                Kind::ConfigMap,
                Some(control_namespace),
                &names::members_configmap(revision),
            ),
            webhooks: [
                key(
                    Kind::MutatingWebhookConfiguration,
                    None,
                    &names::injector_webhook(revision),
                ),
                key(
                    Kind::ValidatingWebhookConfiguration,
                    None,
                    &names::validator_webhook(revision),
                ),
            ],
        }
    }
}

fn key(kind: Kind, namespace: Option<&str>, name: &str) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    }
}

/// What the observed access bindings grant the operator, by namespace (the widest grant).
pub fn access_grants(
    observed: &BTreeMap<ObjectKey, Value>,
    operator: &OperatorAccount,
) -> BTreeMap<String, render::AccessGrant> {
    let mut out: BTreeMap<String, render::AccessGrant> = BTreeMap::new();
    for (_, o) in observed.iter().filter(|(k, _)| k.kind == Kind::RoleBinding) {
        if let Some((ns, grant)) = render::operator_access(o, operator) {
            let entry = out.entry(ns).or_insert(grant);
            *entry = (*entry).max(grant);
        }
    }
    out
}

/// Whether `key` is one of the operator's access bindings: applied before, and removed after,
/// everything it grants rights on.
fn is_access_binding(
    key: &ObjectKey,
    observed: &BTreeMap<ObjectKey, Value>,
    operator: &OperatorAccount,
) -> bool {
    key.kind == Kind::RoleBinding
        && observed
            .get(key)
            .and_then(|o| render::operator_access_namespace(o, operator))
            .is_some()
}

/// The control namespace and the operator's access bindings of the revision: until they exist
/// the operator can neither read nor write the instance's Secrets, Deployments,
/// ServiceAccounts, PDBs and NetworkPolicies.
pub fn access_objects(
    control_plane: &MeshControlPlane,
    revision: &RevisionMembership,
    tenant_members: &BTreeSet<String>,
    operator: &OperatorAccount,
    managed_gateways: &[render::ManagedGateway],
) -> Vec<DesiredObject> {
    // The access bindings do not depend on the certificate: render them with none.
    let no_tls = WebhookTls {
        ca_bundle_pem: String::new(),
        cert_pem: String::new(),
        key_pem: String::new(),
    };
    let input = RenderInput {
        control_plane,
        revision,
        tenant_members,
        status_writer: false,
        tls: &no_tls,
        observed: &Observed::default(),
        operator,
        client_auth: None,
        managed_gateways,
        gateway_classes: &Default::default(),
    };
    render::render(&input)
        .into_iter()
        .filter(|d| {
            d.key.kind == Kind::Namespace
                || render::operator_access_namespace(&d.body, operator).is_some()
        })
        .collect()
}

/// Rendered objects not found by label: they may still exist under our name (unlabelled, or
/// another owner's), so they are read by name before anything is decided about them.
pub fn unobserved<'d>(
    desired: &'d [DesiredObject],
    observed: &BTreeMap<ObjectKey, Value>,
) -> Vec<&'d ObjectKey> {
    desired
        .iter()
        .map(|d| &d.key)
        .filter(|k| !observed.contains_key(*k))
        .collect()
}

/// Which of the [`access_objects`] to apply: those missing or changed, never another owner's.
pub fn access_writes<'d>(
    access: &'d [DesiredObject],
    observed: &BTreeMap<ObjectKey, Value>,
    owner_uid: &str,
) -> Vec<&'d DesiredObject> {
    let todo: BTreeSet<ObjectKey> = apply::plan(access, observed, owner_uid)
        .apply
        .into_iter()
        .collect();
    access.iter().filter(|d| todo.contains(&d.key)).collect()
}

/// What to do about the control namespace before anything is written into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlNamespaceStep {
    /// It does not exist: create it (never apply, which would take over one created since the
    /// caches looked) and record its UID.
    Create,
    /// It is the tenant's (its UID is vouched for, see `membership::control_namespace_refusal`).
    Ours,
    /// It exists and is not the tenant's: nothing may be written.
    Refused(String),
}

/// Checks the control namespace as just read (`live`) against what the tenant's control
/// planes naming it (`claimants`) vouch for: the caches membership decided on may lag behind
/// a namespace created or replaced meanwhile.
pub fn control_namespace_step(
    name: &str,
    live: Option<&Value>,
    claimants: &[meshplane_crds::membership::ControlPlaneFacts],
) -> ControlNamespaceStep {
    let Some(live) = live else {
        return ControlNamespaceStep::Create;
    };
    let meta = live
        .get("metadata")
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .unwrap_or_default();
    let facts = meshplane_crds::membership::NamespaceFacts::of(&meta);
    let claimants: Vec<_> = claimants.iter().collect();
    match meshplane_crds::membership::control_namespace_refusal(name, Some(&facts), &claimants) {
        None => ControlNamespaceStep::Ours,
        Some(why) => ControlNamespaceStep::Refused(why),
    }
}

/// The UID of the control namespace as observed (the reconcile only gets this far with a
/// namespace that is the tenant's).
fn control_namespace_uid(observed: &BTreeMap<ObjectKey, Value>, named: &Named) -> Option<String> {
    observed
        .get(&named.namespace)
        .and_then(|n| n.pointer("/metadata/uid"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The webhook certificate material of the revision's Secret, when there is one and it is
/// ours; reused until a third of its validity remains (`tls::ensure`).
pub fn webhook_tls(
    observed: &BTreeMap<ObjectKey, Value>,
    named: &Named,
    owner_uid: &str,
) -> Option<WebhookTls> {
    observed
        .get(&named.webhook_tls)
        .filter(|s| apply::is_ours(s, owner_uid))
        .and_then(|s| WebhookTls::from_secret_data(s.get("data")?))
}

/// The facts a pass renders from that the writes can change: the ClusterIP the instance
/// Service gets when it is created, and the tenant's root once its CA exists.
pub fn render_facts(
    observed: &BTreeMap<ObjectKey, Value>,
    named: &Named,
    tenant_ca: Option<&TenantCa>,
) -> Observed {
    Observed {
        service_cluster_ip: observed
            .get(&named.service)
            .and_then(|s| s.pointer("/spec/clusterIP")?.as_str().map(str::to_string)),
        root_cert: tenant_ca.and_then(|ca| ca.trust_bundle.clone()),
    }
}

/// One apply of a pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Apply {
    pub object: DesiredObject,
    /// Delete the object first: the API refuses to change a binding's roleRef.
    pub replace: bool,
}

/// The writes of one pass, performed in this order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Writes {
    /// Desired objects missing or changed, in apply order (dependencies first).
    pub apply: Vec<Apply>,
    /// Our objects no longer desired, in safe deletion order, the access bindings last (the
    /// objects they grant rights on are removed first).
    pub prune: Vec<ObjectKey>,
    /// Desired objects that another owner holds: left alone, reported.
    pub foreign: Vec<ObjectKey>,
}

/// Compares the rendered objects with the observed ones (every object carrying the revision's
/// labels, and the rendered ones found by name).
pub fn writes(
    desired: Vec<DesiredObject>,
    observed: &BTreeMap<ObjectKey, Value>,
    owner_uid: &str,
    operator: &OperatorAccount,
) -> Writes {
    let todo = apply::plan(&desired, observed, owner_uid);
    let mut prune = todo.prune;
    prune.sort_by_key(|k| is_access_binding(k, observed, operator));
    let changed: BTreeSet<ObjectKey> = todo.apply.into_iter().collect();
    let apply = desired
        .into_iter()
        .filter(|d| changed.contains(&d.key))
        .map(|object| Apply {
            replace: role_ref_changed(&object, observed),
            object,
        })
        .collect();
    Writes {
        apply,
        prune,
        foreign: todo.foreign,
    }
}

fn role_ref_changed(object: &DesiredObject, observed: &BTreeMap<ObjectKey, Value>) -> bool {
    let role_ref = |v: &Value| v.get("roleRef").cloned();
    matches!(
        object.key.kind,
        Kind::RoleBinding | Kind::ClusterRoleBinding
    ) && observed
        .get(&object.key)
        .and_then(role_ref)
        .is_some_and(|r| Some(r) != role_ref(&object.body))
}

/// What a reconcile did with the webhook serving certificate (contract 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Certificate {
    /// The Secret's material is still good: kept.
    Kept,
    /// There was none (or none of ours): issued.
    Issued,
    /// The Secret's material was due (a third of its validity left, or another host): replaced.
    Rotated,
}

impl Certificate {
    /// From whether there was material before and whether `tls::ensure` issued.
    pub fn of(had_material: bool, issued: bool) -> Self {
        match (had_material, issued) {
            (_, false) => Self::Kept,
            (false, true) => Self::Issued,
            (true, true) => Self::Rotated,
        }
    }
}

/// Events about what the writes did to the tenant CA (issued, rotated, or refused for bad
/// plugged material, the last only once) and to the webhook serving certificate for `host`
/// (`CertificateIssued` the first time, `CertificateRotated` when it replaces one).
pub fn write_notices(
    mcp: &MeshControlPlane,
    tenant_ca: Option<&TenantCa>,
    certificate: Certificate,
    host: &str,
) -> Vec<Notice> {
    let mut notices: Vec<Notice> = tenant_ca
        .and_then(|ca| ca_notice(mcp, ca))
        .into_iter()
        .collect();
    match certificate {
        Certificate::Kept => {}
        Certificate::Issued => notices.push(Notice::on_control_plane(
            false,
            "CertificateIssued",
            format!("issued the webhook serving certificate for {host}"),
        )),
        Certificate::Rotated => notices.push(Notice::on_control_plane(
            false,
            "CertificateRotated",
            format!("rotated the webhook serving certificate for {host}; the instance reloads it without a restart"),
        )),
    }
    notices
}

fn ca_notice(mcp: &MeshControlPlane, tenant_ca: &TenantCa) -> Option<Notice> {
    if let Some(problem) = &tenant_ca.problem {
        let known = condition(mcp.status.as_ref(), types::DEGRADED)
            .is_some_and(|c| c.status == "True" && c.reason == status::CA_INVALID_REASON);
        return (!known).then(|| {
            Notice::on_control_plane(
                true,
                status::CA_INVALID_REASON,
                format!("{problem}; the tenant keeps its current CA"),
            )
        });
    }
    let how = tenant_ca.written?;
    let message = match (how, tenant_ca.phase.as_deref()) {
        ("created", _) => format!("issued the tenant CA Secret {}", names::TENANT_CA_SECRET),
        (_, Some(phase)) => format!(
            "tenant CA Secret {} updated; root rotation phase {phase}",
            names::TENANT_CA_SECRET
        ),
        _ => format!("tenant CA Secret {} updated", names::TENANT_CA_SECRET),
    };
    Some(Notice::on_control_plane(false, "TenantCAUpdated", message))
}

/// Whether the instance Deployment has an available replica.
fn deployment_available(observed: &BTreeMap<ObjectKey, Value>, named: &Named) -> bool {
    status::deployment_available(observed.get(&named.deployment))
}

/// Whether both webhook configurations are in place and ours.
fn webhooks_applied(
    observed: &BTreeMap<ObjectKey, Value>,
    named: &Named,
    foreign: &[ObjectKey],
) -> bool {
    named
        .webhooks
        .iter()
        .all(|k| observed.contains_key(k) && !foreign.contains(k))
}

/// Whether the revision's validating webhook is probed: only once the instance is available
/// and its webhook configurations are in place.
pub fn probe_due(
    observed: &BTreeMap<ObjectKey, Value>,
    named: &Named,
    foreign: &[ObjectKey],
) -> bool {
    deployment_available(observed, named) && webhooks_applied(observed, named, foreign)
}

/// What the writes left, as observed, and what was found out about the instance after them.
pub struct Outcome<'a> {
    pub observed: &'a BTreeMap<ObjectKey, Value>,
    pub named: &'a Named,
    /// Desired objects another owner holds (as of the last pass).
    pub foreign: &'a [ObjectKey],
    pub tenant_ca: Option<&'a TenantCa>,
    /// What the probe of the validating webhook found, if it was due.
    pub webhook_probe: Option<ProbeResult>,
    /// The instance pods that exist (contract 3 counts only theirs).
    pub live_instances: &'a BTreeSet<String>,
    /// Why the requested ingress gateway is not run, if it is not.
    pub gateway_problem: Option<String>,
}

impl Outcome<'_> {
    /// Whether an instance pod reports reads the API server refuses it (contract 3).
    pub fn watches_refused(&self) -> bool {
        let proxies = self.observed.get(&self.named.proxies);
        !status::refused_watches(proxies, self.live_instances).is_empty()
    }

    fn instance_facts(&self) -> InstanceFacts {
        let proxies = self.observed.get(&self.named.proxies);
        InstanceFacts {
            deployment_available: deployment_available(self.observed, self.named),
            webhooks_applied: webhooks_applied(self.observed, self.named, self.foreign),
            webhook_probe: self.webhook_probe.clone(),
            connected_proxies: status::connected_proxies(proxies, self.live_instances),
            members_stale: status::members_stale(proxies, self.live_instances),
            refused_watches: status::refused_watches(proxies, self.live_instances),
            foreign_objects: self.foreign.iter().map(ToString::to_string).collect(),
            ca_problem: self
                .tenant_ca
                .and_then(|ca| ca.problem.as_ref())
                .map(ToString::to_string),
            gateway_problem: self.gateway_problem.clone(),
        }
    }
}

/// Most namespaces the membership Events on a control plane name one by one per reconcile;
/// beyond that, one Event says how many joined (or left) and names the first of them.
pub const NAMED_MEMBERSHIP_CHANGES: usize = 10;

/// Namespace names the reconcile knew before it wrote anything, exactly or up to a bound.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownNamespaces {
    /// The names known.
    pub names: BTreeSet<String>,
    /// Set when the names come from a status list cut at its bound (sorted, with an exact
    /// count): a name sorting after this one is not known either way, so no Event is decided
    /// for it.
    pub known_up_to: Option<String>,
}

impl KnownNamespaces {
    /// Every name, exactly.
    pub fn exactly(names: BTreeSet<String>) -> Self {
        Self {
            names,
            known_up_to: None,
        }
    }

    /// A sorted status list of `count` namespaces of which `names` are listed.
    fn from_bounded<'a>(names: impl Iterator<Item = &'a str>, count: i32) -> Self {
        let names: BTreeSet<String> = names.map(str::to_string).collect();
        let cut = usize::try_from(count).unwrap_or(usize::MAX) > names.len();
        Self {
            known_up_to: if cut { names.last().cloned() } else { None },
            names,
        }
    }

    /// Whether `ns` is decided by what is known (in or out).
    fn decides(&self, ns: &str) -> bool {
        self.known_up_to.as_deref().is_none_or(|last| ns <= last)
    }

    fn is_new(&self, ns: &str) -> bool {
        self.decides(ns) && !self.names.contains(ns)
    }
}

/// The namespaces attached to the revision as its members ConfigMap (contract 2) says, when
/// it is observed, the operator's (owned by `owner_uid`: one somebody else put in its place
/// says nothing of what the instance serves) and readable.
pub fn written_members(
    observed: &BTreeMap<ObjectKey, Value>,
    named: &Named,
    owner_uid: &str,
) -> Option<BTreeSet<String>> {
    let cm = observed
        .get(&named.members)
        .filter(|cm| apply::is_ours(cm, owner_uid))?;
    let data = cm.get("data")?.clone();
    let data: meshplane_contracts::Data = serde_json::from_value(data).ok()?;
    meshplane_contracts::members::MembersData::from_data(&data)
        .ok()
        .map(|m| m.attached)
}

/// What was attached to the revision before this reconcile wrote anything: its members
/// ConfigMap as observed, else the member list of its last status (bounded), else nothing
/// (a revision reconciled for the first time).
pub fn members_before(
    observed: &BTreeMap<ObjectKey, Value>,
    named: &Named,
    owner_uid: &str,
    previous: Option<&MeshControlPlaneStatus>,
) -> KnownNamespaces {
    if let Some(attached) = written_members(observed, named, owner_uid) {
        return KnownNamespaces::exactly(attached);
    }
    match previous.and_then(|s| s.members.as_ref()) {
        Some(list) => {
            KnownNamespaces::from_bounded(list.names.iter().map(String::as_str), list.count)
        }
        None => KnownNamespaces::default(),
    }
}

/// The Events of namespaces joining and leaving `revision` (of `tenant`): `before` as the
/// reconcile found the revision's members, `after` as its members ConfigMap holds them once
/// written (`None` when it could not be read: nothing is decided). Each change is reported
/// once, when the ConfigMap that the instance serves changes: on the control plane (one Event
/// per namespace, or one for many) and on each namespace. A steady reconcile reports nothing.
pub fn membership_notices(
    revision: &str,
    tenant: &str,
    before: &KnownNamespaces,
    after: Option<&BTreeSet<String>>,
) -> Vec<Notice> {
    let Some(after) = after else {
        return Vec::new();
    };
    let joined: Vec<&String> = after.iter().filter(|ns| before.is_new(ns)).collect();
    let left: Vec<&String> = before
        .names
        .iter()
        .filter(|ns| !after.contains(*ns))
        .collect();
    let target = format!("revision {revision} of tenant {tenant}");
    let mut notices = Vec::new();
    for (reason, verb, changed) in [
        (NAMESPACE_JOINED, "joined", &joined),
        (NAMESPACE_LEFT, "left", &left),
    ] {
        if changed.len() <= NAMED_MEMBERSHIP_CHANGES {
            notices.extend(changed.iter().map(|ns| {
                Notice::on_control_plane(false, reason, format!("namespace {ns} {verb} {target}"))
            }));
        } else {
            let first: Vec<&str> = changed
                .iter()
                .take(NAMED_MEMBERSHIP_CHANGES)
                .map(|s| s.as_str())
                .collect();
            notices.push(Notice::on_control_plane(
                false,
                reason,
                format!(
                    "{} namespaces {verb} {target}: {}, and {} more",
                    changed.len(),
                    first.join(", "),
                    changed.len() - first.len()
                ),
            ));
        }
        notices.extend(changed.iter().map(|ns| Notice {
            regarding: Regarding::Namespace(ns.to_string()),
            warning: false,
            reason: reason.to_string(),
            message: format!("{verb} {target}"),
        }));
    }
    notices
}

/// Reason of the Event of a namespace joining a revision.
pub const NAMESPACE_JOINED: &str = "NamespaceJoined";
/// Reason of the Event of a namespace leaving a revision.
pub const NAMESPACE_LEFT: &str = "NamespaceLeft";
/// Reason of the control plane's Event of a namespace labelled for it but refused.
pub const NAMESPACE_REJECTED: &str = "NamespaceRejected";

/// The status of an active revision from its reconcile's outcome, and the Events the change
/// brings: a Warning on each namespace newly rejected and one on the control plane
/// (`NamespaceRejected`, naming it and why), one when `MembersStale` or
/// `WatchesRefused` turns True, and `ConflictResolved` when a Degraded revision has nothing
/// left to report.
pub fn report(
    mcp: &MeshControlPlane,
    revision: &RevisionMembership,
    outcome: &Outcome<'_>,
    now: &Time,
) -> Report {
    let facts = outcome.instance_facts();
    let previous = mcp.status.as_ref();
    let mut status = status::active_status(mcp, revision, &facts, now);
    // Otherwise what was recorded before stays (`status::active_status` carries it over).
    if let Some(uid) = control_namespace_uid(outcome.observed, outcome.named) {
        status.control_namespace_uid = Some(uid);
    }
    let known_rejected = previous
        .and_then(|s| s.rejected.as_ref())
        .map(|r| {
            KnownNamespaces::from_bounded(r.namespaces.iter().map(|n| n.name.as_str()), r.count)
        })
        .unwrap_or_default();
    let mut notices: Vec<Notice> = revision
        .rejected
        .iter()
        .filter(|(ns, _)| known_rejected.is_new(ns))
        .flat_map(|(ns, rejection)| {
            [
                Notice::on_control_plane(
                    true,
                    NAMESPACE_REJECTED,
                    format!(
                        "rejected namespace {ns} ({}): {}",
                        rejection.reason.as_str(),
                        rejection.message
                    ),
                ),
                Notice {
                    regarding: Regarding::Namespace(ns.clone()),
                    warning: true,
                    reason: rejection.reason.as_str().to_string(),
                    message: rejection.message.clone(),
                },
            ]
        })
        .collect();
    let turned_true = |type_: &str| {
        let is_true = |s: Option<&'_ MeshControlPlaneStatus>| {
            condition(s, type_)
                .filter(|c| c.status == "True")
                .map(|c| c.message.clone())
        };
        match (is_true(Some(&status)), is_true(previous)) {
            (Some(message), None) => Some(message),
            _ => None,
        }
    };
    // Contract 3 carries the instance's word that it serves the members it last read, and
    // that it serves without what the API server refuses it.
    for type_ in [types::MEMBERS_STALE, types::WATCHES_REFUSED] {
        if let Some(message) = turned_true(type_) {
            notices.push(Notice::on_control_plane(true, type_, message));
        }
    }
    if condition(previous, types::DEGRADED).is_some_and(|c| c.status == "True")
        && facts.foreign_objects.is_empty()
        && facts.ca_problem.is_none()
    {
        notices.push(Notice::on_control_plane(
            false,
            "ConflictResolved",
            "the revision is active again".into(),
        ));
    }
    Report { status, notices }
}

/// When to look again: soon while a webhook does not answer yet or an instance pod is refused
/// reads (its reader RoleBinding was removed or replaced, and the removal of a binding that is
/// no longer the operator's triggers nothing: looking again re-creates the binding once it is
/// gone), else at the resync.
pub fn requeue_after(
    webhook_probe: Option<&ProbeResult>,
    watches_refused: bool,
    resync: Duration,
) -> Duration {
    match webhook_probe {
        Some(ProbeResult::Failed(_)) => PROBE_EVERY.min(resync),
        _ if watches_refused => PROBE_EVERY.min(resync),
        _ => resync,
    }
}

/// The status of a control plane whose deletion waits for `pods` injected pods, with a
/// Warning Event when the wait starts.
pub fn in_use(mcp: &MeshControlPlane, pods: usize, now: &Time) -> Report {
    let mut notices = Vec::new();
    if condition(mcp.status.as_ref(), types::IN_USE).is_none() {
        notices.push(Notice::on_control_plane(
            true,
            "InUse",
            format!(
                "deletion waits for {pods} pod(s) injected by revision {:?}; annotate {}=\"true\" to delete anyway",
                mcp.revision(),
                names::FORCE_DELETE_ANNOTATION
            ),
        ));
    }
    Report {
        status: status::in_use_status(mcp, pods, now),
        notices,
    }
}

/// What deleting the control plane removes of the observed objects, in order: webhooks first,
/// then per-namespace objects and RBAC, then the instance, and the operator's access bindings
/// last (they grant the rights to delete the instance). Only objects it owns; never a
/// namespace (a control namespace holds user config).
pub fn teardown<'o>(
    observed: &'o BTreeMap<ObjectKey, Value>,
    owner_uid: &str,
    operator: &OperatorAccount,
) -> Vec<&'o ObjectKey> {
    let owned = |o: &Value| {
        o.pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|os| {
                os.iter()
                    .any(|r| r.get("uid").and_then(Value::as_str) == Some(owner_uid))
            })
    };
    let mut doomed: Vec<&ObjectKey> = Kind::DELETE_ORDER
        .into_iter()
        .flat_map(|kind| {
            observed
                .iter()
                .filter(move |(k, o)| k.kind == kind && owned(o))
                .map(|(k, _)| k)
        })
        .collect();
    doomed.sort_by_key(|k| is_access_binding(k, observed, operator));
    doomed
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use meshplane_crds::membership::{self, ControlPlaneFacts, NamespaceFacts};
    use serde_json::json;

    use super::*;
    use crate::ca::CaProblem;

    const NOW: i64 = 1_800_000_000;

    fn now() -> Time {
        Time(Timestamp::from_second(NOW).expect("valid time"))
    }

    /// A control plane of `tenant` whose namespace selector refuses team green.
    fn mk_control_plane(name: &str, tenant: &str, created: &str) -> MeshControlPlane {
        serde_json::from_value(json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1,
                         "creationTimestamp": created},
            "spec": {"tenant": tenant, "namespaceSelector": {"matchExpressions": [
                {"key": "team", "operator": "NotIn", "values": ["green"]}]}},
        }))
        .expect("a valid control plane")
    }

    fn mk_namespace(name: &str, labels: &[(&str, &str)]) -> NamespaceFacts {
        NamespaceFacts::new(name, labels)
    }

    /// blue-v1 with shop and cart joined and intruder (team green) rejected.
    fn mk_membership(control_planes: &[&MeshControlPlane]) -> Membership {
        let namespaces = [
            mk_namespace("shop", &[(names::REV_LABEL, "blue-v1")]),
            mk_namespace("cart", &[(names::REV_LABEL, "blue-v1")]),
            mk_namespace(
                "intruder",
                &[(names::REV_LABEL, "blue-v1"), ("team", "green")],
            ),
        ];
        let control_planes: Vec<ControlPlaneFacts> =
            control_planes.iter().map(|c| (*c).into()).collect();
        membership::compute(&namespaces, &control_planes, &[])
    }

    fn mk_tls() -> WebhookTls {
        WebhookTls {
            ca_bundle_pem: "ca".into(),
            cert_pem: "cert".into(),
            key_pem: "key".into(),
        }
    }

    /// Every object of blue-v1, rendered for its membership.
    fn mk_desired(mcp: &MeshControlPlane, membership: &Membership) -> Vec<DesiredObject> {
        let Decision::Active {
            revision,
            tenant_members,
            ..
        } = decide(mcp, membership, &now())
        else {
            panic!("blue-v1 is active");
        };
        render::render(&RenderInput {
            control_plane: mcp,
            revision,
            tenant_members: &tenant_members,
            status_writer: true,
            tls: &mk_tls(),
            observed: &Observed::default(),
            operator: &OperatorAccount::default(),
            client_auth: None,
            managed_gateways: &[],
            gateway_classes: &Default::default(),
        })
    }

    /// The objects as the API holds them once applied.
    fn mk_observed(objects: &[DesiredObject]) -> BTreeMap<ObjectKey, Value> {
        objects
            .iter()
            .map(|d| (d.key.clone(), d.body.clone()))
            .collect()
    }

    fn mk_blue() -> (MeshControlPlane, Membership) {
        let mcp = mk_control_plane("blue-v1", "blue", "2026-01-01T00:00:00Z");
        let membership = mk_membership(&[&mcp]);
        (mcp, membership)
    }

    fn uid(mcp: &MeshControlPlane) -> String {
        mcp.uid().unwrap_or_default()
    }

    /// Whether a pass writes nothing (the steady state).
    fn writes_nothing(writes: &Writes) -> bool {
        writes.apply.is_empty() && writes.prune.is_empty()
    }

    fn applied_keys(writes: &Writes) -> Vec<&ObjectKey> {
        writes.apply.iter().map(|a| &a.object.key).collect()
    }

    #[test]
    fn an_active_control_plane_is_reconciled_for_its_membership() {
        let (mcp, membership) = mk_blue();
        let Decision::Active {
            revision,
            tenant_members,
            ..
        } = decide(&mcp, &membership, &now())
        else {
            panic!("blue-v1 is active");
        };
        assert_eq!(revision.tenant, "blue");
        assert_eq!(
            tenant_members,
            BTreeSet::from(["cart".to_string(), "shop".to_string()])
        );
        assert!(revision.rejected.contains_key("intruder"));
    }

    #[test]
    fn a_duplicate_revision_writes_nothing_and_warns_once() {
        let (blue, _) = mk_blue();
        let mut copy = mk_control_plane("blue-copy", "red", "2026-02-01T00:00:00Z");
        copy.spec.revision = Some("blue-v1".into());
        let membership = mk_membership(&[&blue, &copy]);
        let Decision::Conflicted(report) = decide(&copy, &membership, &now()) else {
            panic!("the later duplicate is in conflict");
        };
        assert_eq!(report.notices.len(), 1, "{:?}", report.notices);
        let warning = &report.notices[0];
        assert!(warning.warning);
        assert_eq!(warning.reason, "RevisionConflict");
        assert_eq!(warning.regarding, Regarding::ControlPlane);
        let degraded = condition(Some(&report.status), types::DEGRADED).expect("Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "RevisionConflict")
        );

        // Already Degraded for that reason: the status stays, no second Warning.
        copy.status = Some(report.status.clone());
        let Decision::Conflicted(again) = decide(&copy, &membership, &now()) else {
            panic!("still in conflict");
        };
        assert_eq!(again.notices, []);
        assert_eq!(again.status, report.status);
    }

    #[test]
    fn a_tenant_admitted_with_another_tenants_trust_domain_writes_nothing_and_warns() {
        // Created while the operator's webhook was down.
        let mut blue = mk_control_plane("blue-v1", "blue", "2026-01-01T00:00:00Z");
        blue.spec.mesh_config.trust_domain = Some("corp.example".into());
        let mut red = mk_control_plane("red-v1", "red", "2026-02-01T00:00:00Z");
        red.spec.mesh_config.trust_domain = Some("corp.example".into());
        let mut canary = mk_control_plane("blue-v2", "blue", "2026-03-01T00:00:00Z");
        canary.spec.mesh_config.trust_domain = Some("corp.example".into());
        let membership = mk_membership(&[&blue, &red, &canary]);
        assert!(matches!(
            decide(&canary, &membership, &now()),
            Decision::Active { .. }
        ));
        let Decision::Conflicted(report) = decide(&red, &membership, &now()) else {
            panic!("the younger tenant is in conflict");
        };
        let warning = &report.notices[0];
        assert_eq!(
            (warning.warning, warning.reason.as_str()),
            (true, "TrustDomainTaken")
        );
        assert!(warning.message.contains("\"blue\""), "{}", warning.message);
        let degraded = condition(Some(&report.status), types::DEGRADED).expect("Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "TrustDomainTaken")
        );
    }

    #[test]
    fn the_control_namespace_is_checked_as_read_before_the_first_write() {
        use meshplane_crds::membership::ControlPlaneFacts;
        let mcp = mk_control_plane("blue-v1", "blue", "2026-01-01T00:00:00Z");
        let mut recorded = ControlPlaneFacts::from(&mcp);
        recorded.control_namespace_uid = Some("uid-made".into());
        let live = |uid: &str| {
            serde_json::json!({"metadata": {"name": "meshplane-blue", "uid": uid,
                "labels": {names::MANAGED_BY_LABEL: names::MANAGED_BY_VALUE,
                           names::TENANT_LABEL: "blue"}}})
        };
        let step = |live: Option<&Value>| {
            control_namespace_step("meshplane-blue", live, std::slice::from_ref(&recorded))
        };
        assert_eq!(step(None), ControlNamespaceStep::Create);
        assert_eq!(step(Some(&live("uid-made"))), ControlNamespaceStep::Ours);
        // Created by someone else since the caches looked, with our labels.
        assert!(matches!(
            step(Some(&live("uid-planted"))),
            ControlNamespaceStep::Refused(_)
        ));
    }

    #[test]
    fn access_is_the_control_namespace_and_the_operators_bindings_only() {
        let (mcp, membership) = mk_blue();
        let revision = membership
            .revision_of_control_plane("blue-v1")
            .expect("active");
        let members = membership.tenant_members("blue");
        let operator = OperatorAccount::default();
        let access = access_objects(&mcp, revision, &members, &operator, &[]);
        let keys: Vec<String> = access.iter().map(|d| d.key.to_string()).collect();
        assert_eq!(
            keys,
            [
                "Namespace meshplane-blue",
                "RoleBinding meshplane-blue/meshplane-blue-v1-operator"
            ]
        );
        // Nothing there yet: all of it; already in place: nothing.
        assert_eq!(
            access_writes(&access, &BTreeMap::new(), &uid(&mcp)).len(),
            2
        );
        let observed = mk_observed(&access);
        assert_eq!(
            access_writes(&access, &observed, &uid(&mcp)),
            Vec::<&DesiredObject>::new()
        );
        assert_eq!(
            access_grants(&observed, &operator),
            BTreeMap::from([(
                "meshplane-blue".to_string(),
                render::AccessGrant::ControlNamespace
            )])
        );
    }

    #[test]
    fn a_rejected_namespace_gets_no_bootstrap_configmap() {
        let (mcp, membership) = mk_blue();
        let writes = writes(
            mk_desired(&mcp, &membership),
            &BTreeMap::new(),
            &uid(&mcp),
            &OperatorAccount::default(),
        );
        let bootstrap = names::bootstrap_configmap("blue-v1");
        let in_namespace = |ns: &str| {
            writes
                .apply
                .iter()
                .any(|a| a.object.key.namespace.as_deref() == Some(ns))
        };
        for member in ["shop", "cart"] {
            assert!(
                applied_keys(&writes).contains(&&key(Kind::ConfigMap, Some(member), &bootstrap)),
                "{member}"
            );
        }
        assert!(
            !in_namespace("intruder"),
            "nothing at all in a rejected namespace"
        );
        assert!(writes.prune.is_empty() && writes.foreign.is_empty());
        assert!(writes.apply.iter().all(|a| !a.replace));
    }

    #[test]
    fn the_steady_state_plans_no_writes() {
        let (mcp, membership) = mk_blue();
        let desired = mk_desired(&mcp, &membership);
        let observed = mk_observed(&desired);
        let writes = writes(desired, &observed, &uid(&mcp), &OperatorAccount::default());
        assert!(writes_nothing(&writes), "{writes:?}");
        assert_eq!(writes.foreign, []);
    }

    #[test]
    fn only_the_changed_object_is_applied() {
        let (mcp, membership) = mk_blue();
        let desired = mk_desired(&mcp, &membership);
        let members = key(
            Kind::ConfigMap,
            Some("meshplane-blue"),
            &names::members_configmap("blue-v1"),
        );
        let mut observed = mk_observed(&desired);
        if let Some(cm) = observed.get_mut(&members) {
            cm["data"]["members"] = json!("shop\n");
        }
        let writes = writes(desired, &observed, &uid(&mcp), &OperatorAccount::default());
        assert_eq!(applied_keys(&writes), [&members]);
        assert!(writes.prune.is_empty());
    }

    #[test]
    fn a_binding_whose_role_ref_changed_is_replaced() {
        let (mcp, membership) = mk_blue();
        let desired = mk_desired(&mcp, &membership);
        let restarter = key(
            Kind::RoleBinding,
            Some("shop"),
            &format!("{}-restarter", names::instance_name("blue-v1")),
        );
        let mut observed = mk_observed(&desired);
        let binding = observed.get_mut(&restarter).expect("the restarter binding");
        binding["roleRef"]["kind"] = json!("Role");
        let writes = writes(desired, &observed, &uid(&mcp), &OperatorAccount::default());
        assert_eq!(writes.apply.len(), 1, "{writes:?}");
        assert_eq!(writes.apply[0].object.key, restarter);
        assert!(writes.apply[0].replace);
    }

    #[test]
    fn an_object_under_our_name_that_is_not_ours_is_left_alone_and_reported() {
        let (mcp, membership) = mk_blue();
        let desired = mk_desired(&mcp, &membership);
        let taken = key(
            Kind::ConfigMap,
            Some("shop"),
            &names::bootstrap_configmap("blue-v1"),
        );
        let mut observed = mk_observed(&desired);
        observed.insert(
            taken.clone(),
            json!({"metadata": {"name": taken.name, "namespace": "shop"}, "data": {"mine": "yes"}}),
        );
        let writes = writes(desired, &observed, &uid(&mcp), &OperatorAccount::default());
        assert_eq!(writes.foreign, [taken]);
        assert!(writes_nothing(&writes), "{writes:?}");
    }

    #[test]
    fn objects_no_longer_desired_are_pruned_webhooks_first_access_bindings_last() {
        let (mcp, membership) = mk_blue();
        let all = mk_desired(&mcp, &membership);
        let observed = mk_observed(&all);
        // shop leaves: its objects go, the others stay.
        let desired: Vec<DesiredObject> = all
            .iter()
            .filter(|d| d.key.namespace.as_deref() != Some("shop"))
            .cloned()
            .collect();
        let left = writes(desired, &observed, &uid(&mcp), &OperatorAccount::default());
        assert!(!left.prune.is_empty());
        assert!(left
            .prune
            .iter()
            .all(|k| k.namespace.as_deref() == Some("shop")));
        assert!(left.apply.is_empty());

        // Nothing desired: everything of ours goes but the namespace, in the safe order.
        let gone = writes(
            Vec::new(),
            &observed,
            &uid(&mcp),
            &OperatorAccount::default(),
        );
        assert_eq!(
            gone.prune.first().map(|k| k.kind),
            Some(Kind::MutatingWebhookConfiguration)
        );
        assert_eq!(
            gone.prune.last().map(ToString::to_string).as_deref(),
            Some("RoleBinding meshplane-blue/meshplane-blue-v1-operator")
        );
        assert!(gone.prune.iter().all(|k| k.kind != Kind::Namespace));
    }

    #[test]
    fn another_pass_follows_while_the_service_ip_or_the_root_changes() {
        let named = Named::new("blue-v1", "meshplane-blue");
        let mut observed = BTreeMap::new();
        let first = render_facts(&observed, &named, None);
        assert_eq!(first, Observed::default());
        observed.insert(
            named.service.clone(),
            json!({"spec": {"clusterIP": "198.18.0.7"}}),
        );
        let tenant_ca = TenantCa {
            trust_bundle: Some("root".into()),
            problem: None,
            written: Some("created"),
            phase: None,
        };
        let second = render_facts(&observed, &named, Some(&tenant_ca));
        assert_ne!(second, first);
        assert_eq!(second.service_cluster_ip.as_deref(), Some("198.18.0.7"));
        assert_eq!(second.root_cert.as_deref(), Some("root"));
    }

    #[test]
    fn what_was_written_is_told_once() {
        let (mut mcp, _) = mk_blue();
        let issued = TenantCa {
            trust_bundle: Some("root".into()),
            problem: None,
            written: Some("created"),
            phase: None,
        };
        let notices = write_notices(
            &mcp,
            Some(&issued),
            Certificate::of(false, true),
            "meshplane-blue-v1.meshplane-blue.svc",
        );
        let reasons: Vec<&str> = notices.iter().map(|n| n.reason.as_str()).collect();
        assert_eq!(reasons, ["TenantCAUpdated", "CertificateIssued"]);
        assert!(notices.iter().all(|n| !n.warning));
        // Material replaced is a rotation; material kept is told nothing.
        let rotated = write_notices(&mcp, None, Certificate::of(true, true), "host");
        let reasons: Vec<&str> = rotated.iter().map(|n| n.reason.as_str()).collect();
        assert_eq!(reasons, ["CertificateRotated"]);
        assert_eq!(
            write_notices(&mcp, None, Certificate::of(true, false), "host"),
            []
        );

        let refused = TenantCa {
            trust_bundle: Some("root".into()),
            problem: Some(CaProblem::PluggedMissing {
                namespace: "meshplane-blue".into(),
                name: "cacerts".into(),
            }),
            written: None,
            phase: None,
        };
        let warned = write_notices(&mcp, Some(&refused), Certificate::Kept, "host");
        assert_eq!(warned.len(), 1);
        assert!(warned[0].warning);
        assert_eq!(warned[0].reason, status::CA_INVALID_REASON);
        // Once the status says so, the refusal is not told again; nothing written, nothing told.
        mcp.status = Some(MeshControlPlaneStatus {
            conditions: vec![Condition {
                type_: types::DEGRADED.into(),
                status: "True".into(),
                reason: status::CA_INVALID_REASON.into(),
                message: String::new(),
                last_transition_time: now(),
                observed_generation: Some(1),
            }],
            ..Default::default()
        });
        assert_eq!(
            write_notices(&mcp, Some(&refused), Certificate::Kept, "host"),
            []
        );
        let kept = TenantCa {
            written: None,
            ..issued
        };
        assert_eq!(
            write_notices(&mcp, Some(&kept), Certificate::Kept, "host"),
            []
        );
    }

    /// An outcome of blue-v1 with every object in place and `proxies` as the proxies
    /// ConfigMap's data.
    fn mk_report(mcp: &MeshControlPlane, membership: &Membership, proxies: Value) -> Report {
        let revision = membership
            .revision_of_control_plane("blue-v1")
            .expect("active");
        let named = Named::new("blue-v1", "meshplane-blue");
        let mut observed = mk_observed(&mk_desired(mcp, membership));
        observed.insert(named.proxies.clone(), json!({"data": proxies}));
        let live = BTreeSet::from(["xds-a".to_string()]);
        let outcome = Outcome {
            observed: &observed,
            named: &named,
            foreign: &[],
            tenant_ca: None,
            webhook_probe: None,
            live_instances: &live,
            gateway_problem: None,
        };
        report(mcp, revision, &outcome, &now())
    }

    #[test]
    fn a_newly_rejected_namespace_is_warned_about_once() {
        let (mut mcp, membership) = mk_blue();
        let first = mk_report(&mcp, &membership, json!({"xds-a": "2"}));
        let rejection = &membership.revisions["blue-v1"].rejected["intruder"];
        assert_eq!(
            first.notices,
            [
                Notice {
                    regarding: Regarding::ControlPlane,
                    warning: true,
                    reason: NAMESPACE_REJECTED.into(),
                    message: format!(
                        "rejected namespace intruder (OutsideSelector): {}",
                        rejection.message
                    ),
                },
                Notice {
                    regarding: Regarding::Namespace("intruder".into()),
                    warning: true,
                    reason: "OutsideSelector".into(),
                    message: rejection.message.clone(),
                }
            ]
        );
        assert_eq!(first.status.connected_proxies, Some(2));
        mcp.status = Some(first.status);
        let again = mk_report(&mcp, &membership, json!({"xds-a": "2"}));
        assert_eq!(again.notices, []);
        assert_eq!(Some(&again.status), mcp.status.as_ref(), "a steady status");
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// The membership Events as (regarding namespace or "", reason, message).
    fn told(notices: &[Notice]) -> Vec<(String, &str, &str)> {
        notices
            .iter()
            .map(|n| {
                let on = match &n.regarding {
                    Regarding::ControlPlane => String::new(),
                    Regarding::Namespace(ns) => ns.clone(),
                };
                (on, n.reason.as_str(), n.message.as_str())
            })
            .collect()
    }

    #[test]
    fn joins_and_leaves_are_told_once_on_the_control_plane_and_the_namespace() {
        let before = KnownNamespaces::exactly(set(&["cart", "shop"]));
        let after = set(&["cart", "bank"]);
        let notices = membership_notices("blue-v1", "blue", &before, Some(&after));
        assert_eq!(
            told(&notices),
            [
                (
                    String::new(),
                    NAMESPACE_JOINED,
                    "namespace bank joined revision blue-v1 of tenant blue"
                ),
                (
                    "bank".into(),
                    NAMESPACE_JOINED,
                    "joined revision blue-v1 of tenant blue"
                ),
                (
                    String::new(),
                    NAMESPACE_LEFT,
                    "namespace shop left revision blue-v1 of tenant blue"
                ),
                (
                    "shop".into(),
                    NAMESPACE_LEFT,
                    "left revision blue-v1 of tenant blue"
                ),
            ]
        );
        assert!(notices.iter().all(|n| !n.warning));
        // The next reconcile finds the members ConfigMap as written: nothing to tell.
        let steady = KnownNamespaces::exactly(after.clone());
        assert_eq!(
            membership_notices("blue-v1", "blue", &steady, Some(&after)),
            []
        );
        // Members ConfigMap unreadable after the writes: nothing is decided.
        assert_eq!(membership_notices("blue-v1", "blue", &before, None), []);
    }

    #[test]
    fn the_members_before_come_from_the_members_configmap_else_the_status() {
        let (mcp, membership) = mk_blue();
        let named = Named::new("blue-v1", "meshplane-blue");
        let mut observed = mk_observed(&mk_desired(&mcp, &membership));
        // As rendered: shop and cart attached.
        let written = written_members(&observed, &named, &uid(&mcp));
        assert_eq!(written, Some(set(&["cart", "shop"])));
        // One somebody put in its place (not the operator's labels) says nothing.
        let mut foreign = observed.clone();
        if let Some(cm) = foreign.get_mut(&named.members) {
            cm["metadata"]["labels"] = json!({});
        }
        assert_eq!(written_members(&foreign, &named, &uid(&mcp)), None);
        assert_eq!(
            members_before(&observed, &named, &uid(&mcp), None),
            KnownNamespaces::exactly(set(&["cart", "shop"]))
        );
        // Without a members ConfigMap, a first reconcile knows nothing attached: every
        // attached namespace joins.
        observed.remove(&named.members);
        assert_eq!(
            members_before(&observed, &named, &uid(&mcp), None),
            KnownNamespaces::default()
        );
        let first = membership_notices(
            "blue-v1",
            "blue",
            &KnownNamespaces::default(),
            written.as_ref(),
        );
        assert_eq!(
            first
                .iter()
                .filter(|n| n.regarding == Regarding::ControlPlane)
                .count(),
            2
        );
        // Else the status' list, known only up to its last name when cut at the bound.
        let status = MeshControlPlaneStatus {
            members: Some(status::bounded(&set(&["cart", "shop"]))),
            ..Default::default()
        };
        assert_eq!(
            members_before(&observed, &named, &uid(&mcp), Some(&status)),
            KnownNamespaces::exactly(set(&["cart", "shop"]))
        );
        let cut = MeshControlPlaneStatus {
            members: Some(meshplane_crds::controlplane::NamespaceList {
                count: 60,
                names: vec!["cart".into(), "shop".into()],
            }),
            ..Default::default()
        };
        let known = members_before(&observed, &named, &uid(&mcp), Some(&cut));
        // "bank" sorts inside the list and is not in it: it joined. "web" sorts after the
        // cut: unknown, nothing told.
        let notices = membership_notices(
            "blue-v1",
            "blue",
            &known,
            Some(&set(&["bank", "cart", "shop", "web"])),
        );
        assert_eq!(
            told(&notices)
                .iter()
                .map(|(on, reason, _)| (on.as_str(), *reason))
                .collect::<Vec<_>>(),
            [("", NAMESPACE_JOINED), ("bank", NAMESPACE_JOINED)]
        );
    }

    #[test]
    fn many_changes_at_once_are_one_event_on_the_control_plane() {
        let many: BTreeSet<String> = (0..12).map(|i| format!("ns-{i:02}")).collect();
        let notices =
            membership_notices("blue-v2", "blue", &KnownNamespaces::default(), Some(&many));
        let on_control_plane: Vec<&Notice> = notices
            .iter()
            .filter(|n| n.regarding == Regarding::ControlPlane)
            .collect();
        assert_eq!(on_control_plane.len(), 1);
        assert_eq!(
            on_control_plane[0].message,
            "12 namespaces joined revision blue-v2 of tenant blue: ns-00, ns-01, ns-02, ns-03, ns-04, ns-05, ns-06, ns-07, ns-08, ns-09, and 2 more"
        );
        // Each namespace still gets its own.
        assert_eq!(notices.len(), 1 + 12);
    }

    #[test]
    fn rejections_beyond_the_status_bound_are_not_told_again() {
        let (mut mcp, membership) = mk_blue();
        let first = mk_report(&mcp, &membership, json!({}));
        assert_eq!(first.notices.len(), 2, "{:?}", first.notices);
        // A status listing fewer rejected names than its count, cut before "intruder": the
        // reconcile cannot tell whether intruder was rejected before, and tells nothing.
        let mut status = first.status.clone();
        if let Some(r) = status.rejected.as_mut() {
            r.count = 51;
            r.namespaces = vec![meshplane_crds::controlplane::RejectedNamespace {
                name: "aaa".into(),
                reason: "OutsideSelector".into(),
                message: String::new(),
            }];
        }
        mcp.status = Some(status);
        assert_eq!(mk_report(&mcp, &membership, json!({})).notices, []);
    }

    #[test]
    fn members_stale_is_warned_about_when_it_turns_true() {
        let (mut mcp, membership) = mk_blue();
        mcp.status = Some(mk_report(&mcp, &membership, json!({})).status);
        let stale = json!({"xds-a": "1", "xds-a.members-stale": "2026-12-02T03:40:00Z the members ConfigMap was deleted"});
        let turned = mk_report(&mcp, &membership, stale.clone());
        let reasons: Vec<&str> = turned.notices.iter().map(|n| n.reason.as_str()).collect();
        assert_eq!(reasons, [types::MEMBERS_STALE]);
        assert!(turned.notices[0]
            .message
            .contains("xds-a since 2026-12-02T03:40:00Z"));
        mcp.status = Some(turned.status);
        assert_eq!(mk_report(&mcp, &membership, stale).notices, []);
    }

    #[test]
    fn watches_refused_is_warned_about_when_it_turns_true() {
        let (mut mcp, membership) = mk_blue();
        mcp.status = Some(mk_report(&mcp, &membership, json!({"xds-a": "1"})).status);
        let refused =
            json!({"xds-a": "1", "xds-a.refused-watches": "shop/EndpointSlice\nshop/Service"});
        let turned = mk_report(&mcp, &membership, refused.clone());
        let reasons: Vec<&str> = turned.notices.iter().map(|n| n.reason.as_str()).collect();
        assert_eq!(reasons, [types::WATCHES_REFUSED]);
        assert!(turned.notices[0].warning);
        assert!(
            turned.notices[0]
                .message
                .contains("xds-a cannot read shop/EndpointSlice, shop/Service"),
            "{}",
            turned.notices[0].message
        );
        mcp.status = Some(turned.status);
        assert_eq!(
            mk_report(&mcp, &membership, refused).notices,
            [],
            "no second Warning while it stays True"
        );
        let cleared = mk_report(&mcp, &membership, json!({"xds-a": "1"}));
        assert_eq!(cleared.notices, [], "clearing is no Warning");
        let condition = cleared
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == types::WATCHES_REFUSED)
            .expect("WatchesRefused");
        assert_eq!(condition.status, "False");
    }

    #[test]
    fn a_degraded_revision_that_reconciles_cleanly_is_told_resolved() {
        let (mut mcp, membership) = mk_blue();
        let mut copy = mk_control_plane("blue-copy", "red", "2026-02-01T00:00:00Z");
        copy.spec.revision = Some("blue-v1".into());
        let Decision::Conflicted(conflicted) =
            decide(&copy, &mk_membership(&[&mcp, &copy]), &now())
        else {
            panic!("in conflict");
        };
        // Degraded, as it is while in conflict; now it reconciles with nothing to report.
        mcp.status = Some(conflicted.status);
        let resolved = mk_report(&mcp, &membership, json!({}));
        assert!(
            resolved
                .notices
                .iter()
                .any(|n| n.reason == "ConflictResolved" && !n.warning),
            "{:?}",
            resolved.notices
        );
        let degraded = condition(Some(&resolved.status), types::DEGRADED).expect("Degraded");
        assert_eq!(degraded.status, "False");
    }

    #[test]
    fn a_webhook_that_does_not_answer_is_looked_at_again_soon() {
        let resync = Duration::from_secs(300);
        let failed = ProbeResult::Failed("refused".into());
        assert_eq!(requeue_after(Some(&failed), false, resync), PROBE_EVERY);
        assert_eq!(
            requeue_after(Some(&ProbeResult::Serving), false, resync),
            resync
        );
        assert_eq!(requeue_after(None, false, resync), resync);
        let short = Duration::from_secs(5);
        assert_eq!(requeue_after(Some(&failed), false, short), short);
    }

    #[test]
    fn an_instance_refused_reads_is_looked_at_again_soon() {
        let resync = Duration::from_secs(300);
        assert_eq!(requeue_after(None, true, resync), PROBE_EVERY);
        assert_eq!(
            requeue_after(Some(&ProbeResult::Serving), true, resync),
            PROBE_EVERY
        );
        let short = Duration::from_secs(5);
        assert_eq!(requeue_after(None, true, short), short);
    }

    #[test]
    fn the_webhook_is_probed_only_once_the_instance_and_its_configurations_are_there() {
        let named = Named::new("blue-v1", "meshplane-blue");
        let mut observed: BTreeMap<ObjectKey, Value> = named
            .webhooks
            .iter()
            .map(|k| (k.clone(), json!({})))
            .collect();
        assert!(!probe_due(&observed, &named, &[]), "no Deployment");
        observed.insert(
            named.deployment.clone(),
            json!({"status": {"availableReplicas": 1}}),
        );
        assert!(probe_due(&observed, &named, &[]));
        assert!(
            !probe_due(&observed, &named, &named.webhooks[..1]),
            "a configuration held by another owner"
        );
    }

    #[test]
    fn a_deletion_waits_for_injected_pods_and_warns_when_the_wait_starts() {
        let (mut mcp, _) = mk_blue();
        let first = in_use(&mcp, 2, &now());
        assert_eq!(first.notices.len(), 1);
        assert!(first.notices[0].message.contains("2 pod(s)"));
        mcp.status = Some(first.status);
        assert_eq!(in_use(&mcp, 2, &now()).notices, []);
    }

    #[test]
    fn teardown_removes_webhooks_first_and_access_bindings_last_and_only_what_it_owns() {
        let (mcp, membership) = mk_blue();
        let mut observed = mk_observed(&mk_desired(&mcp, &membership));
        let twin = key(Kind::ConfigMap, Some("bank"), "meshplane-green-bootstrap");
        observed.insert(
            twin.clone(),
            json!({"metadata": {"ownerReferences": [{"uid": "uid-green"}]}}),
        );
        let operator = OperatorAccount::default();
        let doomed: Vec<String> = teardown(&observed, &uid(&mcp), &operator)
            .into_iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            doomed.first().map(String::as_str),
            Some("MutatingWebhookConfiguration meshplane-blue-v1-injector")
        );
        assert_eq!(
            doomed.last().map(String::as_str),
            Some("RoleBinding meshplane-blue/meshplane-blue-v1-operator")
        );
        let at = |prefix: &str| doomed.iter().position(|d| d.starts_with(prefix));
        assert!(at("ConfigMap shop/") < at("Deployment "), "{doomed:?}");
        assert!(!doomed.contains(&twin.to_string()));
        assert!(doomed.iter().all(|d| !d.starts_with("Namespace ")));
    }
}
