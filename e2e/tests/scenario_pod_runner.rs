//! The local pod runner against a fresh stand-in, with plain application pods: Deployments
//! become ready Pods, Services get EndpointSlices and a working ClusterIP, crashed containers
//! restart, a template change replaces the pods, deleting the Deployment stops them.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use meshplane_e2e::harness::{wait_for, Cluster};
use meshplane_pod_runner::{http_get, SERVICE_NAME_LABEL, TEMPLATE_HASH_LABEL};

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

    // The ClusterIP forwards to an echo pod, which names itself and the Host it was asked for.
    let services: Api<Service> = Api::namespaced(cluster.client(), "apps");
    let service = services.get("echo").await.expect("Service echo");
    let cluster_ip = service.spec.and_then(|s| s.cluster_ip).expect("ClusterIP");
    let frontend: SocketAddr = format!("{cluster_ip}:80")
        .parse()
        .expect("ClusterIP address");
    let reply = wait_for("a reply through the echo ClusterIP", DEADLINE, || async {
        http_get(
            frontend,
            "echo.apps.svc.cluster.local",
            "/hello",
            Duration::from_secs(2),
        )
        .await
        .map(Some)
    })
    .await
    .expect("echo reply");
    assert_eq!(reply.status, 200);
    let body: serde_json::Value = serde_json::from_str(&reply.body).expect("echo answers JSON");
    assert_eq!(body["namespace"], "apps");
    assert_eq!(body["host"], "echo.apps.svc.cluster.local");
    let names: Vec<String> = first.iter().map(|p| p.name_any()).collect();
    assert!(
        names.contains(&body["pod"].as_str().unwrap_or_default().to_string()),
        "reply from {body}"
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
    wait_for("no echo pods and their ports closed", DEADLINE, || async {
        let left = echo_pods(&pods).await?.len();
        let address: SocketAddr = format!("{last_ip}:8080")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let open = tokio::net::TcpStream::connect(address).await.is_ok();
        (left == 0 && !open)
            .then_some(())
            .map(Some)
            .ok_or(format!("{left} pods left, port open: {open}"))
    })
    .await
    .expect("pods gone");
}
