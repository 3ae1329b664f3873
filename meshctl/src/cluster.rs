//! The cluster, read with the caller's own credentials (kubeconfig, as kubectl reads it): the
//! kinds the mesh reads, listed into a [`MeshState`] so that every check runs on the same model
//! as offline.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use meshplane_xds_core::kinds::{KindVisitor, WatchedObject};
use meshplane_xds_core::model::Kind;

use crate::state::MeshState;

/// Origin of objects read from the cluster.
pub const ORIGIN: &str = "cluster";

/// Page size of list requests.
const PAGE: u32 = 500;

/// How to reach the cluster (the flags kubectl has).
#[derive(Clone, Debug, Default, Args)]
pub struct ClusterArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(
        long,
        global = true,
        env = "KUBECONFIG",
        value_name = "PATH",
        hide_env_values = true
    )]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Token sent to the instances' `/debug` endpoints (a token of the tenant's
    /// `meshplane-debug` ServiceAccount, audience `meshplane-<tenant>-debug`). Without it,
    /// meshctl requests a 10-minute token per control namespace (TokenRequest), which needs
    /// `create` on `serviceaccounts/token` named `meshplane-debug` there.
    #[arg(
        long,
        global = true,
        env = "MESHCTL_DEBUG_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub debug_token: Option<String>,
}

impl ClusterArgs {
    /// A client with the caller's credentials.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                // KUBECONFIG may list several files, as for kubectl.
                let mut merged: Option<Kubeconfig> = None;
                for p in std::env::split_paths(path) {
                    let file = Kubeconfig::read_from(&p)
                        .with_context(|| format!("reading kubeconfig {}", p.display()))?;
                    merged = Some(match merged {
                        Some(m) => m.merge(file).context("merging kubeconfigs")?,
                        None => file,
                    });
                }
                let file = merged.context("--kubeconfig names no file")?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .context("loading the kubeconfig")?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options)
                .await
                .context("loading the kubeconfig")?,
            (None, None) => kube::Config::infer().await.context(
                "no kubeconfig found (set KUBECONFIG or --kubeconfig) and not running in a cluster",
            )?,
        };
        kube::Client::try_from(config).context("creating the Kubernetes client")
    }
}

/// The API resource of a kind the mesh reads, and whether it is namespaced.
pub fn api_resource(kind: Kind) -> (ApiResource, bool) {
    struct Erase;
    impl KindVisitor for Erase {
        type Output = ApiResource;
        fn visit<T: WatchedObject>(self) -> ApiResource {
            ApiResource::erase::<T>(&())
        }
    }
    (kind.visit(Erase), kind.namespaced())
}

/// The kinds a cluster may not serve: the Gateway API is installed separately, so a cluster
/// without its CRDs simply has none of them.
const OPTIONAL_GROUPS: &[&str] = &["gateway.networking.k8s.io"];

/// Every object of `api`, page by page, as JSON documents with `apiVersion` and `kind`; none
/// when the API server does not serve an optional kind (404).
async fn list_documents(
    api: &Api<DynamicObject>,
    resource: &ApiResource,
) -> Result<Vec<serde_json::Value>, kube::Error> {
    match list_all(api, resource).await {
        Err(kube::Error::Api(s))
            if s.code == 404 && OPTIONAL_GROUPS.contains(&resource.group.as_str()) =>
        {
            Ok(Vec::new())
        }
        other => other,
    }
}

async fn list_all(
    api: &Api<DynamicObject>,
    resource: &ApiResource,
) -> Result<Vec<serde_json::Value>, kube::Error> {
    let mut docs = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        for mut item in page.items {
            item.types = Some(kube::api::TypeMeta {
                api_version: resource.api_version.clone(),
                kind: resource.kind.clone(),
            });
            // managedFields are noise to every check.
            item.metadata.managed_fields = None;
            if let Ok(doc) = serde_json::to_value(&item) {
                docs.push(doc);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(docs),
        }
    }
}

fn explain(kind: &str, scope: &str, e: kube::Error) -> anyhow::Error {
    match &e {
        kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
            "listing {kind} {scope}: the API server does not serve them; is meshplane installed (kubectl apply -k config/default)?"
        ),
        kube::Error::Api(s) if s.code == 403 => {
            anyhow::anyhow!("listing {kind} {scope}: {}", s.message)
        }
        _ => anyhow::Error::new(e).context(format!("listing {kind} {scope}")),
    }
}

/// Which namespaces namespaced kinds are listed in.
#[derive(Clone, Debug)]
pub enum Scope {
    /// Everywhere (one cluster-wide list per kind).
    All,
    /// Only these.
    Namespaces(BTreeSet<String>),
}

/// Reads the cluster-scoped kinds (Namespaces, MeshControlPlanes, MeshRevisionTags) always, and
/// the namespaced kinds in `scope`.
pub async fn read_state(client: &kube::Client, scope: &Scope) -> anyhow::Result<MeshState> {
    let mut state = MeshState::default();
    // Secrets stay unread: meshctl needs no access to key material, and a Gateway's
    // `credentialName` check is the instance's (its Accepted condition).
    for kind in Kind::ALL.iter().copied().filter(|k| *k != Kind::Secret) {
        let (resource, namespaced) = api_resource(kind);
        match (namespaced, scope) {
            (false, _) | (true, Scope::All) => {
                let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
                let docs = list_documents(&api, &resource)
                    .await
                    .map_err(|e| explain(&resource.plural, "in the cluster", e))?;
                state.add_documents(ORIGIN, docs);
            }
            (true, Scope::Namespaces(namespaces)) => {
                for ns in namespaces {
                    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource);
                    let docs = list_documents(&api, &resource)
                        .await
                        .map_err(|e| explain(&resource.plural, &format!("in namespace {ns}"), e))?;
                    state.add_documents(ORIGIN, docs);
                }
            }
        }
    }
    Ok(state)
}

/// Reads the cluster-scoped kinds, then the namespaced kinds of the tenant that namespace
/// `namespace` belongs to (its members and control namespace) — what `describe pod` needs, with
/// no cluster-wide list of namespaced kinds.
pub async fn read_tenant_of(client: &kube::Client, namespace: &str) -> anyhow::Result<MeshState> {
    let cluster_scoped = read_state(client, &Scope::Namespaces(BTreeSet::new())).await?;
    let membership = cluster_scoped.membership();
    let namespaces: BTreeSet<String> = membership
        .tenants
        .values()
        .find(|t| t.members.contains(namespace) || t.control_namespace == namespace)
        .map(|t| {
            let mut all = t.members.clone();
            all.insert(t.control_namespace.clone());
            all
        })
        .unwrap_or_else(|| BTreeSet::from([namespace.to_string()]));
    read_state(client, &Scope::Namespaces(namespaces)).await
}
