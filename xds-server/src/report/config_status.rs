//! Writes the `Accepted` condition of the tenant's networking and security config (every kind
//! of [`ConfigKind`], Kubernetes mode) from the index's verdict ([`Diagnostics`]).
//!
//! Server-side apply on the status subresource under field manager `meshplane-xds/<revision>`,
//! only when the verdict on an object changes (a steady state writes nothing). One revision of
//! the tenant writes each object's status (contract 2, [`StatusScope`]): the revision its
//! namespace is attached to, and for the control namespace the tenant's status writer. Two
//! revisions that judge an object differently (a canary with another mesh config, another
//! version) therefore never take turns on its condition. An object this revision wrote and no
//! longer owns (its namespace moved to another revision) is released: an apply without status
//! drops this manager's fields, so what the owning revision applies stays alone. A write that
//! fails (the object went away, a transient error) is retried on the next verdict or after a
//! pause.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

use crate::source_kube::StatusScope;
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

/// The apply body that releases this manager's status fields of `object`.
pub fn release_patch(object: &ConfigRef) -> serde_json::Value {
    let ar = api_resource(object.kind);
    json!({
        "apiVersion": ar.api_version,
        "kind": ar.kind,
        "metadata": {"name": object.name, "namespace": object.namespace},
    })
}

/// What this revision does with one object's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Apply this verdict.
    Write(Verdict),
    /// Drop what it applied before: another revision owns the object now.
    Release,
}

/// The writes one verdict round needs: objects of the namespaces `scope` owns whose verdict
/// differs from the one written, and releases of objects written before and owned no more.
pub fn steps(
    current: &Diagnostics,
    scope: &StatusScope,
    written: &BTreeMap<ConfigRef, Verdict>,
) -> Vec<(ConfigRef, Step)> {
    let mut out = Vec::new();
    for (object, (generation, findings)) in &current.objects {
        if !scope.owns(&object.namespace) {
            if written.contains_key(object) {
                out.push((object.clone(), Step::Release));
            }
            continue;
        }
        let v = verdict(*generation, findings);
        if written.get(object) != Some(&v) {
            out.push((object.clone(), Step::Write(v)));
        }
    }
    out
}

async fn write(
    client: &Client,
    manager: &str,
    object: &ConfigRef,
    step: &Step,
) -> kube::Result<()> {
    let ar = api_resource(object.kind);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &object.namespace, &ar);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let body = match step {
        Step::Write(v) => status_patch(object, v, &now),
        Step::Release => release_patch(object),
    };
    api.patch_status(
        &object.name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
}

/// Runs until `verdicts` or `scope` closes.
pub async fn run(
    client: Client,
    revision: String,
    mut verdicts: watch::Receiver<Arc<Diagnostics>>,
    mut scope: watch::Receiver<Option<StatusScope>>,
) {
    let manager = format!("meshplane-xds/{revision}");
    let mut written: BTreeMap<ConfigRef, Verdict> = BTreeMap::new();
    loop {
        let current = Arc::clone(&verdicts.borrow_and_update());
        let owned = scope.borrow_and_update().clone();
        let mut failed = false;
        // Until the members ConfigMap was read, this revision does not know what it owns.
        let todo = owned
            .as_ref()
            .map(|s| steps(&current, s, &written))
            .unwrap_or_default();
        for (object, step) in todo {
            match write(&client, &manager, &object, &step).await {
                Ok(()) => match step {
                    Step::Write(v) => {
                        if !v.accepted {
                            tracing::warn!(kind = ?object.kind, namespace = %object.namespace, name = %object.name, reason = %v.reason, message = %v.message, "config not accepted");
                        }
                        written.insert(object, v);
                    }
                    Step::Release => {
                        tracing::info!(kind = ?object.kind, namespace = %object.namespace, name = %object.name, "status released to the revision that owns it now");
                        written.remove(&object);
                    }
                },
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    // Deleted meanwhile; the next verdict drops it.
                    if step == Step::Release {
                        written.remove(&object);
                    }
                }
                Err(e) => {
                    tracing::warn!(kind = ?object.kind, namespace = %object.namespace, name = %object.name, error = %e, "cannot write config status");
                    failed = true;
                }
            }
        }
        written.retain(|k, _| current.objects.contains_key(k));
        let changed = async {
            tokio::select! {
                r = verdicts.changed() => r,
                r = scope.changed() => r,
            }
        };
        let next = if failed {
            tokio::time::timeout(RETRY, changed).await.ok()
        } else {
            Some(changed.await)
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

    fn obj(namespace: &str, name: &str) -> ConfigRef {
        ConfigRef {
            kind: ConfigKind::VirtualService,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn scope(attached: &[&str], status_writer: bool) -> StatusScope {
        StatusScope {
            control_namespace: "meshplane-blue".into(),
            members: meshplane_contracts::members::MembersData {
                members: ["shop", "cart"].iter().map(|s| s.to_string()).collect(),
                attached: attached.iter().map(|s| s.to_string()).collect(),
                status_writer,
                ..Default::default()
            },
        }
    }

    #[test]
    fn each_object_has_one_writer_and_a_lost_one_is_released() {
        let refused = Finding {
            reason: "ProviderUnavailable",
            message: "no provider".into(),
        };
        let current = Diagnostics {
            objects: BTreeMap::from([
                (obj("shop", "a"), (Some(1), vec![refused.clone()])),
                (obj("cart", "b"), (Some(1), vec![])),
                (obj("meshplane-blue", "c"), (Some(2), vec![])),
            ]),
        };
        let names = |steps: &[(ConfigRef, Step)]| {
            steps
                .iter()
                .map(|(o, s)| (o.name.clone(), matches!(s, Step::Write(_))))
                .collect::<Vec<_>>()
        };
        // The old revision: shop and the control namespace; the canary: cart only.
        let old = scope(&["shop"], true);
        let new = scope(&["cart"], false);
        let none = BTreeMap::new();
        assert_eq!(
            names(&steps(&current, &old, &none)),
            [("c".to_string(), true), ("a".to_string(), true)]
        );
        assert_eq!(
            names(&steps(&current, &new, &none)),
            [("b".to_string(), true)]
        );
        // Once written, a steady state writes nothing.
        let written: BTreeMap<ConfigRef, Verdict> = steps(&current, &old, &none)
            .into_iter()
            .filter_map(|(o, s)| match s {
                Step::Write(v) => Some((o, v)),
                Step::Release => None,
            })
            .collect();
        assert!(steps(&current, &old, &written).is_empty());
        // shop moves to the canary: the old revision releases a, the canary writes it.
        let old_after = scope(&[], true);
        assert_eq!(
            steps(&current, &old_after, &written),
            [(obj("shop", "a"), Step::Release)]
        );
        let new_after = scope(&["cart", "shop"], false);
        assert_eq!(
            names(&steps(&current, &new_after, &none)),
            [("b".to_string(), true), ("a".to_string(), true)]
        );
        // The release names the object and carries no status.
        let body = release_patch(&obj("shop", "a"));
        assert_eq!(body["metadata"]["name"], "a");
        assert!(body.get("status").is_none());
    }
}
