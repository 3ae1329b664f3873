//! Golden-file tests of the rendered objects for the samples, and a proof by evaluation that
//! Strict-mode RBAC never reaches a non-member namespace.

use std::collections::BTreeSet;
use std::path::PathBuf;

use meshplane_crds::manifest::{parse_objects, Object};
use meshplane_crds::membership::{
    compute, ControlPlaneFacts, Membership, NamespaceFacts, TagFacts,
};
use meshplane_crds::{names, MeshControlPlane, MeshRevisionTag};
use meshplane_operator::render::{self, DesiredObject, Kind, Observed, RenderInput};
use meshplane_operator::tls::WebhookTls;
use serde_json::Value;

fn samples() -> (Vec<MeshControlPlane>, Vec<MeshRevisionTag>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let (mut cps, mut tags) = (Vec::new(), Vec::new());
    for file in ["blue.yaml", "blue-v2.yaml", "green.yaml"] {
        let text = std::fs::read_to_string(dir.join(file)).expect("sample readable");
        for obj in parse_objects(&text).expect("sample parses") {
            match obj {
                Object::MeshControlPlane(m) => cps.push(*m),
                Object::MeshRevisionTag(t) => tags.push(*t),
                _ => {}
            }
        }
    }
    for (i, cp) in cps.iter_mut().enumerate() {
        cp.metadata.uid = Some(format!(
            "uid-{}",
            cp.metadata.name.clone().unwrap_or_default()
        ));
        cp.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + i as i64).expect("valid"),
            ));
    }
    (cps, tags)
}

/// shop follows the blue-stable tag, cart runs the blue-v2 canary, bank is green's, and
/// intruder is labelled for blue but owned by team green, so blue rejects it.
fn cluster_namespaces() -> Vec<NamespaceFacts> {
    vec![
        NamespaceFacts::new("shop", &[(names::REV_LABEL, "blue-stable")]),
        NamespaceFacts::new("cart", &[(names::REV_LABEL, "blue-v2")]),
        NamespaceFacts::new("bank", &[(names::REV_LABEL, "green"), ("team", "green")]),
        NamespaceFacts::new(
            "intruder",
            &[(names::REV_LABEL, "blue-v1"), ("team", "green")],
        ),
        NamespaceFacts::new("outsider", &[]),
    ]
}

fn membership(
    cps: &[MeshControlPlane],
    tags: &[MeshRevisionTag],
    namespaces: &[NamespaceFacts],
) -> Membership {
    let cp_facts: Vec<ControlPlaneFacts> = cps.iter().map(ControlPlaneFacts::from).collect();
    let tag_facts: Vec<TagFacts> = tags.iter().map(TagFacts::from).collect();
    compute(namespaces, &cp_facts, &tag_facts)
}

/// Fixed material so goldens are stable (real material is random).
fn fixed_tls() -> WebhookTls {
    WebhookTls {
        ca_bundle_pem: "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n".into(),
        cert_pem: "-----BEGIN CERTIFICATE-----\nSERVING\n-----END CERTIFICATE-----\n".into(),
        key_pem: "-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n".into(),
    }
}

fn render_of(cp: &MeshControlPlane, m: &Membership, observed: &Observed) -> Vec<DesiredObject> {
    let rev = m
        .revision_of_control_plane(cp.metadata.name.as_deref().unwrap_or_default())
        .expect("active");
    let members = m.tenant_members(&rev.tenant);
    render::render(&RenderInput {
        control_plane: cp,
        revision: rev,
        tenant_members: &members,
        status_writer: m.is_status_writer(&cp.revision()),
        tls: &fixed_tls(),
        observed,
        operator: &render::OperatorAccount::default(),
        client_auth: None,
        managed_gateways: &[],
        gateway_classes: &Default::default(),
    })
}

fn to_yaml(objects: &[DesiredObject]) -> String {
    objects
        .iter()
        .map(|o| serde_saphyr::to_string(&o.body).expect("serializable"))
        .collect::<Vec<_>>()
        .join("---\n")
}

fn check_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("golden writable");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing golden {}; run with UPDATE_GOLDEN=1",
            path.display()
        )
    });
    assert_eq!(
        actual, expected,
        "golden {name} differs; run with UPDATE_GOLDEN=1 to accept"
    );
}

#[test]
fn rendered_samples_match_goldens() {
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    assert!(m.conflicts.is_empty(), "{:?}", m.conflicts);
    for cp in &cps {
        let name = cp.metadata.name.clone().unwrap_or_default();
        // blue-v1's Service already has its ClusterIP; the others fall back to the DNS name.
        let observed = Observed {
            service_cluster_ip: (name == "blue-v1").then(|| "198.19.96.10".to_string()),
            root_cert: None,
        };
        check_golden(
            &format!("render-{name}.yaml"),
            &to_yaml(&render_of(cp, &m, &observed)),
        );
    }
}

/// The objects the tenant's revisions share in the control namespace: the namespace itself and
/// the debug ServiceAccount (contract 12). Tenant labels only, no revision label, no owner.
fn is_tenant_wide(o: &DesiredObject) -> bool {
    o.key.kind == Kind::Namespace
        || (o.key.kind == Kind::ServiceAccount && o.key.name == names::debug::SERVICE_ACCOUNT)
}

