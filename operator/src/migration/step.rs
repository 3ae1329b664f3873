//! One step of a migration: from its spec, its status and what is observed, the next status and
//! the writes that get there. Pure; the controller (`controller::migration`) gathers the
//! observation and performs the writes, status first, so a restart of the operator resumes
//! where the status says.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use meshplane_crds::migration::{
    BatchPhase, BatchStatus, GateResult, MeshRevisionMigrationSpec, MeshRevisionMigrationStatus,
    MigrationPhase,
};

use super::batches::plan_batches;
use super::gates::{self, gate, BatchInput, Verdict};
use super::proxies::ConnectedProxy;
use super::workloads::{WorkloadKind, WorkloadState};

/// The tag as observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TagState {
    /// `spec.revision`.
    pub revision: String,
    /// `status.tenant` (sticky once set).
    pub tenant: Option<String>,
    /// Namespaces carrying the tag.
    pub members: Vec<String>,
}

/// A revision as observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RevisionState {
    pub tenant: String,
    /// Its `Ready` condition is True.
    pub ready: bool,
    /// Its `status.tags`: its webhooks select the tags listed (status is written after apply).
    pub tags: Vec<String>,
}

/// Everything a step is decided on.
#[derive(Clone, Debug)]
pub struct World {
    pub now: Timestamp,
    pub tag: Option<TagState>,
    /// The revision `spec.revision`.
    pub target: Option<RevisionState>,
    /// The revision the migration started from (`status.fromRevision`), once known.
    pub previous: Option<RevisionState>,
    /// Workloads of the namespaces [`namespaces_to_observe`] asked for, by namespace.
    pub workloads: BTreeMap<String, Vec<WorkloadState>>,
    /// Proxies connected to the target revision's instances.
    pub target_proxies: Result<Vec<ConnectedProxy>, String>,
}

/// A write the controller performs after the status.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Set the tag's `spec.revision`.
    MoveTag { revision: String },
    /// Set the restart annotation of these workloads' pod templates to `restarted_at`.
    Restart {
        workloads: Vec<(WorkloadKind, String, String)>,
        restarted_at: String,
    },
}

/// An Event to publish on the migration.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The outcome of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub status: MeshRevisionMigrationStatus,
    pub effects: Vec<Effect>,
    pub notices: Vec<Notice>,
    /// When to look again (None: only on a change).
    pub requeue: Option<Duration>,
}

/// How often an active migration is looked at.
pub const ACTIVE_REQUEUE: Duration = Duration::from_secs(2);
/// How often a pending one is.
pub const PENDING_REQUEUE: Duration = Duration::from_secs(5);

/// Which namespaces' workloads a step needs, and whether it needs their pods' statistics:
/// the running batch, the next one (its figures before the restart), or every restarted batch
/// while rolling back.
pub fn namespaces_to_observe(status: &MeshRevisionMigrationStatus) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    if status.phase == MigrationPhase::RollingBack {
        for b in status.batches.iter().filter(|b| b.restarted_at.is_some()) {
            out.extend(b.namespaces.iter().map(|n| (n.clone(), false)));
        }
        return out;
    }
    if let Some(b) = status
        .batches
        .iter()
        .find(|b| b.phase == BatchPhase::Gating)
    {
        out.extend(b.namespaces.iter().map(|n| (n.clone(), true)));
    } else if let Some(b) = status
        .batches
        .iter()
        .find(|b| b.phase == BatchPhase::Pending)
    {
        out.extend(b.namespaces.iter().map(|n| (n.clone(), true)));
    }
    out
}

fn progress(status: &MeshRevisionMigrationStatus) -> Option<String> {
    let n = status.batches.len();
    // The running batch, else the one that failed (marked RolledBack once the rollback ends),
    // else how many passed.
    let current = status
        .batches
        .iter()
        .position(|b| matches!(b.phase, BatchPhase::Gating | BatchPhase::Failed))
        .or_else(|| {
            status
                .batches
                .iter()
                .rposition(|b| b.phase == BatchPhase::RolledBack)
        })
        .map(|i| i + 1)
        .unwrap_or_else(|| {
            status
                .batches
                .iter()
                .filter(|b| b.phase == BatchPhase::Passed)
                .count()
        });
    Some(format!("{current}/{n}"))
}

