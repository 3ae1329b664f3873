//! The runner's control loop: watch caches of the objects it acts on, and one reconcile pass
//! on every change and every tick (readiness probes and restarts need the tick).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;

use super::container::ProcessRegistry;
use super::deployments::DeploymentController;
use super::endpoints::EndpointController;
use super::error::PodRunnerError;
use super::local_pod::{LocalPod, PodEnvironment};
use super::net::TestNetwork;
use super::service_accounts::DefaultServiceAccounts;
use super::services::{api_service, service_names, service_routes};
use super::volumes::ObjectData;
use super::PodRunnerOptions;

/// Probes and container restarts are noticed at least this often.
const TICK: Duration = Duration::from_secs(1);
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// The node name pods of this runner may carry (or none).
pub const NODE_NAME: &str = "local";

/// Requests from the [`super::PodRunner`] handle.
pub enum RunnerCommand {
    KillContainer {
        namespace: String,
        pod: String,
        container: String,
        reply: oneshot::Sender<Result<(), PodRunnerError>>,
    },
}

/// Watch caches of everything the runner reads.
struct Caches {
    pods: Store<Pod>,
    deployments: Store<Deployment>,
    services: Store<Service>,
    endpoint_slices: Store<EndpointSlice>,
    config_maps: Store<ConfigMap>,
    secrets: Store<Secret>,
    namespaces: Store<Namespace>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Caches {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl ObjectData for Caches {
    fn config_map(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let cm = self
            .config_maps
            .get(&ObjectRef::new(name).within(namespace))?;
        let mut data: BTreeMap<String, Vec<u8>> = cm
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect();
        data.extend(
            cm.binary_data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone())),
        );
        Some(data)
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let secret = self.secrets.get(&ObjectRef::new(name).within(namespace))?;
        let mut data: BTreeMap<String, Vec<u8>> = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        data.extend(
            secret
                .string_data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone().into_bytes())),
        );
        Some(data)
    }
}

fn reflect<K>(client: &Client, changed: &Arc<Notify>) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let api: Api<K> = Api::all(client.clone());
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    );
    let changed = Arc::clone(changed);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => changed.notify_one(),
                Err(error) => {
                    tracing::debug!(kind = K::kind(&()).as_ref(), %error, "watch error; the watcher retries")
                }
            }
        }
    });
    (reader, task)
}

/// Everything the control loop owns.
pub struct Runner {
    client: Client,
    kubeconfig: Kubeconfig,
    options: PodRunnerOptions,
    runner_env: BTreeMap<String, String>,
    caches: Caches,
    changed: Arc<Notify>,
    local: BTreeMap<String, LocalPod>,
    network: TestNetwork,
    deployments: DeploymentController,
    endpoints: EndpointController,
    service_accounts: DefaultServiceAccounts,
    registry: Arc<ProcessRegistry>,
    status_errors: BTreeMap<String, String>,
    network_error: Option<String>,
}

