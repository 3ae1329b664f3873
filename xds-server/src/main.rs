//! `meshplane-xds`: one revision of one tenant's control plane (contract 1 of
//! docs/architecture.md).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use meshplane_crds::MeshConfig;
use meshplane_xds::admin::DebugAccess;
use meshplane_xds::ads::{AdsLimits, AdsServer};
use meshplane_xds::cli::{Args, Isolation, Source};
use meshplane_xds::credential_access::CredentialAccess;
use meshplane_xds::index::TenantIndex;
use meshplane_xds::metrics::Metrics;
use meshplane_xds::model::SourceEvent;
use meshplane_xds::push::{run_push_loop, ConfigGenerator, DebounceConfig, Hub, Pusher};
use meshplane_xds::report::config_events::EventSink;
use meshplane_xds::source_dir::run_dir_source_reporting;
use meshplane_xds::source_kube::{self, KubeSourceConfig};
use meshplane_xds::tenancy::TokenReviewer;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// jemalloc, with a background thread that returns freed pages to the system within about a
/// second: what a burst of large requests or many streams allocated is given back once they
/// end (glibc's malloc kept hundreds of MiB resident after such streams closed).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (read once, at its first allocation).
#[cfg(not(target_env = "msvc"))]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8; 60] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn generator(
    args: &Args,
    control_namespace: &str,
    events: EventSink,
    credential_access: Option<Arc<CredentialAccess>>,
) -> Box<dyn ConfigGenerator> {
    let index = TenantIndex::new(
        &args.tenant,
        &args.revision,
        control_namespace,
        MeshConfig {
            trust_domain: Some(args.trust_domain()),
            ..MeshConfig::default()
        },
    )
    .with_tags(args.tags.iter().cloned())
    .with_events(events);
    Box::new(match credential_access {
        Some(access) => index.with_credential_access(access),
        None => index,
    })
}

