//! The data model shared by the sources, the tenant index and the ADS server.
//!
//! Sources (Kubernetes watches, a directory of manifests) emit [`SourceEvent`]s; the index
//! folds them into the tenant's state; translation renders a [`ProxyConfig`] per
//! [`ProxyNode`]; the ADS server diffs and pushes [`Resource`]s by their content hash.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use meshplane_crds::controlplane::GatewayDeployment;
use meshplane_crds::networking::CaptureMode;

pub use crate::kinds::{Kind, Object};

impl Object {
    /// Kind, namespace and name of the object.
    pub fn key(&self) -> ObjectKey {
        let meta = self.metadata();
        ObjectKey {
            kind: self.kind(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

/// Identity of an object: kind, namespace (none for cluster-scoped), name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
}

/// What the tenant's instance holds for one `jwksUri`: the key set it fetched last, or why it
/// has none (its tokens are then refused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchedKeys {
    /// The key set as fetched (JSON).
    Keys(String),
    /// The fetch failed (or was refused); the text says why.
    Failed(String),
}

/// One change reported by a source.
#[derive(Clone, Debug)]
pub enum SourceEvent {
    /// An object was created or changed.
    Upsert(Object),
    /// An object was deleted.
    Delete(ObjectKey),
    /// The tenant's member namespaces are now exactly these (objects outside are dropped).
    Members(BTreeSet<String>),
    /// Everything of these kinds in this namespace (None: everywhere) is replaced by the
    /// following Upserts up to the next `Synced` (a relist after a watch restart or 410 Gone).
    Resync {
        namespace: Option<String>,
        kinds: Vec<Kind>,
    },
    /// The revision's mesh config (Kubernetes mode: from the members ConfigMap).
    MeshConfig(Box<meshplane_crds::MeshConfig>),
    /// The tenant's operator-run gateways (Kubernetes mode: the members ConfigMap's
    /// `gateways`).
    GatewayDeployments(Vec<GatewayDeployment>),
    /// The tags pointing at this revision (Kubernetes mode: the members ConfigMap's `tags`);
    /// config labelled with one of them is this revision's (revision-scoped config).
    Tags(BTreeSet<String>),
    /// The relist announced by the last `Resync` is complete.
    Synced,
    /// Which gateway proxies may get which TLS credentials changed (SubjectAccessReview
    /// answers, [`crate::credentials`]): gateways are rendered again.
    CredentialAccess,
    /// The key sets the instance holds for the `jwksUri`s of the tenant's
    /// RequestAuthentications, by URL: the last fetch of each (its keys, or why it has none).
    Jwks(BTreeMap<String, FetchedKeys>),
    /// The source has delivered its initial state: proxies may be answered (readiness).
    Ready,
}

/// What kind of xDS client a proxy is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProxyKind {
    /// An Envoy sidecar (node id `sidecar~...`).
    #[default]
    Sidecar,
    /// An Envoy gateway (node id `router~...`): listeners from the Gateways selecting it.
    Router,
    /// A proxyless gRPC client (node metadata `GENERATOR=grpc`, as Istio's gRPC agent writes
    /// it): API listeners named `host:port`.
    Grpc,
}

/// A proxy as it identifies itself on the ADS stream (node id and metadata), after tenancy
/// checks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProxyNode {
    /// Envoy `node.id`.
    pub id: String,
    /// Sidecar, gateway or proxyless gRPC client.
    pub kind: ProxyKind,
    /// Namespace of the proxy's workload.
    pub namespace: String,
    /// Pod name, when known.
    pub pod_name: Option<String>,
    /// Workload address, when known.
    pub ip: Option<String>,
    /// Workload labels (from node metadata `LABELS`, or looked up from the Pod).
    pub labels: BTreeMap<String, String>,
    /// `NONE` means listeners bind real addresses instead of relying on iptables capture.
    pub capture_mode: CaptureMode,
    /// Address that stands in for `127.0.0.1` and `0.0.0.0` in this proxy's bound listeners and
    /// inbound targets (node metadata `LOOPBACK_ADDR`). Only the local test pod runner sets it,
    /// because there every pod shares the host's loopback; in a cluster it is `None`.
    pub loopback: Option<String>,
    /// Whether the proxy's node agent serves the SDS secrets of contract 11 (node metadata
    /// `SDS=true`): only such a proxy gets mutual TLS contexts, any other would wait forever
    /// for its certificate.
    pub sds: bool,
    /// The ServiceAccount its token was verified for by TokenReview (Kubernetes mode), never
    /// what the node claims; `None` in directory mode.
    pub service_account: Option<String>,
    /// Gateways: the `credentialName` Secrets of its namespace that its ServiceAccount may
    /// `get` (SubjectAccessReview, [`crate::credentials`]), set by the index before
    /// translation; `None`: not checked (directory mode, no API server to ask).
    pub readable_credentials: Option<BTreeSet<String>>,
}

