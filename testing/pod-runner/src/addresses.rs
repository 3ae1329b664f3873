//! Pod addresses: 198.18.0.10 – 198.18.255.254 (198.18.0.0/16, below .10 reserved for the
//! node). Each pod network has its own node namespace, so networks of different runners may
//! hand out the same addresses without meeting.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// The pod network: every pod address lies in it (what a cluster's `--cluster-cidr` is).
pub const POD_NETWORK: &str = "198.18.0.0/16";

/// First address handed out, as an offset in 198.18.0.0/16.
const FIRST: u32 = 10;
/// Last address handed out (198.18.255.254).
const LAST: u32 = 0xfffe;
const BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);

/// Hands addresses out round robin, so that a freed address is not reused at once (a peer may
/// still hold connections to it).
#[derive(Debug)]
pub struct AddressPool {
    in_use: BTreeSet<u32>,
    next: u32,
}

impl Default for AddressPool {
    fn default() -> Self {
        Self::new()
    }
}

impl AddressPool {
    pub fn new() -> Self {
        AddressPool {
            in_use: BTreeSet::new(),
            next: FIRST,
        }
    }

    /// A free address, or None when all are taken.
    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        for _ in FIRST..=LAST {
            let offset = self.next;
            self.next = if offset >= LAST { FIRST } else { offset + 1 };
            // Skip .0 and .255 of every /24: some stacks treat them specially.
            if matches!(offset & 0xff, 0 | 255) {
                continue;
            }
            if self.in_use.insert(offset) {
                return Some(Ipv4Addr::from(BASE + offset));
            }
        }
        None
    }

    pub fn release(&mut self, address: Ipv4Addr) {
        let value = u32::from(address);
        if let Some(offset) = value.checked_sub(BASE).filter(|o| *o <= LAST) {
            self.in_use.remove(&offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_unique_and_not_reused_immediately() {
        let mut pool = AddressPool::new();
        let first = pool.allocate().unwrap();
        let second = pool.allocate().unwrap();
        assert_eq!(first, Ipv4Addr::new(198, 18, 0, 10));
        assert_eq!(second, Ipv4Addr::new(198, 18, 0, 11));
        pool.release(first);
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(198, 18, 0, 12));
    }

    #[test]
    fn the_pool_spans_the_pod_range_skipping_network_and_broadcast_octets() {
        let mut pool = AddressPool::new();
        let all: Vec<Ipv4Addr> = std::iter::from_fn(|| pool.allocate()).collect();
        assert_eq!(all.len(), 245 + 255 * 254);
        assert!(all.iter().all(|a| a.octets()[0..2] == [198, 18]));
        assert!(all.iter().all(|a| !matches!(a.octets()[3], 0 | 255)));
        assert_eq!(all.last(), Some(&Ipv4Addr::new(198, 18, 255, 254)));
        pool.release(all[100]);
        assert_eq!(pool.allocate(), Some(all[100]));
    }
}
