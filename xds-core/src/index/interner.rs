//! One shared `Arc<Resource>` per encoded resource: every scope whose render produces the same
//! bytes under the same name holds the same resource, so streams compare versions, not bytes,
//! and a response shares the encoding instead of copying it.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use prost::Message;

use crate::hash::content_version;
use crate::model::Resource;

/// Resources by name and version, while anyone holds them.
#[derive(Default)]
pub(super) struct Interner {
    /// By (type URL, name, version).
    by_version: HashMap<(&'static str, String, String), Weak<Resource>>,
    /// The last resource interned under each (type URL, name). A render mostly repeats what
    /// the last one produced: equal bytes are found by comparing them, without hashing.
    latest: HashMap<(&'static str, String), Weak<Resource>>,
    /// Size of `by_version` at which dead entries are dropped.
    prune_at: usize,
}

impl Interner {
    /// The shared resource of `msg`'s encoding.
    pub(super) fn intern<M: Message>(
        &mut self,
        type_url: &'static str,
        name: String,
        msg: &M,
    ) -> Arc<Resource> {
        self.intern_encoded(type_url, name, msg.encode_to_vec())
    }

    /// The shared resource of an encoding.
    pub(super) fn intern_encoded(
        &mut self,
        type_url: &'static str,
        name: String,
        encoded: Vec<u8>,
    ) -> Arc<Resource> {
        let named = (type_url, name);
        if let Some(last) = self.latest.get(&named).and_then(Weak::upgrade) {
            if last.encoded == encoded {
                return last;
            }
        }
        let (type_url, name) = named;
        let version = content_version(&encoded);
        self.intern_versioned(type_url, name, encoded, version)
    }

    /// The shared resource of an encoding whose version the caller derived from what it was
    /// built of (equal for equal encodings, stable across restarts).
    pub(super) fn intern_versioned(
        &mut self,
        type_url: &'static str,
        name: String,
        encoded: Vec<u8>,
        version: String,
    ) -> Arc<Resource> {
        let key = (type_url, name, version);
        let resource = match self.by_version.get(&key).and_then(Weak::upgrade) {
            Some(existing) => existing,
            None => {
                let resource = Arc::new(Resource {
                    name: key.1.clone(),
                    type_url,
                    encoded: bytes::Bytes::from(encoded),
                    version: key.2.clone(),
                    packed: Default::default(),
                });
                // Drop entries of resources nobody holds any more each time the map doubles.
                if self.by_version.len() >= self.prune_at {
                    self.by_version.retain(|_, w| w.strong_count() > 0);
                    self.latest.retain(|_, w| w.strong_count() > 0);
                    self.prune_at = (self.by_version.len() * 2).max(4096);
                }
                self.by_version.insert(key, Arc::downgrade(&resource));
                resource
            }
        };
        self.latest
            .insert((type_url, resource.name.clone()), Arc::downgrade(&resource));
        resource
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;

    fn cluster(name: &str, alt_stat_name: &str) -> Cluster {
        Cluster {
            name: name.to_string(),
            alt_stat_name: alt_stat_name.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn equal_encodings_share_one_resource_whichever_came_last() {
        let mut interner = Interner::default();
        let a = interner.intern("t", "c".into(), &cluster("c", "a"));
        let b = interner.intern("t", "c".into(), &cluster("c", "b"));
        assert!(!Arc::ptr_eq(&a, &b));
        assert_ne!(a.version, b.version);
        // `b` is the latest of the name: `a` is found by its version.
        let a2 = interner.intern("t", "c".into(), &cluster("c", "a"));
        assert!(Arc::ptr_eq(&a, &a2));
        let a3 = interner.intern("t", "c".into(), &cluster("c", "a"));
        assert!(Arc::ptr_eq(&a, &a3));
        // The same bytes under another name or type are another resource.
        let other = interner.intern("t", "d".into(), &cluster("c", "a"));
        assert!(!Arc::ptr_eq(&a, &other));
        assert_eq!(other.name, "d");
        let typed = interner.intern("u", "c".into(), &cluster("c", "a"));
        assert!(!Arc::ptr_eq(&a, &typed));
        assert_eq!(typed.type_url, "u");
        assert_eq!(
            a.version,
            content_version(&cluster("c", "a").encode_to_vec())
        );
    }

    #[test]
    fn a_resource_nobody_holds_is_made_anew() {
        let mut interner = Interner::default();
        let version = interner
            .intern("t", "c".into(), &cluster("c", "a"))
            .version
            .clone();
        let again = interner.intern("t", "c".into(), &cluster("c", "a"));
        assert_eq!(again.version, version);
        assert_eq!(Arc::strong_count(&again), 1);
    }
}
