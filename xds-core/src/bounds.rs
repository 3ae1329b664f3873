//! Size limits on what clients send, and bounded echoes of it in logs, statuses and the debug
//! endpoints: nothing a client chooses is written out at more than a few KiB.

use std::borrow::Cow;

/// Longest `node.id` accepted (contract 7's own bound; real ids are well under 300 bytes).
pub const MAX_NODE_ID: usize = meshplane_contracts::node::MAX_NODE_ID_LEN;
/// Longest `node.cluster` accepted.
pub const MAX_NODE_CLUSTER: usize = 1024;
/// Largest encoded `node.metadata` accepted.
pub const MAX_NODE_METADATA: usize = 32 * 1024;
/// Largest encoded node accepted (Envoy lists its extensions there: tens of KiB).
pub const MAX_NODE: usize = 256 * 1024;
/// Largest ADS request decoded.
pub const MAX_REQUEST: usize = 4 * 1024 * 1024;
/// Resource names one stream may subscribe to per type (and send in one request).
pub const MAX_NAMES_PER_TYPE: usize = 50_000;
/// Resource names one stream may hold over all types (subscriptions and initial versions).
pub const MAX_NAMES_PER_STREAM: usize = 100_000;
/// Bytes of resource names one stream may hold.
pub const MAX_NAME_BYTES_PER_STREAM: usize = 4 * 1024 * 1024;
/// `initial_resource_versions` entries in one delta request.
pub const MAX_INITIAL_VERSIONS: usize = 50_000;
/// Longest `version_info` or `response_nonce` (the server's own are a hash or a counter).
pub const MAX_VERSION_INFO: usize = 256;
/// The streams of one HTTP/2 connection share this many stream budgets.
pub const CONNECTION_STREAM_BUDGETS: usize = 2;
/// A first request at least this large counts against [`MAX_AWAITING_ADMISSION`].
pub const LARGE_FIRST_REQUEST: usize = 64 * 1024;
/// Bytes of large first requests held while their streams wait for admission, all streams
/// together.
pub const MAX_AWAITING_ADMISSION: usize = 32 * 1024 * 1024;
/// How much of a client-chosen string is echoed in a log line or a status message.
pub const ECHO: usize = 128;
/// Longest message of a gRPC status refusing a stream.
pub const STATUS_MESSAGE: usize = 4 * ECHO;
/// How much of a NACK's error message is kept and logged.
pub const NACK_MESSAGE: usize = 2048;

/// `s` cut to at most `max` bytes (at a character boundary), marked with its full length when
/// cut.
pub fn clip(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…[{} bytes]", &s[..end], s.len()))
}

/// [`clip`] at [`ECHO`], owned.
pub fn echo(s: &str) -> String {
    clip(s, ECHO).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_short_strings_and_cuts_long_ones_at_a_char_boundary() {
        assert_eq!(clip("abc", 3), "abc");
        let long = "é".repeat(100);
        let cut = clip(&long, 5);
        assert!(cut.starts_with("éé…"), "{cut}");
        assert!(cut.ends_with("[200 bytes]"), "{cut}");
        assert!(echo(&"x".repeat(1 << 20)).len() < ECHO + 32);
    }
}
