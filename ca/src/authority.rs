//! A tenant's signing authority in Istio's plugged-in `cacerts` layout, and what it issues:
//! workload certificates from a CSR (identity given by the caller, never read from the CSR) and
//! serving certificates for the instance's own TLS port.
//!
//! The layout has four files (contract 11 of docs/architecture.md):
//!
//! | key | holds |
//! |---|---|
//! | `ca-cert.pem` | the signing certificate (a root, or an intermediate of the organisation's root) |
//! | `ca-key.pem` | its private key (PKCS#8 or SEC1 PEM) |
//! | `root-cert.pem` | the trust bundle: one root, or two during a root rotation |
//! | `cert-chain.pem` | the chain from `ca-cert.pem` up to the root (may be empty for a root) |

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber, SubjectPublicKeyInfo,
};
use time::{Duration, OffsetDateTime};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use crate::pem::{self, PemCert};
use crate::spiffe::SpiffeId;
use crate::CaError;

/// Key of the signing certificate in the `cacerts` layout.
pub const CA_CERT: &str = "ca-cert.pem";
/// Key of the signing key.
pub const CA_KEY: &str = "ca-key.pem";
/// Key of the trust bundle.
pub const ROOT_CERT: &str = "root-cert.pem";
/// Key of the chain from the signing certificate to the root.
pub const CERT_CHAIN: &str = "cert-chain.pem";

/// Lifetime of a workload certificate when the request asks for none.
pub const DEFAULT_WORKLOAD_TTL: Duration = Duration::hours(24);
/// The longest lifetime a workload certificate may ask for. Nothing revokes a workload
/// certificate but the end of its life or of its root's place in the bundle (a rotation drops
/// the old root this long after it stops signing), so this is how long a stolen key can last.
pub const MAX_WORKLOAD_TTL: Duration = Duration::days(7);
/// Certificates start a little in the past, so that a peer whose clock is behind accepts them.
const BACKDATE: Duration = Duration::minutes(5);
/// CA certificates start further back: everything they sign must fall inside their window.
pub(crate) const BACKDATE_CA: Duration = Duration::hours(1);

/// The four PEM files of the `cacerts` layout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaFiles {
    pub ca_cert: String,
    pub ca_key: String,
    pub root_cert: String,
    pub cert_chain: String,
}

impl CaFiles {
    /// Reads the layout from a key lookup (Secret data, files in a mounted directory).
    /// `cert-chain.pem` may be absent; the other three are required.
    pub fn from_lookup(mut get: impl FnMut(&str) -> Option<String>) -> Result<Self, CaError> {
        let mut need = |key: &'static str| get(key).ok_or(CaError::MissingKey(key));
        let ca_cert = need(CA_CERT)?;
        let ca_key = need(CA_KEY)?;
        let root_cert = need(ROOT_CERT)?;
        let cert_chain = get(CERT_CHAIN).unwrap_or_default();
        Ok(Self {
            ca_cert,
            ca_key,
            root_cert,
            cert_chain,
        })
    }

