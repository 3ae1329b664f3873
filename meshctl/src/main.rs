//! `meshctl`: the meshplane command line. Installed as `kubectl-meshplane` it is a kubectl
//! plugin (`kubectl meshplane proxy-status`). Exit codes: 0 success, 1 failure, 2 usage error,
//! 3 `analyze` found problems at or above `--fail-on`.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use meshctl::cli::Cli;

fn main() -> ExitCode {
    let plugin = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .is_some_and(|n| n.starts_with("kubectl-meshplane"));
    let mut command = Cli::command();
    if plugin {
        command = command.bin_name("kubectl meshplane");
    }
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    meshctl::init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("meshctl: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(meshctl::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("meshctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
