//! Shared harness of the ADS protocol tests: an in-process server over a generator whose
//! per-namespace configs the test sets directly, and tonic clients for both ADS variants.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Struct, Value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshplane_xds::ads::AdsServer;
use meshplane_xds::metrics::Metrics;
use meshplane_xds::model::{type_url, ProxyConfig, ProxyNode, Resource, SourceEvent};
use meshplane_xds::outputs::{IndexWatch, Outputs};
use meshplane_xds::push::{run_push_loop, Change, ConfigGenerator, DebounceConfig, Hub, Pusher};
use meshplane_xds_core::testing::mk_resource;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

pub const TENANT: &str = "blue";
/// Upper bound on waiting for one message: a deadline, not a pacing sleep.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Configs by proxy namespace, set by the test.
#[derive(Clone, Default)]
pub struct Configs(pub Arc<Mutex<BTreeMap<String, ProxyConfig>>>);

struct TestGenerator {
    configs: Configs,
    outputs: Outputs,
    /// Every node rendered for, as the server admitted it.
    rendered: Arc<Mutex<Vec<ProxyNode>>>,
}

impl ConfigGenerator for TestGenerator {
    /// Every event but `Ready` means "the configs changed" (see [`Harness::set`]).
    fn apply(&mut self, event: SourceEvent) -> Change {
        match event {
            SourceEvent::Ready => Change::default(),
            SourceEvent::Members(members) => {
                self.outputs.publish_members(members);
                Change {
                    members_changed: true,
                    ..Change::config()
                }
            }
            _ => Change::config(),
        }
    }
    fn render(&self, node: &ProxyNode) -> Arc<ProxyConfig> {
        self.rendered
            .lock()
            .expect("rendered lock")
            .push(node.clone());
        let configs = self.configs.0.lock().expect("configs lock");
        Arc::new(configs.get(&node.namespace).cloned().unwrap_or_default())
    }
    fn watch(&self) -> IndexWatch {
        self.outputs.watch()
    }
}

/// One encoded resource with a content-hash version.
pub fn res(type_url: &'static str, name: &str, body: &str) -> Arc<Resource> {
    mk_resource(type_url, name, format!("{name}:{body}"))
}

/// A config with one resource per type (cluster `c1`, endpoints `c1`, listener `l1`, route `r1`).
pub fn config(tag: &str) -> ProxyConfig {
    ProxyConfig {
        clusters: vec![res(type_url::CLUSTER, "c1", tag)],
        endpoints: vec![res(type_url::ENDPOINT, "c1", tag)],
        listeners: vec![res(type_url::LISTENER, "l1", tag)],
        routes: vec![res(type_url::ROUTE, "r1", tag)],
        vhds: None,
    }
}

pub struct Harness {
    pub hub: Arc<Hub>,
    pub configs: Configs,
    rendered: Arc<Mutex<Vec<ProxyNode>>>,
    pub addr: std::net::SocketAddr,
    events: mpsc::Sender<SourceEvent>,
    shutdown: watch::Sender<bool>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

impl Harness {
    /// A ready server whose tenant has member namespaces `shop` and `bank`.
    pub async fn start() -> Harness {
        Self::start_with(None).await
    }

    /// Like [`Harness::start`], verifying proxy tokens with `reviewer` (Kubernetes mode).
    pub async fn start_with(reviewer: Option<meshplane_xds::tenancy::TokenReviewer>) -> Harness {
        Self::start_limited(reviewer, meshplane_xds::ads::AdsLimits::default()).await
    }

