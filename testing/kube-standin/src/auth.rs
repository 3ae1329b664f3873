//! Authentication of stand-in requests: one bearer token per identity.
//!
//! Fixed identities (the admin user, the operator, the pod runner) get a random token each when
//! the [`Authenticator`] is created; ServiceAccount tokens are issued at runtime (TokenRequest)
//! and carry audiences, an expiry and an optional bound pod. Fixed identities' tokens are random
//! opaque strings; ServiceAccount tokens are shaped as the real API server's (a JWT whose claims
//! name the audiences, expiry and ServiceAccount), with a random string where the signature
//! goes. Either way only the in-memory table vouches for a token, as the real API server's
//! TokenReview is the only way to check them.

use std::collections::HashMap;
use std::path::Path;
use std::sync::RwLock;
use std::time::{Duration, SystemTime};

use rand::distr::{Alphanumeric, SampleString};

/// The audience of tokens meant for the API server itself (the real default for
/// `--api-audiences`). A token without it cannot authenticate API requests.
pub const API_SERVER_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Group every authenticated identity belongs to.
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";

/// Group of cluster administrators; RBAC allows them everything.
pub const GROUP_MASTERS: &str = "system:masters";

/// Namespace and name of the operator's ServiceAccount.
pub const OPERATOR_NAMESPACE: &str = "meshplane-system";
pub const OPERATOR_SERVICE_ACCOUNT: &str = "meshplane-operator";

/// Username of the pod-runner (kubelet-like) identity.
pub const NODE_USERNAME: &str = "system:node:local";

/// The authenticated identity of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The identity of ServiceAccount `namespace/name`, with the groups the real API gives it.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        UserInfo {
            username: service_account_username(namespace, name),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                GROUP_AUTHENTICATED.to_string(),
            ],
        }
    }

    /// Whether the identity is in `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// `system:serviceaccount:<ns>:<name>`.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Splits `system:serviceaccount:<ns>:<name>` into namespace and name.
pub fn parse_service_account_username(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then_some((namespace, name))
}

/// Who a kubeconfig written by the stand-in acts as.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// Cluster administrator (`system:masters`): the user in e2e scenarios.
    Admin,
    /// The meshplane operator's ServiceAccount.
    Operator,
    /// The local pod runner, acting like a kubelet (`system:node:local`).
    Node,
    /// Any ServiceAccount; its token is issued on demand.
    ServiceAccount { namespace: String, name: String },
}

