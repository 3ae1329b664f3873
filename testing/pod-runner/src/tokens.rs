//! ServiceAccount tokens for pods, issued through TokenRequest as the kubelet does, and the
//! kubeconfig each container process gets so that RBAC applies to it as to a real pod.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::config::Kubeconfig;
use kube::{Api, Client};

use super::error::PodRunnerError;

/// The pod a token is bound to.
#[derive(Debug, Clone)]
pub struct TokenOwner<'a> {
    pub namespace: &'a str,
    pub service_account: &'a str,
    pub pod_name: &'a str,
    pub pod_uid: &'a str,
}

/// `POST .../serviceaccounts/<sa>/token`; no audience means the API server's.
pub async fn request_token(
    client: &Client,
    owner: &TokenOwner<'_>,
    audience: Option<&str>,
    expiration_seconds: Option<i64>,
) -> Result<String, PodRunnerError> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), owner.namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: audience.map(|a| vec![a.to_string()]),
            expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(owner.pod_name.to_string()),
                uid: Some(owner.pod_uid.to_string()),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let what = || {
        format!(
            "TokenRequest for {}/{}",
            owner.namespace, owner.service_account
        )
    };
    let response = api
        .create_token_request(owner.service_account, &PostParams::default(), &request)
        .await
        .map_err(|e| PodRunnerError::api(what(), e))?;
    response
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| PodRunnerError::NotReadyToStart {
            pod: format!("{}/{}", owner.namespace, owner.pod_name),
            reason: format!("{} returned no token", what()),
        })
}

/// A kubeconfig (JSON, which is YAML) for the cluster of `base`'s current context, acting with
/// `token`, at `server` when given (the API's in-cluster URL) instead of `base`'s.
pub fn kubeconfig_with_token(
    base: &Kubeconfig,
    token: &str,
    server: Option<&str>,
) -> Result<String, PodRunnerError> {
    let context_name = base.current_context.clone().unwrap_or_default();
    let cluster_name = base
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .or_else(|| base.clusters.first().map(|c| c.name.clone()))
        .unwrap_or_default();
    let cluster = base
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| {
            PodRunnerError::ClientConfig(format!("kubeconfig has no cluster {cluster_name:?}"))
        })?;
    let mut cluster =
        serde_json::to_value(cluster).map_err(|e| PodRunnerError::ClientConfig(e.to_string()))?;
    if let Some(server) = server {
        cluster["server"] = serde_json::Value::from(server);
    }
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": "pod", "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": "pod"}}],
        "current-context": "pod",
    });
    Ok(kubeconfig.to_string())
}
