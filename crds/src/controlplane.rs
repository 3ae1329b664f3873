//! `meshplane.io/v1alpha1`: `MeshControlPlane` and `MeshRevisionTag`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envoyfilter_policy::EnvoyFilterPolicy;
use crate::names;
use crate::providers::{DefaultProviders, ExtensionProvider};
// Istio's type, which a Sidecar carries too; kept at this path for MeshConfig's readers.
pub use crate::networking::{OutboundTrafficMode, OutboundTrafficPolicy};

/// Desired state of one revision of a tenant's control plane.
///
/// A `MeshControlPlane` runs one instance (an Envoy xDS server) for revision `spec.revision`
/// of tenant `spec.tenant`. Namespaces join it with the label `meshplane.io/rev=<revision>`
/// (or the name of a `MeshRevisionTag` pointing at it).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "meshplane.io",
    version = "v1alpha1",
    kind = "MeshControlPlane",
    doc = "One revision of a tenant's isolated service-mesh control plane.",
    shortname = "mcp",
    status = "MeshControlPlaneStatus",
    printcolumn = r#"{"name":"Tenant","type":"string","jsonPath":".spec.tenant"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".status.revision"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Members","type":"integer","jsonPath":".status.members.count"}"#,
    printcolumn = r#"{"name":"Proxies","type":"integer","jsonPath":".status.connectedProxies"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.metadata.name.size() <= 32 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS-1035 label of at most 32 characters (it is the default revision)"),
)]
#[x_kube(
    validation = Rule::new("has(self.revision) == has(oldSelf.revision)").message("spec.revision is immutable: it cannot be added or removed after creation"),
    validation = Rule::new("has(self.namespace) == has(oldSelf.namespace)").message("spec.namespace is immutable: it cannot be added or removed after creation")
)]
#[serde(rename_all = "camelCase")]
pub struct MeshControlPlaneSpec {
    /// Tenant this revision belongs to. Several revisions may share a tenant; the tenant is the
    /// isolation boundary. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.tenant is immutable"))]
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub tenant: String,

    /// Revision name: the value of the `meshplane.io/rev` namespace label that selects this
    /// instance. Defaults to `metadata.name`. Unique cluster-wide, also against tag names.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.revision is immutable"))]
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub revision: Option<String>,

    /// Control namespace where the instance runs, shared by all revisions of the tenant and
    /// holding tenant-wide configuration (the tenant's root namespace). Defaults to
    /// `meshplane-<tenant>`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.namespace is immutable"))]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,

    /// Namespaces this revision may own. A namespace labelled for the revision (or one of its
    /// tags) but not matched by this selector is rejected, not joined. Absent: any namespace
    /// may join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Version of meshplane this revision runs; selects the default images.
    #[serde(default = "default_version")]
    #[schemars(length(min = 1, max = 64))]
    pub version: String,

    /// Images of this revision; each defaults to the meshplane image of `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Images>,

    /// Number of instance replicas. A PodDisruptionBudget keeps one available when above 1.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 10))]
    pub replicas: i32,

    /// Compute resources of the instance container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// How the instance reads the cluster: `Strict` (default) grants it read access per member
    /// namespace as namespaces join; `Shared` grants cluster-wide read and filters in the instance.
    #[serde(default)]
    pub isolation: IsolationMode,

    /// Mesh-wide settings of this revision.
    #[serde(default)]
    #[x_kube(validation = Rule::new("!has(self.extensionProviders) || self.extensionProviders.all(p, [has(p.envoyExtAuthzHttp), has(p.envoyExtAuthzGrpc), has(p.opentelemetry), has(p.envoyFileAccessLog), has(p.envoyOtelAls), has(p.prometheus)].filter(x, x).size() == 1)").message("spec.meshConfig.extensionProviders: each provider sets exactly one of envoyExtAuthzHttp, envoyExtAuthzGrpc, opentelemetry, envoyFileAccessLog, envoyOtelAls, prometheus"))]
    #[x_kube(validation = Rule::new("!has(self.extensionProviders) || self.extensionProviders.all(p, self.extensionProviders.exists_one(q, q.name == p.name))").message("spec.meshConfig.extensionProviders: provider names must be unique"))]
    pub mesh_config: MeshConfig,

