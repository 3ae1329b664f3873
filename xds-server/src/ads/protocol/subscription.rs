//! What a proxy subscribed to, per type: the names it asked for or the wildcard (xDS protocol,
//! "How the client specifies what resources to return"). A state-of-the-world request states
//! the whole subscription again; an incremental one adds and removes names ("Incremental
//! xDS", "Unsubscribing From Resources"). An empty first request is the legacy wildcard.

use std::collections::BTreeSet;

/// Wildcard resource name of xDS subscriptions.
pub const WILDCARD: &str = "*";

/// The subscription of one type on one stream.
#[derive(Clone, Debug, Default)]
pub struct Subscription {
    /// Whether a request of the type came.
    requested: bool,
    wildcard: bool,
    names: BTreeSet<String>,
    /// Bytes of `names` ([`crate::ads::budget`] bounds them).
    name_bytes: usize,
    /// Names are namespaces (VHDS): one covers every resource named `<name>/<...>`.
    namespaced: bool,
}

/// What folding a request changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Folded {
    /// It was the type's first request on the stream.
    pub first: bool,
    /// It changed the names or the wildcard (state of the world), or named any (incremental).
    pub changed: bool,
}

impl Subscription {
    /// A subscription whose names are namespaces (VHDS).
    pub fn namespaced() -> Self {
        Self {
            namespaced: true,
            ..Self::default()
        }
    }

    /// Whether the proxy subscribed to this type.
    pub fn requested(&self) -> bool {
        self.requested
    }

    pub fn wildcard(&self) -> bool {
        self.wildcard
    }

    pub fn names(&self) -> &BTreeSet<String> {
        &self.names
    }

    /// Whether the names are namespaces (VHDS).
    pub fn is_namespaced(&self) -> bool {
        self.namespaced
    }

    /// Subscribed names and their bytes.
    pub fn held(&self) -> (usize, usize) {
        (self.names.len(), self.name_bytes)
    }

    /// Whether the subscribed names cover resource `name`: the name itself, or, namespaced
    /// (VHDS), its namespace, everything before its last `/`. The wildcard is not looked at.
    pub fn covers(&self, name: &str) -> bool {
        if self.namespaced {
            name.rsplit_once('/')
                .is_some_and(|(namespace, _)| self.names.contains(namespace))
        } else {
            self.names.contains(name)
        }
    }

    /// Whether resource `name` is subscribed to: by the wildcard or by name.
    pub fn takes(&self, name: &str) -> bool {
        self.wildcard || self.covers(name)
    }

    /// Folds a state-of-the-world request naming `names`: they replace the subscription. An
    /// empty first request is the legacy wildcard; it stays wildcard while empty.
    pub fn fold_sotw(&mut self, names: &[String]) -> Folded {
        let first = !self.requested;
        self.requested = true;
        let explicit_wildcard = names.iter().any(|n| n == WILDCARD);
        let wildcard = explicit_wildcard || (names.is_empty() && (first || self.wildcard));
        let names: BTreeSet<String> = names.iter().filter(|n| *n != WILDCARD).cloned().collect();
        let changed = wildcard != self.wildcard || names != self.names;
        self.wildcard = wildcard;
        self.name_bytes = names.iter().map(String::len).sum();
        self.names = names;
        Folded { first, changed }
    }

    /// Folds an incremental request: `subscribe` added, then `unsubscribe` removed, each of
    /// these handed to `left` once it is out (what the proxy held of it may go with it). An
    /// empty first subscription is the legacy wildcard.
    pub fn fold_delta(
        &mut self,
        subscribe: &[String],
        unsubscribe: &[String],
        mut left: impl FnMut(&Self, &str),
    ) -> Folded {
        let first = !self.requested;
        self.requested = true;
        if first {
            self.wildcard = subscribe.is_empty();
        }
        for name in subscribe {
            if name == WILDCARD {
                self.wildcard = true;
            } else if self.names.insert(name.clone()) {
                self.name_bytes += name.len();
            }
        }
        for name in unsubscribe {
            if name == WILDCARD {
                self.wildcard = false;
            } else if self.names.remove(name) {
                self.name_bytes -= name.len();
            }
            left(self, name);
        }
        Folded {
            first,
            changed: !subscribe.is_empty() || !unsubscribe.is_empty(),
        }
    }

    /// Names of the type once a state-of-the-world request naming `names` is folded, and how
    /// that changes the stream's (`held`, its names and bytes over every type): (names of the
    /// type, names over every type, their bytes).
    pub fn after_sotw(&self, held: (usize, usize), names: &[String]) -> (usize, usize, usize) {
        let (count, added) = names
            .iter()
            .filter(|n| *n != WILDCARD)
            .fold((0, 0), |(c, b), n| (c + 1, b + n.len()));
        (
            count,
            held.0 - self.names.len() + count,
            held.1 - self.name_bytes + added,
        )
    }

    /// [`Self::after_sotw`] for an incremental request. Names both subscribed and
    /// unsubscribed, or subscribed twice, count as added (an upper bound).
    pub fn after_delta(
        &self,
        held: (usize, usize),
        subscribe: &[String],
        unsubscribe: &[String],
    ) -> (usize, usize, usize) {
        let (mut all, mut bytes) = held;
        let mut count = self.names.len();
        for n in subscribe {
            if n != WILDCARD && !self.names.contains(n) {
                count += 1;
                all += 1;
                bytes += n.len();
            }
        }
        let mut gone = BTreeSet::new();
        for n in unsubscribe {
            if self.names.contains(n) && gone.insert(n.as_str()) {
                count -= 1;
                all -= 1;
                bytes -= n.len();
            }
        }
        (count, all, bytes)
    }
}
