//! Sidecar injection: the pure decision and JSON patch for one Pod.
//!
//! The patch adds the proxy container (`meshplane-proxy`, contract 7), the traffic-capture init
//! container `meshplane-init` (unless the pod asks for capture mode `NONE`), which runs
//! `meshplane-proxy capture` from the same image with arguments rendered from the pod's capture
//! annotations ([`meshplane_crds::capture`]), the bootstrap ConfigMap
//! (contract 6), a scratch `emptyDir` for the generated bootstrap, the projected ServiceAccount
//! token with the tenant's audience, and the `sidecar.meshplane.io/revision` annotation. The
//! node agent's certificate lifetime comes from `sidecar.meshplane.io/certTTL`
//! ([`meshplane_crds::agent`]).
//! Every `add` creates the array or map it appends to when the pod lacks it.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, HTTPGetAction,
    Pod, Probe, ProjectedVolumeSource, SecurityContext, ServiceAccountTokenProjection, Volume,
    VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use meshplane_contracts::bootstrap;
use meshplane_contracts::node::{env, meta, NodeId};
use meshplane_crds::agent::{cert_ttl_from_annotations, CertTtlError};
use meshplane_crds::capture::{init_container_args, CaptureAnnotationError, CaptureScope};
use meshplane_crds::names::{self, ports, PROXY_UID};
use serde_json::Value;

use crate::downward::pod_identity_env;
use crate::grpc_agent;

/// Name of the injected proxy container.
pub const PROXY_CONTAINER: &str = "meshplane-proxy";
/// Name of the injected traffic-capture init container.
pub const INIT_CONTAINER: &str = "meshplane-init";
/// The proxy image's binary; the capture init container runs its `capture` subcommand.
pub const PROXY_BINARY: &str = "/usr/local/bin/meshplane-proxy";
/// Volume holding the revision's bootstrap ConfigMap.
pub const BOOTSTRAP_VOLUME: &str = "meshplane-bootstrap";
/// `emptyDir` the launcher writes the final bootstrap into (the root filesystem is read-only).
pub const RUNTIME_VOLUME: &str = "meshplane-runtime";
/// Projected ServiceAccount token volume.
pub const TOKEN_VOLUME: &str = "meshplane-token";
/// Where the bootstrap ConfigMap is mounted (its `envoy.yaml` names this path for the trust
/// bundle).
pub const BOOTSTRAP_DIR: &str = bootstrap::MOUNT_DIR;
/// Where the `emptyDir` is mounted.
pub const RUNTIME_DIR: &str = "/var/run/meshplane";
/// Where the projected token is mounted.
pub const TOKEN_DIR: &str = "/var/run/secrets/meshplane/tokens";
/// File name of the token inside [`TOKEN_DIR`].
pub const TOKEN_FILE: &str = "meshplane-token";
/// Lifetime requested for the projected token; the kubelet refreshes it before expiry.
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3600;
/// Readiness path on [`ports::PROXY_READY`].
pub const READY_PATH: &str = bootstrap::READY_PATH;

/// Pod label naming the workload, preferred for the proxy's service cluster.
const APP_LABELS: &[&str] = &["app", "app.kubernetes.io/name"];
/// Label the Deployment controller appends (as `-<hash>`) to its ReplicaSets' names.
const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// Whether the proxy's traffic is captured by iptables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureMode {
    /// iptables redirects the pod's TCP traffic through the proxy.
    #[default]
    Default,
    /// No capture: no init container; applications address the proxy explicitly.
    None,
}

impl CaptureMode {
    /// Value of the `CAPTURE_MODE` node metadata (contract 7).
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureMode::Default => "DEFAULT",
            CaptureMode::None => "NONE",
        }
    }

    /// Parses the pod annotation value (case-insensitive); `IPTABLES` is the default mode.
    pub fn parse(value: &str) -> Option<Self> {
        match value.to_ascii_uppercase().as_str() {
            "DEFAULT" | "IPTABLES" => Some(CaptureMode::Default),
            "NONE" => Some(CaptureMode::None),
            _ => None,
        }
    }
}