/// Why a request could not be authenticated (answered with 401).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("Unauthorized: no bearer token")]
    MissingToken,
    #[error("Unauthorized: the Authorization header is not a bearer token")]
    MalformedHeader,
    #[error("Unauthorized: unknown bearer token")]
    UnknownToken,
    #[error("Unauthorized: token has expired")]
    Expired,
    #[error("Unauthorized: token audiences {0:?} do not include the API server")]
    WrongAudience(Vec<String>),
    #[error("cannot write kubeconfig {path}: {source}")]
    WriteKubeconfig {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A pod a ServiceAccount token is bound to (`boundObjectRef` of a TokenRequest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPod {
    pub name: String,
    pub uid: String,
}

/// Everything the stand-in remembers about one issued token.
#[derive(Debug, Clone)]
pub struct TokenRecord {
    pub user: UserInfo,
    /// Audiences the token is valid for; empty for fixed identities (valid for the API only).
    pub audiences: Vec<String>,
    /// None for fixed identities, which never expire.
    pub expires_at: Option<SystemTime>,
    pub bound_pod: Option<BoundPod>,
}

impl TokenRecord {
    fn is_expired(&self, now: SystemTime) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    fn accepted_by_api_server(&self) -> bool {
        self.audiences.is_empty() || self.audiences.iter().any(|a| a == API_SERVER_AUDIENCE)
    }
}

/// Maps bearer tokens to identities; holds fixed identities and issued ServiceAccount tokens.
#[derive(Debug)]
pub struct Authenticator {
    tokens: RwLock<HashMap<String, TokenRecord>>,
    fixed: HashMap<Identity, String>,
}

impl Default for Authenticator {
    fn default() -> Self {
        Self::new()
    }
}

impl Authenticator {
    /// Creates the fixed identities, each with a fresh random token.
    pub fn new() -> Self {
        let mut tokens = HashMap::new();
        let mut fixed = HashMap::new();
        let fixed_users = [
            (
                Identity::Admin,
                UserInfo {
                    username: "admin".to_string(),
                    groups: vec![GROUP_MASTERS.to_string(), GROUP_AUTHENTICATED.to_string()],
                },
            ),
            (
                Identity::Operator,
                UserInfo::service_account(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT),
            ),
            (
                Identity::Node,
                UserInfo {
                    username: NODE_USERNAME.to_string(),
                    groups: vec!["system:nodes".to_string(), GROUP_AUTHENTICATED.to_string()],
                },
            ),
        ];
        for (identity, user) in fixed_users {
            let token = random_token();
            tokens.insert(
                token.clone(),
                TokenRecord {
                    user,
                    audiences: Vec::new(),
                    expires_at: None,
                    bound_pod: None,
                },
            );
            fixed.insert(identity, token);
        }
        Authenticator {
            tokens: RwLock::new(tokens),
            fixed,
        }
    }

    /// Resolves the `Authorization` header of a request to an identity.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<UserInfo, AuthError> {
        let header = authorization.ok_or(AuthError::MissingToken)?;
        let token = bearer_token(header).ok_or(AuthError::MalformedHeader)?;
        let record = self.lookup(token).ok_or(AuthError::UnknownToken)?;
        if record.is_expired(SystemTime::now()) {
            return Err(AuthError::Expired);
        }
        if !record.accepted_by_api_server() {
            return Err(AuthError::WrongAudience(record.audiences));
        }
        Ok(record.user)
    }

    /// The record of a token, whether or not it has expired.
    pub fn lookup(&self, token: &str) -> Option<TokenRecord> {
        read_lock(&self.tokens).get(token).cloned()
    }

    /// Issues a new ServiceAccount token. Empty `audiences` means the API server's audience.
    pub fn issue_service_account_token(
        &self,
        namespace: &str,
        name: &str,
        audiences: Vec<String>,
        lifetime: Duration,
        bound_pod: Option<BoundPod>,
    ) -> (String, SystemTime) {
        let audiences = if audiences.is_empty() {
            vec![API_SERVER_AUDIENCE.to_string()]
        } else {
            audiences
        };
        let expires_at = SystemTime::now() + lifetime;
        let token =
            service_account_jwt(namespace, name, &audiences, expires_at, bound_pod.as_ref());
        let record = TokenRecord {
            user: UserInfo::service_account(namespace, name),
            audiences,
            expires_at: Some(expires_at),
            bound_pod,
        };
        write_lock(&self.tokens).insert(token.clone(), record);
        tracing::debug!(namespace, name, "issued ServiceAccount token");
        (token, expires_at)
    }

    /// The bearer token of `identity`; ServiceAccounts get a fresh API-audience token.
    pub fn token_for(&self, identity: &Identity) -> String {
        if let Some(token) = self.fixed.get(identity) {
            return token.clone();
        }
        match identity {
            Identity::ServiceAccount { namespace, name } => {
                // A day outlives any test run; callers that need expiry use TokenRequest.
                let lifetime = Duration::from_secs(24 * 3600);
                self.issue_service_account_token(namespace, name, Vec::new(), lifetime, None)
                    .0
            }
            // Fixed identities are always in `fixed` (see `new`); answer with an unusable
            // token rather than panic.
            Identity::Admin | Identity::Operator | Identity::Node => String::new(),
        }
    }

    /// Writes a kubeconfig that talks to `server_url` as `identity`.
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        server_url: &str,
        identity: &Identity,
    ) -> Result<(), AuthError> {
        let token = self.token_for(identity);
        std::fs::write(path, kubeconfig_yaml(server_url, &token)).map_err(|source| {
            AuthError::WriteKubeconfig {
                path: path.display().to_string(),
                source,
            }
        })
    }
}

