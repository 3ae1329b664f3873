//! Pacing of the responses a client's own requests cause. Every SotW request that changes a
//! subscription must be answered with the whole subscribed set (xDS protocol, "state of the
//! world"), so a client that alternates two subscriptions makes the server encode and send its
//! full config once per request: a cheap request buys an expensive response. A stream gets a
//! burst of such responses and then a steady rate; past them its responses wait, while its
//! further requests are still read and folded, so a flood of subscription changes collapses
//! into one answer for the latest subscription. Responses caused by config changes (pushes)
//! are never charged.

use std::time::{Duration, Instant};

/// Client-caused responses a stream may get at once (a proxy's start-up asks for a few types,
/// then for the endpoints and routes its clusters and listeners name).
pub const BURST: u32 = 64;
/// Client-caused responses per second after the burst.
pub const RATE: u32 = 16;

/// How many client-caused responses a stream may get: a burst, then a rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacingLimits {
    /// Responses at once.
    pub burst: u32,
    /// Responses per second after the burst (at least one).
    pub rate: u32,
}

impl Default for PacingLimits {
    fn default() -> Self {
        PacingLimits {
            burst: BURST,
            rate: RATE,
        }
    }
}

/// One stream's allowance of client-caused responses.
#[derive(Debug)]
pub struct Pacing {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Pacing {
    pub fn new(limits: PacingLimits, now: Instant) -> Self {
        Self::with(f64::from(limits.rate.max(1)), f64::from(limits.burst), now)
    }

    pub fn with(rate: f64, burst: f64, now: Instant) -> Self {
        Pacing {
            rate,
            burst,
            tokens: burst,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
    }

    /// None when a client-caused response may be sent now, else when one may.
    pub fn wait(&mut self, now: Instant) -> Option<Instant> {
        self.refill(now);
        if self.tokens >= 1.0 {
            return None;
        }
        let missing = 1.0 - self.tokens;
        Some(now + Duration::from_secs_f64(missing / self.rate))
    }

    /// Charges `responses` sent in answer to the client's requests (may go below zero: one
    /// request can ask for several types).
    pub fn charge(&mut self, responses: usize, now: Instant) {
        self.refill(now);
        self.tokens -= responses as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_free_then_responses_wait_for_the_rate() {
        let t0 = Instant::now();
        let mut p = Pacing::with(10.0, 3.0, t0);
        for _ in 0..3 {
            assert_eq!(p.wait(t0), None);
            p.charge(1, t0);
        }
        let after = |w: Option<Instant>| w.map(|w| (w - t0).as_millis());
        assert_eq!(after(p.wait(t0)), Some(100));
        assert_eq!(p.wait(t0 + Duration::from_millis(100)), None);
    }

    #[test]
    fn a_request_answered_with_several_types_costs_each_of_them() {
        let t0 = Instant::now();
        let mut p = Pacing::with(10.0, 4.0, t0);
        p.charge(6, t0);
        // Two below zero: three tokens to earn before the next response.
        assert_eq!(p.wait(t0).map(|w| (w - t0).as_millis()), Some(300));
    }

    #[test]
    fn an_idle_stream_gets_its_burst_back_and_no_more() {
        let t0 = Instant::now();
        let mut p = Pacing::with(10.0, 2.0, t0);
        p.charge(2, t0);
        let later = t0 + Duration::from_secs(3600);
        p.charge(2, later);
        assert!(p.wait(later).is_some(), "the refill stopped at the burst");
    }
}