/// Contract 12: every revision of a tenant renders the same debug ServiceAccount in the
/// control namespace (so none fights another over it and none prunes it), and it has no RBAC.
#[test]
fn the_debug_account_is_shared_by_the_tenants_revisions_and_has_no_rbac() {
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    let debug_account = |objects: &[DesiredObject]| {
        let found: Vec<_> = objects
            .iter()
            .filter(|o| o.key.kind == Kind::ServiceAccount && o.key.name == "meshplane-debug")
            .cloned()
            .collect();
        assert_eq!(found.len(), 1, "one debug account per revision's render");
        found[0].clone()
    };
    let blue_v1 = render_of(&cps[0], &m, &Observed::default());
    let blue_v2 = render_of(&cps[1], &m, &Observed::default());
    let green = render_of(&cps[2], &m, &Observed::default());
    let v1 = debug_account(&blue_v1);
    assert_eq!(
        v1,
        debug_account(&blue_v2),
        "the same object from both revisions"
    );
    assert_eq!(v1.key.namespace.as_deref(), Some("meshplane-blue"));
    assert_eq!(
        debug_account(&green).key.namespace.as_deref(),
        Some("meshplane-green")
    );
    let meta = &v1.body["metadata"];
    assert_eq!(meta["labels"][names::TENANT_LABEL], "blue");
    assert_eq!(
        meta["labels"][names::MANAGED_BY_LABEL],
        names::MANAGED_BY_VALUE
    );
    assert!(
        meta["labels"].get(names::REVISION_LABEL).is_none(),
        "{meta}"
    );
    assert!(meta.get("ownerReferences").is_none(), "{meta}");
    for o in blue_v1
        .iter()
        .filter(|o| o.key.kind == Kind::RoleBinding || o.key.kind == Kind::ClusterRoleBinding)
    {
        let subjects = o.body["subjects"].as_array().cloned().unwrap_or_default();
        assert!(
            !subjects.iter().any(|s| s["name"] == "meshplane-debug"),
            "the debug account is bound to nothing: {}",
            o.key
        );
    }
}

#[test]
fn bootstrap_and_webhooks_land_exactly_where_the_product_says() {
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    let blue_v1 = render_of(&cps[0], &m, &Observed::default());
    let bootstrap_namespaces: BTreeSet<String> = blue_v1
        .iter()
        .filter(|o| o.key.kind == Kind::ConfigMap && o.key.name == "meshplane-blue-v1-bootstrap")
        .filter_map(|o| o.key.namespace.clone())
        .collect();
    // Every member of tenant blue (both revisions), never green's, the rejected or the outsider.
    assert_eq!(
        bootstrap_namespaces,
        BTreeSet::from(["cart".to_string(), "shop".to_string()])
    );
    let injector = blue_v1
        .iter()
        .find(|o| o.key.kind == Kind::MutatingWebhookConfiguration)
        .expect("injector");
    let selector = &injector.body["webhooks"][0]["namespaceSelector"]["matchExpressions"];
    assert_eq!(
        selector[0]["values"],
        serde_json::json!(["blue-v1", "blue-stable"])
    );
    // The tenant's own selector is ANDed in, so the rejected namespace gets no injection.
    assert_eq!(selector[1]["key"], "team");
    for o in &blue_v1 {
        if is_tenant_wide(o) {
            continue;
        }
        let labels = &o.body["metadata"]["labels"];
        assert_eq!(
            labels[names::MANAGED_BY_LABEL],
            names::MANAGED_BY_VALUE,
            "{}",
            o.key
        );
        assert_eq!(labels[names::TENANT_LABEL], "blue", "{}", o.key);
        assert_eq!(labels[names::REVISION_LABEL], "blue-v1", "{}", o.key);
        assert_eq!(
            o.body["metadata"]["ownerReferences"][0]["uid"], "uid-blue-v1",
            "{}",
            o.key
        );
    }
}

#[test]
fn bootstrap_uses_the_cluster_ip_when_assigned_and_http2_over_tls_for_xds() {
    const HOST: &str = "meshplane-blue-v1.meshplane-blue.svc";
    let with_ip = render::envoy_bootstrap("198.18.128.10", HOST);
    let cluster = &with_ip["static_resources"]["clusters"][0];
    assert_eq!(cluster["name"], "xds-grpc");
    assert_eq!(cluster["type"], "STATIC");
    assert!(cluster["typed_extension_protocol_options"]
        ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]
        ["http2_protocol_options"]
        .is_object());
    // Contract 6: large pushes arrive in large frames.
    assert_eq!(
        cluster["typed_extension_protocol_options"]
            ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]
            ["http2_protocol_options"]["custom_settings_parameters"],
        serde_json::json!([{"identifier": 5, "value": 1_048_576}])
    );
    // Contract 11: the TLS port, the Service's name as SNI and as the name its certificate
    // must carry, checked against the mounted bundle.
    let endpoint = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        ["address"]["socket_address"];
    assert_eq!(endpoint["address"], "198.18.128.10");
    assert_eq!(endpoint["port_value"], 15012);
    let tls = &cluster["transport_socket"]["typed_config"];
    assert_eq!(tls["sni"], HOST);
    let validation = &tls["common_tls_context"]["validation_context"];
    assert_eq!(
        validation["trusted_ca"]["filename"],
        "/etc/meshplane/bootstrap/root-cert.pem"
    );
    assert_eq!(
        validation["match_typed_subject_alt_names"][0]["matcher"]["exact"],
        HOST
    );
    let with_dns = render::envoy_bootstrap(HOST, HOST);
    assert_eq!(
        with_dns["static_resources"]["clusters"][0]["type"],
        "STRICT_DNS"
    );
}

/// A tiny RBAC evaluator: can `subject` do `verb` on `group/resource` in `namespace`
/// (`None` = cluster scope)?
struct Rbac<'a> {
    objects: &'a [DesiredObject],
}

