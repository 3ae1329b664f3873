//! Mesh-state generator for the xds-server's directory source.
//!
//! Writes one tenant's state as Kubernetes YAML: member Namespaces labelled
//! `meshplane.io/rev=<rev>`, Services with ports and ClusterIPs, their EndpointSlices and Pods
//! (one file per Service), and optionally one Sidecar per namespace importing `./*` plus the
//! shared namespace. Mutators rewrite single files atomically (temp file + rename) so the
//! server never reads half a file.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Label that attaches a namespace to a revision.
pub const REV_LABEL: &str = "meshplane.io/rev";
/// Name of the namespace every scoped Sidecar imports in addition to its own.
pub const SHARED_NAMESPACE: &str = "shared";
/// Service port of every generated Service.
pub const SERVICE_PORT: u16 = 80;
/// Container port the endpoints listen on.
pub const TARGET_PORT: u16 = 8080;

/// Size and shape of the generated mesh.
#[derive(Clone, Debug)]
pub struct MeshSpec {
    pub services: usize,
    pub endpoints_per_service: usize,
    /// Member namespaces, the shared one included.
    pub namespaces: usize,
    /// Whether every namespace gets a Sidecar importing `./*` and `shared/*`.
    pub scoped: bool,
    pub revision: String,
    /// The tenant's control namespace (written too, so the directory is self-contained).
    pub control_namespace: String,
}

/// One endpoint of a Service: a Pod and its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub pod: String,
    pub ip: Ipv4Addr,
}

/// One generated Service with its endpoints.
#[derive(Clone, Debug)]
pub struct ServiceState {
    pub namespace: String,
    pub name: String,
    pub cluster_ip: Ipv4Addr,
    pub endpoints: Vec<Endpoint>,
    /// Bumped on each endpoint change, so pod names stay unique.
    generation: u64,
}

impl ServiceState {
    /// The service's host name as proxies see it.
    pub fn host(&self) -> String {
        format!("{}.{}.svc.cluster.local", self.name, self.namespace)
    }
}

/// What a mutation changed: enough for the load generator to recognise it on the wire.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// An endpoint of `host` was replaced by one at `new_ip`.
    EndpointReplaced {
        namespace: String,
        host: String,
        old_ip: Ipv4Addr,
        new_ip: Ipv4Addr,
    },
    /// A Service appeared (with its endpoints).
    ServiceAdded {
        namespace: String,
        host: String,
        endpoint_ips: Vec<Ipv4Addr>,
    },
    /// A Service and its endpoints disappeared.
    ServiceRemoved { namespace: String, host: String },
}

impl Mutation {
    /// Namespace of the changed Service.
    pub fn namespace(&self) -> &str {
        match self {
            Mutation::EndpointReplaced { namespace, .. }
            | Mutation::ServiceAdded { namespace, .. }
            | Mutation::ServiceRemoved { namespace, .. } => namespace,
        }
    }
}

/// The generated state and the directory it lives in.
#[derive(Debug)]
pub struct MeshState {
    pub spec: MeshSpec,
    pub dir: PathBuf,
    pub namespaces: Vec<String>,
    pub services: Vec<ServiceState>,
    next_endpoint: u32,
    next_cluster_ip: u32,
    next_service: usize,
}

/// Every generated address is in 198.18.0.0/15 (reserved for benchmarking, RFC 2544): endpoints
/// from 198.18.0.0/16, ClusterIPs from 198.19.0.0/17 and simulated proxies from 198.19.128.0/17
/// ([`proxy_ip`]), so the byte patterns the load generator looks for never collide. A range
/// that runs out is an error, never a wrap into another range or out of 198.18.0.0/15.
const ENDPOINTS: (u32, u32) = (
    u32::from_be_bytes([198, 18, 0, 0]),
    u32::from_be_bytes([198, 18, 255, 255]),
);
const CLUSTER_IPS: (u32, u32) = (
    u32::from_be_bytes([198, 19, 0, 0]),
    u32::from_be_bytes([198, 19, 127, 255]),
);
const PROXIES: (u32, u32) = (
    u32::from_be_bytes([198, 19, 128, 0]),
    u32::from_be_bytes([198, 19, 255, 255]),
);

