//! `meshplane-operator`: runs the MeshControlPlane and MeshRevisionTag controllers (when it
//! leads), the admission check of the meshplane API, and the monitoring endpoints.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use kube::Client;
use meshplane_operator::admission_tls::{self, SharedTls};
use meshplane_operator::controller::{self, Context, Settings};
use meshplane_operator::leader::LeaderElector;
use meshplane_operator::metrics::Metrics;
use meshplane_operator::server::{self, Health};
use meshplane_webhooks::client_auth::ClientAuth;
use tokio::sync::watch;
use tracing::{info, warn};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Reconciles MeshControlPlane and MeshRevisionTag into isolated per-tenant service-mesh
/// control planes. Connects to the cluster like kubectl (KUBECONFIG, else in-cluster).
#[derive(Debug, Parser)]
#[command(name = "meshplane-operator", version)]
struct Args {
    /// Address of /metrics, /healthz and /readyz (plain HTTP).
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Address of the HTTPS admission check /validate-meshplane.
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_addr: SocketAddr,
    /// Directory with tls.crt and tls.key for the admission check (a mounted Secret). When
    /// absent, all replicas share one certificate kept in the Secret --webhook-tls-secret
    /// (issued by whichever replica creates it first, rotated there), whose CA is kept in the
    /// caBundle of --webhook-config-name.
    #[arg(long)]
    webhook_tls_dir: Option<PathBuf>,
    /// Namespace of the operator (its Service and the shared webhook TLS Secret).
    #[arg(long, env = "POD_NAMESPACE", default_value = "meshplane-system")]
    namespace: String,
    /// The operator's own ServiceAccount in --namespace: each member namespace binds it the
    /// right to restart workloads there (revision migrations).
    #[arg(long, default_value = "meshplane-operator")]
    service_account: String,
    /// Secret in --namespace holding the replicas' shared admission certificate.
    #[arg(long, default_value = WEBHOOK_TLS_SECRET)]
    webhook_tls_secret: String,
    /// DNS name of the operator's Service, the subject of the shared certificate
    /// (default `meshplane-operator.<namespace>.svc`).
    #[arg(long)]
    webhook_host: Option<String>,
    /// ValidatingWebhookConfiguration whose caBundle receives the shared CA ("" = none).
    #[arg(long, default_value = meshplane_contracts::operator_tls::WEBHOOK_CONFIGURATION)]
    webhook_config_name: String,
    /// Run the controllers only while holding the Lease (safe with several replicas).
    #[arg(long)]
    leader_election: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "meshplane-system")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "meshplane-operator")]
    lease_name: String,
    /// Identity in the Lease (defaults to the pod name, else host name and pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Lease duration in seconds; renewals happen every third of it.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// PEM file with the CA bundle that signs the Kubernetes API server's admission client
    /// certificate (the kubeconfig of its `--admission-control-config-file`). When set, the
    /// operator's /validate-meshplane and every instance's /inject and /validate answer only
    /// callers presenting a certificate of this CA (others get 401 or 403, /healthz stays
    /// open); the operator hands it to the instances as `client-ca.crt` in their webhook TLS
    /// Secrets. Reloaded when the file changes (instances get it at their next reconcile).
    /// Unset: admission calls are not authenticated (a NetworkPolicy cannot name the API
    /// server). See docs/webhooks.md, "Authenticating the API server".
    #[arg(long, value_name = "FILE")]
    apiserver_client_ca: Option<PathBuf>,
    /// With --apiserver-client-ca: an identity the API server's client certificate must carry
    /// (subject CN, DNS or URI SAN); repeat or separate with commas to accept several. Unset:
    /// any certificate of the CA.
    #[arg(
        long,
        value_name = "NAME",
        value_delimiter = ',',
        requires = "apiserver_client_ca"
    )]
    apiserver_client_name: Vec<String>,
    /// Validity of the webhook certificates issued for instances, in days.
    #[arg(long, default_value_t = 90)]
    tls_validity_days: i64,
    /// Periodic resync of every object, in seconds.
    #[arg(long, default_value_t = 300)]
    resync_seconds: u64,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// Default name of the Secret shared by the operator's replicas for admission TLS.
