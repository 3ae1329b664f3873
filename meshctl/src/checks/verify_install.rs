//! `meshctl verify-install`: whether what `kubectl apply -k config/default` and the tenants'
//! `MeshControlPlane`s should have created exists and works: the CRDs Established, the
//! operator's Deployment available, its admission webhook configured (a CA bundle) and
//! answering the API server (a dry-run request), and per control plane: Ready, its instance
//! Deployment available, its webhook configurations present, its validating webhook answering
//! the operator's dry-run probe. With `-f`/`-k`, every object of the manifests exists.
//! Each check is judged by a pure function of what was read.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::discovery::Scope;
use meshplane_crds::names;
use meshplane_crds::{MeshControlPlane, MeshRevisionTag};
use serde::Serialize;
use serde_json::json;

use super::manifests::{self, ObjectRef};
use super::{DEFAULT_OPERATOR_NAMESPACE, OPERATOR_DEPLOYMENT};
use crate::cli::EXIT_FINDINGS;
use crate::cluster::ClusterArgs;
use crate::output::{self, Format, Report, Table};

/// Name of the MeshRevisionTag that verify-install dry-run creates through the operator's
/// webhook (never stored).
pub const PROBE_TAG: &str = "meshctl-verify-install";
/// Field manager of meshctl's dry runs.
const FIELD_MANAGER: &str = "meshctl";

/// `meshctl verify-install`.
#[derive(Debug, Args)]
pub struct VerifyInstallArgs {
    /// Also check that every object of these manifests exists: a file or a directory of them,
    /// as `kubectl apply -f` reads it.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "PATH",
        conflicts_with = "kustomize"
    )]
    pub filename: Option<PathBuf>,
    /// Also check that every object `kubectl kustomize DIR` renders exists (the install was
    /// `kubectl apply -k DIR`, e.g. config/default).
    #[arg(short = 'k', long = "kustomize", value_name = "DIR")]
    pub kustomize: Option<PathBuf>,
    /// Namespace the operator is installed in.
    #[arg(long, value_name = "NS", default_value = DEFAULT_OPERATOR_NAMESPACE)]
    pub operator_namespace: String,
}

/// How one check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Status {
    Passed,
    Failed,
    /// It could not run (the caller may not read or dry-run what it needs).
    Skipped,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "FAILED",
            Status::Skipped => "skipped",
        }
    }
}

/// One check and its result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    /// What was checked (`Kind name`, or a described property of it).
    pub check: String,
    pub status: Status,
    pub reason: String,
}

impl CheckResult {
    fn new(check: impl Into<String>, status: Status, reason: impl Into<String>) -> Self {
        CheckResult {
            check: check.into(),
            status,
            reason: reason.into(),
        }
    }
    fn passed(check: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(check, Status::Passed, reason)
    }
    fn failed(check: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(check, Status::Failed, reason)
    }
    fn skipped(check: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(check, Status::Skipped, reason)
    }
}

/// What `meshctl verify-install` prints.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    pub checks: Vec<CheckResult>,
}

impl VerifyReport {
    fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }

    /// Whether a check failed.
    pub fn failed(&self) -> bool {
        self.count(Status::Failed) > 0
    }
}

impl Report for VerifyReport {
    fn human(&self, _wide: bool) -> String {
        let mut table = Table::new(["check", "status", "reason"]);
        for c in &self.checks {
            table.row([
                c.check.clone(),
                c.status.as_str().to_string(),
                c.reason.clone(),
            ]);
        }
        let mut out = table.render();
        let (passed, failed, skipped) = (
            self.count(Status::Passed),
            self.count(Status::Failed),
            self.count(Status::Skipped),
        );
        let skipped = if skipped > 0 {
            format!(", {skipped} skipped")
        } else {
            String::new()
        };
        out.push_str(&if failed == 0 {
            format!("{passed} passed{skipped}: meshplane is installed and healthy\n")
        } else {
            format!("{passed} passed, {failed} failed{skipped}: meshplane is not healthy\n")
        });
        out
    }
}