impl Rbac<'_> {
    fn rules_of(&self, kind: Kind, namespace: Option<&str>, name: &str) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|o| {
                o.key.kind == kind && o.key.namespace.as_deref() == namespace && o.key.name == name
            })
            .flat_map(|o| o.body["rules"].as_array().into_iter().flatten())
            .collect()
    }

    fn allows(rule: &Value, verb: &str, group: &str, resource: &str) -> bool {
        let has = |field: &str, v: &str| {
            rule[field]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == v || x == "*"))
        };
        has("verbs", verb) && has("apiGroups", group) && has("resources", resource)
    }

    fn can(
        &self,
        sa: (&str, &str),
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> bool {
        self.objects
            .iter()
            .filter(|b| matches!(b.key.kind, Kind::RoleBinding | Kind::ClusterRoleBinding))
            .filter(|b| {
                b.body["subjects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| {
                        s["kind"] == "ServiceAccount" && s["name"] == sa.0 && s["namespace"] == sa.1
                    })
            })
            .any(|b| {
                let role_ref = &b.body["roleRef"];
                let role_name = role_ref["name"].as_str().unwrap_or_default();
                let (rules, reach) = if b.key.kind == Kind::ClusterRoleBinding {
                    // A ClusterRoleBinding grants its ClusterRole everywhere.
                    (self.rules_of(Kind::ClusterRole, None, role_name), true)
                } else {
                    let binding_ns = b.key.namespace.as_deref();
                    let rules = if role_ref["kind"] == "ClusterRole" {
                        self.rules_of(Kind::ClusterRole, None, role_name)
                    } else {
                        self.rules_of(Kind::Role, binding_ns, role_name)
                    };
                    (rules, namespace.is_some() && binding_ns == namespace)
                };
                reach && rules.iter().any(|r| Self::allows(r, verb, group, resource))
            })
    }
}

const VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];
const NAMESPACED: &[(&str, &str)] = &[
    ("", "services"),
    ("", "pods"),
    ("", "configmaps"),
    ("", "secrets"),
    ("discovery.k8s.io", "endpointslices"),
    ("networking.meshplane.io", "serviceentries"),
    ("networking.meshplane.io", "envoyfilters"),
    ("networking.meshplane.io", "sidecars"),
    ("networking.meshplane.io", "virtualservices"),
    ("networking.meshplane.io", "virtualservices/status"),
    ("networking.meshplane.io", "destinationrules"),
    ("networking.meshplane.io", "gateways/status"),
    ("rbac.authorization.k8s.io", "roles"),
    ("events.k8s.io", "events"),
];

#[test]
fn strict_rbac_never_reaches_a_non_member_namespace() {
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    for cp in &cps {
        let objects = render_of(cp, &m, &Observed::default());
        let rev = cp.revision();
        let control_ns = cp.control_namespace();
        let sa = (names::instance_name(&rev), control_ns.clone());
        let rbac = Rbac { objects: &objects };
        let members = m.tenant_members(&cp.spec.tenant);
        let all_namespaces = [
            "shop",
            "cart",
            "bank",
            "intruder",
            "outsider",
            "meshplane-blue",
            "meshplane-green",
            "kube-system",
        ];
        for ns in all_namespaces {
            for verb in VERBS {
                for (group, resource) in NAMESPACED {
                    let allowed = rbac.can((&sa.0, &sa.1), verb, group, resource, Some(ns));
                    if allowed {
                        assert!(
                            members.contains(ns) || ns == control_ns,
                            "{rev}: {verb} {resource} allowed in non-member {ns}"
                        );
                        assert!(
                            ["get", "list", "watch"].contains(verb)
                                || (ns == control_ns
                                    && *verb == "patch"
                                    && *resource == "configmaps")
                                // The Accepted condition of the tenant's traffic config.
                                || (*verb == "patch" && resource.ends_with("/status"))
                                // Warning Events on config it does not apply.
                                || (["create", "patch"].contains(verb) && *resource == "events"),
                            "{rev}: write {verb} {resource} in {ns}"
                        );
                        assert_ne!(*resource, "secrets", "{rev}: secrets readable in {ns}");
                    }
                }
            }
            // Members can be read, and get Events about the config the instance skips.
            if members.contains(ns) || ns == control_ns {
                assert!(
                    rbac.can((&sa.0, &sa.1), "watch", "", "services", Some(ns)),
                    "{rev}: {ns}"
                );
                assert!(
                    rbac.can(
                        (&sa.0, &sa.1),
                        "create",
                        "events.k8s.io",
                        "events",
                        Some(ns)
                    ),
                    "{rev}: Events in {ns}"
                );
            }
        }
        // The only cluster-scoped rights: TokenReview and SubjectAccessReview.
        for (group, resource) in [
            ("authentication.k8s.io", "tokenreviews"),
            ("authorization.k8s.io", "subjectaccessreviews"),
        ] {
            assert!(rbac.can((&sa.0, &sa.1), "create", group, resource, None));
        }
        for (group, resource) in [
            ("", "namespaces"),
            ("", "nodes"),
            ("rbac.authorization.k8s.io", "clusterroles"),
        ] {
            for verb in VERBS {
                assert!(
                    !rbac.can((&sa.0, &sa.1), verb, group, resource, None),
                    "{rev}: {verb} {resource}"
                );
            }
        }
    }
}

#[test]
fn a_namespace_leaving_loses_its_bootstrap_reader_and_restarter_bindings() {
    let (cps, tags) = samples();
    let before = membership(&cps, &tags, &cluster_namespaces());
    let mut namespaces = cluster_namespaces();
    namespaces.retain(|n| n.name != "shop");
    namespaces.push(NamespaceFacts::new("shop", &[]));
    let after = membership(&cps, &tags, &namespaces);
    let keys = |m: &Membership| -> BTreeSet<(Kind, String)> {
        render_of(&cps[1], m, &Observed::default())
            .into_iter()
            .filter(|o| o.key.namespace.as_deref() == Some("shop"))
            .map(|o| (o.key.kind, o.key.name.clone()))
            .collect()
    };
    assert_eq!(
        keys(&before),
        BTreeSet::from([
            (Kind::Role, "meshplane-blue-v2-reader".to_string()),
            (Kind::RoleBinding, "meshplane-blue-v2-reader".to_string()),
            (Kind::RoleBinding, "meshplane-blue-v2-restarter".to_string()),
            (Kind::ConfigMap, "meshplane-blue-v2-bootstrap".to_string()),
        ])
    );
    assert!(keys(&after).is_empty());
}

