//! The server: what one client may open or send ([`AdsLimits`]) and the admission of a stream
//! (its first request within its budget, the proxy's identity, its namespace a member), after
//! which the stream runs on its own task ([`super::stream`]).
//!
//! Virtual hosts go over VHDS ([`crate::translate::vhds`]) only to incremental streams of
//! Envoy (`Node.user_agent_name`); state-of-the-world streams and proxyless gRPC clients keep
//! them inline, and so does every client with `--vhds false` ([`AdsServer::with_vhds`]).

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};

use super::budget;
use super::codec::Wire;
use super::pacing;
use super::protocol::{Protocol, StreamState};
use super::stream::{self, request_error, run_stream};
use crate::credential_access::{CredentialAccess, PREFETCH_WAIT};
use crate::model::{ProxyKind, ProxyNode};
use crate::push::Hub;
use crate::tenancy::{bearer_token, parse_node, AdmissionError, TokenReviewer};

/// How long a stream waits for the sources to sync before it is told to come back later.
const SYNC_WAIT: Duration = Duration::from_secs(10);
/// `Node.user_agent_name` of Envoy.
const ENVOY_USER_AGENT: &str = "envoy";
/// Responses buffered per stream before the stream task waits for the proxy to read.
const STREAM_BUFFER: usize = 16;

/// What one client may open or send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdsLimits {
    /// Concurrent streams per HTTP/2 connection (SETTINGS_MAX_CONCURRENT_STREAMS): Envoy opens
    /// one ADS stream per connection, gRPC clients a few.
    pub streams_per_connection: u32,
    /// Connected proxies per namespace.
    pub proxies_per_namespace: usize,
    /// How long a new stream may take to send its first request.
    pub first_request: Duration,
    /// Whether node metadata `LOOPBACK_ADDR` is honoured: only where every pod shares the
    /// host's loopback (the local pod runner); elsewhere a client could pick any value.
    pub honor_loopback: bool,
    /// What a stream, a connection's streams and the streams awaiting admission may hold of
    /// their clients' requests.
    pub budget: budget::BudgetLimits,
    /// How fast a stream's own requests may make it send responses.
    pub pacing: pacing::PacingLimits,
}

impl Default for AdsLimits {
    fn default() -> Self {
        Self {
            streams_per_connection: 16,
            proxies_per_namespace: 5_000,
            first_request: Duration::from_secs(30),
            honor_loopback: false,
            budget: budget::BudgetLimits::default(),
            pacing: pacing::PacingLimits::default(),
        }
    }
}

/// The ADS gRPC service of one tenant revision.
#[derive(Clone)]
pub struct AdsServer {
    hub: Arc<Hub>,
    reviewer: Option<TokenReviewer>,
    pub(super) shutdown: watch::Receiver<bool>,
    limits: AdsLimits,
    /// Whether delta Envoys get virtual hosts over VHDS.
    vhds: bool,
    /// Large first requests awaiting admission, every port's streams together.
    awaiting: budget::AdmissionPool,
    /// Budgets of the open connections.
    connections: budget::Connections,
    /// Kubernetes mode: a connecting gateway waits for the answers about its credentials.
    credential_access: Option<Arc<CredentialAccess>>,
}

impl AdsServer {
    /// `reviewer`: Kubernetes mode verifies proxy tokens; `None` trusts node metadata
    /// (directory mode). Streams end when `shutdown` turns true.
    pub fn new(
        hub: Arc<Hub>,
        reviewer: Option<TokenReviewer>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let reviewer = reviewer.map(|r| r.reporting_to(Arc::clone(hub.metrics())));
        Self {
            hub,
            reviewer,
            shutdown,
            limits: AdsLimits::default(),
            vhds: true,
            awaiting: budget::AdmissionPool::new(AdsLimits::default().budget.awaiting_admission),
            connections: budget::Connections::default(),
            credential_access: None,
        }
    }

    /// The same server making a connecting gateway wait (briefly) until `access` knows which
    /// of the tenant's credentials its ServiceAccount may read, so its first config has the
    /// TLS servers it may serve.
    pub fn with_credential_access(mut self, access: Option<Arc<CredentialAccess>>) -> Self {
        self.credential_access = access;
        self
    }

    /// The same server serving virtual hosts over VHDS to delta Envoys (`true`, the default)
    /// or inline to every client.
    pub fn with_vhds(mut self, vhds: bool) -> Self {
        self.vhds = vhds;
        self
    }

    /// The same server with other limits.
    pub fn with_limits(mut self, limits: AdsLimits) -> Self {
        self.limits = limits;
        self.awaiting = budget::AdmissionPool::new(limits.budget.awaiting_admission);
        self
    }

    /// What one client may open or send.
    pub fn limits(&self) -> AdsLimits {
        self.limits
    }

    async fn admit(
        &self,
        node: Option<&Node>,
        token: Option<String>,
        peer: Option<std::net::IpAddr>,
    ) -> Result<ProxyNode, Status> {
        let result = self.check(node, token, peer).await;
        if let Err(e) = &result {
            self.hub.metrics().rejected(e.reason());
            let node = node.map(|n| crate::bounds::clip(&n.id, crate::bounds::ECHO));
            crate::budgeted!(crate::log_budget::CONNECTIONS, warn, node = node.as_deref(), error = %e, "refused ADS stream");
        }
        result.map_err(|e| e.to_status())
    }