/// The status and message of condition `kind` among `(type, status, reason, message)`.
fn condition<'a>(
    conditions: impl IntoIterator<Item = (&'a str, &'a str, &'a str, &'a str)>,
    kind: &str,
) -> Option<(&'a str, String)> {
    conditions
        .into_iter()
        .find(|(t, ..)| *t == kind)
        .map(|(_, status, reason, message)| {
            let said = [reason, message]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(": ");
            (status, said)
        })
}

/// A CRD this release ships, as found in the cluster.
pub fn check_crd(
    release: &CustomResourceDefinition,
    found: Option<&CustomResourceDefinition>,
) -> CheckResult {
    let name = release.metadata.name.clone().unwrap_or_default();
    let what = format!("CustomResourceDefinition {name}");
    let Some(found) = found else {
        return CheckResult::failed(
            what,
            "not found: apply the install (kubectl apply -k config/default)",
        );
    };
    let conditions = found
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    (
                        c.type_.as_str(),
                        c.status.as_str(),
                        c.reason.as_deref().unwrap_or_default(),
                        c.message.as_deref().unwrap_or_default(),
                    )
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    match condition(conditions, "Established") {
        Some(("True", _)) => {}
        Some((status, said)) => {
            return CheckResult::failed(what, format!("Established={status}: {said}"))
        }
        None => return CheckResult::failed(what, "not Established yet"),
    }
    let served: Vec<&str> = found
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.as_str())
        .collect();
    let missing: Vec<&str> = release
        .spec
        .versions
        .iter()
        .filter(|v| v.served && !served.contains(&v.name.as_str()))
        .map(|v| v.name.as_str())
        .collect();
    if !missing.is_empty() {
        return CheckResult::failed(
            what,
            format!(
                "does not serve {} (serves {}): apply this release's CRDs",
                missing.join(", "),
                served.join(", ")
            ),
        );
    }
    CheckResult::passed(what, format!("Established, serves {}", served.join(", ")))
}