impl Runner {
    /// Connects, fills the watch caches and returns the loop, ready to run.
    pub async fn connect(
        client: Client,
        kubeconfig: Kubeconfig,
        options: PodRunnerOptions,
        registry: Arc<ProcessRegistry>,
    ) -> Result<Self, PodRunnerError> {
        // Fail early, with the API's own words, when the kubeconfig cannot list what we need.
        let pods_api: Api<Pod> = Api::all(client.clone());
        pods_api
            .list(&kube::api::ListParams::default().limit(1))
            .await
            .map_err(|e| PodRunnerError::api("list pods (checking the runner's access)", e))?;
        let changed = Arc::new(Notify::new());
        let (pods, pods_task) = reflect::<Pod>(&client, &changed);
        let (deployments, deployments_task) = reflect::<Deployment>(&client, &changed);
        let (services, services_task) = reflect::<Service>(&client, &changed);
        let (endpoint_slices, endpoint_slices_task) = reflect::<EndpointSlice>(&client, &changed);
        let (config_maps, config_maps_task) = reflect::<ConfigMap>(&client, &changed);
        let (secrets, secrets_task) = reflect::<Secret>(&client, &changed);
        let (namespaces, namespaces_task) = reflect::<Namespace>(&client, &changed);
        let caches = Caches {
            pods,
            deployments,
            services,
            endpoint_slices,
            config_maps,
            secrets,
            namespaces,
            tasks: vec![
                namespaces_task,
                pods_task,
                deployments_task,
                services_task,
                endpoint_slices_task,
                config_maps_task,
                secrets_task,
            ],
        };
        let synced = async {
            caches.pods.wait_until_ready().await?;
            caches.deployments.wait_until_ready().await?;
            caches.services.wait_until_ready().await?;
            caches.endpoint_slices.wait_until_ready().await?;
            caches.config_maps.wait_until_ready().await?;
            caches.namespaces.wait_until_ready().await?;
            caches.secrets.wait_until_ready().await
        };
        match tokio::time::timeout(CACHE_SYNC_TIMEOUT, synced).await {
            Ok(Ok(())) => {}
            _ => {
                return Err(PodRunnerError::ClientConfig(format!(
                    "watch caches of pods, deployments, services, endpointslices, configmaps and secrets did not sync within {CACHE_SYNC_TIMEOUT:?}"
                )))
            }
        }
        let mut runner_env = options.process_env.clone();
        if let Some(envoy) = &options.envoy_bin {
            runner_env.insert("ENVOY_BIN".into(), envoy.display().to_string());
        }
        runner_env
            .entry("RUST_LOG".into())
            .or_insert_with(|| "info".into());
        Ok(Runner {
            client,
            kubeconfig,
            network: options.network.clone(),
            options,
            runner_env,
            caches,
            changed,
            local: BTreeMap::new(),
            deployments: DeploymentController::default(),
            endpoints: EndpointController::default(),
            service_accounts: DefaultServiceAccounts::default(),
            registry,
            status_errors: BTreeMap::new(),
            network_error: None,
        })
    }

    /// Runs until `shutdown` turns true, then stops every pod.
    pub async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<RunnerCommand>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            self.reconcile().await;
            tokio::select! {
                _ = shutdown_requested(&mut shutdown) => break,
                Some(command) = commands.recv() => self.handle(command),
                _ = self.changed.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
        for (_, pod) in std::mem::take(&mut self.local) {
            let net = pod.net.clone();
            pod.stop().await;
            self.network.remove_pod(&net);
        }
    }

    fn handle(&mut self, command: RunnerCommand) {
        match command {
            RunnerCommand::KillContainer {
                namespace,
                pod,
                container,
                reply,
            } => {
                let killed = self
                    .local
                    .values()
                    .find(|p| p.namespace == namespace && p.name == pod)
                    .is_some_and(|p| p.kill_container(&container));
                let result = if killed {
                    tracing::info!(%namespace, %pod, %container, "killed container on request");
                    Ok(())
                } else {
                    Err(PodRunnerError::NoSuchContainer {
                        namespace,
                        pod,
                        container,
                    })
                };
                let _ = reply.send(result);
            }
        }
    }

    async fn reconcile(&mut self) {
        let namespaces = self.caches.namespaces.state();
        self.service_accounts
            .reconcile_all(&self.client, &namespaces)
            .await;
        let pods = self.caches.pods.state();
        let deployments = self.caches.deployments.state();
        self.deployments
            .reconcile_all(&self.client, &deployments, &pods)
            .await;
        self.sync_pods(&pods).await;
        self.write_pod_statuses(&pods).await;
        let services = self.caches.services.state();
        self.endpoints
            .reconcile_all(&self.client, &services, &pods)
            .await;
        // kube-proxy and cluster DNS: from the Services and their slices as the API has them.
        let slices = self.caches.endpoint_slices.state();
        let routes = service_routes(&services, &slices);
        let names = service_names(&services);
        match self.network.set_services(&routes, &names) {
            Ok(()) => self.network_error = None,
            Err(error) => {
                let message = error.to_string();
                if self.network_error.as_ref() != Some(&message) {
                    tracing::error!(%message, "cannot program Services into the pod network");
                    self.network_error = Some(message);
                }
            }
        }
    }

