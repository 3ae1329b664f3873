//! Warning Events on the tenant's config objects that the instance reads but cannot use
//! (Kubernetes mode): objects that break `meshplane_crds::validation` (created before their
//! namespace joined the tenant, or while the validating webhook was down), EnvoyFilters beyond
//! the tenant's EnvoyFilter policy, and EnvoyFilter patches that cannot apply.
//!
//! The index reports into an [`EventSink`] (no I/O there: a bounded queue, never blocking);
//! the xds-server's `report::config_events::run` publishes each report as an `events.k8s.io/v1` Event
//! of type `Warning` regarding the object, in the object's namespace. The sink lets through one
//! report per object generation
//! and reason ([`Dedup`]): the same invalid object seen again on a relist or a push, or a
//! patch failing for many proxies, is one Event; a new generation of the object is judged anew.
//! Reasons are the names of `meshctl analyze`'s codes for the same findings.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;

use crate::model::Object;

/// An object breaks a validation rule (MP0401); it is not applied.
pub const INVALID_CONFIG: &str = "InvalidConfig";
/// An EnvoyFilter patch cannot be applied to the configuration of a proxy it selects (MP0402).
pub const ENVOY_FILTER_PATCH_NOT_APPLIED: &str = "EnvoyFilterPatchNotApplied";
/// An EnvoyFilter does what the tenant's EnvoyFilter policy does not allow (MP0406).
pub const ENVOY_FILTER_BEYOND_POLICY: &str = "EnvoyFilterBeyondPolicy";

/// Most bytes of an Event's note (the API server refuses more than 1 kB).
pub const MAX_NOTE: usize = 1000;
/// Most objects whose reported generations are remembered; the oldest is forgotten first.
pub const MAX_REMEMBERED: usize = 4096;
/// Reports waiting to be published; more are dropped (Events are best effort).
pub const QUEUE: usize = 256;

/// The object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Regarding {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub resource_version: Option<String>,
}

impl Regarding {
    /// An EnvoyFilter.
    pub fn envoy_filter(f: &meshplane_crds::EnvoyFilter) -> Option<Self> {
        Self::from_meta(
            "networking.meshplane.io/v1alpha1",
            "EnvoyFilter",
            &f.metadata,
        )
    }

    fn from_meta(
        api_version: &str,
        kind: &str,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Option<Self> {
        Some(Regarding {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
            uid: meta.uid.clone(),
            generation: meta.generation,
            resource_version: meta.resource_version.clone(),
        })
    }

    /// The config object `obj`; `None` for kinds that are facts, not config (Services, Pods…).
    pub fn of(obj: &Object) -> Option<Self> {
        let (api_version, kind) = match obj {
            Object::ServiceEntry(_) => ("networking.meshplane.io/v1alpha1", "ServiceEntry"),
            Object::Sidecar(_) => ("networking.meshplane.io/v1alpha1", "Sidecar"),
            Object::EnvoyFilter(_) => ("networking.meshplane.io/v1alpha1", "EnvoyFilter"),
            Object::VirtualService(_) => ("networking.meshplane.io/v1alpha1", "VirtualService"),
            Object::DestinationRule(_) => ("networking.meshplane.io/v1alpha1", "DestinationRule"),
            Object::Gateway(_) => ("networking.meshplane.io/v1alpha1", "Gateway"),
            Object::PeerAuthentication(_) => {
                ("security.meshplane.io/v1alpha1", "PeerAuthentication")
            }
            Object::AuthorizationPolicy(_) => {
                ("security.meshplane.io/v1alpha1", "AuthorizationPolicy")
            }
            Object::RequestAuthentication(_) => {
                ("security.meshplane.io/v1alpha1", "RequestAuthentication")
            }
            _ => return None,
        };
        Self::from_meta(api_version, kind, obj.metadata())
    }

    /// The reference an Event carries.
    pub fn object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(self.api_version.clone()),
            kind: Some(self.kind.clone()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            resource_version: self.resource_version.clone(),
            field_path: None,
        }
    }
}

/// One finding about one object, to be published as a Warning Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigEvent {
    pub regarding: Regarding,
    /// One of the reasons above.
    pub reason: &'static str,
    /// What is wrong: the field and the rule (at most [`MAX_NOTE`] bytes).
    pub note: String,
}

impl ConfigEvent {
    /// A finding about `obj`; `None` for objects Events are not written about.
    pub fn about(obj: &Object, reason: &'static str, note: impl Into<String>) -> Option<Self> {
        Some(Self::regarding(Regarding::of(obj)?, reason, note))
    }

    /// A finding about the object `regarding` names.
    pub fn regarding(regarding: Regarding, reason: &'static str, note: impl Into<String>) -> Self {
        ConfigEvent {
            regarding,
            reason,
            note: truncate(note.into(), MAX_NOTE),
        }
    }
}

/// `s` cut to at most `max` bytes on a character boundary, marked when cut.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str("...");
    s
}

