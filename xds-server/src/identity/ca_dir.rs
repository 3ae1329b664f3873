//! The tenant CA as mounted from its Secret: the four files of the `cacerts` layout in one
//! directory, loaded on first use and reloaded when any of them changes.
//!
//! Like the webhook certificate, every use stats the files (four `stat` calls) and reloads only
//! when one changed; that follows the kubelet's atomic Secret updates without a watcher that
//! could miss events. Material that fails to load (a half-written update, a bad plug-in) is
//! reported and the previous authority keeps signing until the files change again.
//!
//! Each load that succeeds reports when the signing certificate and its root expire to the
//! instance's metrics (`meshplane_xds_ca_expiry_timestamp_seconds`), for the expiry alerts.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use meshplane_ca::authority::{CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT};
use meshplane_ca::{Authority, CaError, CaFiles};
use time::OffsetDateTime;

use crate::metrics::Metrics;

/// Why no authority is available.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CaLoadError {
    #[error("reading the tenant CA in {dir}: {reason}")]
    Read { dir: PathBuf, reason: String },
    #[error("the tenant CA in {dir} is not usable: {source}")]
    Invalid { dir: PathBuf, source: CaError },
}

type Stamps = [Option<(u64, Option<SystemTime>, u64, i64)>; 4];

const FILES: [&str; 4] = [CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT];

fn stamps(dir: &Path) -> Stamps {
    FILES.map(|name| {
        let meta = std::fs::metadata(dir.join(name)).ok()?;
        #[cfg(unix)]
        let (ino, ctime) = {
            use std::os::unix::fs::MetadataExt;
            (meta.ino(), meta.ctime_nsec() + meta.ctime() * 1_000_000_000)
        };
        #[cfg(not(unix))]
        let (ino, ctime) = (0, 0);
        Some((meta.len(), meta.modified().ok(), ino, ctime))
    })
}

struct Loaded {
    stamps: Stamps,
    result: Result<Arc<Authority>, CaLoadError>,
}

/// The mounted CA directory.
pub struct CaDirectory {
    dir: PathBuf,
    loaded: Mutex<Option<Loaded>>,
    /// The last authority that loaded; kept serving while newer files fail to load.
    good: Mutex<Option<Arc<Authority>>>,
    /// Where loads report the certificates' expiry.
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for CaDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaDirectory")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CaDirectory {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            loaded: Mutex::new(None),
            good: Mutex::new(None),
            metrics: None,
        }
    }

    /// Reports the expiry of every authority that loads to `metrics`.
    pub fn reporting_to(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current authority: reloaded if the files changed since the last call. When the
    /// newest files do not load, the last good authority is returned (and the error logged
    /// once); without one, the error.
    pub fn authority(&self) -> Result<Arc<Authority>, CaLoadError> {
        let now_stamps = stamps(&self.dir);
        let mut loaded = lock(&self.loaded);
        let fresh = loaded.as_ref().is_some_and(|l| l.stamps == now_stamps);
        if !fresh {
            let result = self.load().map(Arc::new);
            match &result {
                Ok(a) => {
                    tracing::info!(dir = %self.dir.display(), ?a, "tenant CA loaded");
                    if let Some(metrics) = &self.metrics {
                        metrics.ca_loaded(&expiries(a));
                    }
                    *lock(&self.good) = Some(Arc::clone(a));
                }
                Err(e) => tracing::error!(error = %e, "tenant CA not loaded"),
            }
            *loaded = Some(Loaded {
                stamps: now_stamps,
                result,
            });
        }
        match loaded.as_ref().map(|l| &l.result) {
            Some(Ok(a)) => Ok(Arc::clone(a)),
            Some(Err(e)) => lock(&self.good).clone().ok_or_else(|| e.clone()),
            None => Err(CaLoadError::Read {
                dir: self.dir.clone(),
                reason: "not loaded".into(),
            }),
        }
    }

    fn load(&self) -> Result<Authority, CaLoadError> {
        let mut read_error = None;
        let files =
            CaFiles::from_lookup(|name| match std::fs::read_to_string(self.dir.join(name)) {
                Ok(text) => Some(text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    read_error = Some(format!("{name}: {e}"));
                    None
                }
            });
        if let Some(reason) = read_error {
            return Err(CaLoadError::Read {
                dir: self.dir.clone(),
                reason,
            });
        }
        let files = files.map_err(|source| CaLoadError::Invalid {
            dir: self.dir.clone(),
            source,
        })?;
        Authority::load(&files, OffsetDateTime::now_utc()).map_err(|source| CaLoadError::Invalid {
            dir: self.dir.clone(),
            source,
        })
    }
}

/// When `authority`'s signing certificate and root expire, as metric labels and Unix seconds.
fn expiries(authority: &Authority) -> Vec<(&'static str, i64)> {
    let mut out = vec![("ca-cert", authority.not_after().unix_timestamp())];
    let root = meshplane_ca::pem::certificates(authority.root_pem())
        .ok()
        .and_then(|certs| certs.into_iter().next())
        .and_then(|root| meshplane_ca::pem::validity(&root.parse().ok()?).ok());
    if let Some((_, not_after)) = root {
        out.push(("root-cert", not_after.unix_timestamp()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshplane_ca::root::{
        generate_intermediate, generate_root, plugged_in_files, self_signed_files,
    };
    use time::Duration;

    fn write(dir: &Path, files: &CaFiles) {
        for (name, pem) in files.entries() {
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, pem).expect("write");
            std::fs::rename(&tmp, dir.join(name)).expect("rename");
        }
    }

    fn expiry(metrics: &Metrics, certificate: &str) -> Option<i64> {
        let text = metrics.encode().expect("encodes");
        let prefix =
            format!("meshplane_xds_ca_expiry_timestamp_seconds{{certificate=\"{certificate}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
    }

    #[test]
    fn each_load_reports_when_the_signing_certificate_and_its_root_expire() {
        let dir = tempfile::tempdir().expect("temp dir");
        let metrics = Arc::new(Metrics::new());
        let ca = CaDirectory::new(dir.path()).reporting_to(Arc::clone(&metrics));
        assert!(ca.authority().is_err());
        assert_eq!(expiry(&metrics, "ca-cert"), None, "absent until a CA loads");

        let now = OffsetDateTime::now_utc();
        let root = generate_root("blue", "blue.example", now, Duration::days(365)).expect("root");
        write(dir.path(), &self_signed_files(&root));
        let loaded = ca.authority().expect("loads");
        let root_expiry = loaded.not_after().unix_timestamp();
        assert!((root_expiry - (now + Duration::days(365)).unix_timestamp()).abs() <= 1);
        assert_eq!(expiry(&metrics, "ca-cert"), Some(root_expiry));
        assert_eq!(expiry(&metrics, "root-cert"), Some(root_expiry));

        // Plugged in: an intermediate of that root signs, and expires first.
        let intermediate =
            generate_intermediate(&root, "blue intermediate", now, Duration::days(30))
                .expect("intermediate");
        write(dir.path(), &plugged_in_files(&intermediate, &root.cert_pem));
        let reloaded = ca.authority().expect("reloads");
        let signing_expiry = reloaded.not_after().unix_timestamp();
        assert!(signing_expiry < root_expiry);
        assert_eq!(expiry(&metrics, "ca-cert"), Some(signing_expiry));
        assert_eq!(expiry(&metrics, "root-cert"), Some(root_expiry));
    }
}
