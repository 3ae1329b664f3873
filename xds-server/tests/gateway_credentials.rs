//! Gateway TLS credentials against the Kubernetes API stand-in: who a gateway proxy is comes
//! from its token (TokenReview), what it may read from RBAC (SubjectAccessReview). A pod that
//! claims to be the tenant's gateway and carries its labels, but whose ServiceAccount may not
//! read the credential Secret, gets the Gateway's other servers and no private key; the gateway
//! whose ServiceAccount a Role lets read the Secret gets it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Struct, Value};
use meshplane_crds::MeshConfig;
use meshplane_kube_standin::{Identity, StandIn, StandInHandle, StandInOptions};
use meshplane_xds::ads::AdsServer;
use meshplane_xds::credential_access::{self, CredentialAccess};
use meshplane_xds::index::TenantIndex;
use meshplane_xds::metrics::Metrics;
use meshplane_xds::model::{type_url, SourceEvent};
use meshplane_xds::push::{run_push_loop, DebounceConfig, Hub, Pusher};
use meshplane_xds::source_dir::objects_from_yaml;
use meshplane_xds::tenancy::TokenReviewer;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

const TENANT: &str = "acme";
const CONTROL_NS: &str = "meshplane-acme";
const AUDIENCE: &str = "meshplane-acme";
const DEADLINE: Duration = Duration::from_secs(10);
const PRIVATE_KEY: &[u8] = b"PRIVATE-KEY-OF-SHOP";

/// The tenant's config: a Gateway with a plain HTTP server and an HTTPS server whose
/// certificate is the Secret `shop-cert`, and two pods with the gateway's labels.
const CONFIG: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: meshplane-acme}
---
apiVersion: v1
kind: Pod
metadata: {name: gw-1, namespace: meshplane-acme, labels: {meshplane.io/gateway: ingressgateway}}
spec: {serviceAccountName: ingressgateway, containers: [{name: proxy, image: proxy}]}
---
apiVersion: v1
kind: Pod
metadata: {name: evil-1, namespace: meshplane-acme, labels: {meshplane.io/gateway: ingressgateway}}
spec: {serviceAccountName: impostor, containers: [{name: proxy, image: proxy}]}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: Gateway
metadata: {name: public, namespace: meshplane-acme}
spec:
  selector: {meshplane.io/gateway: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*"]
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: [shop.example.com]
    tls: {mode: SIMPLE, credentialName: shop-cert}
---
apiVersion: v1
kind: Secret
metadata: {name: shop-cert, namespace: meshplane-acme}
type: kubernetes.io/tls
stringData: {tls.crt: CERTIFICATE-OF-SHOP, tls.key: PRIVATE-KEY-OF-SHOP}
"#;

async fn create<K>(client: &kube::Client, namespace: Option<&str>, body: serde_json::Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: kube::Api<K> = kube::Api::namespaced(client.clone(), namespace.unwrap_or(CONTROL_NS));
    let obj: K = serde_json::from_value(body).expect("object");
    api.create(&Default::default(), &obj).await.expect("create");
}

async fn create_cluster<K>(client: &kube::Client, body: serde_json::Value)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: kube::Api<K> = kube::Api::all(client.clone());
    let obj: K = serde_json::from_value(body).expect("object");
    api.create(&Default::default(), &obj).await.expect("create");
}

