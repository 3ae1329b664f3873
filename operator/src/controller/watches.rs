//! One watch per kind, shared by every consumer: a [`SharedWatch`] writes each event of its
//! watch into one reflector store, then hands a copy to each subscriber (a controller's
//! trigger stream), so no kind the controllers have in common is watched twice and every
//! trigger finds the store already holding the object that caused it.
//!
//! kube-runtime's own shared stores (`reflector::store_shared`, `Writer::subscribe`) hand
//! subscribers only the applied objects, read back from the store when polled: deletions and
//! the bounds of a relist never reach them. The namespace triggers need deletions, and
//! `triggers::fact_changes` needs both (an object gone while the watch was disconnected shows
//! only as missing from the relist), so the subscribers here get the watch events themselves.

use std::pin::pin;

use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::watcher;
use kube::Resource;
use tokio::sync::watch;
use tracing::warn;

/// Events a subscriber may lag behind before the watch waits for it.
const SUBSCRIBER_BUFFER: usize = 1024;

/// One watch of `K`: its store, whether the store has seen its first complete list, and the
/// subscribers its events go to once [`SharedWatch::start`]ed.
pub(super) struct SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    writer: Writer<K>,
    store: Store<K>,
    ready_tx: watch::Sender<bool>,
    subscribers: Vec<mpsc::Sender<watcher::Event<K>>>,
}

impl<K> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    pub(super) fn new() -> Self {
        let (store, writer) = reflector::store();
        Self {
            writer,
            store,
            ready_tx: watch::Sender::new(false),
            subscribers: Vec::new(),
        }
    }

    /// The store the watch keeps.
    pub(super) fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// True once the store holds a complete list. Unlike `Store::wait_until_ready`, which
    /// wakes only the last of several concurrent waiters, any number may wait on this.
    pub(super) fn ready(&self) -> watch::Receiver<bool> {
        self.ready_tx.subscribe()
    }

    /// Every event of the watch from its start, each after the store took it. Watch errors
    /// are not passed on: the watch logs them and retries with its own backoff.
    pub(super) fn subscribe(
        &mut self,
    ) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        self.subscribers.push(tx);
        rx.map(Ok)
    }

    /// Feeds `events` (the watch of `kind`) into the store and to the subscribers taken so
    /// far, until the returned [`Feed`] is dropped. A subscriber that is dropped is left out;
    /// one that lags [`SUBSCRIBER_BUFFER`] events behind holds the watch until it catches up.
    pub(super) fn start(
        self,
        kind: &'static str,
        events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    ) -> Feed {
        let Self {
            mut writer,
            ready_tx,
            mut subscribers,
            ..
        } = self;
        Feed(tokio::spawn(async move {
            let mut events = pin!(events);
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(e) => {
                        warn!(kind, error = %e, "watch failed; retrying");
                        continue;
                    }
                };
                writer.apply_watcher_event(&event);
                if matches!(event, watcher::Event::InitDone) {
                    ready_tx.send_replace(true);
                }
                let mut open = Vec::with_capacity(subscribers.len());
                for mut tx in subscribers {
                    if tx.send(event.clone()).await.is_ok() {
                        open.push(tx);
                    }
                }
                subscribers = open;
            }
        }))
    }
}

/// A running [`SharedWatch`]; dropping it ends the watch.
pub(super) struct Feed(tokio::task::JoinHandle<()>);

impl Drop for Feed {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::runtime::reflector::ObjectRef;
    use kube::ResourceExt;
    use watcher::Event as Ev;

    fn namespace(name: &str) -> Namespace {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
            .expect("a valid Namespace")
    }

    fn describe(event: &Ev<Namespace>) -> String {
        match event {
            Ev::Init => "init".into(),
            Ev::InitApply(n) => format!("list {}", n.name_any()),
            Ev::InitDone => "listed".into(),
            Ev::Apply(n) => format!("apply {}", n.name_any()),
            Ev::Delete(n) => format!("delete {}", n.name_any()),
        }
    }

    #[tokio::test]
    async fn every_subscriber_gets_every_event_after_the_store_took_it() {
        let mut shared = SharedWatch::<Namespace>::new();
        let store = shared.store();
        let mut ready = shared.ready();
        let first = shared.subscribe();
        let second = shared.subscribe();
        // A consumer that goes away leaves the others fed.
        drop(shared.subscribe());
        let (tx, rx) = mpsc::unbounded();
        let _feed = shared.start("Namespace", rx);
        let events = [
            Ev::Init,
            Ev::InitApply(namespace("shop")),
            Ev::InitDone,
            Ev::Apply(namespace("bank")),
            Ev::Delete(namespace("shop")),
        ];
        for event in events.iter().cloned() {
            tx.unbounded_send(Ok(event)).expect("the feed runs");
        }
        // A watch error reaches nobody (the watch retries on its own).
        tx.unbounded_send(Err(watcher::Error::NoResourceVersion))
            .expect("the feed runs");
        drop(tx);
        let seen = |events: Vec<Result<Ev<Namespace>, watcher::Error>>| -> Vec<String> {
            events
                .iter()
                .map(|e| e.as_ref().map(describe).unwrap_or_else(|e| e.to_string()))
                .collect()
        };
        let store_for_check = store.clone();
        // What the store holds when each event arrives: the change is already in.
        let first = first
            .inspect(move |e| {
                if let Ok(Ev::Apply(n)) = e {
                    assert!(store_for_check.get(&ObjectRef::from_obj(n)).is_some());
                }
                if let Ok(Ev::Delete(n)) = e {
                    assert!(store_for_check.get(&ObjectRef::from_obj(n)).is_none());
                }
            })
            .collect::<Vec<_>>();
        let (first, second) = futures::join!(first, second.collect::<Vec<_>>());
        let expected: Vec<String> = events.iter().map(describe).collect();
        assert_eq!(seen(first), expected);
        assert_eq!(seen(second), expected);
        ready.wait_for(|r| *r).await.expect("ready after the list");
        assert_eq!(
            store
                .state()
                .iter()
                .map(|n| n.name_any())
                .collect::<Vec<_>>(),
            ["bank"]
        );
    }
}
