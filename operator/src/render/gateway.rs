//! The tenant's ingress gateway (`spec.ingressGateway`): a Deployment of the revision's proxy
//! image running as a router (node id `router~…`, no traffic capture), its Service and
//! ServiceAccount, in the control namespace or a member namespace of the tenant. The revision's
//! instance programs it from the Gateways and VirtualServices of the namespaces it trusts; it
//! learns the gateway's labels and trusted namespaces from the members ConfigMap (`gateways`,
//! contract 2). The instance serves a Gateway's `credentialName` Secret only to gateway proxies
//! whose ServiceAccount may `get` it (SubjectAccessReview), so the gateway's ServiceAccount is
//! bound the shipped Secret reader of its namespace; it mounts no API token, so the binding
//! grants the pods nothing to read with.

use std::collections::{BTreeMap, BTreeSet};

use meshplane_crds::controlplane::GatewayDeployment;
use meshplane_crds::names::{self, ports};
use serde_json::{json, Value};

use super::{DesiredObject, Kind, Revision};

const BOOTSTRAP_VOLUME: &str = "meshplane-bootstrap";
const BOOTSTRAP_DIR: &str = "/etc/meshplane/bootstrap";
/// The tenant's trust bundle in the bootstrap ConfigMap (contract 6).
const ROOT_CERT: &str = meshplane_contracts::bootstrap::ROOT_CERT;
const RUNTIME_VOLUME: &str = "meshplane-runtime";
const RUNTIME_DIR: &str = "/var/run/meshplane";
const TOKEN_VOLUME: &str = "meshplane-token";
const TOKEN_DIR: &str = "/var/run/secrets/meshplane/tokens";
const TOKEN_FILE: &str = "meshplane-token";
const TOKEN_EXPIRATION_SECONDS: i64 = 3600;
/// Container name of the injected sidecar too: the injector leaves a pod that has one alone.
const PROXY_CONTAINER: &str = "meshplane-proxy";

/// The gateway this revision runs, when it asks for one and its namespace is the tenant's
/// (the control namespace or a member). A gateway in any other namespace is not run: the
/// revision's status says why ([`misplaced_gateway`]).
pub fn running_gateway(rev: &Revision<'_>) -> Option<GatewayDeployment> {
    let dep = rev.input.control_plane.gateway_deployment()?;
    (dep.namespace == rev.control_namespace || rev.input.tenant_members.contains(&dep.namespace))
        .then_some(dep)
}

/// Why the requested gateway is not run, if it is not.
pub fn misplaced_gateway(rev: &Revision<'_>) -> Option<String> {
    let dep = rev.input.control_plane.gateway_deployment()?;
    if running_gateway(rev).is_some() {
        return None;
    }
    Some(format!(
        "spec.ingressGateway.namespace {:?} is neither the control namespace {:?} nor a member namespace of tenant {:?}; the gateway is not run until it is",
        dep.namespace, rev.control_namespace, rev.tenant
    ))
}

/// A Kubernetes Gateway API `Gateway` of the tenant's class that this revision runs a proxy
/// for (the operator reads it from the Gateway: [`managed_gateway_name`] names its objects).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ManagedGateway {
    /// The Gateway's namespace: a member namespace of the tenant or its control namespace.
    pub namespace: String,
    /// The Gateway's name.
    pub name: String,
    /// Its GatewayClass's name.
    pub class: String,
    /// The distinct ports of its listeners.
    pub ports: Vec<u16>,
    /// The Service type (`LoadBalancer` unless the Gateway asks otherwise).
    pub service_type: String,
    /// `spec.infrastructure.labels` and `.annotations`, copied onto what is rendered.
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

pub use meshplane_crds::gateway_tenancy::GATEWAY_NAME_LABEL;

/// Name of the Deployment, Service and ServiceAccount of a Gateway API gateway:
/// `<gateway>-<class>` (as Istio names them), shortened with a hash to fit a Service name.
pub fn managed_gateway_name(gateway: &str, class: &str) -> String {
    let full = format!("{gateway}-{class}");
    if full.len() <= 63 {
        return full;
    }
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(full.as_bytes())
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect();
    let keep = 63 - digest.len() - 1;
    let head = full[..keep].trim_end_matches('-');
    format!("{head}-{digest}")
}

