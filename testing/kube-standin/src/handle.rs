//! Starting and stopping a stand-in, its kubeconfigs, and the fault injection tests use.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;

use super::admission::{Dialer, WebhookClientCredentials};
use super::auth::{Authenticator, Identity};
use super::pod_log::PodLogs;
use super::port_forward::PodConnector;
use super::rbac::Authorizer;
use super::requests::{RequestCounter, RequestCounts};
use super::server::{self, ServerState};
use super::store::Store;
use super::tls::{serving_tls, TlsError};

/// How to start a stand-in.
#[derive(Debug, Clone)]
pub struct StandInOptions {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Where kubeconfigs are written; None: a fresh directory under the system temp dir.
    pub kubeconfig_dir: Option<PathBuf>,
    /// How many past events watches can resume from before getting 410 Gone.
    pub history_limit: usize,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Where pods reach the API (the `kubernetes` Service's endpoint, e.g. a relay in the test
    /// network); None: the `kubernetes` Service has no endpoints.
    pub advertise_address: Option<SocketAddr>,
    /// How admission webhooks are reached (default: from the stand-in's own network).
    pub webhook_dialer: Dialer,
    /// Client certificates presented to admission webhooks, by webhook host, as a real API
    /// server's `WebhookAdmissionConfiguration` kubeconfig gives them (default: none).
    pub webhook_credentials: WebhookClientCredentials,
    /// How `pods/<name>/portforward` reaches `localhost:<port>` inside a pod (default: no node
    /// runs pods, every forward fails on its error channel).
    pub pod_connector: PodConnector,
    /// How `pods/<name>/log` reads what a container wrote (default: every log is empty).
    pub pod_logs: PodLogs,
}

impl Default for StandInOptions {
    fn default() -> Self {
        Self {
            port: 0,
            kubeconfig_dir: None,
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(5),
            advertise_address: None,
            webhook_dialer: Dialer::default(),
            webhook_credentials: WebhookClientCredentials::default(),
            pod_connector: PodConnector::default(),
            pod_logs: PodLogs::default(),
        }
    }
}

/// Why a stand-in could not start.
#[derive(Debug, thiserror::Error)]
pub enum StandInError {
    #[error("binding 127.0.0.1:{port}: {source}")]
    Bind {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("creating kubeconfig directory {path}: {source}")]
    KubeconfigDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("loading kubeconfig {path}: {message}")]
    Client { path: String, message: String },
}

/// The Kubernetes API stand-in (a test fixture).
pub struct StandIn;

impl StandIn {
    /// Starts a stand-in on 127.0.0.1 and writes kubeconfigs for the admin, the operator and
    /// the pod runner (`admin.kubeconfig`, `operator.kubeconfig`, `node.kubeconfig`).
    pub async fn start(opts: StandInOptions) -> Result<StandInHandle, StandInError> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port))
            .await
            .map_err(|source| StandInError::Bind {
                port: opts.port,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StandInError::Bind {
            port: opts.port,
            source,
        })?;
        let dir = match &opts.kubeconfig_dir {
            Some(d) => d.clone(),
            None => std::env::temp_dir().join(format!(
                "kube-standin-{}-{}",
                addr.port(),
                rand::random::<u32>()
            )),
        };
        std::fs::create_dir_all(&dir).map_err(|source| StandInError::KubeconfigDir {
            path: dir.display().to_string(),
            source,
        })?;
        let store = Store::new(opts.history_limit);
        let auth = Arc::new(Authenticator::new());
        let requests = Arc::new(RequestCounter::default());
        let authorizer = Arc::new(Authorizer::new());
        let state = Arc::new(ServerState {
            store: store.clone(),
            auth: auth.clone(),
            address: addr.to_string(),
            bookmark_interval: opts.bookmark_interval,
            requests: requests.clone(),
            webhook_dialer: opts.webhook_dialer.clone(),
            webhook_credentials: opts.webhook_credentials.clone(),
            pod_connector: opts.pod_connector.clone(),
            pod_logs: opts.pod_logs.clone(),
            authorizer: authorizer.clone(),
        });
        if let Some(address) = opts.advertise_address {
            store.advertise_api(address);
        }
        let app = axum::Router::new()
            .fallback(server::handle)
            .with_state(state);
        let tls = serving_tls()?;
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        tokio::spawn(serve(
            listener,
            TlsAcceptor::from(tls.config),
            app,
            shutdown_rx,
        ));
        let handle = StandInHandle {
            addr,
            dir,
            store,
            auth,
            requests,
            authorizer,
            ca_pem: tls.ca_pem,
            shutdown: Some(shutdown_tx),
        };
        for identity in [Identity::Admin, Identity::Operator, Identity::Node] {
            handle.kubeconfig(&identity)?;
        }
        tracing::info!(%addr, "kube-standin (test fixture) listening");
        Ok(handle)
    }
}

