//! The API server's Table printers for the built-in kinds users list most: Pods, Services,
//! Deployments, ReplicaSets, StatefulSets, DaemonSets, Namespaces, ConfigMaps, Secrets and
//! ServiceAccounts, with the columns and cells Kubernetes' own printers give them
//! (`pkg/printers/internalversion`). As on the real server, every row carries the wide
//! (priority 1) cells; `kubectl get` shows them with `-o wide`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerStatus, Namespace, Pod, PodTemplateSpec, Secret, Service,
    ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::resources::{PrinterColumn, ResourceType};

/// One printed row: its cells in column order and the row conditions (`Completed` for pods
/// that ended).
pub struct Row {
    pub cells: Vec<Value>,
    pub conditions: Option<Value>,
}

/// The columns of a printer.
pub type Columns = fn() -> Vec<PrinterColumn>;
/// How a printer turns one object into a row, at a time `now`.
pub type RowOf = fn(&Value, Timestamp) -> Row;

/// A built-in kind's printer: its columns and how one object becomes a row.
pub struct Printer {
    pub columns: Columns,
    pub row: RowOf,
}

/// The printer of `rt`, for the kinds that have one here.
pub fn printer(rt: &ResourceType) -> Option<Printer> {
    let printer = |columns: Columns, row: RowOf| Printer { columns, row };
    match (rt.group.as_str(), rt.version.as_str(), rt.plural.as_str()) {
        ("", "v1", "pods") => Some(printer(pod_columns, pod_row)),
        ("", "v1", "services") => Some(printer(service_columns, service_row)),
        ("", "v1", "namespaces") => Some(printer(namespace_columns, namespace_row)),
        ("", "v1", "configmaps") => Some(printer(config_map_columns, config_map_row)),
        ("", "v1", "secrets") => Some(printer(secret_columns, secret_row)),
        ("", "v1", "serviceaccounts") => {
            Some(printer(service_account_columns, service_account_row))
        }
        ("apps", "v1", "deployments") => Some(printer(deployment_columns, deployment_row)),
        ("apps", "v1", "replicasets") => Some(printer(replica_set_columns, replica_set_row)),
        ("apps", "v1", "statefulsets") => Some(printer(stateful_set_columns, stateful_set_row)),
        ("apps", "v1", "daemonsets") => Some(printer(daemon_set_columns, daemon_set_row)),
        _ => None,
    }
}

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn column(name: &str, priority: i64, description: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: "string".into(),
        format: if name == "Name" { "name" } else { "" }.into(),
        description: description.into(),
        priority,
        json_path: String::new(),
    }
}

fn name_column() -> PrinterColumn {
    column("Name", 0, NAME_DESCRIPTION)
}

fn age_column() -> PrinterColumn {
    column("Age", 0, AGE_DESCRIPTION)
}

/// Decodes a stored object into its type; a body that does not decode prints as an empty
/// object of the kind (with its name, which every stored object has).
fn typed<T>(obj: &Value) -> T
where
    T: DeserializeOwned + Default + k8s_openapi::Metadata<Ty = ObjectMeta>,
{
    serde_json::from_value(obj.clone()).unwrap_or_else(|_| {
        let mut typed = T::default();
        if let Some(meta) = obj
            .get("metadata")
            .and_then(|m| serde_json::from_value(m.clone()).ok())
        {
            *typed.metadata_mut() = meta;
        }
        typed
    })
}

/// Kubernetes' `duration.HumanDuration` ("45s", "3m20s", "12m", "5h30m", "20h", "3d4h", "9d",
/// "2y10d") of the time from `since` to `now`.
pub fn human_duration(since: Timestamp, now: Timestamp) -> String {
    let seconds = now.as_second() - since.as_second();
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// The printers' `translateTimestampSince`: `<unknown>` for an unset time.
fn age(time: Option<&Time>, now: Timestamp) -> String {
    match time {
        Some(t) => human_duration(t.0, now),
        None => "<unknown>".into(),
    }
}

fn pod_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Ready", 0, "The aggregate readiness state of this pod for accepting traffic."),
        column("Status", 0, "The aggregate status of the containers in this pod."),
        column("Restarts", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
        age_column(),
        column("IP", 1, "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated."),
        column("Node", 1, "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename"),
        column("Nominated Node", 1, "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled."),
        column("Readiness Gates", 1, "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates"),
    ]
}

