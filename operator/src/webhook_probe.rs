//! `WebhooksReady` from a real call: the operator asks the API server for a dry-run create of a
//! probe `Sidecar` in the revision's control namespace. The API server sends it, like any
//! config, to the revision's validating webhook (through the Service, with the configured
//! caBundle); the instance recognises the probe of its own revision and refuses it with a
//! known message (contract 5). So the answer proves the whole path users depend on: the
//! webhook configuration, the Service, TLS and the handler. Dry run: nothing is stored.
//!
//! Results are kept per revision for [`PROBE_EVERY`], so periodic reconciles of many control
//! planes do not turn into a stream of probes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::Client;
use meshplane_crds::names;
use serde_json::json;

/// How long a probe result is reused.
pub const PROBE_EVERY: Duration = Duration::from_secs(30);

/// What a probe found out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// The revision's webhook answered the probe.
    Serving,
    /// It did not; the message says what the API server reported.
    Failed(String),
}

fn sidecars() -> ApiResource {
    ApiResource {
        group: "networking.meshplane.io".into(),
        version: "v1alpha1".into(),
        api_version: "networking.meshplane.io/v1alpha1".into(),
        kind: "Sidecar".into(),
        plural: "sidecars".into(),
    }
}

/// The probe object of `revision` (a valid Sidecar, so sibling revisions' webhooks admit it).
pub fn probe_object(revision: &str, control_namespace: &str) -> DynamicObject {
    let mut obj = DynamicObject::new(&names::webhook_probe_name(revision), &sidecars())
        .within(control_namespace);
    obj.metadata.annotations = Some(
        [(
            names::WEBHOOK_PROBE_ANNOTATION.to_string(),
            revision.to_string(),
        )]
        .into(),
    );
    obj.data = json!({"spec": {"egress": [{"hosts": ["./*"]}]}});
    obj
}

/// Reads the API server's answer to a probe dry run.
pub fn interpret(revision: &str, answer: Result<(), kube::Error>) -> ProbeResult {
    match answer {
        Ok(()) => ProbeResult::Failed(format!(
            "the API server admitted the probe without calling revision {revision:?}'s validating webhook"
        )),
        Err(kube::Error::Api(status))
            if status
                .message
                .contains(&names::webhook_probe_answer(revision)) =>
        {
            ProbeResult::Serving
        }
        Err(kube::Error::Api(status)) => ProbeResult::Failed(status.message.clone()),
        Err(other) => ProbeResult::Failed(format!("the probe could not be sent: {other}")),
    }
}

/// Probes revision `revision`'s validating webhook now.
pub async fn probe(client: &Client, revision: &str, control_namespace: &str) -> ProbeResult {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), control_namespace, &sidecars());
    let params = PostParams {
        dry_run: true,
        field_manager: Some(names::FIELD_MANAGER.to_string()),
    };
    let answer = api
        .create(&params, &probe_object(revision, control_namespace))
        .await
        .map(|_| ());
    interpret(revision, answer)
}

/// Recent probe results per revision.
#[derive(Default)]
pub struct WebhookProbes {
    last: Mutex<HashMap<String, (Instant, ProbeResult)>>,
}

impl WebhookProbes {
    /// The result of a probe of `revision` at most [`PROBE_EVERY`] old (a failed one is
    /// retried at once), probing when needed.
    pub async fn check(
        &self,
        client: &Client,
        revision: &str,
        control_namespace: &str,
    ) -> ProbeResult {
        let cached = self
            .lock()
            .get(revision)
            .filter(|(at, r)| *r == ProbeResult::Serving && at.elapsed() < PROBE_EVERY)
            .map(|(_, r)| r.clone());
        if let Some(r) = cached {
            return r;
        }
        let result = probe(client, revision, control_namespace).await;
        self.lock()
            .insert(revision.to_string(), (Instant::now(), result.clone()));
        result
    }

    /// Forgets `revision` (its webhooks changed or it went away).
    pub fn forget(&self, revision: &str) {
        self.lock().remove(revision);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, ProbeResult)>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn api_error(message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure(message, "Forbidden")))
    }

    #[test]
    fn only_the_revisions_own_answer_counts_as_serving() {
        let ok = format!(
            "admission webhook \"blue-v1.validate-control.meshplane.io\" denied the request: {}",
            names::webhook_probe_answer("blue-v1")
        );
        assert_eq!(
            interpret("blue-v1", Err(api_error(&ok))),
            ProbeResult::Serving
        );
        assert!(matches!(
            interpret("blue-v2", Err(api_error(&ok))),
            ProbeResult::Failed(_)
        ));
        let down =
            "failed calling webhook \"blue-v1.validate-control.meshplane.io\": connection refused";
        assert_eq!(
            interpret("blue-v1", Err(api_error(down))),
            ProbeResult::Failed(down.into())
        );
        assert!(
            matches!(interpret("blue-v1", Ok(())), ProbeResult::Failed(m) if m.contains("without calling"))
        );
    }

    #[test]
    fn the_probe_is_a_valid_sidecar_naming_its_revision() {
        let p = probe_object("blue-v1", "meshplane-blue");
        assert_eq!(p.metadata.namespace.as_deref(), Some("meshplane-blue"));
        assert_eq!(
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::WEBHOOK_PROBE_ANNOTATION))
                .map(String::as_str),
            Some("blue-v1")
        );
        let spec: meshplane_crds::networking::SidecarSpec =
            serde_json::from_value(p.data["spec"].clone()).expect("a Sidecar spec");
        assert!(meshplane_crds::validation::validate_sidecar(&spec).is_ok());
    }
}
