//! The revisions' running instances and what their debug endpoint says about connected
//! proxies, read through the API server's `pods/proxy` subresource with the caller's own
//! credentials (RBAC: `list pods` and `get pods/proxy` in the tenant's control namespace). The
//! instance's monitoring port is never exposed outside the cluster for this. `/debug` wants a
//! token of the control namespace's `meshplane-debug` ServiceAccount (contract 12), which
//! meshctl requests with the caller's credentials (`create serviceaccounts/token` on that name)
//! unless `--debug-token` gives one.

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use meshplane_crds::names::debug as debug_contract;
use meshplane_crds::names::{self, ports};
use meshplane_crds::MeshControlPlane;
use serde::{Deserialize, Serialize};

/// The instance pods' `app.kubernetes.io/name` (what the operator renders, with the revision
/// label, as the Deployment's selector).
pub const INSTANCE_APP: &str = "meshplane-xds";

/// A NACK as the instance reports it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct NackInfo {
    /// The version the proxy rejected.
    pub version: String,
    /// The proxy's error message.
    pub message: String,
    /// When (Unix seconds).
    pub at: u64,
}

/// Sync state of one resource type of one proxy, as `/debug/proxies` reports it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct TypeSync {
    #[serde(rename = "type")]
    pub type_name: String,
    pub subscribed: bool,
    #[serde(alias = "sent_version")]
    pub sent_version: Option<String>,
    #[serde(alias = "acked_version")]
    pub acked_version: Option<String>,
    #[serde(alias = "awaiting_ack")]
    pub awaiting_ack: bool,
    #[serde(alias = "last_nack")]
    pub last_nack: Option<NackInfo>,
    /// The proxy rejected the latest content offered and runs on older config (or none); the
    /// instance rolls `sent_version` back to what the proxy holds, so `last_nack` alone may be
    /// history.
    pub rejected: bool,
}

/// The state of a type, in the words `proxy-status` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SyncState {
    /// The proxy holds what was last sent.
    Synced,
    /// Sent, not acknowledged yet.
    Stale,
    /// The proxy rejected the version sent; it keeps its previous configuration.
    Nacked,
    /// Subscribed, nothing sent yet.
    NotSent,
    /// Not subscribed.
    Unsubscribed,
}

impl SyncState {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncState::Synced => "SYNCED",
            SyncState::Stale => "STALE",
            SyncState::Nacked => "NACKED",
            SyncState::NotSent => "NOT SENT",
            SyncState::Unsubscribed => "-",
        }
    }
}

impl TypeSync {
    /// Where this type stands.
    pub fn state(&self) -> SyncState {
        if !self.subscribed {
            return SyncState::Unsubscribed;
        }
        if self.rejected {
            return SyncState::Nacked;
        }
        match (&self.sent_version, &self.acked_version) {
            (None, _) => SyncState::NotSent,
            _ if self.awaiting_ack => SyncState::Stale,
            (Some(s), Some(a)) if s == a => SyncState::Synced,
            _ => SyncState::Stale,
        }
    }
}

/// One proxy connected to an instance.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ConnectedProxy {
    pub id: String,
    pub namespace: String,
    #[serde(alias = "pod_name")]
    pub pod_name: Option<String>,
    pub protocol: String,
    #[serde(alias = "config_bytes")]
    pub config_bytes: usize,
    pub types: Vec<TypeSync>,
}

/// One running instance pod of a revision and what it reported.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub tenant: String,
    pub revision: String,
    /// The revision's `spec.version`.
    pub version: String,
    pub namespace: String,
    pub pod: String,
    /// Its proxies, or why they could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip)]
    pub proxies: Vec<ConnectedProxy>,
}

/// Which revisions to read.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub tenant: Option<String>,
    pub revision: Option<String>,
    /// Sent to every instance's `/debug` instead of a requested token.
    pub debug_token: Option<String>,
}

impl Filter {
    fn admits(&self, mcp: &MeshControlPlane) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == mcp.spec.tenant)
            && self.revision.as_ref().is_none_or(|r| *r == mcp.revision())
    }
}

/// A short-lived token of `control_namespace`'s debug ServiceAccount for `tenant`'s debug
/// audience (contract 12), requested with the caller's credentials.
pub async fn request_debug_token(
    client: &kube::Client,
    tenant: &str,
    control_namespace: &str,
) -> anyhow::Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), control_namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![debug_contract::audience(tenant)]),
            expiration_seconds: Some(debug_contract::TOKEN_LIFETIME_SECONDS),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued = accounts
        .create_token_request(
            debug_contract::SERVICE_ACCOUNT,
            &PostParams::default(),
            &request,
        )
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) => anyhow::anyhow!("{} ({})", s.message, s.code),
            other => anyhow::Error::new(other),
        })
        .with_context(|| {
            format!(
                "requesting a debug token of {control_namespace}/{} (needs create on serviceaccounts/token named {} there, or --debug-token)",
                debug_contract::SERVICE_ACCOUNT,
                debug_contract::SERVICE_ACCOUNT
            )
        })?;
    issued
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .context("the TokenRequest answer carries no token")
}

/// `GET <path>` (e.g. `/debug/proxies`) on the monitoring port of instance pod
/// `namespace/pod`, through the API server, with `token` in the debug header: the body.
pub async fn debug_get(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    token: &str,
    path: &str,
) -> anyhow::Result<String> {
    let path = format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}:{}/proxy{path}",
        ports::HTTP_MONITORING
    );
    let request = http::Request::get(&path)
        .header(debug_contract::TOKEN_HEADER, token)
        .body(Vec::new())
        .context("building the request")?;
    client.request_text(request).await.map_err(|e| match e {
        kube::Error::Api(s) => anyhow::anyhow!("{} ({})", s.message, s.code),
        other => anyhow::Error::new(other),
    })
}

