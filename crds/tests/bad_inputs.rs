//! Bad input fails with the expected typed error, naming the field.

use meshplane_crds::manifest::{parse_objects, ManifestError, Object};
use meshplane_crds::validation::{
    validate_envoy_filter, validate_export_to, validate_host, validate_mesh_control_plane,
    validate_service_entry, validate_sidecar, validate_sidecar_host, ValidationError,
};
use meshplane_crds::MeshControlPlane;

fn mcp(yaml_spec: &str) -> MeshControlPlane {
    let text = format!(
        "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata:\n  name: blue-v1\nspec:\n{yaml_spec}"
    );
    match parse_objects(&text).expect("parses").pop() {
        Some(Object::MeshControlPlane(m)) => *m,
        other => panic!("expected a MeshControlPlane, got {other:?}"),
    }
}

fn first_error(r: Result<(), meshplane_crds::validation::ValidationErrors>) -> ValidationError {
    r.expect_err("must be invalid")
        .0
        .into_iter()
        .next()
        .expect("at least one error")
}

#[test]
fn empty_tenant_is_rejected() {
    let err = first_error(validate_mesh_control_plane(&mcp("  tenant: \"\"\n")));
    assert_eq!(
        err,
        ValidationError::Empty {
            field: "spec.tenant".into()
        }
    );
}

#[test]
fn overlong_revision_is_rejected_with_the_limit() {
    let rev = "r".repeat(33);
    let err = first_error(validate_mesh_control_plane(&mcp(&format!(
        "  tenant: blue\n  revision: {rev}\n"
    ))));
    match err {
        ValidationError::TooLong {
            field, len, max, ..
        } => {
            assert_eq!((field.as_str(), len, max), ("spec.revision", 33, 32));
        }
        other => panic!("expected TooLong, got {other:?}"),
    }
}

#[test]
fn revision_must_start_with_a_letter() {
    let err = first_error(validate_mesh_control_plane(&mcp(
        "  tenant: blue\n  revision: 1blue\n",
    )));
    assert!(
        matches!(err, ValidationError::InvalidDnsLabel { ref field, .. } if field == "spec.revision"),
        "{err:?}"
    );
}

#[test]
fn trust_domains_are_spiffe_and_another_tenants_default_is_reserved() {
    let td = |value: &str| {
        validate_mesh_control_plane(&mcp(&format!(
            "  tenant: blue\n  meshConfig:\n    trustDomain: \"{value}\"\n"
        )))
    };
    assert!(
        td("blue.meshplane.local").is_ok(),
        "the tenant's own default"
    );
    assert!(td("prod.example.org").is_ok());
    for bad in [
        "red.meshplane.local",
        "meshplane.local",
        "Blue.example",
        "*.example",
    ] {
        let err = first_error(td(bad));
        assert_eq!(err.field(), "spec.meshConfig.trustDomain", "{bad}: {err}");
    }
    let unset = mcp("  tenant: blue\n");
    assert!(validate_mesh_control_plane(&unset).is_ok());
    assert_eq!(unset.trust_domain(), "blue.meshplane.local");
}

#[test]
fn pod_networks_must_be_cidrs() {
    let nets = |value: &str| {
        validate_mesh_control_plane(&mcp(&format!(
            "  tenant: blue\n  meshConfig:\n    podNetworks: {value}\n"
        )))
    };
    assert!(nets("[198.18.0.0/16, 198.19.0.0/16]").is_ok());
    for bad in ["[198.18.0.0]", "[198.18.0.0/33]", "[pods]"] {
        let err = first_error(nets(bad));
        assert_eq!(
            err.field(),
            "spec.meshConfig.podNetworks[0]",
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("not a CIDR"), "{bad}: {err}");
    }
}

#[test]
fn unknown_isolation_mode_fails_to_decode() {
    let text = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata:\n  name: blue-v1\nspec:\n  tenant: blue\n  isolation: Loose\n";
    let err = parse_objects(text).expect_err("unknown variant");
    match err {
        ManifestError::Decode { kind, name, source } => {
            assert_eq!(
                (kind.as_str(), name.as_str()),
                ("MeshControlPlane", "blue-v1")
            );
            let msg = source.to_string();
            assert!(msg.contains("Loose") && msg.contains("Strict"), "{msg}");
        }
        other => panic!("expected Decode, got {other:?}"),
    }
}

#[test]
fn invalid_selector_is_rejected() {
    let err = first_error(validate_mesh_control_plane(&mcp(
        "  tenant: blue\n  namespaceSelector:\n    matchExpressions:\n      - key: team\n        operator: Like\n        values: [x]\n",
    )));
    assert!(
        matches!(err, ValidationError::InvalidSelector { ref field, .. } if field.starts_with("spec.namespaceSelector")),
        "{err:?}"
    );
}