/// A Deployment that must have at least one available replica.
pub fn check_deployment(what: &str, found: Option<&Deployment>) -> CheckResult {
    let Some(d) = found else {
        return CheckResult::failed(what, "not found");
    };
    let desired = d.spec.replicas.unwrap_or(1);
    let status = d.status.clone().unwrap_or_default();
    let available = status.available_replicas.unwrap_or(0);
    if desired == 0 {
        return CheckResult::failed(
            what,
            "scaled to 0 replicas: nothing runs; scale it up (kubectl scale deployment --replicas=N)",
        );
    }
    let conditions: Vec<(&str, &str, &str, &str)> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| {
            (
                c.type_.as_deref().unwrap_or_default(),
                c.status.as_deref().unwrap_or_default(),
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    let replicas = format!("{available}/{desired} replicas available");
    match condition(conditions, "Available") {
        Some(("True", _)) if available > 0 => {}
        Some((status, said)) => {
            return CheckResult::failed(what, format!("{replicas}, Available={status}: {said}"))
        }
        None => {
            return CheckResult::failed(what, format!("{replicas}, no Available condition yet"))
        }
    }
    if status.observed_generation < d.metadata.generation {
        return CheckResult::failed(
            what,
            format!("{replicas}, but the latest change is not rolled out yet (generation {:?}, observed {:?})", d.metadata.generation, status.observed_generation),
        );
    }
    CheckResult::passed(what, replicas)
}

/// One webhook of a configuration: its name and how the API server reaches it.
pub struct Hook<'a> {
    pub name: &'a str,
    pub client: &'a WebhookClientConfig,
}

/// A webhook configuration: present, with webhooks, each with a CA bundle.
pub fn check_webhook_configuration(what: &str, hooks: Option<Vec<Hook<'_>>>) -> CheckResult {
    let Some(hooks) = hooks else {
        return CheckResult::failed(what, "not found");
    };
    if hooks.is_empty() {
        return CheckResult::failed(what, "has no webhooks");
    }
    for hook in &hooks {
        let bundle = hook
            .client
            .ca_bundle
            .as_ref()
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default();
        if !bundle.contains("-----BEGIN CERTIFICATE-----") {
            return CheckResult::failed(
                what,
                format!(
                    "webhook {} has no CA bundle: the API server cannot verify it (the operator fills it in when it runs)",
                    hook.name
                ),
            );
        }
    }
    let targets: Vec<String> = hooks
        .iter()
        .map(|h| match (&h.client.service, &h.client.url) {
            (Some(s), _) => format!("service {}/{}", s.namespace, s.name),
            (None, Some(url)) => url.clone(),
            (None, None) => "nowhere".to_string(),
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    CheckResult::passed(
        what,
        format!(
            "{} webhook(s) with a CA bundle, calling {}",
            hooks.len(),
            targets.join(", ")
        ),
    )
}

/// The webhooks of a validating configuration.
fn validating_hooks(c: &ValidatingWebhookConfiguration) -> Vec<Hook<'_>> {
    c.webhooks
        .iter()
        .flatten()
        .map(|h| Hook {
            name: &h.name,
            client: &h.client_config,
        })
        .collect()
}

/// The webhooks of a mutating configuration.
fn mutating_hooks(c: &MutatingWebhookConfiguration) -> Vec<Hook<'_>> {
    c.webhooks
        .iter()
        .flatten()
        .map(|h| Hook {
            name: &h.name,
            client: &h.client_config,
        })
        .collect()
}

/// Whether an API error is an RBAC refusal of the caller (not a webhook's answer).
fn forbidden_to_caller(status: &kube::core::Status) -> bool {
    status.code == 403 && !status.message.contains("admission webhook")
}

/// The API server's answer to the dry-run MeshRevisionTag sent through the operator's webhook.
pub fn check_operator_admission(what: &str, answer: Result<(), kube::Error>) -> CheckResult {
    match answer {
        Ok(()) => CheckResult::passed(
            what,
            "the API server admitted a dry-run MeshRevisionTag through the webhook",
        ),
        Err(kube::Error::Api(s)) if s.message.contains("denied the request") => {
            CheckResult::passed(
                what,
                format!("the webhook answered a dry run: {}", s.message),
            )
        }
        Err(kube::Error::Api(s)) if s.message.contains("failed calling webhook") => {
            CheckResult::failed(
                what,
                format!("the API server cannot call it: {}", s.message),
            )
        }
        // Admission runs before the store: the name being taken proves the webhook admitted it.
        Err(kube::Error::Api(s)) if s.code == 409 => CheckResult::passed(
            what,
            "the API server admitted a dry-run MeshRevisionTag through the webhook",
        ),
        Err(kube::Error::Api(s)) if forbidden_to_caller(&s) => CheckResult::skipped(
            what,
            format!(
                "the dry run needs create on meshrevisiontags: {}",
                s.message
            ),
        ),
        Err(kube::Error::Api(s)) => CheckResult::failed(what, s.message),
        Err(other) => CheckResult::failed(what, format!("the dry run could not be sent: {other}")),
    }
}

/// The answer to a revision's webhook probe (the operator's: a dry-run Sidecar that the
/// revision's validating webhook refuses with a known message).
pub fn check_instance_probe(
    what: &str,
    revision: &str,
    answer: Result<(), kube::Error>,
) -> CheckResult {
    match answer {
        Err(kube::Error::Api(s)) if s.message.contains(&names::webhook_probe_answer(revision)) => {
            CheckResult::passed(what, "answered a dry-run probe through the API server")
        }
        Ok(()) => CheckResult::failed(
            what,
            format!("the API server admitted the probe without calling revision {revision}'s validating webhook"),
        ),
        Err(kube::Error::Api(s)) if forbidden_to_caller(&s) => CheckResult::skipped(
            what,
            format!("the probe needs create on sidecars.networking.meshplane.io in the control namespace: {}", s.message),
        ),
        Err(kube::Error::Api(s)) => CheckResult::failed(what, s.message),
        Err(other) => CheckResult::failed(what, format!("the probe could not be sent: {other}")),
    }
}

/// A control plane's own account of itself: `Ready`.
pub fn check_control_plane(mcp: &MeshControlPlane) -> CheckResult {
    let name = mcp.metadata.name.clone().unwrap_or_default();
    let what = format!("MeshControlPlane {name}");
    let status = mcp.status.clone().unwrap_or_default();
    if status.observed_generation < mcp.metadata.generation {
        return CheckResult::failed(
            what,
            format!(
                "the operator has not reconciled the latest spec (generation {:?}, status of {:?}): is the operator running?",
                mcp.metadata.generation, status.observed_generation
            ),
        );
    }
    let conditions = status.conditions.iter().map(|c| {
        (
            c.type_.as_str(),
            c.status.as_str(),
            c.reason.as_str(),
            c.message.as_str(),
        )
    });
    match condition(conditions, "Ready") {
        Some(("True", _)) => CheckResult::passed(
            what,
            format!(
                "Ready: revision {} of tenant {}, {} member namespace(s)",
                mcp.revision(),
                mcp.spec.tenant,
                status.members.map(|m| m.count).unwrap_or(0)
            ),
        ),
        Some((s, said)) => CheckResult::failed(
            what,
            format!("Ready={s}: {said} (kubectl describe meshcontrolplane {name})"),
        ),
        None => CheckResult::failed(what, "no Ready condition yet"),
    }
}

/// Whether one object of the manifests exists.
pub fn check_object(object: &ObjectRef, found: Result<bool, String>) -> CheckResult {
    let what = object.to_string();
    match found {
        Ok(true) => CheckResult::passed(what, "exists"),
        Ok(false) => CheckResult::failed(what, "not found: apply the manifests again"),
        Err(e) => CheckResult::failed(what, e),
    }
}

fn reason(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message,
        other => other.to_string(),
    }
}

