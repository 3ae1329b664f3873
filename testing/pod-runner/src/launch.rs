//! Turning a pod's container spec into what the runner executes: program, args, env, user and
//! the pod's network namespace, plus the runner's accommodations (volume mount paths in args
//! and env rewritten to the materialised directories, the ServiceAccount kubeconfig passed in).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container as ContainerSpec, Pod};

use super::binaries::{host_program, locate_binary, program_for_image, Program};
use super::container::Launch;
use super::downward::field_value;
use super::echo::EchoIdentity;
use super::expand::{expand_vars, rewrite_mount_paths};
use super::net::PodNet;
use super::volumes::ObjectData;

/// Environment of the runner shared by every container it starts.
pub struct LaunchContext<'a> {
    pub pod: &'a Pod,
    pub net: &'a PodNet,
    pub bin_dir: &'a Path,
    /// Directory of each volume by volume name.
    pub volume_dirs: &'a BTreeMap<String, PathBuf>,
    pub container_dir: PathBuf,
    pub log_path: PathBuf,
    /// The pod ServiceAccount's kubeconfig, when a token is mounted.
    pub kubeconfig: Option<&'a Path>,
    /// `KUBERNETES_SERVICE_HOST` and `_PORT`: the API's in-cluster address.
    pub api_service: Option<(String, u16)>,
    pub objects: &'a dyn ObjectData,
    /// Added to every process (e.g. ENVOY_BIN, RUST_LOG defaults).
    pub runner_env: &'a BTreeMap<String, String>,
}

/// What to run for `container` (an init container when `init`), or why it cannot run
/// (`CreateContainerConfigError`).
pub fn build_launch(
    container: &ContainerSpec,
    init: bool,
    ctx: &LaunchContext<'_>,
) -> Result<Launch, String> {
    let command: Vec<String> = container.command.clone().unwrap_or_default();
    let program = match program_for_image(container.image.as_deref().unwrap_or_default()) {
        // An application image runs its command when it has one and the host has the program
        // (a shell for an init step, a test's own server or client); an init container
        // without one has nothing to do, an app container without one is the echo server.
        Program::Echo => match command.first() {
            None if init => return Ok(Launch::Complete),
            None => {
                return Ok(Launch::Echo {
                    net: ctx.net.clone(),
                    ports: container
                        .ports
                        .iter()
                        .flatten()
                        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
                        .filter_map(|p| u16::try_from(p.container_port).ok())
                        .collect(),
                    identity: EchoIdentity {
                        pod: ctx.pod.metadata.name.clone().unwrap_or_default(),
                        namespace: ctx.pod.metadata.namespace.clone().unwrap_or_default(),
                        container: container.name.clone(),
                    },
                })
            }
            Some(first) => host_program(first).ok_or_else(|| {
                format!(
                    "command {first:?} of container {} is not on this host",
                    container.name
                )
            })?,
        },
        Program::Binary(image_binary) => match command.first() {
            None => locate_binary(ctx.bin_dir, image_binary).map_err(|e| e.to_string())?,
            Some(first) => {
                let base = Path::new(first)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                if base == image_binary {
                    locate_binary(ctx.bin_dir, image_binary).map_err(|e| e.to_string())?
                } else {
                    host_program(first).ok_or_else(|| {
                        format!(
                            "command {first:?} is neither the image's {image_binary} nor a program on this host"
                        )
                    })?
                }
            }
        },
    };
    let mounts = mount_rewrites(container, ctx.volume_dirs);
    let vars = container_env(container, ctx)?;
    let argv: Vec<String> = command
        .iter()
        .skip(1)
        .chain(container.args.iter().flatten())
        .cloned()
        .collect();
    let args = argv
        .iter()
        .map(|arg| rewrite_mount_paths(&expand_vars(arg, &vars), &mounts))
        .collect();
    let mut env: BTreeMap<String, String> = vars
        .into_iter()
        .map(|(name, value)| (name, rewrite_mount_paths(&value, &mounts)))
        .collect();
    for (name, value) in ctx.runner_env {
        env.entry(name.clone()).or_insert_with(|| value.clone());
    }
    if let Some(path) = std::env::var_os("PATH") {
        env.entry("PATH".into())
            .or_insert_with(|| path.to_string_lossy().into_owned());
    }
    env.insert("HOME".into(), ctx.container_dir.display().to_string());
    if let Some((host, port)) = &ctx.api_service {
        // What the kubelet gives every container.
        env.entry("KUBERNETES_SERVICE_HOST".into())
            .or_insert_with(|| host.clone());
        env.entry("KUBERNETES_SERVICE_PORT".into())
            .or_insert_with(|| port.to_string());
    }
    if let Some(kubeconfig) = ctx.kubeconfig {
        env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
    }
    let user = run_as(container, ctx.pod);
    Ok(Launch::Process {
        program,
        args,
        env,
        work_dir: ctx.container_dir.clone(),
        log_path: ctx.log_path.clone(),
        placement: ctx.net.placement((user != (0, 0)).then_some(user)),
        owner: user,
    })
}