/// The cluster: the control namespace with the gateway's and the impostor's ServiceAccounts, a
/// Role letting the gateway's read `shop-cert`, and the instance's ServiceAccount with what
/// the operator grants it cluster-wide (TokenReview and SubjectAccessReview create).
async fn cluster() -> StandInHandle {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let standin = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let admin = standin.client(&Identity::Admin).await.expect("admin");
    create_cluster::<Namespace>(
        &admin,
        serde_json::json!({"metadata": {"name": CONTROL_NS}}),
    )
    .await;
    for sa in ["ingressgateway", "impostor", "meshplane-acme-v1"] {
        create::<ServiceAccount>(&admin, None, serde_json::json!({"metadata": {"name": sa}})).await;
    }
    create::<Role>(
        &admin,
        None,
        serde_json::json!({"metadata": {"name": "gateway-credentials"},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["shop-cert"], "verbs": ["get"]}]}),
    )
    .await;
    create::<RoleBinding>(
        &admin,
        None,
        serde_json::json!({"metadata": {"name": "gateway-credentials"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gateway-credentials"},
            "subjects": [{"kind": "ServiceAccount", "name": "ingressgateway", "namespace": CONTROL_NS}]}),
    )
    .await;
    create_cluster::<ClusterRole>(
        &admin,
        serde_json::json!({"metadata": {"name": "meshplane-acme-v1"},
            "rules": [
                {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
            ]}),
    )
    .await;
    create_cluster::<ClusterRoleBinding>(
        &admin,
        serde_json::json!({"metadata": {"name": "meshplane-acme-v1"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "meshplane-acme-v1"},
            "subjects": [{"kind": "ServiceAccount", "name": "meshplane-acme-v1", "namespace": CONTROL_NS}]}),
    )
    .await;
    standin
}

struct Instance {
    addr: std::net::SocketAddr,
    hub: Arc<Hub>,
    _shutdown: watch::Sender<bool>,
}

/// An instance as Kubernetes mode wires it, with the instance's own credentials.
async fn instance(standin: &StandInHandle) -> Instance {
    let client = standin
        .client(&Identity::ServiceAccount {
            namespace: CONTROL_NS.into(),
            name: "meshplane-acme-v1".into(),
        })
        .await
        .expect("instance client");
    let access = CredentialAccess::new();
    let mut index = TenantIndex::new(TENANT, "acme-v1", CONTROL_NS, MeshConfig::default())
        .with_credential_access(Arc::clone(&access));
    for obj in objects_from_yaml("config.yaml", CONFIG) {
        index.apply(SourceEvent::Upsert(obj));
    }
    let hub = Hub::new(TENANT, "acme-v1", CONTROL_NS, Arc::new(Metrics::new()));
    let pusher = Pusher::new(Arc::clone(&hub), Box::new(index));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (events, events_rx) = mpsc::channel(64);
    let debounce = DebounceConfig {
        quiet: Duration::from_millis(1),
        max: Duration::from_millis(5),
        isolated_quiet: Duration::from_millis(1),
    };
    tokio::spawn(run_push_loop(
        pusher,
        events_rx,
        debounce,
        shutdown_rx.clone(),
    ));
    tokio::spawn(credential_access::run(
        Arc::clone(&access),
        client.clone(),
        Arc::clone(&hub),
        events.clone(),
        shutdown_rx.clone(),
    ));
    events.send(SourceEvent::Ready).await.expect("push loop");
    tokio::time::timeout(DEADLINE, hub.wait_ready())
        .await
        .expect("ready");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let ads = AdsServer::new(
        Arc::clone(&hub),
        Some(TokenReviewer::new(client, AUDIENCE)),
        shutdown_rx,
    )
    .with_credential_access(Some(access));
    tokio::spawn(ads.serve(listener));
    Instance {
        addr,
        hub,
        _shutdown: shutdown,
    }
}

fn router(pod: &str, ip: &str) -> Node {
    Node {
        id: format!("router~{ip}~{pod}.{CONTROL_NS}~{CONTROL_NS}.svc.cluster.local"),
        cluster: "ingressgateway".into(),
        metadata: Some(Struct {
            fields: [(
                "NAMESPACE".to_string(),
                Value {
                    kind: Some(ValueKind::StringValue(CONTROL_NS.into())),
                },
            )]
            .into_iter()
            .collect(),
        }),
        ..Default::default()
    }
}

/// The listeners the instance first serves to `node` presenting `token`: subscribes to
/// clusters and listeners and acknowledges each response until listeners come.
async fn first_listeners(addr: std::net::SocketAddr, node: Node, token: &str) -> Vec<Listener> {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(8);
    for (i, type_url) in [type_url::CLUSTER, type_url::LISTENER]
        .into_iter()
        .enumerate()
    {
        tx.send(DiscoveryRequest {
            node: (i == 0).then(|| node.clone()),
            type_url: type_url.into(),
            ..Default::default()
        })
        .await
        .expect("queue");
    }
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    let mut stream = client
        .stream_aggregated_resources(request)
        .await
        .expect("admitted")
        .into_inner();
    loop {
        let response = tokio::time::timeout(DEADLINE, stream.message())
            .await
            .expect("a response before the deadline")
            .expect("stream ok")
            .expect("stream open");
        if response.type_url == type_url::LISTENER {
            return response
                .resources
                .iter()
                .map(|any| Listener::decode(any.value.as_slice()).expect("a listener"))
                .collect();
        }
        tx.send(DiscoveryRequest {
            type_url: response.type_url.clone(),
            version_info: response.version_info.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        })
        .await
        .expect("ack");
    }
}

fn carries(listeners: &[Listener], bytes: &[u8]) -> bool {
    listeners
        .iter()
        .map(Message::encode_to_vec)
        .any(|l| l.windows(bytes.len()).any(|w| w == bytes))
}

fn names(listeners: &[Listener]) -> BTreeSet<String> {
    listeners.iter().map(|l| l.name.clone()).collect()
}

#[tokio::test]
async fn a_pod_claiming_to_be_the_gateway_gets_no_private_key_its_service_account_cannot_read() {
    let standin = cluster().await;
    let instance = instance(&standin).await;
    let token = |account: &str| {
        standin.issue_service_account_token(CONTROL_NS, account, &[AUDIENCE], DEADLINE * 6)
    };

    // Same namespace, same labels, a router node id: only the ServiceAccount differs.
    let impostor = first_listeners(
        instance.addr,
        router("evil-1", "198.18.0.6"),
        &token("impostor"),
    )
    .await;
    assert!(
        !carries(&impostor, PRIVATE_KEY),
        "the impostor got the private key: {:?}",
        names(&impostor)
    );
    assert_eq!(
        names(&impostor),
        BTreeSet::from(["0.0.0.0_80".to_string()]),
        "the Gateway's other server is still served to it"
    );

    let gateway = first_listeners(
        instance.addr,
        router("gw-1", "198.18.0.5"),
        &token("ingressgateway"),
    )
    .await;
    assert!(
        carries(&gateway, PRIVATE_KEY),
        "the gateway's first config has its certificate: {:?}",
        names(&gateway)
    );
    assert_eq!(
        names(&gateway),
        BTreeSet::from(["0.0.0.0_80".to_string(), "0.0.0.0_443".to_string()])
    );

    let metrics = instance.hub.metrics().encode().expect("metrics");
    for line in [
        r#"meshplane_xds_credential_reviews_total{result="denied"} 1"#,
        r#"meshplane_xds_credential_reviews_total{result="allowed"} 1"#,
        "meshplane_xds_credentials_refused 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}