/// A read that may find nothing: `Ok(None)` when absent.
fn read_result<T>(
    what: &str,
    answer: Result<Option<T>, kube::Error>,
) -> Result<Option<T>, CheckResult> {
    answer.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 403 => CheckResult::skipped(what, s.message),
        other => CheckResult::failed(what, reason(other)),
    })
}

/// The dry-run MeshRevisionTag sent through the operator's webhook.
fn probe_tag() -> Result<MeshRevisionTag, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "meshplane.io/v1alpha1",
        "kind": "MeshRevisionTag",
        "metadata": {"name": PROBE_TAG},
        "spec": {"revision": format!("{PROBE_TAG}-probe")},
    }))
}

/// The operator's probe Sidecar of `revision` (contract 5).
fn probe_sidecar(revision: &str, control_namespace: &str) -> (ApiResource, DynamicObject) {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("networking.meshplane.io", "v1alpha1", "Sidecar"),
        "sidecars",
    );
    let mut obj = DynamicObject::new(&names::webhook_probe_name(revision), &resource)
        .within(control_namespace);
    obj.metadata.annotations = Some(
        [(
            names::WEBHOOK_PROBE_ANNOTATION.to_string(),
            revision.to_string(),
        )]
        .into(),
    );
    obj.data = json!({"spec": {"egress": [{"hosts": ["./*"]}]}});
    (resource, obj)
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.to_string()),
    }
}

