//! The kube-runtime controllers: one for `MeshControlPlane`, one for `MeshRevisionTag`, one for
//! `MeshRevisionMigration`, sharing one [`Context`] (docs/architecture.md, "From `kubectl
//! apply` to an Envoy", item 3).
//!
//! The control-plane controller writes, per revision, the members ConfigMap (contract 2), the
//! empty proxies ConfigMap whose keys it sums into `status.connectedProxies` (contract 3), the
//! webhook TLS Secret (contract 4) and the webhooks on its paths (contract 5), the bootstrap
//! ConfigMaps (contract 6) and the tenant CA (contract 11), all under the ownership labels
//! (contract 8), which are also what its watches of owned objects select.
//!
//! - `wiring`: the builder chain of the controllers ([`run`]): which watch triggers what.
//! - [`triggers`]: the mappers from a watch event to the objects to reconcile.
//! - `access`: triggers from the kinds the operator reads only per namespace.
//! - `watches`: one watch per kind, shared by the controllers' triggers and the caches.
//! - `caches`: the reflector stores membership is computed from, and [`Snapshot`].
//! - `backoff`: per-object retry delays and per-watch (not shared) trigger backoff.
//! - `context`, `settings`, `error`: what reconciles share, their tunables, their errors;
//!   Events go through `meshplane_events::EventRecorder`, one per occurrence.
//! - `controlplane`, `tag`, `migration`: the reconcile functions; `controlplane::plan` is the
//!   control-plane reconcile's pure core (what to write, which Events, the status).

mod access;
mod backoff;
mod caches;
mod context;
mod controlplane;
mod error;
mod migration;
mod settings;
mod tag;
pub mod triggers;
mod watches;
mod wiring;

pub use crate::metrics::{CONTROL_PLANE_CONTROLLER, MIGRATION_CONTROLLER, TAG_CONTROLLER};
pub use caches::{snapshot, ClusterCaches, Snapshot};
pub use context::{Clock, Context};
pub use controlplane::reconcile_control_plane;
pub use error::Error;
pub use migration::reconcile_migration;
pub use settings::Settings;
pub use tag::reconcile_tag;
pub use wiring::run;
