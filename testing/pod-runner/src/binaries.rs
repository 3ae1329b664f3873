//! Which local program runs a container, chosen by its image.
//!
//! meshplane's own images map to the binaries built from this workspace (the image's
//! `/usr/local/bin/<binary>` or its entrypoint is the workspace binary; any other command of
//! the image, e.g. `/bin/sh` or `iptables-restore`, is the host's program of that name, as if
//! the image's filesystem were the host's); any other image is an application and runs as the
//! built-in echo server.

use std::path::{Path, PathBuf};

use super::error::PodRunnerError;

pub const XDS_BINARY: &str = "meshplane-xds";
pub const OPERATOR_BINARY: &str = "meshplane-operator";
pub const PROXY_BINARY: &str = "meshplane-proxy";

/// What a container runs locally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// One of meshplane's binaries (by file name).
    Binary(&'static str),
    /// The built-in echo HTTP server, for application images (their command instead, when they
    /// have one and the host has its program).
    Echo,
}

/// The program for an image: `<registry>/<repo>/xds-server:<tag>` → `meshplane-xds`, and so on.
pub fn program_for_image(image: &str) -> Program {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let repository = last.split(':').next().unwrap_or(last);
    match repository {
        "xds-server" => Program::Binary(XDS_BINARY),
        "operator" => Program::Binary(OPERATOR_BINARY),
        "proxy" => Program::Binary(PROXY_BINARY),
        _ => Program::Echo,
    }
}

/// Where the workspace binaries are: `MESHPLANE_BIN_DIR`, else `$CARGO_TARGET_DIR/debug`, else
/// the workspace's `target/debug`.
pub fn default_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MESHPLANE_BIN_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        let dir = PathBuf::from(dir);
        let dir = if dir.is_relative() {
            workspace_root().join(dir)
        } else {
            dir
        };
        return dir.join("debug");
    }
    workspace_root().join("target").join("debug")
}

/// The cargo workspace this crate belongs to (it lives at `testing/pod-runner`).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest_dir.to_path_buf())
}

/// The path of binary `name` in `bin_dir`, or an error that says how to build it.
pub fn locate_binary(bin_dir: &Path, name: &str) -> Result<PathBuf, PodRunnerError> {
    let path = bin_dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(PodRunnerError::MissingBinary {
            name: name.to_string(),
            path,
            hint: "build it with `cargo build -p meshplane-operator -p meshplane-xds -p meshplane-proxy --bins` \
                   or point MESHPLANE_BIN_DIR at the directory that holds it"
                .to_string(),
        })
    }
}

/// The host program for `command`: an absolute path that exists, or a name found on `PATH`.
pub fn host_program(command: &str) -> Option<PathBuf> {
    let path = Path::new(command);
    if path.is_absolute() {
        return path.is_file().then(|| path.to_path_buf());
    }
    if command.contains('/') {
        return None;
    }
    let search = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&search)
        .map(|dir| dir.join(command))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meshplane_images_map_to_binaries_and_others_to_echo() {
        assert_eq!(
            program_for_image("ghcr.io/meshplane/xds-server:0.1.0"),
            Program::Binary(XDS_BINARY)
        );
        assert_eq!(
            program_for_image("ghcr.io/meshplane/operator:0.1.0"),
            Program::Binary(OPERATOR_BINARY)
        );
        assert_eq!(
            program_for_image("localhost:5000/meshplane/proxy@sha256:abc"),
            Program::Binary(PROXY_BINARY)
        );
        assert_eq!(program_for_image("nginx:1.27"), Program::Echo);
        assert_eq!(
            program_for_image("example.com/proxy-cache:1"),
            Program::Echo
        );
    }
}
