//! Budgets for what a client makes a stream hold of its requests, checked before it is held.
//!
//! A request is scanned in its encoded form before it is decoded ([`BudgetedDecoder`]): one
//! naming more than a type's worth of resources, too many initial versions or an oversized
//! version is refused undecoded (decoding multiplies its size: every name becomes an
//! allocation). What a stream keeps across requests (subscribed names, initial versions) is
//! checked against the stream's budget before the request is folded ([`StreamBudget`]); the
//! streams of one HTTP/2 connection share a few stream budgets ([`ConnectionBudget`]); large
//! first requests waiting for admission share one pool ([`AdmissionPool`]). Exceeding any ends
//! the stream with RESOURCE_EXHAUSTED naming the limit ([`BudgetError`]).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use prost::bytes::Buf;
use prost::encoding::decode_varint;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic::Status;

use super::codec::Wire;
pub use super::codec::{Held, Prospect, Scan};
use super::protocol::{Protocol, StreamState};
use crate::bounds;
use crate::metrics::Metrics;

/// The budgets of one server ([`super::AdsLimits::budget`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetLimits {
    /// Names subscribed per type, and sent in one request.
    pub names_per_type: usize,
    /// Names a stream holds over every type.
    pub names_per_stream: usize,
    /// Bytes of the names a stream holds.
    pub name_bytes_per_stream: usize,
    /// `initial_resource_versions` entries per request.
    pub initial_versions: usize,
    /// Longest `version_info` and `response_nonce`.
    pub version_info: usize,
    /// Stream budgets the streams of one connection share.
    pub connection_streams: usize,
    /// First requests at least this large count against `awaiting_admission`.
    pub large_first_request: usize,
    /// Bytes of large first requests held while their streams await admission.
    pub awaiting_admission: usize,
}

impl Default for BudgetLimits {
    fn default() -> Self {
        Self {
            names_per_type: bounds::MAX_NAMES_PER_TYPE,
            names_per_stream: bounds::MAX_NAMES_PER_STREAM,
            name_bytes_per_stream: bounds::MAX_NAME_BYTES_PER_STREAM,
            initial_versions: bounds::MAX_INITIAL_VERSIONS,
            version_info: bounds::MAX_VERSION_INFO,
            connection_streams: bounds::CONNECTION_STREAM_BUDGETS,
            large_first_request: bounds::LARGE_FIRST_REQUEST,
            awaiting_admission: bounds::MAX_AWAITING_ADMISSION,
        }
    }
}

/// Every `limit` label of `meshplane_xds_stream_budget_exceeded_total`.
pub const LIMITS: [&str; 8] = [
    "names_per_type",
    "names_per_stream",
    "name_bytes_per_stream",
    "initial_resource_versions",
    "version_info",
    "nonce",
    "connection",
    "awaiting_admission",
];

/// A budget a client exceeded. It travels as the source of the RESOURCE_EXHAUSTED status
/// ([`BudgetError::of`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("{count} resource names of one type; at most {max} per type (limit names_per_type)")]
    NamesPerType { count: usize, max: usize },
    #[error(
        "the stream would hold {count} resource names; at most {max} (limit names_per_stream)"
    )]
    NamesPerStream { count: usize, max: usize },
    #[error("the stream would hold {bytes} bytes of resource names; at most {max} (limit name_bytes_per_stream)")]
    NameBytesPerStream { bytes: usize, max: usize },
    #[error("{count} initial_resource_versions; at most {max} per request (limit initial_resource_versions)")]
    InitialVersions { count: usize, max: usize },
    #[error("version_info of {len} bytes; at most {max} (limit version_info)")]
    VersionInfo { len: usize, max: usize },
    #[error("response_nonce of {len} bytes; at most {max} (limit nonce)")]
    Nonce { len: usize, max: usize },
    #[error("the streams of this connection would hold {names} resource names, {bytes} bytes; at most {max_names}, {max_bytes} bytes per connection (limit connection)")]
    Connection {
        names: usize,
        bytes: usize,
        max_names: usize,
        max_bytes: usize,
    },
    #[error("first request of {bytes} bytes while large first requests awaiting admission hold {held} of {max} bytes; retry later (limit awaiting_admission)")]
    AwaitingAdmission {
        bytes: usize,
        held: usize,
        max: usize,
    },
}

