//! Admission webhooks of a meshplane instance (contracts 4 and 5 of `docs/architecture.md`).
//!
//! - [`inject`]: the pure sidecar-injection decision and JSON patch for a Pod;
//!   [`grpc_agent`]: what proxyless gRPC pods get besides (contract 13), which `inject` adds;
//!   [`downward`]: the pod's own name, namespace and address as env vars, which both give.
//! - [`validate`]: the pure validation of `ServiceEntry`, `EnvoyFilter` and `Sidecar`, shared
//!   semantic rules plus the tenant-boundary rules, against a [`tenant::TenantView`].
//! - [`review`]: the AdmissionReview v1 wire format.
//! - [`handlers`]: [`Webhooks`], request body in, response body out.
//! - [`metrics`]: requests by outcome, denials by reason, latency, and injected or skipped
//!   pods, for the instance's webhooks and the operator's check.
//! - [`tls`]: the serving certificate, reloaded when the mounted Secret changes.
//! - [`client_auth`]: when the API server's admission client CA is configured, only callers
//!   with its certificate reach `/inject` and `/validate` (and the operator's check).
//! - [`server`]: the routes `/inject`, `/validate` and `/healthz`, served by [`https`], the
//!   accept loop the operator's own admission check uses too.
//!
//! `docs/webhooks.md` explains the failure policy and the tenant-boundary rules.

pub mod client_auth;
pub mod downward;
pub mod grpc_agent;
pub mod handlers;
pub mod https;
pub mod inject;
pub mod metrics;
pub mod review;
pub mod server;
pub mod tenant;
pub mod tls;
pub mod validate;

pub use handlers::{Reply, Webhooks};
pub use server::{serve, serve_on, serve_with, ServeError};
pub use tenant::{StaticTenant, TenantView};
