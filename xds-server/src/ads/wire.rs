//! Discovery responses written straight from the shared encodings of their resources.
//!
//! Each resource is encoded once per version ([`Resource::encoded`]) and held by every stream
//! that serves it. prost's `DiscoveryResponse` would need each of them copied into an owned
//! `Any` per response and then encoded again; the messages here hold the shared resources and
//! write their bytes into the gRPC frame directly, in the field order prost uses, so the wire
//! bytes are those of the generated messages (the tests check it). They are only ever sent:
//! decoding one skips every field.
//!
//! [`AdsService`] is the ADS gRPC service over these messages (the generated server fixes its
//! responses to prost's types).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::bytes::{Buf, BufMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, DecodeContext, WireType};
use prost::DecodeError;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{NamedService, StreamingService};
use tonic::{Request, Status, Streaming};

use super::stream::{Delta, Sotw, Wire};
use super::AdsServer;
use crate::model::Resource;

/// Length of a key (tag and wire type) of a field numbered below 16: one byte.
const KEY_LEN: usize = 1;

/// Encoded length of a length-delimited field of `len` bytes.
fn field_len(len: usize) -> usize {
    KEY_LEN + encoded_len_varint(len as u64) + len
}

/// Encoded length of a string or bytes field, absent when empty (proto3 default).
fn scalar_len(value: &[u8]) -> usize {
    if value.is_empty() {
        0
    } else {
        field_len(value.len())
    }
}

fn put_scalar(tag: u32, value: &[u8], buf: &mut impl BufMut) {
    if !value.is_empty() {
        put_delimited(tag, value.len(), buf);
        buf.put_slice(value);
    }
}