/// What the injector of one revision needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectionConfig {
    /// The tenant; sets the token audience and the `TENANT` metadata.
    pub tenant: String,
    /// The revision; names the bootstrap ConfigMap and sets the `REVISION` metadata.
    pub revision: String,
    /// This revision's proxy image (also runs the capture init container).
    pub proxy_image: String,
    /// The tenant's trust domain, given to the proxy as `TRUST_DOMAIN`.
    pub trust_domain: String,
    /// Capture mode of pods without the `sidecar.meshplane.io/captureMode` annotation.
    pub default_capture_mode: CaptureMode,
}

/// Why a pod is admitted unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// Label `sidecar.meshplane.io/inject: "false"`.
    OptedOut,
    /// The revision annotation or a `meshplane-proxy` container is already there.
    AlreadyInjected,
    /// A host-network pod: capture rules would rewrite the node's own traffic.
    HostNetwork,
}

impl SkipReason {
    /// Short explanation for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::OptedOut => "pod opted out of injection",
            SkipReason::AlreadyInjected => "pod is already injected",
            SkipReason::HostNetwork => "pod uses the host network",
        }
    }
}

/// Result of injecting one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Injection {
    /// Admit the pod unchanged.
    Skip(SkipReason),
    /// Admit the pod with this patch.
    Patch(Patch),
}

