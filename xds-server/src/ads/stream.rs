//! One ADS stream: reads requests, folds them into the [`StreamState`], and writes the
//! responses due for the proxy's current snapshot. The wire variants (SotW, delta) differ
//! only in how requests are read and responses encoded ([`Wire`]).

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use super::snapshot::{short_name, type_index, Snapshot};
use super::tracker::{Outgoing, Protocol, RequestOutcome, StreamState};
use super::wire::{DeltaResponse, SotwResponse};
use crate::bounds;
use crate::push::ProxyHandle;

/// Request and response encoding of one ADS variant.
pub trait Wire: Send + 'static {
    type Req: prost::Message + Default + Send + 'static;
    /// Holds the shared resources; encoded straight into the frame ([`super::wire`]).
    type Resp: super::wire::Parts + Send + Unpin + 'static;
    const PROTOCOL: Protocol;
    fn node(req: &Self::Req) -> Option<&Node>;
    fn fold(state: &mut StreamState, req: &Self::Req) -> RequestOutcome;
    fn encode(out: Outgoing) -> Self::Resp;
}

/// State of the world.
pub enum Sotw {}

impl Wire for Sotw {
    type Req = DiscoveryRequest;
    type Resp = SotwResponse;
    const PROTOCOL: Protocol = Protocol::Sotw;

    fn node(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn fold(state: &mut StreamState, req: &DiscoveryRequest) -> RequestOutcome {
        state.on_sotw_request(
            &req.type_url,
            &req.response_nonce,
            &req.version_info,
            &req.resource_names,
            req.error_detail
                .as_ref()
                .map(|e| bounds::clip(&e.message, bounds::NACK_MESSAGE))
                .as_deref(),
        )
    }

    fn encode(out: Outgoing) -> SotwResponse {
        SotwResponse {
            version_info: out.version,
            resources: out.resources,
            type_url: out.type_url,
            nonce: out.nonce,
        }
    }
}

/// Incremental.
pub enum Delta {}

impl Wire for Delta {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaResponse;
    const PROTOCOL: Protocol = Protocol::Delta;

    fn node(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn fold(state: &mut StreamState, req: &DeltaDiscoveryRequest) -> RequestOutcome {
        state.on_delta_request(
            &req.type_url,
            &req.response_nonce,
            &req.resource_names_subscribe,
            &req.resource_names_unsubscribe,
            &req.initial_resource_versions,
            req.error_detail
                .as_ref()
                .map(|e| bounds::clip(&e.message, bounds::NACK_MESSAGE))
                .as_deref(),
        )
    }

    fn encode(out: Outgoing) -> DeltaResponse {
        DeltaResponse {
            system_version_info: out.version,
            resources: out.resources.into_list(),
            type_url: out.type_url,
            nonce: out.nonce,
            removed_resources: out.removed,
        }
    }
}

fn note(handle: &ProxyHandle, outcome: &RequestOutcome) {
    let proxy = handle.node().id.as_str();
    match outcome {
        RequestOutcome::Nack { type_url, nack } => {
            let name = type_index(type_url).map(short_name).unwrap_or("unknown");
            handle.hub().metrics().nacked(name);
            tracing::warn!(proxy, r#type = name, version = %nack.version, error = %nack.message, "proxy rejected config");
        }
        RequestOutcome::Ack { type_url, version } => {
            tracing::debug!(proxy, r#type = %type_url, %version, "ACK");
        }
        RequestOutcome::UnknownType(t) => {
            tracing::debug!(proxy, r#type = %t, "request for a type this server does not serve");
        }
        RequestOutcome::Stale | RequestOutcome::Subscribe { .. } => {}
    }
}

/// Runs one stream until the proxy leaves, the server shuts down or the sink closes.
pub async fn run_stream<W: Wire>(
    mut handle: ProxyHandle,
    first: W::Req,
    mut inbound: Streaming<W::Req>,
    tx: mpsc::Sender<Result<W::Resp, Status>>,
    mut shutdown: watch::Receiver<bool>,
    vhds: bool,
) {
    let mut state = StreamState::new(W::PROTOCOL);
    if vhds {
        state = state.with_vhds();
    }
    note(&handle, &W::fold(&mut state, &first));
    let hub = Arc::clone(handle.hub());
    let namespace = handle.node().namespace.clone();
    // Nothing is answered before the push loop rendered this proxy's config (it does once the
    // sources synced): an empty config would tear proxies down.
    let mut snapshot: Option<Arc<Snapshot>> = None;
    loop {
        if let Some(snap) = &snapshot {
            let responses = state.next_responses(snap);
            let sent_any = !responses.is_empty();
            for out in responses {
                let latency = Instant::now().saturating_duration_since(out.changed_at);
                let name = type_index(out.type_url)
                    .map(short_name)
                    .unwrap_or("unknown");
                if tx.send(Ok(W::encode(out))).await.is_err() {
                    return;
                }
                hub.metrics().pushed(name, latency.as_secs_f64());
            }
            if sent_any {
                handle.publish(&state);
            }
        }
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(req)) => {
                    note(&handle, &W::fold(&mut state, &req));
                    handle.publish(&state);
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(proxy = %handle.node().id, %status, "stream ended");
                    let answer = super::request_error(status);
                    if answer.code() == tonic::Code::InvalidArgument {
                        let _ = tx.send(Err(answer)).await;
                    }
                    break;
                }
            },
            changed = handle.snapshot.changed() => {
                if changed.is_err() {
                    break;
                }
                let next = Arc::clone(&handle.snapshot.borrow_and_update());
                if next.epoch.is_some() {
                    snapshot = Some(next);
                }
            }
            () = hub.namespace_left(&namespace) => {
                // Its namespace left the tenant: the proxy is not this tenant's any more
                // (a namespace that moved to another revision of the tenant stays a member).
                let message = format!(
                    "namespace {:?} is no longer a member of tenant {:?}; this proxy is not served",
                    namespace,
                    hub.tenant()
                );
                tracing::info!(proxy = %handle.node().id, "namespace left the tenant: closing the stream");
                let _ = tx.send(Err(Status::permission_denied(message))).await;
                break;
            }
            () = shutting_down(&mut shutdown) => {
                let _ = tx.send(Err(Status::unavailable("xds-server shutting down"))).await;
                break;
            }
        }
    }
    tracing::info!(proxy = %handle.node().id, "proxy disconnected");
}

/// Resolves when the server starts shutting down (or its shutdown sender is gone).
pub(crate) async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}
