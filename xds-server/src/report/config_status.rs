//! Writes the `Accepted` condition of the tenant's networking and security config (every kind
//! of [`ConfigKind`], Kubernetes mode) from the index's verdict ([`Diagnostics`]).
//!
//! Server-side apply on the status subresource under field manager `meshplane-xds/<revision>`,
//! only when the verdict on an object changes (a steady state writes nothing). Every revision
//! of a tenant judges the same objects alike, so each may write; a write that fails (the
//! object went away, a transient error) is retried on the next verdict or after a pause.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

use crate::translate::diagnostics::{ConfigKind, ConfigRef, Diagnostics, Finding};

/// Pause before retrying writes that failed.
const RETRY: Duration = Duration::from_secs(5);

/// The status an object should carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub generation: Option<i64>,
    pub accepted: bool,
    pub reason: String,
    pub message: String,
}

/// The `Accepted` verdict of one object from its findings.
pub fn verdict(generation: Option<i64>, findings: &[Finding]) -> Verdict {
    match findings {
        [] => Verdict {
            generation,
            accepted: true,
            reason: "Accepted".into(),
            message: "applied to the tenant's proxies".into(),
        },
        [first, ..] => Verdict {
            generation,
            accepted: false,
            reason: first.reason.to_string(),
            message: findings
                .iter()
                .map(|f| f.message.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        },
    }
}

fn api_resource(kind: ConfigKind) -> ApiResource {
    let (group, kind, plural) = kind.api();
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1alpha1", kind), plural)
}

/// The status body applied for a verdict on `object` (an apply body names its object, or the
/// API server refuses it).
pub fn status_patch(object: &ConfigRef, v: &Verdict, now: &Time) -> serde_json::Value {
    let ar = api_resource(object.kind);
    json!({
        "apiVersion": ar.api_version,
        "kind": ar.kind,
        "metadata": {"name": object.name, "namespace": object.namespace},
        "status": {
            "observedGeneration": v.generation,
            "conditions": [{
                "type": meshplane_crds::networking::status::ACCEPTED,
                "status": if v.accepted { "True" } else { "False" },
                "reason": v.reason,
                "message": v.message,
                "observedGeneration": v.generation,
                "lastTransitionTime": now,
            }],
        },
    })
}

async fn write(
    client: &Client,
    manager: &str,
    object: &ConfigRef,
    v: &Verdict,
) -> kube::Result<()> {
    let ar = api_resource(object.kind);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &object.namespace, &ar);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let body = status_patch(object, v, &now);
    api.patch_status(
        &object.name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
}

/// Runs until `verdicts` closes.
pub async fn run(
    client: Client,
    revision: String,
    mut verdicts: watch::Receiver<Arc<Diagnostics>>,
) {
    let manager = format!("meshplane-xds/{revision}");
    let mut written: BTreeMap<ConfigRef, Verdict> = BTreeMap::new();
    loop {
        let current = Arc::clone(&verdicts.borrow_and_update());
        let mut failed = false;
        for (object, (generation, findings)) in &current.objects {
            let v = verdict(*generation, findings);
            if written.get(object) == Some(&v) {
                continue;
            }
            match write(&client, &manager, object, &v).await {
                Ok(()) => {
                    if !v.accepted {
                        tracing::warn!(kind = ?object.kind, namespace = %object.namespace, name = %object.name, reason = %v.reason, message = %v.message, "config not accepted");
                    }
                    written.insert(object.clone(), v);
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    // Deleted meanwhile; the next verdict drops it.
                }
                Err(e) => {
                    tracing::warn!(kind = ?object.kind, namespace = %object.namespace, name = %object.name, error = %e, "cannot write config status");
                    failed = true;
                }
            }
        }
        written.retain(|k, _| current.objects.contains_key(k));
        let next = if failed {
            tokio::time::timeout(RETRY, verdicts.changed()).await.ok()
        } else {
            Some(verdicts.changed().await)
        };
        if let Some(Err(_)) = next {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_name_the_first_reason_and_every_message() {
        assert!(verdict(Some(1), &[]).accepted);
        let v = verdict(
            Some(3),
            &[
                Finding {
                    reason: "HostConflict",
                    message: "a".into(),
                },
                Finding {
                    reason: "UnknownSubset",
                    message: "b".into(),
                },
            ],
        );
        assert_eq!(
            (v.accepted, v.reason.as_str(), v.message.as_str()),
            (false, "HostConflict", "a; b")
        );
        let object = ConfigRef {
            kind: ConfigKind::VirtualService,
            namespace: "shop".into(),
            name: "reviews".into(),
        };
        let body = status_patch(&object, &v, &Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(body["kind"], "VirtualService");
        assert_eq!(body["metadata"]["name"], "reviews");
        assert_eq!(body["metadata"]["namespace"], "shop");
        assert_eq!(body["status"]["conditions"][0]["status"], "False");
        assert_eq!(body["status"]["observedGeneration"], 3);
    }
}
