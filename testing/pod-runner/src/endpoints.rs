//! The EndpointSlice controller part of the runner: one slice per Service with a selector,
//! listing the matching pods (ready or not, as the real controller does) with ports resolved
//! from the Service's targetPort. The runner's kube-proxy part reads the slices back.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::deployments::pod_ready;
use super::error::PodRunnerError;

/// Label linking a slice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
const FIELD_MANAGER: &str = "meshplane-pod-runner";

/// Writes EndpointSlices.
#[derive(Debug, Default)]
pub struct EndpointController {
    /// Last slice written per Service uid.
    written: BTreeMap<String, Value>,
    last_errors: BTreeMap<String, String>,
}

impl EndpointController {
    /// Reconciles every Service's slice.
    pub async fn reconcile_all(
        &mut self,
        client: &Client,
        services: &[Arc<Service>],
        pods: &[Arc<Pod>],
    ) {
        let mut live = Vec::new();
        for service in services {
            let uid = service.metadata.uid.clone().unwrap_or_default();
            live.push(uid.clone());
            let selected = selected_pods(service, pods);
            let Some(slice) = endpoint_slice(service, &selected) else {
                continue;
            };
            if self.written.get(&uid) == Some(&slice) {
                continue;
            }
            let key = format!(
                "{}/{}",
                service.metadata.namespace.as_deref().unwrap_or_default(),
                service.metadata.name.as_deref().unwrap_or_default()
            );
            match apply_slice(client, &slice).await {
                Ok(()) => {
                    self.last_errors.remove(&key);
                    self.written.insert(uid, slice);
                }
                Err(error) => {
                    let message = error.to_string();
                    if self.last_errors.get(&key) != Some(&message) {
                        tracing::warn!(service = %key, %message, "cannot write EndpointSlice");
                        self.last_errors.insert(key, message);
                    }
                }
            }
        }
        // Slices of deleted Services go with them by owner-reference GC.
        self.written.retain(|uid, _| live.contains(uid));
    }
}

async fn apply_slice(client: &Client, slice: &Value) -> Result<(), PodRunnerError> {
    let namespace = slice["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = slice["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(slice),
    )
    .await
    .map_err(|e| PodRunnerError::api(format!("apply EndpointSlice {namespace}/{name}"), e))?;
    Ok(())
}

fn selected_pods<'a>(service: &Service, pods: &'a [Arc<Pod>]) -> Vec<&'a Arc<Pod>> {
    let Some(selector) = service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
    else {
        return Vec::new();
    };
    let mut selected: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| p.metadata.namespace == service.metadata.namespace)
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| pod_ip(p).is_some())
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| {
            let labels = p.metadata.labels.as_ref();
            selector
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .collect();
    selected.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    selected
}

fn pod_ip(pod: &Pod) -> Option<Ipv4Addr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

/// The port a Service port's targetPort means on `pod`.
fn target_port(port: &ServicePort, pod: &Pod) -> Option<u16> {
    match &port.target_port {
        None => u16::try_from(port.port).ok(),
        Some(IntOrString::Int(number)) => u16::try_from(*number).ok(),
        Some(IntOrString::String(name)) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// The slice for `service`, or None when it has no selector (its endpoints are managed by hand).
fn endpoint_slice(service: &Service, pods: &[&Arc<Pod>]) -> Option<Value> {
    let spec = service.spec.as_ref()?;
    spec.selector.as_ref().filter(|s| !s.is_empty())?;
    let namespace = service.metadata.namespace.clone()?;
    let name = service.metadata.name.clone()?;
    let uid = service.metadata.uid.clone().unwrap_or_default();
    let ports: Vec<Value> = spec
        .ports
        .iter()
        .flatten()
        .map(|port| {
            let number = pods.iter().find_map(|p| target_port(port, p));
            json!({"name": port.name.clone().unwrap_or_default(), "protocol": port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                   "port": number, "appProtocol": port.app_protocol})
        })
        .collect();
    let endpoints: Vec<Value> = pods
        .iter()
        .filter_map(|p| {
            let ready = pod_ready(p);
            Some(json!({
                "addresses": [pod_ip(p)?.to_string()],
                "conditions": {"ready": ready, "serving": ready, "terminating": false},
                "targetRef": {"kind": "Pod", "namespace": namespace, "name": p.metadata.name, "uid": p.metadata.uid},
                "nodeName": "local",
            }))
        })
        .collect();
    Some(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{name}-{}", slice_suffix(&uid)),
            "namespace": namespace,
            "labels": {SERVICE_NAME_LABEL: name, MANAGED_BY_LABEL: "endpointslice-controller.k8s.io"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": uid,
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }))
}

/// Five lowercase alphanumerics derived from the Service uid: stable across runner restarts.
fn slice_suffix(uid: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in uid.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|i| {
            let index = (hash >> (i * 8)) as usize % ALPHABET.len();
            char::from(ALPHABET[index])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_list_selected_pods_with_resolved_ports_and_readiness() {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"selector": {"app": "web"}, "clusterIP": "198.19.0.15",
                     "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
        }))
        .unwrap();
        let pod = |name: &str, app: &str, ip: &str, ready: &str| -> Arc<Pod> {
            Arc::new(serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "shop", "labels": {"app": app}},
                "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]}
            })).unwrap())
        };
        let pods = vec![
            pod("web-a", "web", "198.18.0.10", "True"),
            pod("web-b", "web", "198.18.0.11", "False"),
            pod("db", "db", "198.18.0.12", "True"),
        ];
        let selected = selected_pods(&service, &pods);
        let slice = endpoint_slice(&service, &selected).unwrap();
        assert_eq!(slice["metadata"]["labels"][SERVICE_NAME_LABEL], "web");
        assert_eq!(slice["ports"][0]["port"], 8080);
        let endpoints = slice["endpoints"].as_array().unwrap();
        assert_eq!(endpoints.len(), 2);
        assert_eq!(endpoints[0]["conditions"]["ready"], true);
        assert_eq!(endpoints[1]["conditions"]["ready"], false);
    }
}
