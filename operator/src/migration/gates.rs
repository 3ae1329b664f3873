//! The health gates of one batch, as a function of what is observed (docs/migration.md):
//!
//! 1. `NoNacks`: no proxy of the batch rejected its config from the new revision (fails at
//!    once: a NACK does not heal by waiting);
//! 2. `PodsReady`: every workload restarted for this batch, rolled out, every pod Ready and
//!    injected by the new revision;
//! 3. `ProxiesConnected`: every pod's proxy connected to the new revision's instances;
//! 4. `ProxiesSynced`: each holds what it was last sent;
//! 5. `Observe`: the batch stayed healthy for `observeSeconds`;
//! 6. `ErrorRate`, `Latency`: the batch's inbound traffic since its restart against before.
//!
//! A gate still waiting when `timeoutSeconds` have passed since the restart fails.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use meshplane_crds::migration::{GateResult, GateSettings, TrafficFigures};

use super::proxies::ConnectedProxy;
use super::stats::ProxyTraffic;
use super::workloads::WorkloadState;

/// Gate names, as status and Events carry them.
pub mod gate {
    pub const NO_NACKS: &str = "NoNacks";
    pub const PODS_READY: &str = "PodsReady";
    pub const PROXIES_CONNECTED: &str = "ProxiesConnected";
    pub const PROXIES_SYNCED: &str = "ProxiesSynced";
    pub const OBSERVE: &str = "Observe";
    pub const ERROR_RATE: &str = "ErrorRate";
    pub const LATENCY: &str = "Latency";
    pub const ABORTED: &str = "Aborted";
}

/// What one evaluation concluded.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// A gate is not passed yet; `healthy_since` is the start of the observation window (set
    /// once gates 1–4 pass, cleared when they stop passing).
    Waiting {
        gate: GateResult,
        healthy_since: Option<Timestamp>,
        after: Option<TrafficFigures>,
    },
    /// Every gate passed.
    Passed {
        gate: GateResult,
        after: Option<TrafficFigures>,
    },
    /// A gate failed (or timed out waiting).
    Failed {
        gate: GateResult,
        after: Option<TrafficFigures>,
    },
}

/// What the gates of a batch are evaluated on.
pub struct BatchInput<'a> {
    /// The new revision.
    pub revision: &'a str,
    /// The batch's restart annotation value.
    pub restarted_at: &'a str,
    /// When the batch was restarted.
    pub started: Timestamp,
    /// Start of the observation window, if the batch was already healthy.
    pub healthy_since: Option<Timestamp>,
    /// The batch's traffic before the restart.
    pub before: Option<&'a TrafficFigures>,
    pub workloads: &'a [WorkloadState],
    /// The proxies connected to the new revision's instances, or why they could not be read.
    pub proxies: &'a Result<Vec<ConnectedProxy>, String>,
    pub settings: &'a GateSettings,
    pub now: Timestamp,
}

fn result(gate: &str, passed: bool, message: String) -> GateResult {
    GateResult {
        gate: gate.to_string(),
        passed,
        message,
    }
}