/// An init container with `restartPolicy: Always` (a sidecar): counted among the pod's
/// containers.
fn is_restartable(container: Option<&Container>) -> bool {
    container.and_then(|c| c.restart_policy.as_deref()) == Some("Always")
}

fn last_terminated(status: &ContainerStatus) -> Option<Timestamp> {
    status
        .last_state
        .as_ref()?
        .terminated
        .as_ref()?
        .finished_at
        .as_ref()
        .map(|t| t.0)
}

fn condition_true(pod: &Pod, type_: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// `printPod` of Kubernetes' printers: READY counts ready containers (and started sidecars)
/// of all containers (and sidecars); STATUS is the phase, or the reason a container or init
/// container gives (`Init:0/1`, `Init:CrashLoopBackOff`, `CrashLoopBackOff`, `Completed`,
/// `ExitCode:1`), `Terminating` once deleted; RESTARTS adds when the last restart was.
fn pod_row(obj: &Value, now: Timestamp) -> Row {
    let pod: Pod = typed(obj);
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let mut restarts = 0i64;
    let mut sidecar_restarts = 0i64;
    let mut total = spec.containers.len();
    let mut ready = 0usize;
    let mut last_restart: Option<Timestamp> = None;
    let mut last_sidecar_restart: Option<Timestamp> = None;
    let phase = status.phase.clone().unwrap_or_default();
    let mut reason = match status.reason.as_deref() {
        Some(r) if !r.is_empty() => r.to_string(),
        _ => phase.clone(),
    };
    let conditions = status.conditions.clone().unwrap_or_default();
    if conditions
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("SchedulingGated"))
    {
        reason = "SchedulingGated".into();
    }
    let row_conditions = match phase.as_str() {
        "Succeeded" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}]),
        ),
        "Failed" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]),
        ),
        _ => None,
    };
    let init_containers = spec.init_containers.clone().unwrap_or_default();
    let init_by_name: BTreeMap<&str, &Container> = init_containers
        .iter()
        .map(|c| (c.name.as_str(), c))
        .collect();
    total += init_containers
        .iter()
        .filter(|c| is_restartable(Some(c)))
        .count();

    let later = |a: Option<Timestamp>, b: Option<Timestamp>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let mut initializing = false;
    for (i, container) in status.init_container_statuses.iter().flatten().enumerate() {
        restarts += i64::from(container.restart_count);
        last_restart = later(last_restart, last_terminated(container));
        let sidecar = is_restartable(init_by_name.get(container.name.as_str()).copied());
        if sidecar {
            sidecar_restarts += i64::from(container.restart_count);
            last_sidecar_restart = later(last_sidecar_restart, last_terminated(container));
        }
        let state = container.state.clone().unwrap_or_default();
        if state.terminated.as_ref().is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if sidecar && container.started == Some(true) {
            if container.ready {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = state.terminated.as_ref() {
            reason = match t.reason.as_deref() {
                Some(r) if !r.is_empty() => format!("Init:{r}"),
                _ => match t.signal {
                    Some(signal) if signal != 0 => format!("Init:Signal:{signal}"),
                    _ => format!("Init:ExitCode:{}", t.exit_code),
                },
            };
        } else if let Some(r) = state
            .waiting
            .as_ref()
            .and_then(|w| w.reason.as_deref())
            .filter(|r| !r.is_empty() && *r != "PodInitializing")
        {
            reason = format!("Init:{r}");
        } else {
            reason = format!("Init:{i}/{}", init_containers.len());
        }
        initializing = true;
        break;
    }

    if !initializing || condition_true(&pod, "Initialized") {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for container in status.container_statuses.iter().flatten().rev() {
            restarts += i64::from(container.restart_count);
            last_restart = later(last_restart, last_terminated(container));
            let state = container.state.clone().unwrap_or_default();
            let waiting = state
                .waiting
                .as_ref()
                .and_then(|w| w.reason.as_deref())
                .filter(|r| !r.is_empty());
            if let Some(r) = waiting {
                reason = r.to_string();
            } else if let Some(t) = state.terminated.as_ref() {
                reason = match t.reason.as_deref() {
                    Some(r) if !r.is_empty() => r.to_string(),
                    _ => match t.signal {
                        Some(signal) if signal != 0 => format!("Signal:{signal}"),
                        _ => format!("ExitCode:{}", t.exit_code),
                    },
                };
            } else if container.ready && state.running.is_some() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = if condition_true(&pod, "Ready") {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }

    if pod.metadata.deletion_timestamp.is_some() {
        if status.reason.as_deref() == Some("NodeLost") {
            reason = "Unknown".into();
        } else if phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".into();
        }
    }

    let restarts_text = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", human_duration(t, now)),
        _ => restarts.to_string(),
    };
    let or_none = |s: Option<String>| match s {
        Some(s) if !s.is_empty() => s,
        _ => "<none>".to_string(),
    };
    let ip = status
        .pod_ips
        .as_ref()
        .and_then(|ips| ips.first())
        .map(|ip| ip.ip.clone())
        .or(status.pod_ip.clone());
    let readiness_gates = match spec.readiness_gates.as_deref() {
        Some(gates) if !gates.is_empty() => {
            let passed = gates
                .iter()
                .filter(|g| {
                    conditions
                        .iter()
                        .find(|c| c.type_ == g.condition_type)
                        .is_some_and(|c| c.status == "True")
                })
                .count();
            format!("{passed}/{}", gates.len())
        }
        _ => "<none>".into(),
    };
    Row {
        cells: vec![
            json!(pod.metadata.name.clone().unwrap_or_default()),
            json!(format!("{ready}/{total}")),
            json!(reason),
            json!(restarts_text),
            json!(age(pod.metadata.creation_timestamp.as_ref(), now)),
            json!(or_none(ip)),
            json!(or_none(spec.node_name.clone())),
            json!(or_none(status.nominated_node_name.clone())),
            json!(readiness_gates),
        ],
        conditions: row_conditions,
    }
}

fn service_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Type", 0, "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types"),
        column("Cluster-IP", 0, "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies"),
        column("External-IP", 0, "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system."),
        column("Port(s)", 0, "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies"),
        age_column(),
        column("Selector", 1, "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/"),
    ]
}

