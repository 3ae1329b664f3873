//! `istio.v1.auth.IstioCertificateService/CreateCertificate` on the instance.
//!
//! The caller's identity is the ServiceAccount that TokenReview reports for the bearer token
//! (audience `meshplane-<tenant>`), turned into `spiffe://<trust domain>/ns/NS/sa/SA`. The CSR
//! only proves possession of the key: the SANs it asks for are ignored. The namespace must be
//! a member of the tenant (or its control namespace), or the request is refused: another
//! tenant's pods, and pods of namespaces that joined no tenant, get no certificate here.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use meshplane_ca::grpc::{
    IstioCertificateRequest, IstioCertificateResponse, IstioCertificateService,
};
use meshplane_ca::{CaError, SpiffeId};
use time::{Duration, OffsetDateTime};
use tonic::{Request, Response, Status};

use super::ca_dir::CaDirectory;
use crate::push::Hub;
use crate::tenancy::{bearer_token, AdmissionError, TokenReviewer};

/// How long a request waits for the tenant's membership to be known.
const SYNC_WAIT: StdDuration = StdDuration::from_secs(10);

/// The certificate service of one instance.
#[derive(Clone)]
pub struct CertificateServer {
    ca: Arc<CaDirectory>,
    reviewer: TokenReviewer,
    hub: Arc<Hub>,
    trust_domain: String,
}

impl std::fmt::Debug for CertificateServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateServer")
            .field("trust_domain", &self.trust_domain)
            .finish_non_exhaustive()
    }
}

impl CertificateServer {
    /// `reviewer` may be the ADS stream's: the certificate service reviews with budgets of its
    /// own ([`TokenReviewer::for_service`]), sharing only recent answers.
    pub fn new(
        ca: Arc<CaDirectory>,
        reviewer: TokenReviewer,
        hub: Arc<Hub>,
        trust_domain: impl Into<String>,
    ) -> Self {
        let reviewer = reviewer
            .for_service("certificates")
            .reporting_to(Arc::clone(hub.metrics()));
        Self {
            ca,
            reviewer,
            hub,
            trust_domain: trust_domain.into(),
        }
    }

    /// The identity a token proves, if it is one this tenant issues certificates to.
    async fn identity(
        &self,
        token: Option<String>,
        peer: Option<std::net::IpAddr>,
    ) -> Result<SpiffeId, Status> {
        let token = token.ok_or_else(|| AdmissionError::MissingToken.to_status())?;
        let reviewed = self
            .reviewer
            .review(&token, peer)
            .await
            .map_err(|e| e.to_status())?;
        let id = SpiffeId::from_service_account_username(&self.trust_domain, &reviewed.username)
            .map_err(|e| Status::unauthenticated(format!("token rejected: {e}")))?;
        if tokio::time::timeout(SYNC_WAIT, self.hub.wait_ready())
            .await
            .is_err()
        {
            return Err(AdmissionError::NotSynced.to_status());
        }
        if !self.hub.admits_namespace(id.namespace()) {
            return Err(AdmissionError::NotMember {
                namespace: id.namespace().to_owned(),
                tenant: self.hub.tenant().to_owned(),
                revision: self.hub.revision().to_owned(),
            }
            .to_status());
        }
        Ok(id)
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CertificateServer {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let token = bearer_token(request.metadata());
        let peer = request.remote_addr().map(|a| a.ip());
        let result = async {
            let id = self.identity(token, peer).await?;
            let req = request.into_inner();
            let authority = self
                .ca
                .authority()
                .map_err(|e| Status::unavailable(e.to_string()))?;
            let ttl = Duration::seconds(req.validity_duration.max(0));
            let issued = authority
                .issue_workload(&req.csr, &id, ttl, OffsetDateTime::now_utc())
                .map_err(|e| match e {
                    CaError::BadCsr(_) => Status::invalid_argument(e.to_string()),
                    other => Status::internal(other.to_string()),
                })?;
            tracing::info!(identity = %id, not_after = %issued.not_after, "issued workload certificate");
            Ok::<_, Status>(issued.chain)
        }
        .await;
        let metrics = self.hub.metrics();
        match result {
            Ok(cert_chain) => {
                metrics.certificate("issued");
                Ok(Response::new(IstioCertificateResponse { cert_chain }))
            }
            Err(status) => {
                metrics.certificate(match status.code() {
                    tonic::Code::Unauthenticated => "unauthenticated",
                    tonic::Code::PermissionDenied => "not_member",
                    tonic::Code::InvalidArgument => "bad_csr",
                    _ => "unavailable",
                });
                crate::budgeted!(crate::log_budget::CONNECTIONS, warn, error = %status.message(), "refused certificate request");
                Err(status)
            }
        }
    }
}
