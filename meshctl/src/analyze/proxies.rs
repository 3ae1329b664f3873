//! Proxies, from what the instances report (cluster only): NACKs, and sidecars of running pods
//! that no instance of their tenant has connected.

use std::collections::BTreeSet;

use meshplane_crds::names;

use super::codes;
use super::Finding;
use crate::instances::{Instance, SyncState};
use crate::state::MeshState;

/// Findings about proxies; `instances` are every instance read (of every revision).
pub fn check(state: &MeshState, instances: &[Instance]) -> Vec<Finding> {
    let mut out = Vec::new();
    for i in instances {
        for p in &i.proxies {
            for t in &p.types {
                if t.state() != SyncState::Nacked {
                    continue;
                }
                let (version, nack) = t
                    .last_nack
                    .as_ref()
                    .map(|n| (n.version.as_str(), n.message.as_str()))
                    .unwrap_or(("?", ""));
                let object = match &p.pod_name {
                    Some(pod) => format!("Pod {}/{pod}", p.namespace),
                    None => format!("Proxy {}", p.id),
                };
                out.push(Finding::new(
                    codes::PROXY_NACKED,
                    object,
                    format!(
                        "its proxy rejected {} version {} from instance {} (revision {}): {nack}",
                        t.type_name, version, i.pod, i.revision
                    ),
                ));
            }
        }
    }
    // Connected (tenant, namespace, pod) across the tenant's instances.
    let connected: BTreeSet<(String, String, String)> = instances
        .iter()
        .flat_map(|i| {
            i.proxies.iter().filter_map(move |p| {
                Some((i.tenant.clone(), p.namespace.clone(), p.pod_name.clone()?))
            })
        })
        .collect();
    // A tenant whose instances could not all be read is not judged.
    let unread: BTreeSet<&str> = instances
        .iter()
        .filter(|i| i.error.is_some())
        .map(|i| i.tenant.as_str())
        .collect();
    let membership = state.membership();
    for pod in state.pods() {
        let Some(revision) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::INJECTED_REVISION_ANNOTATION))
        else {
            continue;
        };
        let status = pod.status.as_ref();
        let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
        // Containers that have not all started yet are not expected to be connected.
        let started = status
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.started.unwrap_or(false)));
        if !running || !started || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(tenant) = membership.revisions.get(revision).map(|r| r.tenant.clone()) else {
            continue; // MP0604 says it.
        };
        if unread.contains(tenant.as_str()) || !instances.iter().any(|i| i.tenant == tenant) {
            continue;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        if !connected.contains(&(tenant.clone(), ns.clone(), name.clone())) {
            out.push(Finding::new(
                codes::PROXY_NOT_CONNECTED,
                format!("Pod {ns}/{name}"),
                format!(
                    "its sidecar (revision {revision:?}) is running but connected to no instance of tenant {tenant:?}"
                ),
            ));
        }
    }
    out
}
