//! `meshplane-proxy capture` on real netfilter: a "pod" and a "peer" network namespace joined
//! by a veth pair, real TCP connections, and the rules the command programs.
//!
//! Needs root, `ip` (iproute2), `setpriv` (util-linux), `python3` and `iptables-restore`
//! (`make test` installs Debian's iptables). Addresses are 198.18.0.0/24, only inside the two
//! namespaces, which carry this process's PID in their names and are deleted when a test ends,
//! also when it fails; namespaces left by a killed run are deleted at the next start.
//!
//! The endpoints (`support/netns_tcp.py`) answer every connection with their tag and the
//! connection's original destination, so a reply says both where a connection went and that
//! the redirect kept the address the client asked for.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use meshplane_crds::capture::{init_container_args, CaptureScope};
use meshplane_crds::names;

const POD_IP: &str = "198.18.0.1";
const PEER_IP: &str = "198.18.0.2";
const PEER_IP_2: &str = "198.18.0.3";
const NS_PREFIX: &str = "mpcap-";
/// Every endpoint exits by itself after this long, even if the test process was killed.
const SERVER_DEADLINE_S: u32 = 300;

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn proxy_bin() -> &'static str {
    env!("CARGO_BIN_EXE_meshplane-proxy")
}

/// The endpoints' code, passed with `python3 -c` so that the proxy's UID can run it wherever
/// the checkout lives.
const HELPER: &str = include_str!("support/netns_tcp.py");

/// Debian's `python3` (readable by every UID), else the first on PATH.
fn python() -> String {
    if Path::new("/usr/bin/python3").exists() {
        return "/usr/bin/python3".to_owned();
    }
    which("python3").unwrap_or_else(|| "python3".to_owned())
}

fn which(tool: &str) -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !path.is_empty()).then_some(path)
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    out
}

