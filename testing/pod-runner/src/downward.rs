//! Downward API: the values of a pod's fields that env vars and volumes may refer to.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Pod;

/// The value of `field_path` (as in a `fieldRef`) for `pod`, which runs at `pod_ip`.
pub fn field_value(pod: &Pod, field_path: &str, pod_ip: Ipv4Addr) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    match field_path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "metadata.labels" => Some(format_map(meta.labels.as_ref())),
        "metadata.annotations" => Some(format_map(meta.annotations.as_ref())),
        "spec.serviceAccountName" => Some(
            spec.and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".to_string()),
        ),
        "spec.nodeName" => Some(
            spec.and_then(|s| s.node_name.clone())
                .unwrap_or_else(|| "local".to_string()),
        ),
        "status.podIP" | "status.podIPs" => Some(pod_ip.to_string()),
        "status.hostIP" | "status.hostIPs" => Some(crate::net::NODE_IP.to_string()),
        other => {
            let (map, key) = if let Some(key) = indexed(other, "metadata.labels") {
                (meta.labels.as_ref(), key)
            } else if let Some(key) = indexed(other, "metadata.annotations") {
                (meta.annotations.as_ref(), key)
            } else {
                return None;
            };
            Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
        }
    }
}

/// `metadata.labels['app']` → `app`.
fn indexed<'a>(field_path: &'a str, prefix: &str) -> Option<&'a str> {
    field_path
        .strip_prefix(prefix)?
        .strip_prefix("['")?
        .strip_suffix("']")
}

/// The kubelet's `key="value"` lines, sorted by key.
fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}\n", serde_json::Value::from(v.as_str())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_fields_resolve_like_the_downward_api() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"containers": [], "serviceAccountName": "web"}
        }))
        .unwrap();
        let ip = Ipv4Addr::new(198, 18, 0, 12);
        assert_eq!(
            field_value(&pod, "metadata.name", ip).as_deref(),
            Some("web-1")
        );
        assert_eq!(
            field_value(&pod, "metadata.namespace", ip).as_deref(),
            Some("shop")
        );
        assert_eq!(
            field_value(&pod, "status.podIP", ip).as_deref(),
            Some("198.18.0.12")
        );
        assert_eq!(
            field_value(&pod, "spec.serviceAccountName", ip).as_deref(),
            Some("web")
        );
        assert_eq!(
            field_value(&pod, "metadata.labels['app']", ip).as_deref(),
            Some("web")
        );
        assert_eq!(
            field_value(&pod, "metadata.labels", ip).as_deref(),
            Some("app=\"web\"\n")
        );
        assert_eq!(field_value(&pod, "spec.unknown", ip), None);
    }
}