/// The `n`-th usable host address of `range` (host bytes .0 and .255 skipped: they look odd in
/// a dump and some parsers reject them).
fn nth_host((first, last): (u32, u32), n: u32, what: &str) -> Result<Ipv4Addr> {
    let ip = u64::from(first) + 1 + u64::from(n) + 2 * (u64::from(n) / 254);
    let ip = u32::try_from(ip).ok().filter(|ip| *ip < last);
    let ip = ip.with_context(|| {
        format!(
            "{what} addresses exhausted: {} to {} holds fewer than {}",
            Ipv4Addr::from(first),
            Ipv4Addr::from(last),
            u64::from(n) + 1
        )
    })?;
    Ok(Ipv4Addr::from(ip))
}

/// Address of the `i`-th simulated proxy (its node id carries it), in 198.19.128.0/17.
pub fn proxy_ip(i: usize) -> Result<Ipv4Addr> {
    let n = u32::try_from(i).context("proxy index out of range")?;
    nth_host(PROXIES, n, "proxy")
}

/// Name of the `i`-th member namespace (the first is the shared one).
pub fn namespace_name(i: usize) -> String {
    if i == 0 {
        SHARED_NAMESPACE.to_string()
    } else {
        format!("ns-{i:03}")
    }
}

impl MeshState {
    /// Builds the state in memory (nothing written yet); fails when the spec needs more
    /// addresses than its ranges hold.
    pub fn new(spec: MeshSpec, dir: impl Into<PathBuf>) -> Result<Self> {
        let namespaces: Vec<String> = (0..spec.namespaces.max(1)).map(namespace_name).collect();
        let mut state = MeshState {
            spec,
            dir: dir.into(),
            namespaces,
            services: Vec::new(),
            next_endpoint: 0,
            next_cluster_ip: 0,
            next_service: 0,
        };
        for i in 0..state.spec.services {
            let ns = state.namespaces[i % state.namespaces.len()].clone();
            let svc = state.new_service(ns)?;
            state.services.push(svc);
        }
        Ok(state)
    }

    fn alloc_endpoint(&mut self) -> Result<Ipv4Addr> {
        let ip = nth_host(ENDPOINTS, self.next_endpoint, "endpoint")?;
        self.next_endpoint += 1;
        Ok(ip)
    }

