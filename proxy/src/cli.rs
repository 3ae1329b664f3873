//! Command line of `meshplane-proxy`, as rendered by the injector: the launcher (contract 7)
//! and the `capture` subcommand of the capture init container.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ipnet::IpNet;
use meshplane_crds::capture::{
    flags, parse_port_selection, parse_ports, parse_range_selection, parse_ranges, CaptureScope,
    PortSelection, RangeSelection,
};
use meshplane_crds::names::ports;

use crate::capture::CapturePlan;

/// Where the final bootstrap goes by default: the pod's `emptyDir` (the root filesystem is
/// read-only).
pub const DEFAULT_OUT: &str = "/var/run/meshplane/envoy.yaml";

/// Environment variable naming the pod's own loopback address in the local test pod runner.
pub const LOOPBACK_ADDR_ENV: &str = "MESHPLANE_LOOPBACK_ADDR";

/// Without a subcommand: builds the final Envoy bootstrap and execs Envoy on it.
#[derive(Debug, Parser)]
#[command(
    name = "meshplane-proxy",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub launch: Option<LaunchArgs>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Programs the pod's netfilter rules so that its TCP traffic goes through the proxy
    /// (the capture init container).
    Capture(CaptureArgs),
}

/// The launcher's arguments.
#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// The bootstrap ConfigMap's `envoy.yaml`.
    #[arg(long)]
    pub bootstrap: PathBuf,
    /// Projected ServiceAccount token; sent on the ADS stream when the file exists.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The bootstrap ConfigMap's `root-cert.pem` (the tenant's trust bundle). Given, the
    /// launcher runs the node agent beside Envoy: workload certificate over SDS, ADS carried
    /// to the instance over TLS with the token re-read at every connect. Absent, Envoy talks to
    /// the instance directly as the bootstrap says (plaintext development setups).
    #[arg(long)]
    pub root_cert: Option<PathBuf>,
    /// Directory of the agent's sockets and Envoy's working directory (default: the directory
    /// of `--out`).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Lifetime of the workload certificate to ask for, in seconds; 0 asks for the instance's
    /// default (24 hours).
    #[arg(long, default_value_t = 0)]
    pub cert_ttl_seconds: u64,
    /// Envoy node id.
    #[arg(long)]
    pub node_id: String,
    /// Envoy node cluster (the workload's service cluster).
    #[arg(long)]
    pub cluster: String,
    /// Also serve ADS to the pod's proxyless gRPC clients on this abstract Unix socket (in the
    /// pod's network namespace; contract 13), carried to the instance like Envoy's. Needs
    /// `--root-cert` (the node agent).
    #[arg(long = "grpc-xds-socket")]
    pub grpc_xds_socket: Option<String>,
    /// Node metadata entry `KEY=VALUE`; repeatable.
    #[arg(long = "meta", value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
    /// Where the final bootstrap is written.
    #[arg(long, default_value = DEFAULT_OUT)]
    pub out: PathBuf,
    /// Envoy binary (a path, or a name looked up on PATH); default `$ENVOY_BIN`, else `envoy`.
    // Not clap's `env =`: a value from the environment would count as a launcher argument
    // given, and make `capture` (which runs with the image's ENVOY_BIN set) ask for --bootstrap.
    #[arg(long)]
    pub envoy_bin: Option<PathBuf>,
    /// Extra Envoy arguments, after `--`.
    #[arg(last = true)]
    pub envoy_args: Vec<String>,
}

/// Environment variable naming the Envoy binary when `--envoy-bin` is not given.
pub const ENVOY_BIN_ENV: &str = "ENVOY_BIN";

impl LaunchArgs {
    /// `--envoy-bin`, else `$ENVOY_BIN`, else `envoy` on PATH.
    pub fn envoy_bin(&self) -> PathBuf {
        self.envoy_bin
            .clone()
            .or_else(|| std::env::var_os(ENVOY_BIN_ENV).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("envoy"))
    }

    /// The arguments Envoy runs with after `-c`: the extra arguments, then each of
    /// [`DRAIN_DEFAULTS`] the extra arguments do not set themselves.
    pub fn envoy_args(&self) -> Vec<String> {
        let mut args = self.envoy_args.clone();
        for (flag, value) in DRAIN_DEFAULTS {
            let set = self
                .envoy_args
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
            if !set {
                args.extend([flag.to_owned(), value.to_owned()]);
            }
        }
        args
    }
}

