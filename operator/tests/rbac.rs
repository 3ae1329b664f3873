//! The operator's own RBAC (`config/rbac/`) against what it renders, evaluated: its cluster-wide
//! ClusterRole holds no right on Secrets, Deployments, ServiceAccounts, PodDisruptionBudgets or
//! NetworkPolicies and no Service write; it holds those only in the namespaces where it renders
//! a binding of the shipped `meshplane-control-namespace` / `meshplane-gateway-namespace`
//! ClusterRoles; and what it holds there and cluster-wide covers every object it writes, every
//! read and watch it makes, and every right it grants (escalation prevention: only rules it
//! holds, or `bind` on the ClusterRole by name).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use meshplane_crds::manifest::{parse_documents, parse_objects, Object};
use meshplane_crds::membership::{
    compute, ControlPlaneFacts, Membership, NamespaceFacts, TagFacts,
};
use meshplane_crds::{names, MeshControlPlane, MeshRevisionTag};
use meshplane_operator::render::{self, DesiredObject, Kind, Observed, RenderInput};
use meshplane_operator::tls::WebhookTls;
use serde_json::Value;

const OPERATOR: (&str, &str) = ("meshplane-system", "meshplane-operator");

fn rbac_documents() -> Vec<Value> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/rbac");
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("config/rbac") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml")
            || path.file_name().and_then(|n| n.to_str()) == Some("kustomization.yaml")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        docs.extend(parse_documents(&text).expect("YAML"));
    }
    docs
}

