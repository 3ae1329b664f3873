//! Labels, annotations and derived object names shared by every component.
//!
//! Every object the operator creates for revision `R` of tenant `T` is named from these
//! functions, so the length limits in [`crate::validation`] can be proven against them. The
//! names and labels that are contracts between the parts (docs/architecture.md) are defined in
//! `meshplane-contracts` and re-exported here.

pub use meshplane_contracts::bootstrap::configmap_name as bootstrap_configmap;
pub use meshplane_contracts::bootstrap::MOUNT_DIR as BOOTSTRAP_DIR;
pub use meshplane_contracts::debug;
pub use meshplane_contracts::members::configmap_name as members_configmap;
pub use meshplane_contracts::node::token_audience;
pub use meshplane_contracts::ownership::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, REVISION_LABEL, TENANT_LABEL,
};
pub use meshplane_contracts::ports;
pub use meshplane_contracts::proxies::configmap_name as proxies_configmap;
pub use meshplane_contracts::tenant_ca::{MOUNT_DIR as TENANT_CA_DIR, SECRET as TENANT_CA_SECRET};
pub use meshplane_contracts::webhook_tls::secret_name as webhook_tls_secret;
pub use meshplane_contracts::webhooks::{
    injector_configuration as injector_webhook, instance_name, service_host,
    validator_configuration as validator_webhook,
};

/// Namespace label that attaches a namespace to a revision (or a tag of one).
pub const REV_LABEL: &str = "meshplane.io/rev";
/// MeshControlPlane annotation by which a platform admin hands an existing namespace to the
/// tenant as its control namespace: its value is that namespace's `metadata.uid`, so a
/// namespace deleted and created again under the same name is not handed over with it.
pub const ADOPT_CONTROL_NAMESPACE_ANNOTATION: &str = "meshplane.io/adopt-control-namespace";
/// The one server-side-apply field manager the operator writes with.
pub const FIELD_MANAGER: &str = "meshplane-operator";
/// Pod label opting a pod out of sidecar injection (`"false"`).
pub const INJECT_LABEL: &str = "sidecar.meshplane.io/inject";
/// Pod annotation recording the revision that injected the pod.
pub const INJECTED_REVISION_ANNOTATION: &str = "sidecar.meshplane.io/revision";
/// Pod annotation asking for a capture mode (`NONE` skips the iptables init container).
pub const CAPTURE_MODE_ANNOTATION: &str = "sidecar.meshplane.io/captureMode";
/// Pod annotation: inbound ports the proxy intercepts (`*` or ports; Istio's
/// `traffic.sidecar.istio.io/includeInboundPorts`). Grammar in [`crate::capture`].
pub const INCLUDE_INBOUND_PORTS_ANNOTATION: &str = "sidecar.meshplane.io/includeInboundPorts";
/// Pod annotation: inbound ports never intercepted.
pub const EXCLUDE_INBOUND_PORTS_ANNOTATION: &str = "sidecar.meshplane.io/excludeInboundPorts";
/// Pod annotation: outbound ports intercepted whatever the destination address.
pub const INCLUDE_OUTBOUND_PORTS_ANNOTATION: &str = "sidecar.meshplane.io/includeOutboundPorts";
/// Pod annotation: outbound ports never intercepted.
pub const EXCLUDE_OUTBOUND_PORTS_ANNOTATION: &str = "sidecar.meshplane.io/excludeOutboundPorts";
/// Pod annotation: outbound destinations intercepted (`*` or CIDRs).
pub const INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION: &str =
    "sidecar.meshplane.io/includeOutboundIPRanges";
/// Pod annotation: outbound destinations never intercepted (CIDRs).
pub const EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION: &str =
    "sidecar.meshplane.io/excludeOutboundIPRanges";
/// Pod annotation: lifetime of the workload certificates the pod's node agent asks for (a Go
/// duration such as `1h` or `90s`; default the instance's 24 hours). Short lifetimes limit
/// what a stolen key is worth; the agent renews at about half of it.
pub const CERT_TTL_ANNOTATION: &str = "sidecar.meshplane.io/certTTL";
/// Pod annotation (`"true"`) for pods whose apps are proxyless gRPC clients: the node agent
/// serves them ADS and their containers get gRPC's xDS bootstrap (contract 13); capture
/// defaults to `NONE`. Istio's counterpart is `inject.istio.io/templates: grpc-agent`.
pub const PROXYLESS_GRPC_ANNOTATION: &str = "sidecar.meshplane.io/proxylessGrpc";
/// Annotation on a `MeshControlPlane` that lets deletion proceed while injected pods still run.
pub const FORCE_DELETE_ANNOTATION: &str = "meshplane.io/force-delete";
/// Annotation on a Service narrowing its visibility, like Istio's `networking.istio.io/exportTo`.
pub const SERVICE_EXPORT_TO_ANNOTATION: &str = "networking.meshplane.io/exportTo";
/// Pod label of a tenant's ingress gateway pods: the gateway's name (what a Gateway's
/// `selector` matches).
pub const GATEWAY_LABEL: &str = "meshplane.io/gateway";
/// Default name of a tenant's ingress gateway.
pub const DEFAULT_GATEWAY_NAME: &str = "ingressgateway";
/// Finalizer the operator puts on cluster-scoped meshplane objects.
pub const FINALIZER: &str = "meshplane.io/cleanup";
/// Label the API server sets on every namespace to its own name (immutable): webhooks and
/// NetworkPolicies select the control namespace by it.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Annotation on the operator's dry-run probe `Sidecar`: the revision whose validating webhook
/// must answer it (contract 5).
pub const WEBHOOK_PROBE_ANNOTATION: &str = "meshplane.io/webhook-probe";

