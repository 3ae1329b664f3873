//! RBAC of a revision's instance. The instance's ServiceAccount gets:
//! - in its control namespace, a Role to read its members ConfigMap, apply its own key in the
//!   proxies ConfigMap, read the registry and tenant-wide config there, write the `Accepted`
//!   status of traffic config and Warning Events on config it does not apply;
//! - Strict: in each member namespace of the tenant, a Role `meshplane-<rev>-reader` (read-only
//!   on what the registry is built from, plus those status writes and Events), created on join
//!   and pruned on leave;
//!   Shared: the same reads cluster-wide through one ClusterRoleBinding, plus reads of
//!   Namespaces, MeshControlPlanes and MeshRevisionTags, from which the instance checks the
//!   members ConfigMap (it reads only listed namespaces that membership confirms);
//! - in both modes, in each member namespace of the tenant, a RoleBinding
//!   `meshplane-<rev>-restarter` binding the shipped ClusterRole
//!   [`names::WORKLOAD_RESTARTER_ROLE`] to the operator's own ServiceAccount: the right to
//!   restart workloads (and read their proxies' statistics) where a migration may need it,
//!   granted as the namespace joins and pruned as it leaves, never cluster-wide (also in the
//!   control namespace, where the gates read the instances' `/debug/proxies`);
//! - when the revision runs an ingress gateway, in the gateway's namespace only (the control
//!   namespace or a member), a RoleBinding `meshplane-<rev>-gateway-credentials` of the shipped
//!   ClusterRole [`names::GATEWAY_CREDENTIALS_ROLE`] to read Secrets: a Gateway's TLS server
//!   names its certificate by `credentialName`, a Secret of that namespace that only the
//!   Gateway (tenant config the operator does not read) knows, so the role cannot list names;
//!   Secrets of every other namespace stay unreadable. The operator holds no Secret read
//!   there: it may bind that one ClusterRole by name;
//! - for the operator itself, a RoleBinding `meshplane-<rev>-operator` in the control namespace
//!   of the shipped ClusterRole [`names::CONTROL_NAMESPACE_ROLE`] (its only rights on Secrets,
//!   Deployments, ServiceAccounts, PodDisruptionBudgets and NetworkPolicies, and its Service
//!   writes), and `meshplane-<rev>-gateway-operator` of [`names::GATEWAY_NAMESPACE_ROLE`] in a
//!   member namespace that runs the gateway;
//! - in both modes, a ClusterRole with `tokenreviews create` and `subjectaccessreviews create`,
//!   the cluster-scoped rights the instance provably needs: contract 7 verifies each proxy's
//!   projected token by TokenReview, and a gateway proxy gets a Gateway's credential Secret only
//!   if a SubjectAccessReview says its ServiceAccount may `get` it; neither review has a
//!   namespaced form the instance could use (a LocalSubjectAccessReview would need a Role in
//!   every gateway namespace). A SubjectAccessReview reads nothing but an RBAC verdict.

use meshplane_crds::names;
use meshplane_crds::IsolationMode;
use serde_json::{json, Value};

use super::instance::proxies_configmap;
use super::{DesiredObject, Kind, Revision};

/// `(apiGroup, resource)` the instance reads to build its registry: Services and their
/// EndpointSlices (destinations), Pods (proxy labels and workload selectors), and the tenant's
/// networking, security, telemetry and Gateway API config.
pub const INSTANCE_READ_RESOURCES: &[(&str, &str)] = &[
    ("", "services"),
    ("", "pods"),
    ("discovery.k8s.io", "endpointslices"),
    ("networking.meshplane.io", "serviceentries"),
    ("networking.meshplane.io", "envoyfilters"),
    ("networking.meshplane.io", "sidecars"),
    ("security.meshplane.io", "peerauthentications"),
    ("security.meshplane.io", "authorizationpolicies"),
    ("security.meshplane.io", "requestauthentications"),
    ("networking.meshplane.io", "virtualservices"),
    ("networking.meshplane.io", "destinationrules"),
    ("networking.meshplane.io", "gateways"),
    ("telemetry.meshplane.io", "telemetries"),
    ("gateway.networking.k8s.io", "httproutes"),
    ("gateway.networking.k8s.io", "grpcroutes"),
    ("gateway.networking.k8s.io", "tlsroutes"),
    ("gateway.networking.k8s.io", "tcproutes"),
    ("gateway.networking.k8s.io", "referencegrants"),
    ("gateway.networking.k8s.io", "gateways"),
];