fn shipped_cluster_roles() -> BTreeMap<String, Vec<Value>> {
    rbac_documents()
        .into_iter()
        .filter(|d| d["kind"] == "ClusterRole")
        .map(|d| {
            let name = d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (name, d["rules"].as_array().cloned().unwrap_or_default())
        })
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// One request: verb on group/resource, optionally a named object.
fn allows(rule: &Value, verb: &str, group: &str, resource: &str, name: Option<&str>) -> bool {
    let has = |field: &str, v: &str| strings(&rule[field]).iter().any(|x| x == v || x == "*");
    let names = strings(&rule["resourceNames"]);
    has("verbs", verb)
        && has("apiGroups", group)
        && has("resources", resource)
        && (names.is_empty() || name.is_some_and(|n| names.iter().any(|x| x == n)))
}

/// What the operator holds: cluster-wide rules, and per-namespace rules from the bindings
/// rendered for it (of shipped ClusterRoles).
struct Operator {
    cluster: Vec<Value>,
    namespaced: BTreeMap<String, Vec<Value>>,
}

impl Operator {
    fn of(objects: &[DesiredObject]) -> Self {
        let shipped = shipped_cluster_roles();
        let cluster = shipped
            .get("meshplane-operator")
            .cloned()
            .expect("the operator's ClusterRole");
        let mut namespaced: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for b in objects.iter().filter(|o| o.key.kind == Kind::RoleBinding) {
            let to_operator = b.body["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["name"] == OPERATOR.1 && s["namespace"] == OPERATOR.0);
            if to_operator && b.body["roleRef"]["kind"] == "ClusterRole" {
                let role = b.body["roleRef"]["name"].as_str().unwrap_or_default();
                let rules = shipped
                    .get(role)
                    .unwrap_or_else(|| panic!("{role} is shipped in config/rbac"));
                namespaced
                    .entry(b.key.namespace.clone().unwrap_or_default())
                    .or_default()
                    .extend(rules.iter().cloned());
            }
        }
        Self {
            cluster,
            namespaced,
        }
    }

    /// In `namespace` (`None`: cluster-wide, which a namespaced binding never grants).
    fn can(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> bool {
        let local = namespace
            .and_then(|ns| self.namespaced.get(ns))
            .into_iter()
            .flatten();
        self.cluster
            .iter()
            .chain(local)
            .any(|r| allows(r, verb, group, resource, name))
    }
}

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
    for cp in cps.iter_mut() {
        cp.metadata.uid = Some(format!(
            "uid-{}",
            cp.metadata.name.clone().unwrap_or_default()
        ));
    }
    (cps, tags)
}

fn membership(cps: &[MeshControlPlane], tags: &[MeshRevisionTag]) -> Membership {
    let namespaces = vec![
        NamespaceFacts::new("shop", &[(names::REV_LABEL, "blue-stable")]),
        NamespaceFacts::new("cart", &[(names::REV_LABEL, "blue-v2")]),
        NamespaceFacts::new("bank", &[(names::REV_LABEL, "green")]),
        NamespaceFacts::new("outsider", &[]),
    ];
    let cp_facts: Vec<ControlPlaneFacts> = cps.iter().map(ControlPlaneFacts::from).collect();
    let tag_facts: Vec<TagFacts> = tags.iter().map(TagFacts::from).collect();
    compute(&namespaces, &cp_facts, &tag_facts)
}

fn with_gateway(cp: &MeshControlPlane, namespace: Option<&str>) -> MeshControlPlane {
    let mut cp = cp.clone();
    let spec = serde_json::json!({
        "name": "edge",
        "allowedNamespaces": ["shop"],
        "service": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    });
    let mut spec: meshplane_crds::controlplane::IngressGatewaySpec =
        serde_json::from_value(spec).expect("gateway spec");
    spec.namespace = namespace.map(str::to_string);
    cp.spec.ingress_gateway = Some(spec);
    cp
}

/// Gateway API Gateways run in the control namespace and in a member namespace.
fn managed_gateways(cp: &MeshControlPlane) -> Vec<render::ManagedGateway> {
    let member = if cp.spec.tenant == "blue" {
        "shop"
    } else {
        "bank"
    };
    [cp.control_namespace(), member.to_string()]
        .into_iter()
        .map(|namespace| render::ManagedGateway {
            namespace,
            name: "web".into(),
            class: format!("meshplane-{}", cp.spec.tenant),
            ports: vec![80, 443],
            service_type: "LoadBalancer".into(),
            labels: Default::default(),
            annotations: Default::default(),
        })
        .collect()
}

fn render_of(cp: &MeshControlPlane, m: &Membership) -> Vec<DesiredObject> {
    render_with(cp, m, &[])
}

fn render_with(
    cp: &MeshControlPlane,
    m: &Membership,
    managed_gateways: &[render::ManagedGateway],
) -> Vec<DesiredObject> {
    let rev = m
        .revision_of_control_plane(cp.metadata.name.as_deref().unwrap_or_default())
        .expect("active");
    let members = m.tenant_members(&rev.tenant);
    render::render(&RenderInput {
        control_plane: cp,
        revision: rev,
        tenant_members: &members,
        status_writer: m.is_status_writer(&cp.revision()),
        tls: &WebhookTls {
            ca_bundle_pem: String::new(),
            cert_pem: String::new(),
            key_pem: String::new(),
        },
        observed: &Observed::default(),
        operator: &render::OperatorAccount::default(),
        client_auth: None,
        managed_gateways,
        gateway_classes: &Default::default(),
    })
}

/// Every render the samples give: Strict and Shared, without a gateway, with one in the
/// control namespace and with one in a member namespace.
fn renders() -> Vec<(String, Vec<DesiredObject>)> {
    let (cps, tags) = samples();
    let m = membership(&cps, &tags);
    let mut out = Vec::new();
    for cp in &cps {
        for (what, variant) in [
            ("plain", cp.clone()),
            ("gateway in the control namespace", with_gateway(cp, None)),
            (
                "gateway in a member",
                with_gateway(
                    cp,
                    Some(if cp.spec.tenant == "blue" {
                        "shop"
                    } else {
                        "bank"
                    }),
                ),
            ),
        ] {
            for isolation in [
                meshplane_crds::IsolationMode::Strict,
                meshplane_crds::IsolationMode::Shared,
            ] {
                let mut variant = variant.clone();
                variant.spec.isolation = isolation;
                let label = format!("{} {what} {isolation:?}", cp.revision());
                out.push((label, render_of(&variant, &m)));
                let label = format!(
                    "{} {what} and Gateway API gateways {isolation:?}",
                    cp.revision()
                );
                out.push((label, render_with(&variant, &m, &managed_gateways(cp))));
            }
        }
    }
    out
}

fn group_resource(kind: Kind) -> (&'static str, &'static str) {
    let ar = kind.api_resource();
    let group: &'static str = Box::leak(ar.group.into_boxed_str());
    let plural: &'static str = Box::leak(ar.plural.into_boxed_str());
    (group, plural)
}

#[test]
fn the_operators_cluster_wide_rules_grant_nothing_on_secrets_deployments_or_instance_objects() {
    let roles = shipped_cluster_roles();
    let cluster = &roles["meshplane-operator"];
    for rule in cluster {
        let resources = strings(&rule["resources"]);
        let verbs = strings(&rule["verbs"]);
        assert!(!resources.iter().any(|r| r == "*"), "no wildcard: {rule}");
        assert!(
            !verbs
                .iter()
                .any(|v| v == "*" || v == "escalate" || v == "impersonate"),
            "{rule}"
        );
        for gone in [
            "secrets",
            "deployments",
            "serviceaccounts",
            "poddisruptionbudgets",
            "networkpolicies",
        ] {
            assert!(
                !resources.iter().any(|r| r == gone),
                "{gone} cluster-wide: {rule}"
            );
        }
        if resources.iter().any(|r| r == "services") {
            assert_eq!(
                verbs,
                ["get", "list", "watch"],
                "Services only read: {rule}"
            );
        }
        if verbs.iter().any(|v| v == "bind") {
            assert_eq!(verbs, ["bind"], "{rule}");
            let names = strings(&rule["resourceNames"]);
            assert!(!names.is_empty(), "bind only by name: {rule}");
            for name in names {
                assert!(roles.contains_key(&name), "{name} is shipped");
            }
        }
    }
    let op = Operator {
        cluster: cluster.clone(),
        namespaced: BTreeMap::new(),
    };
    for verb in [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ] {
        for (group, resource) in [
            ("", "secrets"),
            ("apps", "deployments"),
            ("", "serviceaccounts"),
            ("policy", "poddisruptionbudgets"),
            ("networking.k8s.io", "networkpolicies"),
        ] {
            for ns in [None, Some("kube-system"), Some("shop")] {
                assert!(
                    !op.can(verb, group, resource, ns, None),
                    "{verb} {resource} in {ns:?}"
                );
            }
        }
    }
    // The namespace roles are never bound cluster-wide.
    for doc in rbac_documents()
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding")
    {
        assert_eq!(doc["roleRef"]["name"], "meshplane-operator", "{doc}");
    }
}

#[test]
fn what_the_operator_holds_where_covers_every_write_read_watch_and_grant() {
    for (label, objects) in renders() {
        let op = Operator::of(&objects);
        let control_ns = objects
            .iter()
            .find(|o| o.key.kind == Kind::Namespace)
            .map(|o| o.key.name.clone())
            .expect("a control namespace");
        // Its write powers over the instance are bound in the control namespace and, for a
        // gateway in a member namespace, there; nowhere else.
        let access: BTreeSet<String> = objects
            .iter()
            .filter_map(|o| {
                render::operator_access_namespace(&o.body, &render::OperatorAccount::default())
            })
            .collect();
        let bound_kinds_at: BTreeSet<String> = objects
            .iter()
            .filter(|o| o.key.kind.bound_per_namespace() || o.key.kind == Kind::Service)
            .filter_map(|o| o.key.namespace.clone())
            .collect();
        assert!(access.contains(&control_ns), "{label}");
        assert_eq!(
            access, bound_kinds_at,
            "{label}: access exactly where needed"
        );
        for o in &objects {
            let (group, resource) = group_resource(o.key.kind);
            let ns = o.key.namespace.as_deref();
            let name = Some(o.key.name.as_str());
            // Read by name before the first write, applied (create + patch), pruned.
            for verb in ["get", "create", "patch", "delete"] {
                if o.key.kind == Kind::Namespace && verb == "delete" {
                    continue;
                }
                assert!(
                    op.can(verb, group, resource, ns, name),
                    "{label}: {verb} {}",
                    o.key
                );
            }
            // Listed by label and watched: cluster-wide, or in the access namespaces for the
            // kinds held only there.
            let scope = if o.key.kind.bound_per_namespace() {
                ns
            } else {
                None
            };
            for verb in ["list", "watch"] {
                assert!(
                    op.can(verb, group, resource, scope, None),
                    "{label}: {verb} {}",
                    o.key
                );
            }
        }
        // Secrets: only in the control namespace, never cluster-wide or in a member.
        for ns in [
            None,
            Some("shop"),
            Some("bank"),
            Some("cart"),
            Some("kube-system"),
        ] {
            for verb in ["get", "list", "watch"] {
                assert!(
                    !op.can(verb, "", "secrets", ns, None),
                    "{label}: {verb} secrets {ns:?}"
                );
            }
        }
        assert!(op.can(
            "update",
            "",
            "secrets",
            Some(&control_ns),
            Some(names::TENANT_CA_SECRET)
        ));
        // Escalation prevention: every rule of every Role or ClusterRole it writes is one it
        // holds at that scope; every binding of a shipped ClusterRole is one it may bind.
        for role in objects
            .iter()
            .filter(|o| matches!(o.key.kind, Kind::Role | Kind::ClusterRole))
        {
            for rule in role.body["rules"].as_array().into_iter().flatten() {
                let names = strings(&rule["resourceNames"]);
                for verb in strings(&rule["verbs"]) {
                    for group in strings(&rule["apiGroups"]) {
                        for resource in strings(&rule["resources"]) {
                            let (group, resource) = (group.as_str(), resource.as_str());
                            let ns = role.key.namespace.as_deref();
                            let held = if names.is_empty() {
                                op.can(&verb, group, resource, ns, None)
                            } else {
                                names
                                    .iter()
                                    .all(|n| op.can(&verb, group, resource, ns, Some(n)))
                            };
                            assert!(
                                held,
                                "{label}: {} grants {verb} {group}/{resource}",
                                role.key
                            );
                        }
                    }
                }
            }
        }
        for binding in objects
            .iter()
            .filter(|o| matches!(o.key.kind, Kind::RoleBinding | Kind::ClusterRoleBinding))
        {
            let role_ref = &binding.body["roleRef"];
            let role = role_ref["name"].as_str().unwrap_or_default();
            let rendered = objects.iter().any(|o| {
                o.key.name == role
                    && (o.key.kind == Kind::ClusterRole
                        || (o.key.kind == Kind::Role && o.key.namespace == binding.key.namespace))
            });
            if !rendered {
                assert_eq!(role_ref["kind"], "ClusterRole", "{label}: {}", binding.key);
                assert!(
                    op.can(
                        "bind",
                        "rbac.authorization.k8s.io",
                        "clusterroles",
                        None,
                        Some(role)
                    ),
                    "{label}: {} binds {role}",
                    binding.key
                );
            }
        }
    }
}

/// The operator reads GatewayClasses and Gateways cluster-wide (get, list, watch: the
/// reconcile lists them, the controller watches them) and writes neither.
#[test]
fn the_operator_reads_gateway_classes_and_gateways_cluster_wide() {
    let op = Operator::of(&[]);
    for resource in ["gatewayclasses", "gateways"] {
        for verb in ["get", "list", "watch"] {
            assert!(
                op.can(verb, "gateway.networking.k8s.io", resource, None, None),
                "{verb} {resource}"
            );
        }
        for verb in ["create", "update", "delete"] {
            assert!(
                !op.can(verb, "gateway.networking.k8s.io", resource, None, None),
                "{verb} {resource}"
            );
        }
    }
}

/// Every document of the shipped YAML files in `dir` (kustomization.yaml aside).
fn shipped_documents(dir: &str) -> Vec<Value> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("shipped directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml")
        })
        .collect();
    paths.sort();
    paths
        .iter()
        .flat_map(|p| {
            parse_documents(&std::fs::read_to_string(p).expect("readable")).expect("YAML")
        })
        .collect()
}

