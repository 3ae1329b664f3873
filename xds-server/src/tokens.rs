//! What a bearer token says about itself before anyone vouches for it, and the TokenReview
//! budgets a review is charged to.
//!
//! A projected ServiceAccount token is a JWT whose claims name its audiences, its expiry and
//! its ServiceAccount. Those claims are read unverified, for two things only: to refuse, without
//! asking the API server, a token that could never pass (not a JWT, another audience, expired),
//! and to pick which budgets a review is charged to. Identity always comes from the TokenReview
//! answer.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Longest bearer token looked at (projected tokens are about 1 KiB).
pub const MAX_TOKEN: usize = 8 * 1024;
/// Sources remembered per budget kind; past it, sources share one overflow bucket.
pub const MAX_SOURCES: usize = 4096;

/// Why a token was refused without a TokenReview (the `reason` label of
/// `meshplane_xds_token_refusals_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Not a JWT with JSON claims, or longer than [`MAX_TOKEN`].
    Malformed,
    /// Its `aud` claim does not name the audience asked for.
    WrongAudience,
    /// No `exp` claim, or one in the past.
    Expired,
    /// A TokenReview refused the same token a short while ago.
    RefusedBefore,
    /// The budget of the peer address it came from is spent.
    PeerBudget,
    /// The budget of the namespace its claims name is spent.
    NamespaceBudget,
    /// The budget of the service (ADS, certificates, debug) is spent.
    ServiceBudget,
}

impl Refusal {
    pub const ALL: [Refusal; 7] = [
        Refusal::Malformed,
        Refusal::WrongAudience,
        Refusal::Expired,
        Refusal::RefusedBefore,
        Refusal::PeerBudget,
        Refusal::NamespaceBudget,
        Refusal::ServiceBudget,
    ];

    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::WrongAudience => "wrong_audience",
            Refusal::Expired => "expired",
            Refusal::RefusedBefore => "refused_before",
            Refusal::PeerBudget => "peer_budget",
            Refusal::NamespaceBudget => "namespace_budget",
            Refusal::ServiceBudget => "service_budget",
        }
    }

    /// Whether retrying later may succeed (a budget), rather than never (the token itself).
    pub fn is_throttle(self) -> bool {
        matches!(
            self,
            Refusal::PeerBudget | Refusal::NamespaceBudget | Refusal::ServiceBudget
        )
    }
}

/// The unverified claims of a token that passed [`precheck`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    pub expiry: SystemTime,
    /// The namespace of `sub` (`system:serviceaccount:NS:NAME`) or of the `kubernetes.io`
    /// claim; `None` when neither names one.
    pub namespace: Option<String>,
}

/// Refuses a token that cannot be a projected ServiceAccount token for `audience` valid at
/// `now`, reading only the token itself.
pub fn precheck(token: &str, audience: &str, now: SystemTime) -> Result<Claims, Refusal> {
    use base64::Engine as _;
    if token.len() > MAX_TOKEN {
        return Err(Refusal::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Malformed);
    };
    if signature.is_empty() {
        return Err(Refusal::Malformed);
    }
    let decode = |segment: &str| -> Result<serde_json::Map<String, serde_json::Value>, Refusal> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(segment.trim_end_matches('='))
            .map_err(|_| Refusal::Malformed)?;
        match serde_json::from_slice(&bytes) {
            Ok(serde_json::Value::Object(map)) => Ok(map),
            _ => Err(Refusal::Malformed),
        }
    };
    decode(header)?;
    let claims = decode(payload)?;
    let audience_ok = match claims.get("aud") {
        Some(serde_json::Value::String(a)) => a == audience,
        Some(serde_json::Value::Array(list)) => list.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    };
    if !audience_ok {
        return Err(Refusal::WrongAudience);
    }
    let expiry = claims
        .get("exp")
        .and_then(serde_json::Value::as_u64)
        .map(|exp| UNIX_EPOCH + Duration::from_secs(exp))
        .filter(|exp| *exp > now)
        .ok_or(Refusal::Expired)?;
    let from_sub = claims
        .get("sub")
        .and_then(serde_json::Value::as_str)
        .and_then(crate::tenancy::service_account_namespace);
    let from_kubernetes = claims
        .get("kubernetes.io")
        .and_then(|k| k.get("namespace"))
        .and_then(serde_json::Value::as_str);
    let namespace = from_sub
        .or(from_kubernetes)
        .filter(|ns| ns.len() <= 63)
        .map(str::to_owned);
    Ok(Claims { expiry, namespace })
}

/// A token bucket's refill rate and size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

impl Rate {
    pub fn new(per_second: f64, burst: f64) -> Self {
        Self {
            per_second: per_second.max(0.0),
            burst: burst.max(1.0),
        }
    }
}

