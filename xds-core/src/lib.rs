//! The pure core of a meshplane tenant instance: what the xds-server computes, without the
//! I/O around it.
//!
//! - [`kinds`]: the kinds of object the instance reads, declared once (one table generates
//!   [`model::Kind`], [`model::Object`], their validation and typed dispatch);
//! - [`model`]: the objects sources deliver, the proxies, the encoded resources;
//! - [`translate`] and [`envoyfilter`]: a proxy's Envoy configuration from the tenant's
//!   registry, EnvoyFilters applied;
//! - [`index`]: the tenant's state folded from source events, and the rendered-config cache;
//! - [`outputs`]: what the index publishes besides configurations (members, verdicts, the
//!   EnvoyFilter policy, credential names), on watch channels;
//! - [`generator`]: the seam the push loop drives ([`generator::ConfigGenerator`],
//!   [`generator::Change`]);
//! - [`config_events`]: findings about config objects the instance cannot use, deduplicated;
//! - [`credentials`]: what the index asks about gateway credentials;
//! - [`manifest`]: YAML manifests decoded into objects, as the directory source reads them;
//! - [`hash`]: content hashes used as resource and set versions;
//! - [`bounds`]: size limits on what clients send.
//!
//! No I/O, no async runtime (`tokio::sync` channels only), no Kubernetes client, nothing from the wire: the xds-server
//! (sources, push loop, ADS) and meshctl build on it.

pub mod bounds;
pub mod config_events;
pub mod credentials;
pub mod envoyfilter;
pub mod generator;
pub mod hash;
pub mod index;
pub mod kinds;
pub mod manifest;
pub mod model;
pub mod outputs;
/// Choices for the property tests here and in the xds-server (not part of product builds).
#[cfg(any(test, feature = "testing"))]
pub mod test_choices;
/// Builders the tests here and in the xds-server share (not part of product builds).
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod translate;
