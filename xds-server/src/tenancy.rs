//! Proxy admission at the ADS connection: who the proxy says it is (node id and metadata,
//! contract 7), whether its namespace belongs to this tenant, and, in Kubernetes mode, whether
//! its ServiceAccount token proves that namespace (TokenReview).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Struct};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use meshplane_contracts::node::{meta, NodeId, NodeKind};
use meshplane_crds::networking::CaptureMode;
use tonic::metadata::MetadataMap;

use crate::bounds;
use crate::metrics::Metrics;
use crate::model::{ProxyKind, ProxyNode};
use crate::tokens::{self, Budgets, Refusal, ReviewBudget};
use prost::Message;

/// Why a proxy is refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdmissionError {
    #[error("the first ADS request carries no node")]
    MissingNode,
    /// The contract error, which quotes a bounded part of the id.
    #[error("{0}")]
    MalformedNodeId(String),
    #[error("node metadata NAMESPACE {metadata:?} contradicts node.id namespace {id:?}")]
    NamespaceMismatch { metadata: String, id: String },
    #[error("node metadata POD_NAME {metadata:?} contradicts node.id pod {id:?}")]
    PodMismatch { metadata: String, id: String },
    #[error(
        "proxy of namespace {namespace:?} belongs to tenant {claimed:?}, this is tenant {tenant:?}"
    )]
    WrongTenant {
        namespace: String,
        claimed: String,
        tenant: String,
    },
    #[error("namespace {namespace:?} is not a member of tenant {tenant:?} (revision {revision:?}): label it meshplane.io/rev=<a revision or tag of {tenant:?}>")]
    NotMember {
        namespace: String,
        tenant: String,
        revision: String,
    },
    #[error("no `authorization: Bearer <token>` on the ADS stream")]
    MissingToken,
    #[error("token rejected: {0}")]
    InvalidToken(String),
    #[error("token belongs to namespace {token:?}, the proxy claims namespace {claimed:?}")]
    TokenNamespaceMismatch { token: String, claimed: String },
    #[error("token review failed: {0}")]
    ReviewFailed(String),
    /// A new TokenReview would exceed a budget (the peer's, the claimed namespace's or the
    /// service's): the client may retry later.
    #[error("too many new tokens to review ({0} spent); retry")]
    ReviewThrottled(&'static str),
    #[error("the tenant's configuration has not synced yet; retry")]
    NotSynced,
    #[error("{field} is {len} bytes, more than the {max} accepted")]
    TooLarge {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("namespace {namespace:?} already has {max} connected proxies, the most this instance accepts per namespace")]
    TooManyProxies { namespace: String, max: usize },
}

impl AdmissionError {
    /// Short reason for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            AdmissionError::MissingNode
            | AdmissionError::MalformedNodeId(_)
            | AdmissionError::TooLarge { .. } => "malformed_node",
            AdmissionError::TooManyProxies { .. } => "too_many_proxies",
            AdmissionError::NamespaceMismatch { .. } | AdmissionError::PodMismatch { .. } => {
                "namespace_mismatch"
            }
            AdmissionError::WrongTenant { .. } => "wrong_tenant",
            AdmissionError::NotMember { .. } => "not_member",
            AdmissionError::MissingToken
            | AdmissionError::InvalidToken(_)
            | AdmissionError::TokenNamespaceMismatch { .. } => "unauthenticated",
            AdmissionError::ReviewFailed(_) => "review_failed",
            AdmissionError::ReviewThrottled(_) => "review_throttled",
            AdmissionError::NotSynced => "not_synced",
        }
    }

    /// The gRPC status the stream ends with; its message is bounded whatever the client sent.
    pub fn to_status(&self) -> tonic::Status {
        let message = bounds::clip(&self.to_string(), bounds::STATUS_MESSAGE).into_owned();
        match self {
            AdmissionError::MissingNode
            | AdmissionError::MalformedNodeId(_)
            | AdmissionError::NamespaceMismatch { .. }
            | AdmissionError::PodMismatch { .. }
            | AdmissionError::TooLarge { .. } => tonic::Status::invalid_argument(message),
            AdmissionError::TooManyProxies { .. } => tonic::Status::resource_exhausted(message),
            AdmissionError::MissingToken | AdmissionError::InvalidToken(_) => {
                tonic::Status::unauthenticated(message)
            }
            AdmissionError::ReviewFailed(_)
            | AdmissionError::ReviewThrottled(_)
            | AdmissionError::NotSynced => tonic::Status::unavailable(message),
            AdmissionError::WrongTenant { .. }
            | AdmissionError::NotMember { .. }
            | AdmissionError::TokenNamespaceMismatch { .. } => {
                tonic::Status::permission_denied(message)
            }
        }
    }
}

