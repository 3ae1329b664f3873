//! The instance in the control namespace: Namespace, ServiceAccount, Deployment, Service,
//! PodDisruptionBudget, NetworkPolicy, members and proxies ConfigMaps, webhook TLS Secret.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use meshplane_contracts::instance::{env, InstanceArgs, Isolation};
use meshplane_contracts::members::MembersData;
use meshplane_contracts::{proxies, webhook_tls};
use meshplane_crds::names::{self, ports};
use meshplane_crds::{IsolationMode, MeshConfig};
use serde_json::{json, Value};

use super::{DesiredObject, Kind, ObjectKey, Revision};

/// Where the webhook TLS Secret is mounted (contract 4).
pub const WEBHOOK_TLS_DIR: &str = webhook_tls::MOUNT_DIR;
/// Volume of the tenant CA Secret in the instance pod.
const TENANT_CA_VOLUME: &str = "tenant-ca";
/// UID/GID the instance runs as (distroless "nonroot").
const INSTANCE_UID: i64 = 65532;

/// The control namespace. Shared by the tenant's revisions and home of user config, so it
/// carries no revision label and no owner reference: pruning and garbage collection never
/// reach it.
pub fn control_namespace(rev: &Revision<'_>) -> DesiredObject {
    DesiredObject {
        key: ObjectKey {
            kind: Kind::Namespace,
            namespace: None,
            name: rev.control_namespace.clone(),
        },
        body: json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": rev.control_namespace,
                "labels": {
                    names::MANAGED_BY_LABEL: names::MANAGED_BY_VALUE,
                    names::TENANT_LABEL: rev.tenant,
                },
            },
        }),
    }
}

/// Contract 12: the control namespace's `meshplane-debug` ServiceAccount, whose short-lived
/// tokens (TokenRequest, audience `meshplane-<tenant>-debug`) open the instances' `/debug`
/// endpoints. It has no RBAC: a token of it can read nothing from the API server. Shared by the
/// tenant's revisions, so it carries the tenant's labels but no revision label and no owner:
/// every revision renders the same body, none prunes it, and it stays with the control
/// namespace (which is never deleted either).
pub fn debug_service_account(rev: &Revision<'_>) -> DesiredObject {
    let name = names::debug::SERVICE_ACCOUNT;
    DesiredObject {
        key: ObjectKey {
            kind: Kind::ServiceAccount,
            namespace: Some(rev.control_namespace.clone()),
            name: name.to_string(),
        },
        body: json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": name,
                "namespace": rev.control_namespace,
                "labels": {
                    names::MANAGED_BY_LABEL: names::MANAGED_BY_VALUE,
                    names::TENANT_LABEL: rev.tenant,
                },
            },
            "automountServiceAccountToken": false,
        }),
    }
}

/// Contract 1: the instance command line. ADS and the certificate service listen only on the
/// TLS port (contract 11); there is no plaintext ADS port.
pub fn instance_args(
    tenant: &str,
    revision: &str,
    control_namespace: &str,
    isolation: IsolationMode,
    trust_domain: &str,
) -> Vec<String> {
    InstanceArgs {
        tenant: tenant.to_string(),
        revision: revision.to_string(),
        control_namespace: control_namespace.to_string(),
        isolation: match isolation {
            IsolationMode::Strict => Isolation::Strict,
            IsolationMode::Shared => Isolation::Shared,
        },
        trust_domain: trust_domain.to_string(),
    }
    .to_args()
}

