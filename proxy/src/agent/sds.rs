//! SDS for Envoy on a Unix socket in the pod: `default` is the workload certificate with its
//! key, `ROOTCA` the tenant's trust bundle (the names Istio's translation uses, so a
//! `DestinationRule` with `ISTIO_MUTUAL` and an Istio-shaped transport socket work alike).
//!
//! State of the world per stream (xDS protocol, "SotW"): a request names the secrets it wants;
//! the agent answers with those it has, with a version that is a hash of their content, and
//! answers again whenever that content changes (a renewal, a bundle change). An ACK (a request
//! echoing the last version) gets no answer; a NACK is logged, and the next change is pushed.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{data_source::Specifier, DataSource};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, CertificateValidationContext, Secret, TlsCertificate,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use envoy_types::pb::google::protobuf::Any;
use futures::Stream;
use prost::Message;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};

use super::Secrets;

/// The workload certificate and key.
pub const DEFAULT_SECRET: &str = meshplane_ca::sds::WORKLOAD_CERT_SECRET;
/// The trust bundle.
pub const ROOT_SECRET: &str = meshplane_ca::sds::TRUST_BUNDLE_SECRET;
/// Type URL of an SDS resource.
pub const SECRET_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

fn inline(pem: &str) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(Specifier::InlineBytes(pem.as_bytes().to_vec())),
        ..Default::default()
    })
}

/// The secret `name` as it stands in `secrets`, if there is one yet.
pub fn secret(name: &str, secrets: &Secrets) -> Option<Secret> {
    let r#type = match name {
        DEFAULT_SECRET => {
            let cert = secrets.cert.as_ref()?;
            secret::Type::TlsCertificate(TlsCertificate {
                certificate_chain: inline(&cert.chain_pem),
                private_key: inline(&cert.key_pem),
                ..Default::default()
            })
        }
        ROOT_SECRET => {
            // The bundle of the bootstrap ConfigMap (two roots during a root rotation); before
            // it holds one, the root the instance returned with the certificate.
            let bundle = secrets
                .bundle
                .clone()
                .or_else(|| secrets.cert.as_ref().map(|c| c.root_pem.clone()))
                .filter(|b| !b.is_empty())?;
            secret::Type::ValidationContext(CertificateValidationContext {
                trusted_ca: inline(&bundle),
                ..Default::default()
            })
        }
        _ => return None,
    };
    Some(Secret {
        name: name.to_owned(),
        r#type: Some(r#type),
    })
}

/// The response carrying the requested secrets that exist; `None` when none does yet.
fn response(names: &BTreeSet<String>, secrets: &Secrets, nonce: u64) -> Option<DiscoveryResponse> {
    let found: Vec<Secret> = names.iter().filter_map(|n| secret(n, secrets)).collect();
    if found.is_empty() {
        return None;
    }
    let resources: Vec<Any> = found
        .iter()
        .map(|s| Any {
            type_url: SECRET_TYPE.into(),
            value: s.encode_to_vec(),
        })
        .collect();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for r in &resources {
        r.value.hash(&mut hasher);
    }
    Some(DiscoveryResponse {
        version_info: format!("{:016x}", hasher.finish()),
        resources,
        type_url: SECRET_TYPE.into(),
        nonce: nonce.to_string(),
        ..Default::default()
    })
}

/// The SDS service over the agent's secrets.
#[derive(Clone)]
pub struct SdsServer {
    secrets: watch::Receiver<Secrets>,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

/// One stream: what it asked for and what it was last sent.
async fn run_stream(
    mut inbound: Streaming<DiscoveryRequest>,
    mut secrets: watch::Receiver<Secrets>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) {
    let mut names = BTreeSet::new();
    let mut sent_version: Option<String> = None;
    let mut nonce = 0u64;
    loop {
        let changed = tokio::select! {
            request = inbound.message() => match request {
                Ok(Some(req)) => {
                    if let Some(error) = &req.error_detail {
                        tracing::warn!(names = ?req.resource_names, error = %error.message, "Envoy rejected a secret");
                    }
                    let wanted: BTreeSet<String> = req.resource_names.into_iter().collect();
                    let renamed = wanted != names;
                    names = wanted;
                    // A new subscription (or a changed one) is answered; an ACK is not.
                    renamed || sent_version.is_none()
                }
                Ok(None) | Err(_) => return,
            },
            changed = secrets.changed() => {
                if changed.is_err() {
                    return;
                }
                true
            }
        };
        if !changed {
            continue;
        }
        let current = secrets.borrow_and_update().clone();
        nonce += 1;
        let Some(resp) = response(&names, &current, nonce) else {
            continue;
        };
        if sent_version.as_deref() == Some(resp.version_info.as_str()) {
            continue;
        }
        sent_version = Some(resp.version_info.clone());
        if tx.send(Ok(resp)).await.is_err() {
            return;
        }
    }
}

#[tonic::async_trait]
impl SecretDiscoveryService for SdsServer {
    type StreamSecretsStream = ResponseStream;
    type DeltaSecretsStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(run_stream(request.into_inner(), self.secrets.clone(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_secrets(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented(
            "the node agent serves SDS in state-of-the-world mode (api_type GRPC)",
        ))
    }

    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let names = request.into_inner().resource_names.into_iter().collect();
        let current = self.secrets.borrow().clone();
        response(&names, &current, 0)
            .map(Response::new)
            .ok_or_else(|| Status::unavailable("the requested secrets are not issued yet"))
    }
}

/// Serves SDS on `listener` until `stop`.
pub async fn serve(
    listener: UnixListener,
    secrets: watch::Receiver<Secrets>,
    mut stop: watch::Receiver<bool>,
) {
    let result = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(SecretDiscoveryServiceServer::new(SdsServer { secrets }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "SDS server stopped");
    }
}