impl ProxyNode {
    /// `addr`, or the proxy's own loopback address when `addr` is `127.0.0.1` or `0.0.0.0` and the
    /// proxy declared one.
    pub fn local_address(&self, addr: &str) -> String {
        match &self.loopback {
            Some(l) if addr == "127.0.0.1" || addr == "0.0.0.0" => l.clone(),
            _ => addr.to_string(),
        }
    }
}

/// Envoy resource type URLs, in the order ADS must push them (removals in reverse).
pub mod type_url {
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    /// Virtual hosts served on their own (VHDS) to delta clients that are Envoys.
    pub const VIRTUAL_HOST: &str = "type.googleapis.com/envoy.config.route.v3.VirtualHost";
    /// Push order: clusters before endpoints before listeners before routes before the
    /// virtual hosts the routes point to.
    pub const ORDER: [&str; 5] = [CLUSTER, ENDPOINT, LISTENER, ROUTE, VIRTUAL_HOST];
}

/// One encoded Envoy resource, shared (by `Arc`) between every proxy that receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// Resource name (cluster name, listener name, ...).
    pub name: String,
    /// Type URL of the encoded message.
    pub type_url: &'static str,
    /// Protobuf encoding of the message (the `value` of a `google.protobuf.Any`).
    pub encoded: bytes::Bytes,
    /// Content hash of `encoded` (hex), used as the resource version: stable across restarts.
    pub version: String,
    /// `encoded` compressed, for the streams that send a large resource compressed (the
    /// xds-server's codec fills it); made by the first of them.
    pub packed: Packed,
}

/// A compressed form of shared bytes, made once by the first stream that needs it and kept
/// with what it compresses (`None`: compression failed, and the message carrying it goes
/// uncompressed). The core only holds it: the codec that fills it is the server's.
#[derive(Clone, Default)]
pub struct Packed(OnceLock<Option<bytes::Bytes>>);

impl Packed {
    /// The bytes held, made by `fill` on first use.
    pub fn get_or_init(&self, fill: impl FnOnce() -> Option<bytes::Bytes>) -> Option<bytes::Bytes> {
        self.0.get_or_init(fill).clone()
    }
}

impl PartialEq for Packed {
    /// A cache of what it is attached to: never part of a value's identity.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Packed {}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.get() {
            Some(Some(b)) => write!(f, "Packed({} bytes)", b.len()),
            Some(None) => f.write_str("Packed(failed)"),
            None => f.write_str("Packed(not yet)"),
        }
    }
}

/// Whether `a` holds exactly the resources of `b` (the same `Arc`s, in the same order): then
/// whatever was built from one was built from the other.
pub fn same_resources<'a>(
    a: impl ExactSizeIterator<Item = &'a Arc<Resource>>,
    b: &[Arc<Resource>],
) -> bool {
    a.len() == b.len() && a.zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

/// A resource list's length and the addresses of its first and last resource: lists with
/// different keys hold different resources; lists with the same key are compared in full.
/// Memos of what was built from a list use it while they hold the list's resources (so that no
/// address is reused).
pub type ListKey = (usize, usize, usize);

/// The [`ListKey`] of `list`.
pub fn list_key(list: &[Arc<Resource>]) -> ListKey {
    let address = |r: Option<&Arc<Resource>>| r.map_or(0, |r| Arc::as_ptr(r) as usize);
    (list.len(), address(list.first()), address(list.last()))
}

/// The full configuration of one proxy, per type, sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyConfig {
    pub clusters: Vec<Arc<Resource>>,
    pub endpoints: Vec<Arc<Resource>>,
    pub listeners: Vec<Arc<Resource>>,
    /// Route configurations with their virtual hosts inline.
    pub routes: Vec<Arc<Resource>>,
    /// The same routes for VHDS clients; `None`: they get the inline ones.
    pub vhds: Option<VhdsRoutes>,
}

/// Route configurations as a VHDS client (a delta Envoy) receives them: each one with virtual
/// hosts becomes a stub that points to VHDS over ADS, and its virtual hosts are resources of
/// their own, so a new service sends one virtual host instead of the whole configuration again
/// (`translate::vhds`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VhdsRoutes {
    /// One per route configuration, sorted by name (one without virtual hosts stays inline).
    pub routes: Vec<Arc<Resource>>,
    /// Named `<route configuration>/<virtual host>`, sorted by name.
    pub virtual_hosts: Vec<Arc<Resource>>,
}

impl ProxyConfig {
    /// Route configurations as a VHDS client receives them.
    pub fn vhds_routes(&self) -> &[Arc<Resource>] {
        self.vhds
            .as_ref()
            .map(|v| v.routes.as_slice())
            .unwrap_or(&self.routes)
    }

    /// Resources of one type URL (routes inline).
    pub fn of_type(&self, type_url: &str) -> &[Arc<Resource>] {
        match type_url {
            type_url::CLUSTER => &self.clusters,
            type_url::ENDPOINT => &self.endpoints,
            type_url::LISTENER => &self.listeners,
            type_url::ROUTE => &self.routes,
            type_url::VIRTUAL_HOST => self
                .vhds
                .as_ref()
                .map(|v| v.virtual_hosts.as_slice())
                .unwrap_or_default(),
            _ => &[],
        }
    }
}
