//! The recorder against the API stand-in: distinct findings on one object are distinct Events
//! with their own notes; the same one again is counted in its Event's series.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use meshplane_events::EventRecorder;
use meshplane_kube_standin::{Identity, StandIn, StandInOptions};

#[tokio::test]
async fn two_findings_with_one_reason_are_two_events_and_a_repeat_is_counted() {
    let handle = StandIn::start(StandInOptions::default()).await.unwrap();
    let client = handle.client(&Identity::Admin).await.unwrap();
    let recorder = EventRecorder::new(client.clone(), "meshplane-xds/blue-v1", None);
    let entry = ObjectReference {
        api_version: Some("networking.meshplane.io/v1alpha1".into()),
        kind: Some("ServiceEntry".into()),
        namespace: Some("default".into()),
        name: Some("db".into()),
        uid: Some("uid-db".into()),
        ..Default::default()
    };
    for note in [
        "spec.hosts[0]: not a host",
        "spec.ports[0]: no number",
        "spec.hosts[0]: not a host",
    ] {
        recorder
            .publish(
                &entry,
                EventType::Warning,
                "InvalidConfig",
                note,
                "Translate",
            )
            .await
            .unwrap();
    }
    let events: Api<Event> = Api::namespaced(client, "default");
    let mut seen: Vec<(String, i32)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| (e.note.unwrap_or_default(), e.series.map_or(1, |s| s.count)))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("spec.hosts[0]: not a host".to_string(), 2),
            ("spec.ports[0]: no number".to_string(), 1),
        ]
    );
}