#[test]
fn shared_mode_reads_cluster_wide_through_one_binding_and_no_per_namespace_roles() {
    let (mut cps, tags) = samples();
    cps[2].spec.isolation = meshplane_crds::IsolationMode::Shared;
    let m = membership(&cps, &tags, &cluster_namespaces());
    let objects = render_of(&cps[2], &m, &Observed::default());
    assert!(!objects
        .iter()
        .any(|o| o.key.name == "meshplane-green-reader"));
    let rbac = Rbac { objects: &objects };
    let sa = ("meshplane-green", "meshplane-green");
    assert!(rbac.can(sa, "list", "", "services", Some("outsider")));
    assert!(rbac.can(
        sa,
        "watch",
        "discovery.k8s.io",
        "endpointslices",
        Some("kube-system")
    ));
    assert!(!rbac.can(sa, "list", "", "secrets", Some("outsider")));
    assert!(!rbac.can(sa, "patch", "", "services", Some("bank")));
    let cluster_bindings = objects
        .iter()
        .filter(|o| o.key.kind == Kind::ClusterRoleBinding)
        .count();
    assert_eq!(cluster_bindings, 1);
}

/// Who can make an instance read a namespace. No rendered Role or ClusterRole
/// lets anyone write a members ConfigMap (the instance's only ConfigMap write is its proxies
/// ConfigMap, by name), nor does the shipped tenant-admin role; in Strict mode a members
/// ConfigMap listing `kube-system` or another tenant's namespace gets the instance nothing
/// there, as RBAC reaches only members; in Shared mode, where RBAC reaches everywhere, the
/// instance may read what it checks that ConfigMap against: Namespaces, control planes, tags.
#[test]
fn members_configmaps_are_the_operators_and_shared_instances_may_check_them() {
    let (mut cps, tags) = samples();
    let sa = ("meshplane-green", "meshplane-green");
    let writes = [
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
        "*",
    ];
    for isolation in [
        meshplane_crds::IsolationMode::Strict,
        meshplane_crds::IsolationMode::Shared,
    ] {
        cps[2].spec.isolation = isolation;
        let m = membership(&cps, &tags, &cluster_namespaces());
        let objects = render_of(&cps[2], &m, &Observed::default());
        for role in objects
            .iter()
            .filter(|o| matches!(o.key.kind, Kind::Role | Kind::ClusterRole))
        {
            for rule in role.body["rules"].as_array().into_iter().flatten() {
                let on_configmaps = rule["resources"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|x| x == "configmaps" || x == "*"));
                let writing = rule["verbs"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| writes.iter().any(|w| x == w)));
                if on_configmaps && writing {
                    assert_eq!(
                        rule["resourceNames"],
                        serde_json::json!([names::proxies_configmap("green")]),
                        "{isolation:?}: {} {} writes ConfigMaps beyond its proxies ConfigMap: {rule}",
                        role.key.kind.api_resource().kind,
                        role.key.name
                    );
                }
            }
        }
        let rbac = Rbac { objects: &objects };
        let shared = isolation == meshplane_crds::IsolationMode::Shared;
        for outside in ["kube-system", "shop", "outsider"] {
            assert_eq!(
                rbac.can(sa, "list", "", "services", Some(outside)),
                shared,
                "{isolation:?}: services in {outside}"
            );
        }
        assert!(rbac.can(sa, "list", "", "services", Some("bank")));
        for (group, resource) in [
            ("", "namespaces"),
            ("meshplane.io", "meshcontrolplanes"),
            ("meshplane.io", "meshrevisiontags"),
        ] {
            assert_eq!(
                rbac.can(sa, "watch", group, resource, None),
                shared,
                "{isolation:?}: {resource}"
            );
        }
    }
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/rbac/tenant_admin_role.yaml");
    let role = meshplane_crds::manifest::parse_documents(
        &std::fs::read_to_string(path).expect("tenant admin role"),
    )
    .expect("YAML");
    let grants_configmaps = role.iter().any(|d| {
        d["rules"].as_array().into_iter().flatten().any(|r| {
            let has = |field: &str, v: &str| {
                r[field]
                    .as_array()
                    .is_some_and(|xs| xs.iter().any(|x| x == v || x == "*"))
            };
            has("apiGroups", "") && has("resources", "configmaps")
        })
    });
    assert!(!grants_configmaps, "tenant admins get no ConfigMap right");
}

/// The data of a rendered ConfigMap or (base64-decoded) Secret.
fn data_of(o: &DesiredObject) -> meshplane_contracts::Data {
    use base64::Engine as _;
    let secret = o.key.kind == Kind::Secret;
    o.body["data"]
        .as_object()
        .expect("data")
        .iter()
        .map(|(k, v)| {
            let text = v.as_str().expect("string data").to_string();
            let text = if secret {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .expect("base64");
                String::from_utf8(raw).expect("utf-8")
            } else {
                text
            };
            (k.clone(), text)
        })
        .collect()
}

