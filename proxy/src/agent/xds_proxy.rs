//! Envoy's ADS carried to the instance over TLS.
//!
//! Envoy opens its ADS stream on the agent's Unix socket, in plaintext inside the pod. For
//! each such stream the agent opens a TLS connection to the instance (verified against the
//! trust bundle on disk and the instance Service's name) and a stream on it carrying the token
//! on disk at that moment, then forwards messages both ways. When either side ends, the other
//! is ended with the same status, so Envoy reconnects and the next upstream stream presents
//! the token the kubelet last wrote: a proxy keeps working for as long as its pod lives.

use std::pin::Pin;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::{Stream, StreamExt};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::sync::watch;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use super::instance::Instance;

/// xDS responses can be large (every cluster of a big mesh); the limit is on a message as
/// decompressed.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The ADS service Envoy talks to.
#[derive(Clone)]
pub struct XdsProxy {
    instance: Instance,
}

impl XdsProxy {
    pub fn new(instance: Instance) -> Self {
        Self { instance }
    }

    async fn upstream(&self) -> Result<AggregatedDiscoveryServiceClient<Channel>, Status> {
        let channel = self.instance.connect().await.map_err(|e| {
            tracing::warn!(error = %e, "cannot reach the instance for ADS");
            Status::from(e)
        })?;
        // The instance compresses large responses for clients that accept zstd: a SotW push
        // of a big tenant shrinks several times on the wire (contract 11).
        Ok(AggregatedDiscoveryServiceClient::new(channel)
            .accept_compressed(CompressionEncoding::Zstd)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// The downstream requests as an upstream request stream (ending at the first error) with
    /// the token on disk now. A task pumps them through a channel, which keeps the upstream
    /// request stream `Sync` as tonic's client wants it.
    fn forward<T>(&self, mut inbound: Streaming<T>) -> Result<Request<ReceiverStream<T>>, Status>
    where
        T: Send + 'static,
        Streaming<T>: Stream<Item = Result<T, Status>> + Unpin + Send,
    {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(Ok(message)) = inbound.next().await {
                if tx.send(message).await.is_err() {
                    return;
                }
            }
        });
        let mut request = Request::new(ReceiverStream::new(rx));
        self.instance.authorize(&mut request)?;
        Ok(request)
    }
}

/// Keeps the channel (and so the TLS connection) alive as long as the response stream.
fn tethered<T: Send + 'static>(
    responses: Streaming<T>,
    channel_owner: AggregatedDiscoveryServiceClient<Channel>,
) -> Boxed<T>
where
    Streaming<T>: Stream<Item = Result<T, Status>> + Send,
{
    Box::pin(responses.map(move |item| {
        let _keep = &channel_owner;
        if let Err(status) = &item {
            tracing::info!(code = ?status.code(), message = %status.message(), "the instance ended the ADS stream");
        }
        item
    }))
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsProxy {
    type StreamAggregatedResourcesStream = Boxed<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Boxed<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        tracing::info!("Envoy opened an ADS stream (SotW)");
        let mut client = self.upstream().await?;
        let upstream_request = self.forward(request.into_inner())?;
        let responses = client
            .stream_aggregated_resources(upstream_request)
            .await
            .inspect_err(|s| tracing::warn!(code = ?s.code(), message = %s.message(), "the instance refused the ADS stream"))?
            .into_inner();
        tracing::info!(target = %self.instance.upstream.target, "ADS stream carried to the instance (SotW)");
        Ok(Response::new(tethered(responses, client)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        tracing::info!("Envoy opened an ADS stream (delta)");
        let mut client = self.upstream().await?;
        let upstream_request = self.forward(request.into_inner())?;
        let responses = client
            .delta_aggregated_resources(upstream_request)
            .await
            .inspect_err(|s| tracing::warn!(code = ?s.code(), message = %s.message(), "the instance refused the ADS stream"))?
            .into_inner();
        tracing::info!(target = %self.instance.upstream.target, "ADS stream carried to the instance (delta)");
        Ok(Response::new(tethered(responses, client)))
    }
}

/// Serves the ADS proxy on `listener` until `stop`.
pub async fn serve(listener: UnixListener, instance: Instance, mut stop: watch::Receiver<bool>) {
    let result = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(
            AggregatedDiscoveryServiceServer::new(XdsProxy::new(instance))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "ADS proxy stopped");
    }
}