fn metadata_string(md: Option<&Struct>, key: &str) -> Option<String> {
    match md?.fields.get(key)?.kind.as_ref()? {
        ValueKind::StringValue(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

fn capture_mode(value: Option<String>) -> CaptureMode {
    match value.as_deref().map(str::to_ascii_uppercase).as_deref() {
        Some("NONE") => CaptureMode::None,
        Some("IPTABLES") => CaptureMode::Iptables,
        _ => CaptureMode::Default,
    }
}

/// Refuses nodes larger than anything a real proxy sends ([`bounds`]), before any part of
/// them is parsed, logged or echoed.
pub fn check_node_size(node: &Node) -> Result<(), AdmissionError> {
    let checks = [
        ("node.id", node.id.len(), bounds::MAX_NODE_ID),
        ("node.cluster", node.cluster.len(), bounds::MAX_NODE_CLUSTER),
        (
            "node.metadata",
            node.metadata.as_ref().map_or(0, Message::encoded_len),
            bounds::MAX_NODE_METADATA,
        ),
        ("node", node.encoded_len(), bounds::MAX_NODE),
    ];
    match checks.into_iter().find(|(_, len, max)| len > max) {
        Some((field, len, max)) => Err(AdmissionError::TooLarge { field, len, max }),
        None => Ok(()),
    }
}

/// Identity a node claims (contract 7), checked against itself and the tenant. The node id
/// must parse; metadata `NAMESPACE` and `POD_NAME`, when present, must agree with it. Labels
/// are not taken from the node: the tenant index gives them from the proxy's Pod.
pub fn parse_node(node: Option<&Node>, tenant: &str) -> Result<ProxyNode, AdmissionError> {
    let node = node.ok_or(AdmissionError::MissingNode)?;
    check_node_size(node)?;
    let md = node.metadata.as_ref();
    let id = NodeId::parse(&node.id).map_err(|e| AdmissionError::MalformedNodeId(e.to_string()))?;
    if let Some(claimed) = metadata_string(md, meta::NAMESPACE).filter(|m| *m != id.namespace) {
        return Err(AdmissionError::NamespaceMismatch {
            metadata: bounds::echo(&claimed),
            id: id.namespace,
        });
    }
    if let Some(claimed) = metadata_string(md, meta::POD_NAME).filter(|p| *p != id.pod) {
        return Err(AdmissionError::PodMismatch {
            metadata: bounds::echo(&claimed),
            id: id.pod,
        });
    }
    if let Some(claimed) = metadata_string(md, meta::TENANT) {
        if claimed != tenant {
            return Err(AdmissionError::WrongTenant {
                namespace: id.namespace,
                claimed: bounds::echo(&claimed),
                tenant: tenant.to_string(),
            });
        }
    }
    // gRPC's own xDS client says so in its metadata (gRFC A27 bootstraps carry `node`).
    let kind = if metadata_string(md, "GENERATOR").is_some_and(|g| g.eq_ignore_ascii_case("grpc")) {
        ProxyKind::Grpc
    } else {
        match id.kind {
            NodeKind::Router => ProxyKind::Router,
            NodeKind::Sidecar => ProxyKind::Sidecar,
        }
    };
    Ok(ProxyNode {
        id: node.id.clone(),
        kind,
        namespace: id.namespace,
        pod_name: Some(id.pod),
        ip: Some(id.ip.to_string()),
        labels: BTreeMap::new(),
        capture_mode: capture_mode(metadata_string(md, meta::CAPTURE_MODE)),
        loopback: metadata_string(md, meta::LOOPBACK_ADDR),
        sds: metadata_string(md, meshplane_contracts::tenant_ca::SDS_METADATA).as_deref()
            == Some("true"),
        service_account: None,
        readable_credentials: None,
    })
}

/// The bearer token of a request, if any.
pub fn bearer_token(metadata: &MetadataMap) -> Option<String> {
    let value = metadata.get("authorization")?.to_str().ok()?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))?;
    Some(token.trim().to_string()).filter(|t| !t.is_empty())
}

/// The namespace and name of a ServiceAccount username `system:serviceaccount:NS:NAME`.
pub fn service_account(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty()).then_some((ns, name))
}