    /// The tenant's certificate authority, which signs its workload certificates. Revisions of
    /// a tenant share one CA: the setting of the tenant's oldest revision is the tenant's.
    /// Absent: `selfSigned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!(has(self.selfSigned) && has(self.plugged))").message("spec.certificateAuthority: give selfSigned or plugged, not both"))]
    #[x_kube(validation = Rule::new("!has(self.plugged) || self.plugged.secretName != 'meshplane-ca'").message("spec.certificateAuthority.plugged.secretName: meshplane-ca is the Secret the operator keeps for the instances; name your cacerts Secret otherwise"))]
    pub certificate_authority: Option<CertificateAuthority>,
    /// An ingress gateway for traffic entering the tenant: the operator runs it (Deployment,
    /// Service, ServiceAccount) with this revision's proxy image, and this revision's instance
    /// programs it from the Gateways and VirtualServices of the namespaces it trusts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_gateway: Option<IngressGatewaySpec>,
}

/// A tenant's ingress gateway.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressGatewaySpec {
    /// Name of its Deployment, Service and ServiceAccount; its pods carry the label
    /// `meshplane.io/gateway: <name>`. Default `ingressgateway`.
    #[serde(default = "default_gateway_name")]
    #[schemars(
        length(min = 1, max = 48),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Namespace it runs in: the control namespace (default) or a member namespace of the
    /// tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
    /// Number of gateway pods.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 100))]
    pub replicas: i32,
    /// Extra labels of the gateway pods, e.g. `istio: ingressgateway` for Gateways written for
    /// Istio.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Namespaces whose Gateways and VirtualServices the gateway takes, besides its own
    /// namespace and the control namespace (always trusted). Config from any other namespace is
    /// ignored and reported on its status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_namespaces: Vec<String>,
    /// The gateway's Service.
    #[serde(default)]
    pub service: GatewayService,
    /// Compute resources of the gateway container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

fn default_gateway_name() -> String {
    names::DEFAULT_GATEWAY_NAME.to_string()
}

/// The Service in front of a tenant's ingress gateway.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayService {
    /// `ClusterIP`, `NodePort` or `LoadBalancer` (default).
    #[serde(default, rename = "type")]
    pub type_: GatewayServiceType,
    /// Ports; each `port` is what Gateway servers name, `targetPort` what the proxy binds.
    /// Default: `http` 80 to 8080 and `https` 443 to 8443.
    #[serde(default = "default_gateway_ports")]
    #[schemars(length(min = 1))]
    pub ports: Vec<GatewayServicePort>,
}

impl Default for GatewayService {
    fn default() -> Self {
        Self {
            type_: GatewayServiceType::default(),
            ports: default_gateway_ports(),
        }
    }
}

fn default_gateway_ports() -> Vec<GatewayServicePort> {
    vec![
        GatewayServicePort {
            name: "http".into(),
            port: 80,
            target_port: 8080,
        },
        GatewayServicePort {
            name: "https".into(),
            port: 443,
            target_port: 8443,
        },
    ]
}

/// Type of a gateway's Service.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum GatewayServiceType {
    /// Reachable inside the cluster only.
    ClusterIP,
    /// Also on a port of every node.
    NodePort,
    /// Also through the cluster's load balancer.
    #[default]
    LoadBalancer,
}

/// A port of a gateway's Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayServicePort {
    /// Port name (its protocol prefix, as for any Service).
    #[schemars(length(min = 1, max = 15))]
    pub name: String,
    /// Service port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Port the gateway proxy listens on (unprivileged, 1024 or above).
    #[schemars(range(min = 1024, max = 65535))]
    pub target_port: i32,
}

/// Where a tenant's certificate authority comes from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateAuthority {
    /// The operator issues a root for the tenant and rotates it (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_signed: Option<SelfSignedCa>,
    /// An intermediate of the organisation's root, plugged in from a Secret of the control
    /// namespace in Istio's `cacerts` layout (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`,
    /// `cert-chain.pem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugged: Option<PluggedCa>,
}

/// A self-signed tenant root, kept by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SelfSignedCa {}

/// A plugged-in CA.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluggedCa {
    /// Name of the Secret in the control namespace (Istio names it `cacerts`). Not
    /// `meshplane-ca`: that is the Secret the operator keeps for the instances.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub secret_name: String,
}

impl CertificateAuthority {
    /// The Secret of a plugged-in CA, if this is one.
    pub fn plugged_secret(&self) -> Option<&str> {
        self.plugged.as_ref().map(|p| p.secret_name.as_str())
    }
}

fn default_version() -> String {
    "0.1.0".to_string()
}