impl BudgetError {
    /// The `limit` label of the metric, one of [`LIMITS`].
    pub fn limit(&self) -> &'static str {
        match self {
            Self::NamesPerType { .. } => LIMITS[0],
            Self::NamesPerStream { .. } => LIMITS[1],
            Self::NameBytesPerStream { .. } => LIMITS[2],
            Self::InitialVersions { .. } => LIMITS[3],
            Self::VersionInfo { .. } => LIMITS[4],
            Self::Nonce { .. } => LIMITS[5],
            Self::Connection { .. } => LIMITS[6],
            Self::AwaitingAdmission { .. } => LIMITS[7],
        }
    }

    /// RESOURCE_EXHAUSTED with this as its message and source.
    pub fn to_status(&self) -> Status {
        let mut status = Status::resource_exhausted(self.to_string());
        status.set_source(Arc::new(self.clone()));
        status
    }

    /// The budget error a status carries, if any.
    pub fn of(status: &Status) -> Option<&BudgetError> {
        std::error::Error::source(status)?.downcast_ref()
    }
}

/// Where each counted field of a request is.
struct Fields {
    version_info: u32,
    subscribe: [u32; 2],
    unsubscribe: [u32; 2],
    initial: u32,
    nonce: u32,
}

/// `DiscoveryRequest`: version_info 1, resource_names 3, response_nonce 5, resource_locators 7.
const SOTW: Fields = Fields {
    version_info: 1,
    subscribe: [3, 7],
    unsubscribe: [0, 0],
    initial: 0,
    nonce: 5,
};

/// `DeltaDiscoveryRequest`: resource_names_subscribe 3, resource_names_unsubscribe 4,
/// initial_resource_versions 5, response_nonce 6, resource_locators_(un)subscribe 8 and 9.
const DELTA: Fields = Fields {
    version_info: 0,
    subscribe: [3, 8],
    unsubscribe: [4, 9],
    initial: 5,
    nonce: 6,
};

/// Counts the top-level fields of `buf`, an encoded request of `protocol`, without decoding
/// them. `None` when it is no protobuf this scan reads (groups, bad lengths): the decoder then
/// reports it or the decoded request is counted instead.
pub fn scan(protocol: Protocol, mut buf: &[u8]) -> Option<Scan> {
    let fields = match protocol {
        Protocol::Sotw => &SOTW,
        Protocol::Delta => &DELTA,
    };
    let mut s = Scan::default();
    while !buf.is_empty() {
        let key = decode_varint(&mut buf).ok()?;
        let tag = u32::try_from(key >> 3).ok()?;
        let skip = match key & 7 {
            0 => {
                decode_varint(&mut buf).ok()?;
                0
            }
            1 => 8,
            5 => 4,
            2 => usize::try_from(decode_varint(&mut buf).ok()?).ok()?,
            _ => return None,
        };
        if skip > buf.len() {
            return None;
        }
        buf.advance(skip);
        if key & 7 != 2 || tag == 0 {
            continue;
        }
        if fields.subscribe.contains(&tag) {
            s.subscribe += 1;
            s.subscribe_bytes += skip;
        } else if fields.unsubscribe.contains(&tag) {
            s.unsubscribe += 1;
        } else if tag == fields.initial {
            s.initial_versions += 1;
            s.initial_bytes += skip;
        } else if tag == fields.version_info {
            s.version_info = skip;
        } else if tag == fields.nonce {
            s.nonce = skip;
        }
    }
    Some(s)
}

