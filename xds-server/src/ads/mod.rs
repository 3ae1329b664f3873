//! The Aggregated Discovery Service, in layers. Each layer imports only the layers above it in
//! this list (`scripts/check-layers.py` checks it, and that no two files import each other):
//!
//! 1. resource maps and frames: [`map_diff`] (how two maps of a type differ), [`compressed`]
//!    (zstd frames of shared pieces), [`payload`] (what a response carries), [`frames`] (the
//!    `Any` fields of responses and the buffers they are written into);
//! 2. snapshots: [`snapshot`], a proxy's configuration per type, with what changed since the
//!    snapshot it succeeded;
//! 3. the protocol, pure per-stream state ([`protocol`]): subscriptions, ACK/NACK, planning for
//!    state-of-the-world and incremental streams, the order of types, and the status a stream
//!    publishes;
//! 4. the codec: how each variant reads requests and writes responses ([`codec`]);
//! 5. the stream: [`pacing`], [`budget`] and the stream task ([`stream`]);
//! 6. the server: limits and the admission of a stream ([`server`]);
//! 7. the transport: the gRPC service, the listener and the HTTP/2 server ([`wire`]).
//!
//! The push side (`crate::push`) builds snapshots and reads the status streams publish: it
//! imports layers 1 to 4, and the stream and the server import its hub (where a stream
//! registers and gets its snapshots), never the other way round.

// 1. Resource maps and frames.
pub mod compressed;
pub mod frames;
pub mod map_diff;
pub mod payload;

// 2. Snapshots.
pub mod snapshot;

// 3. The protocol.
pub mod protocol;

// 4. The codec.
pub mod codec;

// 5. The stream.
pub mod budget;
pub mod pacing;
pub mod stream;

// 6. The server.
pub mod server;

// 7. The transport.
pub mod wire;

pub use server::{AdsLimits, AdsServer};
pub(crate) use wire::accepted;