fn default_replicas() -> i32 {
    1
}

/// Container images of a revision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Images {
    /// Image of the xds-server (the control-plane instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub xds_server: Option<String>,
    /// Image of the sidecar proxy injected into member pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub proxy: Option<String>,
}

/// How a revision's instance is granted read access to the cluster.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum IsolationMode {
    /// Read access only in member namespaces, granted per namespace by a RoleBinding created when
    /// the namespace joins and deleted when it leaves.
    #[default]
    Strict,
    /// Cluster-wide read through one ClusterRoleBinding; the instance filters to its members.
    Shared,
}

/// Mesh-wide settings of a revision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshConfig {
    /// Trust domain of the tenant's workload identities (`spiffe://<trustDomain>/ns/..`).
    /// Absent: `<tenant>.meshplane.local`. Each tenant has its own: a trust domain another
    /// tenant uses is refused, and every revision of a tenant uses the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub trust_domain: Option<String>,
    /// Default visibility of Services and ServiceEntries that set no `exportTo`: `*` (the whole
    /// tenant, the default), `.` (own namespace) or namespace names of the tenant.
    #[serde(default = "default_export_to")]
    pub default_export_to: Vec<String>,
    /// What a proxy does with traffic to hosts it does not know.
    #[serde(default)]
    pub outbound_traffic_policy: OutboundTrafficPolicy,
    /// Access logging of the tenant's proxies.
    #[serde(default)]
    pub access_logging: AccessLogging,
    /// What the tenant's EnvoyFilters may do, enforced at admission and again when the instance
    /// translates them. Absent: the safe defaults — no Lua, no added or redirected clusters,
    /// only filters and other typed extensions (access loggers, load-balancing policies,
    /// transport sockets, ...) that neither run code nor send request data elsewhere.
    #[serde(default, skip_serializing_if = "EnvoyFilterPolicy::is_default")]
    pub envoy_filter_policy: EnvoyFilterPolicy,
    /// Services the tenant's proxies call for policy and telemetry, in Istio's shapes:
    /// external authorizers that `action: CUSTOM` AuthorizationPolicies name
    /// (`envoyExtAuthzHttp`, `envoyExtAuthzGrpc`), tracing collectors (`opentelemetry`),
    /// access logs (`envoyFileAccessLog`, `envoyOtelAls`) and `prometheus` metrics. A
    /// provider's `service` must be inside the tenant: a Service of one of its namespaces
    /// (`name.ns.svc.cluster.local` or `ns/name`) or one of its ServiceEntry hosts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub extension_providers: Vec<ExtensionProvider>,
    /// Providers used where a Telemetry resource names none, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_providers: Option<DefaultProviders>,
    /// How the tenant's instance fetches the key sets (`jwksUri`) of RequestAuthentications.
    #[serde(default, skip_serializing_if = "JwksFetch::is_default")]
    pub jwks_fetch: JwksFetch,
    /// Defaults of the tenant's proxies (Istio's `meshConfig.defaultConfig`, a ProxyConfig);
    /// meshplane reads `tracing.sampling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_config: Option<DefaultProxyConfig>,
    /// The cluster's pod address ranges (CIDRs: the cluster CIDR the CNI hands pod addresses
    /// from, e.g. kube-controller-manager's `--cluster-cidr`). A ServiceEntry endpoint address
    /// inside them must then be a pod of the tenant: another tenant's pod (or one of no tenant)
    /// is refused at admission. Absent: the check is off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-validations" = [{"rule": "self.all(c, isCIDR(c))", "message": "podNetworks must be CIDRs, such as 198.18.0.0/16"}]))]
    pub pod_networks: Vec<String>,
}

/// Defaults of the tenant's proxies (the fields of Istio's `ProxyConfig` that meshplane reads).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefaultProxyConfig {
    /// Tracing defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<DefaultTracing>,
}

/// Tracing defaults of the tenant's proxies.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefaultTracing {
    /// Percentage of requests (0 to 100) that start a trace where no Telemetry sets
    /// `randomSamplingPercentage` (Istio's default: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub sampling: Option<f64>,
}

impl MeshConfig {
    /// `defaultConfig.tracing.sampling`, when set.
    pub fn default_sampling(&self) -> Option<f64> {
        self.default_config
            .as_ref()
            .and_then(|d| d.tracing.as_ref())
            .and_then(|t| t.sampling)
    }
}

