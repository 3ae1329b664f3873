//! Labels, annotations and derived object names shared by every component.
//!
//! Every object the operator creates for revision `R` of tenant `T` is named from these
//! functions, so the length limits in [`crate::validation`] can be proven against them.

/// Namespace label that attaches a namespace to a revision (or a tag of one).
pub const REV_LABEL: &str = "meshplane.io/rev";
/// Label on every object the operator owns: the tenant it belongs to.
pub const TENANT_LABEL: &str = "meshplane.io/tenant";
/// Label on every object the operator owns: the revision it belongs to.
pub const REVISION_LABEL: &str = "meshplane.io/revision";
/// Standard Kubernetes label naming the manager of an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on meshplane-owned objects.
pub const MANAGED_BY_VALUE: &str = "meshplane";
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
/// Annotation on a `MeshControlPlane` that lets deletion proceed while injected pods still run.
pub const FORCE_DELETE_ANNOTATION: &str = "meshplane.io/force-delete";
/// Annotation on a Service narrowing its visibility, like Istio's `networking.istio.io/exportTo`.
pub const SERVICE_EXPORT_TO_ANNOTATION: &str = "networking.meshplane.io/exportTo";
/// Finalizer the operator puts on cluster-scoped meshplane objects.
pub const FINALIZER: &str = "meshplane.io/cleanup";

/// Longest revision or tag name: keeps `meshplane-<rev>-bootstrap`, the Service
/// `meshplane-<rev>` (a DNS-1035 label, at most 63) and pod names derived from the
/// Deployment comfortably inside Kubernetes' limits.
pub const MAX_REVISION_LEN: usize = 32;
/// Longest tenant name: keeps the default control namespace `meshplane-<tenant>` and
/// tenant-scoped ClusterRole names short.
pub const MAX_TENANT_LEN: usize = 32;
/// Default trust domain of a tenant's identities.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// Default control ("root") namespace of a tenant.
pub fn control_namespace(tenant: &str) -> String {
    format!("meshplane-{tenant}")
}

/// Name of the revision's instance: Deployment, Service, ServiceAccount, PDB.
pub fn instance_name(revision: &str) -> String {
    format!("meshplane-{revision}")
}

/// Bootstrap ConfigMap placed in every member namespace of the tenant.
pub fn bootstrap_configmap(revision: &str) -> String {
    format!("meshplane-{revision}-bootstrap")
}

/// ConfigMap in the control namespace listing the tenant's members for the instance.
pub fn members_configmap(revision: &str) -> String {
    format!("meshplane-{revision}-members")
}

/// Secret in the control namespace holding the instance's webhook CA and serving certificate.
pub fn webhook_tls_secret(revision: &str) -> String {
    format!("meshplane-{revision}-webhook-tls")
}

/// Mutating (injection) webhook configuration of a revision.
pub fn injector_webhook(revision: &str) -> String {
    format!("meshplane-{revision}-injector")
}

/// Validating (config) webhook configuration of a revision.
pub fn validator_webhook(revision: &str) -> String {
    format!("meshplane-{revision}-validator")
}

/// Role and RoleBinding granting a revision's instance read access in one member namespace.
pub fn member_reader(revision: &str) -> String {
    format!("meshplane-{revision}-reader")
}

/// Cluster-scoped RBAC objects of a revision (Shared mode reads, webhook self-management).
pub fn cluster_role(revision: &str) -> String {
    format!("meshplane-{revision}")
}

/// In-cluster DNS name of the instance Service, the subject of its serving certificate.
pub fn service_host(revision: &str, control_namespace: &str) -> String {
    format!("{}.{control_namespace}.svc", instance_name(revision))
}

/// Audience of the projected ServiceAccount token a proxy presents to its tenant's instance.
pub fn token_audience(tenant: &str) -> String {
    format!("meshplane-{tenant}")
}

/// Service ports of every instance.
pub mod ports {
    /// ADS (gRPC, HTTP/2 cleartext).
    pub const GRPC_XDS: u16 = 15010;
    /// Admission webhooks (HTTPS).
    pub const HTTPS_WEBHOOK: u16 = 15017;
    /// Metrics, health and debug (HTTP).
    pub const HTTP_MONITORING: u16 = 15014;
    /// Virtual outbound listener a captured proxy receives redirected traffic on.
    pub const VIRTUAL_OUTBOUND: u16 = 15001;
    /// Virtual inbound listener a captured proxy receives redirected traffic on.
    pub const VIRTUAL_INBOUND: u16 = 15006;
    /// Envoy admin (loopback only).
    pub const PROXY_ADMIN: u16 = 15000;
    /// Envoy readiness endpoint.
    pub const PROXY_READY: u16 = 15021;
}

/// UID the injected proxy runs as; the capture rules exclude it so Envoy's own traffic is
/// not redirected back into itself.
pub const PROXY_UID: i64 = 1337;