/// Status subresources the instance writes (the `Accepted` condition of networking config).
pub const INSTANCE_STATUS_RESOURCES: &[&str] = &[
    "virtualservices/status",
    "destinationrules/status",
    "gateways/status",
    "serviceentries/status",
    "sidecars/status",
    "envoyfilters/status",
];

/// Status subresources of the security group the instance writes (the `Accepted` condition
/// of AuthorizationPolicies, PeerAuthentications and RequestAuthentications, and the key
/// fetches of the latter).
pub const INSTANCE_SECURITY_STATUS_RESOURCES: &[&str] = &[
    "authorizationpolicies/status",
    "peerauthentications/status",
    "requestauthentications/status",
];

/// Status subresources of the telemetry group the instance writes (the `Accepted` condition
/// of Telemetries).
pub const INSTANCE_TELEMETRY_STATUS_RESOURCES: &[&str] = &["telemetries/status"];

/// Status subresources of the Gateway API the instance writes (route parent status and
/// Gateway status, for parents of meshplane's controller only).
pub const INSTANCE_GATEWAY_API_STATUS_RESOURCES: &[&str] = &[
    "httproutes/status",
    "grpcroutes/status",
    "tlsroutes/status",
    "tcproutes/status",
    "gateways/status",
];

/// Read verbs: the instance watches, never writes, registry sources.
const READ: [&str; 3] = ["get", "list", "watch"];

/// Shared isolation: what the instance computes its tenant's members from, so that the
/// members ConfigMap (editable by whoever may edit ConfigMaps in the control namespace) never
/// decides which namespaces it reads: the Namespaces' labels and the cluster-scoped control
/// planes and tags, read-only. It reads every namespace's objects anyway in this mode.
pub fn shared_membership_rules() -> Vec<Value> {
    vec![
        json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": READ}),
        json!({"apiGroups": ["meshplane.io"],
               "resources": ["meshcontrolplanes", "meshrevisiontags"], "verbs": READ}),
    ]
}

/// Rules granting read on [`INSTANCE_READ_RESOURCES`].
pub fn member_reader_rules() -> Vec<Value> {
    // One rule per API group, in order of first appearance (a group may appear more than once).
    let mut groups: Vec<&str> = Vec::new();
    for (g, _) in INSTANCE_READ_RESOURCES {
        if !groups.contains(g) {
            groups.push(g);
        }
    }
    groups
        .into_iter()
        .map(|g| {
            let resources: Vec<&str> = INSTANCE_READ_RESOURCES
                .iter()
                .filter(|(rg, _)| *rg == g)
                .map(|(_, r)| *r)
                .collect();
            json!({"apiGroups": [g], "resources": resources, "verbs": READ})
        })
        .collect()
}

/// The status writes of [`INSTANCE_STATUS_RESOURCES`] and the Warning Events on config the
/// instance does not apply (`events.k8s.io`: a new Event is created, a repeated one patched
/// into a series), granted per namespace of the tenant (never cluster-wide).
pub fn member_status_rules() -> Vec<Value> {
    vec![
        json!({"apiGroups": ["networking.meshplane.io"],
               "resources": INSTANCE_STATUS_RESOURCES, "verbs": ["get", "patch"]}),
        json!({"apiGroups": ["security.meshplane.io"],
               "resources": INSTANCE_SECURITY_STATUS_RESOURCES, "verbs": ["get", "patch"]}),
        json!({"apiGroups": ["telemetry.meshplane.io"],
               "resources": INSTANCE_TELEMETRY_STATUS_RESOURCES, "verbs": ["get", "patch"]}),
        json!({"apiGroups": ["gateway.networking.k8s.io"],
               "resources": INSTANCE_GATEWAY_API_STATUS_RESOURCES, "verbs": ["get", "patch"]}),
        json!({"apiGroups": ["events.k8s.io"], "resources": ["events"],
               "verbs": ["create", "patch"]}),
    ]
}

fn binding(
    rev: &Revision<'_>,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
    role_kind: &str,
) -> DesiredObject {
    rev.object(
        kind,
        namespace,
        name,
        json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
            "subjects": [{
                "kind": "ServiceAccount",
                "name": names::instance_name(&rev.revision),
                "namespace": rev.control_namespace,
            }],
        }),
    )
}