    /// The layout as (key, PEM) pairs, in key order.
    pub fn entries(&self) -> [(&'static str, &str); 4] {
        [
            (CA_CERT, &self.ca_cert),
            (CA_KEY, &self.ca_key),
            (CERT_CHAIN, &self.cert_chain),
            (ROOT_CERT, &self.root_cert),
        ]
    }
}

/// A certificate issued by an [`Authority`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCert {
    /// PEM certificates, the issued one first, then the signing certificate and any
    /// intermediates, and the root last (Istio's `cert_chain` order).
    pub chain: Vec<String>,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl IssuedCert {
    /// The chain without the root, as a TLS peer presents it.
    pub fn presented_chain_pem(&self) -> String {
        let n = self.chain.len().saturating_sub(1).max(1);
        self.chain.iter().take(n).map(String::as_str).collect()
    }

    /// The root that anchors the chain.
    pub fn root_pem(&self) -> &str {
        self.chain.last().map(String::as_str).unwrap_or_default()
    }
}

/// A loaded, checked signing authority.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    /// The signing certificate, then the intermediates up to (not including) the root.
    chain: Vec<PemCert>,
    /// The root of the bundle that anchors `chain`.
    root: PemCert,
    /// Every root of the trust bundle.
    bundle: Vec<PemCert>,
    not_after: OffsetDateTime,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("chain_len", &self.chain.len())
            .field("bundle_len", &self.bundle.len())
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Authority {
    /// Loads and checks the layout at `now`: the key belongs to `ca-cert.pem`, which is a CA
    /// valid now, and `ca-cert.pem` chains through `cert-chain.pem` to a root of `root-cert.pem`
    /// (signatures checked at every step).
    pub fn load(files: &CaFiles, now: OffsetDateTime) -> Result<Self, CaError> {
        let signing = pem::certificates(&files.ca_cert)?
            .into_iter()
            .next()
            .ok_or(CaError::Empty(CA_CERT))?;
        let bundle = pem::certificates(&files.root_cert)?;
        if bundle.is_empty() {
            return Err(CaError::Empty(ROOT_CERT));
        }
        let key = KeyPair::from_pem(&files.ca_key).map_err(|e| CaError::BadKey(e.to_string()))?;

        let parsed = signing.parse()?;
        if !parsed.is_ca() {
            return Err(CaError::NotACa(CA_CERT));
        }
        if parsed.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(CaError::KeyMismatch);
        }
        let (not_before, not_after) = pem::validity(&parsed)?;
        if now < not_before || now >= not_after {
            return Err(CaError::NotValidNow {
                what: CA_CERT,
                not_before,
                not_after,
            });
        }

        // Walk up from the signing certificate: each step's issuer is the next chain entry
        // (roots excluded) or, at the top, a root of the bundle.
        let intermediates: Vec<PemCert> = pem::certificates(&files.cert_chain)?
            .into_iter()
            .filter(|c| c.der != signing.der && !bundle.iter().any(|r| r.der == c.der))
            .collect();
        let mut chain = vec![signing.clone()];
        let root = loop {
            let current = chain.last().ok_or(CaError::Empty(CA_CERT))?;
            let cur = current.parse()?;
            if let Some(root) = bundle.iter().find(|r| signed_by(&cur, r)) {
                break root.clone();
            }
            if chain.len() > intermediates.len() + 1 {
                return Err(CaError::Unanchored);
            }
            let next = intermediates
                .iter()
                .find(|i| signed_by(&cur, i) && !chain.contains(i))
                .ok_or(CaError::Unanchored)?
                .clone();
            chain.push(next);
        };
        // A self-signed signing certificate is its own root: present it once.
        if root.der == signing.der {
            chain.clear();
            chain.push(signing.clone());
        }

        let issuer = Issuer::from_ca_cert_der(&signing.der.clone().into(), key)
            .map_err(|e| CaError::BadCertificate(e.to_string()))?;
        Ok(Self {
            issuer,
            chain,
            root,
            bundle,
            not_after,
        })
    }

    /// The trust bundle (`root-cert.pem`): every root, as PEM.
    pub fn trust_bundle_pem(&self) -> String {
        pem::join(&self.bundle)
    }

    /// The root that anchors what this authority issues.
    pub fn root_pem(&self) -> &str {
        &self.root.pem
    }

    /// When the signing certificate expires; nothing issued outlives it.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// Issues a workload certificate for the public key of `csr_pem` (its signature is checked,
    /// proving the caller holds the key) with `identity` as the only SAN. Everything else the
    /// CSR asks for (subject, SANs, extensions) is ignored: the identity comes from the token.
    /// `ttl` of zero means [`DEFAULT_WORKLOAD_TTL`]; longer than [`MAX_WORKLOAD_TTL`] is cut.
    pub fn issue_workload(
        &self,
        csr_pem: &str,
        identity: &SpiffeId,
        ttl: Duration,
        now: OffsetDateTime,
    ) -> Result<IssuedCert, CaError> {
        let public_key = csr_public_key(csr_pem)?;
        let mut params = self.leaf_params(ttl, now)?;
        params.subject_alt_names = vec![SanType::URI(
            identity
                .uri()
                .try_into()
                .map_err(|e: rcgen::Error| CaError::Issue(e.to_string()))?,
        )];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.sign(&params, &public_key)
    }

