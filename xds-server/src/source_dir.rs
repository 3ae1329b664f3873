//! The directory source (`--source dir:PATH`): Kubernetes-style YAML manifests in a directory
//! tree, watched for changes. The standalone mode for local runs, VMs and tests.
//!
//! Every `*.yaml`/`*.yml` file under the directory (multi-document) is read and delivered as one
//! full resync (`Resync` of every kind, the objects, `Synced`, then `Ready`). After a change only
//! the files named by the file events are read again, and only their objects are delivered: an
//! `Upsert` per object they hold now, a `Delete` per object no file holds any more (an object
//! held by several files is the one of the last file in path order). Files written in place are
//! read once their events have been quiet for [`DEBOUNCE`]; files renamed into place, the way
//! atomic writers replace them, are read as soon as their events arrive. A file is used whole or
//! not at all: when it is not valid YAML, cannot be read, or holds a document that does not
//! decode or fails `meshplane_crds::validation`, none of it is taken, the objects it last held
//! stay (a truncated or half-edited file never deletes them), and a warning names the file and
//! each problem whenever it is read, until it is fixed. A file cut exactly between documents
//! still reads as a shorter manifest: only what does not parse or validate is caught. Documents
//! are decoded by `meshplane_xds_core::manifest` (the kinds of [`Kind::ALL`](meshplane_xds_core::model::Kind::ALL); a namespaced object
//! without a namespace lands in `default`, as with kubectl).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;

use meshplane_xds_core::manifest::{self, is_manifest};
pub use meshplane_xds_core::manifest::{
    decode_document, objects_from_yaml, read_manifest, Manifest, SkippedObject,
};

use crate::model::{Kind, Object, ObjectKey, SourceEvent};

/// Quiet time after the last file event before files written in place are read. Only long
/// enough to coalesce the several events of one write; files renamed into place are read at
/// once ([`Batch`]); the push loop does the batching.
pub const DEBOUNCE: Duration = Duration::from_millis(20);

/// Longest a burst of file events may delay a read of the changed files.
pub const DEBOUNCE_MAX: Duration = Duration::from_millis(200);

/// Whether a file event means the manifests may have changed (not a read or an attribute change).
fn changes_content(kind: &notify::EventKind) -> bool {
    use notify::event::ModifyKind;
    !matches!(
        kind,
        notify::EventKind::Access(_) | notify::EventKind::Modify(ModifyKind::Metadata(_))
    )
}

