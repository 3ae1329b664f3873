//! The directory source against a real directory: initial state as one resync, then a change
//! and a deletion delivered as the changed objects only.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use meshplane_xds::metrics::Metrics;
use meshplane_xds::model::{Kind, Object, ObjectKey, SourceEvent};
use meshplane_xds::source_dir::{run_dir_source, run_dir_source_reporting};
use tokio::sync::mpsc;

/// Guards against a hang only; the test waits for events, never for time.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// What a consumer of the events holds: names of its Services, Namespaces and ServiceEntries
/// by key, and how many full resyncs it got.
#[derive(Default)]
struct Mirror {
    objects: BTreeMap<ObjectKey, String>,
    resyncs: usize,
}

impl Mirror {
    /// Applies events until `done` holds; returns the names held then, sorted.
    async fn until(
        &mut self,
        rx: &mut mpsc::Receiver<SourceEvent>,
        done: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        loop {
            let names: Vec<String> = self.objects.values().cloned().collect();
            if done(&names) {
                return names;
            }
            let ev = tokio::time::timeout(HANG_GUARD, rx.recv())
                .await
                .expect("directory source delivers the change")
                .expect("source alive");
            match ev {
                SourceEvent::Resync {
                    namespace: None,
                    kinds,
                } => {
                    assert!(kinds.contains(&Kind::Service) && kinds.contains(&Kind::Namespace));
                    self.resyncs += 1;
                    self.objects.clear();
                }
                SourceEvent::Upsert(obj) => {
                    let key = obj.key();
                    if let Object::Service(_) | Object::Namespace(_) | Object::ServiceEntry(_) = obj
                    {
                        let name = format!("{:?}/{}", key.kind, key.name);
                        self.objects.insert(key, name);
                    }
                }
                SourceEvent::Delete(key) => {
                    self.objects.remove(&key);
                }
                _ => {}
            }
        }
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "meshplane-dir-source-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("nested")).expect("create scratch dir");
    dir
}

#[tokio::test]
async fn snapshot_then_changes_then_deletions() {
    let dir = scratch_dir("changes");
    std::fs::write(
        dir.join("ns.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {meshplane.io/rev: blue}}\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("nested/web.yml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {ports: [{port: 80}]}\n",
    )
    .expect("write");
    // A file holding an invalid object is not used; the rest of the directory is.
    std::fs::write(
        dir.join("nested/invalid.yaml"),
        "apiVersion: networking.meshplane.io/v1alpha1\nkind: ServiceEntry\nmetadata: {name: invalid, namespace: shop}\nspec: {hosts: [\"*\"]}\n",
    )
    .expect("write");
    std::fs::write(dir.join("notes.txt"), "not a manifest").expect("write");

    let (tx, mut rx) = mpsc::channel(64);
    let source = tokio::spawn(run_dir_source(dir.clone(), tx));

    let mut mirror = Mirror::default();
    let first = mirror.until(&mut rx, |n| n.len() == 2).await;
    assert_eq!(first, names(&["Namespace/shop", "Service/web"]));

    std::fs::write(
        dir.join("api.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\nspec: {ports: [{port: 81}]}\n",
    )
    .expect("write");
    let held = mirror
        .until(&mut rx, |n| n.contains(&"Service/api".to_string()))
        .await;
    assert_eq!(
        held,
        names(&["Namespace/shop", "Service/api", "Service/web"])
    );

    std::fs::remove_file(dir.join("nested/web.yml")).expect("remove");
    let held = mirror
        .until(&mut rx, |n| !n.contains(&"Service/web".to_string()))
        .await;
    assert_eq!(held, names(&["Namespace/shop", "Service/api"]));
    assert_eq!(
        mirror.resyncs, 1,
        "changes come as changed objects, not resyncs"
    );

    drop(rx);
    // With the receiver gone the source ends cleanly at its next change.
    std::fs::write(dir.join("poke.yaml"), "").expect("write");
    let result = tokio::time::timeout(HANG_GUARD, source)
        .await
        .expect("source stops")
        .expect("no panic");
    assert!(result.is_ok(), "{result:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Given as a relative path (as `scripts/bench.sh` does), the directory still delivers a change
/// as the changed objects: the file watcher reports absolute paths, which once fell outside the
/// relative root and made every change a full re-read.
#[tokio::test]
async fn a_relative_directory_delivers_changes_not_resyncs() {
    let dir = scratch_dir("relative");
    let cwd = std::env::current_dir().expect("cwd");
    let up = "../".repeat(cwd.components().count().saturating_sub(1));
    let relative = PathBuf::from(up).join(dir.strip_prefix("/").expect("absolute scratch dir"));
    assert!(relative.is_relative());
    let svc = |name: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{ports: [{{port: 80}}]}}\n")
    };
    std::fs::write(dir.join("a.yaml"), svc("a")).expect("write");
    let (tx, mut rx) = mpsc::channel(64);
    let source = tokio::spawn(run_dir_source(relative, tx));
    let mut mirror = Mirror::default();
    mirror.until(&mut rx, |n| n.len() == 1).await;
    std::fs::write(dir.join(".b.yaml.tmp"), svc("b")).expect("write");
    std::fs::rename(dir.join(".b.yaml.tmp"), dir.join("b.yaml")).expect("rename");
    std::fs::write(dir.join("c.yaml"), svc("c")).expect("write");
    let held = mirror.until(&mut rx, |n| n.len() == 3).await;
    assert_eq!(held, names(&["Service/a", "Service/b", "Service/c"]));
    assert_eq!(
        mirror.resyncs, 1,
        "changes come as changed objects, not resyncs"
    );
    source.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A truncated manifest renamed into place (an interrupted copy) and a garbled namespace file
/// delete nothing: the running source keeps their last good objects and goes on delivering
/// the changes of other files, counting the damaged files in `meshplane_xds_unusable_manifests`;
/// fixing a file delivers what it now holds.
#[tokio::test]
async fn a_damaged_manifest_keeps_its_objects_while_other_changes_flow() {
    let dir = scratch_dir("damaged");
    let svc = |name: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{ports: [{{port: 80}}]}}\n")
    };
    let many: String = (0..20)
        .map(|i| svc(&format!("s{i:02}")))
        .collect::<Vec<_>>()
        .join("---\n");
    std::fs::write(
        dir.join("ns.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {meshplane.io/rev: blue}}\n",
    )
    .expect("write");
    std::fs::write(dir.join("many.yaml"), &many).expect("write");
    let (tx, mut rx) = mpsc::channel(256);
    let metrics = Arc::new(Metrics::for_instance("blue", "blue-v1"));
    let unusable = || {
        let text = metrics.encode().expect("metrics");
        text.lines()
            .find_map(|l| l.strip_prefix("meshplane_xds_unusable_manifests{"))
            .and_then(|rest| rest.rsplit(' ').next())
            .and_then(|v| v.trim().parse::<i64>().ok())
            .unwrap_or_else(|| panic!("no unusable_manifests in\n{text}"))
    };
    let source = tokio::spawn(run_dir_source_reporting(
        dir.clone(),
        tx,
        Some(Arc::clone(&metrics)),
    ));
    let mut mirror = Mirror::default();
    let first = mirror.until(&mut rx, |n| n.len() == 21).await;
    assert_eq!(unusable(), 0);

    let tmp = dir.join(".many.yaml.tmp");
    let cut = many.find("{name: s10").expect("s10") + 8;
    std::fs::write(&tmp, &many[..cut]).expect("write");
    std::fs::rename(&tmp, dir.join("many.yaml")).expect("rename");
    std::fs::write(
        dir.join("ns.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: [shop",
    )
    .expect("write");
    // Events arrive in order: once a later change is in, the damage's reads are in too.
    std::fs::write(dir.join("later.yaml"), svc("later")).expect("write");
    let held = mirror
        .until(&mut rx, |n| n.contains(&"Service/later".to_string()))
        .await;
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let mut expected = first.clone();
    expected.push("Service/later".to_string());
    assert_eq!(
        sorted(held),
        sorted(expected),
        "nothing of the damaged files was deleted"
    );
    assert_eq!(unusable(), 2, "many.yaml and ns.yaml");

    std::fs::write(dir.join("many.yaml"), svc("s00")).expect("write");
    let held = mirror.until(&mut rx, |n| n.len() == 3).await;
    assert_eq!(
        sorted(held),
        names(&["Namespace/shop", "Service/later", "Service/s00"])
    );
    assert_eq!(unusable(), 1, "ns.yaml is still garbled");
    assert_eq!(mirror.resyncs, 1);
    source.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_file_renamed_into_place_is_read_again() {
    let dir = scratch_dir("rename");
    let web = |name: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{ports: [{{port: 80}}]}}\n")
    };
    std::fs::write(dir.join("nested/web.yaml"), web("web")).expect("write");
    std::fs::write(dir.join("api.yaml"), web("api")).expect("write");
    let (tx, mut rx) = mpsc::channel(64);
    let source = tokio::spawn(run_dir_source(dir.clone(), tx));
    let mut mirror = Mirror::default();
    let first = mirror.until(&mut rx, |n| n.len() == 2).await;
    assert_eq!(first, names(&["Service/api", "Service/web"]));
    // Atomic replace: a hidden temp file renamed over the manifest.
    let tmp = dir.join("nested/.web.yaml.tmp");
    std::fs::write(&tmp, web("web2")).expect("write temp");
    std::fs::rename(&tmp, dir.join("nested/web.yaml")).expect("rename");
    // The other file's objects are kept; the replaced one is gone.
    let held = mirror
        .until(&mut rx, |n| {
            n.contains(&"Service/web2".to_string()) && !n.contains(&"Service/web".to_string())
        })
        .await;
    assert_eq!(held, names(&["Service/api", "Service/web2"]));
    source.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_missing_directory_is_a_typed_error() {
    let (tx, _rx) = mpsc::channel(4);
    let err = run_dir_source("/nonexistent/meshplane-manifests", tx)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/meshplane-manifests"),
        "{err}"
    );
}
