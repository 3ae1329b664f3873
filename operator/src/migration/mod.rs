//! The pure core of health-gated revision migration (`MeshRevisionMigration`,
//! docs/migration.md): batches, the proxies' statistics and sync state, the gates, and the
//! step function that turns a status and an observation into the next status and writes.
//! The controller (`controller::migration`) only gathers and writes.
//!
//! - [`batches`]: which namespaces go together.
//! - [`workloads`]: Deployments, StatefulSets and DaemonSets as the gates see them.
//! - [`stats`]: a proxy's inbound request statistics from `/stats/prometheus`.
//! - [`proxies`]: an instance's `/debug/proxies`.
//! - [`gates`]: the health gates of one batch.
//! - [`step`]: one step of a migration.

pub mod batches;
pub mod gates;
pub mod proxies;
pub mod stats;
pub mod step;
pub mod workloads;

#[cfg(test)]
mod tests;