/// How Envoy drains the connections of a filter chain that an LDS update replaced (a new
/// AuthorizationPolicy, PeerAuthentication or DestinationRule changes the inbound chains).
/// Those connections keep the old chain's config until they close, and Envoy's defaults
/// (`gradual` over 600 s) let a pooled connection from a client's sidecar serve a revoked
/// policy for minutes. `immediate` closes each one after the next request it serves
/// (`Connection: close`, or GOAWAY on HTTP/2): a connection idle in a client's pool at the
/// update still serves that one request under the old config, every later request is decided
/// by the new one; 45 s (Istio's drain duration) bounds how long a connection that sends
/// nothing more is kept.
pub const DRAIN_DEFAULTS: [(&str, &str); 2] =
    [("--drain-strategy", "immediate"), ("--drain-time-s", "45")];

/// What to do with the IPv6 table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Ipv6Mode {
    /// Leave ip6tables untouched (the proxy listens on IPv4 only).
    Off,
    /// Program the same rules into the IPv6 table.
    Capture,
}

/// Arguments of `meshplane-proxy capture`; the injector renders them from the pod's
/// annotations (`meshplane_crds::capture::init_container_args`).
#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// UID whose traffic is never captured (the proxy's).
    #[arg(long = flags::PROXY_UID, default_value_t = default_proxy_id())]
    pub proxy_uid: u32,
    /// GID whose traffic is never captured (the proxy's).
    #[arg(long = flags::PROXY_GID, default_value_t = default_proxy_id())]
    pub proxy_gid: u32,
    /// Port of the proxy's virtual outbound listener.
    #[arg(long = flags::OUTBOUND_PORT, default_value_t = ports::VIRTUAL_OUTBOUND)]
    pub outbound_port: u16,
    /// Port of the proxy's virtual inbound listener.
    #[arg(long = flags::INBOUND_PORT, default_value_t = ports::VIRTUAL_INBOUND)]
    pub inbound_port: u16,
    /// Inbound ports to capture: `*`, or a comma-separated list (empty: none).
    #[arg(long = flags::INCLUDE_INBOUND_PORTS, default_value = "*", value_parser = parse_port_selection)]
    pub include_inbound_ports: PortSelection,
    /// Inbound ports never captured.
    #[arg(long = flags::EXCLUDE_INBOUND_PORTS, default_value = "", value_parser = parse_ports)]
    pub exclude_inbound_ports: ::std::vec::Vec<u16>,
    /// Outbound ports captured whatever the destination address.
    #[arg(long = flags::INCLUDE_OUTBOUND_PORTS, default_value = "", value_parser = parse_ports)]
    pub include_outbound_ports: ::std::vec::Vec<u16>,
    /// Outbound ports never captured.
    #[arg(long = flags::EXCLUDE_OUTBOUND_PORTS, default_value = "", value_parser = parse_ports)]
    pub exclude_outbound_ports: ::std::vec::Vec<u16>,
    /// Outbound destinations to capture: `*`, or comma-separated CIDRs (empty: by port only).
    #[arg(long = flags::INCLUDE_OUTBOUND_IP_RANGES, default_value = "*", value_parser = parse_range_selection)]
    pub include_outbound_ip_ranges: RangeSelection,
    /// Outbound destinations never captured (CIDRs).
    #[arg(long = flags::EXCLUDE_OUTBOUND_IP_RANGES, default_value = "", value_parser = parse_ranges)]
    pub exclude_outbound_ip_ranges: ::std::vec::Vec<IpNet>,
    /// IPv6: `off` leaves ip6tables untouched; `capture` applies the same rules to IPv6.
    #[arg(long, value_enum, default_value_t = Ipv6Mode::Off)]
    pub ipv6: Ipv6Mode,
    /// Print the iptables-restore input and change nothing (needs no privilege).
    #[arg(long)]
    pub dry_run: bool,
}

fn default_proxy_id() -> u32 {
    CapturePlan::default().proxy_uid
}

impl CaptureArgs {
    /// The plan these arguments describe.
    pub fn plan(&self) -> CapturePlan {
        CapturePlan {
            proxy_uid: self.proxy_uid,
            proxy_gid: self.proxy_gid,
            outbound_port: self.outbound_port,
            inbound_port: self.inbound_port,
            scope: CaptureScope {
                include_inbound_ports: self.include_inbound_ports.clone(),
                exclude_inbound_ports: self.exclude_inbound_ports.clone(),
                include_outbound_ports: self.include_outbound_ports.clone(),
                exclude_outbound_ports: self.exclude_outbound_ports.clone(),
                include_outbound_ranges: self.include_outbound_ip_ranges.clone(),
                exclude_outbound_ranges: self.exclude_outbound_ip_ranges.clone(),
            },
        }
    }
}