impl BudgetLimits {
    /// Whether one request is within the per-request limits.
    pub fn check_request(&self, s: &Scan) -> Result<(), BudgetError> {
        let max = self.names_per_type;
        for count in [s.subscribe, s.unsubscribe] {
            if count > max {
                return Err(BudgetError::NamesPerType { count, max });
            }
        }
        if s.initial_versions > self.initial_versions {
            return Err(BudgetError::InitialVersions {
                count: s.initial_versions,
                max: self.initial_versions,
            });
        }
        let bytes = s.subscribe_bytes + s.initial_bytes;
        if bytes > self.name_bytes_per_stream {
            return Err(BudgetError::NameBytesPerStream {
                bytes,
                max: self.name_bytes_per_stream,
            });
        }
        let max = self.version_info;
        if s.version_info > max {
            return Err(BudgetError::VersionInfo {
                len: s.version_info,
                max,
            });
        }
        if s.nonce > max {
            return Err(BudgetError::Nonce { len: s.nonce, max });
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Bytes of large first requests held while their streams await admission, shared by every
/// stream of a server.
#[derive(Clone, Debug)]
pub struct AdmissionPool {
    held: Arc<Mutex<usize>>,
    max: usize,
}

impl AdmissionPool {
    pub fn new(max: usize) -> Self {
        Self {
            held: Arc::default(),
            max,
        }
    }

    /// A share of `bytes`, returned when dropped.
    fn take(&self, bytes: usize) -> Result<PoolShare, BudgetError> {
        let mut held = lock(&self.held);
        if *held + bytes > self.max {
            return Err(BudgetError::AwaitingAdmission {
                bytes,
                held: *held,
                max: self.max,
            });
        }
        *held += bytes;
        Ok(PoolShare {
            held: Arc::clone(&self.held),
            bytes,
        })
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        *lock(&self.held)
    }
}

#[derive(Debug)]
struct PoolShare {
    held: Arc<Mutex<usize>>,
    bytes: usize,
}

impl Drop for PoolShare {
    fn drop(&mut self) {
        *lock(&self.held) -= self.bytes;
    }
}

/// The share of the [`AdmissionPool`] a stream's first request took, if it was large: held
/// until admission decides ([`AwaitingShare::release`]) or the stream ends.
#[derive(Clone, Debug, Default)]
pub struct AwaitingShare(Arc<Mutex<Option<PoolShare>>>);

impl AwaitingShare {
    pub fn release(&self) {
        lock(&self.0).take();
    }
}

/// A connection's identity while it is open: its two addresses.
type ConnectionKey = (Option<SocketAddr>, Option<SocketAddr>);
type Registry = Mutex<HashMap<ConnectionKey, Weak<ConnectionBudget>>>;

/// The open connections' budgets, found by their addresses.
#[derive(Clone, Debug, Default)]
pub struct Connections(Arc<Registry>);

impl Connections {
    /// The budget of the connection at `local`/`remote`, shared with its other streams (a
    /// stream of an unknown connection gets one of its own).
    pub fn budget(
        &self,
        local: Option<SocketAddr>,
        remote: Option<SocketAddr>,
        limits: &BudgetLimits,
    ) -> Arc<ConnectionBudget> {
        let known = remote.is_some();
        let key = (local, remote);
        let mut map = lock(&self.0);
        if known {
            if let Some(b) = map.get(&key).and_then(Weak::upgrade) {
                return b;
            }
        }
        let budget = Arc::new(ConnectionBudget {
            held: Mutex::default(),
            max: Held {
                names: limits.names_per_stream * limits.connection_streams,
                bytes: limits.name_bytes_per_stream * limits.connection_streams,
            },
            key: known.then_some(key),
            registry: Arc::downgrade(&self.0),
        });
        if known {
            map.insert(key, Arc::downgrade(&budget));
        }
        budget
    }

    /// Connections with a budget now.
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the streams of one connection hold together.
#[derive(Debug)]
pub struct ConnectionBudget {
    held: Mutex<Held>,
    max: Held,
    key: Option<ConnectionKey>,
    registry: Weak<Registry>,
}

impl ConnectionBudget {
    /// Moves a stream's charge from `from` to `to`; growth must fit unless `force`.
    fn recharge(&self, from: Held, to: Held, force: bool) -> Result<(), BudgetError> {
        let mut held = lock(&self.held);
        let next = Held {
            names: held.names - from.names + to.names,
            bytes: held.bytes - from.bytes + to.bytes,
        };
        let grows = to.names > from.names || to.bytes > from.bytes;
        if !force && grows && (next.names > self.max.names || next.bytes > self.max.bytes) {
            return Err(BudgetError::Connection {
                names: next.names,
                bytes: next.bytes,
                max_names: self.max.names,
                max_bytes: self.max.bytes,
            });
        }
        *held = next;
        Ok(())
    }

    /// What its streams hold now.
    pub fn held(&self) -> Held {
        *lock(&self.held)
    }
}

impl Drop for ConnectionBudget {
    fn drop(&mut self) {
        let (Some(key), Some(registry)) = (self.key, self.registry.upgrade()) else {
            return;
        };
        let mut map = lock(&registry);
        // Another stream of a new connection at the same addresses may have replaced it.
        if map.get(&key).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&key);
        }
    }
}

/// The budget of one stream: what it holds is charged to its connection.
#[derive(Debug)]
pub struct StreamBudget {
    limits: BudgetLimits,
    connection: Arc<ConnectionBudget>,
    metrics: Arc<Metrics>,
    /// Charged to the connection now.
    charged: Held,
    /// Initial versions accepted, counted for the stream's life (what a proxy says it holds
    /// is kept until responses replace it).
    initial: Held,
}

impl StreamBudget {
    pub fn new(
        limits: BudgetLimits,
        connection: Arc<ConnectionBudget>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            limits,
            connection,
            metrics,
            charged: Held::default(),
            initial: Held::default(),
        }
    }

    /// Whether the stream may hold what `prospect` says once the request is folded; charges
    /// its growth to the connection. A refusal is counted in the metrics.
    pub fn admit(&mut self, prospect: &Prospect) -> Result<(), BudgetError> {
        let result = self.check(prospect);
        if let Err(e) = &result {
            self.metrics.budget_exceeded(e.limit());
        }
        result
    }

    fn check(&mut self, p: &Prospect) -> Result<(), BudgetError> {
        let l = &self.limits;
        if p.type_names > l.names_per_type {
            return Err(BudgetError::NamesPerType {
                count: p.type_names,
                max: l.names_per_type,
            });
        }
        let initial = Held {
            names: self.initial.names + p.initial.names,
            bytes: self.initial.bytes + p.initial.bytes,
        };
        let after = Held {
            names: p.subscribed.names + initial.names,
            bytes: p.subscribed.bytes + initial.bytes,
        };
        if after.names > l.names_per_stream {
            return Err(BudgetError::NamesPerStream {
                count: after.names,
                max: l.names_per_stream,
            });
        }
        if after.bytes > l.name_bytes_per_stream {
            return Err(BudgetError::NameBytesPerStream {
                bytes: after.bytes,
                max: l.name_bytes_per_stream,
            });
        }
        self.connection.recharge(self.charged, after, false)?;
        self.charged = after;
        self.initial = initial;
        Ok(())
    }

    /// Charges what `state` holds now (a request it ignored, e.g. stale, holds less than
    /// its prospect).
    pub fn settle(&mut self, state: &StreamState) {
        let (names, bytes) = state.names_held();
        let now = Held {
            names: names + self.initial.names,
            bytes: bytes + self.initial.bytes,
        };
        if now != self.charged {
            // Never more than admitted: the prospect is an upper bound.
            let _ = self.connection.recharge(self.charged, now, true);
            self.charged = now;
        }
    }
}

impl Drop for StreamBudget {
    fn drop(&mut self) {
        let _ = self
            .connection
            .recharge(self.charged, Held::default(), true);
    }
}

/// Decodes requests of `W`, each scanned first and refused undecoded when over a per-request
/// limit; a large first request takes its share of the [`AdmissionPool`] before it is decoded.
pub struct BudgetedDecoder<W> {
    limits: BudgetLimits,
    metrics: Arc<Metrics>,
    pool: AdmissionPool,
    awaiting: AwaitingShare,
    first: bool,
    buffer: BufferSettings,
    wire: PhantomData<fn() -> W>,
}

impl<W: Wire> BudgetedDecoder<W> {
    pub fn new(
        limits: BudgetLimits,
        metrics: Arc<Metrics>,
        pool: AdmissionPool,
        awaiting: AwaitingShare,
        buffer: BufferSettings,
    ) -> Self {
        Self {
            limits,
            metrics,
            pool,
            awaiting,
            first: true,
            buffer,
            wire: PhantomData,
        }
    }

