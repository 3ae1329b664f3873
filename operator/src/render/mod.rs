//! Pure rendering of one revision's desired objects (docs/architecture.md contracts 1-8).
//!
//! [`render`] takes a control plane, its membership and a few observed facts and returns every
//! object the operator must keep for that revision, as server-side-apply bodies. No I/O: the
//! controller decides what to write by comparing these bodies with what it observes.

mod bootstrap;
mod gateway;
mod instance;
mod rbac;
mod webhooks;

use std::collections::{BTreeMap, BTreeSet};

use kube::core::ApiResource;
use meshplane_crds::membership::RevisionMembership;
use meshplane_crds::{names, MeshControlPlane};
use serde_json::{json, Value};

use crate::tls::WebhookTls;

pub use bootstrap::envoy_bootstrap;
pub use gateway::{
    bound_listener_ports, managed_gateway_name, misplaced_gateway_of, ManagedGateway,
    GATEWAY_NAME_LABEL,
};
pub use instance::{instance_args, proxies_configmap, WEBHOOK_TLS_DIR};
pub use rbac::{
    member_reader_rules, operator_access, operator_access_namespace, AccessGrant,
    INSTANCE_READ_RESOURCES,
};

/// The kinds of object the operator writes, in the order it applies them (dependencies first:
/// the namespace before what lives in it, the instance before the webhooks that call it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Namespace,
    ServiceAccount,
    Role,
    RoleBinding,
    ClusterRole,
    ClusterRoleBinding,
    ConfigMap,
    Secret,
    Service,
    Deployment,
    PodDisruptionBudget,
    NetworkPolicy,
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
}

impl Kind {
    /// Every kind, in apply order.
    pub const ALL: [Kind; 14] = [
        Kind::Namespace,
        Kind::ServiceAccount,
        Kind::Role,
        Kind::RoleBinding,
        Kind::ClusterRole,
        Kind::ClusterRoleBinding,
        Kind::ConfigMap,
        Kind::Secret,
        Kind::Service,
        Kind::Deployment,
        Kind::PodDisruptionBudget,
        Kind::NetworkPolicy,
        Kind::MutatingWebhookConfiguration,
        Kind::ValidatingWebhookConfiguration,
    ];

    /// Kinds removed by deletion and pruning, in the safe order: webhooks first (so nothing
    /// calls an instance that is going away), then per-namespace objects and RBAC, then the
    /// instance itself. Namespaces are never deleted: a control namespace holds user config.
    pub const DELETE_ORDER: [Kind; 13] = [
        Kind::MutatingWebhookConfiguration,
        Kind::ValidatingWebhookConfiguration,
        Kind::ConfigMap,
        Kind::RoleBinding,
        Kind::Role,
        Kind::ClusterRoleBinding,
        Kind::ClusterRole,
        Kind::PodDisruptionBudget,
        Kind::NetworkPolicy,
        Kind::Deployment,
        Kind::Service,
        Kind::Secret,
        Kind::ServiceAccount,
    ];

    /// `(group, version, kind, plural)`.
    fn gvkp(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            Kind::Namespace => ("", "v1", "Namespace", "namespaces"),
            Kind::ServiceAccount => ("", "v1", "ServiceAccount", "serviceaccounts"),
            Kind::ConfigMap => ("", "v1", "ConfigMap", "configmaps"),
            Kind::Secret => ("", "v1", "Secret", "secrets"),
            Kind::Service => ("", "v1", "Service", "services"),
            Kind::Deployment => ("apps", "v1", "Deployment", "deployments"),
            Kind::PodDisruptionBudget => (
                "policy",
                "v1",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
            ),
            Kind::NetworkPolicy => (
                "networking.k8s.io",
                "v1",
                "NetworkPolicy",
                "networkpolicies",
            ),
            Kind::Role => ("rbac.authorization.k8s.io", "v1", "Role", "roles"),
            Kind::RoleBinding => (
                "rbac.authorization.k8s.io",
                "v1",
                "RoleBinding",
                "rolebindings",
            ),
            Kind::ClusterRole => (
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRole",
                "clusterroles",
            ),
            Kind::ClusterRoleBinding => (
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRoleBinding",
                "clusterrolebindings",
            ),
            Kind::MutatingWebhookConfiguration => (
                "admissionregistration.k8s.io",
                "v1",
                "MutatingWebhookConfiguration",
                "mutatingwebhookconfigurations",
            ),
            Kind::ValidatingWebhookConfiguration => (
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
            ),
        }
    }

    /// The `kind` string.
    pub fn name(self) -> &'static str {
        self.gvkp().2
    }

    /// The `apiVersion` string.
    pub fn api_version(self) -> String {
        let (group, version, _, _) = self.gvkp();
        if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::Namespace
                | Kind::ClusterRole
                | Kind::ClusterRoleBinding
                | Kind::MutatingWebhookConfiguration
                | Kind::ValidatingWebhookConfiguration
        )
    }

    /// Kinds the operator holds no cluster-wide right on: it reads, watches and writes them only
    /// in the namespaces where it bound itself the shipped ClusterRole
    /// `meshplane-control-namespace` (or `meshplane-gateway-namespace`), see
    /// [`operator_access_namespace`]. Services are written there too, but read cluster-wide
    /// (instances are granted Service reads, which the operator must hold to grant).
    pub fn bound_per_namespace(self) -> bool {
        matches!(
            self,
            Kind::Secret
                | Kind::ServiceAccount
                | Kind::Deployment
                | Kind::PodDisruptionBudget
                | Kind::NetworkPolicy
        )
    }

    /// Whether `meshplane-gateway-namespace` grants it (a gateway proxy's own objects).
    pub fn granted_for_gateways(self) -> bool {
        matches!(self, Kind::ServiceAccount | Kind::Deployment)
    }

    /// The dynamic API resource for kube's `Api<DynamicObject>`.
    pub fn api_resource(self) -> ApiResource {
        let (group, version, kind, plural) = self.gvkp();
        ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version: self.api_version(),
            kind: kind.to_string(),
            plural: plural.to_string(),
        }
    }
}

