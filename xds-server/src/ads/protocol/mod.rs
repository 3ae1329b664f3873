//! The xDS protocol state of one ADS stream, per resource type, as pure logic: which request
//! is an ACK or a NACK, what each proxy holds, and what to send next. No I/O; the stream task
//! ([`super::stream`]) feeds it requests and snapshots, and the codec ([`super::codec`])
//! encodes what it plans. In parts, each a plain struct or a step of planning:
//!
//! - [`subscription`]: what the proxy subscribed to per type, names or the wildcard;
//! - [`ack`]: what was offered and how the proxy answered per type: nonces, ACK/NACK, what it
//!   holds;
//! - [`tracker`]: one type's state, and its plan in steps: due, scope, the protocol's branch
//!   ([`plan_sotw`], [`plan_delta`]), commit;
//! - [`stream_state`]: one stream's types, and each request folded into its type;
//! - [`order`]: which types go when (dependencies, endpoints after clusters, removals last);
//! - [`status`]: the plain value a stream publishes for the debug endpoints.
//!
//! Rules kept here (see the xDS protocol, named sections in quotes):
//! - a nonce per response; a request answers the latest nonce of its type, older ones are
//!   stale ("ACK/NACK and resource type instance version");
//! - a NACK (request with `error_detail`) restores what the proxy had and blocks that type
//!   until its desired content changes;
//! - at most one un-ACKed response per type; newer state waits and is coalesced;
//! - an ACK is never answered with unchanged resources ("When to send an update");
//! - additions go out in CDS → EDS → LDS → RDS order ("Eventual consistency
//!   considerations"). Listeners and routes wait while a type they depend on
//!   ([`DEPENDS_ON`]) has a response awaiting its ACK or a change the proxy rejected, so they
//!   never name a cluster the proxy has not accepted. Endpoints go only for clusters already
//!   sent on the stream, without waiting for the CDS ACK: Envoy holds that ACK until its new
//!   clusters warmed, which takes their endpoints ("Resource warming");
//! - a cluster that changes is re-created by Envoy, and the new one warms until an EDS
//!   response carries its assignment (Envoy does not hand it the one it holds, it waits out
//!   its initial fetch): so the assignment of every cluster a CDS response changes or adds goes
//!   (again) after it;
//! - removals only once nothing is in flight, one type at a time in reverse order (make before
//!   break), each after the types that depend on it are settled;
//! - a SotW response of endpoints carries what changed, as an incremental one would
//!   ([`carries_whole_state`]; xDS keeps state of the world for listeners and clusters only,
//!   "Grouping Resources into Responses"): an assignment left out stays with the proxy until it
//!   unsubscribes (Envoy hands each assignment to the watch of its cluster and drops it with
//!   the watch);
//! - what a proxy lacks is found from the names its snapshot records as changed since its
//!   predecessor when the proxy holds that predecessor whole ([`super::snapshot::diff`]), so a
//!   settled stream plans in the size of the change; otherwise by a walk over both;
//! - a delta Envoy ([`StreamState::with_vhds`]) gets route configurations as VHDS stubs and
//!   their virtual hosts as a fifth type after them, once the clusters and the routes are
//!   ACKed. A subscribed name covers every virtual host named `<name>/<vhost>` (namespace
//!   matching), but Envoy 1.40 subscribes with no names (a wildcard) and drops virtual hosts of a
//!   route configuration it has not processed yet (no watch takes them): so virtual hosts go
//!   only for the route configurations the proxy holds, and those of a configuration it drops
//!   are forgotten with it (a new one gets them again). Other streams do not serve the type.

use std::time::Instant;

use crate::ads::payload::Resources;

pub mod ack;
pub mod order;
pub mod plan_delta;
pub mod plan_sotw;
pub mod status;
pub mod stream_state;
pub mod subscription;
pub mod tracker;

#[cfg(test)]
mod dependency_order;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tracker_model;

pub use ack::Nack;
pub use order::DEPENDS_ON;
pub use plan_sotw::carries_whole_state;
pub use stream_state::StreamState;
pub use tracker::TypeTracker;

/// Which ADS variant a stream speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// State of the world: every response carries the full set of the type.
    Sotw,
    /// Incremental: responses carry changed resources and removed names.
    Delta,
}

impl Protocol {
    /// Label value for metrics and debug output.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Sotw => "sotw",
            Protocol::Delta => "delta",
        }
    }
}

/// A response the stream must send, before protocol encoding.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub type_url: &'static str,
    pub nonce: String,
    /// SotW `version_info`; delta `system_version_info`.
    pub version: String,
    pub resources: Resources,
    /// Delta only: names the proxy must drop.
    pub removed: Vec<String>,
    /// When the change behind this response was first seen.
    pub changed_at: Instant,
}

/// What a request meant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestOutcome {
    /// A type we do not serve.
    UnknownType(String),
    /// The request answers an older response: ignored.
    Stale,
    /// The latest response of the type was accepted.
    Ack {
        type_url: &'static str,
        version: String,
    },
    /// The latest response of the type was rejected.
    Nack { type_url: &'static str, nack: Nack },
    /// A (re)subscription, nothing pending was answered.
    Subscribe { type_url: &'static str },
}
