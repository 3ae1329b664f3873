//! `meshctl precheck`: whether meshplane can be installed in (or upgraded on) the cluster: the
//! Kubernetes version ([`MIN_KUBERNETES`]), meshplane's CRDs absent or at versions this release
//! serves, no other mesh injecting the namespaces meshplane would inject, the new revision's name
//! free (`--revision`), and the caller's right to create what the install creates. [`Facts`] is
//! what is read from the cluster; [`check`] judges it.

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Args;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::version::Info;
use kube::api::{Api, ListParams, PostParams};
use meshplane_crds::names::{self, REV_LABEL};
use meshplane_crds::selector::label_selector_matches;
use meshplane_crds::{MeshControlPlane, MeshRevisionTag};
use serde::Serialize;

use super::codes;
use super::{KubeVersion, DEFAULT_OPERATOR_NAMESPACE, MIN_KUBERNETES};
use crate::analyze::{self, Finding, Severity};
use crate::cli::{FailOn, EXIT_FINDINGS};
use crate::cluster::ClusterArgs;
use crate::output::{self, Format, Report, Table};

/// Istio's namespace label of its default revision.
const ISTIO_INJECTION_LABEL: &str = "istio-injection";
/// Istio's namespace and pod label naming a revision.
const ISTIO_REV_LABEL: &str = "istio.io/rev";

/// `meshctl precheck`.
#[derive(Debug, Args)]
pub struct PrecheckArgs {
    /// The revision about to be installed (a canary upgrade): its name must be free.
    #[arg(long, value_name = "REVISION")]
    pub revision: Option<String>,
    /// Namespace the operator is (to be) installed in.
    #[arg(long, value_name = "NS", default_value = DEFAULT_OPERATOR_NAMESPACE)]
    pub operator_namespace: String,
    /// Exit with code 3 when a finding is at least this severe.
    #[arg(long, value_enum, default_value_t = FailOn::Error)]
    pub fail_on: FailOn,
    /// Print every precheck code and exit.
    #[arg(long)]
    pub list_codes: bool,
}

/// One right the install needs: `verb` on `resource` of `group`, in `namespace` or cluster-wide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permission {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    pub namespace: Option<String>,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => write!(f, " (cluster-wide)"),
        }
    }
}

/// What `kubectl apply -k config/default` and a tenant's `MeshControlPlane` make the caller
/// create, the operator going into `operator_namespace`.
pub fn install_permissions(operator_namespace: &str) -> Vec<Permission> {
    let cluster = |group, resource| Permission {
        verb: "create",
        group,
        resource,
        namespace: None,
    };
    let namespaced = |group, resource| Permission {
        verb: "create",
        group,
        resource,
        namespace: Some(operator_namespace.to_string()),
    };
    vec![
        cluster("apiextensions.k8s.io", "customresourcedefinitions"),
        cluster("", "namespaces"),
        cluster("rbac.authorization.k8s.io", "clusterroles"),
        cluster("rbac.authorization.k8s.io", "clusterrolebindings"),
        cluster(
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
        ),
        cluster(
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
        ),
        cluster(
            "admissionregistration.k8s.io",
            "validatingadmissionpolicybindings",
        ),
        cluster("meshplane.io", "meshcontrolplanes"),
        namespaced("apps", "deployments"),
        namespaced("", "services"),
        namespaced("", "serviceaccounts"),
        namespaced("rbac.authorization.k8s.io", "roles"),
        namespaced("rbac.authorization.k8s.io", "rolebindings"),
    ]
}

/// What precheck reads from the cluster; a part that could not be read carries the reason.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub version: Option<Result<Info, String>>,
    /// Every CRD of the cluster (only meshplane's groups are judged).
    pub crds: Option<Result<Vec<CustomResourceDefinition>, String>>,
    pub mutating_webhooks: Option<Result<Vec<MutatingWebhookConfiguration>, String>>,
    pub namespaces: Option<Result<Vec<Namespace>, String>>,
    /// Existing control planes and tags (when meshplane's CRDs are installed).
    pub control_planes: Option<Result<Vec<MeshControlPlane>, String>>,
    pub tags: Option<Result<Vec<MeshRevisionTag>, String>>,
    pub access: Vec<(Permission, Result<bool, String>)>,
}

/// What `meshctl precheck` prints.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrecheckReport {
    pub findings: Vec<Finding>,
    /// What was checked and found in order.
    pub checked: Vec<String>,
    /// Checks that could not run, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl PrecheckReport {
    /// Whether a finding is at least as severe as `threshold`.
    pub fn fails(&self, threshold: Option<Severity>) -> bool {
        threshold.is_some_and(|t| self.findings.iter().any(|f| f.severity <= t))
    }
}

