//! `meshplane-proxy`: writes the final Envoy bootstrap and execs Envoy, or, as
//! `meshplane-proxy capture`, programs the pod's traffic capture (see the library docs).

use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{CommandFactory, Parser};
use meshplane_proxy::capture::{self, Family};
use meshplane_proxy::cli::{
    CaptureArgs, Cli, Command as Sub, Ipv6Mode, LaunchArgs, LOOPBACK_ADDR_ENV,
};
use meshplane_proxy::{build_bootstrap, BootstrapError, BootstrapOptions};

#[derive(Debug, thiserror::Error)]
enum LaunchError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{LOOPBACK_ADDR_ENV}={value:?} is not an IP address")]
    LoopbackAddr { value: String },
    #[error("building the bootstrap from {path}: {source}")]
    Bootstrap {
        path: PathBuf,
        source: BootstrapError,
    },
    #[error("serializing the bootstrap: {0}")]
    Serialize(serde_json::Error),
    #[error("exec {bin}: {source}")]
    Exec {
        bin: PathBuf,
        source: std::io::Error,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let cli = Cli::parse();
    let launch_args = match (cli.command, cli.launch) {
        (Some(Sub::Capture(args)), _) => return run_capture(&args),
        (None, Some(args)) => args,
        (None, None) => Cli::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "give the launcher's --bootstrap, --node-id and --cluster, or a subcommand (capture)",
            )
            .exit(),
    };
    // `launch` only returns on failure: on success the process is Envoy.
    let err = launch(launch_args);
    tracing::error!("meshplane-proxy: {err}");
    ExitCode::FAILURE
}

/// `meshplane-proxy capture`: prints what it applied (the init container's log shows it).
fn run_capture(args: &CaptureArgs) -> ExitCode {
    let plan = args.plan();
    let mut families = vec![Family::V4];
    let if_inet6 = std::fs::read_to_string("/proc/net/if_inet6");
    match (args.ipv6, &if_inet6) {
        (Ipv6Mode::Capture, Ok(_)) => families.push(Family::V6),
        (Ipv6Mode::Capture, Err(_)) => {
            tracing::info!("IPv6 is disabled in this network namespace: only IPv4 is captured");
        }
        (Ipv6Mode::Off, Ok(text)) if capture::has_global_ipv6(text) => tracing::warn!(
            "the pod has an IPv6 address and IPv6 capture is off: its IPv6 traffic bypasses the proxy"
        ),
        (Ipv6Mode::Off, _) => {}
    }
    if args.dry_run {
        for family in families {
            print!("{}", capture::restore_input(&plan, family, &[]));
        }
        return ExitCode::SUCCESS;
    }
    match capture::apply(&plan, &families) {
        Ok(applied) => {
            for a in applied {
                tracing::info!(
                    table = a.family.command_prefix(),
                    replaced_jumps = a.replaced_jumps,
                    "capture rules applied"
                );
                print!("{}", a.table);
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            tracing::error!("meshplane-proxy capture: {err}");
            ExitCode::FAILURE
        }
    }
}

fn launch(cli: LaunchArgs) -> LaunchError {
    match prepare(&cli) {
        Ok(()) => {}
        Err(e) => return e,
    }
    let envoy_bin = cli.envoy_bin();
    tracing::info!(envoy = %envoy_bin.display(), out = %cli.out.display(), "starting Envoy");
    let source = Command::new(&envoy_bin)
        .arg("-c")
        .arg(&cli.out)
        .arg("--disable-hot-restart")
        .args(&cli.envoy_args)
        .exec();
    LaunchError::Exec {
        bin: envoy_bin,
        source,
    }
}

fn prepare(cli: &LaunchArgs) -> Result<(), LaunchError> {
    let input = read(&cli.bootstrap)?;
    let token = match &cli.token_file {
        Some(path) if path.exists() => Some(read(path)?),
        Some(path) => {
            tracing::warn!(path = %path.display(), "token file absent: ADS stream carries no token");
            None
        }
        None => None,
    };
    let loopback_addr = match std::env::var(LOOPBACK_ADDR_ENV) {
        Ok(value) => Some(
            value
                .parse::<IpAddr>()
                .map_err(|_| LaunchError::LoopbackAddr {
                    value: value.clone(),
                })?,
        ),
        Err(_) => None,
    };
    let opts = BootstrapOptions {
        node_id: cli.node_id.clone(),
        cluster: cli.cluster.clone(),
        metadata: cli.meta.iter().cloned().collect(),
        token,
        loopback_addr,
    };
    let bootstrap = build_bootstrap(&input, &opts).map_err(|source| LaunchError::Bootstrap {
        path: cli.bootstrap.clone(),
        source,
    })?;
    // JSON is valid YAML, so Envoy reads it from a `.yaml` path as well.
    let text = serde_json::to_string_pretty(&bootstrap).map_err(LaunchError::Serialize)?;
    std::fs::write(&cli.out, text).map_err(|source| LaunchError::Write {
        path: cli.out.clone(),
        source,
    })
}

fn read(path: &Path) -> Result<String, LaunchError> {
    std::fs::read_to_string(path).map_err(|source| LaunchError::Read {
        path: path.to_owned(),
        source,
    })
}