/// Runs the directory source; its end (an unreadable directory) ends the process.
fn spawn_dir_source(
    path: PathBuf,
    tx: mpsc::Sender<SourceEvent>,
    shutdown: watch::Sender<bool>,
    metrics: Arc<Metrics>,
) {
    tokio::spawn(async move {
        if let Err(e) = run_dir_source_reporting(&path, tx, Some(metrics)).await {
            tracing::error!(error = %e, "directory source stopped");
            let _ = shutdown.send(true);
        }
    });
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    meshplane_xds::logging::init(args.log_format, &args.tenant, &args.revision);
    let control_namespace = args
        .control_namespace
        .clone()
        .unwrap_or_else(|| meshplane_crds::names::control_namespace(&args.tenant));
    let audience = args
        .token_audience
        .clone()
        .unwrap_or_else(|| meshplane_crds::names::token_audience(&args.tenant));
    let pod_name = std::env::var(meshplane_contracts::instance::env::POD_NAME)
        .unwrap_or_else(|_| meshplane_crds::names::instance_name(&args.revision));

    let metrics = Arc::new(Metrics::for_instance(&args.tenant, &args.revision));
    let hub = Hub::new(&args.tenant, &args.revision, &control_namespace, metrics);
    // Kubernetes mode: config the index does not apply becomes Warning Events on it.
    let (event_sink, config_events) = match args.source {
        Source::Kube => {
            let (sink, rx) = meshplane_xds::report::config_events::channel();
            (sink, Some(rx))
        }
        Source::Dir(_) => (EventSink::default(), None),
    };
    // Kubernetes mode: gateway credentials only to ServiceAccounts that may read them.
    let credential_access = matches!(args.source, Source::Kube).then(CredentialAccess::new);
    let pusher = Pusher::new(
        Arc::clone(&hub),
        generator(
            &args,
            &control_namespace,
            event_sink,
            credential_access.clone(),
        ),
    );
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shutdown_rx_main = shutdown_rx.clone();
    let (events_tx, events_rx) = mpsc::channel::<SourceEvent>(1024);
    // The key fetcher feeds the index like a source (its status writer is Kubernetes mode's).
    let jwks_events = events_tx.clone();
    let mut jwks_status = None;

    let (reviewer, debug_access) = match &args.source {
        Source::Dir(path) => {
            spawn_dir_source(
                path.clone(),
                events_tx,
                shutdown_tx.clone(),
                Arc::clone(hub.metrics()),
            );
            (None, DebugAccess::loopback_only(&control_namespace))
        }
        Source::Kube => {
            let client = kube::Client::try_default()
                .await
                .context("connecting to the Kubernetes API")?;
            let (members_stale, stale_rx) = watch::channel(None);
            let (refused_watches, refused_rx) = watch::channel(None);
            let (status_scope, scope_rx) = watch::channel(None);
            let config = KubeSourceConfig {
                tenant: args.tenant.clone(),
                control_namespace: control_namespace.clone(),
                revision: args.revision.clone(),
                shared: args.isolation == Isolation::Shared,
                metrics: Arc::clone(hub.metrics()),
                members_stale,
                refused_watches,
                status_scope,
            };
            if let Some(access) = &credential_access {
                tokio::spawn(meshplane_xds::credential_access::run(
                    Arc::clone(access),
                    client.clone(),
                    Arc::clone(&hub),
                    events_tx.clone(),
                    shutdown_rx.clone(),
                ));
            }
            tokio::spawn(source_kube::run(client.clone(), config, events_tx));
            tokio::spawn(meshplane_xds::report::proxy_count::run(
                client.clone(),
                control_namespace.clone(),
                args.revision.clone(),
                pod_name.clone(),
                hub.connected_count(),
                meshplane_xds::report::proxy_count::Marks {
                    members_stale: stale_rx,
                    refused_watches: refused_rx,
                },
                shutdown_rx.clone(),
            ));
            jwks_status = Some(meshplane_xds::jwks::StatusWriter {
                client: client.clone(),
                revision: args.revision.clone(),
                scope: scope_rx.clone(),
            });
            // The Accepted condition of VirtualServices, DestinationRules and Gateways.
            tokio::spawn(meshplane_xds::report::config_status::run(
                client.clone(),
                args.revision.clone(),
                hub.diagnostics(),
                scope_rx.clone(),
            ));
            if let Some(rx) = config_events {
                tokio::spawn(meshplane_xds::report::config_events::run(
                    client.clone(),
                    args.revision.clone(),
                    pod_name.clone(),
                    rx,
                    scope_rx.clone(),
                ));
            }
            // Debug tokens (contract 12) have their own audience and their own cache, so a
            // debug token never opens an ADS stream and a proxy's token never reads /debug.
            let budget = args.review_budget();
            let debug_reviewer = TokenReviewer::with_budget(
                client.clone(),
                meshplane_contracts::debug::audience(&args.tenant),
                budget,
            )
            .for_service("debug")
            .reporting_to(Arc::clone(hub.metrics()));
            (
                Some(TokenReviewer::with_budget(client, audience, budget)),
                DebugAccess::new(Some(debug_reviewer), &control_namespace),
            )
        }
    };

    let debounce = DebounceConfig {
        quiet: Duration::from_millis(args.debounce_quiet_ms),
        max: Duration::from_millis(args.debounce_max_ms.max(args.debounce_quiet_ms)),
        isolated_quiet: Duration::from_millis(args.debounce_isolated_quiet_ms),
    };
    tokio::spawn(meshplane_xds::jwks::run(
        hub.jwks_plan(),
        jwks_events,
        jwks_status,
    ));
    let push = tokio::spawn(run_push_loop(
        pusher,
        events_rx,
        debounce,
        shutdown_rx.clone(),
    ));

    if args.xds_addr.is_none() && args.xds_tls_addr.is_none() {
        anyhow::bail!(
            "give --xds-tls-addr (TLS ADS and certificates) or --xds-addr (plaintext ADS)"
        );
    }
    meshplane_ca::spiffe::validate_trust_domain(&args.trust_domain()).context("--trust-domain")?;
    let xds_listener = match args.xds_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding ADS on {addr}"))?,
        ),
        None => None,
    };
    let xds_tls_listener = match args.xds_tls_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding TLS ADS on {addr}"))?,
        ),
        None => None,
    };
    let monitoring_listener = TcpListener::bind(args.monitoring_addr)
        .await
        .with_context(|| format!("binding monitoring on {}", args.monitoring_addr))?;
    tracing::info!(
        tenant = %args.tenant,
        revision = %args.revision,
        xds = ?xds_listener.as_ref().and_then(|l| l.local_addr().ok()),
        xds_tls = ?xds_tls_listener.as_ref().and_then(|l| l.local_addr().ok()),
        monitoring = %monitoring_listener.local_addr()?,
        "meshplane-xds listening"
    );

    let webhooks = spawn_webhooks(
        &args,
        Arc::clone(&hub),
        shutdown_rx.clone(),
        shutdown_tx.clone(),
    );

    let limits = AdsLimits {
        streams_per_connection: args.max_streams_per_connection.max(1),
        proxies_per_namespace: args.max_proxies_per_namespace.max(1),
        honor_loopback: args.loopback_addr.is_some(),
        ..AdsLimits::default()
    };
    let ads_server = AdsServer::new(Arc::clone(&hub), reviewer.clone(), shutdown_rx.clone())
        .with_limits(limits)
        .with_vhds(args.vhds)
        .with_credential_access(credential_access);
    let ads = xds_listener.map(|listener| tokio::spawn(ads_server.clone().serve(listener)));
    let secure = match xds_tls_listener {
        Some(listener) => Some(spawn_secure(
            &args,
            &control_namespace,
            listener,
            ads_server,
            reviewer,
            Arc::clone(&hub),
            shutdown_rx.clone(),
        )?),
        None => None,
    };
    let admin = tokio::spawn(meshplane_xds::admin::serve(
        monitoring_listener,
        hub,
        debug_access,
        shutdown_rx,
    ));

    let mut stopped = shutdown_rx_main;
    tokio::select! {
        () = shutdown_signal() => {}
        _ = stopped.wait_for(|s| *s) => {}
    }
    tracing::info!("shutting down");
    let _ = shutdown_tx.send(true);
    if let Some(ads) = ads {
        ads.await.context("ADS task")?.context("ADS server")?;
    }
    if let Some(secure) = secure {
        secure
            .await
            .context("TLS ADS task")?
            .context("TLS ADS server")?;
    }
    admin
        .await
        .context("monitoring task")?
        .context("monitoring server")?;
    let _ = push.await;
    if let Some(webhooks) = webhooks {
        let _ = webhooks.await;
    }
    Ok(())
}

