//! Small statistics helpers for the result tables.

use std::time::Duration;

/// The `q`-quantile (0..=1) of `values` by nearest rank; `None` when empty.
pub fn quantile(values: &mut [Duration], q: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = (q.clamp(0.0, 1.0) * values.len() as f64).ceil() as usize;
    values
        .get(rank.saturating_sub(1).min(values.len() - 1))
        .copied()
}

/// Milliseconds with one decimal, or `n/a`.
pub fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "n/a".to_string(),
        |d| format!("{:.1} ms", d.as_secs_f64() * 1e3),
    )
}

/// Human-readable bytes (KiB/MiB/GiB).
pub fn bytes(n: f64) -> String {
    const K: f64 = 1024.0;
    if n >= K * K * K {
        format!("{:.2} GiB", n / (K * K * K))
    } else if n >= K * K {
        format!("{:.1} MiB", n / (K * K))
    } else if n >= K {
        format!("{:.1} KiB", n / K)
    } else {
        format!("{n:.0} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&mut v, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&mut v, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&mut v, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(quantile(&mut [], 0.5), None);
        let mut one = [Duration::from_millis(7)];
        assert_eq!(quantile(&mut one, 0.99), Some(Duration::from_millis(7)));
    }

    #[test]
    fn formats() {
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
        assert_eq!(ms(Some(Duration::from_micros(1500))), "1.5 ms");
        assert_eq!(ms(None), "n/a");
    }
}