/// A pod that cannot be injected; the request is denied with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    /// The capture-mode annotation has an unknown value.
    #[error("metadata.annotations[\"{annotation}\"]: {value:?} is not a capture mode; use DEFAULT or NONE", annotation = names::CAPTURE_MODE_ANNOTATION)]
    InvalidCaptureMode { value: String },
    /// The proxyless gRPC annotation is neither true nor false.
    #[error("metadata.annotations[\"{annotation}\"]: {value:?} is not a boolean; use \"true\" or \"false\"", annotation = names::PROXYLESS_GRPC_ANNOTATION)]
    InvalidProxylessGrpc { value: String },
    /// A capture annotation (ports, CIDRs) is malformed.
    #[error(transparent)]
    InvalidCaptureAnnotation(#[from] CaptureAnnotationError),
    /// The certificate lifetime annotation is malformed or out of bounds.
    #[error(transparent)]
    InvalidCertTtl(#[from] CertTtlError),
    /// The pod has no spec to add containers to.
    #[error("spec: missing; a Pod needs a spec")]
    MissingSpec,
    /// The pod already uses a name the injector needs.
    #[error("{field}: the pod already has a {what} named {name:?}, which sidecar injection needs; rename it or opt out with label {label}=\"false\"", label = names::INJECT_LABEL)]
    NameTaken {
        field: &'static str,
        what: &'static str,
        name: &'static str,
    },
}

/// Decides whether and how to inject `pod`, created in `namespace`.
pub fn inject(
    pod: &Pod,
    namespace: &str,
    config: &InjectionConfig,
) -> Result<Injection, InjectError> {
    let meta = &pod.metadata;
    let labels = meta.labels.as_ref();
    let annotations = meta.annotations.as_ref();
    let spec = pod.spec.as_ref();
    let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let init_containers = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let volumes = spec.and_then(|s| s.volumes.as_deref()).unwrap_or_default();

    if labels
        .and_then(|l| l.get(names::INJECT_LABEL))
        .is_some_and(|v| v == "false")
    {
        return Ok(Injection::Skip(SkipReason::OptedOut));
    }
    let has_proxy = containers
        .iter()
        .chain(init_containers)
        .any(|c| c.name == PROXY_CONTAINER);
    if has_proxy || annotations.is_some_and(|a| a.contains_key(names::INJECTED_REVISION_ANNOTATION))
    {
        return Ok(Injection::Skip(SkipReason::AlreadyInjected));
    }
    let Some(spec) = spec else {
        return Err(InjectError::MissingSpec);
    };
    if spec.host_network.unwrap_or(false) {
        return Ok(Injection::Skip(SkipReason::HostNetwork));
    }

    let proxyless_grpc = grpc_agent::requested(annotations)
        .map_err(|value| InjectError::InvalidProxylessGrpc { value })?;
    let capture = match annotations.and_then(|a| a.get(names::CAPTURE_MODE_ANNOTATION)) {
        Some(value) => {
            CaptureMode::parse(value).ok_or_else(|| InjectError::InvalidCaptureMode {
                value: value.clone(),
            })?
        }
        // Proxyless clients balance for themselves: capturing their calls would route twice.
        None if proxyless_grpc => CaptureMode::None,
        None => config.default_capture_mode,
    };
    // Validated in every mode: a malformed annotation is an error even where it has no effect yet.
    let scope = CaptureScope::from_annotations(annotations)?;
    let cert_ttl = cert_ttl_from_annotations(annotations)?;
    for name in [BOOTSTRAP_VOLUME, RUNTIME_VOLUME, TOKEN_VOLUME] {
        if volumes.iter().any(|v| v.name == name) {
            return Err(InjectError::NameTaken {
                field: "spec.volumes",
                what: "volume",
                name,
            });
        }
    }
    if capture == CaptureMode::Default && init_containers.iter().any(|c| c.name == INIT_CONTAINER) {
        return Err(InjectError::NameTaken {
            field: "spec.initContainers",
            what: "init container",
            name: INIT_CONTAINER,
        });
    }

    let cluster = service_cluster(pod, namespace);
    let mut ops = Vec::new();
    let annotation = BTreeMap::from([(
        names::INJECTED_REVISION_ANNOTATION.to_owned(),
        config.revision.clone(),
    )]);
    push_map_entries(
        &mut ops,
        &["metadata", "annotations"],
        annotations.is_some(),
        annotation,
    );
    if capture == CaptureMode::Default {
        push_appends(
            &mut ops,
            &["spec", "initContainers"],
            spec.init_containers.is_some(),
            vec![to_value(capture_container(config, &scope))],
        );
    }
    let workload = meshplane_crds::telemetry::pod_workload(pod);
    let mut proxy = proxy_container(config, capture, &cluster, &workload, cert_ttl);
    if proxyless_grpc {
        proxy
            .args
            .get_or_insert_with(Vec::new)
            .extend(grpc_agent::agent_args());
        for (i, container) in containers.iter().enumerate() {
            let node = grpc_agent::Node {
                tenant: &config.tenant,
                revision: &config.revision,
                cluster: &cluster,
            };
            let env = grpc_agent::app_env(container, node);
            if !env.is_empty() {
                let index = i.to_string();
                push_appends(
                    &mut ops,
                    &["spec", "containers", &index, "env"],
                    container.env.is_some(),
                    env.into_iter().map(to_value).collect(),
                );
            }
        }
    }
    push_appends(
        &mut ops,
        &["spec", "containers"],
        true,
        vec![to_value(proxy)],
    );
    push_appends(
        &mut ops,
        &["spec", "volumes"],
        spec.volumes.is_some(),
        proxy_volumes(config).into_iter().map(to_value).collect(),
    );
    Ok(Injection::Patch(Patch(ops)))
}

/// `node.cluster` of the proxy: the `app` (or `app.kubernetes.io/name`) label, else the pod's
/// first owner (a Deployment's ReplicaSet without its template hash), else the namespace.
pub fn service_cluster(pod: &Pod, namespace: &str) -> String {
    let labels = pod.metadata.labels.as_ref();
    if let Some(app) = APP_LABELS
        .iter()
        .find_map(|k| labels.and_then(|l| l.get(*k)).filter(|v| !v.is_empty()))
    {
        return app.clone();
    }
    if let Some(owner) = pod
        .metadata
        .owner_references
        .as_ref()
        .and_then(|o| o.first())
    {
        let hash = labels.and_then(|l| l.get(POD_TEMPLATE_HASH_LABEL));
        let deployment = hash
            .filter(|_| owner.kind == "ReplicaSet")
            .and_then(|h| owner.name.strip_suffix(h.as_str()))
            .and_then(|n| n.strip_suffix('-'))
            .filter(|n| !n.is_empty());
        return deployment.unwrap_or(&owner.name).to_owned();
    }
    namespace.to_owned()
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// Adds entries to a string map, creating the map when the pod has none.
fn push_map_entries(
    ops: &mut Vec<PatchOperation>,
    path: &[&str],
    exists: bool,
    entries: BTreeMap<String, String>,
) {
    if !exists {
        ops.push(add(pointer(path), to_value(entries)));
        return;
    }
    for (k, v) in entries {
        let mut p = pointer(path);
        p.push_back(k.as_str());
        ops.push(add(p, Value::String(v)));
    }
}

/// Appends items to an array, creating the array when the pod has none.
fn push_appends(ops: &mut Vec<PatchOperation>, path: &[&str], exists: bool, items: Vec<Value>) {
    if !exists {
        ops.push(add(pointer(path), Value::Array(items)));
        return;
    }
    for item in items {
        let mut p = pointer(path);
        p.push_back("-");
        ops.push(add(p, item));
    }
}

fn to_value(v: impl serde::Serialize) -> Value {
    // Serializing k8s-openapi structs and string maps cannot fail (no non-string map keys).
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn proxy_container(
    config: &InjectionConfig,
    capture: CaptureMode,
    cluster: &str,
    workload: &str,
    cert_ttl: Option<std::time::Duration>,
) -> Container {
    let mut args: Vec<String> = vec![
        "--bootstrap".into(),
        format!("{BOOTSTRAP_DIR}/{}", bootstrap::ENVOY_YAML),
        "--token-file".into(),
        format!("{TOKEN_DIR}/{TOKEN_FILE}"),
        // The node agent (contract 11): the workload certificate over SDS, and ADS carried to
        // the instance over TLS verified against this bundle, with the token re-read at every
        // connect, so the proxy outlives its first token.
        "--root-cert".into(),
        format!("{BOOTSTRAP_DIR}/{}", bootstrap::ROOT_CERT),
        // The launcher's default, spelled out so that runners relocating volumes see the path.
        "--out".into(),
        format!("{RUNTIME_DIR}/{}", bootstrap::ENVOY_YAML),
        // `$(VAR)` is expanded by the kubelet from the env below (downward API).
        "--node-id".into(),
        NodeId::injector_template(),
    ];
    // No LABELS: the instance takes a proxy's labels from its Pod, never from what it claims.
    let (pod_namespace, pod_name) = (
        format!("$({})", env::POD_NAMESPACE),
        format!("$({})", env::POD_NAME),
    );
    for (key, value) in [
        (meta::NAMESPACE, pod_namespace.as_str()),
        (meta::POD_NAME, pod_name.as_str()),
        (meta::TENANT, config.tenant.as_str()),
        (meta::REVISION, config.revision.as_str()),
        (meta::CAPTURE_MODE, capture.as_str()),
    ] {
        args.push("--meta".into());
        args.push(format!("{key}={value}"));
    }
    args.push("--cluster".into());
    args.push(cluster.into());
    if let Some(ttl) = cert_ttl {
        args.push("--cert-ttl-seconds".into());
        args.push(ttl.as_secs().to_string());
    }

    Container {
        name: PROXY_CONTAINER.into(),
        image: Some(config.proxy_image.clone()),
        command: Some(vec!["meshplane-proxy".into()]),
        args: Some(args),
        env: Some(
            pod_identity_env(env::POD_NAME, env::POD_NAMESPACE, env::POD_IP)
                .into_iter()
                .chain([
                    EnvVar {
                        name: "TRUST_DOMAIN".into(),
                        value: Some(config.trust_domain.clone()),
                        ..Default::default()
                    },
                    // The workload's name in the sidecar's request metrics.
                    EnvVar {
                        name: meshplane_crds::telemetry::WORKLOAD_ENV.into(),
                        value: Some(workload.to_string()),
                        ..Default::default()
                    },
                ])
                .collect(),
        ),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some(READY_PATH.into()),
                port: IntOrString::Int(i32::from(ports::PROXY_READY)),
                ..Default::default()
            }),
            initial_delay_seconds: Some(1),
            period_seconds: Some(2),
            failure_threshold: Some(30),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_user: Some(PROXY_UID),
            run_as_group: Some(PROXY_UID),
            run_as_non_root: Some(true),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: BOOTSTRAP_VOLUME.into(),
                mount_path: BOOTSTRAP_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: RUNTIME_VOLUME.into(),
                mount_path: RUNTIME_DIR.into(),
                ..Default::default()
            },
            VolumeMount {
                name: TOKEN_VOLUME.into(),
                mount_path: TOKEN_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

/// The capture init container: `meshplane-proxy capture` with the pod's capture scope. It runs
/// as root with `NET_ADMIN` and `NET_RAW` only, which netfilter needs in the pod's own network
/// namespace; the proxy runs as [`PROXY_UID`], whose traffic the rules leave alone.
fn capture_container(config: &InjectionConfig, scope: &CaptureScope) -> Container {
    Container {
        name: INIT_CONTAINER.into(),
        image: Some(config.proxy_image.clone()),
        command: Some(vec![PROXY_BINARY.into(), "capture".into()]),
        args: Some(init_container_args(scope)),
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_group: Some(0),
            run_as_non_root: Some(false),
            privileged: Some(false),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into(), "NET_RAW".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn proxy_volumes(config: &InjectionConfig) -> Vec<Volume> {
    vec![
        Volume {
            name: BOOTSTRAP_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: names::bootstrap_configmap(&config.revision),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: RUNTIME_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        Volume {
            name: TOKEN_VOLUME.into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: Some(names::token_audience(&config.tenant)),
                        expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
                        path: TOKEN_FILE.into(),
                        user: None,
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> InjectionConfig {
        InjectionConfig {
            tenant: "blue".into(),
            revision: "blue-v1".into(),
            proxy_image: "ghcr.io/meshplane/proxy:1.0.0".into(),
            trust_domain: "cluster.local".into(),
            default_capture_mode: CaptureMode::Default,
        }
    }

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn patched(p: &Pod, ns: &str) -> Value {
        let Injection::Patch(patch) = inject(p, ns, &config()).unwrap() else {
            panic!("expected a patch");
        };
        let mut doc = serde_json::to_value(p).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        doc
    }

    #[test]
    fn patch_applies_to_a_pod_without_annotations_init_containers_or_volumes() {
        let p =
            pod(json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "app"}]}}));
        let doc = patched(&p, "shop");
        assert_eq!(
            doc["metadata"]["annotations"][names::INJECTED_REVISION_ANNOTATION],
            "blue-v1"
        );
        assert_eq!(doc["spec"]["initContainers"][0]["name"], INIT_CONTAINER);
        assert_eq!(doc["spec"]["containers"][0]["name"], "app");
        assert_eq!(doc["spec"]["containers"][1]["name"], PROXY_CONTAINER);
        assert_eq!(doc["spec"]["volumes"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn patch_appends_to_existing_arrays_and_maps() {
        let p = pod(json!({
            "metadata": {"name": "web", "annotations": {"a": "1"}},
            "spec": {
                "initContainers": [{"name": "migrate"}],
                "containers": [{"name": "app"}],
                "volumes": [{"name": "data", "emptyDir": {}}]
            }
        }));
        let doc = patched(&p, "shop");
        assert_eq!(doc["metadata"]["annotations"]["a"], "1");
        assert_eq!(
            doc["metadata"]["annotations"][names::INJECTED_REVISION_ANNOTATION],
            "blue-v1"
        );
        // Capture goes last so earlier init containers' traffic is not redirected to a proxy
        // that is not running yet.
        assert_eq!(doc["spec"]["initContainers"][0]["name"], "migrate");
        assert_eq!(doc["spec"]["initContainers"][1]["name"], INIT_CONTAINER);
        assert_eq!(doc["spec"]["volumes"][0]["name"], "data");
        assert_eq!(doc["spec"]["volumes"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn opted_out_and_injected_pods_are_skipped() {
        let opted = pod(
            json!({"metadata": {"labels": {names::INJECT_LABEL: "false"}}, "spec": {"containers": []}}),
        );
        assert_eq!(
            inject(&opted, "shop", &config()),
            Ok(Injection::Skip(SkipReason::OptedOut))
        );
        let annotated = pod(
            json!({"metadata": {"annotations": {names::INJECTED_REVISION_ANNOTATION: "x"}}, "spec": {"containers": []}}),
        );
        assert_eq!(
            inject(&annotated, "shop", &config()),
            Ok(Injection::Skip(SkipReason::AlreadyInjected))
        );
        let with_proxy = pod(json!({"spec": {"containers": [{"name": PROXY_CONTAINER}]}}));
        assert_eq!(
            inject(&with_proxy, "shop", &config()),
            Ok(Injection::Skip(SkipReason::AlreadyInjected))
        );
        let host = pod(json!({"spec": {"hostNetwork": true, "containers": [{"name": "app"}]}}));
        assert_eq!(
            inject(&host, "shop", &config()),
            Ok(Injection::Skip(SkipReason::HostNetwork))
        );
    }

    #[test]
    fn inject_label_other_than_false_still_injects() {
        let p = pod(
            json!({"metadata": {"labels": {names::INJECT_LABEL: "true"}}, "spec": {"containers": []}}),
        );
        assert!(matches!(
            inject(&p, "shop", &config()),
            Ok(Injection::Patch(_))
        ));
    }

    #[test]
    fn capture_mode_none_skips_the_init_container_and_is_announced() {
        let p = pod(json!({
            "metadata": {"annotations": {names::CAPTURE_MODE_ANNOTATION: "none"}},
            "spec": {"containers": [{"name": "app"}]}
        }));
        let doc = patched(&p, "shop");
        assert!(doc["spec"].get("initContainers").is_none());
        let args = doc["spec"]["containers"][1]["args"].as_array().unwrap();
        assert!(args.contains(&json!("CAPTURE_MODE=NONE")));
    }

    #[test]
    fn unknown_capture_mode_is_an_error_naming_the_annotation() {
        let p = pod(
            json!({"metadata": {"annotations": {names::CAPTURE_MODE_ANNOTATION: "TPROXY"}}, "spec": {"containers": []}}),
        );
        let err = inject(&p, "shop", &config()).unwrap_err();
        assert!(
            err.to_string().contains("sidecar.meshplane.io/captureMode"),
            "{err}"
        );
        assert!(err.to_string().contains("TPROXY"), "{err}");
    }

    #[test]
    fn a_pod_without_spec_is_an_error() {
        assert_eq!(
            inject(&pod(json!({"metadata": {"name": "x"}})), "shop", &config()),
            Err(InjectError::MissingSpec)
        );
    }

    #[test]
    fn a_taken_volume_name_is_an_error() {
        let p = pod(json!({"spec": {"containers": [], "volumes": [{"name": TOKEN_VOLUME}]}}));
        assert_eq!(
            inject(&p, "shop", &config()),
            Err(InjectError::NameTaken {
                field: "spec.volumes",
                what: "volume",
                name: TOKEN_VOLUME
            })
        );
    }

    #[test]
    fn service_cluster_prefers_app_label_then_owner_then_namespace() {
        let by_label =
            pod(json!({"metadata": {"labels": {"app": "reviews", "pod-template-hash": "abc"}}}));
        assert_eq!(service_cluster(&by_label, "shop"), "reviews");
        let by_rs = pod(json!({"metadata": {
            "labels": {"pod-template-hash": "5d9f8c7b6"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d9f8c7b6", "uid": "u"}]
        }}));
        assert_eq!(service_cluster(&by_rs, "shop"), "web");
        let by_job = pod(json!({"metadata": {
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "nightly", "uid": "u"}]
        }}));
        assert_eq!(service_cluster(&by_job, "shop"), "nightly");
        assert_eq!(service_cluster(&pod(json!({})), "shop"), "shop");
    }

    #[test]
    fn proxy_runs_as_the_uid_the_capture_command_excludes() {
        let p = pod(json!({"spec": {"containers": []}}));
        let doc = patched(&p, "shop");
        let proxy = &doc["spec"]["containers"][0];
        assert_eq!(proxy["securityContext"]["runAsUser"], PROXY_UID);
        assert_eq!(proxy["securityContext"]["runAsGroup"], PROXY_UID);
        let init = &doc["spec"]["initContainers"][0];
        assert_eq!(init["command"], json!([PROXY_BINARY, "capture"]));
        let args = init["args"].as_array().unwrap();
        assert!(args.contains(&json!(format!("--proxy-uid={PROXY_UID}"))));
        assert!(args.contains(&json!(format!("--proxy-gid={PROXY_UID}"))));
        assert_eq!(init["securityContext"]["runAsUser"], 0);
        assert_eq!(
            init["securityContext"]["capabilities"]["add"],
            json!(["NET_ADMIN", "NET_RAW"])
        );
    }

    #[test]
    fn capture_annotations_become_the_init_containers_arguments() {
        let p = pod(json!({
            "metadata": {"annotations": {
                names::EXCLUDE_INBOUND_PORTS_ANNOTATION: "9090",
                names::EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION: "198.18.9.0/24"
            }},
            "spec": {"containers": [{"name": "app"}]}
        }));
        let doc = patched(&p, "shop");
        let args = doc["spec"]["initContainers"][0]["args"].as_array().unwrap();
        assert!(args.contains(&json!("--exclude-inbound-ports=9090")));
        assert!(args.contains(&json!("--exclude-outbound-ip-ranges=198.18.9.0/24")));
    }

    #[test]
    fn the_cert_ttl_annotation_becomes_the_agents_lifetime_flag() {
        let p = pod(json!({
            "metadata": {"annotations": {names::CERT_TTL_ANNOTATION: "1m30s"}},
            "spec": {"containers": [{"name": "app"}]}
        }));
        let doc = patched(&p, "shop");
        let args = doc["spec"]["containers"][1]["args"].as_array().unwrap();
        let at = args
            .iter()
            .position(|a| a == "--cert-ttl-seconds")
            .expect("the flag is rendered");
        assert_eq!(args[at + 1], "90");
        let default = patched(&pod(json!({"spec": {"containers": []}})), "shop");
        let args = default["spec"]["containers"][0]["args"].as_array().unwrap();
        assert!(
            !args.contains(&json!("--cert-ttl-seconds")),
            "without the annotation the instance's default applies"
        );
        let bad = pod(json!({
            "metadata": {"annotations": {names::CERT_TTL_ANNOTATION: "5s"}},
            "spec": {"containers": [{"name": "app"}]}
        }));
        let err = inject(&bad, "shop", &config()).unwrap_err().to_string();
        assert!(
            err.contains(names::CERT_TTL_ANNOTATION) && err.contains("\"5s\""),
            "{err}"
        );
    }

    #[test]
    fn a_malformed_capture_annotation_is_an_error_in_every_mode() {
        for mode in ["DEFAULT", "NONE"] {
            let p = pod(json!({
                "metadata": {"annotations": {
                    names::CAPTURE_MODE_ANNOTATION: mode,
                    names::EXCLUDE_OUTBOUND_PORTS_ANNOTATION: "3306,mysql"
                }},
                "spec": {"containers": [{"name": "app"}]}
            }));
            let err = inject(&p, "shop", &config()).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(names::EXCLUDE_OUTBOUND_PORTS_ANNOTATION),
                "{msg}"
            );
            assert!(msg.contains("\"mysql\" is not a port"), "{msg}");
        }
    }
}
