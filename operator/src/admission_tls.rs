//! The operator's own admission certificate, shared by its replicas: the I/O around the pure
//! decisions of [`crate::tls`]. Every replica reads the Secret, then creates, keeps or rotates
//! it as [`tls::shared_tls_step`] decides, keeps each caBundle of the operator's webhook
//! configuration equal to the Secret's `ca.crt` ([`tls::ca_bundle_needs_write`]), and serves
//! the certificate only once the caBundle trusts it. Writes are guarded (create, or replace at
//! the resourceVersion read), so two replicas racing end up serving one certificate.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use meshplane_crds::names;
use meshplane_webhooks::client_auth::ClientAuth;
use time::OffsetDateTime;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::server::{self, Health};
use crate::tls::{self, SharedTlsStep, TlsError, WebhookTls};

/// How often a replica re-reads the shared Secret (reload, rotation, caBundle drift) once it
/// serves a trusted certificate, and how soon it retries before.
pub const RESYNC: Duration = Duration::from_secs(30);
pub const RETRY: Duration = Duration::from_secs(2);

/// How many times a write that lost a race (409) is retried after re-reading.
const ATTEMPTS: usize = 5;

/// Why one sync of the shared certificate failed (the loop retries after [`RETRY`]).
#[derive(Debug, thiserror::Error)]
pub enum AdmissionTlsError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Issue(#[from] TlsError),
    #[error("Secret {0} has no resourceVersion")]
    NoResourceVersion(String),
    #[error("{0} kept changing under us")]
    KeptChanging(String),
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> AdmissionTlsError {
    let what = what.into();
    move |source| AdmissionTlsError::Api { what, source }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Where the shared certificate lives and what it is for.
#[derive(Clone, Debug)]
pub struct SharedTls {
    /// Namespace of the operator (the Secret's).
    pub namespace: String,
    /// The Secret holding the replicas' certificate.
    pub secret: String,
    /// DNS name of the operator's Service, the certificate's subject.
    pub host: String,
    /// ValidatingWebhookConfiguration whose caBundles receive the CA ("" = none).
    pub config_name: String,
    pub validity: time::Duration,
}

/// Reads the shared Secret, then creates it (POST), keeps it, or rotates it (replace guarded by
/// the resourceVersion read). A 409 means another replica wrote first: re-read and adopt.
pub async fn sync_secret(
    api: &Api<Secret>,
    shared: &SharedTls,
    now: OffsetDateTime,
) -> Result<WebhookTls, AdmissionTlsError> {
    let name = &shared.secret;
    for _ in 0..ATTEMPTS {
        let current = api
            .get_opt(name)
            .await
            .map_err(api_error(format!("reading Secret {name}")))?;
        let observed = current.as_ref().and_then(|secret| {
            let data = serde_json::to_value(&secret.data).ok()?;
            WebhookTls::from_secret_data(&data)
        });
        let step = tls::shared_tls_step(
            current.is_some(),
            observed,
            &shared.host,
            now,
            shared.validity,
        )?;
        let (tls, resource_version) = match step {
            SharedTlsStep::Use(tls) => return Ok(tls),
            SharedTlsStep::Create(tls) => (tls, None),
            SharedTlsStep::Update(tls) => {
                let rv = current.and_then(|s| s.metadata.resource_version);
                let rv = rv.ok_or_else(|| AdmissionTlsError::NoResourceVersion(name.clone()))?;
                (tls, Some(rv))
            }
        };
        let secret = secret_object(name, resource_version.clone(), &tls);
        let written = match &resource_version {
            None => api.create(&PostParams::default(), &secret).await,
            Some(_) => api.replace(name, &PostParams::default(), &secret).await,
        };
        match written {
            Ok(_) => {
                info!(
                    secret = %name,
                    rotated = resource_version.is_some(),
                    "issued the shared admission certificate"
                );
                return Ok(tls);
            }
            Err(e) if is_conflict(&e) => {
                info!(secret = %name, "another replica wrote the admission certificate first; adopting it");
            }
            Err(e) => return Err(api_error(format!("writing Secret {name}"))(e)),
        }
    }
    Err(AdmissionTlsError::KeptChanging(format!("Secret {name}")))
}

fn secret_object(name: &str, resource_version: Option<String>, tls: &WebhookTls) -> Secret {
    use meshplane_contracts::webhook_tls::{CA_CRT, TLS_CRT, TLS_KEY};
    let bytes = |pem: &str| k8s_openapi::ByteString(pem.as_bytes().to_vec());
    let mut secret = Secret {
        type_: Some(meshplane_contracts::webhook_tls::SECRET_TYPE.to_string()),
        data: Some(
            [
                (CA_CRT.to_string(), bytes(&tls.ca_bundle_pem)),
                (TLS_CRT.to_string(), bytes(&tls.cert_pem)),
                (TLS_KEY.to_string(), bytes(&tls.key_pem)),
            ]
            .into(),
        ),
        ..Secret::default()
    };
    secret.metadata.name = Some(name.to_string());
    secret.metadata.resource_version = resource_version;
    secret.metadata.labels = Some(
        [(
            "app.kubernetes.io/managed-by".to_string(),
            "meshplane".to_string(),
        )]
        .into(),
    );
    secret
}

/// Keeps every caBundle of the webhook configuration `config_name` equal to the shared Secret's
/// `ca.crt`; returns whether all of them then trust the CA of the served certificate. Retries
/// when another replica wrote in between.
pub async fn publish_ca_bundle(
    client: &Client,
    config_name: &str,
    tls: &WebhookTls,
) -> Result<bool, AdmissionTlsError> {
    let mut attempt = 0;
    loop {
        match try_publish_ca_bundle(client, config_name, tls).await {
            Err(AdmissionTlsError::Api { source, .. })
                if attempt + 1 < ATTEMPTS && is_conflict(&source) =>
            {
                attempt += 1
            }
            other => return other,
        }
    }
}

async fn try_publish_ca_bundle(
    client: &Client,
    config_name: &str,
    tls: &WebhookTls,
) -> Result<bool, AdmissionTlsError> {
    let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let current = api
        .get(config_name)
        .await
        .map_err(api_error("reading the operator's webhook configuration"))?;
    let bundles: Vec<(String, String)> = current
        .webhooks
        .iter()
        .flatten()
        .map(|hook| {
            let existing = hook
                .client_config
                .ca_bundle
                .as_ref()
                .map(|b| String::from_utf8_lossy(&b.0).to_string())
                .unwrap_or_default();
            (hook.name.clone(), existing)
        })
        .collect();
    if bundles.is_empty() {
        warn!(
            config = config_name,
            "the operator's webhook configuration has no webhooks"
        );
        return Ok(false);
    }
    if !bundles
        .iter()
        .any(|(_, existing)| tls::ca_bundle_needs_write(existing, tls))
    {
        return Ok(bundles
            .iter()
            .all(|(_, existing)| tls::ca_bundle_trusts(existing, tls)));
    }
    let webhooks: Vec<_> = bundles
        .iter()
        .map(|(name, _)| {
            serde_json::json!({
                "name": name,
                "clientConfig": {"caBundle": tls.ca_bundle_base64()},
            })
        })
        .collect();
    let body = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": config_name, "resourceVersion": current.metadata.resource_version},
        "webhooks": webhooks,
    });
    api.patch(
        config_name,
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(api_error("setting caBundle"))?;
    info!(
        config = config_name,
        "caBundle set to the shared admission CA"
    );
    Ok(true)
}

/// Serves the shared admission certificate until `stop` turns true: syncs the Secret, keeps
/// the caBundle equal to its `ca.crt`, swaps the serving certificate when the Secret changes
/// (only once the caBundle trusts it, unless nothing is served yet), and reports ready only
/// while the served certificate's CA is in the caBundle. With `client_auth`, the served
/// configuration asks callers for the API server's admission client certificate.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    shared: SharedTls,
    client_auth: Option<Arc<ClientAuth>>,
    clock: Arc<dyn Fn() -> OffsetDateTime + Send + Sync>,
    configs: watch::Sender<Option<Arc<rustls::ServerConfig>>>,
    health: Health,
    mut stop: watch::Receiver<bool>,
) {
    let api = Api::<Secret>::namespaced(client.clone(), &shared.namespace);
    let mut served: Option<WebhookTls> = None;
    loop {
        let mut ready = false;
        match sync_secret(&api, &shared, clock()).await {
            Ok(tls) => {
                let trusted = if shared.config_name.is_empty() {
                    true
                } else {
                    publish_ca_bundle(&client, &shared.config_name, &tls)
                        .await
                        .unwrap_or_else(|e| {
                            warn!(error = %e, "could not publish the admission CA");
                            false
                        })
                };
                if served.as_ref() != Some(&tls) && (trusted || served.is_none()) {
                    match server::rustls_config(&tls.cert_pem, &tls.key_pem, client_auth.clone()) {
                        Ok(config) => {
                            configs.send_replace(Some(config));
                            served = Some(tls.clone());
                            info!(secret = %shared.secret, "serving the shared admission certificate");
                        }
                        Err(e) => warn!(error = %e, "the shared admission certificate is unusable"),
                    }
                }
                ready = trusted && served.as_ref() == Some(&tls);
            }
            Err(e) => warn!(error = %e, "could not sync the shared admission certificate"),
        }
        health.set_ready(ready);
        let pause = if ready { RESYNC } else { RETRY };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {},
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