async fn check_operator(client: &kube::Client, namespace: &str, report: &mut VerifyReport) {
    let what = format!("Deployment {namespace}/{OPERATOR_DEPLOYMENT}");
    let found = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(OPERATOR_DEPLOYMENT)
        .await;
    report.checks.push(match read_result(&what, found) {
        Ok(d) => check_deployment(&what, d.as_ref()),
        Err(c) => c,
    });

    let config_name = meshplane_contracts::operator_tls::WEBHOOK_CONFIGURATION;
    let what = format!("ValidatingWebhookConfiguration {config_name}");
    let found = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get_opt(config_name)
        .await;
    report.checks.push(match read_result(&what, found) {
        Ok(c) => check_webhook_configuration(&what, c.as_ref().map(validating_hooks)),
        Err(c) => c,
    });

    let what = "the operator's admission webhook answers the API server";
    let answer = match probe_tag() {
        Ok(tag) => Api::<MeshRevisionTag>::all(client.clone())
            .create(&dry_run(), &tag)
            .await
            .map(|_| ()),
        Err(e) => {
            report.checks.push(CheckResult::failed(what, e.to_string()));
            return;
        }
    };
    report.checks.push(check_operator_admission(what, answer));
}

async fn check_control_planes(client: &kube::Client, report: &mut VerifyReport) {
    let control_planes = match Api::<MeshControlPlane>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            report.checks.push(CheckResult::skipped(
                "MeshControlPlanes",
                format!("cannot list them: {}", reason(e)),
            ));
            return;
        }
    };
    if control_planes.is_empty() {
        report.checks.push(CheckResult::skipped(
            "MeshControlPlanes",
            "none yet: create one per tenant revision (kubectl apply -f config/samples/blue.yaml)",
        ));
    }
    for mcp in &control_planes {
        report.checks.push(check_control_plane(mcp));
        let revision = mcp.revision();
        let namespace = mcp
            .status
            .as_ref()
            .and_then(|s| s.control_namespace.clone())
            .unwrap_or_else(|| mcp.control_namespace());
        let instance = names::instance_name(&revision);
        let what = format!("Deployment {namespace}/{instance}");
        let found = Api::<Deployment>::namespaced(client.clone(), &namespace)
            .get_opt(&instance)
            .await;
        report.checks.push(match read_result(&what, found) {
            Ok(d) => check_deployment(&what, d.as_ref()),
            Err(c) => c,
        });

        let injector = names::injector_webhook(&revision);
        let what = format!("MutatingWebhookConfiguration {injector}");
        let found = Api::<MutatingWebhookConfiguration>::all(client.clone())
            .get_opt(&injector)
            .await;
        report.checks.push(match read_result(&what, found) {
            Ok(c) => check_webhook_configuration(&what, c.as_ref().map(mutating_hooks)),
            Err(c) => c,
        });

        let validator = names::validator_webhook(&revision);
        let what = format!("ValidatingWebhookConfiguration {validator}");
        let found = Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .get_opt(&validator)
            .await;
        report.checks.push(match read_result(&what, found) {
            Ok(c) => check_webhook_configuration(&what, c.as_ref().map(validating_hooks)),
            Err(c) => c,
        });

        let what = format!("revision {revision}'s validating webhook answers the API server");
        let (resource, probe) = probe_sidecar(&revision, &namespace);
        let answer = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &resource)
            .create(&dry_run(), &probe)
            .await
            .map(|_| ());
        report
            .checks
            .push(check_instance_probe(&what, &revision, answer));
    }
}