/// Why the directory source stopped.
#[derive(Debug, thiserror::Error)]
pub enum DirSourceError {
    /// The directory cannot be read.
    #[error("cannot read manifest directory {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The directory cannot be watched.
    #[error("cannot watch manifest directory {path}: {source}")]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// Reads every manifest under `dir`, in path order, leaving out (with a warning) the files
/// that are not usable.
pub fn load_dir(dir: &Path) -> Result<Vec<Object>, DirSourceError> {
    Ok(DirState::load(dir)?.objects())
}

/// What one read of a manifest file found.
#[derive(Debug)]
enum FileRead {
    /// Every document decoded and passed validation (documents of kinds the xds-server does
    /// not read are ignored); a file that is gone holds nothing.
    Usable(Vec<Object>),
    /// The file is not used; each problem says what is wrong and where.
    Unusable(Vec<String>),
}

fn read_file(file: &Path) -> FileRead {
    match std::fs::read_to_string(file) {
        Ok(text) => {
            let Manifest { objects, problems } = read_manifest(&text);
            if problems.is_empty() {
                FileRead::Usable(objects)
            } else {
                FileRead::Unusable(problems)
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileRead::Usable(Vec::new()),
        Err(e) => FileRead::Unusable(vec![format!("not readable: {e}")]),
    }
}

/// The manifests of a directory, file by file, so that a file event re-reads only the files
/// it names.
#[derive(Debug)]
pub struct DirState {
    root: PathBuf,
    /// The objects each file contributes: what it holds, or for an unusable file what it held
    /// when it was last usable.
    files: BTreeMap<PathBuf, Vec<Object>>,
    /// The files that are not usable now, with their problems.
    unusable: BTreeMap<PathBuf, Vec<String>>,
    /// The files holding each object, so a change finds the object that now applies.
    holders: BTreeMap<ObjectKey, BTreeSet<PathBuf>>,
}

impl DirState {
    /// Reads every manifest under `root`; unusable files contribute nothing.
    pub fn load(root: &Path) -> Result<Self, DirSourceError> {
        Self::load_keeping(root, None)
    }

    /// Reads every manifest under `root`; an unusable file keeps what it contributes to
    /// `previous`.
    fn load_keeping(root: &Path, previous: Option<&DirState>) -> Result<Self, DirSourceError> {
        let mut paths = Vec::new();
        collect_files(root, &mut paths)?;
        let mut files: BTreeMap<PathBuf, Vec<Object>> = BTreeMap::new();
        let mut unusable = BTreeMap::new();
        for path in paths {
            let objects = match read_file(&path) {
                FileRead::Usable(objects) => objects,
                FileRead::Unusable(problems) => {
                    let kept = previous
                        .and_then(|p| p.files.get(&path))
                        .cloned()
                        .unwrap_or_default();
                    warn_unusable(&path, &problems, kept.len());
                    unusable.insert(path.clone(), problems);
                    kept
                }
            };
            files.insert(path, objects);
        }
        let mut holders: BTreeMap<ObjectKey, BTreeSet<PathBuf>> = BTreeMap::new();
        for (path, objects) in &files {
            for o in objects {
                holders.entry(o.key()).or_default().insert(path.clone());
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            files,
            unusable,
            holders,
        })
    }

    /// The files that are not used now, with what is wrong in each, in path order.
    pub fn unusable_files(&self) -> &BTreeMap<PathBuf, Vec<String>> {
        &self.unusable
    }

    /// Every object, in path order (a later file's object replaces an earlier one's).
    pub fn objects(&self) -> Vec<Object> {
        self.files.values().flatten().cloned().collect()
    }

    /// Number of manifest files held.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Re-reads what changed at `paths`: files or directories, created, modified, renamed
    /// (either name) or removed. Returns the events that bring a consumer of the previous state
    /// to the new one: `Upsert`s of the objects the changed files hold and `Delete`s of the
    /// objects no file holds any more. A path outside the directory (or the directory itself)
    /// reads everything again and returns a full resync. On an error nothing changes.
    pub fn update<'a>(
        &mut self,
        paths: impl IntoIterator<Item = &'a PathBuf>,
    ) -> Result<Vec<SourceEvent>, DirSourceError> {
        let mut read: BTreeMap<PathBuf, Vec<Object>> = BTreeMap::new();
        let mut dropped: Vec<PathBuf> = Vec::new();
        for path in paths {
            let Ok(rel) = path.strip_prefix(&self.root) else {
                return self.reload();
            };
            if rel.as_os_str().is_empty() {
                return self.reload();
            }
            // Paths and everything below them are read again; hidden ones are not manifests.
            dropped.push(path.clone());
            if is_hidden(rel) {
                continue;
            }
            if path.is_dir() {
                let mut found = Vec::new();
                collect_files(path, &mut found)?;
                for f in found {
                    read.entry(f).or_default();
                }
            } else if is_manifest(path) && path.is_file() {
                read.entry(path.clone()).or_default();
            }
        }
        // An unusable file stays as it was: what it contributed is kept, nothing is re-sent.
        let mut kept: BTreeSet<PathBuf> = BTreeSet::new();
        let mut problems: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
        read.retain(|file, objects| match read_file(file) {
            FileRead::Usable(found) => {
                *objects = found;
                true
            }
            FileRead::Unusable(found) => {
                let held = self.files.get(file).map_or(0, Vec::len);
                warn_unusable(file, &found, held);
                kept.insert(file.clone());
                problems.insert(file.clone(), found);
                false
            }
        });
        for path in &dropped {
            for p in below(&self.unusable, path) {
                self.unusable.remove(&p);
            }
        }
        self.unusable.extend(problems);
        let mut affected: BTreeSet<ObjectKey> = BTreeSet::new();
        for path in dropped {
            let gone = below(&self.files, &path)
                .into_iter()
                .filter(|p| !kept.contains(p));
            for p in gone {
                for o in self.files.remove(&p).unwrap_or_default() {
                    let key = o.key();
                    if let Some(h) = self.holders.get_mut(&key) {
                        h.remove(&p);
                        if h.is_empty() {
                            self.holders.remove(&key);
                        }
                    }
                    affected.insert(key);
                }
            }
        }
        for (path, objects) in &read {
            for o in objects {
                let key = o.key();
                self.holders
                    .entry(key.clone())
                    .or_default()
                    .insert(path.clone());
                affected.insert(key);
            }
        }
        self.files.extend(read);
        Ok(affected
            .into_iter()
            .map(|key| match self.current(&key) {
                Some(o) => SourceEvent::Upsert(o.clone()),
                None => SourceEvent::Delete(key),
            })
            .collect())
    }

    /// The object that applies for `key`: the last one of the last file holding it.
    fn current(&self, key: &ObjectKey) -> Option<&Object> {
        let path = self.holders.get(key)?.last()?;
        self.files.get(path)?.iter().rev().find(|o| o.key() == *key)
    }

    /// Reads everything again; the events are a full resync.
    fn reload(&mut self) -> Result<Vec<SourceEvent>, DirSourceError> {
        tracing::debug!(dir = %self.root.display(), "manifest directory read again in full");
        *self = Self::load_keeping(&self.root, Some(self))?;
        Ok(self.resync_events())
    }

    /// The whole state as one resync: `Resync` of every kind, every object, `Synced`.
    pub fn resync_events(&self) -> Vec<SourceEvent> {
        std::iter::once(SourceEvent::Resync {
            namespace: None,
            kinds: Kind::ALL.to_vec(),
        })
        .chain(self.objects().into_iter().map(SourceEvent::Upsert))
        .chain(std::iter::once(SourceEvent::Synced))
        .collect()
    }
}

/// The keys of `map` at or below `path`.
fn below<V>(map: &BTreeMap<PathBuf, V>, path: &Path) -> Vec<PathBuf> {
    map.range(path.to_path_buf()..)
        .take_while(|(p, _)| p.starts_with(path))
        .map(|(p, _)| p.clone())
        .collect()
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DirSourceError> {
    let entries = std::fs::read_dir(dir).map_err(|source| DirSourceError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if manifest::is_hidden(&name) {
            continue;
        }
        if path.is_dir() {
            collect_files(&path, out)?;
        } else if is_manifest(&path) {
            out.push(path);
        }
    }
    Ok(())
}

/// Every manifest file under `dir` (`*.yaml`/`*.yml`, hidden entries skipped), in path order:
/// the files the directory source reads.
pub fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>, DirSourceError> {
    let mut paths = Vec::new();
    collect_files(dir, &mut paths)?;
    paths.sort();
    Ok(paths)
}

fn warn_unusable(file: &Path, problems: &[String], kept: usize) {
    for problem in problems {
        tracing::warn!(
            file = %file.display(),
            problem = %problem,
            kept_objects = kept,
            "manifest file not used until it is fixed; the objects it last held stay"
        );
    }
}

/// Sends events in order; false when the receiver is gone.
async fn send_all(events: Vec<SourceEvent>, tx: &mpsc::Sender<SourceEvent>) -> bool {
    for ev in events {
        if tx.send(ev).await.is_err() {
            return false;
        }
    }
    true
}

/// Sends the directory's full state as one resync; false when the receiver is gone.
async fn send_snapshot(state: &DirState, tx: &mpsc::Sender<SourceEvent>) -> bool {
    tracing::info!(
        dir = %state.root.display(),
        files = state.file_count(),
        unusable = state.unusable.len(),
        objects = state.holders.len(),
        "manifest directory read"
    );
    send_all(state.resync_events(), tx).await
}

/// What the watcher reports: changed paths, or that everything must be read again.
#[derive(Debug)]
enum FsChange {
    /// `whole`: the paths were replaced or removed in one step (a rename onto them, a removal),
    /// so what is there now is complete; otherwise they may still be being written.
    Paths {
        paths: Vec<PathBuf>,
        whole: bool,
    },
    Rescan,
}

impl FsChange {
    fn of(ev: notify::Event) -> Self {
        use notify::event::{ModifyKind, RenameMode};
        use notify::EventKind;
        if ev.need_rescan() || ev.paths.is_empty() {
            return FsChange::Rescan;
        }
        let whole = matches!(
            ev.kind,
            EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both))
                | EventKind::Remove(_)
        );
        FsChange::Paths {
            paths: ev.paths,
            whole,
        }
    }
}

/// The file events of one read of the directory, gathered while the debounce waits.
///
/// The wait exists for files written in place (an editor's several writes): reading one
/// halfway would see part of its objects. A writer that renames a finished file into place
/// (what `kubectl`-style tools and the bench's generator do) leaves nothing half-written, so
/// once every visible path of the batch was last replaced whole the batch is read at once:
/// the push loop's own debounce still batches what follows.
#[derive(Debug, Default)]
struct Batch {
    /// The watched directory: hidden is decided below it, as for reads.
    root: PathBuf,
    changed: BTreeSet<PathBuf>,
    rescan: bool,
    /// Visible paths whose last event was an in-place change.
    written_in_place: BTreeSet<PathBuf>,
    /// Whether a visible path was replaced or removed whole.
    replaced: bool,
}

impl Batch {
    fn new(root: &Path, rescan: bool) -> Self {
        Batch {
            root: root.to_path_buf(),
            rescan,
            ..Batch::default()
        }
    }