impl Report for PrecheckReport {
    fn human(&self, wide: bool) -> String {
        let mut out = String::new();
        if !self.findings.is_empty() {
            let mut table = if wide {
                Table::new(["code", "severity", "name", "object", "message"])
            } else {
                Table::new(["code", "severity", "object", "message"])
            };
            for f in &self.findings {
                let mut row = vec![f.code.to_string(), f.severity.as_str().to_string()];
                if wide {
                    row.push(f.name.to_string());
                }
                row.push(f.object.clone());
                row.push(f.message.clone());
                table.row(row);
            }
            out.push_str(&table.render());
        }
        for c in &self.checked {
            out.push_str(&format!("checked: {c}\n"));
        }
        for s in &self.skipped {
            out.push_str(&format!("not checked: {s}\n"));
        }
        let errors = self
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .count();
        out.push_str(&match (errors, self.findings.len()) {
            (0, 0) => "no problems found: meshplane can be installed\n".to_string(),
            (0, n) => format!("{n} finding(s), no error: meshplane can be installed\n"),
            (e, _) => format!("{e} error(s): fix them before installing meshplane\n"),
        });
        out
    }
}

/// Whether `group` is one of meshplane's API groups.
fn is_meshplane_group(group: &str) -> bool {
    group == "meshplane.io" || group.ends_with(".meshplane.io")
}

/// Judges `facts` against the CRDs this release knows (`known`), for a new revision `revision`.
pub fn check(
    facts: &Facts,
    known: &[CustomResourceDefinition],
    revision: Option<&str>,
) -> PrecheckReport {
    let mut report = PrecheckReport::default();
    check_version(facts.version.as_ref(), &mut report);
    match &facts.crds {
        Some(Ok(crds)) => check_crds(crds, known, &mut report),
        Some(Err(e)) => report.skipped.push(format!("meshplane's CRDs: {e}")),
        None => {}
    }
    let namespaces: &[Namespace] = match &facts.namespaces {
        Some(Ok(ns)) => ns,
        Some(Err(e)) => {
            report.skipped.push(format!("namespaces: {e}"));
            &[]
        }
        None => &[],
    };
    match &facts.mutating_webhooks {
        Some(Ok(hooks)) => check_injectors(hooks, namespaces, revision, &mut report),
        Some(Err(e)) => report
            .skipped
            .push(format!("other meshes' injector webhooks: {e}")),
        None => {}
    }
    check_namespace_labels(namespaces, &mut report);
    if let Some(revision) = revision {
        check_revision(revision, facts, &mut report);
    }
    check_access(&facts.access, &mut report);
    analyze::sort(&mut report.findings);
    report
}

fn check_version(version: Option<&Result<Info, String>>, report: &mut PrecheckReport) {
    let object = "Kubernetes API server";
    match version {
        None => {}
        Some(Err(e)) => report.findings.push(Finding::new(
            codes::KUBERNETES_VERSION_UNKNOWN,
            object,
            format!("the version could not be read ({e}); meshplane needs Kubernetes {MIN_KUBERNETES} or later"),
        )),
        Some(Ok(info)) => match KubeVersion::of(info) {
            None => report.findings.push(Finding::new(
                codes::KUBERNETES_VERSION_UNKNOWN,
                object,
                format!(
                    "version {:?} does not parse; meshplane needs Kubernetes {MIN_KUBERNETES} or later",
                    info.git_version
                ),
            )),
            Some(v) if v < MIN_KUBERNETES => report.findings.push(Finding::new(
                codes::KUBERNETES_TOO_OLD,
                object,
                format!(
                    "Kubernetes {} ({v}) is older than {MIN_KUBERNETES}, the oldest release meshplane supports (its admission policy and CRD validation rules need it): upgrade the cluster first",
                    info.git_version
                ),
            )),
            Some(v) => report.checked.push(format!(
                "Kubernetes version {} ({v}): supported ({MIN_KUBERNETES} or later)",
                info.git_version
            )),
        },
    }
}

/// Names of a CRD's versions, served ones only when `served_only`.
fn versions(crd: &CustomResourceDefinition, served_only: bool) -> Vec<String> {
    crd.spec
        .versions
        .iter()
        .filter(|v| v.served || !served_only)
        .map(|v| v.name.clone())
        .collect()
}

