//! The pod network leaves nothing behind: the `local-cluster` binary (stand-in + pod runner)
//! runs a pod whose init container is a long-lived host process inside the pod's namespace;
//! stopped with SIGTERM it deletes every namespace it made and adds nothing to the host; killed
//! with SIGKILL its leftovers (namespaces, `/etc/netns` files, the process still inside) stay
//! while nobody cleans them, are kept while their owner lives, and are removed by the next
//! network's start-up clean-up once the owner is dead.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::Api;
use meshplane_pod_runner::net::{remove_leftovers, NAME_PREFIX};

const DEADLINE: Duration = Duration::from_secs(60);

/// A pod whose init container never ends: `sleep` runs inside the pod's network namespace.
fn holder_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "holder", "namespace": "default"},
        "spec": {
            "initContainers": [{"name": "hold", "image": "example.com/tools:1", "command": ["sleep", "600"]}],
            "containers": [{"name": "app", "image": "example.com/echo:1"}]
        }
    }))
    .expect("pod")
}

struct LocalCluster {
    child: Child,
    network_id: String,
    dir: PathBuf,
}

impl LocalCluster {
    fn start(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("pod-network-cleanup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("work dir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_local-cluster"))
            .arg("--kubeconfig-dir")
            .arg(dir.join("kubeconfigs"))
            .arg("--work-dir")
            .arg(dir.join("pods"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("local-cluster starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut network_id = None;
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("local-cluster's output");
            if let Some(rest) = line.strip_prefix("pod network ") {
                network_id = rest.split_whitespace().next().map(str::to_string);
                break;
            }
        }
        let network_id = network_id.expect("local-cluster names its pod network");
        assert!(network_id.starts_with(&format!("{NAME_PREFIX}{}-", child.id())));
        LocalCluster {
            child,
            network_id,
            dir,
        }
    }

    async fn create_holder(&self) {
        let path = self.dir.join("kubeconfigs/admin.kubeconfig");
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        let client = kube::Client::try_from(config).expect("client");
        let pods: Api<Pod> = Api::namespaced(client, "default");
        pods.create(&PostParams::default(), &holder_pod())
            .await
            .expect("holder pod");
    }

    /// Waits for the holder's namespace and the `sleep` inside it; returns the sleep's pid.
    async fn wait_for_holder(&self) -> u32 {
        let started = Instant::now();
        loop {
            if let Some(pid) = self
                .namespaces()
                .iter()
                .find(|n| n.ends_with("default.holder"))
                .and_then(|n| process_in(n, "sleep"))
            {
                return pid;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "no sleep in the holder's namespace; namespaces: {:?}",
                self.namespaces()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Namespaces and `/etc/netns` entries of this cluster's network.
    fn namespaces(&self) -> Vec<String> {
        owned_entries(&self.network_id)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn owned_entries(network_id: &str) -> Vec<String> {
    let mut found = Vec::new();
    for dir in ["/run/netns", "/etc/netns"] {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{network_id}-")) {
                found.push(format!("{dir}/{name}"));
            }
        }
    }
    found
}

/// The pid of a process named `comm` inside namespace `path` (`/run/netns/<name>`).
fn process_in(path: &str, comm: &str) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let target = std::fs::metadata(path).ok()?;
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let ns = std::fs::metadata(entry.path().join("ns/net")).ok()?;
            let name = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            (ns.ino() == target.ino() && ns.dev() == target.dev() && name.trim() == comm)
                .then_some(pid)
        })
}

fn alive(pid: u32) -> bool {
    // A zombie is dead for this purpose: it holds no namespace.
    std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).is_ok_and(
        |stat| {
            stat.rsplit(") ")
                .next()
                .is_some_and(|rest| !rest.starts_with('Z'))
        },
    )
}

fn host_network() -> String {
    let mut out = String::new();
    for args in [&["-o", "link"][..], &["route"], &["rule"]] {
        let output = Command::new("ip").args(args).output().expect("ip");
        out.push_str(&String::from_utf8_lossy(&output.stdout));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_deletes_every_namespace_and_leaves_the_host_as_it_was() {
    let host_before = host_network();
    let cluster = LocalCluster::start("term");
    cluster.create_holder().await;
    let sleeper = cluster.wait_for_holder().await;
    assert!(!cluster.namespaces().is_empty());
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(cluster.child.id() as i32, libc::SIGTERM);
    }
    let mut cluster = cluster;
    let status = cluster.child.wait().expect("local-cluster exits");
    assert!(status.success(), "{status:?}");
    assert_eq!(cluster.namespaces(), Vec::<String>::new());
    assert!(!alive(sleeper), "the pod's process was stopped");
    assert_eq!(
        host_network(),
        host_before,
        "links, routes and rules of the host"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_of_a_killed_run_are_removed_only_once_their_owner_is_dead() {
    let mut cluster = LocalCluster::start("kill");
    cluster.create_holder().await;
    let sleeper = cluster.wait_for_holder().await;
    let removed = remove_leftovers();
    assert!(
        removed.iter().all(|n| !n.starts_with(&cluster.network_id)),
        "a live owner's namespaces are never removed: {removed:?}"
    );
    assert!(!cluster.namespaces().is_empty());

    cluster.child.kill().expect("SIGKILL");
    cluster.child.wait().expect("reaped");
    assert!(
        !cluster.namespaces().is_empty() && alive(sleeper),
        "a killed runner cannot clean up after itself"
    );
    let removed = remove_leftovers();
    assert!(
        removed.iter().any(|n| n.starts_with(&cluster.network_id)),
        "{removed:?}"
    );
    assert_eq!(cluster.namespaces(), Vec::<String>::new());
    let started = Instant::now();
    while alive(sleeper) {
        assert!(
            started.elapsed() < DEADLINE,
            "the leftover process was killed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
