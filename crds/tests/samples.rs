//! Every sample in `config/samples/` is a valid meshplane object.

use std::path::PathBuf;

use meshplane_crds::manifest::{parse_objects, Object};
use meshplane_crds::validation::{
    validate_envoy_filter, validate_mesh_control_plane, validate_revision_tag,
    validate_service_entry, validate_sidecar,
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
