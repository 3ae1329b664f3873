//! The command line: global flags (kubeconfig, context, output format, verbosity) and one
//! subcommand per task.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::analyze::{self, AnalyzeReport, CodeList, Severity};
use crate::bug_report::{self, BugReportArgs};
use crate::checks::precheck::{self, PrecheckArgs};
use crate::checks::verify_install::{self, VerifyInstallArgs};
use crate::cluster::{self, ClusterArgs, Scope};
use crate::describe::{self, DescribeCommand};
use crate::instances;
use crate::output::{self, Format};
use crate::proxy_config::{self, ProxyConfigCommand};
use crate::proxy_status::{self, ProxyStatusArgs};
use crate::state::MeshState;
use crate::tag::{self, TagCommand};
use crate::translate::{self, TranslateArgs};
use crate::version::{self, VersionArgs};

/// meshctl: operate meshplane's tenant meshes (proxy status across revisions, tags, analyze,
/// translate, describe). Reads the cluster with your kubeconfig's credentials, as kubectl does.
#[derive(Debug, Parser)]
#[command(name = "meshctl", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// More logging on stderr (-v, -vv).
    #[arg(short = 'v', long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every proxy of every revision (or one tenant): its sync state per type, NACKs, revision.
    ProxyStatus(ProxyStatusArgs),
    /// What a running proxy holds (clusters, listeners, routes, endpoints, secrets, bootstrap)
    /// and its log levels, from its Envoy admin through the API server's port-forward.
    ProxyConfig {
        #[command(subcommand)]
        command: ProxyConfigCommand,
    },
    /// List, set or remove revision tags.
    Tag {
        #[command(subcommand)]
        command: TagCommand,
    },
    /// Check a cluster, or a directory of manifests, for problems (stable codes, see --list-codes).
    Analyze(AnalyzeArgs),
    /// The Envoy configuration a workload would receive, offline from a directory of manifests.
    Translate(TranslateArgs),
    /// Before an install or upgrade: Kubernetes version, meshplane's CRDs, other meshes'
    /// injectors, the new revision's name, your permissions (stable codes, see --list-codes).
    Precheck(PrecheckArgs),
    /// After an install: what it should have created exists and works, check by check.
    VerifyInstall(VerifyInstallArgs),
    /// Show how the mesh sees an object.
    Describe {
        #[command(subcommand)]
        command: DescribeCommand,
    },
    /// One archive for a bug report: versions, control planes, config, findings, logs, and each
    /// proxy's config dump and stats; private keys and tokens removed, Secrets never read.
    BugReport(BugReportArgs),
    /// This client's version and the versions the cluster runs.
    Version(VersionArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion { shell: clap_complete::Shell },
}

/// When `analyze` exits non-zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    Error,
    Warning,
    Info,
    Never,
}

impl FailOn {
    pub fn threshold(self) -> Option<Severity> {
        match self {
            FailOn::Error => Some(Severity::Error),
            FailOn::Warning => Some(Severity::Warning),
            FailOn::Info => Some(Severity::Info),
            FailOn::Never => None,
        }
    }
}

/// `meshctl analyze`.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// Analyze a directory of manifests instead of the cluster.
    #[arg(short = 'f', long = "filename", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Exit with code 3 when a finding is at least this severe.
    #[arg(long, value_enum, default_value_t = FailOn::Error)]
    pub fail_on: FailOn,
    /// Print every analyzer code and exit.
    #[arg(long)]
    pub list_codes: bool,
}

/// Exit code of an analysis that found problems.
pub const EXIT_FINDINGS: u8 = 3;

async fn analyze_command(args: &AnalyzeArgs, cli: &Cli) -> anyhow::Result<ExitCode> {
    if args.list_codes {
        output::print(&CodeList(analyze::codes::ALL.to_vec()), cli.output)?;
        return Ok(ExitCode::SUCCESS);
    }
    let report = match &args.dir {
        Some(dir) => {
            let state = MeshState::from_dir(dir)?;
            AnalyzeReport {
                source: dir.display().to_string(),
                findings: analyze::analyze(&state),
                skipped: vec!["proxies (MP07xx): they need a cluster".to_string()],
            }
        }
        None => {
            let client = cli.cluster.client().await?;
            let state = cluster::read_state(&client, &Scope::All).await?;
            let mut findings = analyze::analyze(&state);
            let mut skipped = Vec::new();
            let filter = instances::Filter {
                debug_token: cli.cluster.debug_token.clone(),
                ..instances::Filter::default()
            };
            match instances::read(&client, &filter).await {
                Ok(read) => {
                    findings.extend(analyze::proxies::check(&state, &read));
                    for i in read.iter().filter(|i| i.error.is_some()) {
                        skipped.push(format!(
                            "proxies of instance {}/{} (revision {}): {}",
                            i.namespace,
                            i.pod,
                            i.revision,
                            i.error.as_deref().unwrap_or_default()
                        ));
                    }
                }
                Err(e) => skipped.push(format!("proxies (MP07xx): {e:#}")),
            }
            analyze::sort(&mut findings);
            AnalyzeReport {
                source: "the cluster".to_string(),
                findings,
                skipped,
            }
        }
    };
    output::print(&report, cli.output)?;
    Ok(if report.fails(args.fail_on.threshold()) {
        ExitCode::from(EXIT_FINDINGS)
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs the command `cli` names.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Analyze(args) => return analyze_command(args, &cli).await,
        Command::Precheck(args) => return precheck::run(args, &cli.cluster, cli.output).await,
        Command::VerifyInstall(args) => {
            return verify_install::run(args, &cli.cluster, cli.output).await
        }
        Command::ProxyStatus(args) => proxy_status::run(args, &cli.cluster, cli.output).await?,
        Command::ProxyConfig { command } => {
            return proxy_config::run(command, &cli.cluster, cli.output).await
        }
        Command::Tag { command } => tag::run(command, &cli.cluster, cli.output).await?,
        Command::Translate(args) => translate::run(args, cli.output)?,
        Command::Describe { command } => describe::run(command, &cli.cluster, cli.output).await?,
        Command::BugReport(args) => bug_report::run(args, &cli.cluster, cli.output).await?,
        Command::Version(args) => version::run(args, &cli.cluster, cli.output).await?,
        Command::Completion { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(*shell, &mut command, "meshctl", &mut std::io::stdout());
        }
    }
    Ok(ExitCode::SUCCESS)
}
