//! `meshplane-operator`: runs the MeshControlPlane and MeshRevisionTag controllers (when it
//! leads), the admission check of the meshplane API, and the monitoring endpoints.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use meshplane_crds::names;
use meshplane_operator::controller::{self, Context, Settings};
use meshplane_operator::leader::LeaderElector;
use meshplane_operator::metrics::Metrics;
use meshplane_operator::server::{self, Health};
use meshplane_operator::tls::{self, SharedTlsStep, WebhookTls};
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

/// How often a replica re-reads the shared Secret (reload, rotation, caBundle drift) once it
/// serves a trusted certificate, and how soon it retries before.
const TLS_RESYNC: Duration = Duration::from_secs(30);
const TLS_RETRY: Duration = Duration::from_secs(2);

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

fn is_conflict(e: &anyhow::Error) -> bool {
    e.downcast_ref::<kube::Error>()
        .is_some_and(|k| matches!(k, kube::Error::Api(s) if s.code == 409))
}

/// Reads the shared Secret, then creates it (POST), keeps it, or rotates it (replace guarded by
/// the resourceVersion read) as [`tls::shared_tls_step`] decides. A 409 means another replica
/// wrote first: re-read and adopt its material.
async fn sync_shared_tls(
    api: &Api<Secret>,
    name: &str,
    host: &str,
    validity: time::Duration,
) -> anyhow::Result<WebhookTls> {
    for _ in 0..5 {
        let current = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading Secret {name}"))?;
        let observed = match &current {
            Some(secret) => WebhookTls::from_secret_data(&serde_json::to_value(&secret.data)?),
            None => None,
        };
        let step = tls::shared_tls_step(
            current.is_some(),
            observed,
            host,
            time::OffsetDateTime::now_utc(),
            validity,
        )?;
        let (tls, resource_version) = match step {
            SharedTlsStep::Use(tls) => return Ok(tls),
            SharedTlsStep::Create(tls) => (tls, None),
            SharedTlsStep::Update(tls) => {
                let rv = current.and_then(|s| s.metadata.resource_version);
                (tls, Some(rv.context("the Secret has no resourceVersion")?))
            }
        };
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "resourceVersion": resource_version,
                "labels": {"app.kubernetes.io/managed-by": "meshplane"},
            },
            "type": meshplane_contracts::webhook_tls::SECRET_TYPE,
            "data": tls.secret_data(),
        }))?;
        let written = match &resource_version {
            None => api.create(&PostParams::default(), &secret).await,
            Some(_) => api.replace(name, &PostParams::default(), &secret).await,
        };
        match written.map_err(anyhow::Error::from) {
            Ok(_) => {
                info!(
                    secret = name,
                    rotated = resource_version.is_some(),
                    "issued the shared admission certificate"
                );
                return Ok(tls);
            }
            Err(e) if is_conflict(&e) => {
                info!(
                    secret = name,
                    "another replica wrote the admission certificate first; adopting it"
                );
            }
            Err(e) => return Err(e).with_context(|| format!("writing Secret {name}")),
        }
    }
    anyhow::bail!("Secret {name} kept changing under us")
}

/// Keeps every caBundle of the operator's webhook configuration equal to the shared Secret's
/// `ca.crt` (see [`tls::ca_bundle_needs_write`]); returns whether all of them then trust the
/// CA of the served certificate. Retries when another replica wrote in between.
async fn publish_ca_bundle(
    client: &Client,
    config_name: &str,
    tls: &WebhookTls,
) -> anyhow::Result<bool> {
    let mut attempt = 0;
    loop {
        match try_publish_ca_bundle(client, config_name, tls).await {
            Err(e) if attempt < 5 && is_conflict(&e) => attempt += 1,
            other => return other,
        }
    }
}

async fn try_publish_ca_bundle(
    client: &Client,
    config_name: &str,
    tls: &WebhookTls,
) -> anyhow::Result<bool> {
    let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let current = api
        .get(config_name)
        .await
        .context("reading the operator's webhook configuration")?;
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
    .context("setting caBundle")?;
    info!(
        config = config_name,
        "caBundle set to the shared admission CA"
    );
    Ok(true)
}

/// Serves the shared admission certificate: syncs the Secret, keeps the caBundle equal to its
/// `ca.crt`, swaps the serving certificate when the Secret changes (only once the caBundle
/// trusts it, unless nothing is served yet), and reports ready only while the served
/// certificate's CA is in the caBundle.
async fn run_shared_tls(
    client: Client,
    args: SharedTlsArgs,
    configs: watch::Sender<Option<Arc<rustls::ServerConfig>>>,
    health: Health,
    stop_rx: watch::Receiver<bool>,
) {
    let api = Api::<Secret>::namespaced(client.clone(), &args.namespace);
    let mut served: Option<WebhookTls> = None;
    let mut stop = stop_rx;
    loop {
        let mut ready = false;
        match sync_shared_tls(&api, &args.secret, &args.host, args.validity).await {
            Ok(tls) => {
                let trusted = if args.config_name.is_empty() {
                    true
                } else {
                    publish_ca_bundle(&client, &args.config_name, &tls)
                        .await
                        .unwrap_or_else(|e| {
                            warn!(error = %e, "could not publish the admission CA");
                            false
                        })
                };
                if served.as_ref() != Some(&tls) && (trusted || served.is_none()) {
                    match server::rustls_config(&tls.cert_pem, &tls.key_pem) {
                        Ok(config) => {
                            configs.send_replace(Some(config));
                            served = Some(tls.clone());
                            info!(secret = %args.secret, "serving the shared admission certificate");
                        }
                        Err(e) => warn!(error = %e, "the shared admission certificate is unusable"),
                    }
                }
                ready = trusted && served.as_ref() == Some(&tls);
            }
            Err(e) => warn!(error = %e, "could not sync the shared admission certificate"),
        }
        health.set_ready(ready);
        let pause = if ready { TLS_RESYNC } else { TLS_RETRY };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {},
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

struct SharedTlsArgs {
    namespace: String,
    secret: String,
    host: String,
    config_name: String,
    validity: time::Duration,
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
            tls_tx.send_replace(Some(server::rustls_config(&cert_pem, &key_pem)?));
            health.set_ready(true);
            None
        }
        None => Some(tokio::spawn(run_shared_tls(
            client.clone(),
            SharedTlsArgs {
                host: args.webhook_host.clone().unwrap_or_else(|| {
                    meshplane_contracts::operator_tls::service_host(&args.namespace)
                }),
                namespace: args.namespace.clone(),
                secret: args.webhook_tls_secret.clone(),
                config_name: args.webhook_config_name.clone(),
                validity: time::Duration::days(args.tls_validity_days),
            },
            tls_tx,
            health.clone(),
            stop_rx.clone(),
        ))),
    };
    let admission_task = tokio::spawn(server::serve_https_reloading(
        admission,
        tls_rx,
        server::admission_router(client.clone()),
        stopped(&stop_rx),
    ));

    let settings = Settings {
        tls_validity: time::Duration::days(args.tls_validity_days),
        resync: Duration::from_secs(args.resync_seconds),
        operator_account: meshplane_operator::render::OperatorAccount {
            namespace: args.namespace.clone(),
            name: args.service_account.clone(),
        },
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
        tokio::select! {
            _ = elector.acquire() => {},
            _ = stop_wait.wait_for(|s| *s) => {},
        }
        if !*stop_rx.borrow() {
            let holder = elector.clone();
            let lost_tx = stop_tx.clone();
            let holding = tokio::spawn(async move {
                holder.hold().await;
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
