//! The codes of `meshctl precheck`, stable like the analyzer's (`MP08xx`, a range of their
//! own): `MP080x` the Kubernetes version, `MP081x` meshplane's CRDs, `MP082x` other meshes'
//! injection, `MP083x` the new revision's name, `MP084x` the caller's permissions.

use crate::analyze::codes::{Code, Severity};

macro_rules! codes {
    ($($konst:ident = $id:literal $name:literal $sev:ident $summary:literal;)*) => {
        $(pub const $konst: Code = Code { id: $id, name: $name, severity: Severity::$sev, summary: $summary };)*
        /// Every precheck code, in code order.
        pub const ALL: &[Code] = &[$($konst),*];
    };
}

codes! {
    KUBERNETES_TOO_OLD = "MP0801" "KubernetesVersionUnsupported" Error
        "The API server is older than the oldest Kubernetes release meshplane supports; upgrade the cluster first.";
    KUBERNETES_VERSION_UNKNOWN = "MP0802" "KubernetesVersionUnknown" Warning
        "The API server's version could not be read or parsed; check it against the supported range by hand.";
    CRD_STORED_VERSION_UNSERVED = "MP0811" "CrdStoredVersionUnserved" Error
        "A meshplane CRD holds objects stored at a version this release does not serve; migrate them to a served version before the upgrade.";
    CRD_VERSION_DROPPED = "MP0812" "CrdVersionDropped" Warning
        "The cluster serves a version of a meshplane CRD that this release does not; manifests written for it stop working after the upgrade.";
    CRD_UNKNOWN = "MP0813" "CrdUnknown" Warning
        "A CRD of meshplane's API groups that this release does not know: the cluster runs a newer meshplane; use that release's meshctl.";
    ISTIO_INJECTS_MESH_NAMESPACES = "MP0821" "IstioInjectsMeshNamespaces" Error
        "An Istio injector webhook would inject pods of namespaces that join meshplane: they would get two sidecars.";
    ISTIO_INJECTS_LABELLED_PODS = "MP0822" "IstioInjectsLabelledPods" Warning
        "An Istio injector webhook injects pods that carry its labels in any namespace, meshplane's included; keep those labels off meshplane's pods.";
    ISTIO_INSTALLED = "MP0823" "IstioInstalled" Info
        "Istio's injector is installed and injects only namespaces labelled for Istio; meshplane can run beside it.";
    NAMESPACE_IN_TWO_MESHES = "MP0824" "NamespaceInTwoMeshes" Error
        "A namespace is labelled both for meshplane (meshplane.io/rev) and for Istio (istio-injection=enabled or istio.io/rev); keep one.";
    OTHER_MESH_INJECTOR = "MP0825" "OtherMeshInjector" Warning
        "Another service mesh's sidecar injector is installed; do not enable its injection in meshplane's namespaces.";
    INVALID_REVISION_NAME = "MP0831" "InvalidRevisionName" Error
        "The revision to install is not a DNS-1035 label of at most 32 characters.";
    REVISION_TAKEN = "MP0832" "RevisionTaken" Error
        "The revision to install exists already, or a tag has its name; revisions and tags share the meshplane.io/rev label.";
    INSTALL_PERMISSION_MISSING = "MP0841" "InstallPermissionMissing" Error
        "The caller may not create an object the install creates; install as a cluster admin.";
    PERMISSION_UNCHECKED = "MP0842" "PermissionUnchecked" Warning
        "A permission could not be checked (the SelfSubjectAccessReview failed).";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precheck_codes_are_unique_sorted_and_apart_from_the_analyzers() {
        let ids: Vec<&str> = ALL.iter().map(|c| c.id).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(ids, sorted);
        for c in ALL {
            assert!(c.id.starts_with("MP08") && c.id.len() == 6, "{}", c.id);
            assert!(
                crate::analyze::codes::by_id(c.id).is_none(),
                "{} is an analyzer code",
                c.id
            );
        }
    }

    #[test]
    fn the_user_guide_lists_every_precheck_code() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guide/meshctl.md");
        let guide = std::fs::read_to_string(&path).expect("docs/guide/meshctl.md");
        for c in ALL {
            let row = format!(
                "| `{}` | {} | {} | {} |",
                c.id,
                c.name,
                c.severity.as_str(),
                c.summary
            );
            assert!(
                guide.lines().any(|l| l == row),
                "docs/guide/meshctl.md lacks (or has another text for) {row}"
            );
        }
    }
}