/// Gates 1–4; `Err` carries (failed for good, result).
fn health(input: &BatchInput<'_>) -> Result<(), (bool, GateResult)> {
    let empty = Vec::new();
    let proxies = input.proxies.as_ref().unwrap_or(&empty);
    let proxy_of = |namespace: &str, pod: &str| {
        proxies
            .iter()
            .find(|p| p.namespace == namespace && p.pod_name.as_deref() == Some(pod))
    };
    // 1. A NACK from any pod of the batch, ready or not, fails the batch at once.
    for w in input.workloads {
        for pod in &w.pods {
            let Some(proxy) = proxy_of(&w.namespace, &pod.name) else {
                continue;
            };
            if let Some((t, nack)) = proxy
                .types
                .iter()
                .find_map(|t| t.current_nack().map(|n| (t, n)))
            {
                let message = clip_nack(&nack.message);
                return Err((
                    true,
                    result(
                        gate::NO_NACKS,
                        false,
                        format!(
                            "proxy of pod {}/{} rejected {} version {} from {}: {message}",
                            w.namespace, pod.name, t.type_name, nack.version, input.revision
                        ),
                    ),
                ));
            }
        }
    }
    // 2. Restarted, rolled out, every pod Ready on the new revision.
    for w in input.workloads {
        if w.restarted_at.as_deref() != Some(input.restarted_at) {
            return Err((
                false,
                result(
                    gate::PODS_READY,
                    false,
                    format!("{} is not restarted yet", w.key()),
                ),
            ));
        }
        let on_new = w
            .pods
            .iter()
            .filter(|p| p.ready && p.revision.as_deref() == Some(input.revision))
            .count();
        if !w.rolled_out || on_new < w.pods.len() {
            let others: Vec<String> = w
                .pods
                .iter()
                .filter(|p| p.revision.as_deref() != Some(input.revision))
                .map(|p| {
                    format!(
                        "{} on {}",
                        p.name,
                        p.revision.as_deref().unwrap_or("no proxy")
                    )
                })
                .take(5)
                .collect();
            return Err((
                false,
                result(
                    gate::PODS_READY,
                    false,
                    format!(
                        "{}: {on_new}/{} pods Ready on {}{}{}",
                        w.key(),
                        w.pods.len(),
                        input.revision,
                        if w.rolled_out {
                            ""
                        } else {
                            ", rollout in progress"
                        },
                        if others.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", others.join(", "))
                        }
                    ),
                ),
            ));
        }
    }
    // 3, 4. Connected and synced.
    if let Err(e) = input.proxies {
        return Err((
            false,
            result(
                gate::PROXIES_CONNECTED,
                false,
                format!("the instances of {} could not be read: {e}", input.revision),
            ),
        ));
    }
    let pods = input
        .workloads
        .iter()
        .flat_map(|w| w.pods.iter().map(move |p| (w.namespace.as_str(), p)));
    let (mut total, mut connected, mut synced) = (0, 0, 0);
    let mut first_missing = None;
    let mut first_unsynced = None;
    for (namespace, pod) in pods {
        total += 1;
        match proxy_of(namespace, &pod.name) {
            None => {
                first_missing.get_or_insert_with(|| format!("{namespace}/{}", pod.name));
            }
            Some(proxy) => {
                connected += 1;
                match proxy.types.iter().find(|t| !t.synced()) {
                    None => synced += 1,
                    Some(t) => {
                        first_unsynced.get_or_insert_with(|| {
                            format!(
                                "{namespace}/{} ({} not acknowledged)",
                                pod.name, t.type_name
                            )
                        });
                    }
                }
            }
        }
    }
    if let Some(pod) = first_missing {
        return Err((
            false,
            result(
                gate::PROXIES_CONNECTED,
                false,
                format!(
                    "{connected}/{total} proxies connected to {}; waiting for {pod}",
                    input.revision
                ),
            ),
        ));
    }
    if let Some(pod) = first_unsynced {
        return Err((
            false,
            result(
                gate::PROXIES_SYNCED,
                false,
                format!("{synced}/{total} proxies synced; waiting for {pod}"),
            ),
        ));
    }
    Ok(())
}

/// Longest NACK message quoted in a gate result.
const MAX_NACK_MESSAGE: usize = 300;

/// An Envoy rejection as one line of at most [`MAX_NACK_MESSAGE`] characters. Envoy puts the
/// offending resource's proto dump first and the reason last, so a long message keeps its
/// beginning (which resource) and its end (why).
fn clip_nack(message: &str) -> String {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = line.chars().collect();
    if chars.len() <= MAX_NACK_MESSAGE {
        return line;
    }
    let head: String = chars[..80].iter().collect();
    let tail: String = chars[chars.len() - (MAX_NACK_MESSAGE - 81)..]
        .iter()
        .collect();
    format!("{head}…{tail}")
}

