//! The Gateway API objects the operator acts on, read into what rendering takes
//! (docs/architecture.md, "Gateway API gateways"): GatewayClasses as tenancy facts, and the
//! Gateways a revision runs as [`ManagedGateway`]s. Pure.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use meshplane_crds::gateway_api::{Gateway, GatewayClass};
use meshplane_crds::gateway_tenancy::{gateway_placement, ClassFacts, GatewayPlacement};
use meshplane_crds::membership::Membership;

use crate::render::ManagedGateway;

/// The annotation of a Gateway that picks its Service's type (`ClusterIP`, `NodePort` or
/// `LoadBalancer`, the default).
pub const SERVICE_TYPE_ANNOTATION: &str = "meshplane.io/service-type";

/// A GatewayClass as tenancy reads it.
pub fn class_facts(class: &GatewayClass) -> ClassFacts {
    ClassFacts {
        name: class.name_any(),
        controller: class.spec.controller_name.clone(),
        parameters_ref: class.spec.parameters_ref.as_ref().map(|p| {
            (
                p.group.clone(),
                p.kind.clone(),
                p.name.clone(),
                p.namespace.clone(),
            )
        }),
    }
}

/// The Gateways `revision` runs proxies for: those of its tenant's classes placed on it.
pub fn managed_gateways(
    revision: &str,
    gateways: &[Gateway],
    tenant_classes: &BTreeMap<String, BTreeSet<String>>,
    membership: &Membership,
) -> Vec<ManagedGateway> {
    let mut out: Vec<ManagedGateway> = gateways
        .iter()
        .filter(|g| g.metadata.deletion_timestamp.is_none())
        .filter_map(|g| {
            let namespace = g.namespace()?;
            let class = g.spec.gateway_class_name.clone();
            match gateway_placement(&namespace, &class, tenant_classes, membership) {
                GatewayPlacement::Revision(r) if r == revision => {}
                _ => return None,
            }
            let infrastructure = g.spec.infrastructure.clone().unwrap_or_default();
            let service_type = match g
                .annotations()
                .get(SERVICE_TYPE_ANNOTATION)
                .map(String::as_str)
            {
                Some(t @ ("ClusterIP" | "NodePort" | "LoadBalancer")) => t.to_string(),
                _ => "LoadBalancer".to_string(),
            };
            let mut ports: Vec<u16> = g
                .spec
                .listeners
                .iter()
                .filter_map(|l| u16::try_from(l.port).ok())
                .collect();
            ports.sort_unstable();
            ports.dedup();
            Some(ManagedGateway {
                namespace,
                name: g.name_any(),
                class,
                ports,
                service_type,
                labels: infrastructure.labels,
                annotations: infrastructure.annotations,
            })
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshplane_crds::gateway_tenancy::tenant_classes;
    use meshplane_crds::membership::{compute, ControlPlaneFacts, NamespaceFacts};
    use meshplane_crds::names;

    fn cp(name: &str, tenant: &str) -> ControlPlaneFacts {
        ControlPlaneFacts {
            name: name.into(),
            created: None,
            tenant: tenant.into(),
            revision: name.into(),
            control_namespace: format!("meshplane-{tenant}"),
            trust_domain: format!("{tenant}.meshplane.local"),
            namespace_selector: None,
            control_namespace_uid: None,
            handed_namespace_uid: None,
            legacy_claim: false,
        }
    }

    fn gateway(
        namespace: &str,
        name: &str,
        class: &str,
        annotations: serde_json::Value,
    ) -> Gateway {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {
                "gatewayClassName": class,
                "listeners": [
                    {"name": "http", "port": 80, "protocol": "HTTP"},
                    {"name": "http-alt", "port": 80, "protocol": "HTTP", "hostname": "a.example.com"},
                    {"name": "https", "port": 443, "protocol": "HTTPS",
                     "tls": {"certificateRefs": [{"name": "cert"}]}},
                ],
                "infrastructure": {"labels": {"team": "web"}},
            },
        }))
        .expect("a Gateway")
    }

    fn class(name: &str, controller: &str, control_plane: &str) -> GatewayClass {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": name},
            "spec": {"controllerName": controller, "parametersRef":
                {"group": "meshplane.io", "kind": "MeshControlPlane", "name": control_plane}},
        }))
        .expect("a GatewayClass")
    }

    #[test]
    fn a_revision_runs_the_gateways_of_its_tenants_classes_in_its_namespaces() {
        let m = compute(
            &[
                NamespaceFacts::new("shop", &[(names::REV_LABEL, "blue-v1")]),
                NamespaceFacts::new("bank", &[(names::REV_LABEL, "green")]),
            ],
            &[cp("blue-v1", "blue"), cp("green", "green")],
            &[],
        );
        let classes: Vec<ClassFacts> = [
            class(
                "blue",
                meshplane_crds::gateway_tenancy::CONTROLLER_NAME,
                "blue-v1",
            ),
            class(
                "green",
                meshplane_crds::gateway_tenancy::CONTROLLER_NAME,
                "green",
            ),
            class("istio", "istio.io/gateway-controller", "blue-v1"),
        ]
        .iter()
        .map(class_facts)
        .collect();
        let by_tenant = tenant_classes(&classes, &m);
        let gateways = [
            gateway(
                "shop",
                "web",
                "blue",
                serde_json::json!({SERVICE_TYPE_ANNOTATION: "ClusterIP"}),
            ),
            gateway("meshplane-blue", "edge", "blue", serde_json::json!({})),
            // Blue's class in green's namespace, green's in blue's, another controller's.
            gateway("bank", "stolen", "blue", serde_json::json!({})),
            gateway("shop", "green-in-blue", "green", serde_json::json!({})),
            gateway("shop", "istio", "istio", serde_json::json!({})),
        ];
        let blue = managed_gateways("blue-v1", &gateways, &by_tenant, &m);
        let names: Vec<(&str, &str)> = blue
            .iter()
            .map(|g| (g.namespace.as_str(), g.name.as_str()))
            .collect();
        assert_eq!(names, vec![("meshplane-blue", "edge"), ("shop", "web")]);
        assert_eq!(blue[1].ports, vec![80, 443]);
        assert_eq!(blue[1].service_type, "ClusterIP");
        assert_eq!(blue[0].service_type, "LoadBalancer");
        assert_eq!(blue[1].labels["team"], "web");
        assert!(managed_gateways("green", &gateways, &by_tenant, &m).is_empty());
    }
}
