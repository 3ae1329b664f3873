//! The resource types the stand-in serves: built-in kinds meshplane uses, plus custom resources
//! registered at runtime from `CustomResourceDefinition` objects.

use serde_json::Value;

/// One `additionalPrinterColumns` entry of a CRD version.
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// A served resource: one group/version/plural, how it is scoped, and what it supports.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Whether `/status` is a subresource (writes to the main resource then ignore `status`).
    pub has_status: bool,
    /// Other subresources served by the auth helper (`serviceaccounts/token`).
    pub extra_subresources: Vec<String>,
    /// Only `create` is served (TokenReview, the access reviews).
    pub create_only: bool,
    pub printer_columns: Vec<PrinterColumn>,
    /// Name of the CRD that registered this type.
    pub crd_name: Option<String>,
}

/// Storage identity of a resource: objects of all versions of one group/plural share it, and
/// the two views of Events share one (`event_views`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub group: String,
    pub plural: String,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Where its objects are stored: both views of Events share the core one
    /// (`event_views`).
    pub fn key(&self) -> ResourceKey {
        super::event_views::storage_key(&self.group, &self.plural)
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        if self.create_only {
            vec!["create"]
        } else {
            vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    has_status: bool,
}

const BUILTINS: &[Builtin] = &[
    b("", "v1", "Namespace", "namespaces", false, &["ns"], true),
    b("", "v1", "Pod", "pods", true, &["po"], true),
    b("", "v1", "Service", "services", true, &["svc"], true),
    b("", "v1", "ConfigMap", "configmaps", true, &["cm"], false),
    b("", "v1", "Secret", "secrets", true, &[], false),
    b(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        true,
        &["sa"],
        false,
    ),
    b("", "v1", "Event", "events", true, &["ev"], false),
    b(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        true,
        &["ev"],
        false,
    ),
    b(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        true,
        &["deploy"],
        true,
    ),
    b(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        true,
        &["rs"],
        true,
    ),
    b(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        true,
        &["sts"],
        true,
    ),
    b("apps", "v1", "DaemonSet", "daemonsets", true, &["ds"], true),
    b(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        true,
        &[],
        false,
    ),
    b(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
        &["pdb"],
        true,
    ),
    b(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        true,
        &["netpol"],
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        true,
        &[],
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        true,
        &[],
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        false,
        &[],
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
        &[],
        false,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        false,
        &[],
        false,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        false,
        &[],
        false,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        false,
        &[],
        true,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        false,
        &[],
        false,
    ),
    b(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        true,
        &[],
        false,
    ),
    b(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
        &["crd", "crds"],
        true,
    ),
    b(
        "authentication.k8s.io",
        "v1",
        "TokenReview",
        "tokenreviews",
        false,
        &[],
        false,
    ),
    b(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        false,
        &[],
        false,
    ),
    b(
        "authorization.k8s.io",
        "v1",
        "SubjectAccessReview",
        "subjectaccessreviews",
        false,
        &[],
        false,
    ),
];

/// Kinds that are only ever created, answered and never stored (reviews).
const CREATE_ONLY: &[&str] = &[
    "tokenreviews",
    "selfsubjectaccessreviews",
    "subjectaccessreviews",
];

const fn b(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    has_status: bool,
) -> Builtin {
    Builtin {
        group,
        version,
        kind,
        plural,
        namespaced,
        short_names,
        has_status,
    }
}

/// The built-in resource types, in discovery order.
pub fn builtin_types() -> Vec<ResourceType> {
    BUILTINS
        .iter()
        .map(|b| ResourceType {
            group: b.group.into(),
            version: b.version.into(),
            kind: b.kind.into(),
            plural: b.plural.into(),
            singular: b.kind.to_ascii_lowercase(),
            namespaced: b.namespaced,
            short_names: b.short_names.iter().map(|s| s.to_string()).collect(),
            // `kubectl get all` lists the kinds in category "all".
            categories: if matches!(
                b.plural,
                "pods" | "services" | "deployments" | "replicasets" | "statefulsets" | "daemonsets"
            ) {
                vec!["all".into()]
            } else {
                Vec::new()
            },
            has_status: b.has_status,
            extra_subresources: if b.plural == "serviceaccounts" {
                vec!["token".into()]
            } else {
                Vec::new()
            },
            create_only: CREATE_ONLY.contains(&b.plural),
            printer_columns: Vec::new(),
            crd_name: None,
        })
        .collect()
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The resource types a CRD serves (one per served version), or why the CRD is unusable.
pub fn types_from_crd(crd: &Value) -> Result<Vec<ResourceType>, String> {
    let spec = crd.get("spec").ok_or("spec: Required value")?;
    let group = str_at(spec, "group");
    let names = spec.get("names").ok_or("spec.names: Required value")?;
    let plural = str_at(names, "plural");
    let kind = str_at(names, "kind");
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return Err("spec.group, spec.names.plural and spec.names.kind are required".into());
    }
    let expected_name = format!("{plural}.{group}");
    let name = crate::object::name(crd);
    if name != expected_name {
        return Err(format!(
            "metadata.name: Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group ({expected_name:?})"
        ));
    }
    let namespaced = match str_at(spec, "scope") {
        "Namespaced" => true,
        "Cluster" => false,
        other => return Err(format!("spec.scope: Unsupported value: {other:?}")),
    };
    let singular = match str_at(names, "singular") {
        "" => kind.to_ascii_lowercase(),
        s => s.to_string(),
    };
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or("spec.versions: Required value")?;
    let mut types = Vec::new();
    for v in versions {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let version = str_at(v, "name");
        if version.is_empty() {
            return Err("spec.versions[].name: Required value".into());
        }
        let printer_columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: str_at(c, "name").into(),
                        type_: str_at(c, "type").into(),
                        format: str_at(c, "format").into(),
                        description: str_at(c, "description").into(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                        json_path: str_at(c, "jsonPath").into(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        types.push(ResourceType {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: singular.clone(),
            namespaced,
            short_names: strings(names.get("shortNames")),
            categories: strings(names.get("categories")),
            has_status: v.pointer("/subresources/status").is_some(),
            extra_subresources: Vec::new(),
            create_only: false,
            printer_columns,
            crd_name: Some(name.to_string()),
        });
    }
    Ok(types)
}