/// Accepts connections and serves HTTP/1.1 and HTTP/2 on them (over TLS, or plain) until
/// shutdown.
async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: axum::Router,
    mut shutdown: oneshot::Receiver<()>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // A TLS ClientHello starts with record type 0x16; anything else is plain HTTP
            // (raw test clients), served on the same port.
            let mut first = [0u8; 1];
            let is_tls = matches!(tcp.peek(&mut first).await, Ok(1) if first[0] == 0x16);
            let served = if is_tls {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                };
                builder
                    .serve_connection_with_upgrades(TokioIo::new(tls), service)
                    .await
            } else {
                builder
                    .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                    .await
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

/// A kubeconfig with one cluster (server URL and CA), one token user and one context.
fn kubeconfig_yaml(server_url: &str, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    // JSON strings are valid YAML scalars and need no further escaping.
    let server = serde_json::Value::from(server_url);
    let token = serde_json::Value::from(token);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: standin-user\n  user:\n    token: {token}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin-user\ncurrent-context: standin\n"
    )
}

/// A running stand-in. Dropping it stops the server.
pub struct StandInHandle {
    addr: SocketAddr,
    dir: PathBuf,
    store: Arc<Store>,
    auth: Arc<Authenticator>,
    requests: Arc<RequestCounter>,
    authorizer: Arc<Authorizer>,
    ca_pem: String,
    shutdown: Option<oneshot::Sender<()>>,
}

impl StandInHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// `http://127.0.0.1:<port>`: the same server without TLS, for raw test clients (kubectl
    /// sends tokens only over HTTPS).
    pub fn plain_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// PEM of the CA that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn kubeconfig_dir(&self) -> &Path {
        &self.dir
    }

    /// Path of a kubeconfig acting as `identity`, written now (ServiceAccounts get a fresh token).
    pub fn kubeconfig(&self, identity: &Identity) -> Result<PathBuf, StandInError> {
        let file = match identity {
            Identity::Admin => "admin.kubeconfig".to_string(),
            Identity::Operator => "operator.kubeconfig".to_string(),
            Identity::Node => "node.kubeconfig".to_string(),
            Identity::ServiceAccount { namespace, name } => {
                format!("sa-{namespace}-{name}.kubeconfig")
            }
        };
        let path = self.dir.join(file);
        let token = self.auth.token_for(identity);
        std::fs::write(&path, kubeconfig_yaml(&self.url(), &self.ca_pem, &token)).map_err(
            |source| StandInError::KubeconfigDir {
                path: path.display().to_string(),
                source,
            },
        )?;
        Ok(path)
    }

    /// The bearer token of an identity.
    pub fn token(&self, identity: &Identity) -> String {
        self.auth.token_for(identity)
    }

    /// Issues a ServiceAccount token directly, for any audiences and lifetime (zero gives a
    /// token that has already expired): what a test needs beyond TokenRequest's limits.
    pub fn issue_service_account_token(
        &self,
        namespace: &str,
        name: &str,
        audiences: &[&str],
        lifetime: std::time::Duration,
    ) -> String {
        let audiences = audiences.iter().map(|a| a.to_string()).collect();
        self.auth
            .issue_service_account_token(namespace, name, audiences, lifetime, None)
            .0
    }

    /// A kube client acting as `identity`, through its written kubeconfig.
    pub async fn client(&self, identity: &Identity) -> Result<kube::Client, StandInError> {
        let path = self.kubeconfig(identity)?;
        let err = |message: String| StandInError::Client {
            path: path.display().to_string(),
            message,
        };
        let kubeconfig =
            kube::config::Kubeconfig::read_from(&path).map_err(|e| err(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| err(e.to_string()))?;
        kube::Client::try_from(config).map_err(|e| err(e.to_string()))
    }

    /// Resource requests answered so far, by verb, and the latest writes (what
    /// `GET /standin/requests` serves to other processes).
    pub fn requests(&self) -> RequestCounts {
        self.requests.snapshot()
    }

    /// How many RBAC rule sets the authorizer has read from the store (its cache's misses).
    pub fn rbac_resolutions(&self) -> u64 {
        self.authorizer.resolutions()
    }

    /// How many watch streams are open right now.
    pub fn open_watches(&self) -> usize {
        self.store.open_watches()
    }

    /// Open watch streams by resource (`<plural>` for the core group, else
    /// `<plural>.<group>`), kept current: `wait_for` awaits a count.
    pub fn watches_by_resource(
        &self,
    ) -> tokio::sync::watch::Receiver<std::collections::BTreeMap<String, usize>> {
        self.store.watches_by_resource()
    }

    /// Ends every open watch stream; clients must reconnect (and resume).
    pub fn drop_all_watches(&self) {
        self.store.drop_all_watches();
    }

    /// Forgets the event history: resuming a watch from any version seen so far gets 410 Gone.
    pub fn expire_history(&self) {
        self.store.expire_history();
    }

    /// Stops serving.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.store.drop_all_watches();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for StandInHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
