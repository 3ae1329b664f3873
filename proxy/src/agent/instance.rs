//! The way to the instance: its TLS port, the tenant's trust bundle and the pod's token, all
//! read from their files at the moment of use (the kubelet rewrites both).

use std::path::PathBuf;

use meshplane_ca::grpc::{connect_instance, ChannelError};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use crate::bootstrap::Upstream;

/// Why the instance could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("reading the trust bundle {path}: {source}")]
    Bundle {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the trust bundle {0} holds no certificate yet (the tenant CA is not issued)")]
    NoBundle(PathBuf),
    #[error("reading the token {path}: {source}")]
    Token {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the token file {0} is empty")]
    EmptyToken(PathBuf),
    #[error(transparent)]
    Channel(#[from] ChannelError),
}

impl From<InstanceError> for tonic::Status {
    fn from(e: InstanceError) -> Self {
        tonic::Status::unavailable(e.to_string())
    }
}

/// Where the instance is and how to prove who we are to it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub upstream: Upstream,
    /// `root-cert.pem` of the bootstrap ConfigMap.
    pub root_cert: PathBuf,
    /// The projected ServiceAccount token; `None` sends no token.
    pub token_file: Option<PathBuf>,
}

impl Instance {
    /// The trust bundle as it is on disk now, if it holds at least one certificate.
    pub fn bundle(&self) -> Result<String, InstanceError> {
        let text =
            std::fs::read_to_string(&self.root_cert).map_err(|source| InstanceError::Bundle {
                path: self.root_cert.clone(),
                source,
            })?;
        match meshplane_ca::pem::certificates(&text) {
            Ok(certs) if !certs.is_empty() => Ok(text),
            _ => Err(InstanceError::NoBundle(self.root_cert.clone())),
        }
    }

    /// A new TLS channel, the server verified against the bundle on disk now.
    pub async fn connect(&self) -> Result<Channel, InstanceError> {
        let bundle = self.bundle()?;
        Ok(connect_instance(&self.upstream.target, &self.upstream.server_name, &bundle).await?)
    }

    /// Adds `authorization: Bearer <token>` with the token on disk now.
    pub fn authorize<T>(&self, request: &mut tonic::Request<T>) -> Result<(), InstanceError> {
        let Some(path) = &self.token_file else {
            return Ok(());
        };
        let token = std::fs::read_to_string(path).map_err(|source| InstanceError::Token {
            path: path.clone(),
            source,
        })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(InstanceError::EmptyToken(path.clone()));
        }
        let value: MetadataValue<_> = format!("Bearer {token}")
            .parse()
            .map_err(|_| InstanceError::EmptyToken(path.clone()))?;
        request.metadata_mut().insert("authorization", value);
        Ok(())
    }
}
