//! A proxy's Envoy admin endpoint, reached as istioctl reaches it: through the API server's
//! `pods/portforward` subresource with the caller's own credentials (RBAC: `create` on
//! `pods/portforward` in the pod's namespace) to `localhost:15000` inside the pod. The admin
//! port listens on the pod's loopback only (contract 6), so nothing else in the cluster can
//! reach it; meshctl opens one forwarded connection per request.

use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http::{header, Method, Request};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use meshplane_crds::names::ports::PROXY_ADMIN;

/// How long one admin request may take, forward included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest admin response read (config dumps of large meshes run to tens of MiB).
const MAX_RESPONSE: usize = 256 * 1024 * 1024;

/// The admin endpoint of one pod's proxy.
#[derive(Clone)]
pub struct EnvoyAdmin {
    pods: Api<Pod>,
    namespace: String,
    pod: String,
}

impl EnvoyAdmin {
    pub fn new(client: kube::Client, namespace: &str, pod: &str) -> Self {
        EnvoyAdmin {
            pods: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            pod: pod.to_string(),
        }
    }

    /// `GET <path>` (e.g. `/config_dump`), the body on success.
    pub async fn get(&self, path: &str) -> anyhow::Result<Bytes> {
        self.request(Method::GET, path).await
    }

    /// `POST <path>` (the admin's changing endpoints, `/logging` among them).
    pub async fn post(&self, path: &str) -> anyhow::Result<Bytes> {
        self.request(Method::POST, path).await
    }

    async fn request(&self, method: Method, path: &str) -> anyhow::Result<Bytes> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.forwarded(method.clone(), path))
            .await
            .with_context(|| {
                format!(
                    "{method} {path} on the proxy of pod {}/{}: no answer within {REQUEST_TIMEOUT:?}",
                    self.namespace, self.pod
                )
            })?
            .with_context(|| {
                format!(
                    "{method} {path} on the proxy of pod {}/{} (Envoy admin, port {PROXY_ADMIN})",
                    self.namespace, self.pod
                )
            })
    }

    async fn forwarded(&self, method: Method, path: &str) -> anyhow::Result<Bytes> {
        let mut forwarder = self
            .pods
            .portforward(&self.pod, &[PROXY_ADMIN])
            .await
            .context("port-forward through the API server (needs create on pods/portforward)")?;
        let stream = forwarder
            .take_stream(PROXY_ADMIN)
            .context("the port-forward has no stream for the admin port")?;
        let forward_error = forwarder.take_error(PROXY_ADMIN);
        let exchange = async {
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            let connection = tokio::spawn(connection);
            let request = Request::builder()
                .method(method)
                .uri(path)
                .header(header::HOST, format!("localhost:{PROXY_ADMIN}"))
                .body(Empty::<Bytes>::new())?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
                .to_bytes();
            connection.abort();
            if !status.is_success() {
                bail!(
                    "the proxy answered {status}: {}",
                    String::from_utf8_lossy(&body).trim()
                );
            }
            anyhow::Ok(body)
        };
        let result = match forward_error {
            Some(error) => {
                tokio::select! {
                    result = exchange => result,
                    Some(message) = error => Err(anyhow::anyhow!("{message}")),
                }
            }
            None => exchange.await,
        };
        forwarder.abort();
        result
    }
}
