//! The local pod runner against a fresh stand-in, with plain application pods: Deployments
//! become ready Pods, each in its own network namespace with its own address; Services get
//! EndpointSlices and a working ClusterIP (netfilter DNAT, from the node and from pods, a pod
//! reaching itself included) and resolve by name inside pods; crashed containers restart, a
//! template change replaces the pods, deleting the Deployment stops them and removes their
//! namespaces.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use meshplane_e2e::harness::{pod_ip, wait_for, Cluster};
use meshplane_pod_runner::{SERVICE_NAME_LABEL, TEMPLATE_HASH_LABEL};

const DEADLINE: Duration = Duration::from_secs(60);

const APP: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: apps
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: greeting
  namespace: apps
data:
  message: hello
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: echo
  namespace: apps
spec:
  replicas: 2
  selector:
    matchLabels: {app: echo}
  template:
    metadata:
      labels: {app: echo}
    spec:
      containers:
        - name: app
          image: example.com/echo:1
          ports:
            - {name: http, containerPort: 8080}
          readinessProbe:
            httpGet: {path: /healthz, port: http}
          volumeMounts:
            - {name: greeting, mountPath: /etc/greeting}
      volumes:
        - name: greeting
          configMap: {name: greeting}
---
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: apps
spec:
  selector: {app: echo}
  ports:
    - {name: http, port: 80, targetPort: http}
"#;