/// The ports the gateway proxy binds for a Gateway's listener ports, as (listener port, bound
/// port), sorted: the same one from 1024 up, else 8000 above it (80 -> 8080, 443 -> 8443) or
/// the next port no listener uses, since the proxy runs without privileges. The instance reads
/// them back from the Service's `targetPort`s.
pub fn bound_listener_ports(ports: &[u16]) -> Vec<(u16, u16)> {
    let mut ports: Vec<u16> = ports.to_vec();
    ports.sort_unstable();
    ports.dedup();
    let mut taken: BTreeSet<u16> = ports.iter().copied().filter(|p| *p >= 1024).collect();
    ports
        .iter()
        .map(|&p| {
            if p >= 1024 {
                return (p, p);
            }
            let mut bound = p + 8000;
            // Past the ports the proxy keeps for itself (15000-15099) if it ever came to that.
            while taken.contains(&bound) || (15000..=15099).contains(&bound) {
                bound += 1;
            }
            taken.insert(bound);
            (p, bound)
        })
        .collect()
}

/// The namespaces where this revision runs gateway proxies (its ingress gateway and the
/// Gateway API gateways it runs), each needing the bootstrap ConfigMap, the instance's
/// credential reader and, in a member namespace, the operator's write access.
pub fn gateway_namespaces(rev: &Revision<'_>) -> BTreeSet<String> {
    running_gateway(rev)
        .map(|g| g.namespace)
        .into_iter()
        .chain(
            rev.input
                .managed_gateways
                .iter()
                .filter(|g| runs_managed(rev, g))
                .map(|g| g.namespace.clone()),
        )
        .collect()
}

/// The gateways this revision runs as its instance learns them (contract 2, `gateways`): the
/// ingress gateway, then each Gateway API gateway (pods labelled with its Gateway's name,
/// trusting no namespace beyond its own: its Gateway's `allowedRoutes` decide).
pub fn instance_gateways(rev: &Revision<'_>) -> Vec<GatewayDeployment> {
    running_gateway(rev)
        .into_iter()
        .chain(
            rev.input
                .managed_gateways
                .iter()
                .filter(|g| runs_managed(rev, g))
                .map(|g| GatewayDeployment {
                    name: managed_gateway_name(&g.name, &g.class),
                    namespace: g.namespace.clone(),
                    labels: BTreeMap::from([(GATEWAY_NAME_LABEL.to_string(), g.name.clone())]),
                    allowed_namespaces: Vec::new(),
                }),
        )
        .collect()
}

/// Whether a Gateway API gateway's namespace is the tenant's (checked again here: the plan
/// chooses them, the render never writes outside the tenant).
fn runs_managed(rev: &Revision<'_>, g: &ManagedGateway) -> bool {
    g.namespace == rev.control_namespace || rev.input.tenant_members.contains(&g.namespace)
}

/// The gateways' objects: the ingress gateway's and every Gateway API gateway's, with one
/// credentials RoleBinding per namespace naming all of their ServiceAccounts.
pub fn gateway(rev: &Revision<'_>) -> Vec<DesiredObject> {
    let mut out = Vec::new();
    // ServiceAccounts by namespace, for the credentials RoleBindings.
    let mut accounts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if let (Some(dep), Some(spec)) = (
        running_gateway(rev),
        rev.input.control_plane.spec.ingress_gateway.as_ref(),
    ) {
        accounts
            .entry(dep.namespace.clone())
            .or_default()
            .push(dep.name.clone());
        out.extend(ingress_gateway(rev, &dep, spec));
    }
    for g in rev
        .input
        .managed_gateways
        .iter()
        .filter(|g| runs_managed(rev, g))
    {
        let name = managed_gateway_name(&g.name, &g.class);
        accounts.entry(g.namespace.clone()).or_default().push(name);
        out.extend(managed_gateway(rev, g));
    }
    for (namespace, names_) in accounts {
        let subjects: Vec<Value> = names_
            .iter()
            .map(|n| json!({"kind": "ServiceAccount", "name": n, "namespace": namespace}))
            .collect();
        out.push(rev.object(
            Kind::RoleBinding,
            Some(&namespace),
            &names::gateway_proxy_credentials(&rev.revision),
            json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": names::GATEWAY_CREDENTIALS_ROLE},
                "subjects": subjects,
            }),
        ));
    }
    out
}