/// `(uid, gid)` from the container's securityContext, else the pod's, else root.
fn run_as(container: &ContainerSpec, pod: &Pod) -> (u32, u32) {
    let pod_context = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let own = container.security_context.as_ref();
    let uid = own
        .and_then(|c| c.run_as_user)
        .or_else(|| pod_context.and_then(|c| c.run_as_user))
        .and_then(|u| u32::try_from(u).ok())
        .unwrap_or(0);
    let gid = own
        .and_then(|c| c.run_as_group)
        .or_else(|| pod_context.and_then(|c| c.run_as_group))
        .and_then(|g| u32::try_from(g).ok())
        .unwrap_or(0);
    (uid, gid)
}

/// mountPath → materialised directory (with subPath) for each of the container's mounts.
fn mount_rewrites(
    container: &ContainerSpec,
    volume_dirs: &BTreeMap<String, PathBuf>,
) -> Vec<(String, String)> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|mount| {
            let dir = volume_dirs.get(&mount.name)?;
            let dir = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => dir.join(sub),
                None => dir.clone(),
            };
            Some((mount.mount_path.clone(), dir.display().to_string()))
        })
        .collect()
}

/// The container's environment as the kubelet computes it: envFrom first, then env in order,
/// each value expanded against the variables defined before it.
fn container_env(
    container: &ContainerSpec,
    ctx: &LaunchContext<'_>,
) -> Result<BTreeMap<String, String>, String> {
    let namespace = ctx.pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut vars = BTreeMap::new();
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.clone().unwrap_or_default();
        let data = if let Some(cm) = &source.config_map_ref {
            match ctx.objects.config_map(namespace, &cm.name) {
                Some(data) => data,
                None if cm.optional == Some(true) => BTreeMap::new(),
                None => return Err(format!("configmap {:?} not found", cm.name)),
            }
        } else if let Some(secret) = &source.secret_ref {
            match ctx.objects.secret(namespace, &secret.name) {
                Some(data) => data,
                None if secret.optional == Some(true) => BTreeMap::new(),
                None => return Err(format!("secret {:?} not found", secret.name)),
            }
        } else {
            BTreeMap::new()
        };
        for (key, value) in data {
            vars.insert(
                format!("{prefix}{key}"),
                String::from_utf8_lossy(&value).into_owned(),
            );
        }
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(value) = &var.value {
            expand_vars(value, &vars)
        } else if let Some(source) = &var.value_from {
            if let Some(field) = &source.field_ref {
                field_value(ctx.pod, &field.field_path, ctx.net.ip()).ok_or_else(|| {
                    format!(
                        "env {}: unsupported fieldRef {}",
                        var.name, field.field_path
                    )
                })?
            } else if let Some(key) = &source.config_map_key_ref {
                match ctx
                    .objects
                    .config_map(namespace, &key.name)
                    .and_then(|d| d.get(&key.key).cloned())
                {
                    Some(value) => String::from_utf8_lossy(&value).into_owned(),
                    None if key.optional == Some(true) => continue,
                    None => {
                        return Err(format!(
                            "env {}: configmap {}/{} has no key {}",
                            var.name, namespace, key.name, key.key
                        ))
                    }
                }
            } else if let Some(key) = &source.secret_key_ref {
                match ctx
                    .objects
                    .secret(namespace, &key.name)
                    .and_then(|d| d.get(&key.key).cloned())
                {
                    Some(value) => String::from_utf8_lossy(&value).into_owned(),
                    None if key.optional == Some(true) => continue,
                    None => {
                        return Err(format!(
                            "env {}: secret {}/{} has no key {}",
                            var.name, namespace, key.name, key.key
                        ))
                    }
                }
            } else {
                // resourceFieldRef: the runner enforces no resources; report none.
                String::new()
            }
        } else {
            String::new()
        };
        vars.insert(var.name.clone(), value);
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoObjects;

    impl ObjectData for NoObjects {
        fn config_map(&self, _: &str, _: &str) -> Option<BTreeMap<String, Vec<u8>>> {
            None
        }
        fn secret(&self, _: &str, _: &str) -> Option<BTreeMap<String, Vec<u8>>> {
            None
        }
    }

    #[test]
    fn instance_args_are_expanded_and_rewritten_for_the_local_pod() {
        let bin_dir = std::env::temp_dir().join(format!("podrunner-launch-{}", std::process::id()));
        std::fs::create_dir_all(&bin_dir).unwrap();
        std::fs::write(bin_dir.join("meshplane-xds"), b"").unwrap();
        std::fs::write(bin_dir.join("meshplane-proxy"), b"").unwrap();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "blue-v1-abc", "namespace": "meshplane-blue"},
            "spec": {
                "securityContext": {"runAsUser": 65532, "runAsGroup": 65532},
                "initContainers": [
                    {"name": "meshplane-init", "image": "ghcr.io/meshplane/proxy:0.1.0",
                     "command": ["/usr/local/bin/meshplane-proxy", "capture"], "args": ["--inbound-ports", "*"],
                     "securityContext": {"runAsUser": 0, "runAsGroup": 0}},
                    {"name": "shell", "image": "ghcr.io/meshplane/proxy:0.1.0",
                     "command": ["/bin/sh", "-c"], "args": ["true"]},
                    {"name": "nothing", "image": "example.com/busybox:1"}
                ],
                "containers": [{
                "name": "xds",
                "image": "ghcr.io/meshplane/xds-server:0.1.0",
                "args": ["--xds-addr", "0.0.0.0:15010", "--webhook-tls-dir", "/var/run/meshplane/webhook-tls",
                         "--pod=$(POD_NAME)"],
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "ID", "value": "x-$(POD_NAME)"}],
                "volumeMounts": [{"name": "tls", "mountPath": "/var/run/meshplane/webhook-tls"}]
            }]}
        }))
        .unwrap();
        let volume_dirs = [("tls".to_string(), PathBuf::from("/tmp/pod/volumes/tls"))].into();
        let runner_env = BTreeMap::new();
        let net = PodNet::unplugged(
            "meshplane-blue",
            "blue-v1-abc",
            "198.18.0.10".parse().unwrap(),
        );
        let ctx = LaunchContext {
            pod: &pod,
            net: &net,
            bin_dir: &bin_dir,
            volume_dirs: &volume_dirs,
            container_dir: PathBuf::from("/tmp/pod/containers/xds"),
            log_path: PathBuf::from("/tmp/pod/xds.log"),
            kubeconfig: Some(Path::new("/tmp/pod/kubeconfig")),
            api_service: Some(("198.19.0.1".into(), 443)),
            objects: &NoObjects,
            runner_env: &runner_env,
        };
        let spec = pod.spec.as_ref().unwrap();
        let Launch::Process {
            program,
            args,
            env,
            owner,
            ..
        } = build_launch(&spec.containers[0], false, &ctx).unwrap()
        else {
            panic!("the xds-server image must run a process");
        };
        assert_eq!(program, bin_dir.join("meshplane-xds"));
        assert_eq!(
            args,
            [
                "--xds-addr",
                "0.0.0.0:15010",
                "--webhook-tls-dir",
                "/tmp/pod/volumes/tls",
                "--pod=blue-v1-abc"
            ],
            "listen addresses stay: the pod has its own network"
        );
        assert_eq!(env["ID"], "x-blue-v1-abc");
        assert_eq!(env["KUBECONFIG"], "/tmp/pod/kubeconfig");
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "198.19.0.1");
        assert_eq!(env["KUBERNETES_SERVICE_PORT"], "443");
        assert_eq!(owner, (65532, 65532), "the pod's securityContext applies");

        let inits = spec.init_containers.as_ref().unwrap();
        let Launch::Process {
            program,
            args,
            owner,
            ..
        } = build_launch(&inits[0], true, &ctx).unwrap()
        else {
            panic!("the capture init container runs the proxy image's binary");
        };
        assert_eq!(program, bin_dir.join("meshplane-proxy"));
        assert_eq!(args, ["capture", "--inbound-ports", "*"]);
        assert_eq!(owner, (0, 0), "the container's own securityContext wins");
        let Launch::Process { program, .. } = build_launch(&inits[1], true, &ctx).unwrap() else {
            panic!("an image's other commands are the host's");
        };
        assert_eq!(program, PathBuf::from("/bin/sh"));
        assert!(matches!(
            build_launch(&inits[2], true, &ctx),
            Ok(Launch::Complete)
        ));
        std::fs::remove_dir_all(&bin_dir).unwrap();
    }

    #[test]
    fn an_application_image_runs_its_command_or_is_the_echo_server() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "grpc-v1", "namespace": "shop"},
            "spec": {"containers": [
                {"name": "server", "image": "example.com/echo:1",
                 "command": ["/bin/sh", "-c"], "args": ["exec serve --name $(NAME)"],
                 "env": [{"name": "NAME", "value": "v1"}]},
                {"name": "echo", "image": "example.com/echo:1", "ports": [{"containerPort": 8080}]},
                {"name": "missing", "image": "example.com/echo:1", "command": ["no-such-program-here"]}
            ]}
        }))
        .unwrap();
        let (volume_dirs, runner_env) = (BTreeMap::new(), BTreeMap::new());
        let net = PodNet::unplugged("shop", "grpc-v1", "198.18.0.11".parse().unwrap());
        let ctx = LaunchContext {
            pod: &pod,
            net: &net,
            bin_dir: Path::new("/nonexistent"),
            volume_dirs: &volume_dirs,
            container_dir: PathBuf::from("/tmp/pod/containers/server"),
            log_path: PathBuf::from("/tmp/pod/server.log"),
            kubeconfig: None,
            api_service: None,
            objects: &NoObjects,
            runner_env: &runner_env,
        };
        let containers = &pod.spec.as_ref().unwrap().containers;
        let Launch::Process { program, args, .. } =
            build_launch(&containers[0], false, &ctx).unwrap()
        else {
            panic!("an application image with a command runs it");
        };
        assert_eq!(program, PathBuf::from("/bin/sh"));
        assert_eq!(args, ["-c", "exec serve --name v1"]);
        let Launch::Echo { ports, .. } = build_launch(&containers[1], false, &ctx).unwrap() else {
            panic!("an application image without a command is the echo server");
        };
        assert_eq!(ports, [8080]);
        let error = build_launch(&containers[2], false, &ctx).unwrap_err();
        assert!(error.contains("no-such-program-here"), "{error}");
    }
}