pub fn instance(rev: &Revision<'_>) -> Vec<DesiredObject> {
    let ns = Some(rev.control_namespace.as_str());
    let name = names::instance_name(&rev.revision);
    let members = MembersData {
        members: rev.input.tenant_members.clone(),
        attached: rev.input.revision.attached.clone(),
        tags: rev.input.revision.tags.clone(),
        // The instance applies the revision's meshConfig (outbound policy, default exportTo,
        // access logging) from here; it cannot read MeshControlPlanes.
        // The trust domain goes resolved: the instance translates with the one it signs.
        mesh_config: serde_json::to_string(&MeshConfig {
            trust_domain: Some(rev.input.control_plane.trust_domain()),
            ..rev.input.control_plane.spec.mesh_config.clone()
        })
        .ok(),
        // The gateways this revision runs: their pod labels and trusted namespaces (so the
        // instance reads the credential Secrets of their namespaces).
        gateways: {
            let gateways = super::gateway::instance_gateways(rev);
            (!gateways.is_empty())
                .then(|| serde_json::to_string(&gateways).ok())
                .flatten()
        },
        status_writer: rev.input.status_writer,
        gateway_classes: rev.input.gateway_classes.clone(),
    };
    let mut out = vec![
        rev.object(Kind::ServiceAccount, ns, &name, json!({})),
        rev.object(Kind::Deployment, ns, &name, deployment_spec(rev)),
        rev.object(
            Kind::Service,
            ns,
            &name,
            json!({
                "spec": {
                    "type": "ClusterIP",
                    "selector": rev.pod_selector(),
                    "ports": [
                        {"name": "grpc-xds-tls", "port": ports::GRPC_XDS_TLS, "targetPort": ports::GRPC_XDS_TLS, "protocol": "TCP", "appProtocol": "grpc"},
                        {"name": "https-webhook", "port": ports::HTTPS_WEBHOOK, "targetPort": ports::HTTPS_WEBHOOK, "protocol": "TCP"},
                        {"name": "http-monitoring", "port": ports::HTTP_MONITORING, "targetPort": ports::HTTP_MONITORING, "protocol": "TCP"},
                    ],
                }
            }),
        ),
        rev.object(Kind::PodDisruptionBudget, ns, &name, pdb_spec(rev)),
        rev.object(Kind::NetworkPolicy, ns, &name, network_policy_spec(rev)),
        // Contract 2.
        rev.object(
            Kind::ConfigMap,
            ns,
            &names::members_configmap(&rev.revision),
            json!({"data": members.to_data()}),
        ),
        // Contract 3: created without data; each instance pod applies its own key under its
        // own field manager, so the operator never owns (or removes) those keys.
        rev.object(Kind::ConfigMap, ns, &proxies_configmap(&rev.revision), json!({})),
    ];
    let mut data: BTreeMap<String, String> = rev
        .input
        .tls
        .secret_data()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    // The API server's admission client CA, when the platform admin gave it: the instance
    // then answers admission calls only with its certificate.
    if let Some(client_auth) = rev.input.client_auth {
        data.extend(
            client_auth
                .to_data()
                .into_iter()
                .map(|(k, v)| (k, B64.encode(v))),
        );
    }
    out.push(rev.object(
        Kind::Secret,
        ns,
        &names::webhook_tls_secret(&rev.revision),
        json!({
            "type": webhook_tls::SECRET_TYPE,
            "data": data,
        }),
    ));
    out
}

/// Name of the proxy-count ConfigMap (contract 3).
pub fn proxies_configmap(revision: &str) -> String {
    proxies::configmap_name(revision)
}