/// Serves ADS and the certificate service on the TLS port, with a serving certificate of the
/// tenant CA for the instance Service's names. Without a token reviewer (directory mode) the
/// certificate service is off: it has nobody to ask who a caller is.
fn spawn_secure(
    args: &Args,
    control_namespace: &str,
    listener: TcpListener,
    ads: AdsServer,
    reviewer: Option<TokenReviewer>,
    hub: Arc<Hub>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>> {
    use meshplane_xds::identity::{secure, CaDirectory, CertificateServer, ServingCert};
    let ca = Arc::new(CaDirectory::new(&args.ca_dir).reporting_to(Arc::clone(hub.metrics())));
    if let Err(e) = ca.authority() {
        tracing::warn!(error = %e, "the TLS port has no certificate until the tenant CA loads");
    }
    let instance = meshplane_crds::names::instance_name(&args.revision);
    let host = meshplane_crds::names::service_host(&args.revision, control_namespace);
    let mut dns_names = vec![
        host.clone(),
        format!("{host}.cluster.local"),
        format!("{instance}.{control_namespace}"),
        instance.clone(),
    ];
    dns_names.extend(args.serving_dns_names.iter().cloned());
    let identity =
        meshplane_ca::SpiffeId::new(&args.trust_domain(), control_namespace, &instance).ok();
    let serving = Arc::new(ServingCert::new(
        Arc::clone(&ca),
        dns_names,
        identity,
        meshplane_ca::verify::provider(),
    ));
    let tls = secure::server_config(serving).context("TLS configuration of the ADS port")?;
    let certificates = reviewer.map(|r| CertificateServer::new(ca, r, hub, args.trust_domain()));
    Ok(tokio::spawn(secure::serve_secure(
        listener,
        tls,
        ads,
        certificates,
        shutdown,
    )))
}

/// The tenant membership the validating webhook checks against, from the hub's index: members,
/// EnvoyFilter policy, the cluster's pod networks and the tenant's pod addresses; and the
/// tenant's trust domain.
struct HubTenant(Arc<Hub>, String);

impl meshplane_webhooks::TenantView for HubTenant {
    fn tenant(&self) -> &str {
        self.0.tenant()
    }
    fn control_namespace(&self) -> &str {
        self.0.control_namespace()
    }
    fn is_member(&self, namespace: &str) -> bool {
        self.0.admits_namespace(namespace)
    }
    fn envoy_filter_policy(&self) -> meshplane_crds::envoyfilter_policy::EnvoyFilterPolicy {
        (*self.0.envoy_filter_policy()).clone()
    }
    fn trust_domain(&self) -> Option<&str> {
        Some(&self.1)
    }
    fn pod_networks(&self) -> Vec<ipnet::IpNet> {
        (*self.0.pod_networks()).clone()
    }
    fn is_tenant_pod_address(&self, address: std::net::IpAddr) -> bool {
        self.0.is_tenant_pod_address(address)
    }
}

/// Serves the admission webhooks (contract 5) until shutdown. In Kubernetes mode a webhook
/// server that cannot start ends the process: with failurePolicy Fail, pod creation in the
/// revision's namespaces depends on it.
fn spawn_webhooks(
    args: &Args,
    hub: Arc<Hub>,
    shutdown: watch::Receiver<bool>,
    stop_all: watch::Sender<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let Some(proxy_image) = args.proxy_image.clone() else {
        tracing::warn!(
            "no --proxy-image (MESHPLANE_PROXY_IMAGE): admission webhooks are not served"
        );
        return None;
    };
    let injection = meshplane_webhooks::inject::InjectionConfig {
        tenant: args.tenant.clone(),
        revision: args.revision.clone(),
        proxy_image,
        trust_domain: args.trust_domain(),
        default_capture_mode: meshplane_webhooks::inject::CaptureMode::Default,
    };
    let metrics = Arc::clone(hub.metrics());
    let handlers = Arc::new(
        meshplane_webhooks::Webhooks::new(injection, Arc::new(HubTenant(hub, args.trust_domain())))
            .with_metrics(metrics.webhooks().clone()),
    );
    let on_refusal: meshplane_webhooks::client_auth::RefusalHook =
        Arc::new(move |reason| metrics.webhook_refused(reason));
    let (addr, tls_dir) = (args.webhook_addr, args.webhook_tls_dir.clone());
    let fatal = matches!(args.source, Source::Kube);
    Some(tokio::spawn(async move {
        let mut shutdown = shutdown;
        let stopped = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        if let Err(e) =
            meshplane_webhooks::serve(addr, tls_dir, handlers, Some(on_refusal), stopped).await
        {
            tracing::error!(error = %e, "admission webhook server stopped");
            if fatal {
                let _ = stop_all.send(true);
            }
        }
    }))
}
