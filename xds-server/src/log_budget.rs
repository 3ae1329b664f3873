//! Budgets for log lines that a client can cause at will (a connection, a refused stream, a
//! request for a type nobody serves): without one, a client that reconnects in a loop writes
//! the instance's log, and its disk, as fast as it can open streams. Each budget is a token
//! bucket; a line over budget is counted, not written, and the next line written says how many
//! were left out, so the log still tells that something happened and how much.

use std::sync::Mutex;
use std::time::Instant;

/// Lines per second a budget allows after its burst.
const LINES_PER_SECOND: f64 = 10.0;
/// Lines a budget allows at once.
const BURST: f64 = 100.0;

/// One token bucket of log lines.
#[derive(Debug)]
pub struct LogBudget {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
    suppressed: u64,
}

/// What a caller may do with one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write it, saying that this many lines before it were left out.
    Write { suppressed: u64 },
    /// Leave it out (it is counted).
    Suppress,
}

impl LogBudget {
    /// A budget of `rate` lines per second with bursts of `burst`.
    pub const fn new(rate: f64, burst: f64) -> Self {
        LogBudget {
            state: Mutex::new(Bucket {
                rate,
                burst,
                tokens: burst,
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// The instance's default: 10 lines per second, 100 at once.
    pub const fn standard() -> Self {
        Self::new(LINES_PER_SECOND, BURST)
    }

    /// Whether one more line may be written now.
    pub fn line(&self) -> Verdict {
        self.line_at(Instant::now())
    }

    /// [`Self::line`] at `now`.
    pub fn line_at(&self, now: Instant) -> Verdict {
        let mut b = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(last) = b.last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            b.tokens = (b.tokens + elapsed * b.rate).min(b.burst);
        }
        b.last = Some(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Verdict::Write {
                suppressed: std::mem::take(&mut b.suppressed),
            }
        } else {
            b.suppressed += 1;
            Verdict::Suppress
        }
    }
}

/// Connections and disconnections of proxies, and streams refused at admission or over budget.
pub static CONNECTIONS: LogBudget = LogBudget::standard();
/// Requests a stream makes that the server does not act on (unknown types).
pub static PROTOCOL: LogBudget = LogBudget::standard();

/// Writes a line through `budget`: `$level` is a `tracing` macro, the rest its arguments. A
/// line written after suppressed ones carries `suppressed = N`.
#[macro_export]
macro_rules! budgeted {
    ($budget:expr, $level:ident, $($arg:tt)+) => {
        match $budget.line() {
            $crate::log_budget::Verdict::Write { suppressed: 0 } => tracing::$level!($($arg)+),
            $crate::log_budget::Verdict::Write { suppressed } => {
                tracing::$level!(suppressed, $($arg)+)
            }
            $crate::log_budget::Verdict::Suppress => {}
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_is_cut_at_the_budget_and_the_next_line_counts_what_was_left_out() {
        let budget = LogBudget::new(10.0, 100.0);
        let start = Instant::now();
        let written = (0..10_000)
            .filter(|_| budget.line_at(start) != Verdict::Suppress)
            .count();
        assert_eq!(
            written, 100,
            "a loop of 10,000 connections writes the burst only"
        );
        assert_eq!(
            budget.line_at(start + Duration::from_millis(100)),
            Verdict::Write { suppressed: 9_900 }
        );
        assert_eq!(
            budget.line_at(start + Duration::from_millis(100)),
            Verdict::Suppress
        );
    }

    #[test]
    fn a_quiet_budget_refills_to_its_burst_and_no_further() {
        let budget = LogBudget::new(10.0, 5.0);
        let start = Instant::now();
        for _ in 0..5 {
            assert_eq!(budget.line_at(start), Verdict::Write { suppressed: 0 });
        }
        assert_eq!(budget.line_at(start), Verdict::Suppress);
        let later = start + Duration::from_secs(3600);
        let written = (0..50)
            .filter(|_| budget.line_at(later) != Verdict::Suppress)
            .count();
        assert_eq!(written, 5);
    }
}
