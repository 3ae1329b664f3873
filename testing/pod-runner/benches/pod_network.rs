//! Per-pod set-up cost of the pod runner's real pod network, measured (not asserted):
//!
//! 1. `add_pod`: the pod's network namespace, its veth pair, address, routes, `hosts` and
//!    `resolv.conf`;
//! 2. capture: the capture init container exactly as the sidecar injector renders it
//!    (`meshplane_webhooks::inject`), run as root inside the pod's namespace;
//! 3. Services: rewriting the node's ClusterIP rules (one `iptables-restore`) for `SERVICES`
//!    Services with two endpoints each;
//! 4. teardown: deleting the pod's namespace.
//!
//! `cargo bench -p meshplane-pod-runner --bench pod_network` (as root; `PODS` pods, default 20).
//! Prints a table of median, p90 and max per step.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use meshplane_pod_runner::net::{Placement, ServiceRoute, TestNetwork};
use meshplane_pod_runner::{default_bin_dir, locate_binary};
use meshplane_webhooks::inject::{inject, CaptureMode, Injection, InjectionConfig, INIT_CONTAINER};

const SERVICES: u16 = 100;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pods: usize = std::env::var("PODS")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(20);
    let capture = capture_container()?;
    let (program, args) = capture_command(&capture)?;
    let network = TestNetwork::create()?;
    let mut add = Vec::new();
    let mut rules = Vec::new();
    let mut remove = Vec::new();
    let mut nets = Vec::new();
    for i in 0..pods {
        let started = Instant::now();
        let net = network.add_pod("bench", &format!("pod-{i}"), &format!("uid-{i}"))?;
        add.push(started.elapsed());

        let started = Instant::now();
        let mut command = std::process::Command::new(&program);
        command.args(&args);
        Placement {
            netns: Some(net.netns().path()),
            ..Placement::default()
        }
        .apply_std(&mut command)?;
        let output = command.output()?;
        if !output.status.success() {
            return Err(format!(
                "the capture init container failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        rules.push(started.elapsed());
        nets.push(net);
    }
    let mut services = Vec::new();
    for round in 0..5u16 {
        let routes: Vec<ServiceRoute> = (0..SERVICES)
            .map(|s| ServiceRoute {
                frontend: SocketAddr::from((
                    [198, 19, 1 + (s / 250) as u8, (s % 250) as u8 + 1],
                    8080,
                )),
                // Each round moves the endpoints so that every rewrite really changes the rules.
                backends: (0..2u16)
                    .map(|e| SocketAddr::from(([198, 18, 0, 10 + e as u8], 9000 + round)))
                    .collect(),
            })
            .collect();
        let started = Instant::now();
        network.set_services(&routes, &[])?;
        services.push(started.elapsed());
    }
    for net in nets {
        let started = Instant::now();
        network.remove_pod(&net);
        remove.push(started.elapsed());
    }
    network.shutdown();

    println!("| step ({pods} pods) | median | p90 | max |");
    println!("|---|---|---|---|");
    for (name, samples) in [
        (
            "network namespace + veth + addresses + routes + hosts (add_pod)",
            &mut add,
        ),
        (
            "capture rules (the injector's init container, in the pod)",
            &mut rules,
        ),
        (
            &*format!("ClusterIP rules for {SERVICES} Services (iptables-restore, node)"),
            &mut services,
        ),
        ("teardown (delete the pod's namespace)", &mut remove),
    ] {
        samples.sort();
        println!(
            "| {name} | {} | {} | {} |",
            ms(percentile(samples, 50)),
            ms(percentile(samples, 90)),
            ms(*samples.last().unwrap_or(&Duration::ZERO))
        );
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() - 1) * p / 100]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The capture init container the injector renders for a plain pod in the default mode.
fn capture_container() -> Result<Container, Box<dyn std::error::Error>> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "bench"},
        "spec": {"containers": [{"name": "app", "image": "example.com/echo:1"}]}
    }))?;
    let config = InjectionConfig {
        tenant: "bench".into(),
        revision: "bench".into(),
        proxy_image: "ghcr.io/meshplane/proxy:0.1.0".into(),
        trust_domain: "cluster.local".into(),
        default_capture_mode: CaptureMode::Default,
    };
    let Injection::Patch(patch) = inject(&pod, "bench", &config)? else {
        return Err("the injector skipped a plain pod".into());
    };
    let mut doc = serde_json::to_value(&pod)?;
    json_patch::patch(&mut doc, &patch)?;
    let injected: Pod = serde_json::from_value(doc)?;
    injected
        .spec
        .and_then(|s| s.init_containers)
        .into_iter()
        .flatten()
        .find(|c| c.name == INIT_CONTAINER)
        .ok_or_else(|| "no capture init container".into())
}

/// The program and arguments as the pod runner runs them: the proxy image's own binary is the
/// workspace's, any other command the host's.
fn capture_command(
    container: &Container,
) -> Result<(PathBuf, Vec<String>), Box<dyn std::error::Error>> {
    let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
    argv.extend(container.args.clone().unwrap_or_default());
    if argv.is_empty() {
        return Err("the capture init container has no command".into());
    }
    let first = argv.remove(0);
    let program =
        if Path::new(&first).file_name().and_then(|n| n.to_str()) == Some("meshplane-proxy") {
            locate_binary(&default_bin_dir(), "meshplane-proxy")?
        } else {
            PathBuf::from(first)
        };
    Ok((program, argv))
}