fn put_delimited(tag: u32, len: usize, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// Length of the `google.protobuf.Any` (type_url = 1, value = 2) holding `r`.
fn any_len(r: &Resource) -> usize {
    scalar_len(r.type_url.as_bytes()) + scalar_len(&r.encoded)
}

fn put_any(tag: u32, r: &Resource, buf: &mut impl BufMut) {
    put_delimited(tag, any_len(r), buf);
    put_scalar(1, r.type_url.as_bytes(), buf);
    put_scalar(2, &r.encoded, buf);
}

/// A `DiscoveryResponse` (state of the world): version_info = 1, resources = 2 (`Any`),
/// type_url = 4, nonce = 5.
#[derive(Clone, Debug, Default)]
pub struct SotwResponse {
    pub version_info: String,
    pub resources: Vec<Arc<Resource>>,
    pub type_url: &'static str,
    pub nonce: String,
}

impl prost::Message for SotwResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_scalar(1, self.version_info.as_bytes(), buf);
        for r in &self.resources {
            put_any(2, r, buf);
        }
        put_scalar(4, self.type_url.as_bytes(), buf);
        put_scalar(5, self.nonce.as_bytes(), buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Send-only: see the module documentation.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        scalar_len(self.version_info.as_bytes())
            + self
                .resources
                .iter()
                .map(|r| field_len(any_len(r)))
                .sum::<usize>()
            + scalar_len(self.type_url.as_bytes())
            + scalar_len(self.nonce.as_bytes())
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// A `DeltaDiscoveryResponse`: system_version_info = 1, resources = 2 (`Resource`: version
/// = 1, resource = 2 (`Any`), name = 3), type_url = 4, nonce = 5, removed_resources = 6.
#[derive(Clone, Debug, Default)]
pub struct DeltaResponse {
    pub system_version_info: String,
    pub resources: Vec<Arc<Resource>>,
    pub type_url: &'static str,
    pub nonce: String,
    pub removed_resources: Vec<String>,
}

/// Length of the delta `Resource` wrapping `r`.
fn delta_resource_len(r: &Resource) -> usize {
    scalar_len(r.version.as_bytes()) + field_len(any_len(r)) + scalar_len(r.name.as_bytes())
}

impl prost::Message for DeltaResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_scalar(1, self.system_version_info.as_bytes(), buf);
        for r in &self.resources {
            put_delimited(2, delta_resource_len(r), buf);
            put_scalar(1, r.version.as_bytes(), buf);
            put_any(2, r, buf);
            put_scalar(3, r.name.as_bytes(), buf);
        }
        put_scalar(4, self.type_url.as_bytes(), buf);
        put_scalar(5, self.nonce.as_bytes(), buf);
        for name in &self.removed_resources {
            // Repeated strings are written even when empty.
            put_delimited(6, name.len(), buf);
            buf.put_slice(name.as_bytes());
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        scalar_len(self.system_version_info.as_bytes())
            + self
                .resources
                .iter()
                .map(|r| field_len(delta_resource_len(r)))
                .sum::<usize>()
            + scalar_len(self.type_url.as_bytes())
            + scalar_len(self.nonce.as_bytes())
            + self
                .removed_resources
                .iter()
                .map(|n| field_len(n.len()))
                .sum::<usize>()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// gRPC service name of ADS.
pub const SERVICE_NAME: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The ADS gRPC service of an [`AdsServer`], answering with [`SotwResponse`] and
/// [`DeltaResponse`].
#[derive(Clone)]
pub struct AdsService {
    server: Arc<AdsServer>,
}

impl AdsService {
    pub fn new(server: AdsServer) -> Self {
        Self {
            server: Arc::new(server),
        }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = SERVICE_NAME;
}

/// Runs one ADS call of variant `W` on `server`.
async fn call<W: Wire, B>(
    server: Arc<AdsServer>,
    req: http::Request<B>,
) -> http::Response<tonic::body::Body>
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    let codec = tonic_prost::ProstCodec::<W::Resp, W::Req>::default();
    let mut grpc = tonic::server::Grpc::new(codec)
        .apply_max_message_size_config(Some(crate::bounds::MAX_REQUEST), None);
    grpc.streaming(Open::<W>(server, std::marker::PhantomData), req)
        .await
}

/// Opens the stream of one call (admission, then the stream task).
struct Open<W>(Arc<AdsServer>, std::marker::PhantomData<fn() -> W>);

impl<W: Wire> StreamingService<W::Req> for Open<W> {
    type Response = W::Resp;
    type ResponseStream = ReceiverStream<Result<W::Resp, Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<W::Req>>) -> Self::Future {
        let server = Arc::clone(&self.0);
        Box::pin(async move { server.open::<W>(request).await.map(tonic::Response::new) })
    }
}

impl<B> Service<http::Request<B>> for AdsService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let server = Arc::clone(&self.server);
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move { Ok(call::<Sotw, B>(server, req).await) }),
            DELTA_PATH => Box::pin(async move { Ok(call::<Delta, B>(server, req).await) }),
            other => {
                let status = tonic::Status::unimplemented(format!(
                    "no method {}",
                    crate::bounds::echo(other)
                ));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::type_url;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource as DeltaResource,
    };
    use envoy_types::pb::google::protobuf::Any;
    use prost::Message;

    fn res(name: &str, type_url: &'static str, body: Vec<u8>) -> Arc<Resource> {
        Arc::new(Resource {
            name: name.into(),
            type_url,
            version: crate::ads::snapshot::content_version(&body),
            encoded: bytes::Bytes::from(body),
        })
    }

    /// Resources of every size class a length prefix can take, and an empty one.
    fn resources() -> Vec<Arc<Resource>> {
        [0usize, 1, 127, 128, 300, 16_384, 70_000]
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let body: Vec<u8> = (0..len).map(|b| (b * 31 + i) as u8).collect();
                res(
                    &format!("outbound|80||s{i}.shop.svc.cluster.local"),
                    type_url::ENDPOINT,
                    body,
                )
            })
            .collect()
    }

    fn any(r: &Resource) -> Any {
        Any {
            type_url: r.type_url.to_string(),
            value: r.encoded.to_vec(),
        }
    }

    #[test]
    fn sotw_responses_are_byte_identical_to_prost_encoding() {
        for (resources, version, nonce) in [
            (resources(), "v1", "7"),
            (Vec::new(), "", ""),
            (resources()[..1].to_vec(), "", "1"),
        ] {
            let ours = SotwResponse {
                version_info: version.into(),
                resources: resources.clone(),
                type_url: type_url::ENDPOINT,
                nonce: nonce.into(),
            };
            let theirs = DiscoveryResponse {
                version_info: version.into(),
                resources: resources.iter().map(|r| any(r)).collect(),
                type_url: type_url::ENDPOINT.into(),
                nonce: nonce.into(),
                ..Default::default()
            };
            let bytes = ours.encode_to_vec();
            assert_eq!(bytes.len(), ours.encoded_len());
            assert_eq!(bytes, theirs.encode_to_vec());
            assert_eq!(
                DiscoveryResponse::decode(bytes.as_slice()).expect("decodes"),
                theirs
            );
        }
    }

    #[test]
    fn delta_responses_are_byte_identical_to_prost_encoding() {
        for (resources, removed) in [
            (resources(), vec!["gone".to_string(), String::new()]),
            (Vec::new(), Vec::new()),
        ] {
            let ours = DeltaResponse {
                system_version_info: "sys".into(),
                resources: resources.clone(),
                type_url: type_url::ENDPOINT,
                nonce: "42".into(),
                removed_resources: removed.clone(),
            };
            let theirs = DeltaDiscoveryResponse {
                system_version_info: "sys".into(),
                resources: resources
                    .iter()
                    .map(|r| DeltaResource {
                        name: r.name.clone(),
                        version: r.version.clone(),
                        resource: Some(any(r)),
                        ..Default::default()
                    })
                    .collect(),
                type_url: type_url::ENDPOINT.into(),
                nonce: "42".into(),
                removed_resources: removed,
                ..Default::default()
            };
            let bytes = ours.encode_to_vec();
            assert_eq!(bytes.len(), ours.encoded_len());
            assert_eq!(bytes, theirs.encode_to_vec());
            assert_eq!(
                DeltaDiscoveryResponse::decode(bytes.as_slice()).expect("decodes"),
                theirs
            );
        }
    }
}
