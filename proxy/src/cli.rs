//! Command line of `meshplane-proxy`, as rendered by the injector (contract 7).

use std::path::PathBuf;

use clap::Parser;

/// Where the final bootstrap goes by default: the pod's `emptyDir` (the root filesystem is
/// read-only).
pub const DEFAULT_OUT: &str = "/var/run/meshplane/envoy.yaml";

/// Environment variable naming the pod's own loopback address in the local test pod runner.
pub const LOOPBACK_ADDR_ENV: &str = "MESHPLANE_LOOPBACK_ADDR";

/// Builds the final Envoy bootstrap and execs Envoy on it.
#[derive(Debug, Parser)]
#[command(name = "meshplane-proxy", version)]
pub struct Cli {
    /// The bootstrap ConfigMap's `envoy.yaml`.
    #[arg(long)]
    pub bootstrap: PathBuf,
    /// Projected ServiceAccount token; sent on the ADS stream when the file exists.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Envoy node id.
    #[arg(long)]
    pub node_id: String,
    /// Envoy node cluster (the workload's service cluster).
    #[arg(long)]
    pub cluster: String,
    /// Node metadata entry `KEY=VALUE`; repeatable.
    #[arg(long = "meta", value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
    /// Where the final bootstrap is written.
    #[arg(long, default_value = DEFAULT_OUT)]
    pub out: PathBuf,
    /// Envoy binary (a path, or a name looked up on PATH).
    #[arg(long, env = "ENVOY_BIN", default_value = "envoy")]
    pub envoy_bin: PathBuf,
    /// Extra Envoy arguments, after `--`.
    #[arg(last = true)]
    pub envoy_args: Vec<String>,
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
        let cli = Cli::try_parse_from([
            "meshplane-proxy",
            "--bootstrap",
            "/etc/meshplane/bootstrap/envoy.yaml",
            "--token-file",
            "/var/run/secrets/meshplane/tokens/meshplane-token",
            "--node-id",
            "sidecar~10.0.0.7~web-1.shop~shop.svc.cluster.local",
            "--meta",
            "NAMESPACE=shop",
            "--meta",
            "LABELS=a=b",
            "--cluster",
            "web",
            "--",
            "--mode",
            "validate",
        ])
        .unwrap();
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
    fn rejects_metadata_without_a_key() {
        assert!(parse_meta("=x").is_err());
        assert!(parse_meta("NOEQUALS").is_err());
        assert_eq!(parse_meta("K=").unwrap(), ("K".into(), String::new()));
    }
}
