//! Which tenant a Kubernetes Gateway API GatewayClass belongs to, and which revision runs and
//! programs a Gateway of it (docs/architecture.md, "Gateway API gateways").
//!
//! A class is meshplane's when its `controllerName` is [`CONTROLLER_NAME`]; it names its
//! tenant with `parametersRef` to a `MeshControlPlane` or a `MeshRevisionTag` (group
//! `meshplane.io`), whose tenant it takes (a tag never moves across tenants, so a class that
//! names one outlives canaries). A Gateway of a tenant's class runs and is programmed only in a
//! namespace of that tenant (a member or its control namespace), by the revision that writes
//! the status of that namespace's config (contract 2, `writes_status_of`); anywhere else it is
//! not run, and its status says why. Pure, so that the operator and the instances' directory
//! mode can share one answer.

use std::collections::{BTreeMap, BTreeSet};

use crate::membership::Membership;

/// The `controllerName` of meshplane's GatewayClasses.
pub use crate::gateway_api::CONTROLLER_NAME;
/// The label tying a Gateway API gateway's pods to their Gateway (as the Gateway API
/// ecosystem labels them): the operator sets it, the instance programs a gateway proxy that
/// carries it as that Gateway.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// The API group a class's `parametersRef` names.
pub const PARAMETERS_GROUP: &str = "meshplane.io";

/// A GatewayClass as far as tenancy goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassFacts {
    pub name: String,
    pub controller: String,
    /// `parametersRef` as (group, kind, name, namespace).
    pub parameters_ref: Option<(String, String, String, Option<String>)>,
}

/// What a class is to meshplane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClassTenancy {
    /// Another controller's: never touched, its status never written.
    NotOurs,
    /// Ours, for this tenant.
    Tenant(String),
    /// Ours but naming no tenant: `Accepted=False` with this reason and message.
    Invalid {
        reason: &'static str,
        message: String,
    },
}

/// The tenant of a class.
pub fn class_tenancy(class: &ClassFacts, membership: &Membership) -> ClassTenancy {
    if class.controller != CONTROLLER_NAME {
        return ClassTenancy::NotOurs;
    }
    let invalid = |message: String| ClassTenancy::Invalid {
        reason: "InvalidParameters",
        message,
    };
    let Some((group, kind, name, namespace)) = &class.parameters_ref else {
        return invalid(format!(
            "parametersRef must name the tenant: a MeshControlPlane or MeshRevisionTag of group {PARAMETERS_GROUP}"
        ));
    };
    if group != PARAMETERS_GROUP || namespace.is_some() {
        return invalid(format!(
            "parametersRef must be a cluster-scoped MeshControlPlane or MeshRevisionTag of group {PARAMETERS_GROUP}, not {group}/{kind}"
        ));
    }
    let tenant = match kind.as_str() {
        "MeshControlPlane" => membership
            .revision_of_control_plane(name)
            .map(|r| r.tenant.clone()),
        "MeshRevisionTag" => membership.tags.get(name).and_then(|t| t.tenant.clone()),
        _ => {
            return invalid(format!(
                "parametersRef kind {kind} is neither MeshControlPlane nor MeshRevisionTag"
            ))
        }
    };
    match tenant {
        Some(t) => ClassTenancy::Tenant(t),
        None => invalid(format!("{kind} {name:?} does not exist or is not active")),
    }
}

/// The classes of each tenant, by tenant.
pub fn tenant_classes(
    classes: &[ClassFacts],
    membership: &Membership,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in classes {
        if let ClassTenancy::Tenant(t) = class_tenancy(c, membership) {
            out.entry(t).or_default().insert(c.name.clone());
        }
    }
    out
}

/// Where a Gateway of one of meshplane's classes runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GatewayPlacement {
    /// Not of a class of any tenant: nothing to do.
    NotOurs,
    /// Run and programmed by this revision.
    Revision(String),
    /// Of `tenant`'s class, in a namespace that is not the tenant's: not run, with why.
    OutsideTenant { tenant: String, message: String },
}

