//! Which control planes and tags a Namespace change concerns.
//!
//! A namespace whose `meshplane.io/rev` label is removed or changed must still reach the
//! revision it left (to prune its bootstrap ConfigMap and reader RoleBinding there), so the
//! index remembers each namespace's previous label.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use meshplane_crds::{names, MeshControlPlane, MeshRevisionTag};

/// Namespace name → the `meshplane.io/rev` value it had when last seen.
pub type NamespaceIndex = HashMap<String, String>;

/// The label values (current and previous) a namespace change concerns; updates the index.
pub fn label_values(ns: &Namespace, index: &mut NamespaceIndex) -> BTreeSet<String> {
    let name = ns.name_any();
    let current = ns.labels().get(names::REV_LABEL).cloned();
    let deleted = ns.metadata.deletion_timestamp.is_some();
    let previous = match (&current, deleted) {
        (Some(v), false) => index.insert(name, v.clone()),
        _ => index.remove(&name),
    };
    current.into_iter().chain(previous).collect()
}

/// Every control plane of every tenant that a revision or tag in the namespace's current or
/// previous label belongs to: a namespace joining or leaving changes the bootstrap ConfigMaps
/// and reader RBAC of all revisions of the tenant.
pub fn control_planes_for_namespace(
    ns: &Namespace,
    index: &mut NamespaceIndex,
    control_planes: &[Arc<MeshControlPlane>],
) -> Vec<ObjectRef<MeshControlPlane>> {
    let values = label_values(ns, index);
    if values.is_empty() {
        return Vec::new();
    }
    let tenants: BTreeSet<&str> = control_planes
        .iter()
        .filter(|cp| {
            values.contains(&cp.revision())
                || cp
                    .status
                    .as_ref()
                    .is_some_and(|s| s.tags.iter().any(|t| values.contains(t)))
        })
        .map(|cp| cp.spec.tenant.as_str())
        .collect();
    control_planes
        .iter()
        .filter(|cp| tenants.contains(cp.spec.tenant.as_str()))
        .map(|cp| ObjectRef::from_obj(cp.as_ref()))
        .collect()
}

/// Tags named by the namespace's current or previous label (their member lists change).
pub fn tags_for_namespace(
    ns: &Namespace,
    index: &mut NamespaceIndex,
    tags: &[Arc<MeshRevisionTag>],
) -> Vec<ObjectRef<MeshRevisionTag>> {
    let values = label_values(ns, index);
    tags.iter()
        .filter(|t| values.contains(&t.name_any()))
        .map(|t| ObjectRef::from_obj(t.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use meshplane_crds::{MeshControlPlaneSpec, MeshControlPlaneStatus};

    fn namespace(name: &str, rev: Option<&str>) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: rev.map(|r| [(names::REV_LABEL.to_string(), r.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn cp(name: &str, tenant: &str, tags: &[&str]) -> Arc<MeshControlPlane> {
        let spec: MeshControlPlaneSpec =
            serde_json::from_value(serde_json::json!({"tenant": tenant})).unwrap();
        let mut mcp = MeshControlPlane::new(name, spec);
        mcp.status = Some(MeshControlPlaneStatus {
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        });
        Arc::new(mcp)
    }

    fn names_of(refs: Vec<ObjectRef<MeshControlPlane>>) -> Vec<String> {
        let mut v: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        v.sort();
        v
    }

    #[test]
    fn a_removed_label_still_reaches_the_tenant_it_left() {
        let cps = [
            cp("blue-v1", "blue", &["blue-stable"]),
            cp("blue-v2", "blue", &[]),
            cp("green", "green", &[]),
        ];
        let mut index = NamespaceIndex::default();
        assert_eq!(
            names_of(control_planes_for_namespace(
                &namespace("shop", Some("blue-stable")),
                &mut index,
                &cps
            )),
            ["blue-v1", "blue-v2"]
        );
        // Moved to green: both tenants are concerned.
        assert_eq!(
            names_of(control_planes_for_namespace(
                &namespace("shop", Some("green")),
                &mut index,
                &cps
            )),
            ["blue-v1", "blue-v2", "green"]
        );
        // Label removed: green (the tenant it left) still hears about it.
        assert_eq!(
            names_of(control_planes_for_namespace(
                &namespace("shop", None),
                &mut index,
                &cps
            )),
            ["green"]
        );
        // Nothing remembered any more.
        assert!(
            control_planes_for_namespace(&namespace("shop", None), &mut index, &cps).is_empty()
        );
    }
}
