//! Environment variables the kubelet fills in from the pod itself (the downward API): the
//! injected proxy and a proxyless gRPC client's bootstrap both learn the pod's name, namespace
//! and address this way, each under the names it reads.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};

/// The pod's name, namespace and IP as the variables `name`, `namespace` and `ip`, in that
/// order.
pub fn pod_identity_env(name: &str, namespace: &str, ip: &str) -> [EnvVar; 3] {
    [
        field_env(name, "metadata.name"),
        field_env(namespace, "metadata.namespace"),
        field_env(ip, "status.podIP"),
    ]
}

/// The variable `name`, set from the pod's field `field_path`.
fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
