//! `meshctl precheck` and `meshctl verify-install`: is this cluster ready for meshplane, and did
//! the install create what it should, in working order.
//!
//! Both read the cluster with the caller's credentials into plain facts, then judge them with
//! pure functions (tested with small builders): [`precheck`] reports findings with stable codes
//! ([`codes`], `MP08xx`) like `analyze`; [`verify_install`] reports each check passed or failed
//! with a reason. [`manifests`] reads the objects an install should have created (`-f`, `-k`).

pub mod codes;
pub mod manifests;
pub mod precheck;
pub mod verify_install;

use k8s_openapi::apimachinery::pkg::version::Info;

/// Namespace the install (`config/default`) puts the operator in.
pub const DEFAULT_OPERATOR_NAMESPACE: &str = "meshplane-system";
/// Name of the operator's Deployment (and Service) in `config/manager`.
pub const OPERATOR_DEPLOYMENT: &str = "meshplane-operator";

/// The oldest Kubernetes minor release meshplane supports: the install's
/// ValidatingAdmissionPolicy (`admissionregistration.k8s.io/v1`, the operator's guardrails) is
/// served from 1.30, and the CRDs' CEL rules (transition rules with `oldSelf` for immutable
/// fields) need CRD validation rules, GA in 1.29. The one place this range is defined.
pub const MIN_KUBERNETES: KubeVersion = KubeVersion {
    major: 1,
    minor: 30,
};

/// A Kubernetes release, major and minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeVersion {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The leading digits of `s` (`"30+"` of some providers is 30).
fn leading_number(s: &str) -> Option<u32> {
    let digits: String = s.trim().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

impl KubeVersion {
    /// The release the API server's `/version` reports: `major`/`minor`, else `gitVersion`
    /// (`v1.30.2-gke.1`).
    pub fn of(info: &Info) -> Option<KubeVersion> {
        if let (Some(major), Some(minor)) =
            (leading_number(&info.major), leading_number(&info.minor))
        {
            return Some(KubeVersion { major, minor });
        }
        let git = info.git_version.trim_start_matches('v');
        let mut parts = git.split('.');
        let major = leading_number(parts.next()?)?;
        let minor = leading_number(parts.next()?)?;
        Some(KubeVersion { major, minor })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(major: &str, minor: &str, git: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: git.into(),
            ..Info::default()
        }
    }

    #[test]
    fn versions_are_read_from_major_minor_or_the_git_version() {
        let v = |major, minor| Some(KubeVersion { major, minor });
        assert_eq!(KubeVersion::of(&info("1", "30", "v1.30.2")), v(1, 30));
        assert_eq!(
            KubeVersion::of(&info("1", "31+", "v1.31.1-gke.2")),
            v(1, 31)
        );
        assert_eq!(KubeVersion::of(&info("", "", "v1.29.0-eks")), v(1, 29));
        assert_eq!(KubeVersion::of(&info("", "", "unknown")), None);
        assert!(
            KubeVersion {
                major: 1,
                minor: 29
            } < MIN_KUBERNETES
        );
        assert!(
            KubeVersion {
                major: 1,
                minor: 37
            } >= MIN_KUBERNETES
        );
        assert!(KubeVersion { major: 2, minor: 0 } > MIN_KUBERNETES);
    }
}
