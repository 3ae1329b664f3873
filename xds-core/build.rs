//! Finds the descriptor set that envoy-types ships (`src/generated/types.bin` in its crate
//! source) and hands its path to the crate as `ENVOY_TYPES_DESCRIPTOR_SET`, so that
//! `translate::protojson` can embed it with `include_bytes!`. The path comes from
//! `cargo metadata` (the resolved envoy-types package of this workspace, wherever cargo keeps
//! it: registry cache, vendor directory or a path override), never from a guessed location.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../Cargo.lock");
    let path = match descriptor_set() {
        Ok(path) => path,
        Err(e) => panic!("cannot locate the envoy-types descriptor set: {e}"),
    };
    println!("cargo:rerun-if-changed={}", path.display());
    println!(
        "cargo:rustc-env=ENVOY_TYPES_DESCRIPTOR_SET={}",
        path.display()
    );
}

fn descriptor_set() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").map_err(|e| format!("CARGO is not set: {e}"))?;
    let target = std::env::var("TARGET").map_err(|e| format!("TARGET is not set: {e}"))?;
    let manifest = std::env::var("CARGO_MANIFEST_DIR")
        .map_err(|e| format!("CARGO_MANIFEST_DIR is not set: {e}"))?;
    // Only the packages of the platform being built, and from what is downloaded already when
    // that suffices: a clean machine has none of the lock's packages for other platforms
    // (android_system_properties, ...), and a `cargo build --bins` may not have fetched the
    // workspace's dev-dependencies, which metadata resolves too; then ask the registry.
    let metadata = |offline: bool| {
        let mut cmd = Command::new(&cargo);
        cmd.args([
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            &target,
        ]);
        if offline {
            cmd.arg("--offline");
        }
        cmd.arg("--manifest-path")
            .arg(PathBuf::from(&manifest).join("Cargo.toml"))
            .output()
            .map_err(|e| format!("running cargo metadata: {e}"))
    };
    let mut out = metadata(true)?;
    if !out.status.success() {
        out = metadata(false)?;
    }
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("cargo metadata printed no JSON: {e}"))?;
    let packages = meta["packages"]
        .as_array()
        .ok_or("cargo metadata lists no packages")?;
    let manifest_path = packages
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("envoy-types is not among the resolved packages")?;
    let dir = PathBuf::from(manifest_path)
        .parent()
        .map(PathBuf::from)
        .ok_or("envoy-types' manifest path has no parent")?;
    let path = dir.join("src").join("generated").join("types.bin");
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} does not exist", path.display()))
    }
}