    fn refuse(&self, e: BudgetError) -> Status {
        self.metrics.budget_exceeded(e.limit());
        e.to_status()
    }
}

impl<W: Wire> Decoder for BudgetedDecoder<W> {
    type Item = W::Req;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<W::Req>, Status> {
        let len = src.remaining();
        // The message is one contiguous buffer (tonic gathers it whole).
        let scanned = (src.chunk().len() == len)
            .then(|| scan(W::PROTOCOL, src.chunk()))
            .flatten();
        if let Some(s) = &scanned {
            self.limits.check_request(s).map_err(|e| self.refuse(e))?;
        }
        if std::mem::take(&mut self.first) && len >= self.limits.large_first_request {
            let share = self.pool.take(len).map_err(|e| self.refuse(e))?;
            *lock(&self.awaiting.0) = Some(share);
        }
        let req =
            <W::Req as prost::Message>::decode(src).map_err(|e| Status::internal(e.to_string()))?;
        if scanned.is_none() {
            self.limits
                .check_request(&W::scanned(&req))
                .map_err(|e| self.refuse(e))?;
        }
        Ok(Some(req))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.buffer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryRequest, DiscoveryRequest, ResourceLocator,
    };
    use prost::Message;

    fn names(n: usize, prefix: &str) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    #[test]
    fn the_scan_counts_what_decoding_would_allocate() {
        let sotw = DiscoveryRequest {
            version_info: "v1".into(),
            resource_names: names(10, "c"),
            resource_locators: vec![ResourceLocator {
                name: "l".into(),
                ..Default::default()
            }],
            response_nonce: "7".into(),
            type_url: "t".repeat(300),
            ..Default::default()
        };
        let s = scan(Protocol::Sotw, &sotw.encode_to_vec()).expect("scans");
        assert_eq!(s.subscribe, 11);
        assert_eq!(s.subscribe_bytes, 10 * 2 + 3);
        assert_eq!((s.version_info, s.nonce), (2, 1));

        let delta = DeltaDiscoveryRequest {
            resource_names_subscribe: names(5, "s"),
            resource_names_unsubscribe: names(3, "u"),
            initial_resource_versions: names(4, "i")
                .into_iter()
                .map(|n| (n, "v".to_string()))
                .collect(),
            response_nonce: "12".into(),
            ..Default::default()
        };
        let s = scan(Protocol::Delta, &delta.encode_to_vec()).expect("scans");
        assert_eq!((s.subscribe, s.unsubscribe, s.initial_versions), (5, 3, 4));
        assert_eq!(s.nonce, 2);
        // Map entries: key field (2 + 2 bytes) and value field (2 + 1 bytes).
        assert_eq!(s.initial_bytes, 4 * 7);
        // A truncated request is not scanned (the decoder reports it).
        let bytes = delta.encode_to_vec();
        assert_eq!(scan(Protocol::Delta, &bytes[..bytes.len() - 1]), None);
    }