/// `labels.FormatLabels`: `k=v` pairs sorted by key, `<none>` when empty.
fn format_labels(labels: Option<&BTreeMap<String, String>>) -> String {
    match labels {
        Some(l) if !l.is_empty() => l
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
        _ => "<none>".into(),
    }
}

fn service_row(obj: &Value, now: Timestamp) -> Row {
    let svc: Service = typed(obj);
    let spec = svc.spec.clone().unwrap_or_default();
    let type_ = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
    let cluster_ip = spec
        .cluster_ips
        .as_ref()
        .and_then(|ips| ips.first().cloned())
        .or(spec.cluster_ip.clone())
        .filter(|ip| !ip.is_empty())
        .unwrap_or_else(|| "<none>".into());
    let external_ips = spec.external_ips.clone().unwrap_or_default();
    let external_ip = match type_.as_str() {
        "ClusterIP" | "NodePort" if !external_ips.is_empty() => external_ips.join(","),
        "ClusterIP" | "NodePort" => "<none>".into(),
        "LoadBalancer" => {
            let mut all: Vec<String> = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| {
                    i.ip.clone()
                        .filter(|ip| !ip.is_empty())
                        .or(i.hostname.clone().filter(|h| !h.is_empty()))
                })
                .collect();
            all.extend(external_ips);
            if all.is_empty() {
                "<pending>".into()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => spec.external_name.clone().unwrap_or_default(),
        _ => "<unknown>".into(),
    };
    let ports: Vec<String> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let protocol = p.protocol.as_deref().unwrap_or("TCP");
            match p.node_port {
                Some(node_port) if node_port > 0 => format!("{}:{node_port}/{protocol}", p.port),
                _ => format!("{}/{protocol}", p.port),
            }
        })
        .collect();
    let ports = if ports.is_empty() {
        "<none>".into()
    } else {
        ports.join(",")
    };
    Row {
        cells: vec![
            json!(svc.metadata.name.clone().unwrap_or_default()),
            json!(type_),
            json!(cluster_ip),
            json!(external_ip),
            json!(ports),
            json!(age(svc.metadata.creation_timestamp.as_ref(), now)),
            json!(format_labels(spec.selector.as_ref())),
        ],
        conditions: None,
    }
}

