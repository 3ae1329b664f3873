//! Gateway API north-south gateways: a GatewayClass of meshplane's controller naming blue's
//! MeshControlPlane, and a Gateway of that class in blue's member namespace `shop`, make the
//! operator run the Gateway's proxy (Deployment, Service and ServiceAccount `<gateway>-<class>`)
//! whose pod becomes Ready; the members ConfigMap tells blue's instance the class; a Gateway of
//! blue's class in green's namespace `garden` gets no proxy; deleting the Gateway removes its
//! proxy.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use kube::Api;
use meshplane_e2e::harness::{wait_for, Cluster};

const DEADLINE: Duration = Duration::from_secs(120);

const CLASS_AND_GATEWAYS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: blue}
spec:
  controllerName: meshplane.io/gateway-controller
  parametersRef: {group: meshplane.io, kind: MeshControlPlane, name: blue-v1}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: stray, namespace: garden}
spec:
  gatewayClassName: blue
  listeners:
    - {name: http, port: 80, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: web
  namespace: shop
  annotations: {meshplane.io/service-type: ClusterIP}
spec:
  gatewayClassName: blue
  listeners:
    - {name: http, port: 80, protocol: HTTP}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_of_a_tenants_class_runs_its_proxy_in_the_tenants_namespaces_only() {
    let cluster = Cluster::start_two_tenants("gateway-api-ingress", DEADLINE)
        .await
        .expect("two tenants Ready");
    cluster
        .apply_manifest(CLASS_AND_GATEWAYS)
        .expect("the class and the Gateways");

    let deployments = Api::<Deployment>::namespaced(cluster.client(), "shop");
    wait_for("Deployment shop/web-blue", DEADLINE, || {
        let deployments = deployments.clone();
        async move {
            match deployments.get_opt("web-blue").await {
                Ok(Some(d)) => Ok(Some(d)),
                Ok(None) => Err("not yet".to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
    .expect("the operator runs the Gateway's proxy");
    let service = Api::<Service>::namespaced(cluster.client(), "shop")
        .get("web-blue")
        .await
        .expect("its Service");
    let spec = service.spec.expect("a Service spec");
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let ports: Vec<i32> = spec
        .ports
        .unwrap_or_default()
        .iter()
        .map(|p| p.port)
        .collect();
    assert!(ports.contains(&80), "the listener's port: {ports:?}");
    Api::<ServiceAccount>::namespaced(cluster.client(), "shop")
        .get("web-blue")
        .await
        .expect("its ServiceAccount");
    cluster
        .wait_for_ready_pods(
            "shop",
            "gateway.networking.k8s.io/gateway-name=web",
            1,
            DEADLINE,
        )
        .await
        .expect("the gateway proxy becomes Ready");

    // The instance learns the tenant's class from its members ConfigMap (contract 2).
    let members = Api::<ConfigMap>::namespaced(cluster.client(), "meshplane-blue")
        .get("meshplane-blue-v1-members")
        .await
        .expect("blue's members ConfigMap");
    let classes = members
        .data
        .unwrap_or_default()
        .get("gatewayClasses")
        .cloned()
        .unwrap_or_default();
    assert_eq!(classes.trim(), "blue");

    // The stray Gateway existed before blue's proxy was rendered: blue's class in green's
    // namespace runs nothing there.
    let in_garden = Api::<Deployment>::namespaced(cluster.client(), "garden")
        .get_opt("stray-blue")
        .await
        .expect("Deployments in garden are readable");
    assert!(in_garden.is_none(), "no proxy for a Gateway outside blue");

    cluster
        .kubectl(&[
            "delete",
            "gateways.gateway.networking.k8s.io",
            "web",
            "-n",
            "shop",
        ])
        .expect("delete the Gateway");
    wait_for("Deployment shop/web-blue gone", DEADLINE, || {
        let deployments = deployments.clone();
        async move {
            match deployments.get_opt("web-blue").await {
                Ok(None) => Ok(Some(())),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
    .expect("deleting the Gateway removes its proxy");
    let service = Api::<Service>::namespaced(cluster.client(), "shop")
        .get_opt("web-blue")
        .await
        .expect("Services in shop are readable");
    assert!(service.is_none(), "its Service is pruned too");
}
