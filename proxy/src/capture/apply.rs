//! The thin I/O half of capture: checks what the command needs, reads the current `nat` table,
//! applies [`rules::restore_input`] with `iptables-restore --noflush` and reads it back.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::rules::{self, CapturePlan, Family};

/// Bit of `CAP_NET_ADMIN` in the capability sets of `/proc/self/status`.
const CAP_NET_ADMIN: u32 = 12;
/// Bit of `CAP_NET_RAW`.
const CAP_NET_RAW: u32 = 13;

/// How to grant the capability, shown with every capability error.
const GRANT_HINT: &str = "in Kubernetes the injected meshplane-init container asks for it \
(securityContext: runAsUser 0, capabilities.add [NET_ADMIN, NET_RAW]); a namespace whose Pod \
Security level is baseline or restricted refuses such pods (label it \
pod-security.kubernetes.io/enforce=privileged, or opt the pod out with the annotation \
sidecar.meshplane.io/captureMode: NONE); on a host, run it as root in the pod's network \
namespace (ip netns exec NS meshplane-proxy capture)";

/// Why capture could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// A program the command runs is not on `PATH`.
    #[error("{program} not found on PATH ({path}): capture programs netfilter with iptables-restore and iptables-save; the meshplane proxy image ships them (Debian's iptables package); on a Debian host run apt-get install -y iptables")]
    NotInstalled { program: String, path: String },
    /// The process lacks `CAP_NET_ADMIN`.
    #[error("capture needs the CAP_NET_ADMIN capability to change the pod's netfilter rules and this process does not have it (effective capabilities {effective:#x}); {GRANT_HINT}")]
    MissingNetAdmin { effective: u64 },
    /// A program ran and failed.
    #[error("{command} failed ({status}): {stderr}{hint}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
        hint: String,
    },
    /// A program could not be started.
    #[error("running {command}: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    /// The table read back is not what was applied: something else changed it meanwhile.
    #[error("after {command} the nat table does not hold exactly the rules applied; another program may be changing it. It holds:\n{applied}")]
    Mismatch { command: String, applied: String },
}

/// The effective capability set from the text of `/proc/self/status`.
pub fn effective_capabilities(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

fn has(effective: u64, bit: u32) -> bool {
    effective & (1u64 << bit) != 0
}

/// Finds an executable `name` in the directories of `path` (a `PATH` value).
pub fn find_on_path(name: &str, path: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::split_paths(path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The two programs of one family, resolved on `PATH`.
struct Tools {
    save: PathBuf,
    restore: PathBuf,
}

impl Tools {
    fn find(family: Family) -> Result<Self, CaptureError> {
        let path = std::env::var("PATH").unwrap_or_default();
        let find = |suffix: &str| {
            let program = format!("{}-{suffix}", family.command_prefix());
            find_on_path(&program, &path).ok_or_else(|| CaptureError::NotInstalled {
                program,
                path: path.clone(),
            })
        };
        Ok(Tools {
            restore: find("restore")?,
            save: find("save")?,
        })
    }
}

/// What [`apply`] did for one family.
#[derive(Debug)]
pub struct Applied {
    pub family: Family,
    /// Jumps of an earlier run that were replaced.
    pub replaced_jumps: usize,
    /// The `nat` table afterwards, as `iptables-save` prints it.
    pub table: String,
}

/// Applies `plan` for each of `families`, atomically per family, and checks the result.
pub fn apply(plan: &CapturePlan, families: &[Family]) -> Result<Vec<Applied>, CaptureError> {
    // Every check comes before the first change: a missing tool or capability changes nothing.
    let tools = families
        .iter()
        .map(|f| Tools::find(*f).map(|t| (*f, t)))
        .collect::<Result<Vec<_>, _>>()?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = effective_capabilities(&status);
    if let Some(effective) = effective {
        if !has(effective, CAP_NET_ADMIN) {
            return Err(CaptureError::MissingNetAdmin { effective });
        }
    }
    let hint = match effective {
        Some(e) if !has(e, CAP_NET_RAW) => format!(
            "\nnote: CAP_NET_RAW is missing too, which the iptables legacy backend needs; {GRANT_HINT}"
        ),
        _ => String::new(),
    };

    let mut done = Vec::new();
    for (family, tools) in tools {
        let before = run(&tools.save, &["-t", "nat"], None, &hint)?;
        let existing = rules::existing_jumps(&before);
        let input = rules::restore_input(plan, family, &existing);
        run(&tools.restore, &["--noflush"], Some(&input), &hint)?;
        let after = run(&tools.save, &["-t", "nat"], None, &hint)?;
        if !rules::matches_applied(&after, &rules::rules(plan, family)) {
            return Err(CaptureError::Mismatch {
                command: tools.restore.display().to_string(),
                applied: after,
            });
        }
        done.push(Applied {
            family,
            replaced_jumps: existing.len(),
            table: after,
        });
    }
    Ok(done)
}

fn run(
    program: &Path,
    args: &[&str],
    stdin: Option<&str>,
    hint: &str,
) -> Result<String, CaptureError> {
    let command = format!("{} {}", program.display(), args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| CaptureError::Spawn {
            command: command.clone(),
            source,
        })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A write error means the program exited early; its status and stderr say why.
        let _ = pipe.write_all(input.as_bytes());
    }
    let output = child
        .wait_with_output()
        .map_err(|source| CaptureError::Spawn {
            command: command.clone(),
            source,
        })?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    let mut hint = hint.to_owned();
    if stderr.contains("Permission denied") || stderr.contains("you must be root") {
        hint.push_str(&format!("\nnote: permission denied: {GRANT_HINT}"));
    }
    if let Some(input) = stdin {
        hint.push_str("\ninput was:\n");
        hint.push_str(input);
    }
    Err(CaptureError::Failed {
        command,
        status: output.status.to_string(),
        stderr,
        hint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_effective_set() {
        let status = "Name:\tcat\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t0000000000003000\n";
        let eff = effective_capabilities(status).unwrap();
        assert!(has(eff, CAP_NET_ADMIN));
        assert!(has(eff, CAP_NET_RAW));
        assert!(!has(0x2000, CAP_NET_ADMIN));
        assert_eq!(effective_capabilities("Name:\tx\n"), None);
    }

    #[test]
    fn finds_only_executable_files_on_path() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("mp-capture-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::create_dir_all(dir.join("b")).unwrap();
        let plain = dir.join("a/iptables-restore");
        std::fs::write(&plain, "").unwrap();
        let exe = dir.join("b/iptables-restore");
        std::fs::write(&exe, "").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("{}:{}", dir.join("a").display(), dir.join("b").display());
        assert_eq!(find_on_path("iptables-restore", &path), Some(exe));
        assert_eq!(find_on_path("iptables-save", &path), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn capability_error_says_what_is_missing_and_how_to_grant_it() {
        let msg = CaptureError::MissingNetAdmin { effective: 0 }.to_string();
        assert!(msg.contains("CAP_NET_ADMIN"), "{msg}");
        assert!(
            msg.contains("capabilities.add [NET_ADMIN, NET_RAW]"),
            "{msg}"
        );
        assert!(msg.contains("captureMode: NONE"), "{msg}");
    }
}
