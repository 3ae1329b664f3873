//! The Aggregated Discovery Service: admission of each stream, then one task per stream that
//! runs the protocol state machine ([`tracker`]) against the proxy's snapshots.

#[cfg(test)]
mod dependency_order;
pub mod snapshot;
pub mod stream;
pub mod tracker;
#[cfg(test)]
mod tracker_model;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::model::ProxyNode;
use crate::push::Hub;
use crate::tenancy::{bearer_token, parse_node, AdmissionError, TokenReviewer};
use stream::{run_stream, Delta, Sotw, Wire};

/// How long a stream waits for the sources to sync before it is told to come back later.
const SYNC_WAIT: Duration = Duration::from_secs(10);
/// Responses buffered per stream before the stream task waits for the proxy to read.
const STREAM_BUFFER: usize = 16;

/// The ADS gRPC service of one tenant revision.
#[derive(Clone)]
pub struct AdsServer {
    hub: Arc<Hub>,
    reviewer: Option<TokenReviewer>,
    shutdown: watch::Receiver<bool>,
}

impl AdsServer {
    /// `reviewer`: Kubernetes mode verifies proxy tokens; `None` trusts node metadata
    /// (directory mode). Streams end when `shutdown` turns true.
    pub fn new(
        hub: Arc<Hub>,
        reviewer: Option<TokenReviewer>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            hub,
            reviewer,
            shutdown,
        }
    }

    /// The tonic service to mount on a server.
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<Self> {
        AggregatedDiscoveryServiceServer::new(self).max_decoding_message_size(16 * 1024 * 1024)
    }

    /// Serves ADS on `listener` until `shutdown` turns true (streams end first, so the server
    /// can drain).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
    ) -> Result<(), tonic::transport::Error> {
        let mut shutdown = self.shutdown.clone();
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(self.into_service())
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async move { stream::shutting_down(&mut shutdown).await },
            )
            .await
    }

    async fn admit(&self, node: Option<&Node>, token: Option<String>) -> Result<ProxyNode, Status> {
        let result = self.check(node, token).await;
        if let Err(e) = &result {
            self.hub.metrics().rejected(e.reason());
            tracing::warn!(node = node.map(|n| n.id.as_str()), error = %e, "refused ADS stream");
        }
        result.map_err(|e| e.to_status())
    }

    async fn check(
        &self,
        node: Option<&Node>,
        token: Option<String>,
    ) -> Result<ProxyNode, AdmissionError> {
        let proxy = parse_node(node, self.hub.tenant())?;
        if let Some(reviewer) = &self.reviewer {
            let token = token.ok_or(AdmissionError::MissingToken)?;
            reviewer.verify(&token, &proxy).await?;
        }
        // Membership is only known once the sources synced.
        if tokio::time::timeout(SYNC_WAIT, self.hub.wait_ready())
            .await
            .is_err()
        {
            return Err(AdmissionError::NotSynced);
        }
        if !self.hub.admits_namespace(&proxy.namespace) {
            return Err(AdmissionError::NotMember {
                namespace: proxy.namespace,
                tenant: self.hub.tenant().to_string(),
                revision: self.hub.revision().to_string(),
            });
        }
        Ok(proxy)
    }

    async fn open<W: Wire>(
        &self,
        request: Request<Streaming<W::Req>>,
    ) -> Result<ReceiverStream<Result<W::Resp, Status>>, Status> {
        let token = bearer_token(request.metadata());
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("stream closed before its first request"))?;
        let node = self.admit(W::node(&first), token).await?;
        tracing::info!(proxy = %node.id, namespace = %node.namespace, protocol = W::PROTOCOL.as_str(), "proxy connected");
        let handle = self.hub.connect(node, W::PROTOCOL);
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(run_stream::<W>(
            handle,
            first,
            inbound,
            tx,
            self.shutdown.clone(),
        ));
        Ok(ReceiverStream::new(rx))
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.open::<Sotw>(request).await.map(Response::new)
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.open::<Delta>(request).await.map(Response::new)
    }
}