/// Parses `KEY=VALUE`; the key must be non-empty, the value may be empty or contain `=`.
pub fn parse_meta(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("metadata entry {s:?} must have the form KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_injected_command_line() {
        let cli = launch([
            "meshplane-proxy",
            "--bootstrap",
            "/etc/meshplane/bootstrap/envoy.yaml",
            "--token-file",
            "/var/run/secrets/meshplane/tokens/meshplane-token",
            "--node-id",
            "sidecar~198.18.0.7~web-1.shop~shop.svc.cluster.local",
            "--meta",
            "NAMESPACE=shop",
            "--meta",
            "LABELS=a=b",
            "--cluster",
            "web",
            "--",
            "--mode",
            "validate",
        ]);
        assert_eq!(cli.out, PathBuf::from(DEFAULT_OUT));
        assert_eq!(
            cli.meta,
            vec![
                ("NAMESPACE".into(), "shop".into()),
                ("LABELS".into(), "a=b".into())
            ]
        );
        assert_eq!(cli.envoy_args, vec!["--mode", "validate"]);
    }

    #[test]
    fn envoy_drains_replaced_filter_chains_at_once_unless_told_otherwise() {
        let base = [
            "meshplane-proxy",
            "--bootstrap",
            "/b.yaml",
            "--node-id",
            "n",
            "--cluster",
            "c",
        ];
        let cli = launch(base);
        assert_eq!(
            cli.envoy_args(),
            vec!["--drain-strategy", "immediate", "--drain-time-s", "45"]
        );
        // Envoy refuses a flag given twice: a caller's own value replaces the default.
        let cli = launch([
            base[0],
            base[1],
            base[2],
            base[3],
            base[4],
            base[5],
            base[6],
            "--",
            "--drain-time-s=5",
            "--drain-strategy",
            "gradual",
        ]);
        assert_eq!(
            cli.envoy_args(),
            vec!["--drain-time-s=5", "--drain-strategy", "gradual"]
        );
    }

    fn launch<const N: usize>(args: [&str; N]) -> LaunchArgs {
        let cli = Cli::try_parse_from(args).unwrap();
        assert!(cli.command.is_none());
        cli.launch.expect("launcher arguments")
    }

    fn capture(args: &[String]) -> CaptureArgs {
        let argv = ["meshplane-proxy".to_owned(), "capture".to_owned()]
            .into_iter()
            .chain(args.iter().cloned());
        match Cli::try_parse_from(argv).unwrap().command {
            Some(Command::Capture(c)) => c,
            None => panic!("expected the capture subcommand"),
        }
    }

    #[test]
    fn capture_defaults_are_the_injected_proxy_and_capture_everything() {
        let args = capture(&[]);
        assert_eq!(args.plan(), CapturePlan::default());
        assert_eq!(args.ipv6, Ipv6Mode::Off);
        assert!(!args.dry_run);
    }

    #[test]
    fn the_injectors_capture_arguments_parse_back_to_the_annotated_scope() {
        use meshplane_crds::capture::init_container_args;
        let scopes = [
            CaptureScope::default(),
            CaptureScope {
                include_inbound_ports: PortSelection::Only(vec![]),
                exclude_inbound_ports: vec![8081, 9090],
                include_outbound_ports: vec![443],
                exclude_outbound_ports: vec![3306],
                include_outbound_ranges: RangeSelection::Only(vec![]),
                exclude_outbound_ranges: vec![
                    "198.18.4.0/24".parse().unwrap(),
                    "2001:db8::/32".parse().unwrap(),
                ],
            },
            CaptureScope {
                include_inbound_ports: PortSelection::Only(vec![8080]),
                include_outbound_ranges: RangeSelection::Only(vec!["198.18.0.0/15"
                    .parse()
                    .unwrap()]),
                ..CaptureScope::default()
            },
        ];
        for scope in scopes {
            let plan = capture(&init_container_args(&scope)).plan();
            assert_eq!(plan.scope, scope);
            assert_eq!(
                plan,
                CapturePlan {
                    scope: scope.clone(),
                    ..CapturePlan::default()
                }
            );
        }
    }

    #[test]
    fn capture_rejects_malformed_values_and_launcher_flags() {
        let bad = |args: &[&str]| {
            let argv = ["meshplane-proxy", "capture"]
                .into_iter()
                .chain(args.iter().copied());
            Cli::try_parse_from(argv).unwrap_err().to_string()
        };
        assert!(bad(&["--exclude-outbound-ip-ranges=198.18.0.0/40"]).contains("198.18.0.0/40"));
        assert!(bad(&["--include-inbound-ports=*,80"]).contains("cannot be combined"));
        assert!(bad(&["--bootstrap", "x"]).contains("--bootstrap"));
        assert!(Cli::try_parse_from(["meshplane-proxy", "--bootstrap", "b", "capture"]).is_err());
    }

    #[test]
    fn rejects_metadata_without_a_key() {
        assert!(parse_meta("=x").is_err());
        assert!(parse_meta("NOEQUALS").is_err());
        assert_eq!(parse_meta("K=").unwrap(), ("K".into(), String::new()));
    }
}
