//! `meshplane.io/v1alpha1` `MeshRevisionMigration`: moving a tag from its revision to another
//! one of the same tenant, restarting the tag's workloads batch by batch behind health gates,
//! with automatic rollback (docs/migration.md).
//!
//! A kind of its own rather than a field of `MeshRevisionTag`: a migration is an operation with
//! a beginning, an end and an outcome (which batch, which gate, which figures), worth keeping
//! after it ends; the tag stays a plain alias that `kubectl`, `meshctl tag` and GitOps tools can
//! keep writing. The migration controller is the one writer of the tag's `spec.revision` while a
//! migration of it runs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Moves tag `spec.tag` to revision `spec.revision`, restarting the tag's member namespaces'
/// workloads batch by batch; each batch must pass its health gates before the next starts.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "meshplane.io",
    version = "v1alpha1",
    kind = "MeshRevisionMigration",
    doc = "Moves a revision tag to another revision of its tenant, restarting the tag's workloads batch by batch behind health gates, with automatic rollback.",
    shortname = "mrm",
    status = "MeshRevisionMigrationStatus",
    printcolumn = r#"{"name":"Tag","type":"string","jsonPath":".spec.tag"}"#,
    printcolumn = r#"{"name":"From","type":"string","jsonPath":".status.fromRevision"}"#,
    printcolumn = r#"{"name":"To","type":"string","jsonPath":".spec.revision"}"#,
    printcolumn = r#"{"name":"Batch","type":"string","jsonPath":".status.progress"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Failed Gate","type":"string","jsonPath":".status.failedGate.gate"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MeshRevisionMigrationSpec {
    /// The `MeshRevisionTag` to move. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.tag is immutable"))]
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub tag: String,

    /// The revision to move the tag to, of the tag's tenant. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.revision is immutable"))]
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub revision: String,

    /// Namespaces restarted together in one batch.
    #[serde(default = "default_batch_size")]
    #[schemars(range(min = 1, max = 1000))]
    pub batch_size: i32,

    /// Namespaces to migrate first, in this order (canaries). The tag's other member namespaces
    /// follow, sorted by name. Names that are not members of the tag are skipped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub order: Vec<String>,

    /// What every batch must show before the next one starts.
    #[serde(default)]
    pub gates: GateSettings,

    /// Stop before the next batch (the running batch's gates are still evaluated). Setting it
    /// back to false resumes.
    #[serde(default)]
    pub paused: bool,

    /// Stop and roll back: the tag returns to the previous revision and the batches already
    /// restarted are restarted on it. Ignored once the migration has ended.
    #[serde(default)]
    pub abort: bool,
}

fn default_batch_size() -> i32 {
    1
}

/// Health gates of a batch. Every batch must, within `timeoutSeconds` of its restart: have
/// every workload rolled out with Ready pods; have every pod injected by the new revision and
/// its proxy connected to it, synced and without a NACK; and, after `observeSeconds` of
/// traffic, an error rate and mean latency (from the proxies' own statistics) no worse than
/// before the batch by more than the thresholds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateSettings {
    /// How long a batch may take to pass every gate after its restart.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: i32,
    /// How long the batch's new proxies serve traffic before their statistics are judged.
    #[serde(default = "default_observe_seconds")]
    #[schemars(range(min = 0, max = 3600))]
    pub observe_seconds: i32,
    /// Largest allowed rise of the 5xx share of requests, in percentage points.
    #[serde(default = "default_max_error_rate_increase")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub max_error_rate_increase_percent: f64,
    /// Largest allowed rise of the mean request latency, in percent of the value before.
    #[serde(default = "default_max_latency_increase")]
    #[schemars(range(min = 0.0, max = 100000.0))]
    pub max_latency_increase_percent: f64,
    /// Fewest requests on both sides (before and after) for the statistics gates to judge; with
    /// less traffic they pass and the status says the traffic was too thin to judge.
    #[serde(default = "default_min_requests")]
    #[schemars(range(min = 1, max = 1000000000))]
    pub min_requests: i64,
}