/// The ingress gateway's objects (`spec.ingressGateway`).
fn ingress_gateway(
    rev: &Revision<'_>,
    dep: &GatewayDeployment,
    spec: &meshplane_crds::controlplane::IngressGatewaySpec,
) -> Vec<DesiredObject> {
    let ns = Some(dep.namespace.as_str());
    let selector = json!({ names::GATEWAY_LABEL: dep.name });
    let service_type = match spec.service.type_ {
        meshplane_crds::controlplane::GatewayServiceType::ClusterIP => "ClusterIP",
        meshplane_crds::controlplane::GatewayServiceType::NodePort => "NodePort",
        meshplane_crds::controlplane::GatewayServiceType::LoadBalancer => "LoadBalancer",
    };
    let service_ports: Vec<Value> = spec
        .service
        .ports
        .iter()
        .map(|p| json!({"name": p.name, "port": p.port, "targetPort": p.target_port, "protocol": "TCP"}))
        .collect();
    let mut pod_labels: BTreeMap<String, String> = dep.labels.clone();
    pod_labels.insert(names::GATEWAY_LABEL.into(), dep.name.clone());
    let proxy = GatewayProxy {
        name: &dep.name,
        namespace: &dep.namespace,
        selector: selector.clone(),
        pod_labels,
        container_ports: spec
            .service
            .ports
            .iter()
            .map(|p| (p.name.clone(), i64::from(p.target_port)))
            .collect(),
        replicas: i64::from(spec.replicas),
        resources: spec
            .resources
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok()),
    };
    vec![
        // The pods talk to the instance only, with their projected token of its audience.
        rev.object(
            Kind::ServiceAccount,
            ns,
            &dep.name,
            json!({"automountServiceAccountToken": false}),
        ),
        rev.object(
            Kind::Service,
            ns,
            &dep.name,
            json!({"spec": {"type": service_type, "selector": selector, "ports": service_ports}}),
        ),
        rev.object(
            Kind::Deployment,
            ns,
            &dep.name,
            deployment_spec(rev, &proxy),
        ),
    ]
}

/// A Gateway API gateway's objects: ServiceAccount, Service (a port per listener port) and
/// Deployment, named [`managed_gateway_name`], pods labelled [`GATEWAY_NAME_LABEL`].
fn managed_gateway(rev: &Revision<'_>, g: &ManagedGateway) -> Vec<DesiredObject> {
    let name = managed_gateway_name(&g.name, &g.class);
    let ns = Some(g.namespace.as_str());
    let selector = json!({ GATEWAY_NAME_LABEL: g.name });
    let ports = bound_listener_ports(&g.ports);
    let port_name = |p: u16| format!("port-{p}");
    let service_ports: Vec<Value> = ports
        .iter()
        .map(|&(p, bound)| json!({"name": port_name(p), "port": p, "targetPort": bound, "protocol": "TCP"}))
        .collect();
    let mut pod_labels = g.labels.clone();
    pod_labels.insert(GATEWAY_NAME_LABEL.into(), g.name.clone());
    let proxy = GatewayProxy {
        name: &name,
        namespace: &g.namespace,
        selector: selector.clone(),
        pod_labels,
        container_ports: ports
            .iter()
            .map(|&(p, bound)| (port_name(p), i64::from(bound)))
            .collect(),
        replicas: 1,
        resources: None,
    };
    let with_infrastructure = |mut o: DesiredObject| {
        if let Some(meta) = o.body.get_mut("metadata").and_then(Value::as_object_mut) {
            if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
                for (k, v) in &g.labels {
                    labels.entry(k.clone()).or_insert_with(|| json!(v));
                }
                labels.insert(GATEWAY_NAME_LABEL.into(), json!(g.name));
            }
            if !g.annotations.is_empty() {
                meta.insert("annotations".into(), json!(g.annotations));
            }
        }
        o
    };
    vec![
        with_infrastructure(rev.object(
            Kind::ServiceAccount,
            ns,
            &name,
            json!({"automountServiceAccountToken": false}),
        )),
        with_infrastructure(rev.object(
            Kind::Service,
            ns,
            &name,
            json!({"spec": {"type": g.service_type, "selector": selector, "ports": service_ports}}),
        )),
        with_infrastructure(rev.object(Kind::Deployment, ns, &name, deployment_spec(rev, &proxy))),
    ]
}

/// What differs between the gateway proxies the operator runs.
struct GatewayProxy<'a> {
    name: &'a str,
    namespace: &'a str,
    selector: Value,
    /// Besides the tenant, revision and no-injection labels every gateway pod carries.
    pod_labels: BTreeMap<String, String>,
    /// (name, port the proxy binds).
    container_ports: Vec<(String, i64)>,
    replicas: i64,
    resources: Option<Value>,
}