/// TokenReviews one service may send for tokens it has not seen recently: per peer address,
/// per namespace the token claims, and in all.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReviewBudget {
    pub per_peer: Rate,
    pub per_namespace: Rate,
    pub per_service: Rate,
}

impl Default for ReviewBudget {
    fn default() -> Self {
        Self {
            per_peer: Rate::new(5.0, 20.0),
            per_namespace: Rate::new(50.0, 200.0),
            per_service: Rate::new(200.0, 800.0),
        }
    }
}

impl ReviewBudget {
    /// The same rate for every kind of source (tests).
    pub fn uniform(per_second: f64, burst: f64) -> Self {
        let rate = Rate::new(per_second, burst);
        Self {
            per_peer: rate,
            per_namespace: rate,
            per_service: rate,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Self {
        Self {
            tokens: rate.burst,
            refilled: now,
        }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_second).min(rate.burst);
        self.refilled = now;
    }
}

/// Buckets by source, bounded: full buckets are forgotten first (a source that comes back
/// gets a full one again), and past [`MAX_SOURCES`] live ones new sources share one.
#[derive(Debug)]
struct Keyed<K> {
    rate: Rate,
    buckets: HashMap<K, Bucket>,
    overflow: Bucket,
}

impl<K: std::hash::Hash + Eq + Clone> Keyed<K> {
    fn new(rate: Rate, now: Instant) -> Self {
        Self {
            rate,
            buckets: HashMap::new(),
            overflow: Bucket::full(rate, now),
        }
    }

    fn bucket(&mut self, key: &K, now: Instant) -> &mut Bucket {
        let rate = self.rate;
        if !self.buckets.contains_key(key) && self.buckets.len() >= MAX_SOURCES {
            self.buckets.retain(|_, b| {
                b.refill(rate, now);
                b.tokens < rate.burst
            });
        }
        if !self.buckets.contains_key(key) && self.buckets.len() >= MAX_SOURCES {
            self.overflow.refill(rate, now);
            return &mut self.overflow;
        }
        let bucket = self
            .buckets
            .entry(key.clone())
            .or_insert_with(|| Bucket::full(rate, now));
        bucket.refill(rate, now);
        bucket
    }
}

/// The budgets of one service.
#[derive(Debug)]
pub struct Budgets {
    peers: Keyed<Option<IpAddr>>,
    namespaces: Keyed<Option<String>>,
    service: Bucket,
    service_rate: Rate,
}

impl Budgets {
    pub fn new(budget: ReviewBudget) -> Self {
        let now = Instant::now();
        Self {
            peers: Keyed::new(budget.per_peer, now),
            namespaces: Keyed::new(budget.per_namespace, now),
            service: Bucket::full(budget.per_service, now),
            service_rate: budget.per_service,
        }
    }

