//! A proxy's own request statistics, read from Envoy's `/stats/prometheus` (the bootstrap's
//! readiness listener serves that one admin path, contract 6): completed requests, 5xx answers
//! and the request-duration histogram's sum and count, of the inbound HTTP connection managers
//! (the requests the workload served), summed over a batch's pods.

use meshplane_crds::migration::TrafficFigures;

/// Statistics of one proxy's inbound HTTP connection managers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProxyTraffic {
    pub requests: f64,
    pub errors: f64,
    /// Sum of request durations, milliseconds.
    pub time_sum_ms: f64,
    /// Number of durations in the sum.
    pub time_count: f64,
}

impl ProxyTraffic {
    /// The sum of several proxies' statistics.
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a ProxyTraffic>) -> ProxyTraffic {
        all.into_iter()
            .fold(ProxyTraffic::default(), |a, b| ProxyTraffic {
                requests: a.requests + b.requests,
                errors: a.errors + b.errors,
                time_sum_ms: a.time_sum_ms + b.time_sum_ms,
                time_count: a.time_count + b.time_count,
            })
    }

    /// As the status reports it.
    pub fn figures(&self) -> TrafficFigures {
        TrafficFigures {
            requests: self.requests.round() as i64,
            errors: self.errors.round() as i64,
            mean_latency_ms: (self.time_count > 0.0)
                .then(|| round3(self.time_sum_ms / self.time_count)),
        }
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Whether an HTTP connection manager stat prefix is an inbound one (the xds-server names them
/// after the inbound cluster, `inbound|<port>||`); the bootstrap's own `readiness` listener and
/// outbound listeners are left out.
fn is_inbound(prefix: &str) -> bool {
    prefix.starts_with("inbound")
}

/// One sample line `name{labels} value` of the Prometheus text format.
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

fn sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, rest.strip_suffix('}')?),
        None => (series, ""),
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The value of label `key` in a `k="v",k2="v2"` list (values may contain `,` but not `"`,
/// which Envoy's stat names never carry).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (k, after) = rest.split_once("=\"")?;
        let (v, after) = after.split_once('"')?;
        if k.trim_start_matches(',') == key {
            return Some(v);
        }
        rest = after;
    }
    None
}

/// The inbound traffic figures of one proxy's `/stats/prometheus` text. Lines it does not
/// understand are ignored: the format carries hundreds of families.
pub fn parse_prometheus(text: &str) -> ProxyTraffic {
    let mut out = ProxyTraffic::default();
    for s in text.lines().filter_map(sample) {
        let inbound = label(s.labels, "envoy_http_conn_manager_prefix").is_some_and(is_inbound);
        if !inbound || !s.value.is_finite() {
            continue;
        }
        match s.name {
            "envoy_http_downstream_rq_completed" => out.requests += s.value,
            "envoy_http_downstream_rq_xx"
                if label(s.labels, "envoy_response_code_class") == Some("5") =>
            {
                out.errors += s.value
            }
            "envoy_http_downstream_rq_time_sum" => out.time_sum_ms += s.value,
            "envoy_http_downstream_rq_time_count" => out.time_count += s.value,
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = r#"# TYPE envoy_http_downstream_rq_completed counter
envoy_http_downstream_rq_completed{envoy_http_conn_manager_prefix="inbound|8080||"} 40
envoy_http_downstream_rq_completed{envoy_http_conn_manager_prefix="readiness"} 900
envoy_http_downstream_rq_completed{envoy_http_conn_manager_prefix="outbound_0.0.0.0_80"} 7
# TYPE envoy_http_downstream_rq_xx counter
envoy_http_downstream_rq_xx{envoy_response_code_class="2",envoy_http_conn_manager_prefix="inbound|8080||"} 36
envoy_http_downstream_rq_xx{envoy_response_code_class="5",envoy_http_conn_manager_prefix="inbound|8080||"} 4
envoy_http_downstream_rq_xx{envoy_response_code_class="5",envoy_http_conn_manager_prefix="readiness"} 3
# TYPE envoy_http_downstream_rq_time histogram
envoy_http_downstream_rq_time_bucket{envoy_http_conn_manager_prefix="inbound|8080||",le="0.5"} 10
envoy_http_downstream_rq_time_sum{envoy_http_conn_manager_prefix="inbound|8080||"} 100.5
envoy_http_downstream_rq_time_count{envoy_http_conn_manager_prefix="inbound|8080||"} 40
envoy_cluster_upstream_rq_total{envoy_cluster_name="xds-grpc"} 3
"#;

    #[test]
    fn only_inbound_connection_managers_count() {
        let t = parse_prometheus(STATS);
        assert_eq!(
            t,
            ProxyTraffic {
                requests: 40.0,
                errors: 4.0,
                time_sum_ms: 100.5,
                time_count: 40.0
            }
        );
        assert_eq!(
            t.figures(),
            TrafficFigures {
                requests: 40,
                errors: 4,
                mean_latency_ms: Some(2.513)
            }
        );
    }

    #[test]
    fn proxies_add_up_and_garbage_is_ignored() {
        let a = parse_prometheus(STATS);
        let b = parse_prometheus("not a metric\nenvoy_http_downstream_rq_completed{envoy_http_conn_manager_prefix=\"inbound|9090||\"} 10\nbroken{ 3\n");
        let total = ProxyTraffic::sum([&a, &b]);
        assert_eq!(total.requests, 50.0);
        assert_eq!(total.errors, 4.0);
        assert_eq!(ProxyTraffic::default().figures().mean_latency_ms, None);
    }
}
