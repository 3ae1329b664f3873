//! Kubernetes `$(VAR)` expansion and the runner's rewriting of volume mount paths in args.
//!
//! Expansion follows the kubelet: `$(NAME)` is replaced by the variable's value when it is
//! defined and left as written otherwise; `$$` escapes a `$`.

use std::collections::BTreeMap;

/// Expands `$(VAR)` references in `input` from `vars`.
pub fn expand_vars(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match vars.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Replaces each volume mount path at the start of a path component of `value` by the
/// directory the runner materialised it in. Processes cannot mount at absolute paths, so the
/// args and env that name a mount path are pointed at the materialised copy instead.
/// `mounts` maps mount path → local directory; the longest mount path wins.
pub fn rewrite_mount_paths(value: &str, mounts: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = mounts.iter().collect();
    sorted.sort_by_key(|(mount, _)| std::cmp::Reverse(mount.len()));
    let mut out = String::with_capacity(value.len());
    let mut index = 0;
    'scan: while index < value.len() {
        let starts_component = index == 0
            || matches!(
                value.as_bytes()[index - 1],
                b'=' | b':' | b',' | b' ' | b'"'
            );
        if starts_component {
            for (mount, local) in &sorted {
                let mount = mount.trim_end_matches('/');
                if mount.is_empty() {
                    continue;
                }
                if let Some(tail) = value[index..].strip_prefix(mount) {
                    let boundary = tail.is_empty()
                        || matches!(tail.as_bytes()[0], b'/' | b':' | b',' | b' ' | b'"');
                    if boundary {
                        out.push_str(local);
                        index += mount.len();
                        continue 'scan;
                    }
                }
            }
        }
        let ch = value[index..].chars().next().unwrap_or_default();
        out.push(ch);
        index += ch.len_utf8().max(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> BTreeMap<String, String> {
        [
            ("POD_NAME", "web-1"),
            ("POD_NAMESPACE", "shop"),
            ("EMPTY", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn defined_variables_are_expanded() {
        assert_eq!(
            expand_vars("sidecar~$(POD_NAME).$(POD_NAMESPACE)~x", &vars()),
            "sidecar~web-1.shop~x"
        );
        assert_eq!(expand_vars("a$(EMPTY)b", &vars()), "ab");
    }

    #[test]
    fn undefined_variables_and_escapes_are_kept_as_kubernetes_does() {
        assert_eq!(expand_vars("$(MISSING)/x", &vars()), "$(MISSING)/x");
        assert_eq!(expand_vars("$$(POD_NAME)", &vars()), "$(POD_NAME)");
        assert_eq!(expand_vars("cost $5 and $(", &vars()), "cost $5 and $(");
    }

    #[test]
    fn mount_paths_are_rewritten_only_at_path_boundaries() {
        let mounts = vec![
            ("/var/run/meshplane".to_string(), "/tmp/p/v1".to_string()),
            (
                "/var/run/meshplane/webhook-tls".to_string(),
                "/tmp/p/v2".to_string(),
            ),
        ];
        assert_eq!(
            rewrite_mount_paths("--webhook-tls-dir=/var/run/meshplane/webhook-tls", &mounts),
            "--webhook-tls-dir=/tmp/p/v2"
        );
        assert_eq!(
            rewrite_mount_paths("/var/run/meshplane/token", &mounts),
            "/tmp/p/v1/token"
        );
        assert_eq!(
            rewrite_mount_paths("/var/run/meshplanex", &mounts),
            "/var/run/meshplanex"
        );
        assert_eq!(
            rewrite_mount_paths("/opt/var/run/meshplane", &mounts),
            "/opt/var/run/meshplane"
        );
    }
}
