//! The tenant's ingress gateway (`spec.ingressGateway`): a Deployment of the revision's proxy
//! image running as a router (node id `router~…`, no traffic capture), its Service and
//! ServiceAccount, in the control namespace or a member namespace of the tenant. The revision's
//! instance programs it from the Gateways and VirtualServices of the namespaces it trusts; it
//! learns the gateway's labels and trusted namespaces from the members ConfigMap (`gateways`,
//! contract 2). The instance serves a Gateway's `credentialName` Secret only to gateway proxies
//! whose ServiceAccount may `get` it (SubjectAccessReview), so the gateway's ServiceAccount is
//! bound the shipped Secret reader of its namespace; it mounts no API token, so the binding
//! grants the pods nothing to read with.

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

/// The gateway's objects (none when the revision runs no gateway).
pub fn gateway(rev: &Revision<'_>) -> Vec<DesiredObject> {
    let Some(dep) = running_gateway(rev) else {
        return Vec::new();
    };
    let Some(spec) = rev.input.control_plane.spec.ingress_gateway.as_ref() else {
        return Vec::new();
    };
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
    vec![
        // The pods talk to the instance only, with their projected token of its audience.
        rev.object(
            Kind::ServiceAccount,
            ns,
            &dep.name,
            json!({"automountServiceAccountToken": false}),
        ),
        rev.object(
            Kind::RoleBinding,
            ns,
            &names::gateway_proxy_credentials(&rev.revision),
            json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": names::GATEWAY_CREDENTIALS_ROLE},
                "subjects": [{"kind": "ServiceAccount", "name": dep.name, "namespace": dep.namespace}],
            }),
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
            deployment_spec(rev, &dep, spec),
        ),
    ]
}

fn deployment_spec(
    rev: &Revision<'_>,
    dep: &GatewayDeployment,
    spec: &meshplane_crds::controlplane::IngressGatewaySpec,
) -> Value {
    let mcp = rev.input.control_plane;
    let mut pod_labels = json!(dep.labels);
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
    args.push(format!("{}.{}", dep.name, dep.namespace));
    let field_env = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let container_ports: Vec<Value> = spec
        .service
        .ports
        .iter()
        .map(|p| json!({"name": p.name, "containerPort": p.target_port, "protocol": "TCP"}))
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
    if let (Some(resources), Some(c)) = (
        spec.resources
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok()),
        container.as_object_mut(),
    ) {
        c.insert("resources".into(), resources);
    }
    json!({"spec": {
        "replicas": spec.replicas,
        "selector": {"matchLabels": {names::GATEWAY_LABEL: dep.name}},
        "template": {
            "metadata": {"labels": pod_labels},
            "spec": {
                "serviceAccountName": dep.name,
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
