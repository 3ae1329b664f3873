//! This pod's connected proxy count and members-stale mark in the revision's proxies
//! ConfigMap (contract 3), which the operator sums into the MeshControlPlane's status.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use meshplane_contracts::proxies::{self, MembersStale};
use tokio::sync::watch;

/// Server-side-applies this pod's connected proxy count into `meshplane-R-proxies` (contract
/// 3), and its members-stale mark while `stale` holds one, whenever either changes, until
/// `shutdown`. Applying without the mark removes it (server-side apply drops a key its
/// manager stops applying).
pub async fn run(
    client: Client,
    control_namespace: String,
    revision: String,
    pod_name: String,
    mut count: watch::Receiver<usize>,
    mut stale: watch::Receiver<Option<MembersStale>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &control_namespace);
    let name = proxies::configmap_name(&revision);
    let params = PatchParams::apply(&proxies::field_manager(&pod_name));
    let mut reported: Option<(usize, Option<MembersStale>)> = None;
    // Without a source (it ended), the count is still reported.
    let mut stale_open = true;
    loop {
        let current = (
            *count.borrow_and_update(),
            stale.borrow_and_update().clone(),
        );
        if reported.as_ref() != Some(&current) {
            let data = proxies::entries(&pod_name, current.0 as u64, current.1.as_ref());
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
            () = crate::ads::stream::shutting_down(&mut shutdown) => return,
        }
    }
}