async fn check_objects(client: &kube::Client, objects: &[ObjectRef], report: &mut VerifyReport) {
    let mut kinds: std::collections::BTreeMap<
        (String, String),
        Result<(ApiResource, bool), String>,
    > = std::collections::BTreeMap::new();
    for object in objects {
        let key = (object.api_version.clone(), object.kind.clone());
        if !kinds.contains_key(&key) {
            let (group, version) = match object.api_version.split_once('/') {
                Some((g, v)) => (g, v),
                None => ("", object.api_version.as_str()),
            };
            let gvk = GroupVersionKind::gvk(group, version, &object.kind);
            let found = kube::discovery::pinned_kind(client, &gvk)
                .await
                .map(|(resource, caps)| (resource, caps.scope == Scope::Namespaced))
                .map_err(|e| {
                    format!(
                        "the API server does not serve {} {}: {}",
                        object.api_version,
                        object.kind,
                        reason(e)
                    )
                });
            kinds.insert(key.clone(), found);
        }
        let mut object = object.clone();
        let found = match &kinds[&key] {
            Err(e) => Err(e.clone()),
            Ok((resource, namespaced)) => {
                let api: Api<DynamicObject> = if *namespaced {
                    let ns = object.namespace.as_deref().unwrap_or("default");
                    Api::namespaced_with(client.clone(), ns, resource)
                } else {
                    // kustomize's `namespace:` lands on kinds it does not know to be
                    // cluster-scoped (ValidatingAdmissionPolicy): the API server ignores it.
                    object.namespace = None;
                    Api::all_with(client.clone(), resource)
                };
                api.get_opt(&object.name)
                    .await
                    .map(|o| o.is_some())
                    .map_err(reason)
            }
        };
        report.checks.push(check_object(&object, found));
    }
}

