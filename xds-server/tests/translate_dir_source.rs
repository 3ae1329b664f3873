//! The directory source against a real directory: initial state, a change, a deletion.

use std::path::PathBuf;
use std::time::Duration;

use meshplane_xds::model::{Kind, Object, SourceEvent};
use meshplane_xds::source_dir::run_dir_source;
use tokio::sync::mpsc;

/// Guards against a hang only; the test waits for events, never for time.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// Collects the events of one full resync and returns the names of its upserted objects.
async fn next_snapshot(rx: &mut mpsc::Receiver<SourceEvent>) -> Vec<String> {
    let mut names = Vec::new();
    let mut started = false;
    loop {
        let ev = tokio::time::timeout(HANG_GUARD, rx.recv())
            .await
            .expect("directory source delivers a snapshot")
            .expect("source alive");
        match ev {
            SourceEvent::Resync {
                namespace: None,
                kinds,
            } => {
                assert!(kinds.contains(&Kind::Service) && kinds.contains(&Kind::Namespace));
                started = true;
                names.clear();
            }
            SourceEvent::Upsert(obj) if started => {
                let key = obj.key();
                if let Object::Service(_) | Object::Namespace(_) | Object::ServiceEntry(_) = obj {
                    names.push(format!("{:?}/{}", key.kind, key.name));
                }
            }
            SourceEvent::Synced if started => {
                names.sort();
                return names;
            }
            _ => {}
        }
    }
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
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {ports: [{port: 80}]}\n---\napiVersion: networking.meshplane.io/v1alpha1\nkind: ServiceEntry\nmetadata: {name: invalid, namespace: shop}\nspec: {hosts: [\"*\"]}\n",
    )
    .expect("write");
    std::fs::write(dir.join("notes.txt"), "not a manifest").expect("write");

    let (tx, mut rx) = mpsc::channel(64);
    let source = tokio::spawn(run_dir_source(dir.clone(), tx));

    let first = next_snapshot(&mut rx).await;
    assert_eq!(
        first,
        vec!["Namespace/shop".to_string(), "Service/web".to_string()]
    );

    std::fs::write(
        dir.join("api.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\nspec: {ports: [{port: 81}]}\n",
    )
    .expect("write");
    let mut snapshot = next_snapshot(&mut rx).await;
    // An editor may produce several events; wait until the new file is seen.
    while !snapshot.contains(&"Service/api".to_string()) {
        snapshot = next_snapshot(&mut rx).await;
    }
    assert!(snapshot.contains(&"Service/web".to_string()));

    std::fs::remove_file(dir.join("nested/web.yml")).expect("remove");
    let mut snapshot = next_snapshot(&mut rx).await;
    while snapshot.contains(&"Service/web".to_string()) {
        snapshot = next_snapshot(&mut rx).await;
    }
    assert_eq!(
        snapshot,
        vec!["Namespace/shop".to_string(), "Service/api".to_string()]
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
    assert_eq!(
        next_snapshot(&mut rx).await,
        vec!["Service/api".to_string(), "Service/web".to_string()]
    );
    // Atomic replace: a hidden temp file renamed over the manifest.
    let tmp = dir.join("nested/.web.yaml.tmp");
    std::fs::write(&tmp, web("web2")).expect("write temp");
    std::fs::rename(&tmp, dir.join("nested/web.yaml")).expect("rename");
    let mut snapshot = next_snapshot(&mut rx).await;
    while !snapshot.contains(&"Service/web2".to_string()) {
        snapshot = next_snapshot(&mut rx).await;
    }
    // The other file's objects are still delivered; the replaced one is gone.
    assert_eq!(
        snapshot,
        vec!["Service/api".to_string(), "Service/web2".to_string()]
    );
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
