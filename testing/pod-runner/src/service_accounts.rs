//! The ServiceAccount controller part of the runner: every namespace gets its `default`
//! ServiceAccount, as kube-controller-manager does, so pods that name none can get tokens.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::PostParams;
use kube::{Api, Client};

/// Remembers the namespaces (by uid) whose `default` ServiceAccount exists.
#[derive(Debug, Default)]
pub struct DefaultServiceAccounts {
    done: BTreeSet<String>,
    last_errors: BTreeSet<String>,
}

impl DefaultServiceAccounts {
    pub async fn reconcile_all(&mut self, client: &Client, namespaces: &[Arc<Namespace>]) {
        for namespace in namespaces {
            let uid = namespace.metadata.uid.clone().unwrap_or_default();
            if self.done.contains(&uid) || namespace.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = namespace.metadata.name.clone().unwrap_or_default();
            let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
            let account = ServiceAccount {
                metadata: kube::api::ObjectMeta {
                    name: Some("default".into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&PostParams::default(), &account).await {
                Ok(_) => {
                    self.done.insert(uid);
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    self.done.insert(uid);
                }
                Err(error) => {
                    if self.last_errors.insert(name.clone()) {
                        tracing::warn!(namespace = %name, %error, "cannot create the default ServiceAccount");
                    }
                }
            }
        }
        self.done.retain(|uid| {
            namespaces
                .iter()
                .any(|n| n.metadata.uid.as_deref() == Some(uid.as_str()))
        });
    }
}