fn deployment_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Ready", 0, "Number of the pod with ready state"),
        column("Up-to-date", 0, "Total number of non-terminating pods targeted by this deployment that have the desired template spec."),
        column("Available", 0, "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment."),
        age_column(),
        column("Containers", 1, "Names of each container in the template."),
        column("Images", 1, "Images referenced by each container in the template."),
        column("Selector", 1, "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment."),
    ]
}

/// A label selector as `labels.Selector.String()` prints it: requirements sorted by key.
fn format_selector(selector: &LabelSelector) -> String {
    let mut requirements: Vec<(String, String)> = Vec::new();
    for (k, v) in selector.match_labels.iter().flatten() {
        requirements.push((k.clone(), format!("{k}={v}")));
    }
    for e in selector.match_expressions.iter().flatten() {
        let mut values = e.values.clone().unwrap_or_default();
        values.sort();
        let text = match e.operator.as_str() {
            "In" => format!("{} in ({})", e.key, values.join(",")),
            "NotIn" => format!("{} notin ({})", e.key, values.join(",")),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => format!("{} {other}", e.key),
        };
        requirements.push((e.key.clone(), text));
    }
    requirements.sort();
    requirements
        .into_iter()
        .map(|(_, text)| text)
        .collect::<Vec<_>>()
        .join(",")
}

/// The wide CONTAINERS and IMAGES cells of a pod template: names and images, comma-separated.
fn template_cells(template: Option<&PodTemplateSpec>) -> [Value; 2] {
    let containers = template
        .and_then(|t| t.spec.as_ref())
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    let images: Vec<&str> = containers
        .iter()
        .map(|c| c.image.as_deref().unwrap_or_default())
        .collect();
    [json!(names.join(",")), json!(images.join(","))]
}

fn deployment_row(obj: &Value, now: Timestamp) -> Row {
    let deploy: Deployment = typed(obj);
    let spec = deploy.spec.clone();
    let status = deploy.status.clone().unwrap_or_default();
    let [names, images] = template_cells(Some(&spec.template));
    Row {
        cells: vec![
            json!(deploy.metadata.name.clone().unwrap_or_default()),
            json!(format!(
                "{}/{}",
                status.ready_replicas.unwrap_or(0),
                spec.replicas.unwrap_or(1)
            )),
            json!(status.updated_replicas.unwrap_or(0)),
            json!(status.available_replicas.unwrap_or(0)),
            json!(age(deploy.metadata.creation_timestamp.as_ref(), now)),
            names,
            images,
            json!(format_selector(&spec.selector)),
        ],
        conditions: None,
    }
}

const CONTAINERS_DESCRIPTION: &str = "Names of each container in the template.";
const IMAGES_DESCRIPTION: &str = "Images referenced by each container in the template.";

fn replica_set_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Desired", 0, "Replicas is the number of desired pods. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset"),
        column("Current", 0, "Replicas is the most recently observed number of non-terminating pods. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset"),
        column("Ready", 0, "The number of non-terminating pods targeted by this ReplicaSet with a Ready Condition."),
        age_column(),
        column("Containers", 1, CONTAINERS_DESCRIPTION),
        column("Images", 1, IMAGES_DESCRIPTION),
        column("Selector", 1, "Selector is a label query over pods that should match the replica count. Label keys and values that must match in order to be controlled by this replica set. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
    ]
}

fn replica_set_row(obj: &Value, now: Timestamp) -> Row {
    let rs: ReplicaSet = typed(obj);
    let status = rs.status.clone().unwrap_or_default();
    let [names, images] = template_cells(rs.spec.template.as_ref());
    Row {
        cells: vec![
            json!(rs.metadata.name.clone().unwrap_or_default()),
            json!(rs.spec.replicas.unwrap_or(1)),
            json!(status.replicas),
            json!(status.ready_replicas.unwrap_or(0)),
            json!(age(rs.metadata.creation_timestamp.as_ref(), now)),
            names,
            images,
            json!(format_selector(&rs.spec.selector)),
        ],
        conditions: None,
    }
}