    #[test]
    fn each_per_request_limit_names_itself() {
        let l = BudgetLimits {
            names_per_type: 10,
            initial_versions: 5,
            name_bytes_per_stream: 100,
            version_info: 8,
            ..BudgetLimits::default()
        };
        let ok = Scan {
            subscribe: 10,
            subscribe_bytes: 50,
            initial_versions: 5,
            initial_bytes: 50,
            version_info: 8,
            nonce: 8,
            ..Scan::default()
        };
        assert_eq!(l.check_request(&ok), Ok(()));
        let over = |s: Scan| l.check_request(&s).expect_err("over").limit();
        assert_eq!(
            over(Scan {
                subscribe: 11,
                ..ok
            }),
            "names_per_type"
        );
        assert_eq!(
            over(Scan {
                unsubscribe: 11,
                ..ok
            }),
            "names_per_type"
        );
        assert_eq!(
            over(Scan {
                initial_versions: 6,
                ..ok
            }),
            "initial_resource_versions"
        );
        assert_eq!(
            over(Scan {
                initial_bytes: 51,
                ..ok
            }),
            "name_bytes_per_stream"
        );
        assert_eq!(
            over(Scan {
                version_info: 9,
                ..ok
            }),
            "version_info"
        );
        assert_eq!(over(Scan { nonce: 9, ..ok }), "nonce");
        let status = BudgetError::Nonce { len: 9, max: 8 }.to_status();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            BudgetError::of(&status),
            Some(&BudgetError::Nonce { len: 9, max: 8 })
        );
        assert!(
            status.message().contains("limit nonce"),
            "{}",
            status.message()
        );
    }