    fn new_service(&mut self, namespace: String) -> Result<ServiceState> {
        let name = format!("svc-{:05}", self.next_service);
        self.next_service += 1;
        let cluster_ip = nth_host(CLUSTER_IPS, self.next_cluster_ip, "ClusterIP")?;
        self.next_cluster_ip += 1;
        let endpoints = (0..self.spec.endpoints_per_service)
            .map(|i| {
                Ok(Endpoint {
                    pod: format!("{name}-0-{i}"),
                    ip: self.alloc_endpoint()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(ServiceState {
            namespace,
            name,
            cluster_ip,
            endpoints,
            generation: 0,
        })
    }

    /// Writes every file into `dir` (created if missing).
    pub fn write_all(&self) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        write_atomic(&self.dir.join("namespaces.yaml"), &self.namespaces_yaml())?;
        if self.spec.scoped {
            for ns in &self.namespaces {
                write_atomic(
                    &self.dir.join(format!("sidecar-{ns}.yaml")),
                    &sidecar_yaml(ns),
                )?;
            }
        }
        for svc in &self.services {
            write_atomic(&self.service_path(svc), &service_yaml(svc))?;
        }
        Ok(())
    }

    fn service_path(&self, svc: &ServiceState) -> PathBuf {
        self.dir
            .join(format!("svc-{}-{}.yaml", svc.namespace, svc.name))
    }

    fn namespaces_yaml(&self) -> String {
        let mut out = String::new();
        let control = std::iter::once(&self.spec.control_namespace);
        for ns in control.chain(self.namespaces.iter()) {
            let _ = write!(
                out,
                "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    {REV_LABEL}: {}\n",
                self.spec.revision
            );
        }
        out
    }

    /// Replaces one endpoint of service `index` (modulo the service count) with a new address.
    pub fn replace_endpoint(&mut self, index: usize, which: usize) -> Result<Mutation> {
        self.plan_replace_endpoint(index, which)?.apply()
    }

    /// Adds a new service in `namespace` and writes its file.
    pub fn add_service(&mut self, namespace: &str) -> Result<Mutation> {
        self.plan_add_service(namespace)?.apply()
    }

    /// Removes service `index` (modulo the service count) and deletes its file.
    pub fn remove_service(&mut self, index: usize) -> Result<Mutation> {
        self.plan_remove_service(index)?.apply()
    }

    /// Like [`Self::replace_endpoint`], but the file changes only on [`Planned::apply`].
    pub fn plan_replace_endpoint(&mut self, index: usize, which: usize) -> Result<Planned> {
        anyhow::ensure!(!self.services.is_empty(), "no services to change");
        let i = index % self.services.len();
        let new_ip = self.alloc_endpoint()?;
        let svc = &mut self.services[i];
        anyhow::ensure!(
            !svc.endpoints.is_empty(),
            "service {} has no endpoints",
            svc.name
        );
        svc.generation += 1;
        let slot = which % svc.endpoints.len();
        let old_ip = svc.endpoints[slot].ip;
        svc.endpoints[slot] = Endpoint {
            pod: format!("{}-{}-{slot}", svc.name, svc.generation),
            ip: new_ip,
        };
        let mutation = Mutation::EndpointReplaced {
            namespace: svc.namespace.clone(),
            host: svc.host(),
            old_ip,
            new_ip,
        };
        let svc = &self.services[i];
        let action = FileAction::Write(self.service_path(svc), service_yaml(svc));
        Ok(Planned { mutation, action })
    }

    /// Like [`Self::add_service`], but the file appears only on [`Planned::apply`].
    pub fn plan_add_service(&mut self, namespace: &str) -> Result<Planned> {
        let svc = self.new_service(namespace.to_string())?;
        let action = FileAction::Write(self.service_path(&svc), service_yaml(&svc));
        let mutation = Mutation::ServiceAdded {
            namespace: svc.namespace.clone(),
            host: svc.host(),
            endpoint_ips: svc.endpoints.iter().map(|e| e.ip).collect(),
        };
        self.services.push(svc);
        Ok(Planned { mutation, action })
    }

    /// Like [`Self::remove_service`], but the file goes only on [`Planned::apply`].
    pub fn plan_remove_service(&mut self, index: usize) -> Result<Planned> {
        anyhow::ensure!(!self.services.is_empty(), "no services to remove");
        let svc = self.services.swap_remove(index % self.services.len());
        let action = FileAction::Remove(self.service_path(&svc));
        let mutation = Mutation::ServiceRemoved {
            namespace: svc.namespace.clone(),
            host: svc.host(),
        };
        Ok(Planned { mutation, action })
    }
}

/// The file operation behind a mutation.
#[derive(Debug)]
enum FileAction {
    Write(PathBuf, String),
    Remove(PathBuf),
}

/// A mutation already applied to the in-memory state whose file change is still to be made,
/// so the caller can note what it expects before the server can see it.
#[derive(Debug)]
pub struct Planned {
    pub mutation: Mutation,
    action: FileAction,
}

impl Planned {
    /// Makes the file change (atomic write or delete).
    pub fn apply(self) -> Result<Mutation> {
        match &self.action {
            FileAction::Write(path, contents) => write_atomic(path, contents)?,
            FileAction::Remove(path) => std::fs::remove_file(path)
                .with_context(|| format!("removing {}", path.display()))?,
        }
        Ok(self.mutation)
    }
}

fn sidecar_yaml(ns: &str) -> String {
    format!(
        "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata:\n  name: default\n  namespace: {ns}\nspec:\n  egress:\n  - hosts:\n    - \"./*\"\n    - \"{SHARED_NAMESPACE}/*\"\n"
    )
}

/// The Service, its EndpointSlice and its Pods as one multi-document YAML file.
pub fn service_yaml(svc: &ServiceState) -> String {
    let (ns, name) = (&svc.namespace, &svc.name);
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    app: {name}\nspec:\n  type: ClusterIP\n  clusterIP: {ip}\n  clusterIPs:\n  - {ip}\n  selector:\n    app: {name}\n  ports:\n  - name: http\n    port: {SERVICE_PORT}\n    targetPort: {TARGET_PORT}\n    protocol: TCP\n",
        ip = svc.cluster_ip
    );
    let _ = write!(
        out,
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-slice\n  namespace: {ns}\n  labels:\n    kubernetes.io/service-name: {name}\naddressType: IPv4\nports:\n- name: http\n  port: {TARGET_PORT}\n  protocol: TCP\nendpoints:\n"
    );
    for e in &svc.endpoints {
        let _ = write!(
            out,
            "- addresses:\n  - {ip}\n  conditions:\n    ready: true\n  targetRef:\n    kind: Pod\n    name: {pod}\n    namespace: {ns}\n",
            ip = e.ip,
            pod = e.pod
        );
    }
    for e in &svc.endpoints {
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: {ns}\n  labels:\n    app: {name}\nspec:\n  containers:\n  - name: app\n    image: app\n    ports:\n    - containerPort: {TARGET_PORT}\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n",
            pod = e.pod,
            ip = e.ip
        );
    }
    out
}

/// Writes `contents` to `path` through a hidden temp file and a rename, so readers see the old
/// or the new file, never a partial one.
pub fn write_atomic(path: &Path, contents: &str) -> Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming onto {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(scoped: bool) -> MeshSpec {
        MeshSpec {
            services: 7,
            endpoints_per_service: 3,
            namespaces: 3,
            scoped,
            revision: "r1".into(),
            control_namespace: "mesh-ctl".into(),
        }
    }

    fn docs(path: &Path) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(path).expect("readable");
        text.split("\n---\n")
            .map(|d| d.trim_start_matches("---\n"))
            .filter(|d| !d.trim().is_empty())
            .map(|d| serde_saphyr::from_str::<serde_json::Value>(d).expect("valid YAML"))
            .collect()
    }

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("meshgen-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Every dotted quad in `text` (digits and dots between other characters).
    fn ipv4s(text: &str) -> Vec<Ipv4Addr> {
        text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|w| w.matches('.').count() == 3)
            .map(|w| w.parse().unwrap_or_else(|_| panic!("not an address: {w}")))
            .collect()
    }

