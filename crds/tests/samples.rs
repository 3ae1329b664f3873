//! Every sample in `config/samples/` is a valid meshplane object.

use std::path::PathBuf;

use meshplane_crds::manifest::{parse_objects, Object};
use meshplane_crds::validation::{
    validate_destination_rule, validate_envoy_filter, validate_gateway,
    validate_mesh_control_plane, validate_revision_tag, validate_service_entry, validate_sidecar,
    validate_virtual_service,
};

fn samples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/samples")
}

#[test]
fn every_sample_deserializes_and_validates() {
    let mut kinds = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(samples_dir())
        .expect("config/samples exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect();
    entries.sort();
    assert!(!entries.is_empty(), "no samples found");
    for path in entries {
        let text = std::fs::read_to_string(&path).expect("readable sample");
        let objects = parse_objects(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!objects.is_empty(), "{} has no objects", path.display());
        for obj in objects {
            let (kind, result) = match &obj {
                Object::MeshControlPlane(o) => ("MeshControlPlane", validate_mesh_control_plane(o)),
                Object::MeshRevisionTag(o) => ("MeshRevisionTag", validate_revision_tag(o)),
                Object::ServiceEntry(o) => ("ServiceEntry", validate_service_entry(&o.spec)),
                Object::Sidecar(o) => ("Sidecar", validate_sidecar(&o.spec)),
                Object::EnvoyFilter(o) => ("EnvoyFilter", validate_envoy_filter(&o.spec)),
                // Migrations are operations, not configuration any part reads from a manifest:
                // the sample must decode into the kind (schema defaults and all).
                Object::Other(v) if v["kind"] == "MeshRevisionMigration" => {
                    serde_json::from_value::<meshplane_crds::MeshRevisionMigration>(v.clone())
                        .unwrap_or_else(|e| {
                            panic!("{}: MeshRevisionMigration: {e}", path.display())
                        });
                    ("MeshRevisionMigration", Ok(()))
                }
                Object::VirtualService(o) => ("VirtualService", validate_virtual_service(&o.spec)),
                Object::DestinationRule(o) => {
                    ("DestinationRule", validate_destination_rule(&o.spec))
                }
                Object::Gateway(o) => ("Gateway", validate_gateway(&o.spec)),
                Object::Other(v) => {
                    panic!("{}: unexpected non-meshplane object {v}", path.display())
                }
            };
            result.unwrap_or_else(|e| panic!("{}: {kind} invalid: {e}", path.display()));
            kinds.push(kind);
        }
    }
    // The samples cover the whole API surface a user meets first.
    for kind in [
        "MeshControlPlane",
        "MeshRevisionTag",
        "ServiceEntry",
        "Sidecar",
        "EnvoyFilter",
        "VirtualService",
        "DestinationRule",
        "Gateway",
    ] {
        assert!(kinds.contains(&kind), "no sample of {kind}");
    }
}

#[test]
fn samples_describe_two_tenants_and_a_tag() {
    let read =
        |name: &str| std::fs::read_to_string(samples_dir().join(name)).expect("sample exists");
    let mut revisions = Vec::new();
    let mut tags = Vec::new();
    for file in ["blue.yaml", "blue-v2.yaml", "green.yaml"] {
        for obj in parse_objects(&read(file)).expect("parses") {
            match obj {
                Object::MeshControlPlane(m) => {
                    revisions.push((m.spec.tenant.clone(), m.revision()))
                }
                Object::MeshRevisionTag(t) => tags.push((
                    t.metadata.name.clone().unwrap_or_default(),
                    t.spec.revision.clone(),
                )),
                _ => {}
            }
        }
    }
    revisions.sort();
    assert_eq!(
        revisions,
        vec![
            ("blue".to_string(), "blue-v1".to_string()),
            ("blue".to_string(), "blue-v2".to_string()),
            ("green".to_string(), "green".to_string()),
        ]
    );
    assert_eq!(
        tags,
        vec![("blue-stable".to_string(), "blue-v1".to_string())]
    );
}

/// The ClusterRole shipped for tenant admins writes tenant config but can neither create nor
/// change control planes or tags (creating a `MeshControlPlane` is a cluster-admin power), nor
/// touch namespaces, RBAC or anything outside meshplane's config groups. In the core group it
/// only reads pods (and through `pods/proxy`) and mints tokens of the one debug ServiceAccount
/// (contract 12), never of any other ServiceAccount.
#[test]
fn the_tenant_admin_role_cannot_create_or_change_control_planes() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/rbac/tenant_admin_role.yaml");
    let text = std::fs::read_to_string(&path).expect("config/rbac/tenant_admin_role.yaml");
    let docs = meshplane_crds::manifest::parse_documents(&text).expect("YAML");
    assert_eq!(docs.len(), 1, "one ClusterRole");
    let role = &docs[0];
    assert_eq!(role["kind"], "ClusterRole");
    assert_eq!(role["metadata"]["name"], "meshplane-tenant-admin");
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let rules = role["rules"].as_array().expect("rules");
    assert!(!rules.is_empty());
    for rule in rules {
        let groups = strings(&rule["apiGroups"]);
        let resources = strings(&rule["resources"]);
        let verbs = strings(&rule["verbs"]);
        assert!(!groups.iter().any(|g| g == "*"), "no wildcard: {rule}");
        if groups.iter().any(|g| g.is_empty()) {
            assert_eq!(groups, [""], "{rule}");
            let names = strings(&rule["resourceNames"]);
            let allowed = match resources.as_slice() {
                [r] if r == "pods" => verbs.iter().all(|v| v == "get" || v == "list"),
                [r] if r == "pods/proxy" => verbs == ["get"],
                [r] if r == "serviceaccounts/token" => {
                    verbs == ["create"] && names == [meshplane_crds::names::debug::SERVICE_ACCOUNT]
                }
                _ => false,
            };
            assert!(
                allowed,
                "core group: only pod reads and the debug account's tokens: {rule}"
            );
            continue;
        }
        assert!(rule.get("nonResourceURLs").is_none(), "{rule}");
        if groups.iter().any(|g| g == "meshplane.io") {
            let writes = [
                "create",
                "update",
                "patch",
                "delete",
                "deletecollection",
                "*",
            ];
            assert!(
                !verbs.iter().any(|v| writes.contains(&v.as_str())),
                "tenant admins only read control planes and tags: {rule}"
            );
        } else {
            assert!(
                groups
                    .iter()
                    .all(|g| g == "networking.meshplane.io" || g == "security.meshplane.io"),
                "only meshplane's config groups: {rule}"
            );
        }
        assert!(!resources.is_empty(), "{rule}");
    }
}
