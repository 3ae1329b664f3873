//! meshplane operator: reconciles `MeshControlPlane` and `MeshRevisionTag` into isolated
//! per-tenant control-plane instances (see docs/architecture.md).
//!
//! - [`render`]: pure desired object set of one revision.
//! - [`apply`]: comparing desired with observed; server-side apply and pruning.
//! - [`tls`]: webhook CA and serving certificates, rotation (pure);
//!   [`admission_tls`]: the operator's own admission certificate shared by its replicas.
//! - [`ca`]: the tenant CA Secret (self-signed and rotated, or plugged in).
//! - [`status`]: pure status and conditions.
//! - [`controller`]: the kube-runtime controllers and their reconcile functions.
//! - [`migration`]: pure core of health-gated revision migration (batches, gates, steps).
//! - [`admission`]: the operator's own admission check of the meshplane API.
//! - [`leader`]: leader election on a Lease.
//! - [`metrics`], [`server`]: Prometheus metrics, health endpoints and HTTPS serving.

pub mod admission;
pub mod admission_tls;
pub mod apply;
pub mod ca;
pub mod controller;
pub mod gateway_api;
pub mod leader;
pub mod metrics;
pub mod migration;
pub mod render;
pub mod server;
pub mod status;
pub mod tls;
pub mod webhook_probe;