/// The namespace of a ServiceAccount username `system:serviceaccount:NS:NAME`.
pub fn service_account_namespace(username: &str) -> Option<&str> {
    service_account(username).map(|(ns, _)| ns)
}

/// How long a verified token is trusted without asking again (never past its expiry). Short:
/// a token revoked with its pod stops working within this time.
pub const REVIEW_TTL: Duration = Duration::from_secs(60);
/// How long a token a TokenReview refused is refused without asking again.
pub const REFUSAL_TTL: Duration = Duration::from_secs(10);
/// Most verified tokens remembered, and, apart, most refused ones: refusals never push a
/// verified token out.
pub const REVIEW_CACHE_SIZE: usize = 16_384;

type Verdict = Result<ReviewedToken, AdmissionError>;

/// Review results by token hash, until a deadline, bounded.
#[derive(Debug)]
struct Remembered<V> {
    entries: HashMap<[u8; 32], (Instant, V)>,
}

impl<V> Default for Remembered<V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }
}

impl<V: Clone> Remembered<V> {
    fn get(&self, key: &[u8; 32], now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(until, _)| *until > now)
            .map(|(_, v)| v.clone())
    }

    fn put(&mut self, key: [u8; 32], until: Instant, value: V, now: Instant) {
        if self.entries.len() >= REVIEW_CACHE_SIZE {
            self.entries.retain(|_, (u, _)| *u > now);
            if self.entries.len() >= REVIEW_CACHE_SIZE {
                // Still full of live entries: drop the quarter closest to expiry.
                let mut by_expiry: Vec<_> =
                    self.entries.iter().map(|(k, (u, _))| (*u, *k)).collect();
                by_expiry.sort();
                for (_, k) in by_expiry.into_iter().take(REVIEW_CACHE_SIZE / 4) {
                    self.entries.remove(&k);
                }
            }
        }
        self.entries.insert(key, (until, value));
    }
}

/// What every service's reviewer of one audience shares: recent answers. A proxy that
/// reconnects with the same token costs one TokenReview per [`REVIEW_TTL`], a refused token
/// one per [`REFUSAL_TTL`].
#[derive(Debug, Default)]
struct ReviewCache {
    verified: Remembered<ReviewedToken>,
    refused: Remembered<AdmissionError>,
}

/// The expiry (`exp`, seconds since the epoch) a JWT claims, read without verifying it (only
/// to cap how long a review result is reused; the TokenReview did the verifying).
fn token_expiry(token: &str) -> Option<SystemTime> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    Some(UNIX_EPOCH + Duration::from_secs(exp))
}

