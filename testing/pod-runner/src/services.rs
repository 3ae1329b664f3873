//! What the runner's kube-proxy and DNS parts read from the API: each Service port's ready
//! endpoints from the Service's EndpointSlices (as kube-proxy does, so selector-less Services
//! such as `default/kubernetes` work too), and every Service's name and ClusterIP.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::endpoints::SERVICE_NAME_LABEL;
use super::net::{ServiceName, ServiceRoute};

/// The ClusterIP of a Service, unless it is headless or has none.
fn cluster_ip(service: &Service) -> Option<Ipv4Addr> {
    service.spec.as_ref()?.cluster_ip.as_deref()?.parse().ok()
}

/// One route per TCP port of every Service with a ClusterIP: to the ready endpoints of its
/// slices, on the slice port of the same name.
pub fn service_routes(
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
) -> Vec<ServiceRoute> {
    let mut routes = Vec::new();
    for service in services {
        let Some(ip) = cluster_ip(service) else {
            continue;
        };
        let namespace = service.metadata.namespace.as_deref();
        let name = service.metadata.name.as_deref();
        let own: Vec<&Arc<EndpointSlice>> = slices
            .iter()
            .filter(|s| s.metadata.namespace.as_deref() == namespace)
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .map(String::as_str)
                    == name
            })
            .filter(|s| s.address_type == "IPv4")
            .collect();
        let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
        for port in ports.into_iter().flatten() {
            if port.protocol.as_deref().unwrap_or("TCP") != "TCP" {
                continue;
            }
            let Ok(number) = u16::try_from(port.port) else {
                continue;
            };
            let port_name = port.name.clone().unwrap_or_default();
            let mut backends = Vec::new();
            for slice in &own {
                let Some(target) = slice
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.clone().unwrap_or_default() == port_name)
                    .and_then(|p| p.port)
                    .and_then(|p| u16::try_from(p).ok())
                else {
                    continue;
                };
                for endpoint in slice.endpoints.iter().flatten() {
                    // An unset `ready` means ready (discovery.k8s.io/v1).
                    let ready = endpoint
                        .conditions
                        .as_ref()
                        .and_then(|c| c.ready)
                        .unwrap_or(true);
                    if !ready {
                        continue;
                    }
                    backends.extend(
                        endpoint
                            .addresses
                            .iter()
                            .filter_map(|a| a.parse::<Ipv4Addr>().ok())
                            .map(|a| SocketAddr::from((a, target))),
                    );
                }
            }
            backends.sort();
            backends.dedup();
            routes.push(ServiceRoute {
                frontend: SocketAddr::from((ip, number)),
                backends,
            });
        }
    }
    routes
}

/// Every Service with a ClusterIP, by name.
pub fn service_names(services: &[Arc<Service>]) -> Vec<ServiceName> {
    services
        .iter()
        .filter_map(|service| {
            Some(ServiceName {
                namespace: service.metadata.namespace.clone()?,
                name: service.metadata.name.clone()?,
                cluster_ip: cluster_ip(service)?,
            })
        })
        .collect()
}

/// The in-cluster address of the API: `default/kubernetes`'s ClusterIP and `https` port.
pub fn api_service(services: &[Arc<Service>]) -> Option<(String, u16)> {
    let service = services.iter().find(|s| {
        s.metadata.namespace.as_deref() == Some("default")
            && s.metadata.name.as_deref() == Some("kubernetes")
    })?;
    let ip = cluster_ip(service)?;
    let port = service
        .spec
        .as_ref()?
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("https"))
        .or_else(|| service.spec.as_ref()?.ports.as_ref()?.first())?;
    Some((ip.to_string(), u16::try_from(port.port).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(v: serde_json::Value) -> Arc<Service> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn slice(v: serde_json::Value) -> Arc<EndpointSlice> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn routes_go_to_ready_endpoints_on_the_slice_port_of_the_same_name() {
        let services = vec![
            service(json!({"metadata": {"name": "web", "namespace": "shop"},
                "spec": {"clusterIP": "198.19.0.10", "ports": [
                    {"name": "http", "port": 8080}, {"name": "dns", "port": 53, "protocol": "UDP"}]}})),
            service(
                json!({"metadata": {"name": "kubernetes", "namespace": "default"},
                "spec": {"clusterIP": "198.19.0.1", "ports": [{"name": "https", "port": 443}]}}),
            ),
            service(
                json!({"metadata": {"name": "headless", "namespace": "shop"},
                "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}}),
            ),
        ];
        let slices = vec![
            slice(json!({"metadata": {"name": "web-abc", "namespace": "shop",
                    "labels": {SERVICE_NAME_LABEL: "web"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 9080}],
                "endpoints": [
                    {"addresses": ["198.18.0.11"], "conditions": {"ready": true}},
                    {"addresses": ["198.18.0.12"], "conditions": {"ready": false}},
                    {"addresses": ["198.18.0.13"]}]})),
            slice(
                json!({"metadata": {"name": "web-other-ns", "namespace": "garden",
                    "labels": {SERVICE_NAME_LABEL: "web"}},
                "addressType": "IPv4", "ports": [{"name": "http", "port": 9080}],
                "endpoints": [{"addresses": ["198.18.0.99"]}]}),
            ),
            slice(
                json!({"metadata": {"name": "kubernetes", "namespace": "default",
                    "labels": {SERVICE_NAME_LABEL: "kubernetes"}},
                "addressType": "IPv4", "ports": [{"name": "https", "port": 6443}],
                "endpoints": [{"addresses": ["198.18.0.1"]}]}),
            ),
        ];
        let routes = service_routes(&services, &slices);
        assert_eq!(
            routes,
            vec![
                ServiceRoute {
                    frontend: "198.19.0.10:8080".parse().unwrap(),
                    backends: vec![
                        "198.18.0.11:9080".parse().unwrap(),
                        "198.18.0.13:9080".parse().unwrap()
                    ],
                },
                ServiceRoute {
                    frontend: "198.19.0.1:443".parse().unwrap(),
                    backends: vec!["198.18.0.1:6443".parse().unwrap()],
                },
            ]
        );
        assert_eq!(
            api_service(&services),
            Some(("198.19.0.1".to_string(), 443))
        );
        let names = service_names(&services);
        assert_eq!(
            names.len(),
            2,
            "a headless Service has no ClusterIP to name"
        );
    }
}
