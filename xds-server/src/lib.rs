//! meshplane xds-server: one revision of one tenant, serving Envoy over ADS.

pub use meshplane_xds_core::{
    bounds, envoyfilter, generator, hash, index, kinds, manifest, model, outputs, translate,
};

pub mod admin;
pub mod ads;
pub mod cli;
pub mod credential_access;
pub mod identity;
pub mod jwks;
pub mod log_budget;
pub mod logging;
pub mod metrics;
pub mod push;
pub mod report;
pub mod shared_members;
pub mod source_dir;
pub mod source_kube;
pub mod tenancy;
mod timer;
pub mod tokens;