/// Name of the probe `Sidecar` of revision `revision` (never stored: created by dry run only).
pub fn webhook_probe_name(revision: &str) -> String {
    format!("meshplane-webhook-probe-{revision}")
}

/// The message with which revision `revision`'s validating webhook refuses its probe: the
/// operator reads it as proof that the webhook is reachable and serving.
pub fn webhook_probe_answer(revision: &str) -> String {
    format!("meshplane webhook probe: revision {revision} is serving")
}

/// Longest revision or tag name: keeps `meshplane-<rev>-bootstrap`, the Service
/// `meshplane-<rev>` (a DNS-1035 label, at most 63) and pod names derived from the
/// Deployment comfortably inside Kubernetes' limits.
pub const MAX_REVISION_LEN: usize = 32;
/// Longest tenant name: keeps the default control namespace `meshplane-<tenant>` and
/// tenant-scoped ClusterRole names short.
pub const MAX_TENANT_LEN: usize = 32;
/// Suffix of the default trust domains: tenant `blue` defaults to `blue.meshplane.local`.
/// Trust domains under it are reserved, each for the tenant it names.
pub const TRUST_DOMAIN_SUFFIX: &str = "meshplane.local";

/// Default trust domain of tenant `tenant`'s identities: distinct per tenant, so that tenants
/// sharing an organisation root still refuse each other's workloads. A tenant name is a DNS
/// label, so the result is a valid SPIFFE trust domain.
pub fn default_trust_domain(tenant: &str) -> String {
    format!("{tenant}.{TRUST_DOMAIN_SUFFIX}")
}

/// Default control ("root") namespace of a tenant.
pub fn control_namespace(tenant: &str) -> String {
    format!("meshplane-{tenant}")
}

/// Role and RoleBinding granting a revision's instance read access in one member namespace.
pub fn member_reader(revision: &str) -> String {
    format!("meshplane-{revision}-reader")
}

/// Pod template annotation `kubectl rollout restart` sets; a new value rolls the workload.
pub const RESTARTED_AT_ANNOTATION: &str = "kubectl.kubernetes.io/restartedAt";

/// ClusterRole (shipped in `config/rbac/`, never bound cluster-wide) with the rights to restart
/// workloads; a revision binds it to the operator in each member namespace.
pub const WORKLOAD_RESTARTER_ROLE: &str = "meshplane-workload-restarter";

/// RoleBinding granting the operator [`WORKLOAD_RESTARTER_ROLE`] in one member namespace.
pub fn workload_restarter(revision: &str) -> String {
    format!("meshplane-{revision}-restarter")
}

/// RoleBinding in the namespace of a revision's ingress gateway letting its instance read the
/// Secrets that Gateways name by `credentialName` (it binds [`GATEWAY_CREDENTIALS_ROLE`]).
pub fn gateway_credential_reader(revision: &str) -> String {
    format!("meshplane-{revision}-gateway-credentials")
}

/// RoleBinding in the namespace of a revision's ingress gateway letting the gateway's own
/// ServiceAccount read the Secrets Gateways name by `credentialName` (it binds
/// [`GATEWAY_CREDENTIALS_ROLE`]): the instance serves a credential only to gateway proxies
/// whose ServiceAccount may read it (SubjectAccessReview).
pub fn gateway_proxy_credentials(revision: &str) -> String {
    format!("meshplane-{revision}-gateway-proxy-credentials")
}

/// ClusterRole (shipped in `config/rbac/`, never bound cluster-wide) with Secret reads; a
/// revision binds it to its instance and to its gateway's ServiceAccount in its ingress
/// gateway's namespace only.
pub const GATEWAY_CREDENTIALS_ROLE: &str = "meshplane-gateway-credentials";

/// ClusterRole (shipped in `config/rbac/`, never bound cluster-wide) with the operator's write
/// powers over the instance's objects (Secrets, Deployments, ServiceAccounts, Services,
/// PodDisruptionBudgets, NetworkPolicies); each revision binds it to the operator in its control
/// namespace ([`operator_access`]).
pub const CONTROL_NAMESPACE_ROLE: &str = "meshplane-control-namespace";

/// ClusterRole (shipped in `config/rbac/`, never bound cluster-wide) with the operator's write
/// powers over an ingress gateway's objects (Deployment, Service, ServiceAccount); a revision
/// binds it to the operator in its gateway's namespace when that is a member namespace
/// ([`gateway_operator_access`]).
pub const GATEWAY_NAMESPACE_ROLE: &str = "meshplane-gateway-namespace";

/// RoleBinding granting the operator [`CONTROL_NAMESPACE_ROLE`] in a revision's control
/// namespace.
pub fn operator_access(revision: &str) -> String {
    format!("meshplane-{revision}-operator")
}

/// RoleBinding granting the operator [`GATEWAY_NAMESPACE_ROLE`] in the member namespace where a
/// revision runs its ingress gateway.
pub fn gateway_operator_access(revision: &str) -> String {
    format!("meshplane-{revision}-gateway-operator")
}

/// Cluster-scoped RBAC objects of a revision (Shared mode reads, webhook self-management).
pub fn cluster_role(revision: &str) -> String {
    format!("meshplane-{revision}")
}

/// UID the injected proxy runs as; the capture rules exclude it so Envoy's own traffic is
/// not redirected back into itself.
pub const PROXY_UID: i64 = 1337;
