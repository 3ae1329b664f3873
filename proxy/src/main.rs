//! `meshplane-proxy`: writes the final Envoy bootstrap and execs Envoy, or, as
//! `meshplane-proxy capture`, programs the pod's traffic capture (see the library docs).

use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{CommandFactory, Parser};
use meshplane_ca::sds::SDS_METADATA;
use meshplane_proxy::capture::{self, Family};
use meshplane_proxy::cli::{
    CaptureArgs, Cli, Command as Sub, Ipv6Mode, LaunchArgs, LOOPBACK_ADDR_ENV,
};
use meshplane_proxy::{
    agent, build_bootstrap, route_through_agent, AgentSockets, BootstrapError, BootstrapOptions,
};

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
    if launch_args.root_cert.is_some() {
        return run_agent(launch_args);
    }
    if launch_args.grpc_xds_socket.is_some() {
        tracing::error!("meshplane-proxy: --grpc-xds-socket needs the node agent (--root-cert)");
        return ExitCode::FAILURE;
    }
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

/// Node agent mode: the bootstrap routes ADS and SDS through the agent's sockets, and the agent
/// runs with Envoy as its child.
fn run_agent(cli: LaunchArgs) -> ExitCode {
    let config = match prepare_agent(&cli) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("meshplane-proxy: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("meshplane-proxy: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(agent::run(config)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            tracing::error!("meshplane-proxy: {e}");
            ExitCode::FAILURE
        }
    }
}

fn prepare_agent(cli: &LaunchArgs) -> Result<agent::AgentConfig, LaunchError> {
    let input = read(&cli.bootstrap)?;
    let mut metadata: std::collections::BTreeMap<String, String> =
        cli.meta.iter().cloned().collect();
    // Contract 7: this proxy has the workload certificate and trust bundle over SDS, so the
    // instance may give it mutual TLS listeners and clusters.
    metadata.insert(SDS_METADATA.into(), "true".into());
    let opts = BootstrapOptions {
        node_id: cli.node_id.clone(),
        cluster: cli.cluster.clone(),
        metadata,
        // The agent adds the token upstream; Envoy's side of ADS stays in the pod.
        token: None,
        loopback_addr: loopback_addr()?,
    };
    let mut bootstrap =
        build_bootstrap(&input, &opts).map_err(|source| LaunchError::Bootstrap {
            path: cli.bootstrap.clone(),
            source,
        })?;
    let sockets = AgentSockets::default();
    let upstream =
        route_through_agent(&mut bootstrap, &sockets).map_err(|source| LaunchError::Bootstrap {
            path: cli.bootstrap.clone(),
            source,
        })?;
    let text = serde_json::to_string_pretty(&bootstrap).map_err(LaunchError::Serialize)?;
    std::fs::write(&cli.out, text).map_err(|source| LaunchError::Write {
        path: cli.out.clone(),
        source,
    })?;
    let run_dir = match &cli.run_dir {
        Some(d) => d.clone(),
        None => cli
            .out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    // Envoy runs in `run_dir`: give it the bootstrap by an absolute path.
    let config = std::path::absolute(&cli.out).map_err(|source| LaunchError::Read {
        path: cli.out.clone(),
        source,
    })?;
    tracing::info!(target = %upstream.target, server_name = %upstream.server_name, "node agent: ADS and certificates over TLS");
    Ok(agent::AgentConfig {
        instance: agent::Instance {
            upstream,
            root_cert: cli.root_cert.clone().unwrap_or_default(),
            token_file: cli.token_file.clone(),
        },
        run_dir,
        sockets,
        grpc_xds_socket: cli.grpc_xds_socket.clone(),
        cert_ttl: std::time::Duration::from_secs(cli.cert_ttl_seconds),
        envoy: agent::envoy::EnvoyCommand {
            bin: cli.envoy_bin(),
            config,
            extra_args: cli.envoy_args(),
        },
    })
}

fn loopback_addr() -> Result<Option<IpAddr>, LaunchError> {
    match std::env::var(LOOPBACK_ADDR_ENV) {
        Ok(value) => value
            .parse::<IpAddr>()
            .map(Some)
            .map_err(|_| LaunchError::LoopbackAddr { value }),
        Err(_) => Ok(None),
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
        .args(cli.envoy_args())
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
    let loopback_addr = loopback_addr()?;
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
