//! What a simulated proxy reads of a discovery response, and the ADS calls that read it.
//!
//! The load generator only searches the resources for byte patterns and counts bytes, so it
//! decodes responses into views that keep each resource's encoding as a slice of the received
//! gRPC frame (prost decodes a `bytes` field from tonic's buffer without a copy) and skip the
//! fields it never reads. The generated messages copied every resource into its own `Vec` and
//! allocated its type URL: with the generator on the same machine as the server, that was CPU
//! the server under test did not get (a sixth of the generator's samples in S1's fan-out to
//! every proxy). The wire is unchanged: requests are the generated messages, and responses are
//! the server's bytes read as they are (the tests decode the same bytes both ways).

use std::marker::PhantomData;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use meshplane_xds::ads::wire::{DELTA_PATH, SOTW_PATH};
use prost::bytes::Buf;
use prost::{DecodeError, Message};
use tonic::client::Grpc;
use tonic::codec::{Codec, DecodeBuf, Decoder, Streaming};
use tonic::transport::Channel;
use tonic_prost::ProstEncoder;

/// A `google.protobuf.Any` as read: its value only (the type URL is skipped).
#[derive(Clone, PartialEq, Message)]
pub struct AnyView {
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

/// `envoy.service.discovery.v3.DiscoveryResponse`: the fields a proxy answers with, and the
/// resources.
#[derive(Clone, PartialEq, Message)]
pub struct ResponseView {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<AnyView>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `envoy.service.discovery.v3.Resource` of a delta response: its name and its value.
#[derive(Clone, PartialEq, Message)]
pub struct DeltaResourceView {
    #[prost(message, optional, tag = "2")]
    pub resource: Option<AnyView>,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse`, read like [`ResponseView`].
#[derive(Clone, PartialEq, Message)]
pub struct DeltaResponseView {
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<DeltaResourceView>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
}

/// A decoded message with the length of its encoding (the view skips fields, so its own
/// `encoded_len` would undercount what arrived).
#[derive(Debug)]
pub struct Received<V> {
    pub message: V,
    pub wire_len: usize,
}

/// Decodes `V` and notes how many bytes it came from.
#[derive(Debug)]
pub struct ViewDecoder<V>(PhantomData<V>);

impl<V: Message + Default> Decoder for ViewDecoder<V> {
    type Item = Received<V>;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        received(buf)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

/// Decodes one whole message from `buf`.
fn received<V: Message + Default>(buf: &mut impl Buf) -> Result<Received<V>, DecodeError> {
    let wire_len = buf.remaining();
    V::decode(buf).map(|message| Received { message, wire_len })
}

/// Generated requests out, views in.
#[derive(Debug)]
pub struct ViewCodec<Req, V>(PhantomData<(Req, V)>);

impl<Req, V> Default for ViewCodec<Req, V> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<Req, V> Codec for ViewCodec<Req, V>
where
    Req: Message + Send + 'static,
    V: Message + Default + Send + 'static,
{
    type Encode = Req;
    type Decode = Received<V>;
    type Encoder = ProstEncoder<Req>;
    type Decoder = ViewDecoder<V>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ViewDecoder(PhantomData)
    }
}

/// The ADS client of a simulated proxy.
pub struct AdsClient {
    grpc: Grpc<Channel>,
}

impl AdsClient {
    /// A client on `channel` accepting responses up to `max_message` bytes (decompressed),
    /// compressed with zstd if `zstd`.
    pub fn new(channel: Channel, max_message: usize, zstd: bool) -> Self {
        let mut grpc = Grpc::new(channel)
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        if zstd {
            grpc = grpc.accept_compressed(tonic::codec::CompressionEncoding::Zstd);
        }
        Self { grpc }
    }

    async fn open<Req, V>(
        &mut self,
        path: &'static str,
        requests: impl futures::Stream<Item = Req> + Send + 'static,
    ) -> Result<Streaming<Received<V>>, tonic::Status>
    where
        Req: Message + Send + 'static,
        V: Message + Default + Send + 'static,
    {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("channel not ready: {e}")))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
        let response = self
            .grpc
            .streaming(
                tonic::Request::new(requests),
                path,
                ViewCodec::<Req, V>::default(),
            )
            .await?;
        Ok(response.into_inner())
    }

    /// Opens a state-of-the-world ADS stream.
    pub async fn sotw(
        &mut self,
        requests: impl futures::Stream<Item = DiscoveryRequest> + Send + 'static,
    ) -> Result<Streaming<Received<ResponseView>>, tonic::Status> {
        self.open(SOTW_PATH, requests).await
    }

    /// Opens an incremental (delta) ADS stream.
    pub async fn delta(
        &mut self,
        requests: impl futures::Stream<Item = DeltaDiscoveryRequest> + Send + 'static,
    ) -> Result<Streaming<Received<DeltaResponseView>>, tonic::Status> {
        self.open(DELTA_PATH, requests).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource,
    };
    use envoy_types::pb::google::protobuf::Any;

    fn any(type_url: &str, value: &[u8]) -> Any {
        Any {
            type_url: type_url.into(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn a_sotw_response_reads_as_its_fields_and_resource_values() {
        let full = DiscoveryResponse {
            version_info: "v7".into(),
            resources: vec![any("t/a", b"\x0a\x01a"), any("t/b", b"")],
            canary: true,
            type_url: "t".into(),
            nonce: "n3".into(),
            ..Default::default()
        };
        let view = ResponseView::decode(full.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(view.version_info, "v7");
        assert_eq!(view.type_url, "t");
        assert_eq!(view.nonce, "n3");
        let values: Vec<&[u8]> = view.resources.iter().map(|a| &a.value[..]).collect();
        assert_eq!(values, [&b"\x0a\x01a"[..], &b""[..]]);
    }

    #[test]
    fn a_delta_response_reads_names_values_and_removals() {
        let full = DeltaDiscoveryResponse {
            system_version_info: "s".into(),
            resources: vec![Resource {
                name: "c1".into(),
                version: "1".into(),
                resource: Some(any("t", b"body")),
                aliases: vec!["x".into()],
                ..Default::default()
            }],
            type_url: "t".into(),
            nonce: "n".into(),
            removed_resources: vec!["gone".into()],
            ..Default::default()
        };
        let view = DeltaResponseView::decode(full.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(view.type_url, "t");
        assert_eq!(view.nonce, "n");
        assert_eq!(view.removed_resources, ["gone"]);
        assert_eq!(view.resources.len(), 1);
        assert_eq!(view.resources[0].name, "c1");
        let value = view.resources[0].resource.as_ref().map(|a| &a.value[..]);
        assert_eq!(value, Some(&b"body"[..]));
    }

    #[test]
    fn the_decoder_reports_the_length_that_arrived_not_the_views() {
        let full = DiscoveryResponse {
            version_info: "v".into(),
            resources: vec![any("type.googleapis.com/a.very.long.Type", b"x")],
            type_url: "t".into(),
            ..Default::default()
        };
        let bytes = full.encode_to_vec();
        let decoded = received::<ResponseView>(&mut Bytes::from(bytes.clone())).expect("decodes");
        assert_eq!(decoded.wire_len, bytes.len());
        assert!(decoded.message.encoded_len() < bytes.len());
    }

    #[test]
    fn resource_values_are_slices_of_the_received_bytes() {
        let full = DiscoveryResponse {
            resources: vec![any("t", &[7u8; 300]), any("t", &[9u8; 40])],
            ..Default::default()
        };
        let received = Bytes::from(full.encode_to_vec());
        let range = received.as_ptr_range();
        let view = ResponseView::decode(received.clone()).expect("decodes");
        for a in &view.resources {
            let value = a.value.as_ptr_range();
            assert!(range.start <= value.start && value.end <= range.end);
        }
    }
}
