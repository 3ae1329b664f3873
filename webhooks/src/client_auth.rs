//! Who may call the admission endpoints: the Kubernetes API server, authenticated by its
//! admission client certificate (kube-apiserver's `--admission-control-config-file`, a
//! `WebhookAdmissionConfiguration` whose kubeconfig gives it a certificate per webhook host).
//!
//! Without a network address to tell the API server from any other caller (a NetworkPolicy
//! cannot name it), an admission endpoint answers whoever reaches the port, and an answer can
//! say more than allowed or denied (e.g. whether a namespace is a member of the tenant). When
//! the CA bundle that signs the API server's client certificate is configured, [`ClientAuth`]
//! is the TLS server's client verifier: every handshake asks for a certificate, a certificate
//! of another CA fails the handshake, and no certificate at all still connects (so the
//! kubelet's `/healthz` probes work), but [`gate`] then refuses every admission path with 401,
//! and a certificate whose identity is not among the accepted names with 403, before any
//! review is read.
//!
//! The CA (and, for an instance, the accepted names) are files, reloaded when they change like
//! the serving certificate ([`crate::tls`]): every handshake stats them. A file that appears
//! turns client authentication on, one that disappears turns it off; one that changes to
//! something unusable is logged and the previous CA stays in force. Each refusal is logged
//! with the number of refusals so far ([`ClientAuth::refusals`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use meshplane_contracts::webhook_tls::{self, ClientAuthData};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use crate::tls::{stamp, FileStamp};

/// The CA file in an instance's webhook TLS directory (contract 4).
pub const CLIENT_CA_FILE: &str = webhook_tls::CLIENT_CA_CRT;
/// The accepted-names file in an instance's webhook TLS directory (contract 4).
pub const CLIENT_NAMES_FILE: &str = webhook_tls::CLIENT_NAMES;

/// Why the client CA could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ClientAuthError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Unusable { path: PathBuf, reason: String },
}

/// Where the accepted client names come from.
#[derive(Debug, Clone)]
enum Names {
    /// A file beside the CA, one name a line (contract 4's `client-names`); absent: any.
    File(PathBuf),
    /// Fixed at start (the operator's flags).
    Fixed(Vec<String>),
}

/// Told of each refusal with its reason ([`REFUSAL_REASONS`]), e.g. to count it in a metric.
pub type RefusalHook = Arc<dyn Fn(&'static str) + Send + Sync>;

/// Why a caller was refused: no certificate, one no CA in force signed, or one whose identity
/// is not among the accepted names.
pub const REFUSAL_REASONS: [&str; 3] = ["no_certificate", "unknown_ca", "name_not_accepted"];

/// The client CA in force.
struct Policy {
    verifier: Arc<dyn ClientCertVerifier>,
    data: ClientAuthData,
}

type Stamps = (Option<FileStamp>, Option<FileStamp>);

struct Loaded {
    loaded: Stamps,
    failed: Option<Stamps>,
    /// `None`: client authentication is off (no CA file).
    policy: Option<Arc<Policy>>,
}

/// The client-certificate policy of one admission server; see the module documentation.
pub struct ClientAuth {
    ca_path: PathBuf,
    names: Names,
    provider: Arc<CryptoProvider>,
    state: Mutex<Loaded>,
    refusals: AtomicU64,
    on_refusal: Option<RefusalHook>,
}

impl fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientAuth")
            .field("ca_path", &self.ca_path)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

/// What a caller of an admission path gets instead of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 401 without a certificate, 403 with one that is not accepted.
    pub status: StatusCode,
    pub message: String,
}

impl ClientAuth {
    /// An instance's policy: `client-ca.crt` and `client-names` in its webhook TLS directory
    /// (contract 4). Fails when the CA file exists but is unusable; its absence is "off".
    pub fn from_dir(dir: &Path, provider: Arc<CryptoProvider>) -> Result<Self, ClientAuthError> {
        Self::load(
            dir.join(CLIENT_CA_FILE),
            Names::File(dir.join(CLIENT_NAMES_FILE)),
            provider,
        )
    }