fn check_crds(
    cluster: &[CustomResourceDefinition],
    known: &[CustomResourceDefinition],
    report: &mut PrecheckReport,
) {
    let ours: Vec<&CustomResourceDefinition> = cluster
        .iter()
        .filter(|c| is_meshplane_group(&c.spec.group))
        .collect();
    if ours.is_empty() {
        report
            .checked
            .push("meshplane CRDs: none installed (a fresh install)".to_string());
        return;
    }
    let before = report.findings.len();
    for crd in &ours {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let object = format!("CustomResourceDefinition {name}");
        let Some(release) = known
            .iter()
            .find(|k| k.metadata.name.as_deref() == Some(name.as_str()))
        else {
            report.findings.push(Finding::new(
                codes::CRD_UNKNOWN,
                object,
                format!(
                    "this meshctl ({}) does not know {name}: the cluster runs a newer meshplane; precheck with the meshctl of the release you install",
                    crate::version::client_version()
                ),
            ));
            continue;
        };
        let served = versions(release, true);
        let stored = crd
            .status
            .as_ref()
            .and_then(|s| s.stored_versions.clone())
            .unwrap_or_default();
        for v in stored.iter().filter(|v| !served.contains(v)) {
            report.findings.push(Finding::new(
                codes::CRD_STORED_VERSION_UNSERVED,
                object.clone(),
                format!(
                    "objects are stored as {v}, which this release does not serve (it serves {}): read and write every object back at a served version and remove {v} from status.storedVersions before the upgrade",
                    served.join(", ")
                ),
            ));
        }
        for v in versions(crd, true)
            .into_iter()
            .filter(|v| !served.contains(v))
        {
            report.findings.push(Finding::new(
                codes::CRD_VERSION_DROPPED,
                object.clone(),
                format!(
                    "the cluster serves {v}, which this release does not (it serves {}): manifests written for {v} stop working after the upgrade",
                    served.join(", ")
                ),
            ));
        }
    }
    if report.findings.len() == before {
        report.checked.push(format!(
            "meshplane CRDs: {} installed, at versions this release serves (an upgrade)",
            ours.len()
        ));
    }
}

/// `k8s` selector syntax of a LabelSelector (`a=b, c in (d,e), !f`); empty is `everything`.
pub fn describe_selector(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for r in selector.match_expressions.iter().flatten() {
        let values = r.values.clone().unwrap_or_default().join(",");
        parts.push(match r.operator.as_str() {
            "In" => format!("{} in ({values})", r.key),
            "NotIn" => format!("{} notin ({values})", r.key),
            "Exists" => r.key.clone(),
            "DoesNotExist" => format!("!{}", r.key),
            other => format!("{} {other} ({values})", r.key),
        });
    }
    if parts.is_empty() {
        "everything".to_string()
    } else {
        parts.join(", ")
    }
}

/// Which mesh made an injector webhook configuration, when recognisable (meshplane's own are
/// not another mesh).
pub fn mesh_of(config: &MutatingWebhookConfiguration) -> Option<&'static str> {
    let name = config.metadata.name.as_deref().unwrap_or_default();
    let managed_by_meshplane = config
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::MANAGED_BY_LABEL))
        .is_some_and(|v| v == names::MANAGED_BY_VALUE);
    if name.starts_with("meshplane-") || managed_by_meshplane {
        return None;
    }
    let hooks: Vec<&str> = config
        .webhooks
        .iter()
        .flatten()
        .map(|h| h.name.as_str())
        .collect();
    let any_hook = |f: &dyn Fn(&str) -> bool| hooks.iter().any(|h| f(h));
    if name.starts_with("istio-sidecar-injector")
        || name.starts_with("istio-revision-tag")
        || any_hook(&|h| h.ends_with("sidecar-injector.istio.io"))
    {
        Some("Istio")
    } else if name.contains("linkerd") || any_hook(&|h| h.ends_with(".linkerd.io")) {
        Some("Linkerd")
    } else if name.starts_with("kuma-") || any_hook(&|h| h.ends_with(".kuma.io")) {
        Some("Kuma")
    } else if name.contains("consul") && name.contains("inject") {
        Some("Consul")
    } else if any_hook(&|h| h == "osm-inject.k8s.io") {
        Some("Open Service Mesh")
    } else if any_hook(&|h| h.ends_with("appmesh.k8s.aws")) {
        Some("AWS App Mesh")
    } else {
        None
    }
}

