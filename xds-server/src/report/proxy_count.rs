//! This pod's connected proxy count, members-stale mark and refused-watches mark in the
//! revision's proxies ConfigMap (contract 3), which the operator sums into the
//! MeshControlPlane's status and turns into its `MembersStale` and `WatchesRefused` conditions.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use meshplane_contracts::proxies::{self, MembersStale, RefusedWatches};
use tokio::sync::watch;

/// What this pod reports next to its count: the source's marks (contract 3).
pub struct Marks {
    /// Since when and why the members in use are stale.
    pub members_stale: watch::Receiver<Option<MembersStale>>,
    /// The watches the API server refuses, which the pod serves without.
    pub refused_watches: watch::Receiver<Option<RefusedWatches>>,
}

/// Server-side-applies this pod's connected proxy count into `meshplane-R-proxies` (contract
/// 3), its members-stale mark while `marks.members_stale` holds one and its refused-watches
/// mark while `marks.refused_watches` holds one, whenever any changes, until `shutdown`.
/// Applying without a mark removes it (server-side apply drops a key its manager stops
/// applying).
pub async fn run(
    client: Client,
    control_namespace: String,
    revision: String,
    pod_name: String,
    mut count: watch::Receiver<usize>,
    marks: Marks,
    mut shutdown: watch::Receiver<bool>,
) {
    let Marks {
        members_stale: mut stale,
        refused_watches: mut refused,
    } = marks;
    let api: Api<ConfigMap> = Api::namespaced(client, &control_namespace);
    let name = proxies::configmap_name(&revision);
    let params = PatchParams::apply(&proxies::field_manager(&pod_name));
    type Reported = (usize, Option<MembersStale>, Option<RefusedWatches>);
    let mut reported: Option<Reported> = None;
    // Without a source (it ended), the count is still reported.
    let (mut stale_open, mut refused_open) = (true, true);
    loop {
        let current = (
            *count.borrow_and_update(),
            stale.borrow_and_update().clone(),
            refused.borrow_and_update().clone(),
        );
        if reported.as_ref() != Some(&current) {
            let data = proxies::entries(
                &pod_name,
                current.0 as u64,
                current.1.as_ref(),
                current.2.as_ref(),
            );
            let patch = serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": name, "namespace": control_namespace },
                "data": data,
            });
            match api.patch(&name, &params, &Patch::Apply(&patch)).await {
                Ok(_) => reported = Some(current),
                Err(e) => {
                    tracing::warn!(error = %e, configmap = %name, "cannot report proxy count, retrying");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(2)) => continue,
                        () = crate::ads::stream::shutting_down(&mut shutdown) => return,
                    }
                }
            }
        }
        tokio::select! {
            changed = count.changed() => if changed.is_err() { return },
            changed = async {
                match stale_open {
                    true => stale.changed().await,
                    false => std::future::pending().await,
                }
            } => stale_open = changed.is_ok(),
            changed = async {
                match refused_open {
                    true => refused.changed().await,
                    false => std::future::pending().await,
                }
            } => refused_open = changed.is_ok(),
            () = crate::ads::stream::shutting_down(&mut shutdown) => return,
        }
    }
}
