//! One ADS stream: reads requests, folds them into the [`StreamState`], and writes the
//! responses due for the proxy's current snapshot. The wire variants (SotW, delta) differ
//! only in how requests are read and responses encoded ([`Wire`], the codec).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use super::budget::StreamBudget;
use super::codec::Wire;
use super::protocol::{RequestOutcome, StreamState};
use super::snapshot::{short_name, type_index, Snapshot};
pub(crate) use crate::push::push_loop::shutting_down;
use crate::push::ProxyHandle;

/// A request the server could not read: the client's fault, answered INVALID_ARGUMENT
/// (tonic reports undecodable messages as INTERNAL). Transport errors pass unchanged.
pub(crate) fn request_error(status: Status) -> Status {
    match status.code() {
        tonic::Code::Internal | tonic::Code::OutOfRange => Status::invalid_argument(format!(
            "undecodable request: {}",
            crate::bounds::echo(status.message())
        )),
        _ => status,
    }
}

/// Charges what folding `req` would make `state` hold to `budget`; refused: the status that
/// ends the stream.
pub(crate) fn admit<W: Wire>(
    budget: &mut StreamBudget,
    state: &StreamState,
    req: &W::Req,
) -> Result<(), Status> {
    match W::prospect(state, req) {
        Some(p) => budget.admit(&p).map_err(|e| e.to_status()),
        None => Ok(()),
    }
}

fn note(handle: &ProxyHandle, outcome: &RequestOutcome) {
    let proxy = handle.node().id.as_str();
    match outcome {
        RequestOutcome::Nack { type_url, nack } => {
            let name = type_index(type_url).map(short_name).unwrap_or("unknown");
            handle.hub().metrics().nacked(name);
            crate::budgeted!(crate::log_budget::PROTOCOL, warn, proxy, r#type = name, version = %nack.version, error = %nack.message, "proxy rejected config");
        }
        RequestOutcome::Ack { type_url, version } => {
            tracing::debug!(proxy, r#type = %type_url, %version, "ACK");
        }
        RequestOutcome::UnknownType(t) => {
            // Not answered (as the xDS spec allows for a type the server does not know), but
            // counted and said, so a client waiting for it can be found.
            handle.hub().metrics().unknown_type_request();
            crate::budgeted!(crate::log_budget::PROTOCOL, warn, proxy, r#type = %crate::bounds::echo(t), "request for a type this server does not serve; not answered");
        }
        RequestOutcome::Stale | RequestOutcome::Subscribe { .. } => {}
    }
}

/// What one stream's client may make it hold and send.
pub struct Allowances {
    /// What its requests may make it hold; it already admitted the first request.
    pub budget: StreamBudget,
    /// The responses its own requests may cause.
    pub pacing: super::pacing::Pacing,
}

/// Runs one stream until the proxy leaves, the server shuts down or the sink closes.
///
/// `state` is the stream's new state.
pub async fn run_stream<W: Wire>(
    mut handle: ProxyHandle,
    mut state: StreamState,
    allowances: Allowances,
    first: W::Req,
    mut inbound: Streaming<W::Req>,
    tx: mpsc::Sender<Result<W::Resp, Status>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Allowances {
        mut budget,
        mut pacing,
    } = allowances;
    note(&handle, &W::fold(&mut state, &first));
    budget.settle(&state);
    drop(first);
    let hub = Arc::clone(handle.hub());
    let namespace = handle.node().namespace.clone();
    // Nothing is answered before the push loop rendered this proxy's config (it does once the
    // sources synced): an empty config would tear proxies down.
    let mut snapshot: Option<Arc<Snapshot>> = None;
    // Whether requests of the client were folded since the last responses were computed: the
    // responses they cause are paced (the first request's included).
    let mut client_caused = true;
    loop {
        let paced_until = if client_caused {
            pacing.wait(Instant::now())
        } else {
            None
        };
        if paced_until.is_some() && snapshot.is_some() {
            hub.metrics().paced_response();
        }
        if let (Some(snap), None) = (&snapshot, paced_until) {
            let rejected_before = state.rejected_mask();
            let responses = state.next_responses(snap);
            if client_caused {
                pacing.charge(responses.len(), Instant::now());
                client_caused = false;
            }
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
            if sent_any || state.rejected_mask() != rejected_before {
                handle.publish(&state);
            }
        }
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(req)) => {
                    if let Err(status) = admit::<W>(&mut budget, &state, &req) {
                        crate::budgeted!(crate::log_budget::CONNECTIONS, warn, proxy = %handle.node().id, error = %status.message(), "stream over its budget: closing it");
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                    note(&handle, &W::fold(&mut state, &req));
                    budget.settle(&state);
                    handle.publish(&state);
                    client_caused = true;
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(proxy = %handle.node().id, %status, "stream ended");
                    let answer = request_error(status);
                    if answer.code() == tonic::Code::InvalidArgument
                        || super::budget::BudgetError::of(&answer).is_some()
                    {
                        let _ = tx.send(Err(answer)).await;
                    }
                    break;
                }
            },
            () = crate::timer::sleep_until_opt(paced_until) => {}
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
    crate::budgeted!(crate::log_budget::CONNECTIONS, info, proxy = %handle.node().id, "proxy disconnected");
}