/// A RoleBinding in `namespace` granting the operator's own ServiceAccount the shipped
/// ClusterRole `role` (the operator holds `bind` on it by name).
fn operator_binding(rev: &Revision<'_>, namespace: &str, name: &str, role: &str) -> DesiredObject {
    rev.object(
        Kind::RoleBinding,
        Some(namespace),
        name,
        json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{
                "kind": "ServiceAccount",
                "name": rev.input.operator.name,
                "namespace": rev.input.operator.namespace,
            }],
        }),
    )
}

/// The namespace an observed or desired RoleBinding gives the operator its write powers in
/// (a binding of [`names::CONTROL_NAMESPACE_ROLE`] or [`names::GATEWAY_NAMESPACE_ROLE`] to
/// `operator`), if it is one. Objects of the kinds [`Kind::bound_per_namespace`] are read,
/// watched and written only in such namespaces; these bindings are applied first and removed
/// last.
pub fn operator_access_namespace(
    body: &Value,
    operator: &super::OperatorAccount,
) -> Option<String> {
    operator_access(body, operator).map(|(ns, _)| ns)
}

/// The namespace of an access binding of the operator and what it grants there: every
/// per-namespace kind (`meshplane-control-namespace`), or only a gateway's ServiceAccount and
/// Deployment (`meshplane-gateway-namespace`, [`super::Kind::granted_for_gateways`]).
pub fn operator_access(
    body: &Value,
    operator: &super::OperatorAccount,
) -> Option<(String, AccessGrant)> {
    let grant = match body.pointer("/roleRef/name").and_then(Value::as_str) {
        Some(names::CONTROL_NAMESPACE_ROLE) => AccessGrant::ControlNamespace,
        _ => AccessGrant::Gateway,
    };
    operator_access_binding(body, operator).map(|ns| (ns, grant))
}

/// What an access binding grants the operator in its namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AccessGrant {
    /// Only what a gateway needs (ServiceAccount, Deployment; Services are read cluster-wide).
    Gateway,
    /// Every per-namespace kind.
    ControlNamespace,
}

impl AccessGrant {
    /// Whether the operator may list and watch `kind` where this is granted.
    pub fn covers(self, kind: super::Kind) -> bool {
        kind.bound_per_namespace()
            && (self == AccessGrant::ControlNamespace || kind.granted_for_gateways())
    }
}

fn operator_access_binding(body: &Value, operator: &super::OperatorAccount) -> Option<String> {
    let role_ref = body.get("roleRef")?;
    let role = role_ref.get("name")?.as_str()?;
    let grants = body.get("kind")?.as_str()? == "RoleBinding"
        && role_ref.get("kind")?.as_str()? == "ClusterRole"
        && [names::CONTROL_NAMESPACE_ROLE, names::GATEWAY_NAMESPACE_ROLE].contains(&role);
    let to_operator = body.get("subjects")?.as_array()?.iter().any(|s| {
        s.get("kind").and_then(Value::as_str) == Some("ServiceAccount")
            && s.get("name").and_then(Value::as_str) == Some(operator.name.as_str())
            && s.get("namespace").and_then(Value::as_str) == Some(operator.namespace.as_str())
    });
    (grants && to_operator)
        .then(|| {
            body.pointer("/metadata/namespace")?
                .as_str()
                .map(str::to_string)
        })
        .flatten()
}

