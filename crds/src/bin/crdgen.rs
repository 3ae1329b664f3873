//! Writes meshplane's CRDs to `config/crd/` (default) and the API reference page rendered from
//! them (`docs/guide/api-reference.md`), or checks that the committed files match.
//!
//! Usage: `crdgen [--check] [--api-reference FILE] [DIR]`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut check = false;
    let mut dir = PathBuf::from("config/crd");
    let mut reference = PathBuf::from(meshplane_crds::api_reference::PATH);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--check" => check = true,
            "--api-reference" => match args.next() {
                Some(path) => reference = PathBuf::from(path),
                None => {
                    eprintln!("crdgen: --api-reference needs a file");
                    return ExitCode::FAILURE;
                }
            },
            "-h" | "--help" => {
                println!("crdgen [--check] [--api-reference FILE] [DIR]: write (or with --check, compare) the CRDs in DIR (default config/crd) and the API reference page rendered from them (default {})", meshplane_crds::api_reference::PATH);
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
    let page = meshplane_crds::api_reference::render(&meshplane_crds::crdgen::all());
    let mut outputs: Vec<(PathBuf, &str)> = files
        .iter()
        .map(|(name, text)| (dir.join(name), text.as_str()))
        .collect();
    outputs.push((reference, &page));
    let mut drift = Vec::new();
    for (path, text) in &outputs {
        let text = *text;
        if check {
            if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
                drift.push(path.display().to_string());
            }
        } else if let Err(e) = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| std::fs::write(path, text))
        {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        } else {
            println!("wrote {}", path.display());
        }
    }
    if !drift.is_empty() {
        eprintln!(
            "crdgen: these files differ from the Rust types (CRDs and the API reference rendered from them); run `make crds` and commit them:\n  {}",
            drift.join("\n  ")
        );
        return ExitCode::FAILURE;
    }
    if check {
        println!(
            "crdgen: {} CRDs and the API reference match the Rust types",
            files.len()
        );
    }
    ExitCode::SUCCESS
}
