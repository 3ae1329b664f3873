//! The two backoffs of the controllers: per object after a failed reconcile ([`Failures`]),
//! and per watch after a watch error ([`per_watch`], instead of kube-runtime's one shared
//! trigger backoff).

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::controller::Controller;
use kube::runtime::utils::Backoff;
use kube::Resource;
use serde::de::DeserializeOwned;

/// Consecutive failures per object (`controller/name`): the retry delay doubles from 5 s up to
/// 5 min, and a success starts it over.
#[derive(Default)]
pub(super) struct Failures(Mutex<HashMap<String, u32>>);

impl Failures {
    /// Counts one more failure of `key`; the delay before its retry.
    pub(super) fn failed(&self, key: &str) -> Duration {
        let mut failures = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key.to_string()).or_default();
        *n = n.saturating_add(1);
        let secs = 5u64.saturating_mul(1u64 << (*n - 1).min(6));
        Duration::from_secs(secs.min(300))
    }

    pub(super) fn succeeded(&self, key: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

/// `controller` without kube-runtime's shared trigger backoff: every trigger watch backs off
/// on its own errors instead (`WatchStreamExt::default_backoff` on each). The shared one sits
/// on the merged trigger stream: when all watches fail together (every one gets 410 Gone
/// after the API server compacts its history), each error grows that one backoff, and no
/// trigger of any watch is polled for minutes.
pub(super) fn per_watch<K>(controller: Controller<K>) -> Controller<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    controller.trigger_backoff(NoSharedBackoff)
}

/// The controllers' shared trigger backoff, disabled (see [`per_watch`]).
struct NoSharedBackoff;

impl Iterator for NoSharedBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for NoSharedBackoff {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use futures::{stream, StreamExt};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::controller::Action;
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::watcher;

    #[test]
    fn an_objects_retry_delay_doubles_to_five_minutes_and_a_success_restarts_it() {
        let failures = Failures::default();
        let delays: Vec<u64> = (0..9).map(|_| failures.failed("a").as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(
            failures.failed("b").as_secs(),
            5,
            "each object counts alone"
        );
        failures.succeeded("a");
        assert_eq!(failures.failed("a").as_secs(), 5);
    }

    fn config_map(name: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "x"}}))
            .expect("a valid ConfigMap")
    }

    #[derive(Debug, thiserror::Error)]
    #[error("never")]
    struct Never;

    /// With kube-runtime's shared trigger backoff, four errors of one watch would hold every
    /// other watch's triggers for at least 0.8 + 1.6 + 3.2 + 6.4 s.
    #[tokio::test]
    async fn one_watchs_errors_do_not_delay_another_watchs_triggers() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(config_map("b")));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        // The failing watch says when its last error was taken; only then does the other
        // watch's trigger arrive, so it must wait out whatever backoff those errors started.
        let (errors_taken, taken) = futures::channel::oneshot::channel::<()>();
        let mut errors_taken = Some(errors_taken);
        let failing = stream::iter(1..=4)
            .map(move |n| {
                if n == 4 {
                    if let Some(tx) = errors_taken.take() {
                        let _ = tx.send(());
                    }
                }
                Err::<ConfigMap, _>(watcher::Error::NoResourceVersion)
            })
            .chain(stream::pending());
        let other = stream::once(async move {
            let _ = taken.await;
            Ok::<_, watcher::Error>(config_map("b"))
        })
        .chain(stream::pending());
        let (reconciled_tx, mut reconciled) = futures::channel::mpsc::unbounded::<String>();
        let controller =
            per_watch(Controller::for_stream(failing, store))
                .watches_stream(other, |cm| Some(ObjectRef::from_obj(&cm)))
                .run(
                    |cm: Arc<ConfigMap>,
                     tx: Arc<futures::channel::mpsc::UnboundedSender<String>>| async move {
                        let _ = tx.unbounded_send(cm.metadata.name.clone().unwrap_or_default());
                        Ok::<_, Never>(Action::await_change())
                    },
                    |_, _, _| Action::await_change(),
                    Arc::new(reconciled_tx),
                )
                .for_each(|_| async {});
        let driver = tokio::spawn(controller);
        let first = tokio::time::timeout(Duration::from_secs(3), reconciled.next()).await;
        driver.abort();
        assert_eq!(
            first.expect("reconciled without waiting out a shared backoff"),
            Some("b".to_string())
        );
    }
}
