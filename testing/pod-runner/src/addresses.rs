//! Pod addresses: each pod gets its own loopback address from the runner's /24.
//!
//! All local pods share the host's network namespace; Linux routes all of 127.0.0.0/8 to the
//! loopback device, so a distinct 127.a.b.x per pod gives each pod its own ports.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use super::error::PodRunnerError;

/// First host number handed out (lower ones are left to the host and the stand-in).
const FIRST_HOST: u8 = 10;
const LAST_HOST: u8 = 254;

/// Hands out `<prefix>.x` for x in 10..=254, round robin so a freed address is not reused at once
/// (a restarted peer may still hold connections to it).
#[derive(Debug)]
pub struct AddressPool {
    prefix: [u8; 3],
    in_use: BTreeSet<u8>,
    next: u8,
}

impl AddressPool {
    /// A pool over `a.b.c.10-254` where `subnet` is `a.b.c.0`.
    pub fn new(subnet: Ipv4Addr) -> Self {
        let [a, b, c, _] = subnet.octets();
        AddressPool {
            prefix: [a, b, c],
            in_use: BTreeSet::new(),
            next: FIRST_HOST,
        }
    }

    pub fn allocate(&mut self) -> Result<Ipv4Addr, PodRunnerError> {
        let span = usize::from(LAST_HOST - FIRST_HOST) + 1;
        for _ in 0..span {
            let host = self.next;
            self.next = if host >= LAST_HOST {
                FIRST_HOST
            } else {
                host + 1
            };
            if self.in_use.insert(host) {
                let [a, b, c] = self.prefix;
                return Ok(Ipv4Addr::new(a, b, c, host));
            }
        }
        let [a, b, c] = self.prefix;
        Err(PodRunnerError::AddressesExhausted(format!("{a}.{b}.{c}")))
    }

    pub fn release(&mut self, address: Ipv4Addr) {
        let [a, b, c, host] = address.octets();
        if [a, b, c] == self.prefix {
            self.in_use.remove(&host);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_unique_and_not_reused_immediately() {
        let mut pool = AddressPool::new(Ipv4Addr::new(127, 0, 0, 0));
        let first = pool.allocate().unwrap();
        let second = pool.allocate().unwrap();
        assert_eq!(first, Ipv4Addr::new(127, 0, 0, 10));
        assert_eq!(second, Ipv4Addr::new(127, 0, 0, 11));
        pool.release(first);
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(127, 0, 0, 12));
    }

    #[test]
    fn exhaustion_is_an_error_and_release_makes_room() {
        let mut pool = AddressPool::new(Ipv4Addr::new(127, 9, 9, 0));
        let all: Vec<_> = (0..245).map(|_| pool.allocate().unwrap()).collect();
        assert!(matches!(
            pool.allocate(),
            Err(PodRunnerError::AddressesExhausted(_))
        ));
        pool.release(all[100]);
        assert_eq!(pool.allocate().unwrap(), all[100]);
    }
}