fn default_timeout_seconds() -> i32 {
    300
}
fn default_observe_seconds() -> i32 {
    30
}
fn default_max_error_rate_increase() -> f64 {
    1.0
}
fn default_max_latency_increase() -> f64 {
    50.0
}
fn default_min_requests() -> i64 {
    20
}

impl Default for GateSettings {
    fn default() -> Self {
        Self {
            timeout_seconds: default_timeout_seconds(),
            observe_seconds: default_observe_seconds(),
            max_error_rate_increase_percent: default_max_error_rate_increase(),
            max_latency_increase_percent: default_max_latency_increase(),
            min_requests: default_min_requests(),
        }
    }
}

/// Where a migration stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MigrationPhase {
    /// Not started: waiting for the target revision to be Ready, or refused (see `message`).
    #[default]
    Pending,
    /// A batch is restarting or being gated.
    Progressing,
    /// Stopped between batches by `spec.paused`.
    Paused,
    /// Every batch passed; the tag points at the new revision.
    Succeeded,
    /// A gate failed (or `spec.abort`): the tag is back on the previous revision and the
    /// restarted batches are being restarted on it.
    RollingBack,
    /// Rollback finished: every restarted workload runs on the previous revision again.
    RolledBack,
    /// Refused for good (e.g. the tag belongs to another tenant than the revision).
    Failed,
}

impl MigrationPhase {
    /// Whether the migration has ended (nothing more will happen).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            MigrationPhase::Succeeded | MigrationPhase::RolledBack | MigrationPhase::Failed
        )
    }
}

/// Observed state of a `MeshRevisionMigration`, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshRevisionMigrationStatus {
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub phase: MigrationPhase,
    /// The revision the tag pointed at when the migration started (the rollback target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_revision: Option<String>,
    /// Tenant of both revisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// `i/n`: the batch running (or last run) and the number of batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The batches, fixed when the migration starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<BatchStatus>,
    /// The gate that failed, with its figures (set when a rollback starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_gate: Option<GateResult>,
    /// When the rollback started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_started_at: Option<String>,
    /// When every restarted workload ran on the previous revision again (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_completed_at: Option<String>,
    /// Human-readable summary of the current state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `Ready` (the migration ended as asked), `Progressing`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Where one batch stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BatchPhase {
    /// Not started.
    #[default]
    Pending,
    /// Restarted; its gates are being evaluated.
    Gating,
    /// Every gate passed.
    Passed,
    /// A gate failed or timed out.
    Failed,
    /// Restarted on the previous revision after a rollback.
    RolledBack,
}

/// One batch of namespaces.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchStatus {
    /// Member namespaces of the tag restarted together.
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub phase: BatchPhase,
    /// The `kubectl.kubernetes.io/restartedAt` value the batch's workloads were given (RFC
    /// 3339); a workload carrying it has been restarted for this batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<String>,
    /// When the pods and proxies gates first all passed: the start of the observation window
    /// (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<String>,
    /// When every gate had passed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed_at: Option<String>,
    /// The batch's traffic before its restart, from its proxies' statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<TrafficFigures>,
    /// The batch's traffic since its restart, as last judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<TrafficFigures>,
    /// The gate the batch waits on (or failed), with its figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateResult>,
}

/// Requests served by a set of proxies (their inbound HTTP connection managers).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficFigures {
    /// Completed requests.
    pub requests: i64,
    /// Of which answered 5xx.
    pub errors: i64,
    /// Mean request duration in milliseconds (absent without requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_latency_ms: Option<f64>,
}

/// The outcome of one gate.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateResult {
    /// `PodsReady`, `ProxiesConnected`, `ProxiesSynced`, `NoNacks`, `ErrorRate`, `Latency`,
    /// `Observe` (waiting for the observation window), or `Aborted`.
    pub gate: String,
    /// Whether the gate passed.
    pub passed: bool,
    /// What was seen, with the figures.
    pub message: String,
}
