//! `pods/<name>/log`: what the node supplies, cut and chosen as kube-apiserver does, read with
//! kube-rs (what meshctl uses) and with the real `kubectl logs`.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};
use meshplane_kube_standin::{Identity, PodLogs, PodRef, StandIn, StandInHandle, StandInOptions};
use serde_json::json;

/// A stand-in whose node says, for every container, which container of which pod it is.
async fn standin() -> StandInHandle {
    let logs = PodLogs::new(|pod: PodRef, container: String| async move {
        Ok(format!(
            "first line\n{}/{} {container}\nlast line\n",
            pod.namespace, pod.name
        )
        .into_bytes())
    });
    StandIn::start(StandInOptions {
        pod_logs: logs,
        ..StandInOptions::default()
    })
    .await
    .unwrap()
}

async fn two_container_pod(client: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "app", "image": "app:1"}, {"name": "proxy", "image": "proxy:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

#[tokio::test]
async fn logs_are_read_per_container_and_cut_by_tail_lines() {
    let handle = standin().await;
    let admin = handle.client(&Identity::Admin).await.unwrap();
    two_container_pod(&admin).await;
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let all = pods
        .logs(
            "web",
            &LogParams {
                container: Some("proxy".into()),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(all, "first line\ndefault/web proxy\nlast line\n");
    let tail = pods
        .logs(
            "web",
            &LogParams {
                container: Some("app".into()),
                tail_lines: Some(2),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(tail, "default/web app\nlast line\n");
    // Two containers and none named: refused with the choices, as the real API does.
    let refused = pods.logs("web", &LogParams::default()).await;
    let Err(kube::Error::Api(status)) = refused else {
        panic!("expected a refusal, got {refused:?}");
    };
    assert_eq!(status.code, 400);
    assert!(status.message.contains("[app proxy]"), "{}", status.message);
}

#[tokio::test]
async fn only_callers_allowed_to_get_pods_log_read_it() {
    let handle = standin().await;
    let admin = handle.client(&Identity::Admin).await.unwrap();
    two_container_pod(&admin).await;
    let stranger = handle
        .client(&Identity::ServiceAccount {
            namespace: "default".into(),
            name: "stranger".into(),
        })
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(stranger, "default");
    let refused = pods
        .logs(
            "web",
            &LogParams {
                container: Some("app".into()),
                ..LogParams::default()
            },
        )
        .await;
    let Err(kube::Error::Api(status)) = refused else {
        panic!("expected a refusal, got {refused:?}");
    };
    assert_eq!(status.code, 403, "{}", status.message);
    assert!(status.message.contains("pods/log"), "{}", status.message);
}

#[tokio::test]
async fn kubectl_logs_reads_a_container() {
    let Ok(kubectl) = std::env::var("KUBECTL").map(PathBuf::from).or_else(|_| {
        let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/kubectl");
        if venv.exists() {
            Ok(venv)
        } else {
            Err(())
        }
    }) else {
        panic!("kubectl not found: set KUBECTL or `make venv`");
    };
    let handle = standin().await;
    let admin = handle.client(&Identity::Admin).await.unwrap();
    two_container_pod(&admin).await;
    let kubeconfig = handle.kubeconfig(&Identity::Admin).unwrap();
    let home = handle.kubeconfig_dir().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(kubectl)
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", home)
            .args(["logs", "web", "-c", "proxy", "--tail", "1"])
            .output()
            .expect("kubectl runs")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "last line\n");
}
