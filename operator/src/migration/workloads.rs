//! The workloads a migration restarts (Deployments, StatefulSets, DaemonSets), seen as the
//! gates need them: the restart annotation of their pod template, whether their controller
//! reports the rollout complete (as `kubectl rollout status` decides), and their pods.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use meshplane_crds::names;

use super::stats::ProxyTraffic;

/// The kinds a migration restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
        }
    }
}

/// One pod of a workload.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodState {
    pub name: String,
    pub ready: bool,
    /// The revision that injected its proxy (`sidecar.meshplane.io/revision`), if any.
    pub revision: Option<String>,
    /// Its proxy's inbound statistics, when they could be read.
    pub traffic: Option<ProxyTraffic>,
}

/// One workload and its pods (terminating pods left out).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadState {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    /// `kubectl.kubernetes.io/restartedAt` of its pod template.
    pub restarted_at: Option<String>,
    /// Its controller reports every replica updated to the current template and ready, and no
    /// old replica left.
    pub rolled_out: bool,
    pub pods: Vec<PodState>,
}

impl WorkloadState {
    pub fn key(&self) -> String {
        format!("{}/{}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// Whether a pod template opts out of injection (`sidecar.meshplane.io/inject: "false"`):
/// such workloads have no proxy to migrate and are never restarted.
pub fn opts_out(template: &PodTemplateSpec) -> bool {
    template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get(names::INJECT_LABEL))
        .is_some_and(|v| v == "false")
}

/// The template's restart annotation.
pub fn restarted_at(template: &PodTemplateSpec) -> Option<String> {
    template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(names::RESTARTED_AT_ANNOTATION))
        .cloned()
}

fn observed(generation: Option<i64>, observed: Option<i64>) -> bool {
    observed.unwrap_or(0) >= generation.unwrap_or(0)
}

/// `kubectl rollout status deployment`: the controller saw the latest spec, every replica is
/// updated and available, and no old replica remains.
pub fn deployment_rolled_out(d: &Deployment) -> bool {
    let want = d.spec.replicas.unwrap_or(1);
    let Some(s) = d.status.as_ref() else {
        return want == 0;
    };
    observed(d.metadata.generation, s.observed_generation)
        && s.updated_replicas.unwrap_or(0) >= want
        && s.replicas.unwrap_or(0) <= s.updated_replicas.unwrap_or(0)
        && s.available_replicas.unwrap_or(0) >= want
}

/// `kubectl rollout status statefulset` (RollingUpdate): every replica ready and on the
/// update revision.
pub fn statefulset_rolled_out(s: &StatefulSet) -> bool {
    let want = s.spec.replicas.unwrap_or(1);
    let Some(st) = s.status.as_ref() else {
        return want == 0;
    };
    observed(s.metadata.generation, st.observed_generation)
        && st.ready_replicas.unwrap_or(0) >= want
        && st.updated_replicas.unwrap_or(0) >= want
        && st.update_revision.is_some()
        && st.current_revision == st.update_revision
}

/// `kubectl rollout status daemonset`: every scheduled pod updated and available.
pub fn daemonset_rolled_out(d: &DaemonSet) -> bool {
    let Some(s) = d.status.as_ref() else {
        return false;
    };
    observed(d.metadata.generation, s.observed_generation)
        && s.updated_number_scheduled.unwrap_or(0) >= s.desired_number_scheduled
        && s.number_available.unwrap_or(0) >= s.desired_number_scheduled
}

/// A pod as the gates see it.
pub fn pod_state(pod: &Pod) -> PodState {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    PodState {
        name: pod.metadata.name.clone().unwrap_or_default(),
        ready,
        revision: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::INJECTED_REVISION_ANNOTATION))
            .cloned(),
        traffic: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(spec_replicas: i32, status: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "generation": 3},
            "spec": {"replicas": spec_replicas, "selector": {}, "template": {}},
            "status": status,
        }))
        .expect("deployment")
    }

    #[test]
    fn a_deployment_is_rolled_out_only_when_no_old_replica_is_left() {
        let done = json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        assert!(deployment_rolled_out(&deployment(2, done)));
        let surging = json!({"observedGeneration": 3, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 3});
        assert!(!deployment_rolled_out(&deployment(2, surging)));
        let stale = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        assert!(!deployment_rolled_out(&deployment(2, stale)));
    }

    #[test]
    fn statefulsets_and_daemonsets_follow_kubectl() {
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "db", "generation": 1},
            "spec": {"replicas": 2, "selector": {}, "serviceName": "db", "template": {}},
            "status": {"observedGeneration": 1, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                       "currentRevision": "db-1", "updateRevision": "db-2"},
        }))
        .expect("sts");
        assert!(!statefulset_rolled_out(&sts));
        let mut done = sts.clone();
        if let Some(s) = done.status.as_mut() {
            s.current_revision = Some("db-2".into());
        }
        assert!(statefulset_rolled_out(&done));
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "agent", "generation": 1},
            "spec": {"selector": {}, "template": {}},
            "status": {"observedGeneration": 1, "desiredNumberScheduled": 3, "currentNumberScheduled": 3,
                       "numberMisscheduled": 0, "numberReady": 3, "updatedNumberScheduled": 2, "numberAvailable": 3},
        }))
        .expect("ds");
        assert!(!daemonset_rolled_out(&ds));
    }

    #[test]
    fn template_annotations_and_opt_out_are_read() {
        let t: PodTemplateSpec = serde_json::from_value(json!({"metadata": {
            "labels": {names::INJECT_LABEL: "false"},
            "annotations": {names::RESTARTED_AT_ANNOTATION: "2026-12-01T16:00:00Z"}}}))
        .expect("template");
        assert!(opts_out(&t));
        assert_eq!(restarted_at(&t).as_deref(), Some("2026-12-01T16:00:00Z"));
        assert!(!opts_out(&PodTemplateSpec::default()));
    }
}