/// What one Istio webhook would do to meshplane's namespaces.
fn istio_verdict(
    hook: &MutatingWebhook,
    candidates: &[(String, BTreeMap<String, String>)],
) -> (Severity, String) {
    let namespace_selector = hook.namespace_selector.clone().unwrap_or_default();
    let matched: Vec<&str> = candidates
        .iter()
        .filter(|(_, labels)| label_selector_matches(&namespace_selector, labels))
        .map(|(what, _)| what.as_str())
        .collect();
    let object_selector = hook.object_selector.clone().unwrap_or_default();
    let every_pod = label_selector_matches(&object_selector, &BTreeMap::new());
    let selects = describe_selector(&namespace_selector);
    if matched.is_empty() {
        (
            Severity::Info,
            format!(
                "webhook {} injects only namespaces its selector ({selects}) picks, none of meshplane's: meshplane can run beside it; keep istio-injection and istio.io/rev off meshplane's namespaces",
                hook.name
            ),
        )
    } else if every_pod {
        (
            Severity::Error,
            format!(
                "webhook {} (namespaceSelector {selects}) would inject Istio's sidecar into every pod of {}: pods would get two sidecars; narrow its namespaceSelector to istio-injection=enabled or istio.io/rev (Istio's default), or uninstall Istio first",
                hook.name,
                matched.join(", ")
            ),
        )
    } else {
        (
            Severity::Warning,
            format!(
                "webhook {} injects pods labelled {} in {} as well: keep those labels off the pods of meshplane's namespaces",
                hook.name,
                describe_selector(&object_selector),
                matched.join(", ")
            ),
        )
    }
}

fn check_injectors(
    configs: &[MutatingWebhookConfiguration],
    namespaces: &[Namespace],
    revision: Option<&str>,
    report: &mut PrecheckReport,
) {
    // The namespaces meshplane injects: those labelled for it now, and one that joins later.
    // Istio's own labels are left out: a namespace labelled for both meshes is MP0824's; here
    // the question is whether Istio injects a namespace nobody labelled for it.
    let mut candidates: Vec<(String, BTreeMap<String, String>)> = namespaces
        .iter()
        .filter_map(|ns| {
            let mut labels = ns.metadata.labels.clone().unwrap_or_default();
            labels.remove(ISTIO_INJECTION_LABEL);
            labels.remove(ISTIO_REV_LABEL);
            labels.contains_key(REV_LABEL).then(|| {
                (
                    format!(
                        "namespace {}",
                        ns.metadata.name.as_deref().unwrap_or_default()
                    ),
                    labels,
                )
            })
        })
        .collect();
    let rev = revision.unwrap_or("<revision>");
    candidates.push((
        format!("any namespace labelled {REV_LABEL}={rev}"),
        BTreeMap::from([
            (REV_LABEL.to_string(), rev.to_string()),
            (
                names::NAMESPACE_NAME_LABEL.to_string(),
                "a-joining-namespace".to_string(),
            ),
        ]),
    ));
    let mut found = 0;
    for config in configs {
        let Some(mesh) = mesh_of(config) else {
            continue;
        };
        found += 1;
        let name = config.metadata.name.clone().unwrap_or_default();
        let object = format!("MutatingWebhookConfiguration {name}");
        if mesh != "Istio" {
            report.findings.push(Finding::new(
                codes::OTHER_MESH_INJECTOR,
                object,
                format!("{mesh}'s sidecar injector is installed: a namespace or pod marked for its injection would get two sidecars; do not enable {mesh}'s injection in meshplane's namespaces"),
            ));
            continue;
        }
        let worst = config
            .webhooks
            .iter()
            .flatten()
            .map(|hook| istio_verdict(hook, &candidates))
            .min_by_key(|(severity, _)| *severity);
        let Some((severity, message)) = worst else {
            continue;
        };
        let code = match severity {
            Severity::Error => codes::ISTIO_INJECTS_MESH_NAMESPACES,
            Severity::Warning => codes::ISTIO_INJECTS_LABELLED_PODS,
            Severity::Info => codes::ISTIO_INSTALLED,
        };
        report.findings.push(Finding::new(code, object, message));
    }
    if found == 0 {
        report
            .checked
            .push("other meshes' injectors: none installed".to_string());
    }
}