    /// A policy with the CA bundle at `ca_path` and fixed accepted `names` (empty: any
    /// certificate of the CA). Fails when the file is missing or unusable.
    pub fn from_file(
        ca_path: PathBuf,
        names: Vec<String>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, ClientAuthError> {
        let auth = Self::load(ca_path, Names::Fixed(names), provider)?;
        if auth.lock().policy.is_none() {
            return Err(ClientAuthError::Io {
                path: auth.ca_path.clone(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        Ok(auth)
    }

    fn load(
        ca_path: PathBuf,
        names: Names,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, ClientAuthError> {
        let auth = ClientAuth {
            ca_path,
            names,
            provider,
            state: Mutex::new(Loaded {
                loaded: (None, None),
                failed: None,
                policy: None,
            }),
            refusals: AtomicU64::new(0),
            on_refusal: None,
        };
        let stamps = auth.stamps();
        let policy = auth.read_policy()?;
        {
            let mut state = auth.lock();
            state.loaded = stamps;
            state.policy = policy.map(Arc::new);
        }
        Ok(auth)
    }

    /// Calls `hook` with the reason of every refusal.
    pub fn on_refusal(mut self, hook: RefusalHook) -> Self {
        self.on_refusal = Some(hook);
        self
    }

    fn names_path(&self) -> Option<&Path> {
        match &self.names {
            Names::File(path) => Some(path),
            Names::Fixed(_) => None,
        }
    }

    fn stamps(&self) -> Stamps {
        (stamp(&self.ca_path), self.names_path().and_then(stamp))
    }

    /// Reads the files: `None` when the CA file does not exist.
    fn read_policy(&self) -> Result<Option<Policy>, ClientAuthError> {
        let ca_pem = match std::fs::read_to_string(&self.ca_path) {
            Ok(pem) => pem,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(ClientAuthError::Io {
                    path: self.ca_path.clone(),
                    source,
                })
            }
        };
        let names = match &self.names {
            Names::Fixed(names) => names.clone(),
            Names::File(path) => match std::fs::read_to_string(path) {
                Ok(text) => webhook_tls::parse_names(&text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(source) => {
                    return Err(ClientAuthError::Io {
                        path: path.clone(),
                        source,
                    })
                }
            },
        };
        let verifier = verifier_for(&ca_pem, self.provider.clone()).map_err(|reason| {
            ClientAuthError::Unusable {
                path: self.ca_path.clone(),
                reason,
            }
        })?;
        Ok(Some(Policy {
            verifier,
            data: ClientAuthData { ca_pem, names },
        }))
    }

    /// The policy in force, reloading it first when the files changed.
    fn current(&self) -> Option<Arc<Policy>> {
        let now = self.stamps();
        let mut state = self.lock();
        if now == state.loaded || state.failed.as_ref() == Some(&now) {
            return state.policy.clone();
        }
        match self.read_policy() {
            Ok(policy) => {
                tracing::info!(
                    ca = %self.ca_path.display(),
                    on = policy.is_some(),
                    "reloaded the admission client CA"
                );
                state.policy = policy.map(Arc::new);
                state.loaded = now;
                state.failed = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "admission client CA changed but cannot be loaded; keeping the previous one");
                state.failed = Some(now);
            }
        }
        state.policy.clone()
    }

    /// Whether callers must present a certificate now.
    pub fn is_on(&self) -> bool {
        self.current().is_some()
    }

    /// The CA and names in force, as contract 4 carries them (`None`: off).
    pub fn data(&self) -> Option<ClientAuthData> {
        self.current().map(|p| p.data.clone())
    }

    /// How many calls were refused so far (no certificate, one of another CA, or a name that
    /// is not accepted).
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    fn refuse(
        &self,
        peer: Option<SocketAddr>,
        path: &str,
        reason: &'static str,
        refusal: Refusal,
    ) -> Refusal {
        let refusals = self.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(hook) = &self.on_refusal {
            hook(reason);
        }
        tracing::warn!(
            peer = ?peer,
            path,
            status = refusal.status.as_u16(),
            reason = %refusal.message,
            refusals,
            "refused an admission call: the caller is not the authenticated API server"
        );
        refusal
    }

    /// Decides a call on an admission path by the certificate chain its connection presented
    /// (verified in the handshake; checked again against the CA in force, which may have
    /// changed since).
    pub fn check(&self, connection: &ClientConnection, path: &str) -> Result<(), Refusal> {
        let Some(policy) = self.current() else {
            return Ok(());
        };
        let peer = connection.peer;
        let Some((leaf, intermediates)) = connection.certificates.split_first() else {
            return Err(self.refuse(peer, path, "no_certificate", Refusal {
                status: StatusCode::UNAUTHORIZED,
                message: "admission calls are accepted only from the Kubernetes API server, authenticated by its admission client certificate; this connection presented no client certificate".into(),
            }));
        };
        if let Err(e) = policy
            .verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
        {
            return Err(self.refuse(
                peer,
                path,
                "unknown_ca",
                Refusal {
                    status: StatusCode::FORBIDDEN,
                    message: format!(
                        "the client certificate is not one of the API server's admission client CA: {e}"
                    ),
                },
            ));
        }
        if policy.data.names.is_empty() {
            return Ok(());
        }
        let presented = certificate_names(leaf);
        if presented.iter().any(|n| policy.data.names.contains(n)) {
            return Ok(());
        }
        Err(self.refuse(
            peer,
            path,
            "name_not_accepted",
            Refusal {
                status: StatusCode::FORBIDDEN,
                message: format!(
                    "the client certificate ({}) is not an accepted admission client identity",
                    if presented.is_empty() {
                        "no subject CN or SAN".to_string()
                    } else {
                        presented.join(", ")
                    }
                ),
            },
        ))
    }

    fn lock(&self) -> MutexGuard<'_, Loaded> {
        // The state is replaced whole, so a panic elsewhere cannot leave it half-updated.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A verifier accepting certificates of the CAs in `ca_pem`, and connections without one.
fn verifier_for(
    ca_pem: &str,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| e.to_string())?;
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("no CERTIFICATE block".into());
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| e.to_string())
}

/// The subject CNs and the DNS and URI SANs of a DER certificate.
pub fn certificate_names(der: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der.as_ref()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) | GeneralName::URI(d) => names.push(d.to_string()),
                _ => {}
            }
        }
    }
    names
}

