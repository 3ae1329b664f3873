//! The `Any` fields of discovery responses, written from each resource's shared encoding,
//! and the buffers they are written into: bytes copied into chunks of about [`CHUNK`], large
//! encodings passed on as their own shared buffer. The codec ([`super::codec`]) writes whole
//! responses with these; a snapshot frames its whole set once ([`any_fields`]).

use std::sync::Arc;

use prost::bytes::BufMut;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

use super::payload::AnyFields;
use crate::model::Resource;

/// Length of a key (tag and wire type) of a field numbered below 16: one byte.
pub const KEY_LEN: usize = 1;

/// Encoded length of a length-delimited field of `len` bytes.
pub fn field_len(len: usize) -> usize {
    KEY_LEN + encoded_len_varint(len as u64) + len
}

/// Encoded length of a string or bytes field, absent when empty (proto3 default).
pub fn scalar_len(value: &[u8]) -> usize {
    if value.is_empty() {
        0
    } else {
        field_len(value.len())
    }
}

pub fn put_scalar(tag: u32, value: &[u8], buf: &mut impl BufMut) {
    if !value.is_empty() {
        put_delimited(tag, value.len(), buf);
        buf.put_slice(value);
    }
}

pub fn put_delimited(tag: u32, len: usize, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// Length of the `google.protobuf.Any` (type_url = 1, value = 2) holding `r`.
pub fn any_len(r: &Resource) -> usize {
    scalar_len(r.type_url.as_bytes()) + scalar_len(&r.encoded)
}

/// Where a response is written: bytes go into [`Sink::raw`]; a resource's shared encoding goes
/// through [`Sink::shared`], which a [`Chunker`] passes on by reference instead of copying.
pub trait Sink {
    fn raw(&mut self) -> &mut Vec<u8>;
    fn shared(&mut self, bytes: &bytes::Bytes) {
        self.raw().extend_from_slice(bytes);
    }
}

impl Sink for Vec<u8> {
    fn raw(&mut self) -> &mut Vec<u8> {
        self
    }
}

pub fn put_any(tag: u32, r: &Resource, out: &mut impl Sink) {
    put_delimited(tag, any_len(r), out.raw());
    put_scalar(1, r.type_url.as_bytes(), out.raw());
    if !r.encoded.is_empty() {
        put_delimited(2, r.encoded.len(), out.raw());
        out.shared(&r.encoded);
    }
}

/// The `resources` fields of a SotW response carrying `resources`, framed once to be shared
/// by every stream that sends them ([`Resources::Whole`]).
pub fn any_fields<'a>(resources: impl IntoIterator<Item = &'a Arc<Resource>>) -> AnyFields {
    let mut out = Chunker::new();
    let mut len = 0;
    for r in resources {
        len += field_len(any_len(r));
        put_any(2, r, &mut out);
        if out.buf.len() >= CHUNK {
            out.flush();
        }
    }
    out.flush();
    AnyFields {
        segments: out.ready.into(),
        len,
        ..AnyFields::default()
    }
}

/// Bytes copied into one data frame before it goes out: small enough that a stream holds
/// little more than what HTTP/2 is about to write, large enough to keep frames few.
pub const CHUNK: usize = 64 * 1024;
/// Resource encodings at least this long go out as their own data frame, shared rather than
/// copied (a 10,000-service route configuration is megabytes, sent to every SotW proxy).
pub const SHARE_MIN: usize = 16 * 1024;

/// The data frames of the responses being written, in order: `ready` then `buf`.
#[derive(Default)]
pub struct Chunker {
    pub(crate) ready: std::collections::VecDeque<bytes::Bytes>,
    pub(crate) buf: Vec<u8>,
}

impl Chunker {
    pub fn new() -> Self {
        Self {
            ready: std::collections::VecDeque::new(),
            buf: Vec::new(),
        }
    }

    /// Moves what was copied so far into a frame of its own.
    pub fn flush(&mut self) {
        if !self.buf.is_empty() {
            let full = std::mem::take(&mut self.buf);
            self.ready.push_back(bytes::Bytes::from(full));
        }
    }
}

impl Sink for Chunker {
    fn raw(&mut self) -> &mut Vec<u8> {
        if self.buf.capacity() == 0 {
            self.buf.reserve(CHUNK + SHARE_MIN);
        }
        &mut self.buf
    }

    fn shared(&mut self, bytes: &bytes::Bytes) {
        if bytes.len() >= SHARE_MIN {
            self.flush();
            self.ready.push_back(bytes.clone());
        } else {
            self.raw().extend_from_slice(bytes);
        }
    }
}