fn check_namespace_labels(namespaces: &[Namespace], report: &mut PrecheckReport) {
    for ns in namespaces {
        let labels = ns.metadata.labels.clone().unwrap_or_default();
        let Some(rev) = labels.get(REV_LABEL) else {
            continue;
        };
        let istio = match (
            labels.get(ISTIO_INJECTION_LABEL).map(String::as_str),
            labels.get(ISTIO_REV_LABEL),
        ) {
            (_, Some(istio_rev)) => format!("{ISTIO_REV_LABEL}={istio_rev}"),
            (Some("enabled"), None) => format!("{ISTIO_INJECTION_LABEL}=enabled"),
            _ => continue,
        };
        let name = ns.metadata.name.clone().unwrap_or_default();
        report.findings.push(Finding::new(
            codes::NAMESPACE_IN_TWO_MESHES,
            format!("Namespace {name}"),
            format!("labelled {REV_LABEL}={rev} and {istio}: its new pods would get both meshes' sidecars; remove one mesh's label (kubectl label namespace {name} {}-)", istio.split('=').next().unwrap_or_default()),
        ));
    }
}

fn check_revision(revision: &str, facts: &Facts, report: &mut PrecheckReport) {
    let object = format!("revision {revision}");
    if let Err(e) = meshplane_crds::validation::validate_dns1035_label(
        revision,
        "--revision",
        names::MAX_REVISION_LEN,
    ) {
        report.findings.push(Finding::new(
            codes::INVALID_REVISION_NAME,
            object,
            format!("{e}: a revision name is the value of the {REV_LABEL} label and names the instance's Service"),
        ));
        return;
    }
    let before = report.findings.len();
    match &facts.control_planes {
        Some(Ok(cps)) => {
            for cp in cps.iter().filter(|cp| cp.revision() == revision) {
                report.findings.push(Finding::new(
                    codes::REVISION_TAKEN,
                    object.clone(),
                    format!(
                        "MeshControlPlane {} of tenant {} is revision {revision} already: give the new revision another name (e.g. {revision}-2)",
                        cp.metadata.name.as_deref().unwrap_or_default(),
                        cp.spec.tenant
                    ),
                ));
            }
        }
        Some(Err(e)) => report
            .skipped
            .push(format!("whether revision {revision} is free: {e}")),
        None => {}
    }
    match &facts.tags {
        Some(Ok(tags))
            if tags
                .iter()
                .any(|t| t.metadata.name.as_deref() == Some(revision)) =>
        {
            report.findings.push(Finding::new(
                codes::REVISION_TAKEN,
                object.clone(),
                format!("a MeshRevisionTag is named {revision}: tags and revisions share the {REV_LABEL} label; give the new revision another name"),
            ));
        }
        Some(Ok(_)) => {}
        Some(Err(e)) => report
            .skipped
            .push(format!("whether a tag is named {revision}: {e}")),
        None => {}
    }
    if report.findings.len() == before {
        report
            .checked
            .push(format!("revision {revision}: the name is free"));
    }
}

fn check_access(access: &[(Permission, Result<bool, String>)], report: &mut PrecheckReport) {
    let mut granted = 0;
    for (permission, answer) in access {
        match answer {
            Ok(true) => granted += 1,
            Ok(false) => report.findings.push(Finding::new(
                codes::INSTALL_PERMISSION_MISSING,
                "your credentials",
                format!("you may not {permission}, which the install does: install as a cluster admin (the cluster-admin ClusterRole), or ask one"),
            )),
            Err(e) => report.findings.push(Finding::new(
                codes::PERMISSION_UNCHECKED,
                "your credentials",
                format!("whether you may {permission} could not be checked: {e}"),
            )),
        }
    }
    if !access.is_empty() && granted == access.len() {
        report.checked.push(format!(
            "permissions: you may create every kind of object the install creates ({granted} checked)"
        ));
    }
}

/// `s` of a failed read.
fn reason(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message,
        other => other.to_string(),
    }
}

/// Reads the facts from the cluster with the caller's credentials.
pub async fn read(client: &kube::Client, operator_namespace: &str) -> Facts {
    let mut facts = Facts {
        version: Some(client.apiserver_version().await.map_err(reason)),
        ..Facts::default()
    };
    let crds = Api::<CustomResourceDefinition>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(reason);
    let installed = |plural: &str| {
        crds.as_ref().is_ok_and(|c| {
            c.iter()
                .any(|c| c.metadata.name.as_deref() == Some(&format!("{plural}.meshplane.io")))
        })
    };
    if installed("meshcontrolplanes") {
        facts.control_planes = Some(
            Api::<MeshControlPlane>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .map_err(reason),
        );
    }
    if installed("meshrevisiontags") {
        facts.tags = Some(
            Api::<MeshRevisionTag>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .map_err(reason),
        );
    }
    facts.crds = Some(crds);
    facts.mutating_webhooks = Some(
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(reason),
    );
    facts.namespaces = Some(
        Api::<Namespace>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(reason),
    );
    let reviews = Api::<SelfSubjectAccessReview>::all(client.clone());
    for permission in install_permissions(operator_namespace) {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(permission.verb.to_string()),
                    group: Some(permission.group.to_string()),
                    resource: Some(permission.resource.to_string()),
                    namespace: permission.namespace.clone(),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(reason)
            .and_then(|r| {
                r.status
                    .map(|s| s.allowed)
                    .ok_or_else(|| "the review came back without a status".to_string())
            });
        facts.access.push((permission, answer));
    }
    facts
}

