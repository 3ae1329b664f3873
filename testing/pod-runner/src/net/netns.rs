//! Named Linux network namespaces (`ip netns`), sockets opened inside them, processes started
//! inside them, and the clean-up of what a dead test process left behind.
//!
//! Every namespace this crate creates is named `mprun-<owner pid>-…`, so that several test
//! processes can share the machine and each removes only leftovers whose owner is gone.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::NetError;

/// Where `ip netns` keeps the namespace handles.
pub const NETNS_DIR: &str = "/run/netns";
/// Where `ip netns exec` (and this crate) keep per-namespace `hosts` and `resolv.conf`.
pub const NETNS_ETC_DIR: &str = "/etc/netns";
/// Prefix of every namespace this crate creates: `mprun-<owner pid>-<rest>`.
pub const NAME_PREFIX: &str = "mprun-";

/// One named network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// `ip netns add <name>`.
    pub fn add(name: &str) -> Result<Self, NetError> {
        run_ip(&["netns", "add", name], None)?;
        Ok(NetNs { name: name.into() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A handle by name only, for tests that never enter it.
    #[cfg(test)]
    pub(crate) fn unplugged(name: &str) -> Self {
        NetNs { name: name.into() }
    }

    /// `/run/netns/<name>`: opening it gives a handle for `setns(2)`.
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// `/etc/netns/<name>`: the files `ip netns exec` bind-mounts over `/etc`.
    pub fn etc_dir(&self) -> PathBuf {
        Path::new(NETNS_ETC_DIR).join(&self.name)
    }

    /// Runs `ip -n <name> -batch -` with `lines` (one `ip` command each, without `ip`).
    pub fn ip_batch(&self, lines: &[String]) -> Result<(), NetError> {
        let input = lines.join("\n") + "\n";
        run_ip(&["-n", &self.name, "-batch", "-"], Some(&input))
    }

    /// Runs `f` on a fresh thread that has entered this namespace (only that thread does).
    /// Sockets `f` creates belong to the namespace for their whole life and can be used from
    /// any thread afterwards, tokio's included.
    pub fn run_inside<T, F>(&self, f: F) -> std::io::Result<T>
    where
        T: Send,
        F: FnOnce() -> std::io::Result<T> + Send,
    {
        let handle = File::open(self.path())?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: setns on this thread only, with a valid namespace descriptor.
                    if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    f()
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("namespace thread panicked")))
        })
    }

    /// A TCP (IPv4) socket of this namespace, not yet bound or connected.
    pub fn tcp_socket(&self) -> std::io::Result<tokio::net::TcpSocket> {
        self.run_inside(tokio::net::TcpSocket::new_v4)
    }

    /// Kills every process still inside, then deletes the namespace and its `/etc/netns` files.
    pub fn delete(&self) {
        kill_processes_in(&self.name);
        if let Err(error) = run_ip(&["netns", "delete", &self.name], None) {
            tracing::warn!(netns = %self.name, %error, "cannot delete network namespace");
        }
        let etc = self.etc_dir();
        if etc.exists() {
            if let Err(error) = std::fs::remove_dir_all(&etc) {
                tracing::warn!(dir = %etc.display(), %error, "cannot remove");
            }
        }
    }
}

/// How a process is placed: which namespace, which `/etc` files, which user.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// The network namespace to enter.
    pub netns: Option<PathBuf>,
    /// Files bind-mounted over `/etc/<name>` in a private mount namespace of the process
    /// (what `ip netns exec` does with `/etc/netns/<ns>/`), e.g. `hosts`, `resolv.conf`.
    pub etc_files: Vec<(PathBuf, PathBuf)>,
    /// `(uid, gid)` to run as; None keeps root.
    pub user: Option<(u32, u32)>,
}

impl Placement {
    /// Makes `command` start in this placement (in the child, between fork and exec).
    pub fn apply(&self, command: &mut tokio::process::Command) -> std::io::Result<()> {
        let hook = self.pre_exec_hook()?;
        // SAFETY: the hook only makes async-signal-safe system calls.
        unsafe {
            command.pre_exec(hook);
        }
        Ok(())
    }