    fn budget(limits: BudgetLimits, connection: &Arc<ConnectionBudget>) -> StreamBudget {
        StreamBudget::new(limits, Arc::clone(connection), Arc::new(Metrics::new()))
    }

    fn prospect(names: usize, bytes: usize) -> Prospect {
        Prospect {
            type_names: names,
            subscribed: Held { names, bytes },
            initial: Held::default(),
        }
    }

    #[test]
    fn streams_of_a_connection_share_its_budget_and_give_it_back() {
        let limits = BudgetLimits {
            names_per_stream: 100,
            name_bytes_per_stream: 1000,
            connection_streams: 2,
            ..BudgetLimits::default()
        };
        let connections = Connections::default();
        let a: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let b: SocketAddr = "127.0.0.1:2".parse().expect("addr");
        let one = connections.budget(Some(a), Some(b), &limits);
        let same = connections.budget(Some(a), Some(b), &limits);
        assert!(Arc::ptr_eq(&one, &same));
        let other = connections.budget(Some(a), Some(a), &limits);
        assert!(!Arc::ptr_eq(&one, &other));
        let mut s1 = budget(limits, &one);
        let mut s2 = budget(limits, &one);
        let mut s3 = budget(limits, &one);
        s1.admit(&prospect(90, 900)).expect("fits");
        s2.admit(&prospect(90, 900)).expect("fits");
        let e = s3
            .admit(&prospect(30, 300))
            .expect_err("over the connection");
        assert_eq!(e.limit(), "connection");
        // Its own connection is not affected.
        budget(limits, &other)
            .admit(&prospect(90, 900))
            .expect("another connection");
        // A smaller subscription gives room back; so does a stream that ends.
        s1.admit(&prospect(60, 600)).expect("shrinks");
        s3.admit(&prospect(30, 300)).expect("room again");
        assert_eq!(
            one.held(),
            Held {
                names: 180,
                bytes: 1800
            }
        );
        drop(s2);
        assert_eq!(
            one.held(),
            Held {
                names: 90,
                bytes: 900
            }
        );
        drop((s1, s3, same));
        assert_eq!(connections.len(), 2);
        drop(one);
        assert_eq!(connections.len(), 1, "a closed connection's entry goes");
        drop(other);
        assert!(connections.is_empty());
    }

    #[test]
    fn a_stream_budget_bounds_names_bytes_and_initial_versions() {
        let limits = BudgetLimits {
            names_per_type: 50,
            names_per_stream: 100,
            name_bytes_per_stream: 1000,
            ..BudgetLimits::default()
        };
        let conn = Connections::default().budget(None, None, &limits);
        let mut s = budget(limits, &conn);
        assert_eq!(
            s.admit(&prospect(51, 51)).expect_err("per type").limit(),
            "names_per_type"
        );
        assert_eq!(
            s.admit(&Prospect {
                type_names: 50,
                subscribed: Held {
                    names: 101,
                    bytes: 101
                },
                ..Prospect::default()
            })
            .expect_err("per stream")
            .limit(),
            "names_per_stream"
        );
        assert_eq!(
            s.admit(&prospect(10, 1001)).expect_err("bytes").limit(),
            "name_bytes_per_stream"
        );
        // Initial versions stay counted.
        s.admit(&Prospect {
            initial: Held {
                names: 60,
                bytes: 600,
            },
            ..prospect(10, 100)
        })
        .expect("fits");
        assert_eq!(
            s.admit(&prospect(41, 410))
                .expect_err("with the initial")
                .limit(),
            "names_per_stream"
        );
        s.admit(&prospect(40, 400)).expect("fits");
        assert_eq!(
            conn.held(),
            Held {
                names: 100,
                bytes: 1000
            }
        );
    }

    #[test]
    fn the_admission_pool_is_shared_and_returned() {
        let pool = AdmissionPool::new(100);
        let a = pool.take(60).expect("fits");
        let e = pool.take(50).expect_err("over");
        assert_eq!(e.limit(), "awaiting_admission");
        let b = pool.take(40).expect("fits");
        assert_eq!(pool.held(), 100);
        drop((a, b));
        assert_eq!(pool.held(), 0);
    }
}