/// Verifies projected ServiceAccount tokens with the Kubernetes TokenReview API.
///
/// Before any review is spent, a token must look like one that could pass ([`tokens::precheck`]:
/// a JWT for our audience, not expired) and must not have been refused recently; a new review
/// is then charged to the budgets of the caller's peer address, of the namespace the token
/// claims, and of the service ([`TokenReviewer::for_service`]: ADS and certificate requests
/// each have their own). The claims only pick the budgets: who the caller is comes from the
/// TokenReview answer.
#[derive(Clone)]
pub struct TokenReviewer {
    client: kube::Client,
    audience: String,
    cache: Arc<Mutex<ReviewCache>>,
    service: &'static str,
    budget: ReviewBudget,
    budgets: Arc<Mutex<Budgets>>,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("audience", &self.audience)
            .field("service", &self.service)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TokenReviewer {
    /// A reviewer for ADS streams with the default budgets.
    pub fn new(client: kube::Client, audience: impl Into<String>) -> Self {
        Self::with_budget(client, audience, ReviewBudget::default())
    }

    /// A reviewer for ADS streams sending TokenReviews for tokens it has not seen recently
    /// within `budget`.
    pub fn with_budget(
        client: kube::Client,
        audience: impl Into<String>,
        budget: ReviewBudget,
    ) -> Self {
        Self {
            client,
            audience: audience.into(),
            cache: Arc::new(Mutex::new(ReviewCache::default())),
            service: "ads",
            budget,
            budgets: Arc::new(Mutex::new(Budgets::new(budget))),
            metrics: None,
        }
    }

    /// A reviewer for `service` (a metric label: `certificates`, `debug`) sharing this one's
    /// recent answers but with budgets of its own, so one service's callers cannot spend the
    /// other's reviews.
    pub fn for_service(&self, service: &'static str) -> Self {
        Self {
            service,
            budgets: Arc::new(Mutex::new(Budgets::new(self.budget))),
            ..self.clone()
        }
    }

    /// The same reviewer counting its refusals in `metrics`.
    pub fn reporting_to(mut self, metrics: Arc<Metrics>) -> Self {
        metrics.token_refusals_start(self.service);
        self.metrics = Some(metrics);
        self
    }

    fn refused(&self, refusal: Refusal) {
        if let Some(m) = &self.metrics {
            m.token_refused(self.service, refusal.reason());
        }
    }

    /// Checks that `token` is valid for our audience and belongs to `node`'s namespace (and
    /// pod, when the token is bound to one); returns the name of its ServiceAccount.
    pub async fn verify(
        &self,
        token: &str,
        peer: Option<IpAddr>,
        node: &ProxyNode,
    ) -> Result<String, AdmissionError> {
        let reviewed = self.review(token, peer).await?;
        let (token_ns, account) = service_account(&reviewed.username).ok_or_else(|| {
            AdmissionError::InvalidToken(format!("{:?} is not a ServiceAccount", reviewed.username))
        })?;
        if token_ns != node.namespace {
            return Err(AdmissionError::TokenNamespaceMismatch {
                token: token_ns.to_string(),
                claimed: node.namespace.clone(),
            });
        }
        if let (Some(bound), Some(claimed)) = (&reviewed.bound_pod, &node.pod_name) {
            if bound != claimed {
                return Err(AdmissionError::InvalidToken(format!(
                    "token is bound to pod {bound:?}, the proxy claims pod {claimed:?}"
                )));
            }
        }
        Ok(account.to_string())
    }

    /// Who the API server says `token` belongs to, for our audience: refused from the token
    /// itself if it cannot pass, else from a recent review, else from a new TokenReview if the
    /// budgets of `peer`, of the claimed namespace and of the service allow one now.
    pub async fn review(&self, token: &str, peer: Option<IpAddr>) -> Verdict {
        use sha2::Digest as _;
        let claims = match tokens::precheck(token, &self.audience, SystemTime::now()) {
            Ok(claims) => claims,
            Err(refusal) => {
                self.refused(refusal);
                return Err(AdmissionError::InvalidToken(match refusal {
                    Refusal::WrongAudience => {
                        format!("token is not for audience {:?}", self.audience)
                    }
                    Refusal::Expired => "token has expired or has no expiry".to_string(),
                    _ => "not a ServiceAccount token (JWT)".to_string(),
                }));
            }
        };
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        {
            let cache = lock(&self.cache);
            if let Some(reviewed) = cache.verified.get(&key, now) {
                return Ok(reviewed);
            }
            if let Some(refusal) = cache.refused.get(&key, now) {
                drop(cache);
                self.refused(Refusal::RefusedBefore);
                return Err(refusal);
            }
        }
        let taken = lock(&self.budgets).take(peer, claims.namespace.as_deref(), now);
        if let Err(refusal) = taken {
            self.refused(refusal);
            return Err(AdmissionError::ReviewThrottled(refusal.reason()));
        }
        let verdict = self.review_uncached(token).await;
        let now = Instant::now();
        match &verdict {
            Ok(reviewed) => {
                let ttl = token_expiry(token)
                    .and_then(|exp| exp.duration_since(SystemTime::now()).ok())
                    .map_or(REVIEW_TTL, |left| left.min(REVIEW_TTL));
                lock(&self.cache)
                    .verified
                    .put(key, now + ttl, reviewed.clone(), now);
            }
            // The API server could not answer: ask again next time.
            Err(AdmissionError::ReviewFailed(_)) => {}
            Err(refusal) => {
                lock(&self.cache)
                    .refused
                    .put(key, now + REFUSAL_TTL, refusal.clone(), now);
            }
        }
        verdict
    }

    /// One TokenReview.
    async fn review_uncached(&self, token: &str) -> Verdict {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let result = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AdmissionError::ReviewFailed(bounds::echo(&e.to_string())))?;
        let status = result.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(AdmissionError::InvalidToken(bounds::echo(
                &status.error.unwrap_or_else(|| "not authenticated".into()),
            )));
        }
        if let Some(audiences) = &status.audiences {
            if !audiences.contains(&self.audience) {
                return Err(AdmissionError::InvalidToken(format!(
                    "token is not for audience {:?}",
                    self.audience
                )));
            }
        }
        let user = status.user.unwrap_or_default();
        let bound_pod = user
            .extra
            .as_ref()
            .and_then(|e| e.get("authentication.kubernetes.io/pod-name"))
            .and_then(|v| v.first())
            .cloned();
        Ok(ReviewedToken {
            username: user.username.unwrap_or_default(),
            bound_pod,
        })
    }
}