    fn note(&mut self, change: FsChange) {
        match change {
            FsChange::Paths { paths, whole } => {
                for path in paths {
                    // A path outside the root makes the read take everything: wait for quiet.
                    if !path.strip_prefix(&self.root).is_ok_and(is_hidden) {
                        if whole {
                            self.written_in_place.remove(&path);
                            self.replaced = true;
                        } else {
                            self.written_in_place.insert(path.clone());
                        }
                    }
                    self.changed.insert(path);
                }
            }
            FsChange::Rescan => self.rescan = true,
        }
    }

    /// Whether the batch can be read without waiting for quiet: a manifest was replaced whole
    /// and none is being written in place.
    fn complete(&self) -> bool {
        !self.rescan && self.replaced && self.written_in_place.is_empty()
    }
}

/// Whether a path below the root is hidden (a rename's temporary file, an editor's swap file,
/// anything in a dot directory): not a manifest, never read, and its writes never hold a read
/// back.
fn is_hidden(rel: &Path) -> bool {
    rel.components().any(|c| manifest::is_hidden(c.as_os_str()))
}

/// Runs the directory source until the receiver is dropped: the initial state, `Ready`, then
/// the changed objects after every (debounced) change under `path`, re-reading only the
/// changed files.
pub async fn run_dir_source(
    path: impl AsRef<Path>,
    tx: mpsc::Sender<SourceEvent>,
) -> Result<(), DirSourceError> {
    run_dir_source_reporting(path, tx, None).await
}

/// [`run_dir_source`], keeping `meshplane_xds_unusable_manifests` of `metrics` at the number
/// of files whose last good objects stand in for them.
pub async fn run_dir_source_reporting(
    path: impl AsRef<Path>,
    tx: mpsc::Sender<SourceEvent>,
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
) -> Result<(), DirSourceError> {
    use notify::Watcher as _;
    let report = |state: &DirState| {
        if let Some(m) = &metrics {
            m.set_unusable_manifests(state.unusable.len());
        }
    };
    // notify reports a relative directory's events under the working directory joined with it;
    // the state's root must be that same absolute path, or no changed path falls under it and
    // every change reads the whole directory again.
    let dir = std::path::absolute(path.as_ref()).map_err(|source| DirSourceError::Read {
        path: path.as_ref().to_path_buf(),
        source,
    })?;
    let (fs_tx, mut fs_rx) = mpsc::unbounded_channel::<FsChange>();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let change = match res {
            // Reading the manifests changes their access time (a metadata event); only
            // content, name, creation and removal events mean the directory changed.
            Ok(ev) if changes_content(&ev.kind) => FsChange::of(ev),
            Ok(_) => return,
            Err(e) => {
                // Events may have been lost: read everything again.
                tracing::warn!(error = %e, "manifest directory watch error");
                FsChange::Rescan
            }
        };
        // The receiver only goes away when the source stops.
        let _ = fs_tx.send(change);
    })
    .map_err(|source| DirSourceError::Watch {
        path: dir.clone(),
        source,
    })?;
    watcher
        .watch(&dir, notify::RecursiveMode::Recursive)
        .map_err(|source| DirSourceError::Watch {
            path: dir.clone(),
            source,
        })?;

    let mut state = DirState::load(&dir)?;
    report(&state);
    if !send_snapshot(&state, &tx).await || tx.send(SourceEvent::Ready).await.is_err() {
        return Ok(());
    }
    // After a failed read the events it covered are gone: the next read takes everything.
    let mut failed = false;
    loop {
        let mut batch = Batch::new(&dir, failed);
        tokio::select! {
            ev = fs_rx.recv() => match ev {
                Some(change) => batch.note(change),
                None => return Ok(()),
            },
            _ = tx.closed() => return Ok(()),
        }
        // Debounce: wait for a quiet period so an editor's burst of writes is read once, but
        // never longer than DEBOUNCE_MAX, so a steady stream of changes cannot starve readers;
        // a batch of files replaced whole is read as soon as the events already queued are in.
        let deadline = tokio::time::Instant::now() + DEBOUNCE_MAX;
        loop {
            while let Ok(change) = fs_rx.try_recv() {
                batch.note(change);
            }
            if batch.complete() || tokio::time::Instant::now() >= deadline {
                break;
            }
            let quiet = (tokio::time::Instant::now() + DEBOUNCE).min(deadline);
            match tokio::time::timeout_at(quiet, fs_rx.recv()).await {
                Ok(Some(change)) => {
                    batch.note(change);
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                }
                Ok(None) => return Ok(()),
                Err(_) => break,
            }
        }
        let Batch {
            changed, rescan, ..
        } = batch;
        let result = if rescan {
            DirState::load_keeping(&dir, Some(&state)).map(|fresh| {
                state = fresh;
                state.resync_events()
            })
        } else {
            state.update(&changed)
        };
        failed = result.is_err();
        report(&state);
        let events = match result {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(error = %e, "manifest directory not readable; keeping the last state");
                continue;
            }
        };
        tracing::debug!(
            files = changed.len(),
            events = events.len(),
            "manifest directory changed"
        );
        if !send_all(events, &tx).await {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_attribute_changes_do_not_trigger_a_reload() {
        use notify::event::{
            AccessKind, CreateKind, DataChange, MetadataKind, ModifyKind, RemoveKind, RenameMode,
        };
        use notify::EventKind;
        assert!(!changes_content(&EventKind::Access(AccessKind::Any)));
        assert!(!changes_content(&EventKind::Modify(ModifyKind::Metadata(
            MetadataKind::AccessTime
        ))));
        assert!(changes_content(&EventKind::Modify(ModifyKind::Data(
            DataChange::Content
        ))));
        assert!(changes_content(&EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        ))));
        assert!(changes_content(&EventKind::Create(CreateKind::File)));
        assert!(changes_content(&EventKind::Remove(RemoveKind::File)));
    }

    fn svc(name: &str, port: u16) -> String {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{ports: [{{port: {port}}}]}}\n")
    }

    fn names(objects: &[Object]) -> Vec<String> {
        objects.iter().map(|o| format!("{o:?}")).collect()
    }

    /// The object that applies per key (a later one replaces an earlier one).
    fn effective(objects: &[Object]) -> BTreeMap<ObjectKey, String> {
        objects
            .iter()
            .map(|o| (o.key(), format!("{o:?}")))
            .collect()
    }

    fn fs(paths: &[&str], whole: bool) -> FsChange {
        FsChange::Paths {
            paths: paths.iter().map(PathBuf::from).collect(),
            whole,
        }
    }

    #[test]
    fn a_batch_is_complete_once_what_it_touched_was_replaced_whole() {
        let batch = |changes: Vec<FsChange>| {
            let mut b = Batch::new(Path::new("/m"), false);
            for c in changes {
                b.note(c);
            }
            b
        };
        // An atomic writer: its hidden temporary file, then the rename onto the manifest.
        let tmp = "/m/.a.yaml.tmp";
        assert!(
            !batch(vec![fs(&[tmp], false)]).complete(),
            "nothing visible yet"
        );
        assert!(batch(vec![fs(&[tmp], false), fs(&["/m/a.yaml"], true)]).complete());
        assert!(batch(vec![fs(&[tmp, "/m/a.yaml"], true)]).complete());
        // A manifest written in place waits for quiet, even beside a rename ...
        assert!(!batch(vec![fs(&["/m/b.yaml"], false)]).complete());
        assert!(!batch(vec![fs(&["/m/b.yaml"], false), fs(&["/m/a.yaml"], true)]).complete());
        // ... unless it was itself replaced (or removed) after the write.
        assert!(batch(vec![fs(&["/m/b.yaml"], false), fs(&["/m/b.yaml"], true)]).complete());
        assert!(!batch(vec![fs(&["/m/a.yaml"], true), fs(&["/m/a.yaml"], false)]).complete());
        // Writes below a dot directory are not manifests and hold nothing back.
        let hidden = "/m/..data/b.yaml";
        assert!(batch(vec![fs(&[hidden], false), fs(&["/m/a.yaml"], true)]).complete());
        // Lost events: everything is read again after the quiet wait.
        assert!(!batch(vec![fs(&["/m/a.yaml"], true), FsChange::Rescan]).complete());
    }

    /// What the kernel reports for the two ways of writing a manifest, read through notify.
    #[test]
    fn a_rename_into_place_completes_a_batch_and_a_write_in_place_does_not() {
        use notify::Watcher as _;
        let dir = std::env::temp_dir().join(format!("meshplane-dirbatch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let (tx, rx) = std::sync::mpsc::channel();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let _ = tx.send(res);
        })
        .expect("watcher");
        watcher
            .watch(&dir, notify::RecursiveMode::Recursive)
            .expect("watch");
        // The events until `path` shows up in the batch (at most 10 s).
        let collect = |path: &Path| {
            let mut batch = Batch::new(&dir, false);
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while !batch.changed.contains(path) {
                let left = end.saturating_duration_since(std::time::Instant::now());
                match rx.recv_timeout(left) {
                    Ok(Ok(ev)) if changes_content(&ev.kind) => batch.note(FsChange::of(ev)),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            batch
        };
        let a = dir.join("a.yaml");
        let tmp = dir.join(".a.yaml.tmp");
        std::fs::write(&tmp, svc("a", 80)).expect("write");
        std::fs::rename(&tmp, &a).expect("rename");
        let batch = collect(&a);
        assert!(batch.changed.contains(&a), "{batch:?}");
        assert!(batch.complete(), "{batch:?}");
        let b = dir.join("b.yaml");
        std::fs::write(&b, svc("b", 80)).expect("write");
        let batch = collect(&b);
        assert!(batch.changed.contains(&b), "{batch:?}");
        assert!(!batch.complete(), "{batch:?}");
        drop(watcher);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_change_delivers_only_its_objects() {
        let dir = std::env::temp_dir().join(format!("meshplane-dirdiff-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        for i in 0..20 {
            std::fs::write(dir.join(format!("s{i}.yaml")), svc(&format!("s{i}"), 80))
                .expect("write");
        }
        let mut state = DirState::load(&dir).expect("load");
        assert_eq!(
            state.resync_events().len(),
            22,
            "Resync, 20 objects, Synced"
        );
        std::fs::write(dir.join("s3.yaml"), svc("s3", 81)).expect("write");
        let events = state.update(&[dir.join("s3.yaml")]).expect("update");
        assert_eq!(events.len(), 1);
        assert!(
            matches!(&events[0], SourceEvent::Upsert(Object::Service(s)) if s.metadata.name.as_deref() == Some("s3"))
        );
        std::fs::remove_file(dir.join("s4.yaml")).expect("rm");
        let events = state.update(&[dir.join("s4.yaml")]).expect("update");
        assert!(matches!(&events[..], [SourceEvent::Delete(k)] if k.name == "s4"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn updates_reread_only_the_named_paths_and_match_a_full_read() {
        let dir = std::env::temp_dir().join(format!("meshplane-dirstate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("nested")).expect("mkdir");
        let p = |rel: &str| dir.join(rel);
        let write = |rel: &str, text: &str| std::fs::write(p(rel), text).expect("write");
        write("a.yaml", &svc("a", 80));
        let mut state = DirState::load(&dir).expect("load");
        // What a consumer of the events holds: it must end up with what a full read gives.
        let mut mirror = effective(&state.objects());
        let mut check = |state: &mut DirState, paths: &[PathBuf], what: &str| {
            let events = state.update(paths).expect("update");
            let full = load_dir(&dir).expect("full read");
            assert_eq!(names(&state.objects()), names(&full), "{what}");
            for e in events {
                match e {
                    SourceEvent::Upsert(o) => {
                        mirror.insert(o.key(), format!("{o:?}"));
                    }
                    SourceEvent::Delete(k) => {
                        mirror.remove(&k);
                    }
                    SourceEvent::Resync { .. } => mirror.clear(),
                    _ => {}
                }
            }
            assert_eq!(mirror, effective(&full), "{what}: events");
        };
        write("nested/b.yml", &svc("b", 80));
        check(&mut state, &[p("nested/b.yml")], "create in a subdirectory");
        // Only named paths are read again.
        write("a.yaml", &svc("a", 81));
        let stale = names(&state.objects());
        assert!(state.update(&[]).expect("update").is_empty());
        assert_eq!(names(&state.objects()), stale);
        check(&mut state, &[p("a.yaml")], "modify");
        // Write to a hidden temp file, then rename it into place (how the bench mutates).
        write(".a.yaml.tmp", &svc("a2", 82));
        check(&mut state, &[p(".a.yaml.tmp")], "hidden temp file");
        std::fs::rename(p(".a.yaml.tmp"), p("a.yaml")).expect("rename");
        check(
            &mut state,
            &[p(".a.yaml.tmp"), p("a.yaml")],
            "rename into place",
        );
        assert!(format!("{:?}", state.objects()).contains("a2"));
        // A directory renamed, one staged under a hidden name and renamed in, removals.
        std::fs::rename(p("nested"), p("moved")).expect("rename dir");
        check(&mut state, &[p("nested"), p("moved")], "directory renamed");
        std::fs::create_dir_all(p(".stage/deep")).expect("mkdir");
        write(".stage/deep/c.yaml", &svc("c", 80));
        write(".stage/notes.txt", "not a manifest");
        std::fs::rename(p(".stage"), p("new")).expect("rename dir");
        check(&mut state, &[p(".stage"), p("new")], "directory renamed in");
        // The same object in two files: the later path wins, as with a full read.
        write("z.yaml", &svc("a2", 90));
        check(&mut state, &[p("z.yaml")], "duplicate object");
        std::fs::remove_file(p("moved/b.yml")).expect("rm");
        check(&mut state, &[p("moved/b.yml")], "file removed");
        std::fs::remove_dir_all(p("new")).expect("rm dir");
        check(&mut state, &[p("new")], "directory removed");
        // A broken file changes nothing; once fixed it reads like any other.
        write("a.yaml", "a: [unclosed");
        let held = names(&state.objects());
        assert!(state.update(&[p("a.yaml")]).expect("update").is_empty());
        assert_eq!(names(&state.objects()), held, "broken file");
        write("a.yaml", &svc("a3", 83));
        check(&mut state, &[p("a.yaml")], "broken file fixed");
        // Unknown paths (outside, or the directory itself) read everything.
        write("moved/d.yaml", &svc("d", 80));
        check(
            &mut state,
            &[PathBuf::from("/elsewhere/x.yaml")],
            "path outside",
        );
        write("moved/d.yaml", &svc("d", 81));
        check(
            &mut state,
            std::slice::from_ref(&dir),
            "the directory itself",
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A manifest of `n` Services in namespace `shop`.
    fn services(n: usize) -> String {
        (0..n)
            .map(|i| svc(&format!("s{i}"), 80))
            .collect::<Vec<_>>()
            .join("---\n")
    }

    fn held_names(state: &DirState) -> Vec<String> {
        state.objects().iter().map(|o| o.key().name).collect()
    }

    #[test]
    fn a_damaged_file_keeps_its_last_good_objects_until_it_is_fixed() {
        let dir = std::env::temp_dir().join(format!("meshplane-dirgood-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let ns = dir.join("ns.yaml");
        let many = dir.join("many.yaml");
        let namespace = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {meshplane.io/rev: blue}}\n";
        std::fs::write(&ns, namespace).expect("write");
        let text = services(30);
        std::fs::write(&many, &text).expect("write");
        let mut state = DirState::load(&dir).expect("load");
        assert_eq!(state.objects().len(), 31);
        let before = names(&state.objects());

        // Truncated mid-document and renamed into place, as an interrupted copy leaves it.
        let tmp = dir.join(".many.yaml.tmp");
        let cut = text.find("{name: s15").expect("s15") + 8;
        std::fs::write(&tmp, &text[..cut]).expect("write");
        std::fs::rename(&tmp, &many).expect("rename");
        let events = state.update(&[tmp.clone(), many.clone()]).expect("update");
        assert!(events.is_empty(), "nothing deleted or re-sent: {events:?}");
        assert_eq!(names(&state.objects()), before);
        let problems = &state.unusable_files()[&many];
        assert_eq!(problems.len(), 1, "{problems:?}");

        // A garbled namespace file keeps the namespace (and with it its proxies' membership).
        std::fs::write(
            &ns,
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: [shop",
        )
        .expect("write");
        assert!(state
            .update(std::slice::from_ref(&ns))
            .expect("update")
            .is_empty());
        assert!(held_names(&state).contains(&"shop".to_string()));
        assert_eq!(state.unusable_files().len(), 2);

        // A full read again (lost events) keeps them too.
        let events = state.update(std::slice::from_ref(&dir)).expect("update");
        let upserts = events
            .iter()
            .filter(|e| matches!(e, SourceEvent::Upsert(_)))
            .count();
        assert_eq!(upserts, 31, "the resync still holds every kept object");
        assert_eq!(state.unusable_files().len(), 2);

        // Fixed with fewer objects: the ones it no longer holds go, the problem is cleared.
        std::fs::write(&many, services(28)).expect("write");
        let events = state.update(std::slice::from_ref(&many)).expect("update");
        let deleted: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                SourceEvent::Delete(k) => Some(k.name.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(deleted, vec!["s28".to_string(), "s29".to_string()]);
        assert!(!state.unusable_files().contains_key(&many));
        // Removing a broken file removes what it held.
        std::fs::remove_file(&ns).expect("rm");
        let events = state.update(std::slice::from_ref(&ns)).expect("update");
        assert!(matches!(&events[..], [SourceEvent::Delete(k)] if k.name == "shop"));
        assert!(state.unusable_files().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_manifest_with_one_invalid_document_is_not_used_and_says_why() {
        let yaml = format!(
            "{}---\napiVersion: networking.meshplane.io/v1alpha1\nkind: ServiceEntry\nmetadata: {{name: bad, namespace: shop}}\nspec: {{hosts: [\"*\"]}}\n",
            svc("web", 80)
        );
        let manifest = read_manifest(&yaml);
        assert_eq!(manifest.objects.len(), 1);
        assert_eq!(manifest.problems.len(), 1);
        assert!(
            manifest.problems[0].starts_with("ServiceEntry shop/bad: "),
            "{:?}",
            manifest.problems
        );
        let dir = std::env::temp_dir().join(format!("meshplane-dirbad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("mixed.yaml"), &yaml).expect("write");
        std::fs::write(dir.join("ok.yaml"), svc("api", 80)).expect("write");
        let state = DirState::load(&dir).expect("load");
        assert_eq!(held_names(&state), vec!["api".to_string()]);
        assert_eq!(
            state.unusable_files().keys().collect::<Vec<_>>(),
            vec![&dir.join("mixed.yaml")]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