    /// Like [`Harness::start_with`], with other input limits.
    pub async fn start_limited(
        reviewer: Option<meshplane_xds::tenancy::TokenReviewer>,
        limits: meshplane_xds::ads::AdsLimits,
    ) -> Harness {
        let configs = Configs::default();
        let rendered = Arc::new(Mutex::new(Vec::new()));
        let generator = TestGenerator {
            rendered: Arc::clone(&rendered),
            configs: configs.clone(),
            outputs: Outputs::default(),
        };
        generator
            .outputs
            .publish_members(["shop".to_string(), "bank".to_string()].into());
        let hub = Hub::new(
            TENANT,
            "blue-v1",
            "meshplane-blue",
            Arc::new(Metrics::new()),
        );
        let pusher = Pusher::new(Arc::clone(&hub), Box::new(generator));
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
        events
            .send(SourceEvent::Ready)
            .await
            .expect("push loop running");
        tokio::time::timeout(DEADLINE, hub.wait_ready())
            .await
            .expect("ready");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(
            AdsServer::new(Arc::clone(&hub), reviewer, shutdown_rx)
                .with_limits(limits)
                .serve(listener),
        );
        Harness {
            hub,
            configs,
            rendered,
            addr,
            events,
            shutdown,
        }
    }

    /// Replaces the config of `namespace` and returns once the push loop pushed it.
    pub async fn set(&self, namespace: &str, config: ProxyConfig) {
        self.configs
            .0
            .lock()
            .expect("configs lock")
            .insert(namespace.into(), config);
        let mut pushes = self.hub.pushes();
        let before = *pushes.borrow_and_update();
        // Any event tells the test generator its configs changed.
        self.events
            .send(SourceEvent::Synced)
            .await
            .expect("push loop running");
        tokio::time::timeout(DEADLINE, pushes.wait_for(|n| *n > before))
            .await
            .expect("pushed in time")
            .expect("push loop running");
    }

    /// Makes `members` the tenant's member namespaces (as a readable members ConfigMap does);
    /// returns once the push loop handled it.
    pub async fn set_members(&self, members: &[&str]) {
        let mut pushes = self.hub.pushes();
        let before = *pushes.borrow_and_update();
        self.events
            .send(SourceEvent::Members(
                members.iter().map(|m| m.to_string()).collect(),
            ))
            .await
            .expect("push loop running");
        tokio::time::timeout(DEADLINE, pushes.wait_for(|n| *n > before))
            .await
            .expect("pushed in time")
            .expect("push loop running");
    }

    /// The nodes the generator rendered for so far (what admission made of them).
    pub fn rendered_nodes(&self) -> Vec<ProxyNode> {
        self.rendered.lock().expect("rendered lock").clone()
    }

    pub async fn client(&self) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
        AggregatedDiscoveryServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }
}

pub fn node(namespace: &str, pod: &str) -> Node {
    Node {
        id: format!("sidecar~198.18.0.1~{pod}.{namespace}~{namespace}.svc.cluster.local"),
        cluster: "test".into(),
        metadata: Some(Struct {
            fields: [(
                "NAMESPACE".to_string(),
                Value {
                    kind: Some(ValueKind::StringValue(namespace.into())),
                },
            )]
            .into_iter()
            .collect(),
        }),
        ..Default::default()
    }
}

pub fn nack(message: &str) -> Option<RpcStatus> {
    Some(RpcStatus {
        code: 3,
        message: message.into(),
        details: vec![],
    })
}