fn percent(part: i64, whole: i64) -> f64 {
    if whole <= 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Gates 6: error rate and latency since the restart against before.
pub fn traffic_gates(
    before: Option<&TrafficFigures>,
    after: &TrafficFigures,
    settings: &GateSettings,
) -> GateResult {
    let min = settings.min_requests;
    let Some(before) = before.filter(|b| b.requests >= min && after.requests >= min) else {
        return result(
            gate::ERROR_RATE,
            true,
            format!(
                "traffic too thin to judge ({} requests before, {} after; {min} needed on both sides)",
                before.map_or(0, |b| b.requests),
                after.requests
            ),
        );
    };
    let rate_before = percent(before.errors, before.requests);
    let rate_after = percent(after.errors, after.requests);
    if rate_after - rate_before > settings.max_error_rate_increase_percent {
        return result(
            gate::ERROR_RATE,
            false,
            format!(
                "5xx rate {rate_after:.2}% ({} of {}) against {rate_before:.2}% ({} of {}) before: +{:.2} points, more than the {:.2} allowed",
                after.errors, after.requests, before.errors, before.requests,
                rate_after - rate_before, settings.max_error_rate_increase_percent
            ),
        );
    }
    if let (Some(lb), Some(la)) = (before.mean_latency_ms, after.mean_latency_ms) {
        let limit = lb * (1.0 + settings.max_latency_increase_percent / 100.0);
        // Envoy's durations are whole milliseconds: a sub-millisecond mean is noise.
        if la > limit && la - lb >= 1.0 {
            return result(
                gate::LATENCY,
                false,
                format!(
                    "mean latency {la:.3} ms against {lb:.3} ms before: more than the {:.0}% rise allowed (limit {limit:.3} ms)",
                    settings.max_latency_increase_percent
                ),
            );
        }
    }
    result(
        gate::LATENCY,
        true,
        format!(
            "5xx rate {rate_after:.2}% (before {rate_before:.2}%), mean latency {} ms (before {} ms), over {} requests",
            after.mean_latency_ms.map_or("-".into(), |v| format!("{v:.3}")),
            before.mean_latency_ms.map_or("-".into(), |v| format!("{v:.3}")),
            after.requests
        ),
    )
}

/// The traffic of a batch's pods on the new revision, when every such pod's statistics could
/// be read.
pub fn batch_traffic(
    workloads: &[WorkloadState],
    revision: Option<&str>,
) -> Option<TrafficFigures> {
    let pods: Vec<_> = workloads
        .iter()
        .flat_map(|w| &w.pods)
        .filter(|p| revision.is_none_or(|r| p.revision.as_deref() == Some(r)))
        .collect();
    let traffic: Option<Vec<&ProxyTraffic>> = pods.iter().map(|p| p.traffic.as_ref()).collect();
    traffic.map(|t| ProxyTraffic::sum(t).figures())
}

/// Evaluates every gate of a batch.
pub fn evaluate(input: &BatchInput<'_>) -> Verdict {
    let elapsed = input.now.duration_since(input.started);
    let timeout = SignedDuration::from_secs(i64::from(input.settings.timeout_seconds));
    let timed_out = |mut gate: GateResult, after| {
        if elapsed >= timeout {
            gate.passed = false;
            gate.message = format!(
                "timed out after {}s: {}",
                input.settings.timeout_seconds, gate.message
            );
            Verdict::Failed { gate, after }
        } else {
            Verdict::Waiting {
                gate,
                healthy_since: None,
                after,
            }
        }
    };
    match health(input) {
        Err((true, gate)) => return Verdict::Failed { gate, after: None },
        Err((false, gate)) => return timed_out(gate, None),
        Ok(()) => {}
    }
    let healthy_since = input.healthy_since.unwrap_or(input.now);
    let observe = SignedDuration::from_secs(i64::from(input.settings.observe_seconds));
    let observed = input.now.duration_since(healthy_since);
    let after = batch_traffic(input.workloads, Some(input.revision));
    if observed < observe {
        let gate = result(
            gate::OBSERVE,
            false,
            format!(
                "healthy; observing traffic for {}s of {}s",
                observed.as_secs(),
                input.settings.observe_seconds
            ),
        );
        return match timed_out(gate, after.clone()) {
            Verdict::Waiting { gate, after, .. } => Verdict::Waiting {
                gate,
                healthy_since: Some(healthy_since),
                after,
            },
            failed => failed,
        };
    }
    let Some(after_figures) = after.clone() else {
        let gate = result(
            gate::ERROR_RATE,
            false,
            "the statistics of the batch's proxies could not be read".to_string(),
        );
        return match timed_out(gate, None) {
            Verdict::Waiting { gate, after, .. } => Verdict::Waiting {
                gate,
                healthy_since: Some(healthy_since),
                after,
            },
            failed => failed,
        };
    };
    // Envoy publishes request durations at its stats flush (every 5 s), counters at once: with
    // enough requests but no duration yet, the latency is unknown, not fine.
    let min = input.settings.min_requests;
    let judged = input
        .before
        .is_some_and(|b| b.requests >= min && b.mean_latency_ms.is_some());
    if judged && after_figures.requests >= min && after_figures.mean_latency_ms.is_none() {
        let gate = result(
            gate::LATENCY,
            false,
            format!(
                "{} requests served, their durations not published by the proxies yet",
                after_figures.requests
            ),
        );
        return match timed_out(gate, after) {
            Verdict::Waiting { gate, after, .. } => Verdict::Waiting {
                gate,
                healthy_since: Some(healthy_since),
                after,
            },
            failed => failed,
        };
    }
    let gate = traffic_gates(input.before, &after_figures, input.settings);
    if gate.passed {
        Verdict::Passed { gate, after }
    } else {
        Verdict::Failed { gate, after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_envoy_rejection_keeps_the_resource_and_the_reason_on_one_line() {
        let dump = "  lb_endpoints {\n    endpoint { address { socket_address { port_value: 8080 } } }\n  }\n".repeat(20);
        let message = format!(
            "goo.gle/debugproto  \nname: \"PassthroughCluster\"\ntype: ORIGINAL_DST\n{dump}: Proto constraint validation failed (ClusterValidationError.ConnectTimeout: value must be greater than 0s)"
        );
        let clipped = clip_nack(&message);
        assert!(clipped.chars().count() <= MAX_NACK_MESSAGE, "{clipped}");
        assert!(!clipped.contains('\n'));
        assert!(
            clipped.contains("name: \"PassthroughCluster\""),
            "{clipped}"
        );
        assert!(
            clipped.ends_with("ConnectTimeout: value must be greater than 0s)"),
            "{clipped}"
        );
        assert_eq!(clip_nack("short\nreason"), "short reason");
    }
}