/// `Ready`: True once the migration ended as asked (Succeeded); its reason is the phase.
fn ready_condition(status: &MeshRevisionMigrationStatus, now: Timestamp) -> Vec<Condition> {
    let value = if status.phase == MigrationPhase::Succeeded {
        "True"
    } else {
        "False"
    };
    let reason = format!("{:?}", status.phase);
    let since = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == value && c.reason == reason)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    vec![Condition {
        type_: "Ready".into(),
        status: value.into(),
        reason,
        message: status.message.clone().unwrap_or_default(),
        last_transition_time: since,
        observed_generation: status.observed_generation,
    }]
}

fn parse_time(value: Option<&str>) -> Option<Timestamp> {
    value.and_then(|v| v.parse::<Timestamp>().ok())
}

fn batch_workloads<'a>(batch: &BatchStatus, world: &'a World) -> Vec<&'a WorkloadState> {
    batch
        .namespaces
        .iter()
        .flat_map(|n| world.workloads.get(n).into_iter().flatten())
        .collect()
}

fn restart_effect(workloads: &[&WorkloadState], restarted_at: &str) -> Option<Effect> {
    let todo: Vec<(WorkloadKind, String, String)> = workloads
        .iter()
        .filter(|w| w.restarted_at.as_deref() != Some(restarted_at))
        .map(|w| (w.kind, w.namespace.clone(), w.name.clone()))
        .collect();
    (!todo.is_empty()).then(|| Effect::Restart {
        workloads: todo,
        restarted_at: restarted_at.to_string(),
    })
}

/// Whether the tag's move to `to` has reached the webhooks: `to` lists the tag, `from` no
/// longer does. Restarting before that would inject the new pods from the wrong revision.
fn tag_reflected(tag: &str, to: Option<&RevisionState>, from: Option<&RevisionState>) -> bool {
    to.is_some_and(|r| r.tags.iter().any(|t| t == tag))
        && from.is_none_or(|r| !r.tags.iter().any(|t| t == tag))
}

struct Builder {
    now: Timestamp,
    status: MeshRevisionMigrationStatus,
    effects: Vec<Effect>,
    notices: Vec<Notice>,
}

impl Builder {
    fn notice(&mut self, warning: bool, reason: &'static str, message: String) {
        self.notices.push(Notice {
            warning,
            reason,
            message,
        });
    }

    fn done(mut self, requeue: Option<Duration>) -> Step {
        self.status.conditions = ready_condition(&self.status, self.now);
        self.status.progress = if self.status.batches.is_empty() {
            self.status.progress.take()
        } else {
            progress(&self.status)
        };
        Step {
            status: self.status,
            effects: self.effects,
            notices: self.notices,
            requeue,
        }
    }

    /// Starts the rollback: tag back, restarted batches restarted on the previous revision.
    fn roll_back(mut self, from: &str, failed: GateResult, now: Timestamp, to: &str) -> Step {
        let at = now.to_string();
        self.status.phase = MigrationPhase::RollingBack;
        self.status.rollback_started_at = Some(at);
        self.status.message = Some(format!(
            "gate {} failed: {}; rolling back to {from}",
            failed.gate, failed.message
        ));
        let (warning, reason) = if failed.gate == gate::ABORTED {
            (false, "Aborted")
        } else {
            (true, "GateFailed")
        };
        self.notice(
            warning,
            reason,
            format!(
                "{} → {to}: gate {} failed: {}; the tag returns to {from} and the restarted batches restart on it",
                self.status.progress.clone().unwrap_or_default(),
                failed.gate,
                failed.message
            ),
        );
        self.status.failed_gate = Some(failed);
        self.effects.push(Effect::MoveTag {
            revision: from.to_string(),
        });
        self.done(Some(ACTIVE_REQUEUE))
    }
}

