//! `pods/<name>/portforward` over WebSocket, driven by kube-rs's `Api::portforward` (the client
//! meshctl uses): authorization, the pod's state, the framing, and errors from the node.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use meshplane_kube_standin::{
    Identity, PodConnector, PodRef, StandIn, StandInHandle, StandInOptions,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bound for anything a test awaits; reached only when the behaviour is broken.
const DEADLINE: Duration = Duration::from_secs(20);

/// A port no pod in these tests listens on: the node refuses it.
const CLOSED_PORT: u16 = 9;

/// A stand-in whose node answers every forwarded port with a one-shot echo server on loopback
/// (it replies `pong:<what it read>` and closes), recording which pod and port were asked for.
async fn standin_with_echo_node() -> (StandInHandle, Arc<Mutex<Vec<(PodRef, u16)>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&asked);
    let connector = PodConnector::new(move |pod: PodRef, port: u16| {
        let seen = Arc::clone(&seen);
        async move {
            seen.lock().unwrap().push((pod, port));
            if port == CLOSED_PORT {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "connection refused",
                ));
            }
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            tokio::spawn(async move {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 64];
                let n = conn.read(&mut buf).await.unwrap();
                let mut reply = b"pong:".to_vec();
                reply.extend_from_slice(&buf[..n]);
                conn.write_all(&reply).await.unwrap();
            });
            tokio::net::TcpStream::connect(addr).await
        }
    });
    let handle = StandIn::start(StandInOptions {
        pod_connector: connector,
        ..StandInOptions::default()
    })
    .await
    .unwrap();
    (handle, asked)
}

/// A pod `web` in `default`, in phase `phase`.
async fn pod(client: &kube::Client, phase: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase, "podIP": "198.18.0.10"}})),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn bytes_travel_both_ways_to_the_pods_port() {
    let (handle, asked) = standin_with_echo_node().await;
    let admin = handle.client(&Identity::Admin).await.unwrap();
    let created = pod(&admin, "Running").await;
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let mut forwarder = pods.portforward("web", &[15000]).await.unwrap();
    let mut stream = forwarder.take_stream(15000).unwrap();
    stream.write_all(b"ping").await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut reply))
        .await
        .expect("the pod's end closes the forward")
        .unwrap();
    assert_eq!(reply, b"pong:ping");
    // The server closed the WebSocket once the pod's end closed, so the client's task ends
    // when it lets go of its stream (kube-rs then reports its own late Close frame as an
    // error, as against a kubelet).
    drop(stream);
    let _ = tokio::time::timeout(DEADLINE, forwarder.join())
        .await
        .expect("the forward ends");
    let asked = asked.lock().unwrap().clone();
    assert_eq!(
        asked,
        [(
            PodRef {
                namespace: "default".into(),
                name: "web".into(),
                uid: created.metadata.uid.unwrap(),
            },
            15000
        )]
    );
}

#[tokio::test]
async fn a_port_the_node_cannot_reach_reports_on_its_error_channel() {
    let (handle, _) = standin_with_echo_node().await;
    let admin = handle.client(&Identity::Admin).await.unwrap();
    pod(&admin, "Running").await;
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let mut forwarder = pods.portforward("web", &[CLOSED_PORT]).await.unwrap();
    let error = forwarder.take_error(CLOSED_PORT).unwrap();
    let message = tokio::time::timeout(DEADLINE, error)
        .await
        .expect("an error arrives")
        .expect("an error message");
    assert!(
        message.contains(&format!(
            "error forwarding port {CLOSED_PORT} to pod default/web"
        )) && message.contains("connection refused"),
        "{message}"
    );
}

#[tokio::test]
async fn only_running_pods_and_callers_allowed_to_create_pods_portforward_are_served() {
    let (handle, asked) = standin_with_echo_node().await;
    let admin = handle.client(&Identity::Admin).await.unwrap();
    pod(&admin, "Pending").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    assert!(pods.portforward("web", &[15000]).await.is_err());

    pods.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    // A ServiceAccount with no RBAC may not forward.
    let stranger = handle
        .client(&Identity::ServiceAccount {
            namespace: "default".into(),
            name: "stranger".into(),
        })
        .await
        .unwrap();
    let theirs: Api<Pod> = Api::namespaced(stranger.clone(), "default");
    assert!(theirs.portforward("web", &[15000]).await.is_err());
    // `get` on pods/portforward is not enough: WebSocket upgrades need `create`.
    let rbac = |verb: &str| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "forward", "namespace": "default"},
            "rules": [{"apiGroups": [""], "resources": ["pods/portforward"], "verbs": [verb]}],
        })
    };
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(admin.clone(), "default");
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(rbac("get")).unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(admin.clone(), "default");
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "forward", "namespace": "default"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "forward"},
                "subjects": [{"kind": "ServiceAccount", "name": "stranger", "namespace": "default"}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    assert!(theirs.portforward("web", &[15000]).await.is_err());
    roles
        .replace(
            "forward",
            &PostParams::default(),
            &serde_json::from_value(rbac("create")).unwrap(),
        )
        .await
        .unwrap();
    let mut forwarder = theirs.portforward("web", &[15000]).await.unwrap();
    let mut stream = forwarder.take_stream(15000).unwrap();
    stream.write_all(b"hi").await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut reply))
        .await
        .expect("the pod's end closes the forward")
        .unwrap();
    assert_eq!(reply, b"pong:hi");
    // Only the allowed request reached the node.
    assert_eq!(asked.lock().unwrap().len(), 1);
}