/// Where a Gateway of class `class` in `namespace` runs.
pub fn gateway_placement(
    namespace: &str,
    class: &str,
    tenant_classes: &BTreeMap<String, BTreeSet<String>>,
    membership: &Membership,
) -> GatewayPlacement {
    let Some(tenant) = tenant_classes
        .iter()
        .find(|(_, classes)| classes.contains(class))
        .map(|(t, _)| t.clone())
    else {
        return GatewayPlacement::NotOurs;
    };
    let Some(t) = membership.tenants.get(&tenant) else {
        return GatewayPlacement::OutsideTenant {
            message: format!("tenant {tenant:?} of GatewayClass {class:?} has no active revision"),
            tenant,
        };
    };
    let revision = if namespace == t.control_namespace {
        Some(t.status_writer.clone())
    } else if t.members.contains(namespace) {
        membership
            .revisions
            .iter()
            .find(|(_, r)| r.tenant == tenant && r.attached.contains(namespace))
            .map(|(name, _)| name.clone())
    } else {
        None
    };
    match revision {
        Some(r) if !r.is_empty() => GatewayPlacement::Revision(r),
        _ => GatewayPlacement::OutsideTenant {
            message: format!(
                "namespace {namespace:?} is not a namespace of tenant {tenant:?}, whose GatewayClass {class:?} this is: the Gateway is not run"
            ),
            tenant,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::{compute, ControlPlaneFacts, NamespaceFacts, TagFacts};
    use crate::names;

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

    fn membership() -> Membership {
        let namespaces = vec![
            NamespaceFacts::new("shop", &[(names::REV_LABEL, "blue-stable")]),
            NamespaceFacts::new("cart", &[(names::REV_LABEL, "blue-v2")]),
            NamespaceFacts::new("bank", &[(names::REV_LABEL, "green")]),
            NamespaceFacts::new("outsider", &[]),
        ];
        let tags = vec![TagFacts {
            name: "blue-stable".into(),
            target: "blue-v1".into(),
            recorded_tenant: None,
            recorded_revision: None,
        }];
        compute(
            &namespaces,
            &[
                cp("blue-v1", "blue"),
                cp("blue-v2", "blue"),
                cp("green", "green"),
            ],
            &tags,
        )
    }

    fn class(name: &str, controller: &str, kind: &str, target: &str) -> ClassFacts {
        ClassFacts {
            name: name.into(),
            controller: controller.into(),
            parameters_ref: Some((PARAMETERS_GROUP.into(), kind.into(), target.into(), None)),
        }
    }

    #[test]
    fn a_class_takes_the_tenant_of_the_control_plane_or_tag_it_names() {
        let m = membership();
        let by_tag = class("blue", CONTROLLER_NAME, "MeshRevisionTag", "blue-stable");
        assert_eq!(
            class_tenancy(&by_tag, &m),
            ClassTenancy::Tenant("blue".into())
        );
        let by_cp = class("green", CONTROLLER_NAME, "MeshControlPlane", "green");
        assert_eq!(
            class_tenancy(&by_cp, &m),
            ClassTenancy::Tenant("green".into())
        );
        let istio = class(
            "istio",
            "istio.io/gateway-controller",
            "MeshControlPlane",
            "green",
        );
        assert_eq!(class_tenancy(&istio, &m), ClassTenancy::NotOurs);
        for bad in [
            class("x", CONTROLLER_NAME, "MeshControlPlane", "nope"),
            class("y", CONTROLLER_NAME, "ConfigMap", "green"),
            ClassFacts {
                parameters_ref: None,
                ..by_cp.clone()
            },
            ClassFacts {
                parameters_ref: Some(("".into(), "MeshControlPlane".into(), "green".into(), None)),
                ..by_cp.clone()
            },
        ] {
            assert!(
                matches!(
                    class_tenancy(&bad, &m),
                    ClassTenancy::Invalid {
                        reason: "InvalidParameters",
                        ..
                    }
                ),
                "{bad:?}"
            );
        }
        let classes = tenant_classes(&[by_tag, by_cp, istio], &m);
        assert_eq!(classes["blue"], BTreeSet::from(["blue".to_string()]));
        assert_eq!(classes["green"], BTreeSet::from(["green".to_string()]));
    }

    #[test]
    fn a_gateway_runs_in_its_tenant_by_the_revision_of_its_namespace_and_nowhere_else() {
        let m = membership();
        let classes = tenant_classes(
            &[
                class("blue", CONTROLLER_NAME, "MeshRevisionTag", "blue-stable"),
                class("green", CONTROLLER_NAME, "MeshControlPlane", "green"),
            ],
            &m,
        );
        let place = |ns: &str, class: &str| gateway_placement(ns, class, &classes, &m);
        assert_eq!(
            place("shop", "blue"),
            GatewayPlacement::Revision("blue-v1".into())
        );
        assert_eq!(
            place("cart", "blue"),
            GatewayPlacement::Revision("blue-v2".into())
        );
        // The control namespace's: the tenant's status writer (the oldest revision).
        assert_eq!(
            place("meshplane-blue", "blue"),
            GatewayPlacement::Revision("blue-v1".into())
        );
        assert_eq!(
            place("bank", "green"),
            GatewayPlacement::Revision("green".into())
        );
        // Blue's class in green's namespace, or in nobody's, is not run.
        for ns in ["bank", "outsider", "meshplane-green"] {
            match place(ns, "blue") {
                GatewayPlacement::OutsideTenant { tenant, message } => {
                    assert_eq!(tenant, "blue");
                    assert!(message.contains(ns), "{message}");
                }
                other => panic!("{ns}: {other:?}"),
            }
        }
        assert_eq!(place("shop", "istio"), GatewayPlacement::NotOurs);
    }
}