fn deployment_spec(rev: &Revision<'_>, proxy: &GatewayProxy<'_>) -> Value {
    let mcp = rev.input.control_plane;
    let mut pod_labels = json!(proxy.pod_labels);
    if let Some(l) = pod_labels.as_object_mut() {
        l.insert(names::TENANT_LABEL.into(), json!(rev.tenant));
        l.insert(names::REVISION_LABEL.into(), json!(rev.revision));
        // A gateway is a proxy of its own: never inject a sidecar into it.
        l.insert(names::INJECT_LABEL.into(), json!("false"));
    }
    let mut args: Vec<String> = vec![
        "--bootstrap".into(),
        format!("{BOOTSTRAP_DIR}/envoy.yaml"),
        "--token-file".into(),
        format!("{TOKEN_DIR}/{TOKEN_FILE}"),
        // The node agent (contract 11), as in every sidecar: ADS carried to the instance over
        // TLS verified against the tenant's bundle with the token re-read at every connect, and
        // a workload certificate over SDS, so the gateway originates the tenant's mutual TLS.
        "--root-cert".into(),
        format!("{BOOTSTRAP_DIR}/{ROOT_CERT}"),
        "--out".into(),
        format!("{RUNTIME_DIR}/envoy.yaml"),
        // `router~` makes the instance program it as a gateway (contract 7).
        "--node-id".into(),
        "router~$(POD_IP)~$(POD_NAME).$(POD_NAMESPACE)~$(POD_NAMESPACE).svc.cluster.local".into(),
    ];
    for (key, value) in [
        ("NAMESPACE", "$(POD_NAMESPACE)"),
        ("POD_NAME", "$(POD_NAME)"),
        ("TENANT", rev.tenant.as_str()),
        ("REVISION", rev.revision.as_str()),
        ("CAPTURE_MODE", "NONE"),
    ] {
        args.push("--meta".into());
        args.push(format!("{key}={value}"));
    }
    args.push("--cluster".into());
    args.push(format!("{}.{}", proxy.name, proxy.namespace));
    let field_env = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let container_ports: Vec<Value> = proxy
        .container_ports
        .iter()
        .map(|(name, port)| json!({"name": name, "containerPort": port, "protocol": "TCP"}))
        .collect();
    let mut container = json!({
        "name": PROXY_CONTAINER,
        "image": mcp.proxy_image(),
        "command": ["meshplane-proxy"],
        "args": args,
        "env": [
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_IP", "status.podIP"),
            {"name": "TRUST_DOMAIN", "value": mcp.trust_domain()},
        ],
        "ports": container_ports,
        "readinessProbe": {
            "httpGet": {"path": "/healthz/ready", "port": ports::PROXY_READY},
            "initialDelaySeconds": 1, "periodSeconds": 2, "failureThreshold": 30,
        },
        "securityContext": {
            "runAsUser": names::PROXY_UID,
            "runAsGroup": names::PROXY_UID,
            "runAsNonRoot": true,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "privileged": false,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": BOOTSTRAP_VOLUME, "mountPath": BOOTSTRAP_DIR, "readOnly": true},
            {"name": RUNTIME_VOLUME, "mountPath": RUNTIME_DIR},
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": true},
        ],
    });
    if let (Some(resources), Some(c)) = (proxy.resources.clone(), container.as_object_mut()) {
        c.insert("resources".into(), resources);
    }
    json!({"spec": {
        "replicas": proxy.replicas,
        "selector": {"matchLabels": proxy.selector},
        "template": {
            "metadata": {"labels": pod_labels},
            "spec": {
                "serviceAccountName": proxy.name,
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container],
                "volumes": [
                    {"name": BOOTSTRAP_VOLUME, "configMap": {"name": names::bootstrap_configmap(&rev.revision)}},
                    {"name": RUNTIME_VOLUME, "emptyDir": {}},
                    {"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {
                        "audience": names::token_audience(&rev.tenant),
                        "expirationSeconds": TOKEN_EXPIRATION_SECONDS,
                        "path": TOKEN_FILE,
                    }}]}},
                ],
            },
        },
    }})
}

/// Why the gateway `input` asks for is not run, if it is not (for the revision's status).
pub fn misplaced_gateway_of(input: &super::RenderInput<'_>) -> Option<String> {
    misplaced_gateway(&Revision::new(input))
}