    /// Takes one review from the peer's, the claimed namespace's and the service's budget, or
    /// none and says which is spent (the peer's first: a flooding client is refused on its own
    /// account before it touches anyone else's).
    pub fn take(
        &mut self,
        peer: Option<IpAddr>,
        namespace: Option<&str>,
        now: Instant,
    ) -> Result<(), Refusal> {
        let peer = peer.map(|ip| ip.to_canonical());
        if self.peers.bucket(&peer, now).tokens < 1.0 {
            return Err(Refusal::PeerBudget);
        }
        let namespace = namespace.map(str::to_owned);
        if self.namespaces.bucket(&namespace, now).tokens < 1.0 {
            return Err(Refusal::NamespaceBudget);
        }
        self.service.refill(self.service_rate, now);
        if self.service.tokens < 1.0 {
            return Err(Refusal::ServiceBudget);
        }
        self.service.tokens -= 1.0;
        self.peers.bucket(&peer, now).tokens -= 1.0;
        self.namespaces.bucket(&namespace, now).tokens -= 1.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn jwt(claims: serde_json::Value) -> String {
        let enc = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        format!(
            "{}.{}.c2lnbmF0dXJl",
            enc(&serde_json::json!({"alg": "RS256"})),
            enc(&claims)
        )
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn the_claims_of_a_projected_token_pick_its_namespace() {
        let token = jwt(serde_json::json!({
            "aud": ["meshplane-blue"], "exp": 2000,
            "sub": "system:serviceaccount:shop:web",
        }));
        assert_eq!(
            precheck(&token, "meshplane-blue", at(1000)),
            Ok(Claims {
                expiry: at(2000),
                namespace: Some("shop".into())
            })
        );
        // A single audience as a string, the namespace from the kubernetes.io claim.
        let token = jwt(serde_json::json!({
            "aud": "meshplane-blue", "exp": 2000, "kubernetes.io": {"namespace": "bank"},
        }));
        assert_eq!(
            precheck(&token, "meshplane-blue", at(1000)).map(|c| c.namespace),
            Ok(Some("bank".into()))
        );
        let token = jwt(serde_json::json!({"aud": "meshplane-blue", "exp": 2000}));
        assert_eq!(
            precheck(&token, "meshplane-blue", at(1000)).map(|c| c.namespace),
            Ok(None)
        );
    }

    #[test]
    fn tokens_that_could_never_pass_are_refused_from_themselves() {
        let good = serde_json::json!({"aud": ["meshplane-blue"], "exp": 2000});
        let cases = [
            ("forged".to_string(), Refusal::Malformed),
            ("a.b".to_string(), Refusal::Malformed),
            ("a.b.c.d".to_string(), Refusal::Malformed),
            (format!("{}.", jwt(good.clone())), Refusal::Malformed),
            ("!!.??.xx".to_string(), Refusal::Malformed),
            (
                jwt(good.clone())
                    .trim_end_matches("c2lnbmF0dXJl")
                    .to_string(),
                Refusal::Malformed,
            ),
            (
                format!("{}{}", jwt(good.clone()), "x".repeat(MAX_TOKEN)),
                Refusal::Malformed,
            ),
            (
                jwt(serde_json::json!({"aud": ["meshplane-green"], "exp": 2000})),
                Refusal::WrongAudience,
            ),
            (
                jwt(serde_json::json!({"exp": 2000})),
                Refusal::WrongAudience,
            ),
            (
                jwt(serde_json::json!({"aud": "meshplane-blue", "exp": 999})),
                Refusal::Expired,
            ),
            (
                jwt(serde_json::json!({"aud": "meshplane-blue"})),
                Refusal::Expired,
            ),
        ];
        for (token, want) in cases {
            assert_eq!(
                precheck(&token, "meshplane-blue", at(1000)),
                Err(want),
                "{token}"
            );
        }
        assert!(precheck(&jwt(good), "meshplane-blue", at(1000)).is_ok());
    }

    #[test]
    fn a_flooding_peer_spends_its_own_budget_not_its_neighbours() {
        let mut budgets = Budgets::new(ReviewBudget {
            per_peer: Rate::new(0.0, 3.0),
            per_namespace: Rate::new(0.0, 5.0),
            per_service: Rate::new(0.0, 100.0),
        });
        let now = Instant::now();
        let flooder = Some(IpAddr::from([198, 18, 0, 9]));
        let honest = Some(IpAddr::from([198, 18, 0, 10]));
        for _ in 0..3 {
            assert_eq!(budgets.take(flooder, Some("shop"), now), Ok(()));
        }
        for _ in 0..100 {
            assert_eq!(
                budgets.take(flooder, Some("shop"), now),
                Err(Refusal::PeerBudget)
            );
        }
        // The flood's refusals cost the namespace nothing: two reviews are left for it.
        assert_eq!(budgets.take(honest, Some("shop"), now), Ok(()));
        assert_eq!(budgets.take(honest, Some("shop"), now), Ok(()));
        assert_eq!(
            budgets.take(honest, Some("shop"), now),
            Err(Refusal::NamespaceBudget)
        );
        // Another namespace's proxies are not affected.
        assert_eq!(budgets.take(honest, Some("bank"), now), Ok(()));
        // IPv4-mapped IPv6 is the same peer.
        let mapped = Some(IpAddr::from(
            std::net::Ipv4Addr::new(198, 18, 0, 9).to_ipv6_mapped(),
        ));
        assert_eq!(
            budgets.take(mapped, Some("bank"), now),
            Err(Refusal::PeerBudget)
        );
    }

    #[test]
    fn budgets_refill_and_forget_idle_sources_within_bounds() {
        let mut budgets = Budgets::new(ReviewBudget::uniform(10.0, 1.0));
        let now = Instant::now();
        let peer = Some(IpAddr::from([198, 18, 0, 9]));
        assert_eq!(budgets.take(peer, None, now), Ok(()));
        assert_eq!(budgets.take(peer, None, now), Err(Refusal::PeerBudget));
        let later = now + Duration::from_millis(100);
        assert_eq!(budgets.take(peer, None, later), Ok(()));

        let mut budgets = Budgets::new(ReviewBudget {
            per_peer: Rate::new(0.0, 1.0),
            per_namespace: Rate::new(0.0, 1e9),
            per_service: Rate::new(0.0, 1e9),
        });
        for i in 0..(MAX_SOURCES as u32 + 10) {
            let peer = Some(IpAddr::from(std::net::Ipv6Addr::from(u128::from(i))));
            let _ = budgets.take(peer, None, now);
        }
        assert!(budgets.peers.buckets.len() <= MAX_SOURCES);
    }
}
