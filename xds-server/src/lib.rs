//! meshplane xds-server: one revision of one tenant, serving Envoy over ADS.

pub mod admin;
pub mod ads;
pub mod bounds;
pub mod cli;
pub mod config_events;
pub mod config_status;
pub mod credential_access;
pub mod envoyfilter;
pub mod identity;
pub mod index;
pub mod kinds;
pub mod log_budget;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod push;
pub mod shared_members;
pub mod source_dir;
pub mod source_kube;
pub mod tenancy;
#[cfg(test)]
mod test_rng;
mod timer;
pub mod tokens;
pub mod translate;