    async fn check(
        &self,
        node: Option<&Node>,
        token: Option<String>,
        peer: Option<std::net::IpAddr>,
    ) -> Result<ProxyNode, AdmissionError> {
        let mut proxy = parse_node(node, self.hub.tenant())?;
        proxy.loopback = proxy
            .loopback
            .filter(|l| self.limits.honor_loopback && is_loopback_v4(l));
        if let Some(reviewer) = &self.reviewer {
            let token = token.ok_or(AdmissionError::MissingToken)?;
            // Only the verified identity decides which gateway credentials it may get.
            proxy.service_account = Some(reviewer.verify(&token, peer, &proxy).await?);
        }
        // Membership is only known once the sources synced.
        if tokio::time::timeout(SYNC_WAIT, self.hub.wait_ready())
            .await
            .is_err()
        {
            return Err(AdmissionError::NotSynced);
        }
        if !self.hub.admits_namespace(&proxy.namespace) {
            return Err(AdmissionError::NotMember {
                namespace: crate::bounds::echo(&proxy.namespace),
                tenant: self.hub.tenant().to_string(),
                revision: self.hub.revision().to_string(),
            });
        }
        if let (ProxyKind::Router, Some(access), Some(account)) = (
            proxy.kind,
            &self.credential_access,
            proxy.service_account.as_deref(),
        ) {
            let names = self.hub.credential_names();
            access
                .prefetch(&proxy.namespace, account, &names, PREFETCH_WAIT)
                .await;
        }
        Ok(proxy)
    }

    /// The decoder of a new stream's requests and the share of the admission pool its first
    /// request takes, if large.
    pub(crate) fn decoder<W: Wire>(
        &self,
        buffer: tonic::codec::BufferSettings,
    ) -> (budget::BudgetedDecoder<W>, budget::AwaitingShare) {
        let awaiting = budget::AwaitingShare::default();
        let decoder = budget::BudgetedDecoder::new(
            self.limits.budget,
            Arc::clone(self.hub.metrics()),
            self.awaiting.clone(),
            awaiting.clone(),
            buffer,
        );
        (decoder, awaiting)
    }

    /// The budget of the connection at these addresses.
    pub(crate) fn connection_budget(
        &self,
        local: Option<std::net::SocketAddr>,
        remote: Option<std::net::SocketAddr>,
    ) -> Arc<budget::ConnectionBudget> {
        self.connections.budget(local, remote, &self.limits.budget)
    }

    pub(crate) async fn open<W: Wire>(
        &self,
        request: Request<Streaming<W::Req>>,
        connection: Arc<budget::ConnectionBudget>,
        awaiting: budget::AwaitingShare,
    ) -> Result<ReceiverStream<Result<W::Resp, Status>>, Status> {
        let token = bearer_token(request.metadata());
        let peer = request.remote_addr().map(|a| a.ip());
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(self.limits.first_request, inbound.message())
            .await
            .map_err(|_| {
                Status::invalid_argument(format!(
                    "no first request within {:?}",
                    self.limits.first_request
                ))
            })?
            .map_err(request_error)?
            .ok_or_else(|| Status::invalid_argument("stream closed before its first request"))?;
        // VHDS is Envoy's (delta only); other delta clients get routes inline.
        let vhds = self.vhds
            && W::PROTOCOL == Protocol::Delta
            && W::node(&first).is_some_and(|n| n.user_agent_name == ENVOY_USER_AGENT);
        let mut state = StreamState::new(W::PROTOCOL);
        if vhds {
            state = state.with_vhds();
        }
        // What the first request would make the stream hold is refused before admission.
        let mut budget = budget::StreamBudget::new(
            self.limits.budget,
            connection,
            Arc::clone(self.hub.metrics()),
        );
        stream::admit::<W>(&mut budget, &state, &first)?;
        let admitted = self.admit(W::node(&first), token, peer).await;
        awaiting.release();
        let node = admitted?;
        let handle = self
            .hub
            .try_connect(node, W::PROTOCOL, self.limits.proxies_per_namespace)
            .map_err(|node| {
                let e = AdmissionError::TooManyProxies {
                    namespace: node.namespace,
                    max: self.limits.proxies_per_namespace,
                };
                self.hub.metrics().rejected(e.reason());
                crate::budgeted!(crate::log_budget::CONNECTIONS, warn, error = %e, "refused ADS stream");
                e.to_status()
            })?;
        let node = handle.node();
        crate::budgeted!(crate::log_budget::CONNECTIONS, info, proxy = %node.id, namespace = %node.namespace, protocol = W::PROTOCOL.as_str(), "proxy connected");
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(run_stream::<W>(
            handle,
            state,
            stream::Allowances {
                budget,
                pacing: pacing::Pacing::new(self.limits.pacing, std::time::Instant::now()),
            },
            first,
            inbound,
            tx,
            self.shutdown.clone(),
        ));
        Ok(ReceiverStream::new(rx))
    }
}

/// Whether `addr` is an IPv4 address in 127.0.0.0/8.
fn is_loopback_v4(addr: &str) -> bool {
    addr.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.is_loopback())
}
