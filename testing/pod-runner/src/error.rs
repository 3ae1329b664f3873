//! Errors of the local pod runner.

use std::path::PathBuf;

/// Why the pod runner, or one of its steps, failed.
#[derive(Debug, thiserror::Error)]
pub enum PodRunnerError {
    #[error("cannot read kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot build a Kubernetes client: {0}")]
    ClientConfig(String),
    #[error("Kubernetes API call {what} failed: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no free pod address left in {0}.10-254")]
    AddressesExhausted(String),
    #[error("binary {name} not found at {path}: {hint}")]
    MissingBinary {
        name: String,
        path: PathBuf,
        hint: String,
    },
    #[error("pod {pod} is not ready to start: {reason}")]
    NotReadyToStart { pod: String, reason: String },
    #[error("container {container} cannot run: {reason}")]
    CannotRun { container: String, reason: String },
    #[error("no container {container} in pod {namespace}/{pod} on this runner")]
    NoSuchContainer {
        namespace: String,
        pod: String,
        container: String,
    },
}

impl PodRunnerError {
    pub(crate) fn api(what: impl Into<String>, source: kube::Error) -> Self {
        PodRunnerError::Api {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PodRunnerError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}