    fn benchmarking(ip: Ipv4Addr) -> bool {
        let [a, b, ..] = ip.octets();
        a == 198 && (b == 18 || b == 19)
    }

    #[test]
    fn every_written_address_is_in_the_benchmarking_range() {
        let dir = tempdir("ranges");
        let mut state = MeshState::new(spec(true), &dir).expect("fits");
        state.write_all().expect("written");
        for i in 0..600 {
            state.replace_endpoint(i, i).expect("replaced");
        }
        state.add_service("ns-001").expect("added");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("dir") {
            let text = std::fs::read_to_string(entry.expect("entry").path()).expect("readable");
            for ip in ipv4s(&text) {
                assert!(benchmarking(ip), "{ip} outside 198.18.0.0/15");
                assert!(!matches!(ip.octets()[3], 0 | 255), "{ip}");
                seen += 1;
            }
        }
        // 8 Services with a ClusterIP (twice) and 3 endpoints each (slice and Pod).
        assert_eq!(seen, 8 * (2 + 3 * 3));
        for i in [0, 1, 5000, 10_000, 32_000] {
            let ip = proxy_ip(i).expect("in range");
            assert!(
                benchmarking(ip) && ip.octets()[1] == 19 && ip.octets()[2] >= 128,
                "{ip}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_exhausted_range_is_an_error_not_a_wrap() {
        // 198.19.128.0/17 holds 128 * 254 usable proxy addresses.
        assert_eq!(
            proxy_ip(128 * 254 - 1).expect("last"),
            Ipv4Addr::new(198, 19, 255, 254)
        );
        let err = proxy_ip(128 * 254).expect_err("past the range");
        assert!(
            err.to_string().contains("proxy addresses exhausted"),
            "{err}"
        );
        let too_big = MeshSpec {
            services: 2,
            endpoints_per_service: 256 * 254 / 2 + 1,
            ..spec(false)
        };
        let err = MeshState::new(too_big, tempdir("exhausted")).expect_err("too many endpoints");
        assert!(
            err.to_string().contains("endpoint addresses exhausted"),
            "{err}"
        );
    }

    #[test]
    fn writes_valid_yaml_for_every_object() {
        let dir = tempdir("write");
        let state = MeshState::new(spec(true), &dir).expect("fits");
        state.write_all().expect("written");
        let ns = docs(&dir.join("namespaces.yaml"));
        assert_eq!(ns.len(), 4, "control namespace + 3 members");
        assert!(ns
            .iter()
            .all(|n| n["metadata"]["labels"][REV_LABEL] == "r1"));
        let sidecar = docs(&dir.join("sidecar-ns-001.yaml"));
        assert_eq!(sidecar[0]["spec"]["egress"][0]["hosts"][1], "shared/*");
        let svc = &state.services[1];
        let objs = docs(&dir.join(format!("svc-{}-{}.yaml", svc.namespace, svc.name)));
        let kinds: Vec<&str> = objs.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(kinds, ["Service", "EndpointSlice", "Pod", "Pod", "Pod"]);
        assert_eq!(objs[1]["endpoints"].as_array().map(Vec::len), Some(3));
        assert_eq!(objs[0]["spec"]["clusterIP"], svc.cluster_ip.to_string());
        let files = std::fs::read_dir(&dir).expect("dir").count();
        assert_eq!(files, 1 + 3 + 7);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unscoped_state_has_no_sidecars_and_services_spread_over_namespaces() {
        let dir = tempdir("unscoped");
        let state = MeshState::new(spec(false), &dir).expect("fits");
        state.write_all().expect("written");
        assert!(!dir.join("sidecar-shared.yaml").exists());
        let per_ns: Vec<usize> = state
            .namespaces
            .iter()
            .map(|ns| state.services.iter().filter(|s| &s.namespace == ns).count())
            .collect();
        assert_eq!(per_ns, [3, 2, 2]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn mutators_rewrite_files_and_allocate_unique_addresses() {
        let dir = tempdir("mutate");
        let mut state = MeshState::new(spec(true), &dir).expect("fits");
        state.write_all().expect("written");
        let before: Vec<Ipv4Addr> = state
            .services
            .iter()
            .flat_map(|s| s.endpoints.iter().map(|e| e.ip))
            .collect();
        let Mutation::EndpointReplaced {
            new_ip,
            old_ip,
            host,
            ..
        } = state.replace_endpoint(2, 1).expect("changed")
        else {
            panic!("wrong mutation kind");
        };
        assert!(!before.contains(&new_ip));
        assert_eq!(old_ip, before[2 * 3 + 1]);
        assert_eq!(host, "svc-00002.ns-002.svc.cluster.local");
        let svc = &state.services[2];
        let text =
            std::fs::read_to_string(dir.join(format!("svc-{}-{}.yaml", svc.namespace, svc.name)))
                .expect("readable");
        assert!(text.contains(&new_ip.to_string()) && !text.contains(&format!("- {old_ip}\n")));

        let Mutation::ServiceAdded {
            host, endpoint_ips, ..
        } = state.add_service("ns-001").expect("added")
        else {
            panic!("wrong mutation kind");
        };
        assert_eq!(host, "svc-00007.ns-001.svc.cluster.local");
        assert_eq!(endpoint_ips.len(), 3);
        assert!(dir.join("svc-ns-001-svc-00007.yaml").exists());

        let Mutation::ServiceRemoved { host, .. } = state.remove_service(0).expect("removed")
        else {
            panic!("wrong mutation kind");
        };
        assert_eq!(host, "svc-00000.shared.svc.cluster.local");
        assert!(!dir.join("svc-shared-svc-00000.yaml").exists());
        // No temp files are left behind.
        let leftovers = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .count();
        assert_eq!(leftovers, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
