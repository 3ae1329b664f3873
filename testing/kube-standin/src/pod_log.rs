//! The `pods/<name>/log` subresource, as kube-apiserver serves it from the kubelet: `GET` with
//! `container` (required when the pod has more than one), `tailLines`, `limitBytes`, answered
//! as `text/plain`; authorized as `get` on `pods/log`. What a container wrote comes from the
//! node ([`PodLogs`], supplied by the pod runner). Not served: `follow`, `previous`,
//! `sinceSeconds`/`sinceTime` and `timestamps` (answered 400, so a client relying on them
//! notices).

use std::sync::Arc;

use crate::error::ApiError;
use crate::port_forward::PodRef;
use axum::body::Body;
use axum::response::Response;
use futures::future::BoxFuture;
use http::{header, HeaderValue, StatusCode};
use serde_json::Value;

type Read =
    dyn Fn(PodRef, String) -> BoxFuture<'static, std::io::Result<Vec<u8>>> + Send + Sync + 'static;

/// How the stand-in reads what a container of a pod wrote (the kubelet's part of `pods/log`).
/// Without it, every pod's log is empty.
#[derive(Clone, Default)]
pub struct PodLogs(Option<Arc<Read>>);

impl PodLogs {
    pub fn new<F, Fut>(read: F) -> Self
    where
        F: Fn(PodRef, String) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::io::Result<Vec<u8>>> + Send + 'static,
    {
        PodLogs(Some(Arc::new(move |pod, container| {
            Box::pin(read(pod, container))
        })))
    }

    async fn read(&self, pod: PodRef, container: String) -> std::io::Result<Vec<u8>> {
        match &self.0 {
            Some(read) => read(pod, container).await,
            None => Ok(Vec::new()),
        }
    }
}

impl std::fmt::Debug for PodLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "PodLogs"
        } else {
            "PodLogs(none)"
        })
    }
}

/// The options of a log request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub container: Option<String>,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
}

impl LogOptions {
    /// Reads the query; options the stand-in does not serve are refused.
    pub fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let mut out = LogOptions::default();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = |what: &str| {
                value.parse::<usize>().map_err(|_| {
                    ApiError::bad_request(format!("{what} must be a non-negative number"))
                })
            };
            match key {
                "container" => out.container = Some(value.to_string()).filter(|c| !c.is_empty()),
                "tailLines" => out.tail_lines = Some(number("tailLines")?),
                "limitBytes" => out.limit_bytes = Some(number("limitBytes")?),
                "follow" | "previous" | "timestamps" if value.is_empty() || value == "false" => {}
                "follow" | "previous" | "timestamps" | "sinceSeconds" | "sinceTime" => {
                    return Err(ApiError::bad_request(format!(
                        "the stand-in's pods/log does not serve {key}"
                    )))
                }
                // `pretty`, `insecureSkipTLSVerifyBackend` and the like change nothing here.
                _ => {}
            }
        }
        Ok(out)
    }
}

fn names(pod: &Value, field: &str) -> Vec<String> {
    pod.pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// The container a request reads: the named one, or the pod's only container.
pub fn container_of(pod: &Value, pod_name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let containers = names(pod, "containers");
    let init = names(pod, "initContainers");
    match asked {
        Some(c) if containers.iter().chain(&init).any(|n| n == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {pod_name}"
        ))),
        None => match containers.as_slice() {
            [only] => Ok(only.clone()),
            _ => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {pod_name}, choose one of: [{}] or one of the init containers: [{}]",
                containers.join(" "),
                init.join(" ")
            ))),
        },
    }
}

/// `tailLines` then `limitBytes`, as the kubelet applies them.
pub fn cut(mut text: Vec<u8>, options: &LogOptions) -> Vec<u8> {
    if let Some(n) = options.tail_lines {
        // The last `n` lines: a trailing newline ends the last line, it does not start one.
        let body = text.strip_suffix(b"\n").unwrap_or(&text);
        let start = if n == 0 {
            text.len()
        } else {
            body.iter()
                .enumerate()
                .rev()
                .filter(|(_, b)| **b == b'\n')
                .nth(n - 1)
                .map_or(0, |(i, _)| i + 1)
        };
        text.drain(..start);
    }
    if let Some(limit) = options.limit_bytes {
        text.truncate(limit);
    }
    text
}

/// Reads the log of `pod` (its stored object) as `options` ask.
pub async fn serve(
    logs: &PodLogs,
    pod: &Value,
    pod_ref: PodRef,
    options: &LogOptions,
) -> Result<Response, ApiError> {
    let container = container_of(pod, &pod_ref.name, options.container.as_deref())?;
    let text = logs.read(pod_ref, container).await.map_err(|e| {
        ApiError::new(
            500,
            "InternalError",
            format!("reading the container's log: {e}"),
        )
    })?;
    let mut response = Response::new(Body::from(cut(text, options)));
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tail_lines_and_limit_bytes_cut_as_the_kubelet_does() {
        let text = b"one\ntwo\nthree\n".to_vec();
        let opts = |tail, limit| LogOptions {
            container: None,
            tail_lines: tail,
            limit_bytes: limit,
        };
        assert_eq!(cut(text.clone(), &opts(Some(2), None)), b"two\nthree\n");
        assert_eq!(cut(text.clone(), &opts(Some(5), None)), text);
        assert_eq!(cut(text.clone(), &opts(Some(0), None)), b"");
        assert_eq!(cut(text.clone(), &opts(Some(1), Some(3))), b"thr");
    }

    #[test]
    fn the_container_is_named_or_the_only_one() {
        let pod = json!({"spec": {"initContainers": [{"name": "capture"}],
                                  "containers": [{"name": "app"}, {"name": "proxy"}]}});
        assert_eq!(
            container_of(&pod, "web-1", Some("proxy")).expect("valid"),
            "proxy"
        );
        assert_eq!(
            container_of(&pod, "web-1", Some("capture")).expect("valid"),
            "capture"
        );
        let err = container_of(&pod, "web-1", None).expect_err("two containers");
        assert!(
            err.message.contains("choose one of: [app proxy]"),
            "{}",
            err.message
        );
        assert!(container_of(&pod, "web-1", Some("db")).is_err());
        let single = json!({"spec": {"containers": [{"name": "app"}]}});
        assert_eq!(container_of(&single, "x", None).expect("only one"), "app");
    }

    #[test]
    fn unserved_options_are_refused() {
        assert_eq!(
            LogOptions::parse(Some("container=app&tailLines=10&follow=false")).expect("served"),
            LogOptions {
                container: Some("app".into()),
                tail_lines: Some(10),
                limit_bytes: None
            }
        );
        for q in [
            "follow=true",
            "sinceSeconds=10",
            "previous=true",
            "tailLines=-1",
        ] {
            assert!(LogOptions::parse(Some(q)).is_err(), "{q}");
        }
    }
}