/// A kubeconfig with one cluster, one user (bearer token) and one current context.
pub fn kubeconfig_yaml(server_url: &str, token: &str) -> String {
    // Values are JSON-quoted: JSON strings are valid YAML scalars and need no escaping rules.
    let server = serde_json::Value::from(server_url);
    let token = serde_json::Value::from(token);
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: standin\n  cluster:\n    server: {server}\n\
         users:\n\
         - name: standin-user\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: standin\n  context:\n    cluster: standin\n    user: standin-user\n\
         current-context: standin\n"
    )
}

fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A token shaped as a projected ServiceAccount token: claims a client can read, and a random
/// last segment instead of a signature.
fn service_account_jwt(
    namespace: &str,
    name: &str,
    audiences: &[String],
    expires_at: SystemTime,
    bound_pod: Option<&BoundPod>,
) -> String {
    use base64::Engine as _;
    let seconds = |at: SystemTime| {
        at.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let mut kubernetes = serde_json::json!({
        "namespace": namespace,
        "serviceaccount": {"name": name},
    });
    if let Some(pod) = bound_pod {
        kubernetes["pod"] = serde_json::json!({"name": pod.name, "uid": pod.uid});
    }
    let claims = serde_json::json!({
        "aud": audiences,
        "exp": seconds(expires_at),
        "iat": seconds(SystemTime::now()),
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": service_account_username(namespace, name),
        "kubernetes.io": kubernetes,
    });
    let encode = |v: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    format!(
        "{}.{}.{}",
        encode(&serde_json::json!({"alg": "RS256", "kid": "standin"})),
        encode(&claims),
        random_token()
    )
}

fn random_token() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 48)
}

// A poisoned lock only means another thread panicked mid-insert; the map is still usable.
fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients read a projected token's claims (audience, expiry, ServiceAccount) before they
    /// ask TokenReview; only the table vouches for the token.
    #[test]
    fn service_account_tokens_carry_readable_claims() {
        use base64::Engine as _;
        let auth = Authenticator::new();
        let pod = BoundPod {
            name: "web-1".into(),
            uid: "u-1".into(),
        };
        let (token, expires_at) = auth.issue_service_account_token(
            "shop",
            "web",
            vec!["meshplane-blue".into()],
            Duration::from_secs(600),
            Some(pod),
        );
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3, "{token}");
        let claims: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(parts[1])
                .expect("base64url"),
        )
        .expect("JSON claims");
        assert_eq!(claims["aud"], serde_json::json!(["meshplane-blue"]));
        assert_eq!(claims["sub"], "system:serviceaccount:shop:web");
        assert_eq!(claims["kubernetes.io"]["pod"]["name"], "web-1");
        let exp = expires_at
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        assert_eq!(claims["exp"], exp);
        assert!(auth.lookup(&token).is_some());
        // The same claims with another last segment are no token of the stand-in.
        let forged = format!("{}.{}.x", parts[0], parts[1]);
        assert!(auth.lookup(&forged).is_none());
    }

    #[test]
    fn service_account_usernames_round_trip() {
        let user = UserInfo::service_account("meshplane-blue", "xds");
        assert_eq!(user.username, "system:serviceaccount:meshplane-blue:xds");
        assert_eq!(
            parse_service_account_username(&user.username),
            Some(("meshplane-blue", "xds"))
        );
        assert_eq!(parse_service_account_username("admin"), None);
        assert_eq!(
            parse_service_account_username("system:serviceaccount:a:b:c"),
            None
        );
    }

    #[tokio::test]
    async fn written_kubeconfig_is_read_by_kube() {
        let auth = Authenticator::new();
        let dir = std::env::temp_dir().join(format!("standin-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("operator.kubeconfig");
        auth.write_kubeconfig(&path, "http://127.0.0.1:6443", &Identity::Operator)
            .unwrap();

        let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .unwrap();
        assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:6443/");
        assert!(config.auth_info.token.is_some());
        // The token kube will send is the one in the file.
        let file: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let token = file["users"][0]["user"]["token"]
            .as_str()
            .map(str::to_string);
        let user = auth
            .authenticate(Some(&format!("Bearer {}", token.unwrap())))
            .unwrap();
        assert_eq!(
            user.username,
            service_account_username(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
