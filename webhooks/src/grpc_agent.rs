//! Injection for proxyless gRPC clients (contract 13): what a pod annotated
//! `sidecar.meshplane.io/proxylessGrpc: "true"` gets besides the sidecar.
//!
//! The node agent also serves ADS on the pod's abstract socket, and every app container gets
//! gRPC's xDS bootstrap inline (`GRPC_XDS_BOOTSTRAP_CONFIG`): the agent's socket as the xDS
//! server, and a node whose id and metadata are the sidecar's (contract 7) plus
//! `GENERATOR=grpc`, expanded by the kubelet from the downward API. The instance then treats
//! the client as the pod's (same tenancy checks, same token) and answers with API listeners.
//! Capture defaults to `NONE`: the point of proxyless gRPC is that the client balances itself.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar};
use meshplane_contracts::grpc_agent::{self, env};
use meshplane_contracts::node::{meta, CLUSTER_DOMAIN};
use meshplane_crds::names;

use crate::downward::pod_identity_env;

/// The node a proxyless client presents besides its id (which the kubelet expands from
/// [`app_env`]): the sidecar's tenant, revision and service cluster (contract 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node<'a> {
    pub tenant: &'a str,
    pub revision: &'a str,
    pub cluster: &'a str,
}

/// Whether the pod asks for it: the annotation is `"true"` or `"false"` (any case); anything
/// else is refused, naming the annotation.
pub fn requested(annotations: Option<&BTreeMap<String, String>>) -> Result<bool, String> {
    match annotations.and_then(|a| a.get(names::PROXYLESS_GRPC_ANNOTATION)) {
        None => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(v) => Err(v.clone()),
    }
}

/// gRPC's xDS bootstrap (gRFC A27), with `$(VAR)`s the kubelet expands from [`app_env`].
pub fn bootstrap(node: Node<'_>) -> String {
    let var = |name: &str| format!("$({name})");
    let (pod, namespace, ip) = (
        var(env::POD_NAME),
        var(env::POD_NAMESPACE),
        var(env::POD_IP),
    );
    serde_json::json!({
        "xds_servers": [{
            "server_uri": grpc_agent::server_uri(),
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        "node": {
            // NodeId::injector_template's shape, from this container's own variables.
            "id": format!("sidecar~{ip}~{pod}.{namespace}~{namespace}.svc.{CLUSTER_DOMAIN}"),
            "cluster": node.cluster,
            "metadata": {
                meta::NAMESPACE: namespace,
                meta::POD_NAME: pod,
                meta::TENANT: node.tenant,
                meta::REVISION: node.revision,
                grpc_agent::GENERATOR_METADATA: grpc_agent::GENERATOR,
            },
        },
    })
    .to_string()
}

/// What an app container gets, unless it brings its own bootstrap (then nothing).
pub fn app_env(container: &Container, node: Node<'_>) -> Vec<EnvVar> {
    let own = container
        .env
        .iter()
        .flatten()
        .any(|e| e.name == env::BOOTSTRAP_CONFIG || e.name == env::BOOTSTRAP_FILE);
    if own {
        return Vec::new();
    }
    pod_identity_env(env::POD_NAME, env::POD_NAMESPACE, env::POD_IP)
        .into_iter()
        .chain([EnvVar {
            name: env::BOOTSTRAP_CONFIG.into(),
            value: Some(bootstrap(node)),
            ..Default::default()
        }])
        .collect()
}

/// The launcher arguments that turn the agent's gRPC socket on.
pub fn agent_args() -> [String; 2] {
    [
        grpc_agent::AGENT_FLAG.to_owned(),
        grpc_agent::XDS_SOCKET.to_owned(),
    ]
}