pub fn rbac(rev: &Revision<'_>) -> Vec<DesiredObject> {
    let ns = rev.control_namespace.as_str();
    let name = names::instance_name(&rev.revision);
    let mut control_rules = vec![
        // Contract 2: the instance learns its members from this ConfigMap (watched by name).
        json!({"apiGroups": [""], "resources": ["configmaps"],
               "resourceNames": [names::members_configmap(&rev.revision)], "verbs": READ}),
        // Contract 3: each pod applies its own key (server-side apply is a patch); the
        // operator creates the ConfigMap, so no create right.
        json!({"apiGroups": [""], "resources": ["configmaps"],
               "resourceNames": [proxies_configmap(&rev.revision)], "verbs": ["get", "patch"]}),
    ];
    // The control namespace is part of the registry and holds tenant-wide config.
    control_rules.extend(member_reader_rules());
    control_rules.extend(member_status_rules());
    let mut out = vec![
        rev.object(Kind::Role, Some(ns), &name, json!({"rules": control_rules})),
        binding(rev, Kind::RoleBinding, Some(ns), &name, "Role"),
    ];

    let mut cluster_rules = vec![
        json!({
            "apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"],
        }),
        json!({
            "apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
            "verbs": ["create"],
        }),
    ];
    match rev.input.control_plane.spec.isolation {
        IsolationMode::Strict => {
            let reader = names::member_reader(&rev.revision);
            for member in rev
                .input
                .tenant_members
                .iter()
                .filter(|m| **m != rev.control_namespace)
            {
                let mut rules = member_reader_rules();
                rules.extend(member_status_rules());
                out.push(rev.object(Kind::Role, Some(member), &reader, json!({"rules": rules})));
                out.push(binding(
                    rev,
                    Kind::RoleBinding,
                    Some(member),
                    &reader,
                    "Role",
                ));
            }
        }
        IsolationMode::Shared => {
            cluster_rules.extend(member_reader_rules());
            cluster_rules.extend(shared_membership_rules());
        }
    }
    // The operator's own write powers over the instance's objects, in the control namespace
    // only (and in a member namespace that runs the gateway): see `config/rbac/`.
    out.push(operator_binding(
        rev,
        &rev.control_namespace,
        &names::operator_access(&rev.revision),
        names::CONTROL_NAMESPACE_ROLE,
    ));
    for namespace in super::gateway::gateway_namespaces(rev) {
        let reader = names::gateway_credential_reader(&rev.revision);
        out.push(rev.object(
            Kind::RoleBinding,
            Some(&namespace),
            &reader,
            json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": names::GATEWAY_CREDENTIALS_ROLE},
                "subjects": [{
                    "kind": "ServiceAccount",
                    "name": names::instance_name(&rev.revision),
                    "namespace": rev.control_namespace,
                }],
            }),
        ));
        if namespace != rev.control_namespace {
            out.push(operator_binding(
                rev,
                &namespace,
                &names::gateway_operator_access(&rev.revision),
                names::GATEWAY_NAMESPACE_ROLE,
            ));
        }
    }
    let restarter = names::workload_restarter(&rev.revision);
    // The control namespace too: the gates read the instances' `/debug/proxies` there.
    let restart_namespaces: std::collections::BTreeSet<&str> = rev
        .input
        .tenant_members
        .iter()
        .map(String::as_str)
        .chain([rev.control_namespace.as_str()])
        .collect();
    for member in restart_namespaces {
        out.push(operator_binding(
            rev,
            member,
            &restarter,
            names::WORKLOAD_RESTARTER_ROLE,
        ));
    }
    let cluster_name = names::cluster_role(&rev.revision);
    out.push(rev.object(
        Kind::ClusterRole,
        None,
        &cluster_name,
        json!({"rules": cluster_rules}),
    ));
    out.push(binding(
        rev,
        Kind::ClusterRoleBinding,
        None,
        &cluster_name,
        "ClusterRole",
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{Kind, OperatorAccount};

    fn binding(role: &str) -> Value {
        let op = OperatorAccount::default();
        json!({
            "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "shop"},
            "roleRef": {"kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": op.name, "namespace": op.namespace}],
        })
    }

    #[test]
    fn a_gateway_namespace_grants_only_the_gateways_own_kinds() {
        let op = OperatorAccount::default();
        let (ns, grant) =
            operator_access(&binding(names::GATEWAY_NAMESPACE_ROLE), &op).expect("an access");
        assert_eq!((ns.as_str(), grant), ("shop", AccessGrant::Gateway));
        let covered: Vec<Kind> = Kind::ALL.into_iter().filter(|k| grant.covers(*k)).collect();
        assert_eq!(covered, [Kind::ServiceAccount, Kind::Deployment]);
        let (_, control) =
            operator_access(&binding(names::CONTROL_NAMESPACE_ROLE), &op).expect("an access");
        assert_eq!(control, AccessGrant::ControlNamespace);
        for kind in [Kind::Secret, Kind::PodDisruptionBudget, Kind::NetworkPolicy] {
            assert!(control.covers(kind) && !grant.covers(kind), "{kind:?}");
        }
        assert!(operator_access(&binding("view"), &op).is_none());
    }
}
