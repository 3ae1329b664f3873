//! Pure status of `MeshControlPlane` and `MeshRevisionTag`: conditions (with stable transition
//! times), member and rejected lists bounded for etcd, connected proxies.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use meshplane_contracts::proxies::{self, MembersStale, ProxyCounts, RefusedWatches};
use meshplane_contracts::Data;
use meshplane_crds::controlplane::{
    NamespaceList, RejectedNamespace, RejectedNamespaces, STATUS_NAME_LIMIT,
};
use meshplane_crds::membership::{Conflict, RevisionMembership, TagResolution};
use meshplane_crds::{
    MeshControlPlane, MeshControlPlaneStatus, MeshRevisionTag, MeshRevisionTagStatus,
};
use serde_json::Value;

use crate::webhook_probe::ProbeResult;

/// Condition types.
pub mod types {
    pub const READY: &str = "Ready";
    pub const RECONCILED: &str = "Reconciled";
    pub const WEBHOOKS_READY: &str = "WebhooksReady";
    pub const DEGRADED: &str = "Degraded";
    pub const IN_USE: &str = "InUse";
    pub const MEMBERS_STALE: &str = "MembersStale";
    pub const WATCHES_REFUSED: &str = "WatchesRefused";
}

/// Reason of `MembersStale=True`: some instance pod serves the members it last read.
pub const MEMBERS_STALE_REASON: &str = "LastKnownMembers";

/// Reason of `WatchesRefused=True`: the API server refuses some instance pod reads (403), and
/// the pod serves without those objects.
pub const WATCHES_REFUSED_REASON: &str = "ReadAccessRefused";

/// A condition without its transition time, which [`merge_conditions`] fills in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionSpec {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl ConditionSpec {
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.to_string(),
            message: message.into(),
        }
    }
}

