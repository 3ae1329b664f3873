//! The resources a response carries: listed one by one, or every resource of a type snapshot
//! with their wire encoding made once and shared by every stream that sends them.
//!
//! A state-of-the-world response of clusters or listeners carries the whole set. In a tenant
//! of 10,000 services every SotW proxy of a scope gets the same 10,000 clusters after each
//! change; framing them one by one (length, `Any` header, a copy of each small encoding) cost
//! each stream as much as the kernel's copy of the bytes. [`Resources::Whole`] frames them
//! once per snapshot ([`AnyFields`], cached in [`super::snapshot::TypeSnapshot`]); a stream
//! then passes on a handful of shared buffers.

use std::sync::Arc;

use bytes::Bytes;

use super::compressed::{Compress, Packed};
use super::map_diff::ResourceMap;
use crate::model::Resource;

/// The resources of one response.
#[derive(Clone, Debug)]
pub enum Resources {
    /// These resources, in this order.
    Listed(Vec<Arc<Resource>>),
    /// Every resource of the map, in name order, with the `resources` fields of a SotW
    /// response carrying them already encoded.
    Whole(Arc<ResourceMap>, Arc<AnyFields>),
}

impl Default for Resources {
    fn default() -> Self {
        Resources::Listed(Vec::new())
    }
}

impl From<Vec<Arc<Resource>>> for Resources {
    fn from(list: Vec<Arc<Resource>>) -> Self {
        Resources::Listed(list)
    }
}

impl Resources {
    pub fn len(&self) -> usize {
        match self {
            Resources::Listed(list) => list.len(),
            Resources::Whole(map, _) => map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> Iter<'_> {
        match self {
            Resources::Listed(list) => Iter::Listed(list.iter()),
            Resources::Whole(map, _) => Iter::Whole(map.values()),
        }
    }

    /// The resources as a list (a delta response wraps each one).
    pub fn into_list(self) -> Vec<Arc<Resource>> {
        match self {
            Resources::Listed(list) => list,
            Resources::Whole(map, _) => map.values().cloned().collect(),
        }
    }
}

/// Iterator over [`Resources`].
pub enum Iter<'a> {
    Listed(std::slice::Iter<'a, Arc<Resource>>),
    Whole(std::collections::btree_map::Values<'a, String, Arc<Resource>>),
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Arc<Resource>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Listed(i) => i.next(),
            Iter::Whole(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Iter::Listed(i) => i.size_hint(),
            Iter::Whole(i) => i.size_hint(),
        }
    }
}

impl<'a> IntoIterator for &'a Resources {
    type Item = &'a Arc<Resource>;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The repeated `resources` fields (`Any`) of a SotW response carrying a set of resources,
/// as written by [`super::frames::any_fields`]: buffers of about [`super::frames::CHUNK`] bytes, with large
/// resource encodings kept as their own shared buffer rather than copied.
#[derive(Clone, Default)]
pub struct AnyFields {
    pub(super) segments: Vec<Bytes>,
    pub(super) len: usize,
    /// The fields compressed, for the streams that send them so ([`super::compressed`]).
    pub(super) packed: Packed,
}

impl AnyFields {
    /// Encoded length of the fields.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The encoding, in pieces.
    pub fn segments(&self) -> &[Bytes] {
        &self.segments
    }

    /// The encoding as one zstd frame, compressed by the first stream that asks.
    pub fn packed(&self) -> Option<Bytes> {
        self.packed
            .get_or_compress(self.segments.iter().map(|s| s.as_ref()))
    }
}

impl std::fmt::Debug for AnyFields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyFields")
            .field("len", &self.len)
            .field("segments", &self.segments.len())
            .finish()
    }
}