/// What a TokenReview reported about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewedToken {
    /// `system:serviceaccount:NS:NAME` for ServiceAccount tokens.
    pub username: String,
    /// The pod the token is bound to, if any.
    pub bound_pod: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::Value;

    fn string(s: &str) -> Value {
        Value {
            kind: Some(ValueKind::StringValue(s.into())),
        }
    }

    fn node(id: &str, md: &[(&str, Value)]) -> Node {
        Node {
            id: id.into(),
            cluster: "c".into(),
            metadata: Some(Struct {
                fields: md.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn parses_contract_node_id_and_metadata_but_never_claimed_labels() {
        let labels = Value {
            kind: Some(ValueKind::StructValue(Struct {
                fields: [("app".to_string(), string("web"))].into_iter().collect(),
            })),
        };
        let n = node(
            "sidecar~198.18.0.7~web-1.shop~shop.svc.cluster.local",
            &[
                (meta::CAPTURE_MODE, string("NONE")),
                ("LABELS", labels),
                (meta::TENANT, string("blue")),
                (meta::POD_NAME, string("web-1")),
            ],
        );
        let p = parse_node(Some(&n), "blue").expect("valid node");
        assert_eq!(p.namespace, "shop");
        assert_eq!(p.pod_name.as_deref(), Some("web-1"));
        assert_eq!(p.ip.as_deref(), Some("198.18.0.7"));
        assert_eq!(p.capture_mode, CaptureMode::None);
        assert!(
            p.labels.is_empty(),
            "labels come from the Pod: {:?}",
            p.labels
        );
    }

    /// Contract 7 from the instance's side: the injector's template, once the kubelet expands
    /// it, is a node id the instance admits.
    #[test]
    fn admits_the_injectors_node_id() {
        let id = NodeId::injector_template()
            .replace("$(POD_IP)", "198.18.0.9")
            .replace("$(POD_NAME)", "web-1")
            .replace("$(POD_NAMESPACE)", "shop");
        let p = parse_node(Some(&node(&id, &[])), "blue").expect("admitted");
        assert_eq!(
            (p.namespace.as_str(), p.pod_name.as_deref()),
            ("shop", Some("web-1"))
        );
    }

    #[test]
    fn tells_gateways_and_proxyless_grpc_clients_from_sidecars() {
        let gw = node(
            "router~198.18.0.8~ingress-1.edge~edge.svc.cluster.local",
            &[],
        );
        let p = parse_node(Some(&gw), "blue").expect("valid node");
        assert_eq!((p.kind, p.namespace.as_str()), (ProxyKind::Router, "edge"));
        let grpc = node(
            "sidecar~198.18.0.9~client-1.shop~shop.svc.cluster.local",
            &[("GENERATOR", string("grpc"))],
        );
        assert_eq!(
            parse_node(Some(&grpc), "blue").expect("valid").kind,
            ProxyKind::Grpc
        );
    }

    #[test]
    fn refuses_contradictions_and_other_tenants() {
        let n = node(
            "sidecar~1.2.3.4~a.shop~shop.svc.cluster.local",
            &[("NAMESPACE", string("bank"))],
        );
        assert!(matches!(
            parse_node(Some(&n), "blue"),
            Err(AdmissionError::NamespaceMismatch { .. })
        ));
        let n = node(
            "sidecar~1.2.3.4~a.shop~shop.svc.cluster.local",
            &[("TENANT", string("green"))],
        );
        let err = parse_node(Some(&n), "blue").expect_err("other tenant");
        assert_eq!(err.to_status().code(), tonic::Code::PermissionDenied);
        assert!(err.to_string().contains("green") && err.to_string().contains("blue"));
        assert_eq!(parse_node(None, "blue"), Err(AdmissionError::MissingNode));
        let garbage = parse_node(
            Some(&node("garbage", &[(meta::NAMESPACE, string("shop"))])),
            "blue",
        )
        .expect_err("an id that does not parse is refused, whatever the metadata says");
        assert_eq!(garbage.to_status().code(), tonic::Code::InvalidArgument);
        assert!(garbage.to_string().contains("node id"), "{garbage}");
        let n = node(
            "sidecar~1.2.3.4~a.shop~shop.svc.cluster.local",
            &[(meta::POD_NAME, string("b"))],
        );
        assert!(matches!(
            parse_node(Some(&n), "blue"),
            Err(AdmissionError::PodMismatch { .. })
        ));
    }

    #[test]
    fn reads_bearer_tokens_and_service_account_names() {
        let mut md = MetadataMap::new();
        assert_eq!(bearer_token(&md), None);
        md.insert("authorization", "Bearer abc.def".parse().expect("ascii"));
        assert_eq!(bearer_token(&md).as_deref(), Some("abc.def"));
        assert_eq!(
            service_account_namespace("system:serviceaccount:shop:default"),
            Some("shop")
        );
        assert_eq!(service_account_namespace("alice"), None);
    }

    /// A kube client whose API server says every token is `username` (or refuses all with
    /// `None`), counting the reviews it answers.
    fn counting_kube(
        reviews: Arc<std::sync::atomic::AtomicUsize>,
        username: Option<&'static str>,
    ) -> kube::Client {
        use http_body_util::BodyExt as _;
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let reviews = Arc::clone(&reviews);
            async move {
                reviews.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = req.into_body().collect().await.expect("body").to_bytes();
                let mut review: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
                review["status"] = match username {
                    Some(user) => serde_json::json!({
                        "authenticated": true, "audiences": ["meshplane-blue"],
                        "user": {"username": user},
                    }),
                    None => serde_json::json!({"authenticated": false, "error": "invalid"}),
                };
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(201)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(
                            serde_json::to_vec(&review).expect("encode"),
                        ))
                        .expect("response"),
                )
            }
        });
        kube::Client::new(service, "default")
    }

    /// A JWT-shaped token for `meshplane-blue` claiming `namespace`, told apart by `n`.
    fn claimed(namespace: &str, n: usize) -> String {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs()
            + 3600;
        let claims = serde_json::json!({
            "aud": "meshplane-blue", "exp": exp,
            "sub": format!("system:serviceaccount:{namespace}:default"),
        });
        format!(
            "{}.{}.{}",
            b64("{}"),
            b64(&claims.to_string()),
            b64(&n.to_string())
        )
    }

    fn refusals(metrics: &Metrics, service: &str, reason: &str) -> String {
        let text = metrics.encode().expect("metrics");
        let series = format!(
            r#"meshplane_xds_token_refusals_total{{service="{service}",reason="{reason}"}} "#
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .unwrap_or("absent")
            .to_string()
    }

    #[tokio::test]
    async fn refused_tokens_cost_one_review_and_unfit_ones_none() {
        let reviews = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let metrics = Arc::new(Metrics::new());
        let reviewer =
            TokenReviewer::new(counting_kube(Arc::clone(&reviews), None), "meshplane-blue")
                .reporting_to(Arc::clone(&metrics));
        let peer = Some(IpAddr::from([198, 18, 0, 9]));
        let junk = claimed("shop", 1);
        for _ in 0..5 {
            let err = reviewer.review(&junk, peer).await.expect_err("refused");
            assert_eq!(err.to_status().code(), tonic::Code::Unauthenticated);
        }
        assert_eq!(reviews.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(refusals(&metrics, "ads", "refused_before"), "4");
        for unfit in ["forged", "a.b.c"] {
            let err = reviewer.review(unfit, peer).await.expect_err("refused");
            assert_eq!(err.to_status().code(), tonic::Code::Unauthenticated);
        }
        assert_eq!(reviews.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(refusals(&metrics, "ads", "malformed"), "2");
        // A certificate reviewer shares what is known, not the budget.
        let certificates = reviewer
            .for_service("certificates")
            .reporting_to(Arc::clone(&metrics));
        assert!(certificates.review(&junk, peer).await.is_err());
        assert_eq!(reviews.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(refusals(&metrics, "certificates", "refused_before"), "1");
    }

    #[tokio::test]
    async fn claims_pick_the_budget_and_the_review_the_identity() {
        let reviews = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let kube = counting_kube(
            Arc::clone(&reviews),
            Some("system:serviceaccount:bank:default"),
        );
        let reviewer =
            TokenReviewer::with_budget(kube, "meshplane-blue", ReviewBudget::uniform(0.0, 2.0));
        let peer = Some(IpAddr::from([198, 18, 0, 9]));
        let node = ProxyNode {
            namespace: "shop".into(),
            ..ProxyNode::default()
        };
        // The token claims shop; the API server says bank.
        let err = reviewer
            .verify(&claimed("shop", 1), peer, &node)
            .await
            .expect_err("bank's token cannot claim shop");
        assert!(
            matches!(err, AdmissionError::TokenNamespaceMismatch { .. }),
            "{err}"
        );
        assert!(reviewer.review(&claimed("shop", 2), peer).await.is_ok());
        // The peer's two reviews are spent: the next new token waits, and says so.
        let err = reviewer
            .review(&claimed("shop", 3), peer)
            .await
            .expect_err("throttled");
        assert_eq!(err, AdmissionError::ReviewThrottled("peer_budget"));
        assert_eq!(err.to_status().code(), tonic::Code::Unavailable);
        assert_eq!(reviews.load(std::sync::atomic::Ordering::SeqCst), 2);
        // A known token costs nothing.
        assert!(reviewer.review(&claimed("shop", 2), peer).await.is_ok());
    }
}