/// Decides the next step of a migration.
pub fn step(
    spec: &MeshRevisionMigrationSpec,
    status: Option<&MeshRevisionMigrationStatus>,
    world: &World,
) -> Step {
    let mut b = Builder {
        now: world.now,
        status: status.cloned().unwrap_or_default(),
        effects: Vec::new(),
        notices: Vec::new(),
    };
    let now = world.now;
    let to = spec.revision.as_str();
    match b.status.phase {
        MigrationPhase::Succeeded | MigrationPhase::RolledBack | MigrationPhase::Failed => {
            b.done(None)
        }
        MigrationPhase::Pending => start(b, spec, world),
        MigrationPhase::Progressing | MigrationPhase::Paused => {
            let Some(from) = b.status.from_revision.clone() else {
                b.status.phase = MigrationPhase::Pending;
                return b.done(Some(PENDING_REQUEUE));
            };
            if spec.abort {
                let failed = GateResult {
                    gate: gate::ABORTED.into(),
                    passed: false,
                    message: "spec.abort is set".into(),
                };
                return b.roll_back(&from, failed, now, to);
            }
            if world.tag.as_ref().is_some_and(|t| t.revision != to) {
                b.effects.push(Effect::MoveTag {
                    revision: to.to_string(),
                });
            }
            let reflected =
                tag_reflected(&spec.tag, world.target.as_ref(), world.previous.as_ref());
            // The running batch.
            if let Some(i) = b
                .status
                .batches
                .iter()
                .position(|x| x.phase == BatchPhase::Gating)
            {
                let batch = b.status.batches[i].clone();
                let workloads: Vec<WorkloadState> = batch_workloads(&batch, world)
                    .into_iter()
                    .cloned()
                    .collect();
                let restarted_at = batch.restarted_at.clone().unwrap_or_default();
                if reflected {
                    let refs: Vec<&WorkloadState> = workloads.iter().collect();
                    b.effects.extend(restart_effect(&refs, &restarted_at));
                }
                let started = parse_time(Some(&restarted_at)).unwrap_or(now);
                let input = BatchInput {
                    revision: to,
                    restarted_at: &restarted_at,
                    started,
                    healthy_since: parse_time(batch.healthy_since.as_deref()),
                    before: batch.before.as_ref(),
                    workloads: &workloads,
                    proxies: &world.target_proxies,
                    settings: &spec.gates,
                    now,
                };
                let n = b.status.batches.len();
                match gates::evaluate(&input) {
                    Verdict::Waiting {
                        gate,
                        healthy_since,
                        after,
                    } => {
                        let x = &mut b.status.batches[i];
                        x.healthy_since = healthy_since.map(|t| t.to_string());
                        x.after = after.or(x.after.take());
                        b.status.message = Some(format!(
                            "batch {}/{n} ({}): waiting on {}: {}",
                            i + 1,
                            batch.namespaces.join(", "),
                            gate.gate,
                            gate.message
                        ));
                        x.gate = Some(gate);
                        b.status.phase = MigrationPhase::Progressing;
                        return b.done(Some(ACTIVE_REQUEUE));
                    }
                    Verdict::Failed { gate, after } => {
                        let x = &mut b.status.batches[i];
                        x.phase = BatchPhase::Failed;
                        x.after = after.or(x.after.take());
                        x.gate = Some(gate.clone());
                        b.effects.clear();
                        return b.roll_back(&from, gate, now, to);
                    }
                    Verdict::Passed { gate, after } => {
                        let x = &mut b.status.batches[i];
                        x.phase = BatchPhase::Passed;
                        x.passed_at = Some(now.to_string());
                        x.after = after.or(x.after.take());
                        let took = parse_time(Some(&restarted_at))
                            .map(|s| now.duration_since(s).as_secs())
                            .unwrap_or(0);
                        b.notice(
                            false,
                            "BatchPassed",
                            format!(
                                "batch {}/{n} ({}) passed every gate in {took}s: {}",
                                i + 1,
                                batch.namespaces.join(", "),
                                gate.message
                            ),
                        );
                        b.status.batches[i].gate = Some(gate);
                        // The next batch is observed (its figures before) on the next step.
                        return b.done(Some(Duration::ZERO));
                    }
                }
            }
            // Between batches.
            let Some(i) = b
                .status
                .batches
                .iter()
                .position(|x| x.phase == BatchPhase::Pending)
            else {
                b.status.phase = MigrationPhase::Succeeded;
                b.status.message = Some(format!(
                    "every batch runs on {to}; tag {} points at it",
                    spec.tag
                ));
                b.notice(
                    false,
                    "Succeeded",
                    b.status.message.clone().unwrap_or_default(),
                );
                return b.done(None);
            };
            let n = b.status.batches.len();
            if spec.paused {
                if b.status.phase != MigrationPhase::Paused {
                    b.notice(
                        false,
                        "Paused",
                        format!("paused before batch {}/{n}", i + 1),
                    );
                }
                b.status.phase = MigrationPhase::Paused;
                b.status.message = Some(format!(
                    "paused before batch {}/{n}; set spec.paused to false to resume",
                    i + 1
                ));
                return b.done(Some(PENDING_REQUEUE));
            }
            if b.status.phase == MigrationPhase::Paused {
                b.notice(false, "Resumed", format!("resumed at batch {}/{n}", i + 1));
            }
            b.status.phase = MigrationPhase::Progressing;
            if !reflected {
                b.status.message = Some(format!(
                    "waiting for the webhooks of {to} to select tag {} before batch {}/{n}",
                    spec.tag,
                    i + 1
                ));
                return b.done(Some(ACTIVE_REQUEUE));
            }
            let batch = b.status.batches[i].clone();
            let workloads = batch_workloads(&batch, world);
            let owned: Vec<WorkloadState> = workloads.iter().map(|w| (*w).clone()).collect();
            let at = now.to_string();
            let x = &mut b.status.batches[i];
            x.phase = BatchPhase::Gating;
            x.restarted_at = Some(at.clone());
            x.before = gates::batch_traffic(&owned, None);
            x.gate = None;
            x.healthy_since = None;
            b.effects.extend(restart_effect(&workloads, &at));
            b.status.message = Some(format!(
                "batch {}/{n} ({}): restarting {} workload(s)",
                i + 1,
                batch.namespaces.join(", "),
                workloads.len()
            ));
            b.notice(
                false,
                "BatchStarted",
                format!(
                    "batch {}/{n}: restarting {} workload(s) in {} on {to}",
                    i + 1,
                    workloads.len(),
                    batch.namespaces.join(", ")
                ),
            );
            b.done(Some(ACTIVE_REQUEUE))
        }
        MigrationPhase::RollingBack => roll_back_step(b, spec, world),
    }
}