/// Contracts 2-6 and 8 from the operator's side: what it renders parses with the contract's
/// own readers (the instance, injector and launcher parse with the same ones), and the
/// bootstrap it renders is one the proxy launcher can complete with a token.
#[test]
fn rendered_objects_satisfy_the_contracts() {
    use meshplane_contracts::{bootstrap, members, ownership, proxies, webhook_tls, webhooks};
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    let blue_v1 = render_of(&cps[0], &m, &Observed::default());
    let find = |kind: Kind, name: &str| {
        blue_v1
            .iter()
            .find(|o| o.key.kind == kind && o.key.name == name)
            .unwrap_or_else(|| panic!("{kind:?} {name} rendered"))
    };

    let read = members::MembersData::from_data(&data_of(find(
        Kind::ConfigMap,
        &members::configmap_name("blue-v1"),
    )))
    .expect("contract 2");
    assert_eq!(read.members, BTreeSet::from(["cart".into(), "shop".into()]));
    assert_eq!(read.attached, BTreeSet::from(["shop".into()]));
    assert_eq!(read.tags, BTreeSet::from(["blue-stable".into()]));
    let mesh: meshplane_crds::MeshConfig =
        serde_json::from_str(read.mesh_config.as_deref().expect("meshConfig")).expect("JSON");
    assert_eq!(mesh, cps[0].spec.mesh_config);

    let counts = find(Kind::ConfigMap, &proxies::configmap_name("blue-v1"));
    assert!(
        counts.body.get("data").is_none(),
        "contract 3: created empty"
    );

    let tls = webhook_tls::TlsData::from_data(&data_of(find(
        Kind::Secret,
        &webhook_tls::secret_name("blue-v1"),
    )))
    .expect("contract 4");
    assert_eq!(tls.ca_pem, fixed_tls().ca_bundle_pem);
    assert_eq!(
        webhook_tls::ClientAuthData::from_data(&data_of(find(
            Kind::Secret,
            &webhook_tls::secret_name("blue-v1"),
        ))),
        Ok(None),
        "contract 4: no admission client CA unless the platform admin gave one"
    );

    for (kind, name, path) in [
        (
            Kind::MutatingWebhookConfiguration,
            webhooks::injector_configuration("blue-v1"),
            webhooks::INJECT_PATH,
        ),
        (
            Kind::ValidatingWebhookConfiguration,
            webhooks::validator_configuration("blue-v1"),
            webhooks::VALIDATE_PATH,
        ),
    ] {
        let service = &find(kind, &name).body["webhooks"][0]["clientConfig"]["service"];
        assert_eq!(service["path"], path, "contract 5");
        assert_eq!(service["name"], webhooks::instance_name("blue-v1"));
        assert_eq!(service["port"], meshplane_contracts::ports::HTTPS_WEBHOOK);
    }

    let boot = blue_v1
        .iter()
        .find(|o| o.key.name == bootstrap::configmap_name("blue-v1"))
        .expect("a bootstrap ConfigMap");
    let boot = bootstrap::BootstrapData::from_data(&data_of(boot)).expect("contract 6");
    assert_eq!(boot.revision, "blue-v1");
    let node_id = meshplane_contracts::node::NodeId::sidecar(
        "198.18.0.7".parse().expect("ip"),
        "web-1",
        "shop",
    );
    let completed = meshplane_proxy::bootstrap::build_bootstrap(
        &boot.envoy_yaml,
        &meshplane_proxy::bootstrap::BootstrapOptions {
            node_id: node_id.to_string(),
            cluster: "web".into(),
            token: Some("token".into()),
            ..Default::default()
        },
    )
    .expect("the launcher completes the operator's bootstrap");
    assert_eq!(
        completed["dynamic_resources"]["ads_config"]["grpc_services"][0]["initial_metadata"][0]
            ["value"],
        "Bearer token"
    );

    for o in blue_v1.iter().filter(|o| !is_tenant_wide(o)) {
        let labels: std::collections::BTreeMap<String, String> =
            serde_json::from_value(o.body["metadata"]["labels"].clone()).expect("labels");
        assert!(
            ownership::is_owned(&labels, "blue", "blue-v1"),
            "contract 8: {}",
            o.key
        );
    }
}