/// The `grpc-encoding` of a response.
fn encoding(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    metadata
        .get("grpc-encoding")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A state-of-the-world client stream.
pub struct SotwClient {
    pub tx: mpsc::Sender<DiscoveryRequest>,
    pub rx: Streaming<DiscoveryResponse>,
    node: Node,
    /// The response's `grpc-encoding` (how its messages may be compressed).
    pub encoding: Option<String>,
}

impl SotwClient {
    /// Opens a stream whose first request subscribes to `type_url` with `names`.
    pub async fn open(
        h: &Harness,
        node: Node,
        type_url: &str,
        names: &[&str],
    ) -> Result<SotwClient, tonic::Status> {
        Self::open_on(h.client().await, node, type_url, names).await
    }

    /// Like [`SotwClient::open`], on `client`.
    pub async fn open_on(
        mut client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
        node: Node,
        type_url: &str,
        names: &[&str],
    ) -> Result<SotwClient, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(DiscoveryRequest {
            node: Some(node.clone()),
            type_url: type_url.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await
        .expect("queue first request");
        let rx = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await?;
        Ok(SotwClient {
            tx,
            encoding: encoding(rx.metadata()),
            rx: rx.into_inner(),
            node,
        })
    }

    pub async fn recv(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(DEADLINE, self.rx.message())
            .await
            .expect("response before the deadline")
            .expect("stream ok")
            .expect("stream open")
    }

    pub async fn request(&self, type_url: &str, names: &[&str], version: &str, nonce: &str) {
        self.send(type_url, names, version, nonce, None).await
    }

    pub async fn send(
        &self,
        type_url: &str,
        names: &[&str],
        version: &str,
        nonce: &str,
        error: Option<RpcStatus>,
    ) {
        self.tx
            .send(DiscoveryRequest {
                node: None,
                type_url: type_url.into(),
                resource_names: names.iter().map(|s| s.to_string()).collect(),
                version_info: version.into(),
                response_nonce: nonce.into(),
                error_detail: error,
                ..Default::default()
            })
            .await
            .expect("send request");
    }

    /// ACKs a response (keeping a wildcard subscription).
    pub async fn ack(&self, r: &DiscoveryResponse) {
        self.request(&r.type_url, &[], &r.version_info, &r.nonce)
            .await
    }

    pub fn node(&self) -> &Node {
        &self.node
    }
}

/// An incremental client stream.
pub struct DeltaClient {
    pub tx: mpsc::Sender<DeltaDiscoveryRequest>,
    pub rx: Streaming<DeltaDiscoveryResponse>,
    /// The response's `grpc-encoding` (how its messages may be compressed).
    pub encoding: Option<String>,
}

impl DeltaClient {
    pub async fn open(
        h: &Harness,
        node: Node,
        type_url: &str,
        subscribe: &[&str],
    ) -> Result<DeltaClient, tonic::Status> {
        Self::open_on(h.client().await, node, type_url, subscribe).await
    }

    /// Like [`DeltaClient::open`], on `client`.
    pub async fn open_on(
        mut client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
        node: Node,
        type_url: &str,
        subscribe: &[&str],
    ) -> Result<DeltaClient, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(DeltaDiscoveryRequest {
            node: Some(node),
            type_url: type_url.into(),
            resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await
        .expect("queue first request");
        let rx = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await?;
        Ok(DeltaClient {
            tx,
            encoding: encoding(rx.metadata()),
            rx: rx.into_inner(),
        })
    }

    pub async fn recv(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(DEADLINE, self.rx.message())
            .await
            .expect("response before the deadline")
            .expect("stream ok")
            .expect("stream open")
    }

    pub async fn send(
        &self,
        type_url: &str,
        subscribe: &[&str],
        unsubscribe: &[&str],
        nonce: &str,
        error: Option<RpcStatus>,
    ) {
        self.tx
            .send(DeltaDiscoveryRequest {
                type_url: type_url.into(),
                resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
                resource_names_unsubscribe: unsubscribe.iter().map(|s| s.to_string()).collect(),
                response_nonce: nonce.into(),
                error_detail: error,
                ..Default::default()
            })
            .await
            .expect("send request");
    }

    pub async fn ack(&self, r: &DeltaDiscoveryResponse) {
        self.send(&r.type_url, &[], &[], &r.nonce, None).await
    }
}

/// Names of the resources in a SotW response.
pub fn sotw_names(r: &DiscoveryResponse) -> Vec<String> {
    r.resources
        .iter()
        .map(|a| {
            let s = String::from_utf8_lossy(&a.value).to_string();
            s.split(':').next().unwrap_or_default().to_string()
        })
        .collect()
}

/// Bodies (`name:tag`) of the resources in a SotW response.
pub fn sotw_bodies(r: &DiscoveryResponse) -> Vec<String> {
    r.resources
        .iter()
        .map(|a| String::from_utf8_lossy(&a.value).to_string())
        .collect()
}

/// Names of the resources in a delta response.
pub fn delta_names(r: &DeltaDiscoveryResponse) -> Vec<String> {
    r.resources.iter().map(|x| x.name.clone()).collect()
}