/// Pending: check the request, fix the batches, record where the tag came from.
fn start(mut b: Builder, spec: &MeshRevisionMigrationSpec, world: &World) -> Step {
    let to = spec.revision.as_str();
    let Some(tag) = world.tag.as_ref() else {
        b.status.message = Some(format!("MeshRevisionTag {} not found", spec.tag));
        return b.done(Some(PENDING_REQUEUE));
    };
    let Some(target) = world.target.as_ref() else {
        b.status.message = Some(format!("revision {to} not found"));
        return b.done(Some(PENDING_REQUEUE));
    };
    if let Some(tenant) = tag.tenant.as_deref().filter(|t| *t != target.tenant) {
        b.status.phase = MigrationPhase::Failed;
        b.status.message = Some(format!(
            "tag {} belongs to tenant {tenant}, revision {to} to tenant {}: a tag never moves across tenants",
            spec.tag, target.tenant
        ));
        b.notice(
            true,
            "Refused",
            b.status.message.clone().unwrap_or_default(),
        );
        return b.done(None);
    }
    if tag.revision == to {
        b.status.phase = MigrationPhase::Failed;
        b.status.message = Some(format!(
            "tag {} already points at {to}: nothing to migrate from (restart its workloads by hand, or move the tag back first)",
            spec.tag
        ));
        b.notice(
            true,
            "Refused",
            b.status.message.clone().unwrap_or_default(),
        );
        return b.done(None);
    }
    if !target.ready {
        b.status.message = Some(format!("waiting for revision {to} to be Ready"));
        return b.done(Some(PENDING_REQUEUE));
    }
    let batches = plan_batches(&tag.members, &spec.order, spec.batch_size);
    b.status.from_revision = Some(tag.revision.clone());
    b.status.tenant = Some(target.tenant.clone());
    b.status.batches = batches
        .into_iter()
        .map(|namespaces| BatchStatus {
            namespaces,
            ..Default::default()
        })
        .collect();
    b.status.phase = MigrationPhase::Progressing;
    b.status.progress = Some(format!("0/{}", b.status.batches.len()));
    b.status.message = Some(format!(
        "moving tag {} from {} to {to}; {} batch(es)",
        spec.tag,
        tag.revision,
        b.status.batches.len()
    ));
    b.notice(
        false,
        "Started",
        b.status.message.clone().unwrap_or_default(),
    );
    b.effects.push(Effect::MoveTag {
        revision: to.to_string(),
    });
    b.done(Some(ACTIVE_REQUEUE))
}