async fn echo_pods(pods: &Api<Pod>) -> Result<Vec<Pod>, String> {
    let list = pods
        .list(&ListParams::default().labels("app=echo"))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list.items)
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits for exactly `count` ready echo pods, all with template hash other than `not_hash`.
async fn wait_for_ready_pods(pods: &Api<Pod>, count: usize, not_hash: Option<&str>) -> Vec<Pod> {
    let what = format!("{count} ready echo pods (template hash not {not_hash:?})");
    wait_for(&what, DEADLINE, || async {
        let items = echo_pods(pods).await?;
        let fresh = items
            .iter()
            .filter(|p| p.labels().get(TEMPLATE_HASH_LABEL).map(String::as_str) != not_hash)
            .filter(|p| ready(p))
            .count();
        if items.len() == count && fresh == count {
            Ok(Some(items))
        } else {
            Err(format!(
                "{} pods, {fresh} of them ready and current",
                items.len()
            ))
        }
    })
    .await
    .expect("echo pods")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_runner_runs_deployments_services_restarts_and_rollouts() {
    let cluster = Cluster::start_plain("pod-runner").await.expect("cluster");
    if cluster.runner().is_none() {
        eprintln!(
            "this scenario tests the local pod runner; E2E_KUBECONFIG is set, so it does not apply"
        );
        return;
    }
    cluster.apply_manifest(APP).expect("apply the app");
    cluster
        .wait_for_deployment_available("apps", "echo", DEADLINE)
        .await
        .expect("echo Deployment available");

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "apps");
    let first = wait_for_ready_pods(&pods, 2, None).await;
    for pod in &first {
        let name = pod.name_any();
        let hash = pod.labels()[TEMPLATE_HASH_LABEL].clone();
        assert!(
            name.starts_with(&format!("echo-{hash}-")),
            "pod name {name} is <deploy>-<hash>-<suffix>"
        );
        let owner = &pod.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("Deployment", "echo", Some(true))
        );
    }

    // EndpointSlice lists both pods, ready, on the container port behind targetPort "http".
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client(), "apps");
    wait_for(
        "an EndpointSlice for Service echo with 2 ready endpoints on 8080",
        DEADLINE,
        || async {
            let list = slices
                .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}=echo")))
                .await
                .map_err(|e| e.to_string())?;
            let slice = list.items.first().ok_or("no slice")?;
            let ready = slice
                .endpoints
                .iter()
                .flatten()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .count();
            let port = slice.ports.iter().flatten().next().and_then(|p| p.port);
            (ready == 2 && port == Some(8080))
                .then_some(())
                .map(Some)
                .ok_or(format!("{ready} ready endpoints, port {port:?}"))
        },
    )
    .await
    .expect("EndpointSlice");

    // Every pod has its own address in the pod range and its own network namespace.
    let ips: Vec<_> = first.iter().map(|p| pod_ip(p).expect("pod IP")).collect();
    assert_ne!(ips[0], ips[1]);
    assert!(
        ips.iter().all(|ip| ip.octets()[..2] == [198, 18]),
        "{ips:?}"
    );
    let names: Vec<String> = first.iter().map(|p| p.name_any()).collect();
    let in_first = cluster.in_pod("apps", &names[0]).expect("first pod");
    let in_second = cluster.in_pod("apps", &names[1]).expect("second pod");
    assert_ne!(in_first.netns(), in_second.netns());

    // The ClusterIP (198.19.0.0/16) forwards from the node to an echo pod, which names itself
    // and the Host it was asked for.
    let services: Api<Service> = Api::namespaced(cluster.client(), "apps");
    let service = services.get("echo").await.expect("Service echo");
    let cluster_ip = service.spec.and_then(|s| s.cluster_ip).expect("ClusterIP");
    assert!(cluster_ip.starts_with("198.19."), "{cluster_ip}");
    let frontend: SocketAddr = format!("{cluster_ip}:80")
        .parse()
        .expect("ClusterIP address");
    let node = cluster.on_node().expect("the stand-in cluster has a node");
    let reply = wait_for("a reply through the echo ClusterIP", DEADLINE, || async {
        node.http_get(frontend, "echo.apps.svc.cluster.local", "/hello")
            .await
            .map(Some)
            .map_err(|e| e.to_string())
    })
    .await
    .expect("echo reply");
    assert_eq!(reply.status, 200);
    let body: serde_json::Value = serde_json::from_str(&reply.body).expect("echo answers JSON");
    assert_eq!(body["namespace"], "apps");
    assert_eq!(body["host"], "echo.apps.svc.cluster.local");
    assert!(
        names.contains(&body["pod"].as_str().unwrap_or_default().to_string()),
        "reply from {body}"
    );

    // Inside a pod the Service resolves by its short name, and every request reaches an echo
    // pod: the other one, or the caller itself (hairpin, masqueraded through the node).
    assert_eq!(
        in_first.resolve("echo").map(|ip| ip.to_string()),
        Some(cluster_ip.clone())
    );
    assert_eq!(
        in_first.resolve("echo.apps.svc.cluster.local"),
        in_first.resolve("echo.apps")
    );
    let mut served_by = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let reply = in_first
            .http_get("http://echo/from-a-pod")
            .await
            .expect("reply");
        let body: serde_json::Value = serde_json::from_str(&reply.body).expect("JSON");
        served_by.insert(body["pod"].as_str().unwrap_or_default().to_string());
    }
    assert!(
        served_by.iter().all(|p| names.contains(p)),
        "only echo pods answer: {served_by:?}"
    );
    // A pod's own address is direct: the peer the server sees is the caller.
    let direct = in_first
        .http_get(&format!("http://{}:8080/", ips[1]))
        .await
        .expect("pod to pod");
    let body: serde_json::Value = serde_json::from_str(&direct.body).expect("JSON");
    assert_eq!(body["pod"], names[1].as_str());
    assert!(
        body["peer"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&format!("{}:", ips[0])),
        "{body}"
    );

    // A killed container is restarted and becomes ready again.
    let victim = first[0].name_any();
    let runner = cluster
        .runner()
        .expect("the stand-in cluster has a pod runner");
    runner
        .kill_container("apps", &victim, "app")
        .await
        .expect("kill");
    wait_for(
        &format!("{victim} restarted once and ready"),
        DEADLINE,
        || async {
            let pod = pods.get(&victim).await.map_err(|e| e.to_string())?;
            let restarts = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .map(|c| c.restart_count)
                .unwrap_or_default();
            (restarts == 1 && ready(&pod))
                .then_some(())
                .map(Some)
                .ok_or(format!("restarts {restarts}"))
        },
    )
    .await
    .expect("restart");

    // A template change replaces every pod.
    let old_hash = first[0].labels()[TEMPLATE_HASH_LABEL].clone();
    cluster
        .kubectl(&["-n", "apps", "set", "env", "deployment/echo", "COLOUR=blue"])
        .expect("change the template");
    let second = wait_for_ready_pods(&pods, 2, Some(&old_hash)).await;
    assert!(
        second.iter().all(|p| !names.contains(&p.name_any())),
        "all pods replaced"
    );
    cluster
        .wait_for_deployment_available("apps", "echo", DEADLINE)
        .await
        .expect("available after the rollout");

    // Deleting the Deployment removes its pods (owner-reference GC) and stops their processes.
    let last_ip = second[0]
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    cluster
        .kubectl(&["-n", "apps", "delete", "deployment", "echo"])
        .expect("delete");
    let network = cluster
        .network()
        .expect("the stand-in cluster has a network")
        .clone();
    wait_for(
        "no echo pods, their ports closed and namespaces gone",
        DEADLINE,
        || async {
            let left = echo_pods(&pods).await?.len();
            let address: SocketAddr = format!("{last_ip}:8080")
                .parse()
                .map_err(|e| format!("{e}"))?;
            let open = node.connect(address).await.is_ok();
            let namespaces = second
                .iter()
                .filter(|p| network.pod("apps", &p.name_any()).is_some())
                .count();
            (left == 0 && !open && namespaces == 0)
                .then_some(())
                .map(Some)
                .ok_or(format!(
                    "{left} pods left, port open: {open}, {namespaces} namespaces left"
                ))
        },
    )
    .await
    .expect("pods gone");
}
