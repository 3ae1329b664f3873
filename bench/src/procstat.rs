//! Sampling a process from `/proc` (CPU time, RSS) and reading Prometheus text metrics.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// One reading of a process.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcSample {
    /// User + system CPU seconds since the process started.
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    /// Peak RSS (VmHWM).
    pub peak_rss_bytes: u64,
}

/// Reads `/proc/<pid>/stat` and `/proc/<pid>/status`.
pub fn sample(pid: u32) -> Result<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let cpu_seconds = stat_cpu_seconds(&stat)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Ok(ProcSample {
        cpu_seconds,
        rss_bytes: kb("VmRSS:"),
        peak_rss_bytes: kb("VmHWM:"),
    })
}

/// User + system CPU seconds of the calling thread (`/proc/thread-self/stat`): what one thread,
/// e.g. a single-threaded runtime, has used.
pub fn thread_cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")
        .context("reading /proc/thread-self/stat")?;
    stat_cpu_seconds(&stat)
}

/// utime + stime of a `stat(5)` line, in seconds.
fn stat_cpu_seconds(stat: &str) -> Result<f64> {
    // The command name may hold spaces and parens: fields start after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3 of stat(5); utime and stime are fields 14 and 15.
    let tick = |i: usize| -> Result<f64> {
        let v: f64 = fields
            .get(i - 3)
            .context("short stat")?
            .parse()
            .context("stat field")?;
        Ok(v)
    };
    Ok((tick(14)? + tick(15)?) / USER_HZ)
}

/// Samples a process periodically in the background (bounded by the caller's stop).
#[derive(Clone, Debug, Default)]
pub struct Sampler {
    samples: Arc<Mutex<Vec<(Instant, ProcSample)>>>,
}

impl Sampler {
    /// Samples `pid` every `every` until the returned handle is dropped/aborted or the process ends.
    pub fn start(pid: u32, every: Duration) -> (Self, tokio::task::JoinHandle<()>) {
        let sampler = Sampler::default();
        let samples = Arc::clone(&sampler.samples);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match sample(pid) {
                    Ok(s) => samples
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((Instant::now(), s)),
                    Err(_) => return,
                }
            }
        });
        (sampler, task)
    }

    /// Highest RSS seen between `from` and `to`.
    pub fn peak_rss(&self, from: Instant, to: Instant) -> u64 {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(t, _)| *t >= from && *t <= to)
            .map(|(_, s)| s.rss_bytes)
            .max()
            .unwrap_or(0)
    }
}

/// Average vCPU of a process between two readings.
pub fn vcpu(a: (Instant, ProcSample), b: (Instant, ProcSample)) -> f64 {
    let wall = b.0.saturating_duration_since(a.0).as_secs_f64();
    if wall <= 0.0 {
        0.0
    } else {
        (b.1.cpu_seconds - a.1.cpu_seconds) / wall
    }
}

/// Reading now, with its time.
pub fn now(pid: u32) -> Result<(Instant, ProcSample)> {
    Ok((Instant::now(), sample(pid)?))
}

/// Prometheus text exposition, as (series with labels, value) pairs.
#[derive(Clone, Debug, Default)]
pub struct Metrics(pub Vec<(String, f64)>);

impl Metrics {
    /// Parses the text format (comments skipped).
    pub fn parse(text: &str) -> Self {
        Metrics(
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    Some((series.to_string(), value.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    /// Sum of every series named `name` (any labels) whose labels contain all of `with`.
    pub fn sum(&self, name: &str, with: &[&str]) -> f64 {
        self.0
            .iter()
            .filter(|(s, _)| {
                let base = s.split('{').next().unwrap_or(s);
                base == name && with.iter().all(|w| s.contains(w))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// GETs `http://addr{path}` (plain HTTP/1.0 on loopback, so the body is never chunked).
/// Returns the status code and the body.
pub async fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await?;
        conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut body = Vec::new();
        conn.read_to_end(&mut body).await?;
        anyhow::Ok(body)
    };
    let body = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .with_context(|| format!("GET {path} timed out"))??;
    let text = String::from_utf8_lossy(&body);
    let (head, payload) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    Ok((status, payload.to_string()))
}

/// The server's `/metrics`.
pub async fn scrape(addr: &str) -> Result<Metrics> {
    let (status, body) = http_get(addr, "/metrics").await?;
    anyhow::ensure!(status == 200, "GET /metrics: HTTP {status}");
    Ok(Metrics::parse(&body))
}

impl Metrics {
    /// Quantile `q` of a Prometheus histogram (all label sets summed), by linear
    /// interpolation inside the bucket, as `histogram_quantile` does.
    pub fn histogram_quantile(&self, name: &str, q: f64) -> Option<f64> {
        let bucket = format!("{name}_bucket");
        let mut by_le: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
        for (series, v) in &self.0 {
            if series.split('{').next() != Some(bucket.as_str()) {
                continue;
            }
            let le = series.split("le=\"").nth(1)?.split('"').next()?;
            let bound: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let e = by_le.entry(bound.to_bits()).or_insert((bound, 0.0));
            e.1 += v;
        }
        let mut buckets: Vec<(f64, f64)> = by_le.into_values().collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let target = q * total;
        let mut prev = (0.0, 0.0);
        for (bound, count) in buckets {
            if count >= target {
                if bound.is_infinite() {
                    return Some(prev.0);
                }
                let span = count - prev.1;
                let frac = if span > 0.0 {
                    (target - prev.1) / span
                } else {
                    1.0
                };
                return Some(prev.0 + (bound - prev.0) * frac);
            }
            prev = (bound, count);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id()).expect("own /proc");
        assert!(s.rss_bytes > 0 && s.peak_rss_bytes >= s.rss_bytes);
        assert!(s.cpu_seconds >= 0.0);
    }

    #[test]
    fn parses_prometheus_text() {
        let m = Metrics::parse(
            "# HELP x y\nmeshplane_xds_pushes_total{type=\"eds\"} 12\nmeshplane_xds_pushes_total{type=\"cds\"} 3\nmeshplane_xds_nacks_total{type=\"eds\"} 1\n",
        );
        assert_eq!(m.sum("meshplane_xds_pushes_total", &[]), 15.0);
        assert_eq!(m.sum("meshplane_xds_pushes_total", &["type=\"eds\""]), 12.0);
        assert_eq!(m.sum("meshplane_xds_nacks_total", &[]), 1.0);
    }

    #[test]
    fn histogram_quantile_interpolates_inside_buckets() {
        let m = Metrics::parse(
            "h_bucket{type=\"a\",le=\"0.1\"} 50\nh_bucket{type=\"a\",le=\"0.2\"} 100\nh_bucket{type=\"a\",le=\"+Inf\"} 100\n",
        );
        let p50 = m.histogram_quantile("h", 0.5).expect("p50");
        assert!((p50 - 0.1).abs() < 1e-9);
        let p75 = m.histogram_quantile("h", 0.75).expect("p75");
        assert!((p75 - 0.15).abs() < 1e-9);
        assert_eq!(Metrics::default().histogram_quantile("h", 0.5), None);
    }
}
