//! A workload's Envoy configuration as its instance renders it: the xds-server's own
//! `TenantIndex`, fed with the state's objects as its directory source would feed it, and the
//! proxy node the workload's sidecar presents (contract 7 of `docs/architecture.md`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use meshplane_crds::membership::Membership;
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::{names, MeshConfig};
use meshplane_xds_core::envoyfilter::PatchError;
use meshplane_xds_core::index::TenantIndex;
use meshplane_xds_core::model::{ProxyConfig, ProxyNode, SourceEvent};
use serde::Serialize;

use crate::state::{placement, MeshState, Placement};

/// Why a workload has no configuration to show.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("namespace {namespace:?} is rejected by revision {revision:?}: {message}")]
    Rejected {
        namespace: String,
        revision: String,
        message: String,
    },
    #[error("namespace {0:?} belongs to no tenant: label it {label}=<revision or tag> to join one", label = names::REV_LABEL)]
    NoTenant(String),
    #[error("namespace {0:?} is not in the state (no Namespace object)")]
    NoNamespace(String),
}

/// A workload as meshctl renders it: a Pod, or labels in a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub name: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub ip: Option<String>,
    pub capture_mode: CaptureMode,
    /// The revision that injected it (its `sidecar.meshplane.io/revision` annotation).
    pub injected_by: Option<String>,
}

impl Workload {
    /// The workload of a Pod.
    pub fn from_pod(pod: &Pod) -> Self {
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let capture_mode = match annotations
            .get(names::CAPTURE_MODE_ANNOTATION)
            .and_then(|v| meshplane_webhooks::inject::CaptureMode::parse(v))
        {
            Some(meshplane_webhooks::inject::CaptureMode::None) => CaptureMode::None,
            _ => CaptureMode::Default,
        };
        Workload {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            capture_mode,
            injected_by: annotations
                .get(names::INJECTED_REVISION_ANNOTATION)
                .cloned(),
        }
    }

    /// A workload with `labels` in `namespace` that does not exist yet.
    pub fn hypothetical(namespace: &str, labels: BTreeMap<String, String>) -> Self {
        Workload {
            namespace: namespace.to_string(),
            name: None,
            labels,
            ip: None,
            capture_mode: CaptureMode::Default,
            injected_by: None,
        }
    }

    /// `namespace/name`, or `namespace/{labels}` for a hypothetical workload.
    pub fn describe(&self) -> String {
        match &self.name {
            Some(name) => format!("{}/{name}", self.namespace),
            None => {
                let labels: Vec<String> = self
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!("{}/{{{}}}", self.namespace, labels.join(","))
            }
        }
    }

    /// The node its sidecar presents on the ADS stream (contract 7): node id
    /// `sidecar~IP~POD.NS~NS.svc.cluster.local`, labels from the Pod.
    pub fn node(&self) -> ProxyNode {
        let name = self.name.clone().unwrap_or_else(|| "workload".to_string());
        let ip = self.ip.clone().unwrap_or_else(|| "0.0.0.0".to_string());
        ProxyNode {
            kind: meshplane_xds_core::model::ProxyKind::Sidecar,
            id: format!(
                "sidecar~{ip}~{name}.{ns}~{ns}.svc.cluster.local",
                ns = self.namespace
            ),
            namespace: self.namespace.clone(),
            pod_name: self.name.clone(),
            ip: self.ip.clone(),
            labels: self.labels.clone(),
            capture_mode: self.capture_mode,
            loopback: None,
            sds: false,
            service_account: None,
            readable_credentials: None,
        }
    }
}

/// The revision serving a workload and where its namespace belongs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Serving {
    /// Where the namespace belongs now.
    pub placement: Placement,
    /// The revision whose instance programs the workload's proxy: the one that injected it while
    /// it is still a revision of the tenant (pods keep their revision until restarted), else the
    /// namespace's.
    pub revision: String,
}

/// Which revision serves `workload`.
pub fn serving(
    state: &MeshState,
    membership: &Membership,
    workload: &Workload,
) -> Result<Serving, RenderError> {
    let labels = state
        .namespace_labels(&workload.namespace)
        .ok_or_else(|| RenderError::NoNamespace(workload.namespace.clone()))?;
    let Some(placement) = placement(membership, &labels, &workload.namespace) else {
        return Err(match membership.rejected.get(&workload.namespace) {
            Some(r) => RenderError::Rejected {
                namespace: workload.namespace.clone(),
                revision: r.revision.clone().unwrap_or_else(|| r.label.clone()),
                message: r.message.clone(),
            },
            None => RenderError::NoTenant(workload.namespace.clone()),
        });
    };
    let revision = workload
        .injected_by
        .as_ref()
        .filter(|r| {
            membership
                .revisions
                .get(*r)
                .is_some_and(|m| m.tenant == placement.tenant)
        })
        .cloned()
        .unwrap_or_else(|| placement.revision.clone());
    Ok(Serving {
        placement,
        revision,
    })
}

/// The index revision `revision` of `tenant` builds from the state: every object, delivered as
/// one directory-source resync. The index keeps only the tenant's namespaces.
pub fn tenant_index(
    state: &MeshState,
    tenant: &str,
    revision: &str,
    control_namespace: &str,
) -> TenantIndex {
    let mut index = TenantIndex::new(tenant, revision, control_namespace, MeshConfig::default());
    index.apply(SourceEvent::Resync {
        namespace: None,
        kinds: meshplane_xds_core::model::Kind::ALL.to_vec(),
    });
    for object in state.objects() {
        index.apply(SourceEvent::Upsert(object.clone()));
    }
    index.apply(SourceEvent::Synced);
    index
}

/// A workload's configuration, with the EnvoyFilter patches that did not apply.
pub struct Rendered {
    pub serving: Serving,
    pub node: ProxyNode,
    pub config: ProxyConfig,
    pub patch_errors: Vec<PatchError>,
    pub index: TenantIndex,
}

/// Renders `workload` as the instance serving it would.
pub fn render(
    state: &MeshState,
    membership: &Membership,
    workload: &Workload,
) -> Result<Rendered, RenderError> {
    let serving = serving(state, membership, workload)?;
    let index = tenant_index(
        state,
        &serving.placement.tenant,
        &serving.revision,
        &serving.placement.control_namespace,
    );
    let node = workload.node();
    let (config, patch_errors) = index.render_checked(&node);
    Ok(Rendered {
        serving,
        node,
        config,
        patch_errors,
        index,
    })
}