/// Runs `meshctl verify-install`.
pub async fn run(
    args: &VerifyInstallArgs,
    cluster: &ClusterArgs,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let objects = match (&args.filename, &args.kustomize) {
        (Some(path), _) => Some(manifests::from_path(path)?),
        (None, Some(dir)) => Some(manifests::from_kustomization(dir)?),
        (None, None) => None,
    };
    let client = cluster.client().await?;
    let mut report = VerifyReport::default();
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for release in meshplane_crds::crdgen::all() {
        let name = release.metadata.name.clone().unwrap_or_default();
        let what = format!("CustomResourceDefinition {name}");
        report
            .checks
            .push(match read_result(&what, crds.get_opt(&name).await) {
                Ok(found) => check_crd(&release, found.as_ref()),
                Err(c) => c,
            });
    }
    check_operator(&client, &args.operator_namespace, &mut report).await;
    check_control_planes(&client, &mut report).await;
    if let Some(objects) = objects {
        check_objects(&client, &objects, &mut report).await;
    }
    output::print(&report, format)?;
    Ok(if report.failed() {
        ExitCode::from(EXIT_FINDINGS)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::{ServiceReference, ValidatingWebhook};
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentSpec, DeploymentStatus};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
    };
    use k8s_openapi::ByteString;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "")
                .with_code(code)
                .boxed(),
        )
    }

    fn deployment(desired: i32, available: i32, available_condition: &str) -> Deployment {
        Deployment {
            metadata: kube::api::ObjectMeta {
                generation: Some(2),
                ..Default::default()
            },
            spec: DeploymentSpec {
                replicas: Some(desired),
                ..DeploymentSpec::default()
            },
            status: Some(DeploymentStatus {
                observed_generation: Some(2),
                available_replicas: Some(available),
                conditions: Some(vec![DeploymentCondition {
                    type_: Some("Available".into()),
                    status: Some(available_condition.into()),
                    reason: Some("MinimumReplicasAvailable".into()),
                    ..DeploymentCondition::default()
                }]),
                ..DeploymentStatus::default()
            }),
        }
    }

    fn release_crd() -> CustomResourceDefinition {
        meshplane_crds::crdgen::all()
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some("meshcontrolplanes.meshplane.io"))
            .unwrap()
    }

    fn established(mut crd: CustomResourceDefinition, status: &str) -> CustomResourceDefinition {
        crd.status = Some(CustomResourceDefinitionStatus {
            conditions: Some(vec![CustomResourceDefinitionCondition {
                type_: "Established".into(),
                status: status.into(),
                reason: Some("InitialNamesAccepted".into()),
                ..CustomResourceDefinitionCondition::default()
            }]),
            ..CustomResourceDefinitionStatus::default()
        });
        crd
    }

    fn webhook_configuration(ca: Option<&str>) -> ValidatingWebhookConfiguration {
        ValidatingWebhookConfiguration {
            metadata: kube::api::ObjectMeta {
                name: Some("meshplane-operator".into()),
                ..Default::default()
            },
            webhooks: Some(vec![ValidatingWebhook {
                name: "validate.meshplane.io".into(),
                client_config: WebhookClientConfig {
                    ca_bundle: ca.map(|c| ByteString(c.as_bytes().to_vec())),
                    service: Some(ServiceReference {
                        name: "meshplane-operator".into(),
                        namespace: "meshplane-system".into(),
                        ..ServiceReference::default()
                    }),
                    url: None,
                },
                ..ValidatingWebhook::default()
            }]),
        }
    }

    fn mcp(generation: i64, observed: i64, ready: &str) -> MeshControlPlane {
        serde_json::from_value(json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": "blue-v1", "generation": generation},
            "spec": {"tenant": "blue"},
            "status": {"observedGeneration": observed, "members": {"count": 2},
                "conditions": [{"type": "Ready", "status": ready, "reason": "InstanceUnavailable",
                    "message": "0 of 1 instance pods ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_crd_passes_when_established_and_serving_this_releases_versions() {
        let release = release_crd();
        let ok = check_crd(&release, Some(&established(release.clone(), "True")));
        assert_eq!(ok.status, Status::Passed, "{ok:?}");
        assert_eq!(ok.reason, "Established, serves v1alpha1");
        let missing = check_crd(&release, None);
        assert_eq!(missing.status, Status::Failed);
        assert!(missing.reason.starts_with("not found"));
        let pending = check_crd(&release, Some(&established(release.clone(), "False")));
        assert_eq!(pending.reason, "Established=False: InitialNamesAccepted");
        let mut old = established(release.clone(), "True");
        old.spec.versions[0].name = "v1alpha0".into();
        let old = check_crd(&release, Some(&old));
        assert_eq!(old.status, Status::Failed);
        assert!(old
            .reason
            .contains("does not serve v1alpha1 (serves v1alpha0)"));
    }

    #[test]
    fn a_deployment_passes_with_available_replicas_and_fails_scaled_to_zero() {
        let what = "Deployment meshplane-system/meshplane-operator";
        let ok = check_deployment(what, Some(&deployment(2, 2, "True")));
        assert_eq!(
            (ok.status, ok.reason.as_str()),
            (Status::Passed, "2/2 replicas available")
        );
        // Kubernetes calls a Deployment of 0 replicas Available; nothing serves, though.
        let zero = check_deployment(what, Some(&deployment(0, 0, "True")));
        assert_eq!(zero.status, Status::Failed);
        assert!(
            zero.reason.starts_with("scaled to 0 replicas"),
            "{}",
            zero.reason
        );
        let down = check_deployment(what, Some(&deployment(2, 0, "False")));
        assert_eq!(down.status, Status::Failed);
        assert!(down
            .reason
            .starts_with("0/2 replicas available, Available=False"));
        let mut rolling = deployment(2, 2, "True");
        rolling.metadata.generation = Some(3);
        assert_eq!(
            check_deployment(what, Some(&rolling)).status,
            Status::Failed
        );
        assert_eq!(check_deployment(what, None).reason, "not found");
    }

    #[test]
    fn a_webhook_configuration_needs_a_ca_bundle() {
        let what = "ValidatingWebhookConfiguration meshplane-operator";
        let ok = webhook_configuration(Some(CA));
        let result = check_webhook_configuration(what, Some(validating_hooks(&ok)));
        assert_eq!(result.status, Status::Passed);
        assert!(result
            .reason
            .contains("service meshplane-system/meshplane-operator"));
        let empty = webhook_configuration(None);
        let result = check_webhook_configuration(what, Some(validating_hooks(&empty)));
        assert_eq!(result.status, Status::Failed);
        assert!(result
            .reason
            .contains("validate.meshplane.io has no CA bundle"));
        assert_eq!(
            check_webhook_configuration(what, None).status,
            Status::Failed
        );
    }

    #[test]
    fn the_operators_webhook_answers_or_the_api_server_says_why_not() {
        let what = "operator webhook";
        assert_eq!(
            check_operator_admission(what, Ok(())).status,
            Status::Passed
        );
        assert_eq!(
            check_operator_admission(what, Err(api_error(409, "already exists"))).status,
            Status::Passed
        );
        let unreachable = check_operator_admission(
            what,
            Err(api_error(500, "Internal error occurred: failed calling webhook \"validate.meshplane.io\": connection refused")),
        );
        assert_eq!(unreachable.status, Status::Failed);
        assert!(unreachable.reason.contains("connection refused"));
        let forbidden = check_operator_admission(
            what,
            Err(api_error(
                403,
                "meshrevisiontags.meshplane.io is forbidden: User \"dev\" cannot create",
            )),
        );
        assert_eq!(forbidden.status, Status::Skipped);
        let denied = check_operator_admission(
            what,
            Err(api_error(403, "admission webhook \"validate.meshplane.io\" denied the request: tag named like a revision")),
        );
        assert_eq!(denied.status, Status::Passed);
    }

    #[test]
    fn an_instance_webhook_passes_only_with_its_probe_answer() {
        let what = "probe";
        let answer = names::webhook_probe_answer("blue-v1");
        let ok = check_instance_probe(what, "blue-v1", Err(api_error(403, &format!("admission webhook \"blue-v1.validate.meshplane.io\" denied the request: {answer}"))));
        assert_eq!(ok.status, Status::Passed);
        assert_eq!(
            check_instance_probe(what, "blue-v1", Ok(())).status,
            Status::Failed
        );
        let other = check_instance_probe(
            what,
            "blue-v2",
            Err(api_error(
                403,
                &format!("admission webhook denied the request: {answer}"),
            )),
        );
        assert_eq!(
            other.status,
            Status::Failed,
            "another revision's answer is not this one's"
        );
    }

    #[test]
    fn a_control_plane_passes_when_ready_for_its_latest_spec() {
        let ok = check_control_plane(&mcp(1, 1, "True"));
        assert_eq!(ok.status, Status::Passed);
        assert_eq!(
            ok.reason,
            "Ready: revision blue-v1 of tenant blue, 2 member namespace(s)"
        );
        let not_ready = check_control_plane(&mcp(1, 1, "False"));
        assert_eq!(not_ready.status, Status::Failed);
        assert!(not_ready
            .reason
            .starts_with("Ready=False: InstanceUnavailable: 0 of 1 instance pods ready"));
        let stale = check_control_plane(&mcp(2, 1, "True"));
        assert_eq!(stale.status, Status::Failed);
        assert!(stale.reason.contains("has not reconciled the latest spec"));
    }

    #[test]
    fn the_summary_says_whether_the_install_is_healthy() {
        let mut report = VerifyReport {
            checks: vec![
                CheckResult::passed("a", "ok"),
                CheckResult::skipped("b", "none yet"),
            ],
        };
        assert!(!report.failed());
        assert!(report
            .human(false)
            .ends_with("1 passed, 1 skipped: meshplane is installed and healthy\n"));
        report.checks.push(CheckResult::failed("c", "not found"));
        assert!(report.failed());
        let text = report.human(false);
        assert!(text.contains("c       FAILED    not found"), "{text}");
        assert!(text.ends_with("1 passed, 1 failed, 1 skipped: meshplane is not healthy\n"));
        let object = ObjectRef {
            api_version: "v1".into(),
            kind: "Service".into(),
            namespace: Some("meshplane-system".into()),
            name: "meshplane-operator".into(),
        };
        let missing = check_object(&object, Ok(false));
        assert_eq!(missing.check, "Service meshplane-system/meshplane-operator");
        assert_eq!(missing.status, Status::Failed);
    }
}