/// Builds conditions, keeping `lastTransitionTime` of those whose status did not change (so a
/// steady state produces an identical status and no write).
pub fn merge_conditions(
    existing: &[Condition],
    wanted: &[ConditionSpec],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    wanted
        .iter()
        .map(|w| {
            let status = if w.status { "True" } else { "False" }.to_string();
            let since = existing
                .iter()
                .find(|c| c.type_ == w.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: w.type_.to_string(),
                status,
                reason: w.reason.clone(),
                message: w.message.clone(),
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

/// A counted list with at most [`STATUS_NAME_LIMIT`] names.
pub fn bounded(names: &BTreeSet<String>) -> NamespaceList {
    NamespaceList {
        count: i32::try_from(names.len()).unwrap_or(i32::MAX),
        names: names.iter().take(STATUS_NAME_LIMIT).cloned().collect(),
    }
}

/// The proxies ConfigMap's data (contract 3) as text; values that are not text are dropped.
fn proxies_data(proxies_configmap: Option<&Value>) -> Option<Data> {
    let data = proxies_configmap?.get("data")?.as_object()?;
    Some(
        data.iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
    )
}

/// The proxies ConfigMap read by contract 3, what breaks it ignored (and logged).
fn proxy_counts(proxies_configmap: Option<&Value>) -> Option<ProxyCounts> {
    let (counts, errors) = ProxyCounts::read(&proxies_data(proxies_configmap)?);
    for e in errors {
        tracing::debug!(error = %e, "ignoring a value of the proxies ConfigMap");
    }
    Some(counts)
}

/// Sum of the per-pod counts in the proxies ConfigMap's data (contract 3) over the instance
/// pods that exist (`live`): a key left behind by a pod that is gone (a rollout, a crash) does
/// not count. Values that are not counts are ignored.
pub fn connected_proxies(
    proxies_configmap: Option<&Value>,
    live: &BTreeSet<String>,
) -> Option<i32> {
    let total = proxy_counts(proxies_configmap)?.total(live);
    Some(i32::try_from(total).unwrap_or(i32::MAX))
}

/// Keys of the proxies ConfigMap left by instance pods that are gone (not in `live`), their
/// counts and members-stale marks, which the reconcile removes.
pub fn stale_proxy_keys(proxies_configmap: Option<&Value>, live: &BTreeSet<String>) -> Vec<String> {
    proxies_data(proxies_configmap)
        .map(|data| proxies::keys_left_behind(&data, live))
        .unwrap_or_default()
}

/// The instance pods in `live` that report serving stale members (contract 3), with their
/// marks.
pub fn members_stale(
    proxies_configmap: Option<&Value>,
    live: &BTreeSet<String>,
) -> Vec<(String, MembersStale)> {
    proxy_counts(proxies_configmap)
        .map(|counts| {
            counts
                .members_stale_of(live)
                .map(|(pod, mark)| (pod.to_string(), mark.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The `MembersStale` condition: True, naming each instance pod, since when and why, while
/// any serves the members it last read; False otherwise.
pub fn members_stale_condition(stale: &[(String, MembersStale)]) -> ConditionSpec {
    if stale.is_empty() {
        return ConditionSpec::new(
            types::MEMBERS_STALE,
            false,
            "MembersCurrent",
            "every instance pod serves the members ConfigMap as the operator wrote it",
        );
    }
    let pods = stale
        .iter()
        .map(|(pod, mark)| format!("{pod} since {} ({})", mark.since, mark.reason))
        .collect::<Vec<_>>()
        .join("; ");
    ConditionSpec::new(
        types::MEMBERS_STALE,
        true,
        MEMBERS_STALE_REASON,
        format!(
            "instance pods serve the last members they could read (nobody is evicted, no namespace joins or leaves) until the members ConfigMap is readable again: {pods}"
        ),
    )
}

/// The instance pods in `live` that serve without what the API server refuses them to read
/// (contract 3), with what they cannot read.
pub fn refused_watches(
    proxies_configmap: Option<&Value>,
    live: &BTreeSet<String>,
) -> Vec<(String, RefusedWatches)> {
    proxy_counts(proxies_configmap)
        .map(|counts| {
            counts
                .refused_watches_of(live)
                .map(|(pod, mark)| (pod.to_string(), mark.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The `WatchesRefused` condition: True, naming each instance pod and the namespaces and kinds
/// it cannot read, while any serves without them; False otherwise.
pub fn watches_refused_condition(refused: &[(String, RefusedWatches)]) -> ConditionSpec {
    if refused.is_empty() {
        return ConditionSpec::new(
            types::WATCHES_REFUSED,
            false,
            "AllWatchesListed",
            "every instance pod reads every namespace and kind it watches",
        );
    }
    let pods = refused
        .iter()
        .map(|(pod, mark)| format!("{pod} cannot read {mark}"))
        .collect::<Vec<_>>()
        .join("; ");
    ConditionSpec::new(
        types::WATCHES_REFUSED,
        true,
        WATCHES_REFUSED_REASON,
        format!(
            "the API server refuses (403) instance pods some reads (namespace/kind); they serve without those objects until access returns (a member namespace's reader RoleBinding removed or changed, say): {pods}"
        ),
    )
}

/// What the reconcile observed about the instance, for the status.
#[derive(Clone, Debug, Default)]
pub struct InstanceFacts {
    /// The Deployment reports at least one available replica.
    pub deployment_available: bool,
    /// Both webhook configurations are in place with the current caBundle.
    pub webhooks_applied: bool,
    /// Sum of connected proxies from the proxies ConfigMap.
    pub connected_proxies: Option<i32>,
    /// Instance pods that serve stale members, from the proxies ConfigMap.
    pub members_stale: Vec<(String, MembersStale)>,
    /// Instance pods that serve without what the API server refuses them, from the proxies
    /// ConfigMap.
    pub refused_watches: Vec<(String, RefusedWatches)>,
    /// What the probe of the revision's validating webhook found (None: not probed, the
    /// instance or its webhook configurations are not in place).
    pub webhook_probe: Option<crate::webhook_probe::ProbeResult>,
    /// Objects we wanted to write but that belong to someone else.
    pub foreign_objects: Vec<String>,
    /// Why the tenant CA could not be kept as asked (it keeps the CA it has).
    pub ca_problem: Option<String>,
    /// Why the requested ingress gateway is not run, if it is not.
    pub gateway_problem: Option<String>,
}

/// Reason of the Degraded condition when the tenant's plugged-in CA is missing or unusable.
pub const CA_INVALID_REASON: &str = "CertificateAuthorityInvalid";

/// Whether an observed Deployment has an available replica.
pub fn deployment_available(deployment: Option<&Value>) -> bool {
    let Some(d) = deployment else { return false };
    let by_condition = d
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Available")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
    let by_count = d
        .pointer("/status/availableReplicas")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        > 0;
    by_condition || by_count
}

fn base_status(mcp: &MeshControlPlane) -> MeshControlPlaneStatus {
    MeshControlPlaneStatus {
        observed_generation: mcp.metadata.generation,
        revision: Some(mcp.revision()),
        control_namespace: Some(mcp.control_namespace()),
        // Recorded when the operator created the namespace; a conflict does not forget it.
        control_namespace_uid: mcp
            .status
            .as_ref()
            .and_then(|s| s.control_namespace_uid.clone()),
        ..Default::default()
    }
}

fn existing_conditions(mcp: &MeshControlPlane) -> &[Condition] {
    mcp.status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[])
}

/// Status of a control plane that conflicts: Degraded with the conflict's reason, nothing else
/// claimed. Membership lists keep their last values so `kubectl get` does not flap to zero.
pub fn conflicted_status(
    mcp: &MeshControlPlane,
    conflicts: &[&Conflict],
    now: &Time,
) -> MeshControlPlaneStatus {
    let first = conflicts.first();
    let reason = first.map(|c| c.reason()).unwrap_or("Conflict");
    let message = conflicts
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join("; ");
    let wanted = [
        ConditionSpec::new(
            types::READY,
            false,
            reason,
            "the revision is in conflict; nothing is changed for it",
        ),
        ConditionSpec::new(types::RECONCILED, false, reason, message.clone()),
        ConditionSpec::new(
            types::WEBHOOKS_READY,
            false,
            reason,
            "the revision is in conflict",
        ),
        ConditionSpec::new(types::DEGRADED, true, reason, message),
    ];
    let previous = mcp.status.clone().unwrap_or_default();
    MeshControlPlaneStatus {
        conditions: merge_conditions(
            existing_conditions(mcp),
            &wanted,
            mcp.metadata.generation,
            now,
        ),
        members: previous.members,
        rejected: previous.rejected,
        tags: previous.tags,
        connected_proxies: previous.connected_proxies,
        ..base_status(mcp)
    }
}

/// Status of an active control plane.
pub fn active_status(
    mcp: &MeshControlPlane,
    rev: &RevisionMembership,
    facts: &InstanceFacts,
    now: &Time,
) -> MeshControlPlaneStatus {
    let ready = facts.deployment_available;
    let mut wanted = vec![
        if ready {
            ConditionSpec::new(
                types::READY,
                true,
                "DeploymentAvailable",
                "the instance Deployment has an available replica",
            )
        } else {
            ConditionSpec::new(
                types::READY,
                false,
                "DeploymentUnavailable",
                "waiting for the instance Deployment to become available",
            )
        },
        if facts.foreign_objects.is_empty() {
            ConditionSpec::new(
                types::RECONCILED,
                true,
                "Applied",
                "every desired object is in place",
            )
        } else {
            ConditionSpec::new(
                types::RECONCILED,
                false,
                "ObjectOwnedElsewhere",
                format!(
                    "left alone because another owner holds them: {}",
                    facts.foreign_objects.join(", ")
                ),
            )
        },
        match (&facts.webhook_probe, facts.webhooks_applied && ready) {
            (Some(ProbeResult::Serving), true) => ConditionSpec::new(
                types::WEBHOOKS_READY,
                true,
                "Serving",
                "the API server reached the revision's validating webhook (dry-run probe)",
            ),
            (Some(ProbeResult::Failed(why)), true) => ConditionSpec::new(
                types::WEBHOOKS_READY,
                false,
                "ProbeFailed",
                format!("the dry-run probe of the validating webhook failed: {why}"),
            ),
            _ => ConditionSpec::new(
                types::WEBHOOKS_READY,
                false,
                "WaitingForInstance",
                "the webhooks are configured but the instance is not available yet",
            ),
        },
    ];
    wanted.push(members_stale_condition(&facts.members_stale));
    wanted.push(watches_refused_condition(&facts.refused_watches));
    wanted.push(if let Some(problem) = &facts.ca_problem {
        ConditionSpec::new(types::DEGRADED, true, CA_INVALID_REASON, problem.clone())
    } else if let Some(problem) = &facts.gateway_problem {
        ConditionSpec::new(
            types::DEGRADED,
            true,
            "GatewayNamespaceNotInTenant",
            problem.clone(),
        )
    } else if facts.foreign_objects.is_empty() {
        ConditionSpec::new(types::DEGRADED, false, "AsExpected", "no conflict")
    } else {
        ConditionSpec::new(
            types::DEGRADED,
            true,
            "ObjectOwnedElsewhere",
            "some objects could not be written",
        )
    });
    let rejected: Vec<RejectedNamespace> = rev
        .rejected
        .iter()
        .take(STATUS_NAME_LIMIT)
        .map(|(name, r)| RejectedNamespace {
            name: name.clone(),
            reason: r.reason.as_str().to_string(),
            message: r.message.clone(),
        })
        .collect();
    MeshControlPlaneStatus {
        conditions: merge_conditions(
            existing_conditions(mcp),
            &wanted,
            mcp.metadata.generation,
            now,
        ),
        members: Some(bounded(&rev.attached)),
        rejected: Some(RejectedNamespaces {
            count: i32::try_from(rev.rejected.len()).unwrap_or(i32::MAX),
            namespaces: rejected,
        }),
        tags: rev.tags.iter().cloned().collect(),
        connected_proxies: facts.connected_proxies,
        ..base_status(mcp)
    }
}

/// Status of a control plane waiting for its injected pods to go before deletion.
pub fn in_use_status(mcp: &MeshControlPlane, pods: usize, now: &Time) -> MeshControlPlaneStatus {
    let mut status = mcp.status.clone().unwrap_or_else(|| base_status(mcp));
    let mut conditions: Vec<Condition> = status
        .conditions
        .iter()
        .filter(|c| c.type_ != types::IN_USE)
        .cloned()
        .collect();
    let wanted = [ConditionSpec::new(
        types::IN_USE,
        true,
        "InUse",
        format!(
            "deletion waits: {pods} pod(s) injected by this revision still run; restart them on another revision, or annotate meshplane.io/force-delete=\"true\""
        ),
    )];
    conditions.extend(merge_conditions(
        existing_conditions(mcp),
        &wanted,
        mcp.metadata.generation,
        now,
    ));
    status.conditions = conditions;
    status
}

/// Status of a tag.
pub fn tag_status(
    tag: &MeshRevisionTag,
    resolution: Option<&TagResolution>,
    conflicts: &[&Conflict],
    now: &Time,
) -> MeshRevisionTagStatus {
    let existing = tag
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let resolved = resolution.and_then(|r| r.revision.clone());
    let mut wanted = match (conflicts.first(), &resolved) {
        (Some(c), _) => {
            let message = conflicts
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            vec![
                ConditionSpec::new(
                    types::READY,
                    resolved.is_some(),
                    c.reason(),
                    message.clone(),
                ),
                ConditionSpec::new(types::DEGRADED, true, c.reason(), message),
            ]
        }
        (None, Some(r)) => vec![
            ConditionSpec::new(
                types::READY,
                true,
                "Resolved",
                format!("namespaces labelled with this tag join revision {r:?}"),
            ),
            ConditionSpec::new(types::DEGRADED, false, "AsExpected", "no conflict"),
        ],
        (None, None) => vec![
            ConditionSpec::new(
                types::READY,
                false,
                "RevisionNotFound",
                "the tag resolves to no revision",
            ),
            ConditionSpec::new(
                types::DEGRADED,
                true,
                "RevisionNotFound",
                "the tag resolves to no revision",
            ),
        ],
    };
    // InUse, as the Sail Operator shows it: whether any namespace carries the tag.
    let users = resolution.map_or(0, |r| r.namespaces.len());
    wanted.push(if users > 0 {
        ConditionSpec::new(
            types::IN_USE,
            true,
            "NamespacesLabelled",
            format!("{users} namespaces are labelled with this tag"),
        )
    } else {
        ConditionSpec::new(
            types::IN_USE,
            false,
            "NoNamespaces",
            "no namespace is labelled with this tag",
        )
    });
    let previous = tag.status.clone().unwrap_or_default();
    MeshRevisionTagStatus {
        observed_generation: tag.metadata.generation,
        // Keep the last accepted resolution while the tag resolves nowhere: the tenant is sticky.
        revision: resolved.or(previous.revision),
        tenant: resolution
            .and_then(|r| r.tenant.clone())
            .or(previous.tenant),
        conditions: merge_conditions(existing, &wanted, tag.metadata.generation, now),
        members: resolution.map(|r| bounded(&r.namespaces)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_changes_only_when_the_status_flips() {
        let want_true = [ConditionSpec::new(types::READY, true, "A", "a")];
        let first = merge_conditions(&[], &want_true, Some(1), &at(100));
        let again = merge_conditions(&first, &want_true, Some(1), &at(200));
        assert_eq!(first, again);
        let flipped = merge_conditions(
            &again,
            &[ConditionSpec::new(types::READY, false, "B", "b")],
            Some(1),
            &at(300),
        );
        assert_eq!(flipped[0].last_transition_time, at(300));
    }

    #[test]
    fn lists_are_bounded_but_counts_exact_and_proxies_summed() {
        let many: BTreeSet<String> = (0..120).map(|i| format!("ns-{i:03}")).collect();
        let l = bounded(&many);
        assert_eq!(l.count, 120);
        assert_eq!(l.names.len(), STATUS_NAME_LIMIT);
        let cm = json!({"data": {"pod-a": "3", "pod-b": "4", "junk": "x", "pod-gone": "9"}});
        let live: BTreeSet<String> = ["pod-a", "pod-b", "junk"].map(String::from).into();
        assert_eq!(connected_proxies(Some(&cm), &live), Some(7));
        assert_eq!(stale_proxy_keys(Some(&cm), &live), ["pod-gone"]);
        assert_eq!(connected_proxies(Some(&json!({})), &live), None);
        assert_eq!(
            connected_proxies(Some(&cm), &BTreeSet::new()),
            Some(0),
            "no instance pod, no proxy"
        );
    }

    /// An instance pod's members-stale mark (contract 3) becomes
    /// `MembersStale=True` naming the pod, since when and why; a gone pod's mark counts for
    /// nothing and is removed with its count.
    #[test]
    fn members_stale_marks_of_live_pods_become_the_condition() {
        let cm = json!({"data": {
            "xds-a": "3", "xds-a.members-stale": "2026-12-02T03:40:00Z the members ConfigMap was deleted",
            "xds-b": "1",
            "xds-gone": "9", "xds-gone.members-stale": "2026-12-01T00:00:00Z old",
            "xds-b.members-stale": "not a mark",
        }});
        let live: BTreeSet<String> = ["xds-a", "xds-b"].map(String::from).into();
        assert_eq!(connected_proxies(Some(&cm), &live), Some(4));
        assert_eq!(
            stale_proxy_keys(Some(&cm), &live),
            ["xds-gone", "xds-gone.members-stale"]
        );
        let stale = members_stale(Some(&cm), &live);
        assert_eq!(stale.len(), 1, "{stale:?}");
        let c = members_stale_condition(&stale);
        assert!(c.status);
        assert_eq!(c.reason, MEMBERS_STALE_REASON);
        assert!(
            c.message
                .contains("xds-a since 2026-12-02T03:40:00Z (the members ConfigMap was deleted)"),
            "{}",
            c.message
        );
        let fresh = members_stale_condition(&members_stale(
            Some(&json!({"data": {"xds-a": "3"}})),
            &live,
        ));
        assert!(!fresh.status);
        assert_eq!(fresh.type_, types::MEMBERS_STALE);
    }

    /// An instance pod's refused-watches mark (contract 3) becomes `WatchesRefused=True`
    /// naming the pod and each namespace/kind it cannot read; a gone pod's mark counts for
    /// nothing and is removed with its count; a broken mark is ignored.
    #[test]
    fn refused_watches_marks_of_live_pods_become_the_condition() {
        let cm = json!({"data": {
            "xds-a": "3", "xds-a.refused-watches": "bank/EndpointSlice\nbank/Service",
            "xds-b": "1", "xds-b.refused-watches": "not a mark",
            "xds-gone": "9", "xds-gone.refused-watches": "shop/Service",
        }});
        let live: BTreeSet<String> = ["xds-a", "xds-b"].map(String::from).into();
        assert_eq!(connected_proxies(Some(&cm), &live), Some(4));
        assert_eq!(
            stale_proxy_keys(Some(&cm), &live),
            ["xds-gone", "xds-gone.refused-watches"]
        );
        let refused = refused_watches(Some(&cm), &live);
        assert_eq!(refused.len(), 1, "{refused:?}");
        let c = watches_refused_condition(&refused);
        assert!(c.status);
        assert_eq!(c.type_, types::WATCHES_REFUSED);
        assert_eq!(c.reason, WATCHES_REFUSED_REASON);
        assert!(
            c.message
                .contains("xds-a cannot read bank/EndpointSlice, bank/Service"),
            "{}",
            c.message
        );
        assert!(c.message.contains("serve without"), "{}", c.message);
        assert!(!c.message.contains("xds-gone"), "{}", c.message);
        let listed = watches_refused_condition(&refused_watches(
            Some(&json!({"data": {"xds-a": "3"}})),
            &live,
        ));
        assert!(!listed.status);
        assert_eq!(listed.type_, types::WATCHES_REFUSED);
    }

    #[test]
    fn deployment_availability() {
        assert!(deployment_available(Some(
            &json!({"status": {"availableReplicas": 1}})
        )));
        assert!(deployment_available(Some(
            &json!({"status": {"conditions": [{"type": "Available", "status": "True"}]}})
        )));
        assert!(!deployment_available(Some(
            &json!({"status": {"replicas": 1}})
        )));
        assert!(!deployment_available(None));
    }

    #[test]
    fn a_tags_in_use_condition_follows_the_namespaces_carrying_it() {
        let tag = MeshRevisionTag::new(
            "blue-stable",
            meshplane_crds::MeshRevisionTagSpec {
                revision: "blue-v1".into(),
            },
        );
        let in_use = |namespaces: &[&str]| {
            let resolution = TagResolution {
                revision: Some("blue-v1".into()),
                tenant: Some("blue".into()),
                namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            };
            let status = tag_status(&tag, Some(&resolution), &[], &at(100));
            let c = status
                .conditions
                .iter()
                .find(|c| c.type_ == types::IN_USE)
                .cloned()
                .expect("InUse condition");
            (c.status, c.reason)
        };
        assert_eq!(
            in_use(&["shop", "pay"]),
            ("True".into(), "NamespacesLabelled".into())
        );
        assert_eq!(in_use(&[]), ("False".into(), "NoNamespaces".into()));
    }
}

#[cfg(test)]
mod webhooks_ready {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn webhooks_ready(probe: Option<ProbeResult>) -> (String, String, String) {
        let mcp: MeshControlPlane = serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": "blue-v1", "generation": 1},
            "spec": {"tenant": "blue"},
        }))
        .expect("control plane");
        let facts = InstanceFacts {
            deployment_available: true,
            webhooks_applied: true,
            webhook_probe: probe,
            ..InstanceFacts::default()
        };
        let now = Time(Timestamp::from_second(1_800_000_000).expect("time"));
        let status = active_status(&mcp, &RevisionMembership::default(), &facts, &now);
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == types::WEBHOOKS_READY)
            .expect("WebhooksReady");
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    /// An available Deployment with its webhook configurations in place is not enough: the
    /// probe through the API server decides.
    #[test]
    fn webhooks_ready_follows_the_probe_not_the_deployment() {
        let (status, reason, _) = webhooks_ready(Some(ProbeResult::Serving));
        assert_eq!((status.as_str(), reason.as_str()), ("True", "Serving"));
        let (status, reason, message) = webhooks_ready(Some(ProbeResult::Failed(
            "failed calling webhook: connection refused".into(),
        )));
        assert_eq!((status.as_str(), reason.as_str()), ("False", "ProbeFailed"));
        assert!(message.contains("connection refused"), "{message}");
        let (status, _, _) = webhooks_ready(None);
        assert_eq!(status, "False", "not probed is not ready");
    }
}