/// Runs `meshctl precheck`.
pub async fn run(
    args: &PrecheckArgs,
    cluster: &ClusterArgs,
    format: Format,
) -> anyhow::Result<ExitCode> {
    if args.list_codes {
        output::print(&analyze::CodeList(codes::ALL.to_vec()), format)?;
        return Ok(ExitCode::SUCCESS);
    }
    let client = cluster.client().await?;
    let facts = read(&client, &args.operator_namespace).await;
    let report = check(
        &facts,
        &meshplane_crds::crdgen::all(),
        args.revision.as_deref(),
    );
    output::print(&report, format)?;
    Ok(if report.fails(args.fail_on.threshold()) {
        ExitCode::from(EXIT_FINDINGS)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::WebhookClientConfig;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionStatus, CustomResourceDefinitionVersion,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn namespace(name: &str, pairs: &[(&str, &str)]) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels(pairs)),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        }
    }

    fn requirement(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn selector(reqs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(reqs),
            ..LabelSelector::default()
        }
    }

    fn hook(
        name: &str,
        namespaces: LabelSelector,
        objects: Option<LabelSelector>,
    ) -> MutatingWebhook {
        MutatingWebhook {
            name: name.into(),
            namespace_selector: Some(namespaces),
            object_selector: objects,
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            client_config: WebhookClientConfig::default(),
            ..MutatingWebhook::default()
        }
    }

    fn config(name: &str, hooks: Vec<MutatingWebhook>) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            webhooks: Some(hooks),
        }
    }

    /// Istio's default injector: by namespace label, and by pod label where the namespace has
    /// none of Istio's labels.
    fn istio_default() -> MutatingWebhookConfiguration {
        config(
            "istio-sidecar-injector",
            vec![
                hook(
                    "namespace.sidecar-injector.istio.io",
                    selector(vec![requirement("istio-injection", "In", &["enabled"])]),
                    Some(selector(vec![requirement(
                        "sidecar.istio.io/inject",
                        "NotIn",
                        &["false"],
                    )])),
                ),
                hook(
                    "rev.namespace.sidecar-injector.istio.io",
                    selector(vec![
                        requirement("istio.io/rev", "In", &["default"]),
                        requirement("istio-injection", "DoesNotExist", &[]),
                    ]),
                    None,
                ),
            ],
        )
    }

    fn istio_object_selected() -> MutatingWebhook {
        hook(
            "object.sidecar-injector.istio.io",
            selector(vec![
                requirement("istio-injection", "DoesNotExist", &[]),
                requirement("istio.io/rev", "DoesNotExist", &[]),
            ]),
            Some(selector(vec![requirement(
                "sidecar.istio.io/inject",
                "In",
                &["true"],
            )])),
        )
    }

    /// An Istio injector that injects every namespace not opted out (enableNamespacesByDefault).
    fn istio_everywhere() -> MutatingWebhookConfiguration {
        config(
            "istio-sidecar-injector",
            vec![hook(
                "sidecar-injector.istio.io",
                selector(vec![requirement("istio-injection", "NotIn", &["disabled"])]),
                None,
            )],
        )
    }

    fn crd(name: &str, served: &[&str], stored: &[&str]) -> CustomResourceDefinition {
        let mut crd = CustomResourceDefinition::default();
        crd.metadata.name = Some(name.into());
        crd.spec.group = name.split_once('.').map(|(_, g)| g).unwrap_or("").into();
        crd.spec.versions = served
            .iter()
            .map(|v| CustomResourceDefinitionVersion {
                name: v.to_string(),
                served: true,
                storage: true,
                ..CustomResourceDefinitionVersion::default()
            })
            .collect();
        crd.status = Some(CustomResourceDefinitionStatus {
            stored_versions: Some(stored.iter().map(|v| v.to_string()).collect()),
            ..CustomResourceDefinitionStatus::default()
        });
        crd
    }

    fn info(git: &str, major: &str, minor: &str) -> Info {
        Info {
            git_version: git.into(),
            major: major.into(),
            minor: minor.into(),
            ..Info::default()
        }
    }

    fn fresh_cluster() -> Facts {
        Facts {
            version: Some(Ok(info("v1.37.0", "1", "37"))),
            crds: Some(Ok(vec![crd(
                "certificates.cert-manager.io",
                &["v1"],
                &["v1"],
            )])),
            mutating_webhooks: Some(Ok(Vec::new())),
            namespaces: Some(Ok(vec![namespace("default", &[])])),
            control_planes: None,
            tags: None,
            access: install_permissions("meshplane-system")
                .into_iter()
                .map(|p| (p, Ok(true)))
                .collect(),
        }
    }

    fn codes_of(report: &PrecheckReport) -> Vec<&str> {
        report.findings.iter().map(|f| f.code).collect()
    }

    #[test]
    fn a_fresh_supported_cluster_passes() {
        let report = check(&fresh_cluster(), &meshplane_crds::crdgen::all(), None);
        assert!(report.findings.is_empty(), "{:?}", report.findings);
        assert!(!report.fails(Some(Severity::Info)));
        let text = report.human(false);
        assert!(text.contains("none installed (a fresh install)"), "{text}");
        assert!(text.ends_with("no problems found: meshplane can be installed\n"));
    }

    #[test]
    fn kubernetes_older_than_the_minimum_is_an_error() {
        let mut facts = fresh_cluster();
        facts.version = Some(Ok(info("v1.29.4", "1", "29")));
        let report = check(&facts, &[], None);
        assert_eq!(codes_of(&report), ["MP0801"]);
        assert!(report.findings[0].message.contains("older than 1.30"));
        assert!(report.fails(Some(Severity::Error)));
        facts.version = Some(Ok(info("v1.30.0-gke.1", "1", "30+")));
        assert!(check(&facts, &[], None).findings.is_empty());
        facts.version = Some(Err("forbidden".into()));
        assert_eq!(codes_of(&check(&facts, &[], None)), ["MP0802"]);
    }

    #[test]
    fn installed_crds_must_be_stored_at_versions_this_release_serves() {
        let known = vec![crd("meshcontrolplanes.meshplane.io", &["v1alpha1"], &[])];
        let mut facts = fresh_cluster();
        facts.crds = Some(Ok(vec![crd(
            "meshcontrolplanes.meshplane.io",
            &["v1alpha1"],
            &["v1alpha1"],
        )]));
        let report = check(&facts, &known, None);
        assert!(report.findings.is_empty(), "{:?}", report.findings);
        assert!(report.checked.iter().any(|c| c.contains("an upgrade")));

        facts.crds = Some(Ok(vec![crd(
            "meshcontrolplanes.meshplane.io",
            &["v1alpha1", "v1alpha0"],
            &["v1alpha0", "v1alpha1"],
        )]));
        let report = check(&facts, &known, None);
        assert_eq!(codes_of(&report), ["MP0811", "MP0812"]);
        assert!(report.findings[0].message.contains("stored as v1alpha0"));

        facts.crds = Some(Ok(vec![crd("meshwidgets.meshplane.io", &["v1"], &["v1"])]));
        assert_eq!(codes_of(&check(&facts, &known, None)), ["MP0813"]);
    }

    #[test]
    fn istio_beside_meshplane_is_fine_but_an_injector_of_every_namespace_is_not() {
        let mut facts = fresh_cluster();
        facts.mutating_webhooks = Some(Ok(vec![istio_default()]));
        let report = check(&facts, &[], None);
        assert_eq!(codes_of(&report), ["MP0823"]);
        assert!(!report.fails(Some(Severity::Warning)));

        let mut with_object_hook = istio_default();
        with_object_hook
            .webhooks
            .as_mut()
            .unwrap()
            .push(istio_object_selected());
        facts.mutating_webhooks = Some(Ok(vec![with_object_hook]));
        let report = check(&facts, &[], None);
        assert_eq!(codes_of(&report), ["MP0822"], "the worst webhook speaks");
        assert!(report.findings[0]
            .message
            .contains("sidecar.istio.io/inject in (true)"));

        facts.mutating_webhooks = Some(Ok(vec![istio_everywhere()]));
        facts.namespaces = Some(Ok(vec![namespace(
            "shop",
            &[("meshplane.io/rev", "blue-stable")],
        )]));
        let report = check(&facts, &[], Some("blue-v2"));
        assert_eq!(codes_of(&report), ["MP0821"]);
        let message = &report.findings[0].message;
        assert!(
            message.contains("namespace shop")
                && message.contains("any namespace labelled meshplane.io/rev=blue-v2")
                && message.contains("istio-injection notin (disabled)"),
            "{message}"
        );
        assert_eq!(
            report.findings[0].object,
            "MutatingWebhookConfiguration istio-sidecar-injector"
        );
        assert!(report.fails(Some(Severity::Error)));
    }

    #[test]
    fn other_meshes_are_named_and_meshplanes_own_injectors_are_not_a_conflict() {
        let linkerd = config(
            "linkerd-proxy-injector-webhook-config",
            vec![hook(
                "linkerd-proxy-injector.linkerd.io",
                LabelSelector::default(),
                None,
            )],
        );
        let own = config(
            "meshplane-blue-v1-injector",
            vec![hook(
                "blue-v1.inject.meshplane.io",
                LabelSelector::default(),
                None,
            )],
        );
        let mut facts = fresh_cluster();
        facts.mutating_webhooks = Some(Ok(vec![linkerd, own]));
        let report = check(&facts, &[], None);
        assert_eq!(codes_of(&report), ["MP0825"]);
        assert!(report.findings[0].message.starts_with("Linkerd's"));
    }

    #[test]
    fn a_namespace_labelled_for_both_meshes_is_an_error() {
        let mut facts = fresh_cluster();
        facts.namespaces = Some(Ok(vec![
            namespace(
                "shop",
                &[
                    ("meshplane.io/rev", "blue-v1"),
                    ("istio-injection", "enabled"),
                ],
            ),
            namespace(
                "garden",
                &[("meshplane.io/rev", "green"), ("istio.io/rev", "canary")],
            ),
            namespace(
                "legacy",
                &[
                    ("meshplane.io/rev", "green"),
                    ("istio-injection", "disabled"),
                ],
            ),
        ]));
        // Istio's usual injector picks shop by its istio-injection label: that is the label's
        // fault (MP0824), not the injector's.
        facts.mutating_webhooks = Some(Ok(vec![istio_default()]));
        let report = check(&facts, &[], None);
        let objects: Vec<&str> = report.findings.iter().map(|f| f.object.as_str()).collect();
        assert_eq!(codes_of(&report), ["MP0824", "MP0824", "MP0823"]);
        assert_eq!(
            objects,
            [
                "Namespace garden",
                "Namespace shop",
                "MutatingWebhookConfiguration istio-sidecar-injector"
            ]
        );
        assert!(report.findings[1]
            .message
            .contains("kubectl label namespace shop istio-injection-"));
    }

    #[test]
    fn the_new_revision_must_have_a_free_valid_name() {
        let mut facts = fresh_cluster();
        let mcp: MeshControlPlane = serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": "blue-v1"}, "spec": {"tenant": "blue"}
        }))
        .unwrap();
        let tag: MeshRevisionTag = serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshRevisionTag",
            "metadata": {"name": "blue-stable"}, "spec": {"revision": "blue-v1"}
        }))
        .unwrap();
        facts.control_planes = Some(Ok(vec![mcp]));
        facts.tags = Some(Ok(vec![tag]));
        assert!(check(&facts, &[], Some("blue-v2")).findings.is_empty());
        let taken = check(&facts, &[], Some("blue-v1"));
        assert_eq!(codes_of(&taken), ["MP0832"]);
        assert!(taken.findings[0].message.contains("tenant blue"));
        assert_eq!(
            codes_of(&check(&facts, &[], Some("blue-stable"))),
            ["MP0832"]
        );
        assert_eq!(codes_of(&check(&facts, &[], Some("Blue_V2"))), ["MP0831"]);
    }

    #[test]
    fn every_missing_permission_is_named() {
        let mut facts = fresh_cluster();
        for (p, answer) in facts.access.iter_mut() {
            if p.resource == "customresourcedefinitions" {
                *answer = Ok(false);
            }
            if p.resource == "deployments" {
                *answer = Err("the server could not find the requested resource".into());
            }
        }
        let report = check(&facts, &[], None);
        assert_eq!(codes_of(&report), ["MP0841", "MP0842"]);
        assert!(report.findings[0].message.contains(
            "you may not create customresourcedefinitions.apiextensions.k8s.io (cluster-wide)"
        ));
        assert!(report.findings[1]
            .message
            .contains("create deployments.apps in namespace meshplane-system"));
    }
}
