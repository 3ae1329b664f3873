//! The Gateway API objects the operator acts on, read into what rendering takes
//! (docs/architecture.md, "Gateway API gateways"): GatewayClasses as tenancy facts, and the
//! Gateways a revision runs as [`ManagedGateway`]s. Pure.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use meshplane_crds::gateway_api::{Gateway, GatewayClass};
use meshplane_crds::gateway_tenancy::{
    gateway_placement, tenant_classes, ClassFacts, GatewayPlacement,
};
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

/// What a revision of `tenant` renders from the Gateway API objects read: the Gateways it runs
/// and the tenant's classes (members ConfigMap key `gatewayClasses`, contract 2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevisionGateways {
    pub managed: Vec<ManagedGateway>,
    pub classes: BTreeSet<String>,
}

/// Whether a read failed because the API server does not serve the kind (the Gateway API
/// CRDs are not installed): that means "no such objects", never a failure.
pub fn not_served(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// The tenant's classes among `classes`.
pub fn classes_of_tenant(
    tenant: &str,
    classes: &[GatewayClass],
    membership: &Membership,
) -> BTreeMap<String, BTreeSet<String>> {
    let facts: Vec<ClassFacts> = classes.iter().map(class_facts).collect();
    tenant_classes(&facts, membership)
        .into_iter()
        .filter(|(t, _)| t == tenant)
        .collect()
}

/// What `revision` of `tenant` renders, from the classes and the Gateways of the tenant's
/// namespaces.
pub fn revision_gateways(
    tenant: &str,
    revision: &str,
    classes: &[GatewayClass],
    gateways: &[Gateway],
    membership: &Membership,
) -> RevisionGateways {
    let ours = classes_of_tenant(tenant, classes, membership);
    RevisionGateways {
        managed: managed_gateways(revision, gateways, &ours, membership),
        classes: ours.get(tenant).cloned().unwrap_or_default(),
    }
}

/// What of a Gateway decides whether and how its proxy runs (not its status): a change of it
/// is worth a reconcile.
pub fn gateway_facts(gateway: &Gateway) -> (Option<serde_json::Value>, Option<String>) {
    (
        serde_json::to_value(&gateway.spec).ok(),
        gateway.annotations().get(SERVICE_TYPE_ANNOTATION).cloned(),
    )
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

    fn two_tenants() -> Membership {
        compute(
            &[
                NamespaceFacts::new("shop", &[(names::REV_LABEL, "blue-v1")]),
                NamespaceFacts::new("bank", &[(names::REV_LABEL, "green")]),
            ],
            &[cp("blue-v1", "blue"), cp("green", "green")],
            &[],
        )
    }

    #[test]
    fn a_revision_renders_its_tenants_classes_and_gateways_only() {
        let m = two_tenants();
        let controller = meshplane_crds::gateway_tenancy::CONTROLLER_NAME;
        let classes = [
            class("blue", controller, "blue-v1"),
            class("blue-too", controller, "blue-v1"),
            class("green", controller, "green"),
            class("nobody", controller, "gone"),
            class("istio", "istio.io/gateway-controller", "blue-v1"),
        ];
        let gateways = [
            gateway("shop", "web", "blue", serde_json::json!({})),
            gateway("bank", "stolen", "blue", serde_json::json!({})),
            gateway("bank", "vault", "green", serde_json::json!({})),
        ];
        let blue = revision_gateways("blue", "blue-v1", &classes, &gateways, &m);
        assert_eq!(
            blue.classes,
            BTreeSet::from(["blue".to_string(), "blue-too".to_string()])
        );
        let run: Vec<&str> = blue.managed.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(run, ["web"]);
        let green = revision_gateways("green", "green", &classes, &gateways, &m);
        assert_eq!(green.classes, BTreeSet::from(["green".to_string()]));
        let run: Vec<&str> = green.managed.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(run, ["vault"]);
        // A tenant without a class has nothing, whatever Gateways exist.
        assert!(classes_of_tenant("red", &classes, &m).is_empty());
        // Deleting the Gateway takes its proxy away.
        let none = revision_gateways("blue", "blue-v1", &classes, &gateways[1..], &m);
        assert!(none.managed.is_empty());
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "message": "m", "reason": "r", "code": code,
            }))
            .expect("a Status"),
        )
    }

    #[test]
    fn only_a_kind_not_served_reads_as_none() {
        assert!(not_served(&api_error(404)));
        for code in [403, 500, 503] {
            assert!(!not_served(&api_error(code)), "{code}");
        }
    }

    #[test]
    fn a_gateways_status_is_not_a_fact() {
        let g = gateway("shop", "web", "blue", serde_json::json!({}));
        let mut with_status = g.clone();
        with_status.status = serde_json::from_value(serde_json::json!({
            "conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }))
        .expect("a status");
        assert_eq!(gateway_facts(&g), gateway_facts(&with_status));
        let mut moved = g.clone();
        moved.spec.gateway_class_name = "green".into();
        assert_ne!(gateway_facts(&g), gateway_facts(&moved));
        let internal = gateway(
            "shop",
            "web",
            "blue",
            serde_json::json!({SERVICE_TYPE_ANNOTATION: "ClusterIP"}),
        );
        assert_ne!(gateway_facts(&g), gateway_facts(&internal));
    }
}
