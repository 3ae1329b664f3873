//! The webhook's serving certificate, reloaded when the mounted Secret changes (contract 4).
//!
//! Every handshake stats `tls.crt` and `tls.key` (two `stat` calls) and reloads the pair only
//! when either file changed. That follows the kubelet's atomic Secret updates (a symlink swap,
//! so new inodes) without a watcher that could miss events, and costs nothing measurable at
//! webhook request rates. A pair that fails to load (e.g. a half-written update) is logged and
//! the previous certificate keeps serving; it is retried when the files change again.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Certificate chain file in the TLS directory (PEM): the Secret key of contract 4.
pub const CERT_FILE: &str = meshplane_contracts::webhook_tls::TLS_CRT;
/// Private key file in the TLS directory (PEM): the Secret key of contract 4.
pub const KEY_FILE: &str = meshplane_contracts::webhook_tls::TLS_KEY;

/// Why the certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file has no usable PEM content.
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    /// rustls refused the key or the pair (e.g. the key does not match the certificate).
    #[error("certificate {cert} with key {key}: {source}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// What identifies one version of a file without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    #[cfg(unix)]
    inode: (u64, u64),
    #[cfg(unix)]
    changed: (i64, i64),
}

pub(crate) fn stamp(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    use std::os::unix::fs::MetadataExt;
    Some(FileStamp {
        len: meta.len(),
        modified: meta.modified().ok(),
        #[cfg(unix)]
        inode: (meta.dev(), meta.ino()),
        #[cfg(unix)]
        changed: (meta.ctime(), meta.ctime_nsec()),
    })
}

type PairStamp = (Option<FileStamp>, Option<FileStamp>);

struct State {
    /// Stamp of the files the serving certificate was loaded from.
    loaded: PairStamp,
    /// Stamp of the last pair that failed to load, so it is not retried on every handshake.
    failed: Option<PairStamp>,
    key: Arc<CertifiedKey>,
}

/// A [`ResolvesServerCert`] serving `tls.crt`/`tls.key` from a directory, reloaded on change.
pub struct ReloadingCertResolver {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

impl fmt::Debug for ReloadingCertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCertResolver")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl ReloadingCertResolver {
    /// Loads the pair from `dir`; fails when the initial pair is unusable.
    pub fn load(dir: &Path, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let cert_path = dir.join(CERT_FILE);
        let key_path = dir.join(KEY_FILE);
        let loaded = (stamp(&cert_path), stamp(&key_path));
        let key = Arc::new(load_pair(&cert_path, &key_path, &provider)?);
        Ok(ReloadingCertResolver {
            cert_path,
            key_path,
            provider,
            state: Mutex::new(State {
                loaded,
                failed: None,
                key,
            }),
        })
    }

    /// The certificate to serve now, reloading it first when the files changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let now = (stamp(&self.cert_path), stamp(&self.key_path));
        let mut state = self.lock();
        if now == state.loaded || state.failed.as_ref() == Some(&now) {
            return state.key.clone();
        }
        match load_pair(&self.cert_path, &self.key_path, &self.provider) {
            Ok(key) => {
                tracing::info!(cert = %self.cert_path.display(), "reloaded the webhook serving certificate");
                state.key = Arc::new(key);
                state.loaded = now;
                state.failed = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "webhook certificate changed but cannot be loaded; serving the previous one");
                state.failed = Some(now);
            }
        }
        state.key.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is replaced whole, so a panic elsewhere cannot leave it half-updated.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ResolvesServerCert for ReloadingCertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn load_pair(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let pem = |path: &Path, reason: String| TlsError::Pem {
        path: path.to_owned(),
        reason,
    };
    let cert_pem = std::fs::read(cert_path).map_err(|source| TlsError::Io {
        path: cert_path.to_owned(),
        source,
    })?;
    let key_pem = std::fs::read(key_path).map_err(|source| TlsError::Io {
        path: key_path.to_owned(),
        source,
    })?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(cert_path, e.to_string()))?;
    if chain.is_empty() {
        return Err(pem(cert_path, "no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| pem(key_path, e.to_string()))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|source| TlsError::Pair {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        source,
    })
}