/// How the tenant's instance fetches the key sets of its RequestAuthentications.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JwksFetch {
    /// Allow fetches from link-local addresses (169.254.0.0/16, fe80::/10) and cloud metadata
    /// addresses. Refused by default: a `jwksUri` written by any namespace owner of the tenant
    /// must not make the instance read its node's metadata service.
    #[serde(default)]
    pub allow_link_local: bool,
    /// How often a key set that was fetched is fetched again (default 20m). A failed fetch is
    /// retried sooner, backing off from 5s to this interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_interval: Option<crate::duration::Duration>,
}

impl JwksFetch {
    fn is_default(&self) -> bool {
        *self == JwksFetch::default()
    }
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            trust_domain: None,
            default_export_to: default_export_to(),
            outbound_traffic_policy: OutboundTrafficPolicy::default(),
            access_logging: AccessLogging::default(),
            envoy_filter_policy: EnvoyFilterPolicy::default(),
            extension_providers: Vec::new(),
            default_providers: None,
            default_config: None,
            jwks_fetch: JwksFetch::default(),
            pod_networks: Vec::new(),
        }
    }
}

impl MeshConfig {
    /// The trust domain of tenant `tenant` under these settings: the one set, else the
    /// tenant's default ([`names::default_trust_domain`]).
    pub fn trust_domain_of(&self, tenant: &str) -> String {
        self.trust_domain
            .clone()
            .unwrap_or_else(|| names::default_trust_domain(tenant))
    }

    /// The extension provider named `name`.
    pub fn extension_provider(&self, name: &str) -> Option<&ExtensionProvider> {
        self.extension_providers.iter().find(|p| p.name == name)
    }
}

fn default_export_to() -> Vec<String> {
    vec!["*".to_string()]
}

/// Access-log settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessLogging {
    /// Write an access log line for every request and connection.
    #[serde(default)]
    pub enabled: bool,
    /// Where to write it; defaults to `/dev/stdout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `TEXT` (default) or `JSON`: Istio's default access log format as a line of text or as
    /// a JSON object (Istio's `accessLogEncoding`). Also the format of the built-in `envoy`
    /// provider that Telemetries name.
    #[serde(default, skip_serializing_if = "AccessLogEncoding::is_text")]
    pub encoding: AccessLogEncoding,
}

/// How an access log line is written.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccessLogEncoding {
    /// One line of text in Istio's default format.
    #[default]
    Text,
    /// One JSON object per line, with the fields of Istio's default format.
    Json,
}

impl AccessLogEncoding {
    fn is_text(&self) -> bool {
        *self == AccessLogEncoding::Text
    }
}