fn stateful_set_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Ready", 0, "Number of the pod with ready state"),
        age_column(),
        column("Containers", 1, CONTAINERS_DESCRIPTION),
        column("Images", 1, IMAGES_DESCRIPTION),
    ]
}

fn stateful_set_row(obj: &Value, now: Timestamp) -> Row {
    let sts: StatefulSet = typed(obj);
    let ready = sts
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let [names, images] = template_cells(Some(&sts.spec.template));
    Row {
        cells: vec![
            json!(sts.metadata.name.clone().unwrap_or_default()),
            json!(format!("{ready}/{}", sts.spec.replicas.unwrap_or(1))),
            json!(age(sts.metadata.creation_timestamp.as_ref(), now)),
            names,
            images,
        ],
        conditions: None,
    }
}

fn daemon_set_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Desired", 0, "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/"),
        column("Current", 0, "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/"),
        column("Ready", 0, "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition."),
        column("Up-to-date", 0, "The total number of nodes that are running updated daemon pod"),
        column("Available", 0, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)"),
        column("Node Selector", 0, "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/"),
        age_column(),
        column("Containers", 1, CONTAINERS_DESCRIPTION),
        column("Images", 1, IMAGES_DESCRIPTION),
        column("Selector", 1, "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
    ]
}

fn daemon_set_row(obj: &Value, now: Timestamp) -> Row {
    let ds: DaemonSet = typed(obj);
    let status = ds.status.clone().unwrap_or_default();
    let node_selector = ds
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref());
    let [names, images] = template_cells(Some(&ds.spec.template));
    Row {
        cells: vec![
            json!(ds.metadata.name.clone().unwrap_or_default()),
            json!(status.desired_number_scheduled),
            json!(status.current_number_scheduled),
            json!(status.number_ready),
            json!(status.updated_number_scheduled.unwrap_or(0)),
            json!(status.number_available.unwrap_or(0)),
            json!(format_labels(node_selector)),
            json!(age(ds.metadata.creation_timestamp.as_ref(), now)),
            names,
            images,
            json!(format_selector(&ds.spec.selector)),
        ],
        conditions: None,
    }
}

fn config_map_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Data", 0, "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process."),
        age_column(),
    ]
}

fn config_map_row(obj: &Value, now: Timestamp) -> Row {
    let cm: ConfigMap = typed(obj);
    let data =
        cm.data.as_ref().map_or(0, |d| d.len()) + cm.binary_data.as_ref().map_or(0, |d| d.len());
    Row {
        cells: vec![
            json!(cm.metadata.name.clone().unwrap_or_default()),
            json!(data),
            json!(age(cm.metadata.creation_timestamp.as_ref(), now)),
        ],
        conditions: None,
    }
}

fn secret_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Type", 0, "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types"),
        column("Data", 0, "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4"),
        age_column(),
    ]
}

fn secret_row(obj: &Value, now: Timestamp) -> Row {
    let secret: Secret = typed(obj);
    Row {
        cells: vec![
            json!(secret.metadata.name.clone().unwrap_or_default()),
            // The API server defaults an unset type to Opaque.
            json!(secret.type_.clone().unwrap_or_else(|| "Opaque".into())),
            json!(secret.data.as_ref().map_or(0, |d| d.len())),
            json!(age(secret.metadata.creation_timestamp.as_ref(), now)),
        ],
        conditions: None,
    }
}

fn service_account_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Secrets", 0, "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use. Pods are only limited to this list if this service account has a \"kubernetes.io/enforce-mountable-secrets\" annotation set to \"true\". The \"kubernetes.io/enforce-mountable-secrets\" annotation is deprecated since v1.32. Prefer separate namespaces to isolate access to mounted secrets. This field should not be used to find auto-generated service account token secrets for use outside of pods. Instead, tokens can be requested directly using the TokenRequest API, or service account token secrets can be manually created. More info: https://kubernetes.io/docs/concepts/configuration/secret"),
        age_column(),
    ]
}