fn deployment_spec(rev: &Revision<'_>) -> Value {
    let mcp = rev.input.control_plane;
    let args = instance_args(
        &rev.tenant,
        &rev.revision,
        &rev.control_namespace,
        mcp.spec.isolation,
        &mcp.trust_domain(),
    );
    let field_env = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let mut container = json!({
        "name": "xds",
        "image": mcp.xds_image(),
        "args": args,
        "env": [
            field_env(env::POD_NAME, "metadata.name"),
            field_env(env::POD_NAMESPACE, "metadata.namespace"),
            // The revision's proxy image, which the injector adds to pods.
            {"name": env::PROXY_IMAGE, "value": mcp.proxy_image()},
        ],
        "ports": [
            {"name": "grpc-xds-tls", "containerPort": ports::GRPC_XDS_TLS, "protocol": "TCP"},
            {"name": "https-webhook", "containerPort": ports::HTTPS_WEBHOOK, "protocol": "TCP"},
            {"name": "http-monitoring", "containerPort": ports::HTTP_MONITORING, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": ports::HTTP_MONITORING}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": ports::HTTP_MONITORING}, "periodSeconds": 10, "failureThreshold": 3},
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": INSTANCE_UID,
            "runAsGroup": INSTANCE_UID,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "webhook-tls", "mountPath": WEBHOOK_TLS_DIR, "readOnly": true},
            {"name": TENANT_CA_VOLUME, "mountPath": names::TENANT_CA_DIR, "readOnly": true},
        ],
    });
    if let (Some(resources), Some(c)) = (
        mcp.spec
            .resources
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok()),
        container.as_object_mut(),
    ) {
        c.insert("resources".into(), resources);
    }
    json!({"spec": {
        "replicas": mcp.spec.replicas,
        "selector": {"matchLabels": rev.pod_selector()},
        "template": {
            "metadata": {"labels": pod_labels(rev)},
            "spec": {
                "serviceAccountName": names::instance_name(&rev.revision),
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container],
                "volumes": [
                    {"name": "webhook-tls", "secret": {"secretName": names::webhook_tls_secret(&rev.revision)}},
                    // Contract 11: the tenant CA, the `cacerts` files only (not the next
                    // root's key of a rotation in progress).
                    {"name": TENANT_CA_VOLUME, "secret": {
                        "secretName": names::TENANT_CA_SECRET,
                        "items": meshplane_contracts::tenant_ca::LAYOUT_KEYS.iter()
                            .map(|k| json!({"key": k, "path": k}))
                            .collect::<Vec<_>>(),
                    }},
                ],
            },
        },
    }})
}

fn pod_labels(rev: &Revision<'_>) -> Value {
    let mut labels = rev.pod_selector();
    if let Some(l) = labels.as_object_mut() {
        l.insert(names::TENANT_LABEL.into(), json!(rev.tenant));
    }
    labels
}

/// Who may reach the instance pods. xDS only from the tenant's namespaces: its members and the
/// control namespace, selected by `kubernetes.io/metadata.name`, which the API server sets on
/// every namespace and nobody can move. The webhook port from anywhere: the API server that
/// calls it is not a pod a selector could name (with the admission client CA configured, the
/// instance authenticates it by its client certificate instead). The monitoring port from
/// anywhere, so metrics stay scrapeable. Egress is left open: the instance talks to the API
/// server.
fn network_policy_spec(rev: &Revision<'_>) -> Value {
    let mut tenant: Vec<&str> = vec![rev.control_namespace.as_str()];
    tenant.extend(
        rev.input
            .tenant_members
            .iter()
            .map(String::as_str)
            .filter(|m| *m != rev.control_namespace),
    );
    let port = |p: u16| json!([{"port": p, "protocol": "TCP"}]);
    json!({"spec": {
        "podSelector": {"matchLabels": rev.pod_selector()},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [{"namespaceSelector": {"matchExpressions": [
                    {"key": names::NAMESPACE_NAME_LABEL, "operator": "In", "values": tenant},
                ]}}],
                // ADS and certificates over TLS only: a rendered instance never serves plaintext
                // ADS (15010), so no rule opens it should a flag ever turn it on.
                "ports": [{"port": ports::GRPC_XDS_TLS, "protocol": "TCP"}],
            },
            // The webhooks and the monitoring port are called by the API server itself
            // (admission, and the pods/proxy path meshctl and the migration gates read /debug
            // through), whose source address no NetworkPolicy can name: they stay open;
            // admission calls need the API server's client certificate when the platform admin
            // configured its CA (contract 4), and /debug needs a debug token whoever calls
            // (contract 12).
            {"ports": port(ports::HTTPS_WEBHOOK)},
            {"ports": port(ports::HTTP_MONITORING)},
        ],
    }})
}

/// With several replicas keep one serving during voluntary disruptions. With one replica a
/// `minAvailable: 1` budget would block every node drain forever, so allow the one pod to be
/// evicted (`maxUnavailable: 1`): proxies keep their last config and reconnect.
fn pdb_spec(rev: &Revision<'_>) -> Value {
    let selector = json!({"matchLabels": rev.pod_selector()});
    if rev.input.control_plane.spec.replicas > 1 {
        json!({"spec": {"minAvailable": 1, "selector": selector}})
    } else {
        json!({"spec": {"maxUnavailable": 1, "selector": selector}})
    }
}
