//! Writes meshplane's CRDs to `config/crd/` (default) or checks that the committed files match.
//!
//! Usage: `crdgen [--check] [DIR]`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut check = false;
    let mut dir = PathBuf::from("config/crd");
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" => check = true,
            "-h" | "--help" => {
                println!("crdgen [--check] [DIR]: write (or with --check, compare) the CRDs in DIR (default config/crd)");
                return ExitCode::SUCCESS;
            }
            other => dir = PathBuf::from(other),
        }
    }
    let files = match meshplane_crds::crdgen::files() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("crdgen: cannot serialize CRDs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut drift = Vec::new();
    for (name, text) in &files {
        let path = dir.join(name);
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                drift.push(path.display().to_string());
            }
        } else if let Err(e) =
            std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, text))
        {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        } else {
            println!("wrote {}", path.display());
        }
    }
    if !drift.is_empty() {
        eprintln!(
            "crdgen: these CRDs differ from the Rust types; run `make crds` and commit:\n  {}",
            drift.join("\n  ")
        );
        return ExitCode::FAILURE;
    }
    if check {
        println!("crdgen: {} CRDs match the Rust types", files.len());
    }
    ExitCode::SUCCESS
}
