//! The Deployment controller part of the runner: Pods for each Deployment (owned directly by
//! the Deployment; the runner has no ReplicaSets), rolled to a new template by surge, and the
//! Deployment status the operator's readiness depends on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use rand::distr::{Alphanumeric, SampleString};
use serde_json::{json, Value};

use super::container::now_rfc3339;
use super::error::PodRunnerError;

/// Label carrying the template hash, as the real ReplicaSet controller sets it.
pub const TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// How long a created or deleted pod is expected to show up in (or vanish from) the watch cache
/// before the controller stops accounting for it.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Pods created or deleted but not yet seen so in the watch cache, so that the controller does
/// not create them twice while its cache lags.
#[derive(Debug, Default)]
pub struct DeploymentController {
    pending_creates: BTreeMap<String, BTreeMap<String, Instant>>,
    pending_deletes: BTreeMap<String, Instant>,
    last_errors: BTreeMap<String, String>,
}

impl DeploymentController {
    /// Reconciles every Deployment against the pods in the cache.
    pub async fn reconcile_all(
        &mut self,
        client: &Client,
        deployments: &[Arc<Deployment>],
        pods: &[Arc<Pod>],
    ) {
        let now = Instant::now();
        self.pending_deletes.retain(|uid, since| {
            now.duration_since(*since) < EXPECTATION_TIMEOUT
                && pods
                    .iter()
                    .any(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
        });
        for deployment in deployments {
            if deployment.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let key = format!(
                "{}/{}",
                deployment.metadata.namespace.as_deref().unwrap_or_default(),
                deployment.metadata.name.as_deref().unwrap_or_default()
            );
            let result = self.reconcile(client, deployment, pods).await;
            match result {
                Ok(()) => {
                    self.last_errors.remove(&key);
                }
                Err(error) => {
                    let message = error.to_string();
                    if self.last_errors.get(&key) != Some(&message) {
                        tracing::warn!(deployment = %key, %message, "deployment reconcile failed");
                        self.last_errors.insert(key, message);
                    }
                }
            }
        }
    }

    async fn reconcile(
        &mut self,
        client: &Client,
        deployment: &Deployment,
        pods: &[Arc<Pod>],
    ) -> Result<(), PodRunnerError> {
        let namespace = deployment.metadata.namespace.clone().unwrap_or_default();
        let name = deployment.metadata.name.clone().unwrap_or_default();
        let uid = deployment.metadata.uid.clone().unwrap_or_default();
        let spec = deployment.spec.clone();
        let replicas = usize::try_from(spec.replicas.unwrap_or(1)).unwrap_or(0);
        let hash = template_hash(&serde_json::to_value(&spec.template).unwrap_or(Value::Null));
        let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");

        let owned: Vec<&Arc<Pod>> = pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
            .filter(|p| controller_uid(p) == Some(uid.as_str()))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                !self
                    .pending_deletes
                    .contains_key(p.metadata.uid.as_deref().unwrap_or_default())
            })
            .collect();
        let pending = self.pending_creates.entry(uid.clone()).or_default();
        let now = Instant::now();
        pending.retain(|pod_name, since| {
            now.duration_since(*since) < EXPECTATION_TIMEOUT
                && !owned
                    .iter()
                    .any(|p| p.metadata.name.as_deref() == Some(pod_name.as_str()))
        });
        let pending_count = pending.len();
        let (current, old): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) = owned
            .iter()
            .partition(|p| p.labels().get(TEMPLATE_HASH_LABEL) == Some(&hash));
        let current_ready = current.iter().filter(|p| pod_ready(p)).count();

        let pods_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let mut to_delete: Vec<&Arc<Pod>> = Vec::new();
        let mut to_create = 0;
        if recreate && !old.is_empty() {
            to_delete.extend(old.iter().copied());
        } else {
            let current_total = current.len() + pending_count;
            if current_total < replicas {
                to_create = replicas - current_total;
            } else if current.len() > replicas {
                to_delete.extend(
                    not_ready_first(&current)
                        .into_iter()
                        .take(current.len() - replicas),
                );
            }
            // Surge: an old pod goes once a ready new pod can take its place.
            let excess_old = (old.len() + current_ready.min(replicas)).saturating_sub(replicas);
            to_delete.extend(not_ready_first(&old).into_iter().take(excess_old));
        }

        for _ in 0..to_create {
            let pod = new_pod(deployment, &hash)?;
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            pods_api
                .create(&PostParams::default(), &pod)
                .await
                .map_err(|e| {
                    PodRunnerError::api(format!("create pod {namespace}/{pod_name}"), e)
                })?;
            tracing::info!(deployment = %name, pod = %pod_name, "created pod");
            self.pending_creates
                .entry(uid.clone())
                .or_default()
                .insert(pod_name, Instant::now());
        }
        for pod in to_delete {
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            match pods_api.delete(&pod_name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(deployment = %name, pod = %pod_name, "deleted pod"),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => {
                    return Err(PodRunnerError::api(
                        format!("delete pod {namespace}/{pod_name}"),
                        e,
                    ))
                }
            }
            self.pending_deletes
                .insert(pod.metadata.uid.clone().unwrap_or_default(), Instant::now());
        }

        let ready = owned.iter().filter(|p| pod_ready(p)).count();
        let status = deployment_status(deployment, replicas, owned.len(), current.len(), ready);
        let existing = deployment
            .status
            .as_ref()
            .map(|s| serde_json::to_value(s).unwrap_or(Value::Null));
        if existing.as_ref().map(status_fingerprint) != Some(status_fingerprint(&status)) {
            let api: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .map_err(|e| {
                PodRunnerError::api(format!("write status of deployment {namespace}/{name}"), e)
            })?;
        }
        Ok(())
    }
}

fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Deployment")
        .map(|o| o.uid.as_str())
}

/// Whether a pod's `Ready` condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

fn not_ready_first<'a>(pods: &[&'a Arc<Pod>]) -> Vec<&'a Arc<Pod>> {
    let mut sorted = pods.to_vec();
    sorted.sort_by_key(|p| pod_ready(p));
    sorted
}

/// A stable hash of the pod template (FNV-1a over its JSON), 10 lowercase hex digits.
pub fn template_hash(template: &Value) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in template.to_string().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:010x}", hash & 0xff_ffff_ffff)
}

/// `<deploy>-<hash>-<suffix>` with the template's labels, annotations and spec.
fn new_pod(deployment: &Deployment, hash: &str) -> Result<Pod, PodRunnerError> {
    let name = deployment.metadata.name.clone().unwrap_or_default();
    let template = deployment.spec.template.clone();
    let meta = template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(TEMPLATE_HASH_LABEL.into(), hash.into());
    let suffix = Alphanumeric
        .sample_string(&mut rand::rng(), 5)
        .to_lowercase();
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{name}-{hash}-{suffix}"),
            "namespace": deployment.metadata.namespace,
            "labels": labels,
            "annotations": meta.annotations.unwrap_or_default(),
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": name,
                "uid": deployment.metadata.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": template.spec,
    });
    serde_json::from_value(pod)
        .map_err(|e| PodRunnerError::ClientConfig(format!("pod for deployment {name}: {e}")))
}

fn deployment_status(
    deployment: &Deployment,
    desired: usize,
    total: usize,
    updated: usize,
    ready: usize,
) -> Value {
    let previous = deployment
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let condition = |kind: &str, status: bool, reason: &str, message: String| {
        let status = if status { "True" } else { "False" };
        let since = previous
            .iter()
            .find(|c| c.type_.as_deref() == Some(kind) && c.status.as_deref() == Some(status))
            .and_then(|c| c.last_transition_time.as_ref())
            .and_then(|t| serde_json::to_value(t).ok())
            .unwrap_or_else(|| Value::String(now_rfc3339()));
        let updated = previous
            .iter()
            .find(|c| {
                c.type_.as_deref() == Some(kind)
                    && c.status.as_deref() == Some(status)
                    && c.reason.as_deref() == Some(reason)
            })
            .and_then(|c| c.last_update_time.as_ref())
            .and_then(|t| serde_json::to_value(t).ok())
            .unwrap_or_else(|| since.clone());
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": since, "lastUpdateTime": updated})
    };
    let available = ready >= desired;
    let complete = updated == desired && total == desired && available;
    let name = deployment.metadata.name.clone().unwrap_or_default();
    let mut status = json!({
        "observedGeneration": deployment.metadata.generation.unwrap_or(0),
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "conditions": [
            if available {
                condition("Available", true, "MinimumReplicasAvailable", "Deployment has minimum availability.".into())
            } else {
                condition("Available", false, "MinimumReplicasUnavailable", "Deployment does not have minimum availability.".into())
            },
            if complete {
                condition("Progressing", true, "NewReplicaSetAvailable", format!("Deployment {name:?} has successfully progressed."))
            } else {
                condition("Progressing", true, "ReplicaSetUpdated", format!("Deployment {name:?} is progressing."))
            },
        ],
    });
    let unavailable = desired.saturating_sub(ready);
    if unavailable > 0 {
        status["unavailableReplicas"] = json!(unavailable);
    }
    status
}

/// The parts of a Deployment status that matter, to write it only when they change.
fn status_fingerprint(status: &Value) -> Value {
    let number = |field: &str| status.get(field).and_then(Value::as_i64).unwrap_or(0);
    let conditions: Vec<Value> = status
        .get("conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| json!([c.get("type"), c.get("status"), c.get("reason")]))
        .collect();
    json!([
        number("observedGeneration"),
        number("replicas"),
        number("updatedReplicas"),
        number("readyReplicas"),
        number("availableReplicas"),
        number("unavailableReplicas"),
        conditions,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_hash_is_stable_and_follows_the_template() {
        let a = json!({"spec": {"containers": [{"name": "x", "image": "a"}]}});
        let b = json!({"spec": {"containers": [{"name": "x", "image": "b"}]}});
        assert_eq!(template_hash(&a), template_hash(&a.clone()));
        assert_ne!(template_hash(&a), template_hash(&b));
        assert_eq!(template_hash(&a).len(), 10);
    }
}
