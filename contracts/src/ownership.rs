//! Contract 8: the labels on every object the operator writes, plus an owner reference to the
//! `MeshControlPlane`. Pruning only ever touches objects carrying all three labels.

use std::collections::BTreeMap;

/// Standard Kubernetes label naming the manager of an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on meshplane-owned objects.
pub const MANAGED_BY_VALUE: &str = "meshplane";
/// The tenant an object belongs to. On a namespace: the tenant whose control namespace it is.
pub const TENANT_LABEL: &str = "meshplane.io/tenant";
/// The revision an object belongs to.
pub const REVISION_LABEL: &str = "meshplane.io/revision";

/// The labels of an object of revision `revision` of tenant `tenant`.
pub fn labels(tenant: &str, revision: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
        (TENANT_LABEL.to_string(), tenant.to_string()),
        (REVISION_LABEL.to_string(), revision.to_string()),
    ])
}

/// The label selector (query form) of everything revision `revision` of `tenant` owns.
pub fn selector(tenant: &str, revision: &str) -> String {
    labels(tenant, revision)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Selector of everything meshplane manages, of every tenant.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")
}

/// Whether `object_labels` carry the ownership labels of `revision` of `tenant`.
pub fn is_owned(object_labels: &BTreeMap<String, String>, tenant: &str, revision: &str) -> bool {
    labels(tenant, revision)
        .iter()
        .all(|(k, v)| object_labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_and_labels_agree() {
        let owned = labels("blue", "blue-v1");
        assert!(is_owned(&owned, "blue", "blue-v1"));
        assert!(!is_owned(&owned, "blue", "blue-v2"));
        assert_eq!(
            selector("blue", "blue-v1"),
            "app.kubernetes.io/managed-by=meshplane,meshplane.io/revision=blue-v1,meshplane.io/tenant=blue"
        );
    }
}
