//! From source events to proxies, in four parts:
//!
//! - the seam to the tenant's state ([`ConfigGenerator`], [`Change`]), which is the core's
//!   (`meshplane_xds_core::generator`);
//! - [`hub`]: the registry of connected proxies, readiness and admission facts, shared (by
//!   `Arc`) with the ADS streams and the admin endpoints; it never holds the generator;
//! - [`push_loop`]: the one task that owns the generator, folds source events, debounces, renders
//!   and fans snapshots out to the proxies' `watch` channels;
//! - [`status`]: the per-proxy sync state the debug endpoints show.
//!
//! Rendering happens only in the push loop, so no lock a stream needs is held while a config is
//! rendered: a new stream registers with the hub and gets its first snapshot from the loop.
//! Sources never see the hub: they send [`crate::model::SourceEvent::Ready`] once their initial
//! state is delivered.

pub mod hub;
pub mod push_loop;
pub mod status;

pub use hub::{Hub, ProxyHandle};
pub use meshplane_xds_core::generator::{Change, ChangeKind, ConfigGenerator};
pub use push_loop::{run_push_loop, DebounceConfig, Debouncer, Pusher};
pub use status::{ProxyStatus, TypeStatus};