    /// [`Placement::apply`] for a `std` command.
    pub fn apply_std(&self, command: &mut Command) -> std::io::Result<()> {
        use std::os::unix::process::CommandExt;
        let hook = self.pre_exec_hook()?;
        // SAFETY: the hook only makes async-signal-safe system calls.
        unsafe {
            command.pre_exec(hook);
        }
        Ok(())
    }

    /// What the child runs between fork and exec. Everything it needs (the namespace handle,
    /// NUL-terminated paths) is prepared here, before the fork.
    fn pre_exec_hook(
        &self,
    ) -> std::io::Result<impl FnMut() -> std::io::Result<()> + Send + Sync + 'static> {
        let netns = self.netns.as_ref().map(File::open).transpose()?;
        let mut mounts = Vec::new();
        for (source, target) in &self.etc_files {
            if !target.exists() {
                // Nothing to mount over (e.g. a host without /etc/resolv.conf).
                continue;
            }
            mounts.push((c_path(source)?, c_path(target)?));
        }
        let user = self.user;
        Ok(move || -> std::io::Result<()> {
            // Only system calls from here on: this runs in the forked child.
            if let Some(handle) = &netns {
                // SAFETY: a valid descriptor opened before the fork.
                if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if !mounts.is_empty() {
                // SAFETY: plain system calls with NUL-terminated paths prepared before the fork.
                unsafe {
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // Keep the bind mounts of this process from propagating to the host.
                    if libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_SLAVE | libc::MS_REC,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    for (source, target) in &mounts {
                        if libc::mount(
                            source.as_ptr(),
                            target.as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND,
                            std::ptr::null(),
                        ) != 0
                        {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                }
            }
            if let Some((uid, gid)) = user {
                // SAFETY: plain system calls; groups first, the uid last.
                unsafe {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(gid) != 0
                        || libc::setuid(uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            Ok(())
        })
    }
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other(format!("{} contains a NUL byte", path.display())))
}

/// Runs `ip <args>` (with `input` on stdin) and turns a failure into an error with its stderr.
fn run_ip(args: &[&str], input: Option<&str>) -> Result<(), NetError> {
    run_tool("ip", args, input)
}

/// Runs a system tool to completion; a non-zero exit is an error carrying what it printed.
pub fn run_tool(program: &str, args: &[&str], input: Option<&str>) -> Result<(), NetError> {
    let command_line = || format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| NetError::Spawn {
            command: command_line(),
            source,
        })?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input.as_bytes())
            .map_err(|source| NetError::Spawn {
                command: command_line(),
                source,
            })?;
    }
    let output = child.wait_with_output().map_err(|source| NetError::Spawn {
        command: command_line(),
        source,
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(NetError::Tool {
            command: command_line(),
            input: input.unwrap_or_default().to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// SIGKILL to every process inside namespace `name` (`ip netns pids`).
fn kill_processes_in(name: &str) {
    let Ok(output) = Command::new("ip")
        .args(["netns", "pids", name])
        .stderr(Stdio::null())
        .output()
    else {
        return;
    };
    for pid in String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        // SAFETY: kill(2) with a pid read from the kernel's list; a vanished pid is ESRCH.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// The owner pid in a name `mprun-<pid>-…`.
pub fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(NAME_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Whether process `pid` exists.
pub fn process_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Removes every namespace (with its processes and `/etc/netns` files) whose owner process is
/// gone; returns the names removed. Namespaces of live processes are never touched.
pub fn remove_leftovers() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for dir in [NETNS_DIR, NETNS_ETC_DIR] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    let mut removed = Vec::new();
    for name in names {
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if pid == std::process::id() || process_alive(pid) {
            continue;
        }
        let netns = NetNs { name: name.clone() };
        if netns.path().exists() {
            netns.delete();
        } else {
            let _ = std::fs::remove_dir_all(netns.etc_dir());
        }
        removed.push(name);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_read_from_the_name() {
        assert_eq!(owner_pid("mprun-4242-3-node"), Some(4242));
        assert_eq!(owner_pid("mprun-17-0-12-shop.web"), Some(17));
        assert_eq!(owner_pid("cni-1234"), None);
        assert_eq!(owner_pid("mprun-x-1"), None);
    }
}