fn check(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails with what to install when the machine cannot run these tests.
fn require_prerequisites() {
    let uid = run(Command::new("id").arg("-u"));
    let missing: Vec<&str> = [
        "ip",
        "setpriv",
        "python3",
        "iptables-restore",
        "iptables-save",
    ]
    .into_iter()
    .filter(|tool| which(tool).is_none())
    .collect();
    assert!(
        String::from_utf8_lossy(&uid.stdout).trim() == "0" && missing.is_empty(),
        "the capture tests program netfilter in network namespaces: run them as root with \
         iproute2, util-linux (setpriv), python3 and iptables installed (make test installs \
         iptables); missing: {missing:?}"
    );
}

/// Deletes namespaces of earlier runs whose process is gone.
fn remove_leftovers() {
    let list = check(Command::new("ip").args(["netns", "list"]));
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix(NS_PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        let alive = Path::new("/proc").join(pid).exists();
        if !alive && pid.chars().all(|c| c.is_ascii_digit()) {
            let _ = run(Command::new("ip").args(["netns", "delete", name]));
        }
    }
}

/// One network namespace, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn create(role: &str, n: usize) -> Self {
        let name = format!("{NS_PREFIX}{}-{n}-{role}", std::process::id());
        check(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name };
        ns.exec(["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        // By absolute path: a test may give the command inside an empty PATH.
        let mut cmd = Command::new(which("ip").unwrap_or_else(|| "ip".to_owned()));
        cmd.args(["netns", "exec", &self.name]).args(args);
        cmd
    }

    fn exec<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        check(&mut self.command(args))
    }

    /// `iptables-save` (or `ip6tables-save`) of the namespace without comments and counters.
    fn saved(&self, save: &str) -> String {
        self.exec([save])
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| match l.rfind(" [") {
                Some(i) if l.starts_with(':') => &l[..i],
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run(Command::new("ip").args(["netns", "delete", &self.name]));
    }
}

/// A TCP endpoint process inside a namespace, killed on drop.
struct Server(Child);

impl Server {
    fn start(ns: &Netns, spec: &str) -> Self {
        let mut child = ns
            .command([python()])
            .args(["-c", HELPER, "serve", &SERVER_DEADLINE_S.to_string(), spec])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the endpoint");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let server = Server(child);
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.trim() == "ready" => server,
            other => panic!("endpoint {spec} in {} did not start: {other:?}", ns.name),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Who opens a connection inside the pod.
#[derive(Clone, Copy, Debug)]
enum As {
    /// The application (root here; any UID but the proxy's).
    App,
    /// The proxy's UID and GID.
    Proxy,
    /// Another UID in the proxy's group.
    ProxyGroup,
}

/// The pod and its peer with endpoints on both sides, torn down on drop (endpoints first).
struct Testbed {
    _servers: Vec<Server>,
    pod: Netns,
    peer: Netns,
}

impl Testbed {
    fn new() -> Self {
        require_prerequisites();
        remove_leftovers();
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pod = Netns::create("pod", n);
        let peer = Netns::create("peer", n);
        pod.exec([
            "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
            &peer.name,
        ]);
        pod.exec(["ip", "addr", "add", &format!("{POD_IP}/24"), "dev", "eth0"]);
        pod.exec(["ip", "link", "set", "eth0", "up"]);
        peer.exec(["ip", "addr", "add", &format!("{PEER_IP}/24"), "dev", "eth0"]);
        peer.exec([
            "ip",
            "addr",
            "add",
            &format!("{PEER_IP_2}/24"),
            "dev",
            "eth0",
        ]);
        peer.exec(["ip", "link", "set", "eth0", "up"]);
        // The proxy's listeners and the application inside the pod; services on the peer.
        let servers = vec![
            Server::start(
                &pod,
                "outbound:15001,inbound:15006,ready:15021,app:8080,app9090:9090",
            ),
            Server::start(&peer, "peer:8080,peer9090:9090,peer443:443"),
        ];
        Testbed {
            _servers: servers,
            pod,
            peer,
        }
    }

    fn capture(&self, args: &[String]) -> Output {
        // ENVOY_BIN set as in the proxy image: the launcher's settings must not get in the way.
        run(self
            .pod
            .command([proxy_bin(), "capture"])
            .args(args)
            .env("ENVOY_BIN", "/usr/local/bin/envoy"))
    }

    fn capture_ok(&self, args: &[String]) {
        let out = self.capture(args);
        assert!(
            out.status.success(),
            "capture {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Connects from the pod as `who` and returns the answer ("TAG ORIGINAL_DESTINATION").
    fn connect_from_pod(&self, who: As, host: &str, port: u16) -> String {
        self.connect_from_pod_bound(who, host, port, None)
    }

    fn connect_from_pod_bound(
        &self,
        who: As,
        host: &str,
        port: u16,
        source: Option<&str>,
    ) -> String {
        let ids: &[&str] = match who {
            As::App => &[],
            As::Proxy => &["setpriv", "--reuid=1337", "--regid=1337", "--clear-groups"],
            As::ProxyGroup => &["setpriv", "--reuid=1000", "--regid=1337", "--clear-groups"],
        };
        let python = python();
        let mut cmd = self
            .pod
            .command(ids.iter().copied().chain([python.as_str()]));
        cmd.args(["-c", HELPER, "connect", host, &port.to_string()]);
        cmd.args(source);
        check(&mut cmd).trim().to_owned()
    }

    /// Connects from the peer to the pod.
    fn connect_from_peer(&self, host: &str, port: u16) -> String {
        let mut cmd = self.peer.command([python()]);
        cmd.args(["-c", HELPER, "connect", host, &port.to_string()]);
        check(&mut cmd).trim().to_owned()
    }

    fn nat(&self) -> String {
        self.pod.saved("iptables-save")
    }
}

fn args_for(annotations: &[(&str, &str)]) -> Vec<String> {
    let map: BTreeMap<String, String> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let scope = CaptureScope::from_annotations(Some(&map)).expect("valid annotations");
    init_container_args(&scope)
}

fn jumps(nat: &str, chain: &str) -> usize {
    nat.lines()
        .filter(|l| l.starts_with(&format!("-A {chain} ")) && l.contains("-j MESHPLANE_"))
        .count()
}

#[test]
fn default_capture_redirects_the_pods_tcp_and_spares_the_proxy() {
    let t = Testbed::new();
    let peer = format!("{PEER_IP}:8080");
    let pod = format!("{POD_IP}:8080");
    // Before capture every connection reaches its destination: the testbed itself is sound.
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP, 8080),
        format!("peer {peer}")
    );
    assert_eq!(t.connect_from_peer(POD_IP, 8080), format!("app {pod}"));

    t.capture_ok(&args_for(&[]));

    // Outbound: the application's connection goes to 15001, original destination kept.
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP, 8080),
        format!("outbound {peer}")
    );
    // The proxy's own traffic (by UID, and by GID) goes out as it is.
    assert_eq!(
        t.connect_from_pod(As::Proxy, PEER_IP, 8080),
        format!("peer {peer}")
    );
    assert_eq!(
        t.connect_from_pod(As::ProxyGroup, PEER_IP, 8080),
        format!("peer {peer}")
    );
    // Inbound: a connection to the pod goes to 15006, except to the proxy's own ports.
    assert_eq!(t.connect_from_peer(POD_IP, 8080), format!("inbound {pod}"));
    assert_eq!(
        t.connect_from_peer(POD_IP, 15021),
        format!("ready {POD_IP}:15021")
    );
    // The application talking to itself, on localhost or its pod IP, is not captured.
    assert_eq!(
        t.connect_from_pod(As::App, "127.0.0.1", 8080),
        "app 127.0.0.1:8080"
    );
    assert_eq!(
        t.connect_from_pod(As::App, POD_IP, 8080),
        format!("app {pod}")
    );
    // The proxy calling its own pod IP (a Service endpoint that is the pod itself) goes
    // through the inbound side; from the inbound passthrough source it reaches the app.
    assert_eq!(
        t.connect_from_pod(As::Proxy, POD_IP, 8080),
        format!("inbound {pod}")
    );
    assert_eq!(
        t.connect_from_pod_bound(As::Proxy, POD_IP, 8080, Some("127.0.0.6")),
        format!("app {pod}")
    );
    // IPv6 capture is off by default: the IPv6 table is left as it was.
    assert!(!t.pod.saved("ip6tables-save").contains("MESHPLANE"));

    // A re-run leaves exactly the same rules.
    let first = t.nat();
    t.capture_ok(&args_for(&[]));
    assert_eq!(t.nat(), first, "a second run changed the rules");
    assert_eq!(jumps(&first, "PREROUTING"), 1);
    assert_eq!(jumps(&first, "OUTPUT"), 1);
}

#[test]
fn annotations_exclude_and_include_ports_and_ranges() {
    let t = Testbed::new();
    t.capture_ok(&args_for(&[]));

    // Exclusions, applied over the default capture by a re-run.
    let excluding = args_for(&[
        (names::EXCLUDE_OUTBOUND_PORTS_ANNOTATION, "9090"),
        (
            names::EXCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
            &format!("{PEER_IP_2}/32"),
        ),
        (names::EXCLUDE_INBOUND_PORTS_ANNOTATION, "9090"),
    ]);
    t.capture_ok(&excluding);
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP, 9090),
        format!("peer9090 {PEER_IP}:9090")
    );
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP_2, 8080),
        format!("peer {PEER_IP_2}:8080")
    );
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP, 8080),
        format!("outbound {PEER_IP}:8080")
    );
    assert_eq!(
        t.connect_from_peer(POD_IP, 9090),
        format!("app9090 {POD_IP}:9090")
    );
    assert_eq!(
        t.connect_from_peer(POD_IP, 8080),
        format!("inbound {POD_IP}:8080")
    );
    let excluded = t.nat();
    t.capture_ok(&excluding);
    assert_eq!(t.nat(), excluded, "a second run changed the rules");
    assert_eq!(jumps(&excluded, "PREROUTING"), 1, "{excluded}");

    // Inclusions: only inbound 9090, only outbound to one address, plus port 443 anywhere.
    t.capture_ok(&args_for(&[
        (names::INCLUDE_INBOUND_PORTS_ANNOTATION, "9090"),
        (
            names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION,
            &format!("{PEER_IP_2}/32"),
        ),
        (names::INCLUDE_OUTBOUND_PORTS_ANNOTATION, "443"),
    ]));
    assert_eq!(
        t.connect_from_peer(POD_IP, 8080),
        format!("app {POD_IP}:8080")
    );
    assert_eq!(
        t.connect_from_peer(POD_IP, 9090),
        format!("inbound {POD_IP}:9090")
    );
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP, 8080),
        format!("peer {PEER_IP}:8080")
    );
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP_2, 8080),
        format!("outbound {PEER_IP_2}:8080")
    );
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP, 443),
        format!("outbound {PEER_IP}:443")
    );

    // No capture at all: empty inclusions.
    t.capture_ok(&args_for(&[
        (names::INCLUDE_INBOUND_PORTS_ANNOTATION, ""),
        (names::INCLUDE_OUTBOUND_IP_RANGES_ANNOTATION, ""),
    ]));
    assert_eq!(
        t.connect_from_peer(POD_IP, 9090),
        format!("app9090 {POD_IP}:9090")
    );
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP_2, 8080),
        format!("peer {PEER_IP_2}:8080")
    );
}

