//! Publishing Events (`events.k8s.io/v1`): one Event per occurrence, told apart by the object
//! it regards, its type, its reason and its note. The same occurrence again within
//! [`SERIES_WINDOW`] is counted in that Event's `series` (as Kubernetes' own recorder does),
//! never a second Event. (kube-runtime's `Recorder` leaves the note out of its key, so two
//! different notes with one reason on one object, such as two namespaces joining, would
//! become one Event counted twice with the first note.)

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::Client;
use serde_json::json;

/// How long a published Event is counted into rather than published anew.
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// What tells one occurrence from another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Occurrence {
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

impl Occurrence {
    pub fn new(reference: &ObjectReference, warning: bool, reason: &str, note: &str) -> Self {
        Self {
            kind: reference.kind.clone(),
            namespace: reference.namespace.clone(),
            name: reference.name.clone(),
            uid: reference.uid.clone(),
            warning,
            reason: reason.to_string(),
            note: note.to_string(),
        }
    }
}

/// An Event published, as remembered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub namespace: String,
    pub name: String,
    /// How often it occurred.
    pub count: i32,
    /// When it last occurred.
    pub last: Timestamp,
}

/// What to write for an occurrence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// A new Event.
    Create,
    /// Count it in the Event published before: its `series` becomes `count`.
    Count(Published),
}

/// Decides the write for an occurrence last published as `before` (if at all), at `now`.
pub fn decide(before: Option<&Published>, now: Timestamp) -> Write {
    match before {
        Some(p) if p.last + SERIES_WINDOW > now => Write::Count(Published {
            count: p.count + 1,
            last: now,
            ..p.clone()
        }),
        _ => Write::Create,
    }
}

/// Publishes Events as one controller (`reportingController`: the operator, or an instance as
/// `meshplane-xds/<revision>`), from one replica (`reportingInstance`).
pub struct EventRecorder {
    client: Client,
    controller: String,
    instance: String,
    published: Mutex<HashMap<Occurrence, Published>>,
}

impl EventRecorder {
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.to_string(),
            instance: instance.unwrap_or_else(|| controller.to_string()),
            published: Mutex::new(HashMap::new()),
        }
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, HashMap<Occurrence, Published>> {
        // A map of plain values: usable whatever a panicking holder left.
        self.published.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes one occurrence (`action` is what the controller was doing).
    pub async fn publish(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let warning = matches!(type_, EventType::Warning);
        let occurrence = Occurrence::new(reference, warning, reason, note);
        let before = {
            let mut remembered = self.remembered();
            remembered.retain(|_, p| p.last + SERIES_WINDOW > now);
            remembered.get(&occurrence).cloned()
        };
        let published = match decide(before.as_ref(), now) {
            Write::Create => {
                let namespace = reference
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into());
                let name = format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                );
                let event = Event {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(namespace.clone()),
                        ..Default::default()
                    },
                    action: Some(action.to_string()),
                    reason: Some(reason.to_string()),
                    note: Some(note.to_string()),
                    type_: Some(if warning { "Warning" } else { "Normal" }.into()),
                    event_time: Some(MicroTime(now)),
                    regarding: Some(reference.clone()),
                    reporting_controller: Some(self.controller.clone()),
                    reporting_instance: Some(self.instance.clone()),
                    ..Default::default()
                };
                Api::<Event>::namespaced(self.client.clone(), &namespace)
                    .create(&PostParams::default(), &event)
                    .await?;
                Published {
                    namespace,
                    name,
                    count: 1,
                    last: now,
                }
            }
            Write::Count(counted) => {
                let series = EventSeries {
                    count: counted.count,
                    last_observed_time: MicroTime(counted.last),
                };
                Api::<Event>::namespaced(self.client.clone(), &counted.namespace)
                    .patch(
                        &counted.name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"series": series})),
                    )
                    .await?;
                counted
            }
        };
        self.remembered().insert(occurrence, published);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_reference(kind: &str, name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some(kind.into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("a valid time")
    }

    #[test]
    fn occurrences_differ_by_note_and_repeat_only_when_all_is_equal() {
        let blue = mk_reference("MeshControlPlane", "blue-v1");
        let cart = Occurrence::new(&blue, false, "NamespaceJoined", "namespace cart joined");
        let shop = Occurrence::new(&blue, false, "NamespaceJoined", "namespace shop joined");
        assert_ne!(cart, shop, "two namespaces joining are two Events");
        assert_eq!(
            cart,
            Occurrence::new(&blue, false, "NamespaceJoined", "namespace cart joined")
        );
        assert_ne!(
            cart,
            Occurrence::new(
                &mk_reference("Namespace", "cart"),
                false,
                "NamespaceJoined",
                "namespace cart joined"
            )
        );
    }

    #[test]
    fn a_repeat_within_the_window_is_counted_else_published_anew() {
        assert_eq!(decide(None, at(0)), Write::Create);
        let first = Published {
            namespace: "default".into(),
            name: "blue-v1.1".into(),
            count: 1,
            last: at(0),
        };
        assert_eq!(
            decide(Some(&first), at(60)),
            Write::Count(Published {
                count: 2,
                last: at(60),
                ..first.clone()
            })
        );
        assert_eq!(decide(Some(&first), at(6 * 60)), Write::Create);
    }
}