/// The instance's NetworkPolicy: xDS only from the tenant's namespaces (members and the
/// control namespace, by the immutable name label), never from another tenant's or an
/// outsider; the webhook and metrics ports stay reachable; and every port the instance
/// container opens is named by a rule (a new port without a rule would be closed to all).
#[test]
fn the_instance_network_policy_admits_xds_only_from_the_tenant() {
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    let blue_v1 = render_of(&cps[0], &m, &Observed::default());
    let policy = blue_v1
        .iter()
        .find(|o| o.key.kind == Kind::NetworkPolicy)
        .expect("a NetworkPolicy");
    assert_eq!(policy.key.namespace.as_deref(), Some("meshplane-blue"));
    let spec = &policy.body["spec"];
    assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress"]));
    let deployment = blue_v1
        .iter()
        .find(|o| o.key.kind == Kind::Deployment)
        .expect("the instance");
    assert_eq!(
        spec["podSelector"]["matchLabels"],
        deployment.body["spec"]["selector"]["matchLabels"]
    );
    let rules = spec["ingress"].as_array().expect("ingress rules");
    let rule_of = |port: u64| {
        rules
            .iter()
            .find(|r| {
                r["ports"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["port"] == port))
            })
            .unwrap_or_else(|| panic!("no rule names port {port}: {rules:?}"))
    };
    let xds = rule_of(u64::from(meshplane_contracts::ports::GRPC_XDS_TLS));
    let plaintext = u64::from(meshplane_contracts::ports::GRPC_XDS);
    assert!(
        // A rule without ports would open every port.
        rules.iter().all(|r| r["ports"]
            .as_array()
            .is_some_and(|ps| ps.iter().all(|p| p["port"] != plaintext))),
        "no rule opens plaintext ADS: {rules:?}"
    );
    let from = &xds["from"][0]["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(from["key"], "kubernetes.io/metadata.name");
    assert_eq!(from["operator"], "In");
    let allowed: BTreeSet<String> = from["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    assert_eq!(
        allowed,
        BTreeSet::from(["meshplane-blue".into(), "shop".into(), "cart".into()]),
        "the tenant's members and control namespace, never bank, intruder or outsider"
    );
    for port in [
        meshplane_contracts::ports::HTTPS_WEBHOOK,
        meshplane_contracts::ports::HTTP_MONITORING,
    ] {
        assert!(
            rule_of(u64::from(port)).get("from").is_none(),
            "port {port} is open"
        );
    }
    let container_ports = deployment.body["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .expect("container ports");
    for p in container_ports {
        rule_of(p["containerPort"].as_u64().expect("port"));
    }
}

#[test]
fn restart_rights_are_bound_per_member_namespace_to_the_operator_never_cluster_wide() {
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    for cp in &cps {
        let objects = render_of(cp, &m, &Observed::default());
        let rev = m
            .revision_of_control_plane(cp.metadata.name.as_deref().unwrap_or_default())
            .expect("active");
        let mut expected: BTreeSet<String> = m.tenant_members(&rev.tenant);
        expected.insert(rev.control_namespace.clone());
        let bound: BTreeSet<String> = objects
            .iter()
            .filter(|o| o.body["roleRef"]["name"] == names::WORKLOAD_RESTARTER_ROLE)
            .map(|o| {
                assert_eq!(o.key.kind, Kind::RoleBinding, "{}: never cluster-wide", o.key);
                assert_eq!(o.body["roleRef"]["kind"], "ClusterRole");
                assert_eq!(
                    o.body["subjects"],
                    serde_json::json!([{"kind": "ServiceAccount", "name": "meshplane-operator", "namespace": "meshplane-system"}])
                );
                o.key.namespace.clone().unwrap_or_default()
            })
            .collect();
        assert_eq!(bound, expected, "{}", cp.revision());
    }
}

fn with_gateway(cp: &MeshControlPlane, namespace: Option<&str>) -> MeshControlPlane {
    let mut cp = cp.clone();
    let spec = serde_json::json!({
        "name": "edge",
        "labels": {"istio": "ingressgateway"},
        "allowedNamespaces": ["shop"],
        "service": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    });
    let mut spec: meshplane_crds::controlplane::IngressGatewaySpec =
        serde_json::from_value(spec).expect("gateway spec");
    spec.namespace = namespace.map(str::to_string);
    cp.spec.ingress_gateway = Some(spec);
    cp
}

#[test]
fn the_ingress_gateway_runs_as_a_router_in_the_tenant_and_its_instance_learns_it() {
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    let blue_v1 = with_gateway(&cps[0], None);
    let objects = render_of(&blue_v1, &m, &Observed::default());
    let find = |kind: Kind, ns: &str, name: &str| {
        objects
            .iter()
            .find(|o| {
                o.key.kind == kind && o.key.namespace.as_deref() == Some(ns) && o.key.name == name
            })
            .unwrap_or_else(|| panic!("{kind:?} {ns}/{name} rendered"))
    };
    let deployment = find(Kind::Deployment, "meshplane-blue", "edge");
    let pod = &deployment.body["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["meshplane.io/gateway"], "edge");
    assert_eq!(pod["metadata"]["labels"]["istio"], "ingressgateway");
    assert_eq!(pod["metadata"]["labels"][names::INJECT_LABEL], "false");
    let container = &pod["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let node_id = args
        .iter()
        .position(|a| *a == "--node-id")
        .map(|i| args[i + 1])
        .expect("--node-id");
    assert!(node_id.starts_with("router~"), "{node_id}");
    assert!(args.contains(&"TENANT=blue") && args.contains(&"CAPTURE_MODE=NONE"));
    assert_eq!(container["securityContext"]["runAsUser"], 1337);
    assert_eq!(
        pod["spec"]["volumes"][2]["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        names::token_audience("blue")
    );
    let service = find(Kind::Service, "meshplane-blue", "edge");
    assert_eq!(service.body["spec"]["type"], "ClusterIP");
    assert_eq!(service.body["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(
        service.body["spec"]["selector"]["meshplane.io/gateway"],
        "edge"
    );
    let account = find(Kind::ServiceAccount, "meshplane-blue", "edge");
    assert_eq!(account.body["automountServiceAccountToken"], false);
    // The instance may read Secrets (credentialName) in the gateway's namespace, and only there:
    // a binding of the shipped ClusterRole (the operator holds no Secret read to grant). The
    // gateway's ServiceAccount is bound it too: the instance serves a credential only to a
    // gateway proxy whose ServiceAccount may get it.
    let proxy_reader = names::gateway_proxy_credentials("blue-v1");
    let binding = find(Kind::RoleBinding, "meshplane-blue", &proxy_reader);
    assert_eq!(
        binding.body["roleRef"]["name"],
        names::GATEWAY_CREDENTIALS_ROLE
    );
    assert_eq!(
        binding.body["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "edge", "namespace": "meshplane-blue"}])
    );
    let reader = names::gateway_credential_reader("blue-v1");
    let binding = find(Kind::RoleBinding, "meshplane-blue", &reader);
    assert_eq!(
        binding.body["roleRef"],
        serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": names::GATEWAY_CREDENTIALS_ROLE})
    );
    assert_eq!(
        binding.body["subjects"][0]["name"],
        names::instance_name("blue-v1")
    );
    let grants_secrets = |objects: &[render::DesiredObject]| -> Vec<String> {
        objects
            .iter()
            .filter(|o| {
                matches!(o.key.kind, Kind::Role | Kind::ClusterRole)
                    && o.body["rules"].to_string().contains("\"secrets\"")
                    || o.body["roleRef"]["name"] == names::GATEWAY_CREDENTIALS_ROLE
            })
            .map(|o| format!("{:?} {:?}/{}", o.key.kind, o.key.namespace, o.key.name))
            .collect()
    };
    assert_eq!(
        grants_secrets(&objects),
        [
            format!("RoleBinding Some(\"meshplane-blue\")/{reader}"),
            format!("RoleBinding Some(\"meshplane-blue\")/{proxy_reader}")
        ]
    );
    // The operator's own write powers: in the control namespace, which here also runs the
    // gateway; no gateway binding.
    assert!(!objects
        .iter()
        .any(|o| o.key.name == names::gateway_operator_access("blue-v1")));
    assert!(
        grants_secrets(&render_of(&cps[0], &m, &Observed::default())).is_empty(),
        "no gateway, no Secret read"
    );
    // The control namespace is no member, but the gateway there needs the bootstrap.
    find(
        Kind::ConfigMap,
        "meshplane-blue",
        "meshplane-blue-v1-bootstrap",
    );
    let members = find(
        Kind::ConfigMap,
        "meshplane-blue",
        "meshplane-blue-v1-members",
    );
    let told: Vec<meshplane_crds::controlplane::GatewayDeployment> = serde_json::from_str(
        members.body["data"]["gateways"]
            .as_str()
            .expect("gateways key"),
    )
    .expect("gateways JSON");
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].namespace, "meshplane-blue");
    assert_eq!(told[0].allowed_namespaces, vec!["shop".to_string()]);
    assert_eq!(told[0].labels["istio"], "ingressgateway");
    let input_members = m.tenant_members("blue");
    let rev = m.revision_of_control_plane("blue-v1").expect("active");
    let input = RenderInput {
        control_plane: &blue_v1,
        revision: rev,
        tenant_members: &input_members,
        status_writer: m.is_status_writer(&blue_v1.revision()),
        tls: &fixed_tls(),
        observed: &Observed::default(),
        operator: &render::OperatorAccount::default(),
        client_auth: None,
        managed_gateways: &[],
        gateway_classes: &Default::default(),
    };
    assert_eq!(render::misplaced_gateway_of(&input), None);

    // In a member namespace: no extra bootstrap, the gateway runs there.
    let in_shop = render_of(
        &with_gateway(&cps[0], Some("shop")),
        &m,
        &Observed::default(),
    );
    assert!(in_shop
        .iter()
        .any(|o| o.key.kind == Kind::Deployment && o.key.namespace.as_deref() == Some("shop")));
    assert!(!in_shop.iter().any(|o| o.key.kind == Kind::ConfigMap
        && o.key.namespace.as_deref() == Some("meshplane-blue")
        && o.key.name == "meshplane-blue-v1-bootstrap"));
    assert_eq!(
        grants_secrets(&in_shop),
        [
            format!("RoleBinding Some(\"shop\")/{reader}"),
            format!("RoleBinding Some(\"shop\")/{proxy_reader}")
        ],
        "Secrets are read where the gateway runs"
    );
    // The operator binds itself the gateway's write powers in shop, and nowhere else.
    let gateway_access: Vec<String> = in_shop
        .iter()
        .filter(|o| o.body["roleRef"]["name"] == names::GATEWAY_NAMESPACE_ROLE)
        .map(|o| o.key.to_string())
        .collect();
    assert_eq!(
        gateway_access,
        [format!(
            "RoleBinding shop/{}",
            names::gateway_operator_access("blue-v1")
        )]
    );

    // In another tenant's namespace: nothing is run there, and the status says why.
    let foreign = with_gateway(&cps[0], Some("bank"));
    let in_bank = render_of(&foreign, &m, &Observed::default());
    assert!(!in_bank
        .iter()
        .any(|o| o.key.namespace.as_deref() == Some("bank")));
    let input = RenderInput {
        control_plane: &foreign,
        ..input
    };
    let problem = render::misplaced_gateway_of(&input).expect("reported");
    assert!(problem.contains("\"bank\""), "{problem}");
}

/// Contract 4 with the API server's admission client CA (`--apiserver-client-ca`): the
/// webhook TLS Secret carries it, and the accepted names, beside the serving material, in the
/// form the instance reads; the rest of the Secret is as without it.
#[test]
fn the_admission_client_ca_travels_in_the_webhook_tls_secret() {
    use meshplane_contracts::webhook_tls::{self, ClientAuthData, TlsData};
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    let rev = m.revision_of_control_plane("blue-v1").expect("active");
    let members = m.tenant_members(&rev.tenant);
    let client_auth = ClientAuthData {
        ca_pem: "-----BEGIN CERTIFICATE-----\nAPISERVER-CLIENT-CA\n-----END CERTIFICATE-----\n"
            .into(),
        names: vec!["kube-apiserver-admission".into()],
    };
    let render_with = |client_auth: Option<&ClientAuthData>| {
        render::render(&RenderInput {
            control_plane: &cps[0],
            revision: rev,
            tenant_members: &members,
            status_writer: m.is_status_writer(&cps[0].revision()),
            tls: &fixed_tls(),
            observed: &Observed::default(),
            operator: &render::OperatorAccount::default(),
            client_auth,
            managed_gateways: &[],
            gateway_classes: &Default::default(),
        })
    };
    let secret_of = |objects: &[DesiredObject]| {
        objects
            .iter()
            .find(|o| {
                o.key.kind == Kind::Secret && o.key.name == webhook_tls::secret_name("blue-v1")
            })
            .expect("the webhook TLS Secret")
            .clone()
    };
    let with = secret_of(&render_with(Some(&client_auth)));
    let data = data_of(&with);
    assert_eq!(
        ClientAuthData::from_data(&data),
        Ok(Some(client_auth.clone()))
    );
    assert_eq!(
        data[webhook_tls::CLIENT_NAMES],
        "kube-apiserver-admission\n"
    );
    assert_eq!(
        TlsData::from_data(&data).expect("serving keys").ca_pem,
        fixed_tls().ca_bundle_pem
    );
    assert_eq!(with.body["type"], webhook_tls::SECRET_TYPE);

    // Any certificate of the CA: no names key.
    let any = ClientAuthData {
        names: vec![],
        ..client_auth
    };
    let data = data_of(&secret_of(&render_with(Some(&any))));
    assert!(!data.contains_key(webhook_tls::CLIENT_NAMES));
    assert_eq!(ClientAuthData::from_data(&data), Ok(Some(any)));

    // Without it, exactly the three serving keys.
    let data = data_of(&secret_of(&render_with(None)));
    assert_eq!(
        data.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            webhook_tls::CA_CRT,
            webhook_tls::TLS_CRT,
            webhook_tls::TLS_KEY
        ]
    );
}

/// A Gateway API Gateway of the tenant's class gets a proxy of its own, named `<gateway>-<class>`
/// as Istio names them, labelled for the instance to program it as that Gateway, on unprivileged
/// ports; a Gateway in a namespace outside the tenant is never rendered.
#[test]
fn a_gateway_api_gateway_runs_as_a_router_named_after_it_in_the_tenant_only() {
    let (cps, tags) = samples();
    let m = membership(&cps, &tags, &cluster_namespaces());
    let rev = m.revision_of_control_plane("blue-v1").expect("active");
    let members = m.tenant_members(&rev.tenant);
    let gateway = |namespace: &str, name: &str| render::ManagedGateway {
        namespace: namespace.into(),
        name: name.into(),
        class: "meshplane-blue".into(),
        ports: vec![443, 80, 8080, 80],
        service_type: "ClusterIP".into(),
        labels: [("team".to_string(), "web".to_string())].into(),
        annotations: [("example.com/owner".to_string(), "web".to_string())].into(),
    };
    // With the ingress gateway in shop as well: one credentials binding names both accounts.
    let blue_v1 = with_gateway(&cps[0], Some("shop"));
    let managed = [
        gateway("shop", "web"),
        gateway("meshplane-blue", "edge"),
        gateway("bank", "stolen"),
        gateway("outsider", "stray"),
    ];
    let objects = render::render(&RenderInput {
        control_plane: &blue_v1,
        revision: rev,
        tenant_members: &members,
        status_writer: true,
        tls: &fixed_tls(),
        observed: &Observed::default(),
        operator: &render::OperatorAccount::default(),
        client_auth: None,
        managed_gateways: &managed,
        gateway_classes: &["meshplane-blue".to_string()].into(),
    });
    let find = |kind: Kind, ns: &str, name: &str| {
        objects
            .iter()
            .find(|o| {
                o.key.kind == kind && o.key.namespace.as_deref() == Some(ns) && o.key.name == name
            })
            .unwrap_or_else(|| panic!("{kind:?} {ns}/{name} rendered"))
    };
    let deployment = find(Kind::Deployment, "shop", "web-meshplane-blue");
    let pod = &deployment.body["spec"]["template"];
    assert_eq!(
        deployment.body["spec"]["selector"]["matchLabels"],
        serde_json::json!({render::GATEWAY_NAME_LABEL: "web"})
    );
    assert_eq!(pod["metadata"]["labels"][render::GATEWAY_NAME_LABEL], "web");
    assert_eq!(pod["metadata"]["labels"]["team"], "web");
    assert_eq!(pod["metadata"]["labels"][names::INJECT_LABEL], "false");
    assert_eq!(pod["metadata"]["labels"][names::TENANT_LABEL], "blue");
    assert_eq!(pod["spec"]["serviceAccountName"], "web-meshplane-blue");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], blue_v1.proxy_image());
    let args = container["args"].to_string();
    assert!(args.contains("router~"), "{args}");
    assert!(args.contains("web-meshplane-blue.shop"), "{args}");
    let bound: Vec<i64> = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter_map(|p| p["containerPort"].as_i64())
        .collect();
    assert_eq!(bound, vec![8081, 8443, 8080]);
    let service = find(Kind::Service, "shop", "web-meshplane-blue");
    let ports: Vec<(i64, i64)> = service.body["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["port"].as_i64().unwrap_or_default(),
                p["targetPort"].as_i64().unwrap_or_default(),
            )
        })
        .collect();
    // Privileged listener ports are bound 8000 above (or the next port no listener uses); the
    // others as they are.
    assert_eq!(ports, vec![(80, 8081), (443, 8443), (8080, 8080)]);
    assert_eq!(service.body["spec"]["type"], "ClusterIP");
    assert_eq!(
        service.body["metadata"]["annotations"]["example.com/owner"],
        "web"
    );
    assert_eq!(
        service.body["metadata"]["labels"][render::GATEWAY_NAME_LABEL],
        "web"
    );
    let account = find(Kind::ServiceAccount, "shop", "web-meshplane-blue");
    assert_eq!(account.body["automountServiceAccountToken"], false);
    let binding = find(
        Kind::RoleBinding,
        "shop",
        &names::gateway_proxy_credentials("blue-v1"),
    );
    assert_eq!(
        binding.body["subjects"],
        serde_json::json!([
            {"kind": "ServiceAccount", "name": "edge", "namespace": "shop"},
            {"kind": "ServiceAccount", "name": "web-meshplane-blue", "namespace": "shop"},
        ])
    );
    // The instance reads credentials, and the operator writes, in both gateway namespaces.
    find(
        Kind::RoleBinding,
        "shop",
        &names::gateway_credential_reader("blue-v1"),
    );
    find(
        Kind::RoleBinding,
        "shop",
        &names::gateway_operator_access("blue-v1"),
    );
    find(
        Kind::RoleBinding,
        "meshplane-blue",
        &names::gateway_credential_reader("blue-v1"),
    );
    find(Kind::Deployment, "meshplane-blue", "edge-meshplane-blue");
    // Never outside the tenant: not green's bank, not a namespace of nobody.
    for outside in ["bank", "outsider"] {
        assert!(
            !objects
                .iter()
                .any(|o| o.key.namespace.as_deref() == Some(outside)),
            "nothing rendered in {outside}"
        );
    }
    // The instance learns the tenant's classes (it cannot read GatewayClasses).
    let members = find(
        Kind::ConfigMap,
        "meshplane-blue",
        "meshplane-blue-v1-members",
    );
    assert_eq!(members.body["data"]["gatewayClasses"], "meshplane-blue\n");
    let told: Vec<meshplane_crds::controlplane::GatewayDeployment> = serde_json::from_str(
        members.body["data"]["gateways"]
            .as_str()
            .expect("gateways key"),
    )
    .expect("gateways JSON");
    let told: Vec<(&str, &str)> = told
        .iter()
        .map(|g| (g.namespace.as_str(), g.name.as_str()))
        .collect();
    assert_eq!(
        told,
        vec![
            ("shop", "edge"),
            ("shop", "web-meshplane-blue"),
            ("meshplane-blue", "edge-meshplane-blue")
        ]
    );
    // Names fit a Service name however long the Gateway's.
    let long = render::managed_gateway_name(&"g".repeat(60), "meshplane-blue");
    assert!(long.len() <= 63 && long.starts_with("ggg"), "{long}");
    assert_ne!(
        long,
        render::managed_gateway_name(&"g".repeat(61), "meshplane-blue")
    );
    assert_eq!(
        render::bound_listener_ports(&[443, 80, 9000]),
        vec![(80, 8080), (443, 8443), (9000, 9000)]
    );
}