fn service_account_row(obj: &Value, now: Timestamp) -> Row {
    let sa: ServiceAccount = typed(obj);
    Row {
        cells: vec![
            json!(sa.metadata.name.clone().unwrap_or_default()),
            json!(sa.secrets.as_ref().map_or(0, |s| s.len())),
            json!(age(sa.metadata.creation_timestamp.as_ref(), now)),
        ],
        conditions: None,
    }
}

fn namespace_columns() -> Vec<PrinterColumn> {
    vec![
        name_column(),
        column("Status", 0, "The status of the namespace"),
        age_column(),
    ]
}

fn namespace_row(obj: &Value, now: Timestamp) -> Row {
    let ns: Namespace = typed(obj);
    Row {
        cells: vec![
            json!(ns.metadata.name.clone().unwrap_or_default()),
            json!(ns.status.and_then(|s| s.phase).unwrap_or_default()),
            json!(age(ns.metadata.creation_timestamp.as_ref(), now)),
        ],
        conditions: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-01-01T12:00:00Z";

    fn pod(extra: Value) -> Value {
        let mut pod = json!({
            "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": "2026-01-01T11:55:00Z"},
            "spec": {"containers": [{"name": "app", "image": "app:1"}, {"name": "proxy", "image": "proxy:1"}]},
        });
        json_patch::merge(&mut pod, &extra);
        pod
    }

    fn cells(obj: &Value) -> Vec<Value> {
        pod_row(obj, at(NOW)).cells
    }

    fn running(name: &str, ready: bool, restarts: i32) -> Value {
        json!({"name": name, "ready": ready, "restartCount": restarts, "image": "", "imageID": "",
               "state": {"running": {"startedAt": "2026-01-01T11:55:10Z"}}})
    }

    #[test]
    fn human_durations_match_kubernetes() {
        let now = at(NOW);
        let cases = [
            (0, "0s"),
            (119, "119s"),
            (200, "3m20s"),
            (300, "5m"),
            (3000, "50m"),
            (3600 * 5 + 60 * 30, "5h30m"),
            (3600 * 20, "20h"),
            (86400 * 3 + 3600 * 4, "3d4h"),
            (86400 * 9, "9d"),
            (86400 * (365 * 2 + 10), "2y10d"),
        ];
        for (seconds, text) in cases {
            let since = Timestamp::from_second(now.as_second() - seconds).unwrap();
            assert_eq!(human_duration(since, now), text, "{seconds}s");
        }
    }

    #[test]
    fn pending_pod_without_statuses() {
        let p = pod(json!({"status": {"phase": "Pending"}}));
        assert_eq!(
            cells(&p),
            vec![
                json!("web-1"),
                json!("0/2"),
                json!("Pending"),
                json!("0"),
                json!("5m"),
                json!("<none>"),
                json!("<none>"),
                json!("<none>"),
                json!("<none>")
            ]
        );
    }

    #[test]
    fn running_pod_counts_ready_containers_and_shows_wide_cells() {
        let p = pod(json!({
            "spec": {"nodeName": "node-a", "readinessGates": [{"conditionType": "example.com/gate"}]},
            "status": {"phase": "Running", "podIP": "198.18.0.5",
                       "conditions": [{"type": "Ready", "status": "False"}, {"type": "example.com/gate", "status": "True"}],
                       "containerStatuses": [running("app", true, 0), running("proxy", false, 0)]},
        }));
        let c = cells(&p);
        assert_eq!(c[1], json!("1/2"));
        assert_eq!(c[2], json!("Running"));
        assert_eq!(c[5], json!("198.18.0.5"));
        assert_eq!(c[6], json!("node-a"));
        assert_eq!(c[7], json!("<none>"));
        assert_eq!(c[8], json!("1/1"));
    }

    #[test]
    fn crash_loop_shows_reason_and_last_restart() {
        let mut crashing = running("app", false, 3);
        crashing["state"] = json!({"waiting": {"reason": "CrashLoopBackOff"}});
        crashing["lastState"] =
            json!({"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T11:59:00Z"}});
        let p = pod(json!({"status": {"phase": "Running",
            "containerStatuses": [crashing, running("proxy", true, 0)]}}));
        let c = cells(&p);
        assert_eq!(c[1], json!("1/2"));
        assert_eq!(c[2], json!("CrashLoopBackOff"));
        assert_eq!(c[3], json!("3 (60s ago)"));
    }

    #[test]
    fn init_containers_show_progress_and_failures() {
        let p = pod(json!({
            "spec": {"initContainers": [{"name": "capture"}, {"name": "wait"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "capture", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                 "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                {"name": "wait", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                 "state": {"running": {}}},
            ]},
        }));
        assert_eq!(cells(&p)[2], json!("Init:1/2"));
        let p = pod(json!({
            "spec": {"initContainers": [{"name": "capture"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "capture", "ready": false, "restartCount": 2, "image": "", "imageID": "",
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ]},
        }));
        let c = cells(&p);
        assert_eq!(c[2], json!("Init:CrashLoopBackOff"));
        assert_eq!(c[3], json!("2"));
        let p = pod(json!({
            "spec": {"initContainers": [{"name": "capture"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "capture", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                 "state": {"terminated": {"exitCode": 2}}},
            ]},
        }));
        assert_eq!(cells(&p)[2], json!("Init:ExitCode:2"));
    }

    #[test]
    fn sidecar_init_containers_count_as_containers() {
        let p = pod(json!({
            "spec": {"initContainers": [{"name": "proxy-init", "restartPolicy": "Always"}]},
            "status": {"phase": "Running",
                "conditions": [{"type": "Initialized", "status": "True"}],
                "initContainerStatuses": [{"name": "proxy-init", "ready": true, "started": true,
                    "restartCount": 1, "image": "", "imageID": "", "state": {"running": {}}}],
                "containerStatuses": [running("app", true, 0), running("proxy", true, 0)]},
        }));
        let c = cells(&p);
        assert_eq!(c[1], json!("3/3"));
        assert_eq!(c[2], json!("Running"));
        assert_eq!(c[3], json!("1"));
    }

    #[test]
    fn deleted_and_finished_pods() {
        let p = pod(
            json!({"metadata": {"deletionTimestamp": "2026-01-01T11:59:59Z"},
            "status": {"phase": "Running", "containerStatuses": [running("app", true, 0), running("proxy", true, 0)]}}),
        );
        assert_eq!(cells(&p)[2], json!("Terminating"));
        let mut done = running("app", false, 0);
        done["state"] = json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
        let p = pod(json!({"status": {"phase": "Succeeded", "containerStatuses": [done]}}));
        let row = pod_row(&p, at(NOW));
        assert_eq!(row.cells[2], json!("Completed"));
        assert_eq!(row.conditions.unwrap()[0]["reason"], json!("Succeeded"));
        let mut failed = running("app", false, 0);
        failed["state"] = json!({"terminated": {"exitCode": 137, "signal": 9}});
        let p = pod(json!({"status": {"phase": "Failed", "containerStatuses": [failed]}}));
        assert_eq!(cells(&p)[2], json!("Signal:9"));
    }

    #[test]
    fn services_deployments_and_namespaces() {
        let now = at(NOW);
        let svc = json!({"metadata": {"name": "web", "creationTimestamp": "2026-01-01T10:00:00Z"},
            "spec": {"type": "NodePort", "clusterIP": "198.19.0.10", "clusterIPs": ["198.19.0.10"],
                     "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 9090, "protocol": "UDP"}],
                     "selector": {"app": "web", "tier": "front"}}});
        assert_eq!(
            service_row(&svc, now).cells,
            vec![
                json!("web"),
                json!("NodePort"),
                json!("198.19.0.10"),
                json!("<none>"),
                json!("80:30080/TCP,9090/UDP"),
                json!("120m"),
                json!("app=web,tier=front")
            ]
        );
        let lb = json!({"metadata": {"name": "gw"}, "spec": {"type": "LoadBalancer", "clusterIP": "None"}});
        let c = service_row(&lb, now).cells;
        assert_eq!(c[2], json!("None"));
        assert_eq!(c[3], json!("<pending>"));
        assert_eq!(c[4], json!("<none>"));
        assert_eq!(c[5], json!("<unknown>"));
        assert_eq!(c[6], json!("<none>"));

        let deploy = json!({"metadata": {"name": "web", "creationTimestamp": "2026-01-01T11:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"},
                        "matchExpressions": [{"key": "track", "operator": "NotIn", "values": ["canary"]}]},
                     "template": {"spec": {"containers": [{"name": "app", "image": "app:1"}, {"name": "proxy", "image": "proxy:1"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
        assert_eq!(
            deployment_row(&deploy, now).cells,
            vec![
                json!("web"),
                json!("2/3"),
                json!(3),
                json!(2),
                json!("60m"),
                json!("app,proxy"),
                json!("app:1,proxy:1"),
                json!("app=web,track notin (canary)")
            ]
        );
        let ns = json!({"metadata": {"name": "tenant-a", "creationTimestamp": "2026-01-01T11:59:30Z"},
            "status": {"phase": "Active"}});
        assert_eq!(
            namespace_row(&ns, now).cells,
            vec![json!("tenant-a"), json!("Active"), json!("30s")]
        );
    }

    #[test]
    fn workloads_and_configuration() {
        let now = at(NOW);
        let template = json!({"spec": {"containers": [{"name": "app", "image": "app:1"}]}});
        let rs = json!({"metadata": {"name": "web-5d9f"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "5d9f"}}, "template": template},
            "status": {"replicas": 2, "readyReplicas": 1}});
        assert_eq!(
            replica_set_row(&rs, now).cells,
            vec![
                json!("web-5d9f"),
                json!(2),
                json!(2),
                json!(1),
                json!("<unknown>"),
                json!("app"),
                json!("app:1"),
                json!("app=web,pod-template-hash=5d9f")
            ]
        );
        let sts = json!({"metadata": {"name": "db"}, "spec": {"replicas": 3, "selector": {}, "template": template},
            "status": {"replicas": 3, "readyReplicas": 3}});
        assert_eq!(stateful_set_row(&sts, now).cells[1], json!("3/3"));
        let ds = json!({"metadata": {"name": "agent"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                     "template": {"spec": {"nodeSelector": {"kubernetes.io/os": "linux"}, "containers": [{"name": "a", "image": "a:1"}]}}},
            "status": {"desiredNumberScheduled": 1, "currentNumberScheduled": 1, "numberReady": 1, "numberMisscheduled": 0}});
        let c = daemon_set_row(&ds, now).cells;
        assert_eq!(
            c[1..7],
            [
                json!(1),
                json!(1),
                json!(1),
                json!(0),
                json!(0),
                json!("kubernetes.io/os=linux")
            ]
        );
        let cm = json!({"metadata": {"name": "settings"}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}});
        assert_eq!(config_map_row(&cm, now).cells[1], json!(3));
        let secret = json!({"metadata": {"name": "token"}, "data": {"t": "AA=="}});
        assert_eq!(
            secret_row(&secret, now).cells[1..3],
            [json!("Opaque"), json!(1)]
        );
        let sa = json!({"metadata": {"name": "default"}});
        assert_eq!(service_account_row(&sa, now).cells[1], json!(0));
    }

    #[test]
    fn every_row_has_a_cell_per_column() {
        for (plural, group, obj) in [
            ("pods", "", pod(json!({}))),
            ("services", "", json!({"metadata": {"name": "s"}})),
            ("namespaces", "", json!({"metadata": {"name": "n"}})),
            ("configmaps", "", json!({"metadata": {"name": "c"}})),
            ("secrets", "", json!({"metadata": {"name": "s"}})),
            ("serviceaccounts", "", json!({"metadata": {"name": "s"}})),
            ("deployments", "apps", json!({"metadata": {"name": "d"}})),
            ("replicasets", "apps", json!({"metadata": {"name": "r"}})),
            ("statefulsets", "apps", json!({"metadata": {"name": "s"}})),
            ("daemonsets", "apps", json!({"metadata": {"name": "d"}})),
        ] {
            let rt = crate::resources::builtin_types()
                .into_iter()
                .find(|t| t.plural == plural && t.group == group)
                .unwrap();
            let p = printer(&rt).unwrap();
            assert_eq!(
                (p.columns)().len(),
                (p.row)(&obj, at(NOW)).cells.len(),
                "{plural}"
            );
        }
    }
}