/// An object (kind, namespace, name, uid) and a reason.
type DedupKey = (String, String, String, Option<String>, &'static str);

/// Remembers which (object, reason) pairs were reported for which generation.
#[derive(Debug, Default)]
pub struct Dedup {
    reported: HashMap<DedupKey, Option<i64>>,
    order: VecDeque<DedupKey>,
}

impl Dedup {
    /// Whether `ev` is the first report of its object's generation for its reason (and
    /// remembers it).
    pub fn first(&mut self, ev: &ConfigEvent) -> bool {
        let r = &ev.regarding;
        let key = (
            r.kind.clone(),
            r.namespace.clone(),
            r.name.clone(),
            r.uid.clone(),
            ev.reason,
        );
        match self.reported.get_mut(&key) {
            Some(generation) if *generation == r.generation => false,
            Some(generation) => {
                *generation = r.generation;
                true
            }
            None => {
                self.reported.insert(key.clone(), r.generation);
                self.order.push_back(key);
                while self.order.len() > MAX_REMEMBERED {
                    if let Some(oldest) = self.order.pop_front() {
                        self.reported.remove(&oldest);
                    }
                }
                true
            }
        }
    }

    /// Forgets `ev`, so that it is reported again (it could not be queued).
    fn forget(&mut self, ev: &ConfigEvent) {
        let r = &ev.regarding;
        self.reported.remove(&(
            r.kind.clone(),
            r.namespace.clone(),
            r.name.clone(),
            r.uid.clone(),
            ev.reason,
        ));
    }
}

/// Where the reports a sink lets through are queued for publishing.
pub trait EventQueue: Send + Sync + std::fmt::Debug {
    /// Queues `ev` without blocking; false when the queue is full or closed.
    fn offer(&self, ev: ConfigEvent) -> bool;
}

impl EventQueue for SyncSender<ConfigEvent> {
    fn offer(&self, ev: ConfigEvent) -> bool {
        self.try_send(ev).is_ok()
    }
}

/// Where the index reports findings; a sink without a queue (the default: directory mode,
/// tests, meshctl) only deduplicates.
#[derive(Clone, Debug, Default)]
pub struct EventSink {
    queue: Option<Arc<dyn EventQueue>>,
    dedup: Arc<Mutex<Dedup>>,
}

impl EventSink {
    /// A sink queueing into `queue`.
    pub fn new(queue: Arc<dyn EventQueue>) -> Self {
        EventSink {
            queue: Some(queue),
            dedup: Arc::default(),
        }
    }

    /// A sink and the receiving end of its queue (at most [`QUEUE`] reports waiting).
    pub fn channel() -> (Self, Receiver<ConfigEvent>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        (Self::new(Arc::new(tx)), rx)
    }

    /// Reports a finding; returns whether it was new (first of its object's generation and
    /// reason). Never blocks: a full queue drops the report, which the next one retries.
    pub fn report(&self, ev: ConfigEvent) -> bool {
        let mut dedup = self.dedup.lock().unwrap_or_else(|p| p.into_inner());
        if !dedup.first(&ev) {
            return false;
        }
        tracing::warn!(kind = %ev.regarding.kind, namespace = %ev.regarding.namespace, name = %ev.regarding.name, reason = ev.reason, note = %ev.note, "config not applied");
        if let Some(queue) = &self.queue {
            if !queue.offer(ev.clone()) {
                dedup.forget(&ev);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshplane_crds::ServiceEntry;

    fn entry(generation: i64, uid: &str) -> Object {
        let mut se: ServiceEntry = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.meshplane.io/v1alpha1",
            "kind": "ServiceEntry",
            "metadata": {"name": "db", "namespace": "shop", "uid": uid, "generation": generation},
            "spec": {"hosts": ["db.example.com"]},
        }))
        .expect("entry");
        se.metadata.resource_version = Some(format!("{generation}0"));
        Object::ServiceEntry(Box::new(se))
    }

    #[test]
    fn one_report_per_object_generation_and_reason() {
        let (sink, rx) = EventSink::channel();
        let ev = |g, uid: &str, reason| ConfigEvent::about(&entry(g, uid), reason, "spec.hosts: x");
        assert!(sink.report(ev(1, "u1", INVALID_CONFIG).expect("config")));
        // Seen again (a relist, another push): not reported again.
        assert!(!sink.report(ev(1, "u1", INVALID_CONFIG).expect("config")));
        // Another reason about the same generation, a new generation, a recreated object
        // (new uid): each reported once.
        assert!(sink.report(ev(1, "u1", ENVOY_FILTER_BEYOND_POLICY).expect("config")));
        assert!(sink.report(ev(2, "u1", INVALID_CONFIG).expect("config")));
        assert!(!sink.report(ev(2, "u1", INVALID_CONFIG).expect("config")));
        assert!(sink.report(ev(1, "u2", INVALID_CONFIG).expect("config")));
        let mut queued = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            queued.push((ev.regarding.generation, ev.reason));
        }
        assert_eq!(
            queued,
            [
                (Some(1), INVALID_CONFIG),
                (Some(1), ENVOY_FILTER_BEYOND_POLICY),
                (Some(2), INVALID_CONFIG),
                (Some(1), INVALID_CONFIG),
            ]
        );
    }

    #[test]
    fn events_regard_the_object_in_its_namespace_with_a_bounded_note() {
        let ev =
            ConfigEvent::about(&entry(3, "u1"), INVALID_CONFIG, "é".repeat(2000)).expect("config");
        assert!(ev.note.len() <= MAX_NOTE && ev.note.ends_with("..."));
        let r = ev.regarding.object_reference();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (Some("ServiceEntry"), Some("shop"), Some("db"), Some("u1"))
        );
        assert_eq!(
            r.api_version.as_deref(),
            Some("networking.meshplane.io/v1alpha1")
        );
        // Facts are not config: no Events about them.
        let svc = Object::Service(Box::default());
        assert!(ConfigEvent::about(&svc, INVALID_CONFIG, "x").is_none());
    }

    #[test]
    fn the_memory_of_reported_objects_is_bounded() {
        let mut d = Dedup::default();
        for i in 0..(MAX_REMEMBERED + 10) {
            let mut ev = ConfigEvent::about(&entry(1, "u"), INVALID_CONFIG, "x").expect("config");
            ev.regarding.name = format!("o{i}");
            assert!(d.first(&ev));
        }
        assert_eq!(d.reported.len(), MAX_REMEMBERED);
        assert_eq!(d.order.len(), MAX_REMEMBERED);
    }
}