/// Observed state of a `MeshControlPlane`, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshControlPlaneStatus {
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Effective revision (`spec.revision` or `metadata.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Effective control namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_namespace: Option<String>,
    /// UID of the control namespace the operator created for the tenant (or was handed with
    /// the `meshplane.io/adopt-control-namespace` annotation). Only the namespace with this
    /// UID is taken as the control namespace: labels anyone can set never make one.
    #[serde(
        default,
        rename = "controlNamespaceUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub control_namespace_uid: Option<String>,
    /// `Ready`, `Reconciled`, `WebhooksReady`, `MembersStale` (an instance serves the last
    /// members it could read: its members ConfigMap is deleted, unreadable or not the
    /// operator's), `WatchesRefused` (the API server refuses an instance pod some reads, named
    /// as namespace/kind, and it serves without those objects until access returns),
    /// `Degraded`, `InUse`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Namespaces attached to this revision (directly or through a tag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<NamespaceList>,
    /// Namespaces labelled for this revision but refused, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<RejectedNamespaces>,
    /// Tags currently pointing at this revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Proxies connected to this revision's instance, as reported by the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected_proxies: Option<i32>,
}

/// Most namespace names a status lists; the count is always exact.
pub const STATUS_NAME_LIMIT: usize = 50;

/// A counted, bounded list of namespace names.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceList {
    /// Exact number of namespaces.
    pub count: i32,
    /// Names, sorted, at most 50.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

/// A counted, bounded list of rejected namespaces.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RejectedNamespaces {
    /// Exact number of rejected namespaces.
    pub count: i32,
    /// Rejected namespaces with their reason, sorted by name, at most 50.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<RejectedNamespace>,
}

/// One namespace refused by a revision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RejectedNamespace {
    /// Namespace name.
    pub name: String,
    /// Machine-readable reason, e.g. `OutsideSelector`.
    pub reason: String,
    /// Human-readable explanation.
    pub message: String,
}

impl MeshControlPlane {
    /// Effective revision: `spec.revision`, or `metadata.name` when unset.
    pub fn revision(&self) -> String {
        self.spec
            .revision
            .clone()
            .or_else(|| self.metadata.name.clone())
            .unwrap_or_default()
    }

    /// Effective control namespace: `spec.namespace`, or `meshplane-<tenant>`.
    pub fn control_namespace(&self) -> String {
        self.spec
            .namespace
            .clone()
            .unwrap_or_else(|| names::control_namespace(&self.spec.tenant))
    }

    /// Effective trust domain: `spec.meshConfig.trustDomain`, or `<tenant>.meshplane.local`.
    pub fn trust_domain(&self) -> String {
        self.spec.mesh_config.trust_domain_of(&self.spec.tenant)
    }

    /// Image of the xds-server for this revision.
    pub fn xds_image(&self) -> String {
        self.spec
            .images
            .as_ref()
            .and_then(|i| i.xds_server.clone())
            .unwrap_or_else(|| format!("ghcr.io/meshplane/xds-server:{}", self.spec.version))
    }

    /// The ingress gateway of this revision as its instance learns it (contract 2).
    pub fn gateway_deployment(&self) -> Option<GatewayDeployment> {
        let gw = self.spec.ingress_gateway.as_ref()?;
        let mut labels = gw.labels.clone();
        labels.insert(names::GATEWAY_LABEL.to_string(), gw.name.clone());
        Some(GatewayDeployment {
            name: gw.name.clone(),
            namespace: gw
                .namespace
                .clone()
                .unwrap_or_else(|| self.control_namespace()),
            labels,
            allowed_namespaces: gw.allowed_namespaces.clone(),
        })
    }

    /// Image of the sidecar proxy for this revision.
    pub fn proxy_image(&self) -> String {
        self.spec
            .images
            .as_ref()
            .and_then(|i| i.proxy.clone())
            .unwrap_or_else(|| format!("ghcr.io/meshplane/proxy:{}", self.spec.version))
    }
}

/// A cluster-scoped alias for a revision: namespaces labelled `meshplane.io/rev=<tag>` join the
/// revision the tag points to. Moving the tag moves them (new pods); a tag never moves across
/// tenants.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "meshplane.io",
    version = "v1alpha1",
    kind = "MeshRevisionTag",
    doc = "A cluster-scoped alias that points namespaces at a revision of one tenant.",
    shortname = "mrt",
    status = "MeshRevisionTagStatus",
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".spec.revision"}"#,
    printcolumn = r#"{"name":"Tenant","type":"string","jsonPath":".status.tenant"}"#,
    printcolumn = r#"{"name":"In Use","type":"string","jsonPath":".status.conditions[?(@.type==\"InUse\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.metadata.name.size() <= 32 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS-1035 label of at most 32 characters (it is the value of the meshplane.io/rev label)"),
)]
#[serde(rename_all = "camelCase")]
pub struct MeshRevisionTagSpec {
    /// Revision this tag points to. Moving it to a revision of another tenant is refused.
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub revision: String,
}

/// Observed state of a `MeshRevisionTag`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshRevisionTagStatus {
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Revision the tag resolves to (the last accepted one while a move is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Tenant of that revision. Once set, the tag stays in this tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// `Ready`, `Degraded` (e.g. `TagMovedAcrossTenants`, `RevisionNotFound`, `TagNamedLikeRevision`),
    /// `InUse` (whether any namespace carries the tag).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Namespaces carrying this tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<NamespaceList>,
}

/// A gateway the operator runs for a tenant, as the tenant's instances learn it (the members
/// ConfigMap's `gateways` key, contract 2): where its pods are, how they are labelled, and
/// which namespaces' Gateways and VirtualServices it takes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct GatewayDeployment {
    /// Name of the gateway (its Deployment and Service).
    pub name: String,
    /// Namespace of its pods.
    pub namespace: String,
    /// Labels its pods carry (a Gateway's `selector` matches them).
    pub labels: BTreeMap<String, String>,
    /// Namespaces whose Gateways and VirtualServices it takes, besides its own namespace and
    /// the control namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_namespaces: Vec<String>,
}

/// Labels of a workload selector (`workloadSelector.labels`).
pub type Labels = BTreeMap<String, String>;