/// `GET /debug/proxies` of instance pod `namespace/pod`.
async fn debug_proxies(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    token: &str,
) -> anyhow::Result<Vec<ConnectedProxy>> {
    let text = debug_get(client, namespace, pod, token, "/debug/proxies").await?;
    serde_json::from_str(&text).with_context(|| {
        let start: String = text.chars().take(200).collect();
        format!("the instance answered something else than its proxy list: {start:?}")
    })
}

/// The running instance pods of every revision `filter` admits, each with its proxies.
pub async fn read(client: &kube::Client, filter: &Filter) -> anyhow::Result<Vec<Instance>> {
    Ok(read_with_tokens(client, filter).await?.0)
}

/// [`read`], with the debug tokens it requested, by control namespace (none when the filter
/// gave one), for a caller that asks an instance more.
pub async fn read_with_tokens(
    client: &kube::Client,
    filter: &Filter,
) -> anyhow::Result<(Vec<Instance>, std::collections::BTreeMap<String, String>)> {
    let mcps: Api<MeshControlPlane> = Api::all(client.clone());
    let mut control_planes = mcps
        .list(&ListParams::default())
        .await
        .context("listing MeshControlPlanes")?
        .items;
    control_planes.retain(|m| filter.admits(m));
    control_planes.sort_by_key(|m| (m.spec.tenant.clone(), m.revision()));
    let mut out = Vec::new();
    // One debug token per control namespace (the tenant's revisions share it).
    let mut tokens = std::collections::BTreeMap::<String, String>::new();
    for mcp in &control_planes {
        let revision = mcp.revision();
        let namespace = mcp.control_namespace();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let selector = format!(
            "app.kubernetes.io/name={INSTANCE_APP},{}={revision}",
            names::REVISION_LABEL
        );
        let listed = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .with_context(|| {
                format!("listing the instance pods of revision {revision} in {namespace}")
            })?;
        let mut running: Vec<Pod> = listed
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect();
        running.sort_by_key(|p| p.metadata.name.clone());
        let token = match &filter.debug_token {
            Some(t) => Ok(t.clone()),
            None if running.is_empty() => Ok(String::new()),
            None => match tokens.get(&namespace) {
                Some(t) => Ok(t.clone()),
                None => request_debug_token(client, &mcp.spec.tenant, &namespace)
                    .await
                    .inspect(|t| {
                        tokens.insert(namespace.clone(), t.clone());
                    })
                    .map_err(|e| format!("{e:#}")),
            },
        };
        for pod in running {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let (proxies, error) = match &token {
                Ok(token) => match debug_proxies(client, &namespace, &name, token).await {
                    Ok(p) => (p, None),
                    Err(e) => (Vec::new(), Some(format!("{e:#}"))),
                },
                Err(e) => (Vec::new(), Some(e.clone())),
            };
            out.push(Instance {
                tenant: mcp.spec.tenant.clone(),
                revision: revision.clone(),
                version: mcp.spec.version.clone(),
                namespace: namespace.clone(),
                pod: name,
                error,
                proxies,
            });
        }
    }
    Ok((out, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sync(
        sent: Option<&str>,
        acked: Option<&str>,
        awaiting: bool,
        nack: Option<&str>,
    ) -> TypeSync {
        TypeSync {
            type_name: "cds".into(),
            subscribed: true,
            sent_version: sent.map(Into::into),
            acked_version: acked.map(Into::into),
            awaiting_ack: awaiting,
            last_nack: nack.map(|v| NackInfo {
                version: v.into(),
                message: "bad".into(),
                at: 0,
            }),
            rejected: false,
        }
    }

    #[test]
    fn states_follow_the_tracker() {
        assert_eq!(
            sync(Some("a"), Some("a"), false, None).state(),
            SyncState::Synced
        );
        assert_eq!(
            sync(Some("b"), Some("a"), true, None).state(),
            SyncState::Stale
        );
        // Rejected b: the instance rolls sent back to the acknowledged a and says so.
        let rejected = TypeSync {
            rejected: true,
            ..sync(Some("a"), Some("a"), false, Some("b"))
        };
        assert_eq!(rejected.state(), SyncState::Nacked);
        // Rejected the very first response: nothing held.
        let first = TypeSync {
            rejected: true,
            ..sync(None, None, false, Some("b"))
        };
        assert_eq!(first.state(), SyncState::Nacked);
        // A NACK of an older version, since superseded and acknowledged, is history.
        assert_eq!(
            sync(Some("c"), Some("c"), false, Some("b")).state(),
            SyncState::Synced
        );
        assert_eq!(sync(None, None, false, None).state(), SyncState::NotSent);
        let mut off = sync(None, None, false, None);
        off.subscribed = false;
        assert_eq!(off.state(), SyncState::Unsubscribed);
    }

    #[test]
    fn the_debug_endpoints_json_decodes() {
        let body = r#"[{"id":"sidecar~198.18.0.11~web-1.shop~shop.svc.cluster.local","namespace":"shop",
            "pod_name":"web-1","protocol":"delta","config_bytes":2800,
            "types":[{"type":"cds","subscribed":true,"sent_version":"v1","acked_version":"v1",
            "awaiting_ack":false,"last_nack":null,"resources":[]}]}]"#;
        let proxies: Vec<ConnectedProxy> = serde_json::from_str(body).expect("decodes");
        assert_eq!(proxies[0].pod_name.as_deref(), Some("web-1"));
        assert_eq!(proxies[0].config_bytes, 2800);
        assert_eq!(proxies[0].types[0].state(), SyncState::Synced);
    }
}
