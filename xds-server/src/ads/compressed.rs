//! Large responses compressed with zstd for the clients that accept it (gRPC message
//! compression: the client sends `grpc-accept-encoding: zstd`, the response says
//! `grpc-encoding: zstd` and flags each compressed message).
//!
//! The client that accepts it is the node agent, which carries a meshed pod's ADS to the
//! instance (contract 11); Envoy talking ADS directly does not ask for it and gets what it got.
//! At 10,000 services a state-of-the-world proxy's push is about 6 MiB, almost all of it a
//! snapshot's whole set of clusters and one route configuration whose virtual hosts repeat the
//! same retry policy and domain patterns. Copying those bytes to every such proxy was most of
//! what a change cost the instance.
//!
//! Compressing each stream's response would cost far more than sending it, so nothing is
//! compressed per stream beyond a few bytes. A compressed message is written as a sequence of
//! zstd frames: a decoder reads concatenated frames as the concatenation of their contents
//! (RFC 8878, section 3.1), and concatenated protobuf fields are the message they make up. The
//! large pieces (a snapshot's whole set, a large resource's encoding) are compressed once, on
//! the first response that carries them, and their frame is shared by every stream; only the
//! bytes around them (version, nonce, the `Any` headers) are compressed per response.

use bytes::Bytes;

/// A response is compressed only when it carries a shared piece at least this long. Below it
/// the copy costs the instance less than decompressing costs the agent.
pub const PACK_MIN: usize = 256 * 1024;

/// zstd level: the fastest of the standard levels. A 4.9 MB route configuration compresses in
/// milliseconds, once per version.
const LEVEL: i32 = 1;

/// The compressed form of a shared encoding, made on first use: the core's cache cell, which
/// this codec fills.
pub use meshplane_xds_core::model::Packed;

/// Fills a [`Packed`] with zstd.
pub trait Compress {
    /// The zstd frame of `pieces`, concatenated; compressed by the first caller.
    fn get_or_compress<'a>(&self, pieces: impl IntoIterator<Item = &'a [u8]>) -> Option<Bytes>;
}

impl Compress for Packed {
    fn get_or_compress<'a>(&self, pieces: impl IntoIterator<Item = &'a [u8]>) -> Option<Bytes> {
        self.get_or_init(|| frame_of(pieces))
    }
}

/// One zstd frame holding `pieces` one after the other.
fn frame_of<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Option<Bytes> {
    use std::io::Write;
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), LEVEL).ok()?;
    for piece in pieces {
        encoder.write_all(piece).ok()?;
    }
    encoder.finish().ok().map(Bytes::from)
}

/// A compressed message being written: zstd frames, some made here from the bytes written
/// between the shared pieces, some shared.
#[derive(Default)]
pub struct Packer {
    raw: Vec<u8>,
    frames: Vec<Bytes>,
    failed: bool,
}

impl Packer {
    /// Where the bytes between shared pieces go.
    pub fn raw(&mut self) -> &mut Vec<u8> {
        &mut self.raw
    }

    /// Appends a shared piece's frame (`None`: it could not be compressed, nor can the
    /// message).
    pub fn frame(&mut self, frame: Option<Bytes>) {
        self.seal();
        match frame {
            Some(frame) => self.frames.push(frame),
            None => self.failed = true,
        }
    }

    /// Compresses what was written since the last frame into a frame of its own.
    fn seal(&mut self) {
        if self.raw.is_empty() {
            return;
        }
        match SMALL.with(|small| compress_small(&mut small.borrow_mut(), &self.raw)) {
            Some(frame) => self.frames.push(Bytes::from(frame)),
            None => self.failed = true,
        }
        self.raw.clear();
    }

    /// The message's frames and their total length (`None` if any part failed).
    pub fn finish(mut self) -> Option<(Vec<Bytes>, usize)> {
        self.seal();
        if self.failed {
            return None;
        }
        let len = self.frames.iter().map(Bytes::len).sum();
        Some((self.frames, len))
    }
}

thread_local! {
    /// The compressor of the few bytes around shared pieces, one per worker thread: making a
    /// zstd context per response cost more than compressing those bytes.
    static SMALL: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// `bytes` as one zstd frame, with this thread's compressor (made on first use).
fn compress_small(
    compressor: &mut Option<zstd::bulk::Compressor<'static>>,
    bytes: &[u8],
) -> Option<Vec<u8>> {
    if compressor.is_none() {
        *compressor = Some(zstd::bulk::Compressor::new(LEVEL).ok()?);
    }
    compressor.as_mut()?.compress(bytes).ok()
}

/// Whether a request's `grpc-accept-encoding` header lists zstd.
pub fn accepts_zstd(accept_encoding: Option<&[u8]>) -> bool {
    accept_encoding.is_some_and(|value| {
        value
            .split(|b| *b == b',')
            .any(|name| name.trim_ascii().eq_ignore_ascii_case(b"zstd"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decompress(frames: &[Bytes]) -> Vec<u8> {
        let joined: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        let mut out = Vec::new();
        let mut decoder = zstd::stream::read::Decoder::new(joined.as_slice()).expect("decoder");
        std::io::copy(&mut decoder, &mut out).expect("decompresses");
        out
    }

    #[test]
    fn concatenated_frames_decompress_to_the_concatenated_bytes() {
        let shared = Packed::default();
        let big: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut packer = Packer::default();
        packer.raw().extend_from_slice(b"head");
        packer.frame(shared.get_or_compress([&big[..10], &big[10..]]));
        packer.raw().extend_from_slice(b"tail");
        let (frames, len) = packer.finish().expect("compressed");
        assert_eq!(frames.len(), 3);
        assert_eq!(len, frames.iter().map(Bytes::len).sum::<usize>());
        assert!(len < big.len() / 4, "{len} of {}", big.len());
        assert_eq!(decompress(&frames), [&b"head"[..], &big, b"tail"].concat());
    }

    #[test]
    fn a_shared_piece_is_compressed_once() {
        let shared = Packed::default();
        let one = shared.get_or_compress([&b"abc"[..]]).expect("compressed");
        let two = shared.get_or_compress([&b"other bytes are not looked at"[..]]);
        assert_eq!(two.as_ref().map(|b| b.as_ptr()), Some(one.as_ptr()));
    }

    #[test]
    fn a_piece_that_failed_fails_the_message() {
        let mut packer = Packer::default();
        packer.raw().extend_from_slice(b"head");
        packer.frame(None);
        assert!(packer.finish().is_none());
    }

    #[test]
    fn zstd_is_accepted_when_listed() {
        assert!(accepts_zstd(Some(b"zstd")));
        assert!(accepts_zstd(Some(b"identity, gzip, ZSTD")));
        assert!(!accepts_zstd(Some(b"identity,gzip")));
        assert!(!accepts_zstd(Some(b"zstdx")));
        assert!(!accepts_zstd(None));
    }
}
