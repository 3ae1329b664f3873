//! Publishing the config findings of the index (`meshplane_xds_core::config_events`, re-exported
//! here) as Warning Events (Kubernetes mode): [`channel`] gives the index a sink whose reports
//! [`run`] publishes as `events.k8s.io/v1` Events of type `Warning` regarding the object, in
//! the object's namespace. Of a tenant's revisions, only the one that writes an object's status
//! (contract 2, [`StatusScope`]) publishes Events about it, so a canary does not double them.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::{Event, EventType};
use kube::Client;
use meshplane_events::EventRecorder;
use tokio::sync::{mpsc, watch};

use crate::source_kube::StatusScope;

pub use meshplane_xds_core::config_events::*;

/// Publishing attempts per Event (the first and retries after [`RETRY`]).
const ATTEMPTS: u32 = 4;
const RETRY: Duration = Duration::from_secs(3);

/// The queue [`run`] publishes from.
#[derive(Debug)]
struct Queue(mpsc::Sender<ConfigEvent>);

impl EventQueue for Queue {
    fn offer(&self, ev: ConfigEvent) -> bool {
        self.0.try_send(ev).is_ok()
    }
}

/// A sink and the receiving end that [`run`] publishes from.
pub fn channel() -> (EventSink, mpsc::Receiver<ConfigEvent>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (EventSink::new(Arc::new(Queue(tx))), rx)
}

/// The Event published for a finding.
pub fn event(ev: &ConfigEvent) -> Event {
    Event {
        type_: EventType::Warning,
        reason: ev.reason.to_string(),
        note: Some(ev.note.clone()),
        action: "Translate".into(),
        secondary: None,
    }
}

/// Whether this revision publishes `ev`: it writes the status of the object's namespace, or no
/// members ConfigMap was read yet (then nobody's scope is known, and an Event twice is better
/// than none).
pub fn publishes(scope: Option<&StatusScope>, ev: &ConfigEvent) -> bool {
    scope.is_none_or(|scope| scope.owns(&ev.regarding.namespace))
}

/// Publishes the findings of `rx` as Events until it closes, those about objects `scope` owns;
/// `instance` names this pod as the reporting instance (controller `meshplane-xds/<revision>`).
pub async fn run(
    client: Client,
    revision: String,
    instance: String,
    mut rx: mpsc::Receiver<ConfigEvent>,
    scope: watch::Receiver<Option<StatusScope>>,
) {
    // One Event per distinct finding: kube-runtime's `Recorder` would fold a new finding with
    // the same reason on the same object into the old Event, keeping the old note.
    let recorder = EventRecorder::new(client, &format!("meshplane-xds/{revision}"), Some(instance));
    let mut retry: Vec<(ConfigEvent, u32)> = Vec::new();
    loop {
        let next = if retry.is_empty() {
            rx.recv().await.map(|ev| vec![(ev, 0)])
        } else {
            match tokio::time::timeout(RETRY, rx.recv()).await {
                Ok(Some(ev)) => Some(vec![(ev, 0)]),
                Ok(None) => None,
                Err(_) => Some(std::mem::take(&mut retry)),
            }
        };
        let Some(batch) = next else { return };
        for (ev, attempts) in batch {
            if !publishes(scope.borrow().as_ref(), &ev) {
                continue;
            }
            let reference = ev.regarding.object_reference();
            let e = event(&ev);
            let note = e.note.as_deref().unwrap_or_default();
            match recorder
                .publish(&reference, e.type_, &e.reason, note, &e.action)
                .await
            {
                Ok(()) => {}
                Err(e) if attempts + 1 < ATTEMPTS => {
                    tracing::debug!(error = %e, kind = %ev.regarding.kind, name = %ev.regarding.name, "cannot publish Event, retrying");
                    retry.push((ev, attempts + 1));
                }
                Err(e) => {
                    tracing::warn!(error = %e, kind = %ev.regarding.kind, namespace = %ev.regarding.namespace, name = %ev.regarding.name, reason = ev.reason, "cannot publish Event")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Object;

    #[test]
    fn a_finding_is_a_warning_event_with_its_reason() {
        let se: meshplane_crds::ServiceEntry = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.meshplane.io/v1alpha1",
            "kind": "ServiceEntry",
            "metadata": {"name": "db", "namespace": "shop", "uid": "u1", "generation": 3},
            "spec": {"hosts": ["db.example.com"]},
        }))
        .expect("entry");
        let obj = Object::ServiceEntry(Box::new(se));
        let ev = ConfigEvent::about(&obj, INVALID_CONFIG, "spec.hosts: x").expect("config");
        let e = event(&ev);
        assert_eq!(
            (e.type_, e.reason.as_str()),
            (EventType::Warning, "InvalidConfig")
        );
    }

    #[test]
    fn only_the_status_writer_of_a_namespace_publishes_about_its_objects() {
        use meshplane_contracts::members::MembersData;
        let entry = |ns: &str| {
            let se: meshplane_crds::ServiceEntry = serde_json::from_value(serde_json::json!({
                "apiVersion": "networking.meshplane.io/v1alpha1",
                "kind": "ServiceEntry",
                "metadata": {"name": "db", "namespace": ns, "uid": "u1", "generation": 1},
                "spec": {"hosts": ["db.example.com"]},
            }))
            .expect("entry");
            ConfigEvent::about(&Object::ServiceEntry(Box::new(se)), INVALID_CONFIG, "x")
                .expect("config")
        };
        let scope = |attached: &[&str], status_writer: bool| StatusScope {
            control_namespace: "meshplane-blue".into(),
            members: MembersData {
                members: ["shop", "cart"].iter().map(|s| s.to_string()).collect(),
                attached: attached.iter().map(|s| s.to_string()).collect(),
                status_writer,
                ..MembersData::default()
            },
        };
        let old = scope(&["shop"], true);
        let canary = scope(&["cart"], false);
        for (ns, old_publishes) in [("shop", true), ("cart", false), ("meshplane-blue", true)] {
            assert_eq!(publishes(Some(&old), &entry(ns)), old_publishes, "{ns}");
            assert_eq!(publishes(Some(&canary), &entry(ns)), !old_publishes, "{ns}");
        }
        assert!(
            publishes(None, &entry("shop")),
            "before the members are read, Events are published"
        );
    }

    #[tokio::test]
    async fn the_channel_queues_what_the_sink_lets_through() {
        let (sink, mut rx) = channel();
        let se: meshplane_crds::ServiceEntry = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.meshplane.io/v1alpha1",
            "kind": "ServiceEntry",
            "metadata": {"name": "db", "namespace": "shop", "uid": "u1", "generation": 1},
            "spec": {"hosts": ["db.example.com"]},
        }))
        .expect("entry");
        let obj = Object::ServiceEntry(Box::new(se));
        let ev = || ConfigEvent::about(&obj, INVALID_CONFIG, "x").expect("config");
        assert!(sink.report(ev()));
        assert!(!sink.report(ev()));
        assert_eq!(rx.try_recv().map(|e| e.reason), Ok(INVALID_CONFIG));
        assert!(rx.try_recv().is_err());
    }
}