    /// Issues a serving certificate for `key` (held by the caller) naming `dns_names` and,
    /// when given, the caller's own SPIFFE identity.
    pub fn issue_serving(
        &self,
        key: &KeyPair,
        dns_names: &[String],
        identity: Option<&SpiffeId>,
        ttl: Duration,
        now: OffsetDateTime,
    ) -> Result<IssuedCert, CaError> {
        let mut params = self.leaf_params(ttl, now)?;
        let mut sans = Vec::new();
        for name in dns_names {
            sans.push(SanType::DnsName(
                name.clone()
                    .try_into()
                    .map_err(|e: rcgen::Error| CaError::Issue(e.to_string()))?,
            ));
        }
        if let Some(id) = identity {
            sans.push(SanType::URI(
                id.uri()
                    .try_into()
                    .map_err(|e: rcgen::Error| CaError::Issue(e.to_string()))?,
            ));
        }
        if let Some(first) = dns_names.first() {
            params.distinguished_name.push(DnType::CommonName, first);
        }
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(&params, key)
    }

    fn leaf_params(
        &self,
        ttl: Duration,
        now: OffsetDateTime,
    ) -> Result<CertificateParams, CaError> {
        let ttl = if ttl <= Duration::ZERO {
            DEFAULT_WORKLOAD_TTL
        } else {
            ttl.min(MAX_WORKLOAD_TTL)
        };
        let not_after = (now + ttl).min(self.not_after);
        if not_after <= now {
            return Err(CaError::Expired);
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.not_before = now - BACKDATE;
        params.not_after = not_after;
        params.serial_number = Some(random_serial());
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        Ok(params)
    }

    fn sign(
        &self,
        params: &CertificateParams,
        public_key: &impl rcgen::PublicKeyData,
    ) -> Result<IssuedCert, CaError> {
        let cert = params
            .signed_by(public_key, &self.issuer)
            .map_err(|e| CaError::Issue(e.to_string()))?;
        let mut chain = vec![cert.pem()];
        chain.extend(
            self.chain
                .iter()
                .filter(|c| c.der != self.root.der)
                .map(|c| c.pem.clone()),
        );
        chain.push(self.root.pem.clone());
        Ok(IssuedCert {
            chain,
            not_before: params.not_before,
            not_after: params.not_after,
        })
    }
}

/// Whether `cert` names `issuer` as its issuer and carries `issuer`'s valid signature.
fn signed_by(cert: &x509_parser::certificate::X509Certificate<'_>, issuer: &PemCert) -> bool {
    let Ok(parsed) = issuer.parse() else {
        return false;
    };
    parsed.is_ca()
        && cert.issuer() == parsed.subject()
        && cert.verify_signature(Some(parsed.public_key())).is_ok()
}

/// The public key of a PEM CSR whose self-signature verifies.
fn csr_public_key(csr_pem: &str) -> Result<SubjectPublicKeyInfo, CaError> {
    let block = ::pem::parse(csr_pem.trim()).map_err(|e| CaError::BadCsr(e.to_string()))?;
    if block.tag() != "CERTIFICATE REQUEST" && block.tag() != "NEW CERTIFICATE REQUEST" {
        return Err(CaError::BadCsr(format!(
            "expected a CERTIFICATE REQUEST PEM block, got {:?}",
            block.tag()
        )));
    }
    let (_, csr) = X509CertificationRequest::from_der(block.contents())
        .map_err(|e| CaError::BadCsr(e.to_string()))?;
    csr.verify_signature()
        .map_err(|_| CaError::BadCsr("the CSR's signature does not verify".into()))?;
    SubjectPublicKeyInfo::from_der(csr.certification_request_info.subject_pki.raw)
        .map_err(|e| CaError::BadCsr(e.to_string()))
}

/// A positive random 128-bit serial number.
pub(crate) fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

/// Generates a P-256 key pair and a CSR for it naming `identity` (what a node agent sends).
pub fn generate_csr(identity: Option<&str>) -> Result<(KeyPair, String), CaError> {
    let key = KeyPair::generate().map_err(|e| CaError::Issue(e.to_string()))?;
    let csr = csr_for(&key, identity)?;
    Ok((key, csr))
}

/// A CSR for `key` naming `identity` as URI SAN (none when `None`).
pub fn csr_for(key: &KeyPair, identity: Option<&str>) -> Result<String, CaError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    if let Some(id) = identity {
        params.subject_alt_names = vec![SanType::URI(
            id.to_owned()
                .try_into()
                .map_err(|e: rcgen::Error| CaError::Issue(e.to_string()))?,
        )];
    }
    params
        .serialize_request(key)
        .and_then(|r| r.pem())
        .map_err(|e| CaError::Issue(e.to_string()))
}