/// RollingBack: tag on the previous revision, every restarted batch restarted on it, done when
/// every pod of those batches runs on it and is Ready.
fn roll_back_step(mut b: Builder, spec: &MeshRevisionMigrationSpec, world: &World) -> Step {
    let Some(from) = b.status.from_revision.clone() else {
        b.status.phase = MigrationPhase::Failed;
        return b.done(None);
    };
    if world.tag.as_ref().is_some_and(|t| t.revision != from) {
        b.effects.push(Effect::MoveTag {
            revision: from.clone(),
        });
    }
    let at = b.status.rollback_started_at.clone().unwrap_or_default();
    if !tag_reflected(&spec.tag, world.previous.as_ref(), world.target.as_ref()) {
        b.status.message = Some(format!(
            "rolling back: waiting for the webhooks of {from} to select tag {} again",
            spec.tag
        ));
        return b.done(Some(ACTIVE_REQUEUE));
    }
    let restarted: Vec<usize> = (0..b.status.batches.len())
        .filter(|i| b.status.batches[*i].restarted_at.is_some())
        .collect();
    let mut waiting: Option<String> = None;
    for &i in &restarted {
        let batch = b.status.batches[i].clone();
        let workloads = batch_workloads(&batch, world);
        b.effects.extend(restart_effect(&workloads, &at));
        for w in &workloads {
            let back = w.restarted_at.as_deref() == Some(at.as_str())
                && w.rolled_out
                && w.pods
                    .iter()
                    .all(|p| p.ready && p.revision.as_deref() == Some(from.as_str()));
            if !back && waiting.is_none() {
                let on_from = w
                    .pods
                    .iter()
                    .filter(|p| p.ready && p.revision.as_deref() == Some(from.as_str()))
                    .count();
                waiting = Some(format!(
                    "{}: {on_from}/{} pods Ready on {from}",
                    w.key(),
                    w.pods.len()
                ));
            }
        }
    }
    if let Some(w) = waiting {
        let gate = b
            .status
            .failed_gate
            .as_ref()
            .map(|g| g.gate.clone())
            .unwrap_or_default();
        b.status.message = Some(format!("gate {gate} failed; rolling back to {from}: {w}"));
        return b.done(Some(ACTIVE_REQUEUE));
    }
    for &i in &restarted {
        b.status.batches[i].phase = BatchPhase::RolledBack;
    }
    let now = world.now;
    b.status.phase = MigrationPhase::RolledBack;
    b.status.rollback_completed_at = Some(now.to_string());
    let took = parse_time(Some(&at))
        .map(|s| now.duration_since(s).as_secs())
        .unwrap_or(0);
    let gate = b.status.failed_gate.clone().unwrap_or_default();
    b.status.message = Some(format!(
        "rolled back: tag {} points at {from} and every restarted workload runs on it again ({took}s after gate {} failed: {})",
        spec.tag, gate.gate, gate.message
    ));
    b.notice(
        gate.gate != gate::ABORTED,
        "RolledBack",
        b.status.message.clone().unwrap_or_default(),
    );
    b.done(None)
}