/// Identity of one object: kind, namespace (for namespaced kinds) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind.name(), self.name),
            None => write!(f, "{} {}", self.kind.name(), self.name),
        }
    }
}

/// One object the operator wants to exist, as the body of a server-side apply.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredObject {
    pub key: ObjectKey,
    pub body: Value,
}

/// Facts observed in the cluster that the rendering depends on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// ClusterIP of the instance Service, once assigned.
    pub service_cluster_ip: Option<String>,
    /// The tenant's root certificate, once a CA exists for it.
    pub root_cert: Option<String>,
}

/// The operator's own ServiceAccount, which the per-namespace restart RoleBindings name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorAccount {
    pub namespace: String,
    pub name: String,
}

impl Default for OperatorAccount {
    fn default() -> Self {
        Self {
            namespace: "meshplane-system".into(),
            name: "meshplane-operator".into(),
        }
    }
}

/// Everything [`render`] needs about one revision.
pub struct RenderInput<'a> {
    pub control_plane: &'a MeshControlPlane,
    pub revision: &'a RevisionMembership,
    /// Member namespaces of the whole tenant (every revision's attached namespaces).
    pub tenant_members: &'a BTreeSet<String>,
    /// Whether this revision writes the status of the control namespace's config (contract 2,
    /// `statusWriter`): one revision of the tenant does.
    pub status_writer: bool,
    pub tls: &'a WebhookTls,
    pub observed: &'a Observed,
    /// Who gets the right to restart workloads in each member namespace (migrations).
    pub operator: &'a OperatorAccount,
    /// The API server's admission client CA and accepted names, added to the webhook TLS
    /// Secret (contract 4); `None`: the instance's admission calls are not authenticated.
    pub client_auth: Option<&'a meshplane_contracts::webhook_tls::ClientAuthData>,
    /// The Gateway API Gateways this revision runs proxies for (of the tenant's class, in the
    /// tenant's namespaces, programmed by this revision).
    pub managed_gateways: &'a [ManagedGateway],
    /// The tenant's Gateway API GatewayClasses (told to the instance, contract 2).
    pub gateway_classes: &'a BTreeSet<String>,
}

/// Derived names and shared metadata of one revision.
pub(crate) struct Revision<'a> {
    pub input: &'a RenderInput<'a>,
    pub tenant: String,
    pub revision: String,
    pub control_namespace: String,
}

impl<'a> Revision<'a> {
    fn new(input: &'a RenderInput<'a>) -> Self {
        Self {
            input,
            tenant: input.revision.tenant.clone(),
            revision: input.control_plane.revision(),
            control_namespace: input.revision.control_namespace.clone(),
        }
    }

    /// Contract 8 labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        ownership_labels(&self.tenant, &self.revision)
    }

    /// The owner reference to the control plane (contract 8).
    pub fn owner_reference(&self) -> Value {
        let meta = &self.input.control_plane.metadata;
        json!({
            "apiVersion": "meshplane.io/v1alpha1",
            "kind": "MeshControlPlane",
            "name": meta.name.clone().unwrap_or_default(),
            "uid": meta.uid.clone().unwrap_or_default(),
            "controller": true,
            "blockOwnerDeletion": true,
        })
    }

    /// An object of `kind` with our labels and owner reference, plus `rest` merged at top level.
    pub fn object(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: &str,
        rest: Value,
    ) -> DesiredObject {
        let mut metadata = json!({
            "name": name,
            "labels": self.labels(),
            "ownerReferences": [self.owner_reference()],
        });
        if let (Some(ns), Some(m)) = (namespace, metadata.as_object_mut()) {
            m.insert("namespace".into(), json!(ns));
        }
        let mut body = json!({
            "apiVersion": kind.api_version(),
            "kind": kind.name(),
            "metadata": metadata,
        });
        if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), rest) {
            b.extend(extra);
        }
        DesiredObject {
            key: ObjectKey {
                kind,
                namespace: namespace.map(str::to_string),
                name: name.to_string(),
            },
            body,
        }
    }

    /// Selector labels of the instance pods.
    pub fn pod_selector(&self) -> Value {
        json!({
            "app.kubernetes.io/name": "meshplane-xds",
            names::REVISION_LABEL: self.revision,
        })
    }
}

/// Contract 8 labels of revision `revision` of tenant `tenant`.
pub fn ownership_labels(tenant: &str, revision: &str) -> BTreeMap<String, String> {
    meshplane_contracts::ownership::labels(tenant, revision)
}

/// Label selector (query form) matching everything revision `revision` of `tenant` owns.
pub fn ownership_selector(tenant: &str, revision: &str) -> String {
    meshplane_contracts::ownership::selector(tenant, revision)
}

/// The full desired object set of one revision, in apply order.
pub fn render(input: &RenderInput<'_>) -> Vec<DesiredObject> {
    let rev = Revision::new(input);
    let mut out = vec![
        instance::control_namespace(&rev),
        instance::debug_service_account(&rev),
    ];
    out.extend(instance::instance(&rev));
    out.extend(rbac::rbac(&rev));
    out.extend(bootstrap::bootstrap_configmaps(&rev));
    out.extend(gateway::gateway(&rev));
    out.extend(webhooks::webhooks(&rev));
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}