#[test]
fn bad_hosts_are_rejected() {
    for (host, allow_any) in [
        ("", false),
        ("*", false),
        ("foo.*.com", false),
        ("under_score.example.com", false),
        ("-lead.example.com", false),
        ("a..b", false),
    ] {
        let err = validate_host(host, "spec.hosts[0]", allow_any).expect_err(host);
        assert!(
            matches!(err, ValidationError::InvalidHost { .. }),
            "{host}: {err:?}"
        );
    }
    for host in [
        "web",
        "web.shop.svc.cluster.local",
        "*.example.com",
        "API.Example.com",
    ] {
        validate_host(host, "spec.hosts[0]", false).unwrap_or_else(|e| panic!("{host}: {e}"));
    }
    validate_host("*", "spec.egress[0].hosts[0]", true).expect("'*' allowed in Sidecar imports");
}

#[test]
fn export_to_entries_must_be_namespaces_or_keywords() {
    for bad in [
        vec!["Green_NS"],
        vec!["~", "."],
        vec![".", "."],
        vec!["shop.svc"],
    ] {
        let entries: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
        let err = validate_export_to(&entries, "spec.exportTo").expect_err("invalid");
        assert!(
            matches!(err, ValidationError::InvalidExportTo { .. }),
            "{bad:?}: {err:?}"
        );
    }
    for good in [
        vec!["*"],
        vec!["."],
        vec!["~"],
        vec![".", "shop", "payments"],
    ] {
        let entries: Vec<String> = good.iter().map(|s| s.to_string()).collect();
        validate_export_to(&entries, "spec.exportTo").unwrap_or_else(|e| panic!("{good:?}: {e}"));
    }
}

#[test]
fn service_entry_with_bad_host_names_the_field() {
    let text = "apiVersion: networking.meshplane.io/v1alpha1\nkind: ServiceEntry\nmetadata:\n  name: x\n  namespace: shop\nspec:\n  hosts: [\"ok.example.com\", \"bad host\"]\n  exportTo: [\"not a ns\"]\n";
    let Some(Object::ServiceEntry(se)) = parse_objects(text).expect("parses").pop() else {
        panic!("expected ServiceEntry");
    };
    let errs = validate_service_entry(&se.spec).expect_err("invalid").0;
    let fields: Vec<&str> = errs.iter().map(|e| e.field()).collect();
    assert_eq!(fields, vec!["spec.hosts[1]", "spec.exportTo"]);
}

#[test]
fn static_service_entry_needs_ip_endpoints() {
    let text = "apiVersion: networking.meshplane.io/v1alpha1\nkind: ServiceEntry\nmetadata:\n  name: x\n  namespace: shop\nspec:\n  hosts: [db.internal]\n  resolution: STATIC\n  ports: [{number: 5432, name: tcp-pg, protocol: TCP}]\n  endpoints: [{address: db.example.com}]\n";
    let Some(Object::ServiceEntry(se)) = parse_objects(text).expect("parses").pop() else {
        panic!("expected ServiceEntry");
    };
    let err = first_error(validate_service_entry(&se.spec));
    assert!(
        matches!(err, ValidationError::InvalidAddress { ref field, .. } if field == "spec.endpoints[0].address"),
        "{err:?}"
    );
}

#[test]
fn sidecar_hosts_need_namespace_slash_host() {
    assert!(matches!(
        validate_sidecar_host("shop", "spec.egress[0].hosts[0]"),
        Err(ValidationError::InvalidHost { .. })
    ));
    validate_sidecar_host("./*", "f").expect("own namespace");
    validate_sidecar_host("*/api.example.com", "f").expect("host in any namespace");
    let text = "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata:\n  name: default\n  namespace: shop\nspec:\n  egress:\n    - hosts: [\"./*\", \"Bad_NS/*\"]\n  ingress:\n    - port: {number: 9080, protocol: HTTP, name: http}\n      defaultEndpoint: 198.19.0.1:9080\n";
    let Some(Object::Sidecar(sc)) = parse_objects(text).expect("parses").pop() else {
        panic!("expected Sidecar");
    };
    let errs = validate_sidecar(&sc.spec).expect_err("invalid").0;
    let fields: Vec<&str> = errs.iter().map(|e| e.field()).collect();
    assert_eq!(
        fields,
        vec!["spec.egress[0].hosts[1]", "spec.ingress[0].defaultEndpoint"]
    );
}

#[test]
fn envoy_filter_operation_must_fit_apply_to() {
    let text = "apiVersion: networking.meshplane.io/v1alpha1\nkind: EnvoyFilter\nmetadata:\n  name: f\n  namespace: shop\nspec:\n  configPatches:\n    - applyTo: CLUSTER\n      patch: {operation: INSERT_BEFORE, value: {name: x}}\n    - applyTo: HTTP_FILTER\n      patch: {operation: ADD}\n";
    let Some(Object::EnvoyFilter(ef)) = parse_objects(text).expect("parses").pop() else {
        panic!("expected EnvoyFilter");
    };
    let errs = validate_envoy_filter(&ef.spec).expect_err("invalid").0;
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0]
            .to_string()
            .contains("not supported for applyTo Cluster"),
        "{}",
        errs[0]
    );
    assert!(
        errs[1].to_string().contains("needs patch.value"),
        "{}",
        errs[1]
    );
}