#[test]
fn ipv6_capture_programs_the_ipv6_table_idempotently() {
    let t = Testbed::new();
    let args: Vec<String> = args_for(&[])
        .into_iter()
        .chain(["--ipv6=capture".to_owned()])
        .collect();
    t.capture_ok(&args);
    let v6 = t.pod.saved("ip6tables-save");
    assert!(
        v6.contains("-A MESHPLANE_OUTPUT -s ::6/128 -o lo -j RETURN"),
        "{v6}"
    );
    assert!(
        v6.contains("-A MESHPLANE_OUTPUT -d ::1/128 -j RETURN"),
        "{v6}"
    );
    t.capture_ok(&args);
    assert_eq!(t.pod.saved("ip6tables-save"), v6);
    // IPv4 capture is unchanged by the IPv6 option.
    assert_eq!(
        t.connect_from_pod(As::App, PEER_IP, 8080),
        format!("outbound {PEER_IP}:8080")
    );
}

#[test]
fn without_net_admin_it_fails_clearly_and_changes_nothing() {
    let t = Testbed::new();
    let before = t.nat();
    let out = run(&mut t.pod.command([
        "setpriv",
        "--bounding-set=-net_admin",
        "--inh-caps=-net_admin",
        proxy_bin(),
        "capture",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "capture succeeded without CAP_NET_ADMIN"
    );
    assert!(stderr.contains("CAP_NET_ADMIN"), "{stderr}");
    assert!(
        stderr.contains("capabilities.add [NET_ADMIN, NET_RAW]"),
        "{stderr}"
    );
    assert_eq!(t.nat(), before);
    assert_eq!(
        t.connect_from_peer(POD_IP, 8080),
        format!("app {POD_IP}:8080")
    );
}

#[test]
fn without_iptables_it_fails_clearly_and_changes_nothing() {
    let t = Testbed::new();
    let before = t.nat();
    let empty = std::env::temp_dir().join(format!("mpcap-empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("create an empty directory");
    let out = run(t.pod.command([proxy_bin(), "capture"]).env("PATH", &empty));
    let _ = std::fs::remove_dir(&empty);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("iptables-restore not found on PATH"),
        "{stderr}"
    );
    assert!(stderr.contains("apt-get install -y iptables"), "{stderr}");
    assert_eq!(t.nat(), before);
}