/// The guardrails (config/rbac/operator_guardrails.yaml) confine the operator's webhook
/// configurations; under them, as its ServiceAccount, it still applies, re-applies and prunes
/// every webhook configuration it renders, and fills in the caBundle of its own shipped one.
#[tokio::test]
async fn the_guardrails_let_the_operator_manage_its_own_webhook_configurations() {
    use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
    use kube::core::{ApiResource, GroupVersionKind};
    use meshplane_kube_standin::{Identity, StandIn, StandInOptions};

    let standin = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let admin = standin.client(&Identity::Admin).await.expect("admin");
    let operator = standin.client(&Identity::Operator).await.expect("operator");
    let mut installed = vec![serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": OPERATOR.0}})];
    installed.extend(shipped_documents("../config/rbac"));
    installed.extend(shipped_documents("../config/webhook"));
    for doc in installed {
        let object: DynamicObject = serde_json::from_value(doc).expect("object");
        let types = object.types.clone().expect("typed");
        let gvk = GroupVersionKind::try_from(&types).expect("gvk");
        let plural = match gvk.kind.as_str() {
            "ValidatingAdmissionPolicy" => "validatingadmissionpolicies".to_string(),
            kind => format!("{}s", kind.to_lowercase()),
        };
        let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
        let api: Api<DynamicObject> = match &object.metadata.namespace {
            Some(ns) => Api::namespaced_with(admin.clone(), ns, &resource),
            None => Api::all_with(admin.clone(), &resource),
        };
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("installing {plural}: {e}"));
    }

    let mut applied = BTreeMap::new();
    for (label, objects) in renders() {
        for object in objects.iter().filter(|o| {
            matches!(
                o.key.kind,
                Kind::MutatingWebhookConfiguration | Kind::ValidatingWebhookConfiguration
            )
        }) {
            let api: Api<DynamicObject> =
                Api::all_with(operator.clone(), &object.key.kind.api_resource());
            // No MeshControlPlane exists here: without its owner the garbage collector would
            // remove the object before the test prunes it.
            let mut body = object.body.clone();
            if let Some(meta) = body["metadata"].as_object_mut() {
                meta.remove("ownerReferences");
            }
            let apply = PatchParams::apply(names::FIELD_MANAGER).force();
            for round in ["created", "updated"] {
                api.patch(&object.key.name, &apply, &Patch::Apply(&body))
                    .await
                    .unwrap_or_else(|e| panic!("{label}: {} {round}: {e}", object.key.name));
            }
            applied.insert(
                (object.key.kind.name(), object.key.name.clone()),
                object.key.kind,
            );
        }
    }
    assert!(applied.len() >= 6, "{applied:?}");
    for ((_, name), kind) in &applied {
        Api::<DynamicObject>::all_with(operator.clone(), &kind.api_resource())
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("pruning {name}: {e}"));
    }

    let tls = meshplane_operator::tls::issue(
        "meshplane-operator.meshplane-system.svc",
        time::OffsetDateTime::now_utc(),
        time::Duration::days(1),
        None,
    )
    .expect("certificate");
    let trusted =
        meshplane_operator::admission_tls::publish_ca_bundle(&operator, "meshplane-operator", &tls)
            .await
            .expect("the operator fills in its own caBundle");
    assert!(trusted);
}
