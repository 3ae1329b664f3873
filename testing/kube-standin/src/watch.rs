//! Watch streams: newline-delimited JSON events over a chunked response, resumable by
//! `resourceVersion`, with bookmarks, initial events, timeouts and fault injection.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use super::error::ApiError;
use super::event_views;
use super::object;
use super::query::Filter;
use super::resources::ResourceType;
use super::store::{EventKind, Store, StoredEvent};
use super::table;

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Synthetic ADDED events for current objects, then changes (no `resourceVersion`, or "0").
    CurrentState,
    /// Changes after this version.
    After(u64),
}

/// A parsed watch request.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub rt: ResourceType,
    pub namespace: Option<String>,
    pub filter: Filter,
    pub start: Start,
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: end the initial events with a marked BOOKMARK.
    pub initial_events_end_marker: bool,
    pub timeout: Duration,
    pub bookmark_interval: Duration,
    /// Events carry Tables (`kubectl get -w`), with this `includeObject`.
    pub table: Option<Option<String>>,
}

fn line(event_type: &str, object: Value) -> Bytes {
    // Moved in: `json!` would copy the object once more (it serializes by reference).
    let mut event = serde_json::Map::new();
    event.insert("type".into(), json!(event_type));
    event.insert("object".into(), object);
    let mut s = Value::Object(event).to_string();
    s.push('\n');
    Bytes::from(s)
}

/// Whether the stored `obj` is one the watch reports; selectors apply to the watch's view
/// (`event_views`).
fn in_scope(req: &WatchRequest, obj: &Value) -> bool {
    if event_views::is_events_view(&req.rt) {
        return in_view_scope(req, &event_views::to_view(&req.rt, obj.clone()));
    }
    in_view_scope(req, obj)
}

fn in_view_scope(req: &WatchRequest, obj: &Value) -> bool {
    req.namespace
        .as_deref()
        .is_none_or(|ns| object::namespace(obj) == Some(ns))
        && req.filter.matches(obj)
}

/// What a stored event means to this watch (selector transitions become ADDED/DELETED).
fn translate(req: &WatchRequest, ev: &StoredEvent) -> Option<(EventKind, Value)> {
    if ev.resource != req.rt.key() {
        return None;
    }
    let now = in_scope(req, &ev.object);
    let before = ev.old.as_ref().is_some_and(|o| in_scope(req, o));
    let kind = match (ev.kind, before, now) {
        (EventKind::Deleted, _, true) => EventKind::Deleted,
        (EventKind::Added, _, true) => EventKind::Added,
        (EventKind::Modified, true, true) => EventKind::Modified,
        (EventKind::Modified, false, true) => EventKind::Added,
        (EventKind::Modified, true, false) => EventKind::Deleted,
        _ => return None,
    };
    Some((kind, Store::present(&req.rt, &ev.object)))
}

fn render(req: &WatchRequest, obj: Value) -> Value {
    match &req.table {
        Some(include) => table::to_table(&req.rt, &[obj], json!({}), include.as_deref()),
        None => obj,
    }
}

fn bookmark(req: &WatchRequest, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        json!({"kind": req.rt.kind, "apiVersion": req.rt.api_version(), "metadata": meta}),
    )
}

/// Opens a watch. A too-old `resourceVersion` gives a stream with one ERROR event (410), as
/// the real API server does.
pub fn open(store: Arc<Store>, req: WatchRequest) -> ReceiverStream<Result<Bytes, Infallible>> {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        // Counted for as long as the stream runs: it ends when the client goes away.
        let _open = store.open_watch(&req.rt);
        let result = run(store.clone(), &req, &tx).await;
        if let Err(e) = result {
            let _ = tx.send(Ok(line("ERROR", e.status()))).await;
        }
    });
    ReceiverStream::new(rx)
}

type Sink = mpsc::Sender<Result<Bytes, Infallible>>;

/// Sends one chunk; false when the client went away.
async fn send(tx: &Sink, chunk: Bytes) -> bool {
    tx.send(Ok(chunk)).await.is_ok()
}

async fn run(store: Arc<Store>, req: &WatchRequest, tx: &Sink) -> Result<(), ApiError> {
    let (since, initial) = match req.start {
        Start::CurrentState => (None, true),
        Start::After(rv) => (Some(rv), false),
    };
    let key = req.rt.key();
    let mut start = store.watch_from(since, initial.then_some((&key, req.namespace.as_deref())))?;
    let mut last_rv = start.resource_version;
    if initial {
        for obj in std::mem::take(&mut start.current) {
            if in_scope(req, &obj) {
                let obj = Store::present(&req.rt, &obj);
                if !send(tx, line("ADDED", render(req, obj))).await {
                    return Ok(());
                }
            }
        }
        if req.initial_events_end_marker
            && req.bookmarks
            && !send(tx, bookmark(req, last_rv, true)).await
        {
            return Ok(());
        }
    }
    for ev in &start.replay {
        if let Some((kind, obj)) = translate(req, ev) {
            if !send(tx, line(kind.as_str(), render(req, obj))).await {
                return Ok(());
            }
        }
    }
    let deadline = tokio::time::sleep(req.timeout);
    tokio::pin!(deadline);
    // interval() rejects a zero period.
    let mut ticker = tokio::time::interval(req.bookmark_interval.max(Duration::from_millis(10)));
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = &mut deadline => return Ok(()),
            _ = start.epoch.changed() => {
                tracing::debug!(resource = %req.rt.plural, "watch dropped by fault injection");
                return Ok(());
            }
            _ = tx.closed() => return Ok(()),
            _ = ticker.tick(), if req.bookmarks => {
                if !send(tx, bookmark(req, last_rv, false)).await {
                    return Ok(());
                }
            }
            received = start.live.recv() => match received {
                Ok(ev) => {
                    last_rv = ev.rv;
                    if let Some((kind, obj)) = translate(req, &ev) {
                        if !send(tx, line(kind.as_str(), render(req, obj))).await {
                            return Ok(());
                        }
                    }
                }
                // A slow client lost events: end the stream; it resumes from its last version.
                Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return Ok(()),
            }
        }
    }
}