const WEBHOOK_TLS_SECRET: &str = meshplane_contracts::operator_tls::SECRET_NAME;

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder.json().with_current_span(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// Completes on SIGTERM or Ctrl-C.
async fn termination() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "cannot listen for SIGTERM");
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn stopped(
    rx: &watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static {
    let rx = rx.clone();
    futures::FutureExt::shared(Box::pin(async move {
        let mut rx = rx;
        let _ = rx.wait_for(|stop| *stop).await;
    }))
}

/// How long in-flight reconciles may take to finish after shutdown was requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the controllers until shutdown; in-flight reconciles get [`SHUTDOWN_GRACE`] to finish
/// (watchers stuck in retry would otherwise hold the process past its termination period).
async fn run_controllers(ctx: Arc<Context>, stop_rx: &watch::Receiver<bool>) {
    let controllers = controller::run(ctx, stopped(stop_rx));
    let deadline = {
        let stop = stopped(stop_rx);
        async move {
            stop.await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        }
    };
    tokio::select! {
        _ = controllers => {},
        _ = deadline => warn!("controllers did not stop within the grace period; exiting anyway"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(args.log_format);
    // Checked before anything else: the operator must not serve without the CA it was told to
    // require.
    let client_auth = match &args.apiserver_client_ca {
        Some(path) => {
            let auth = ClientAuth::from_file(
                path.clone(),
                args.apiserver_client_name.clone(),
                Arc::new(rustls::crypto::ring::default_provider()),
            )
            .with_context(|| "--apiserver-client-ca".to_string())?;
            info!(ca = %path.display(), names = ?args.apiserver_client_name, "admission calls need the API server's client certificate");
            Some(Arc::new(auth))
        }
        None => None,
    };

    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let metrics = Arc::new(Metrics::default());
    let health = Health::default();

    let (stop_tx, stop_rx) = watch::channel(false);
    let signal_tx = stop_tx.clone();
    tokio::spawn(async move {
        termination().await;
        info!("termination requested, shutting down");
        let _ = signal_tx.send(true);
    });

    let monitoring = server::bind(args.metrics_addr).await?;
    let router = server::monitoring_router(metrics.clone(), health.clone());
    let monitoring_stop = stopped(&stop_rx);
    let monitoring_task = tokio::spawn(async move {
        if let Err(e) = axum::serve(monitoring, router)
            .with_graceful_shutdown(monitoring_stop)
            .await
        {
            warn!(error = %e, "monitoring server failed");
        }
    });

    let admission = server::bind(args.webhook_addr).await?;
    let (tls_tx, tls_rx) = watch::channel(None);
    let tls_task = match &args.webhook_tls_dir {
        Some(dir) => {
            let (cert_pem, key_pem) = server::read_tls_dir(dir)?;
            tls_tx.send_replace(Some(server::rustls_config(
                &cert_pem,
                &key_pem,
                client_auth.clone(),
            )?));
            health.set_ready(true);
            None
        }
        None => Some(tokio::spawn(admission_tls::run(
            client.clone(),
            SharedTls {
                host: args.webhook_host.clone().unwrap_or_else(|| {
                    meshplane_contracts::operator_tls::service_host(&args.namespace)
                }),
                namespace: args.namespace.clone(),
                secret: args.webhook_tls_secret.clone(),
                config_name: args.webhook_config_name.clone(),
                validity: time::Duration::days(args.tls_validity_days),
            },
            client_auth.clone(),
            Arc::new(time::OffsetDateTime::now_utc),
            tls_tx,
            health.clone(),
            stop_rx.clone(),
        ))),
    };
    let admission_task = tokio::spawn(server::serve_https_reloading(
        admission,
        tls_rx,
        server::admission_router(client.clone(), client_auth.clone(), metrics.clone()),
        stopped(&stop_rx),
    ));

    let settings = Settings {
        tls_validity: time::Duration::days(args.tls_validity_days),
        resync: Duration::from_secs(args.resync_seconds),
        operator_account: meshplane_operator::render::OperatorAccount {
            namespace: args.namespace.clone(),
            name: args.service_account.clone(),
        },
        apiserver_client: client_auth,
        ..Settings::default()
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        metrics,
        settings,
        Arc::new(time::OffsetDateTime::now_utc),
    ));

    let mut lost_leadership = false;
    if args.leader_election {
        let identity = args.identity.clone().unwrap_or_else(|| {
            format!(
                "{}-{}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| "operator".into()),
                std::process::id()
            )
        });
        let elector = Arc::new(LeaderElector::new(
            client.clone(),
            &args.lease_namespace,
            &args.lease_name,
            &identity,
            Duration::from_secs(args.lease_duration_seconds),
        ));
        let mut stop_wait = stop_rx.clone();
        let acquired = tokio::select! {
            at = elector.acquire() => Some(at),
            _ = stop_wait.wait_for(|s| *s) => None,
        };
        if let Some(acquired) = acquired.filter(|_| !*stop_rx.borrow()) {
            let holder = elector.clone();
            let lost_tx = stop_tx.clone();
            let holding = tokio::spawn(async move {
                holder.hold(acquired).await;
                let _ = lost_tx.send(true);
                true
            });
            run_controllers(ctx, &stop_rx).await;
            lost_leadership = holding.is_finished() && holding.await.unwrap_or(false);
            elector.release().await;
        }
    } else {
        run_controllers(ctx, &stop_rx).await;
    }
    let _ = stop_tx.send(true);
    let _ = tokio::join!(monitoring_task, admission_task);
    if let Some(task) = tls_task {
        let _ = task.await;
    }
    if lost_leadership {
        anyhow::bail!("lost leadership; exiting so that a fresh process rejoins the election");
    }
    info!("stopped");
    Ok(())
}
