//! meshctl: the meshplane command line.
//!
//! Every command reads one model, [`state::MeshState`] (a cluster's objects through the API
//! server with the caller's credentials, or a directory of manifests), decoded by the
//! xds-server's own code, and builds a serializable report ([`output`]). The checks of
//! [`analyze`], the rendering of [`translate`] and [`describe`] are pure functions of that model;
//! only [`proxy_status`] and the proxy checks of `analyze` talk to the instances, through the
//! API server's `pods/proxy` subresource with the caller's credentials ([`instances`]); [`tag`]
//! writes MeshRevisionTags by server-side apply; [`proxy_config`] reads what a running proxy
//! holds from its Envoy admin, through the API server's `pods/portforward` ([`envoy_admin`]);
//! [`checks`] are `precheck` (before an install) and `verify-install` (after it).

pub mod analyze;
pub mod bug_report;
pub mod checks;
pub mod cli;
pub mod cluster;
pub mod describe;
pub mod envoy_admin;
pub mod instances;
pub mod output;
pub mod proxy_config;
pub mod proxy_status;
pub mod render;
pub mod state;
pub mod tag;
pub mod translate;
pub mod version;

pub use cli::run;

/// Logs to stderr: warnings by default, more with `-v` (`RUST_LOG` overrides).
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info,kube=warn",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