    /// Starts new pods, finishes starting pending ones, refreshes volumes, stops deleted ones.
    async fn sync_pods(&mut self, pods: &[Arc<Pod>]) {
        let services = self.caches.services.state();
        let mut seen = Vec::new();
        for pod in pods {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if node.is_some_and(|n| n != NODE_NAME) {
                continue;
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_some() {
                self.finish_deletion(pod, &uid).await;
                continue;
            }
            seen.push(uid.clone());
            if !self.local.contains_key(&uid) {
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                if matches!(phase, Some("Succeeded" | "Failed")) {
                    continue;
                }
                let namespace = pod.metadata.namespace.clone().unwrap_or_default();
                let name = pod.metadata.name.clone().unwrap_or_default();
                let net = match self.network.add_pod(&namespace, &name, &uid) {
                    Ok(net) => net,
                    Err(error) => {
                        let message = error.to_string();
                        if self.network_error.as_ref() != Some(&message) {
                            tracing::error!(pod = %format!("{namespace}/{name}"), %message, "cannot set up the pod's network");
                            self.network_error = Some(message);
                        }
                        continue;
                    }
                };
                let local = LocalPod::new(pod, net, self.network.dialer(), &self.options.work_dir);
                tracing::info!(pod = %local.key(), ip = %local.ip(), netns = %local.net.netns().name(), "taking on pod");
                self.local.insert(uid.clone(), local);
            }
            let env = PodEnvironment {
                client: &self.client,
                kubeconfig: &self.kubeconfig,
                api_service: api_service(&services),
                bin_dir: &self.options.bin_dir,
                objects: &self.caches,
                runner_env: &self.runner_env,
                registry: &self.registry,
                changed: &self.changed,
            };
            let Some(local) = self.local.get_mut(&uid) else {
                continue;
            };
            if local.started() {
                if let Err(error) = local.sync_volumes(pod, &self.caches) {
                    tracing::warn!(pod = %local.key(), %error, "cannot refresh volumes");
                }
            } else {
                local.advance(pod, &env).await;
            }
        }
        let gone: Vec<String> = self
            .local
            .keys()
            .filter(|uid| !seen.contains(uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(local) = self.local.remove(&uid) {
                tracing::info!(pod = %local.key(), "pod deleted; stopping it");
                let net = local.net.clone();
                local.stop().await;
                self.network.remove_pod(&net);
            }
        }
    }

    /// A pod marked for deletion: stop it, then remove it from the API as the kubelet does.
    async fn finish_deletion(&mut self, pod: &Pod, uid: &str) {
        if let Some(local) = self.local.remove(uid) {
            tracing::info!(pod = %local.key(), "pod terminating; stopping it");
            let net = local.net.clone();
            local.stop().await;
            self.network.remove_pod(&net);
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(error) => tracing::warn!(pod = %name, %error, "cannot remove terminated pod"),
        }
    }

    async fn write_pod_statuses(&mut self, pods: &[Arc<Pod>]) {
        futures::future::join_all(
            self.local
                .values_mut()
                .filter(|p| p.started())
                .map(LocalPod::probe),
        )
        .await;
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let Some(local) = self.local.get_mut(&uid) else {
                continue;
            };
            let status = local.status(pod);
            if local.last_status.as_ref() == Some(&status) {
                continue;
            }
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &local.namespace);
            let key = local.key();
            match api
                .patch_status(
                    &local.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await
            {
                Ok(_) => {
                    self.status_errors.remove(&key);
                    local.last_status = Some(status);
                }
                Err(error) => {
                    let message = error.to_string();
                    if self.status_errors.get(&key) != Some(&message) {
                        tracing::warn!(pod = %key, %message, "cannot write pod status");
                        self.status_errors.insert(key, message);
                    }
                }
            }
        }
    }
}

async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// The work directory of a runner: pods and logs live under it.
pub fn logs_dir(work_dir: &std::path::Path) -> PathBuf {
    work_dir.join("logs")
}