impl ClientCertVerifier for ClientAuth {
    fn offer_client_auth(&self) -> bool {
        self.is_on()
    }

    fn client_auth_mandatory(&self) -> bool {
        // Probes of /healthz come without one; the admission paths are refused by `gate`.
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: a client then presents the certificate it has (Go's crypto/tls and rustls
        // alike), and the hints could not follow a reload from behind a borrow.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let Some(policy) = self.current() else {
            // Turned off since the handshake began: nothing to hold the caller to.
            return Ok(ClientCertVerified::assertion());
        };
        policy
            .verifier
            .verify_client_cert(end_entity, intermediates, now)
            .inspect_err(|e| {
                self.refuse(
                    None,
                    "(handshake)",
                    "unknown_ca",
                    Refusal {
                        status: StatusCode::FORBIDDEN,
                        message: format!("client certificate refused in the TLS handshake: {e}"),
                    },
                );
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// What the accept loop knows of a connection's client, handed to the routes as a request
/// extension.
#[derive(Debug, Clone, Default)]
pub struct ClientConnection {
    pub peer: Option<SocketAddr>,
    /// The chain the client presented in the handshake (leaf first), verified then; empty
    /// when it presented none.
    pub certificates: Arc<Vec<CertificateDer<'static>>>,
}

/// Middleware for the admission routes: refuses a call that [`ClientAuth::check`] refuses,
/// with its status and a plain-text message, before the body is read.
pub async fn gate(State(auth): State<Arc<ClientAuth>>, request: Request, next: Next) -> Response {
    let connection = request
        .extensions()
        .get::<ClientConnection>()
        .cloned()
        .unwrap_or_default();
    match auth.check(&connection, request.uri().path()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => (refusal.status, refusal.message).into_response(),
    }
}
