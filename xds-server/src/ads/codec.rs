//! How each ADS variant reads its requests and writes its responses ([`Wire`]), and the
//! responses themselves, written straight from the shared encodings of their resources.
//!
//! Each resource is encoded once per version ([`Resource::encoded`]) and held by every stream
//! that serves it. prost's `DiscoveryResponse` would need each of them copied into an owned
//! `Any` per response and then encoded again; the messages here hold the shared resources and
//! write their bytes into the gRPC frame directly, in the field order prost uses, so the wire
//! bytes are those of the generated messages (the tests check it). A SotW response carrying a
//! snapshot's whole set goes further: its `Any` fields are framed once per snapshot
//! ([`super::frames::any_fields`], [`super::payload`]) and every stream passes on the same
//! buffers. They are only ever sent: decoding one skips every field.
//!
//! To a client that accepts zstd, a response carrying a large shared piece goes compressed,
//! the piece's compressed frame made once and shared as well ([`super::compressed`]).

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};
use prost::DecodeError;

use super::compressed::{Compress, Packer, PACK_MIN};
use super::frames::{any_len, field_len, put_any, put_delimited, put_scalar, scalar_len, Sink};
use super::payload::Resources;
use super::protocol::{Outgoing, Protocol, RequestOutcome, StreamState};
use crate::bounds;
use crate::model::Resource;

/// Request and response encoding of one ADS variant.
pub trait Wire: Send + 'static {
    type Req: prost::Message + Default + Send + 'static;
    /// Holds the shared resources; encoded straight into the frame ([`Parts`]).
    type Resp: Parts + Send + Unpin + 'static;
    const PROTOCOL: Protocol;
    fn node(req: &Self::Req) -> Option<&Node>;
    fn fold(state: &mut StreamState, req: &Self::Req) -> RequestOutcome;
    /// What `req` lists, counted from its decoded form.
    fn scanned(req: &Self::Req) -> Scan;
    /// What the stream would hold once `req` is folded; `None`: it holds nothing of it.
    fn prospect(state: &StreamState, req: &Self::Req) -> Option<Prospect>;
    fn encode(out: Outgoing) -> Self::Resp;
}

/// State of the world.
pub enum Sotw {}

impl Wire for Sotw {
    type Req = DiscoveryRequest;
    type Resp = SotwResponse;
    const PROTOCOL: Protocol = Protocol::Sotw;

    fn node(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn fold(state: &mut StreamState, req: &DiscoveryRequest) -> RequestOutcome {
        state.on_sotw_request(
            &req.type_url,
            &req.response_nonce,
            &req.version_info,
            &req.resource_names,
            req.error_detail
                .as_ref()
                .map(|e| bounds::clip(&e.message, bounds::NACK_MESSAGE))
                .as_deref(),
        )
    }

    fn scanned(req: &DiscoveryRequest) -> Scan {
        Scan {
            subscribe: req.resource_names.len() + req.resource_locators.len(),
            subscribe_bytes: names_len(&req.resource_names)
                + req
                    .resource_locators
                    .iter()
                    .map(|l| l.name.len())
                    .sum::<usize>(),
            version_info: req.version_info.len(),
            nonce: req.response_nonce.len(),
            ..Scan::default()
        }
    }

    fn prospect(state: &StreamState, req: &DiscoveryRequest) -> Option<Prospect> {
        let (type_names, names, bytes) =
            state.names_after_sotw(&req.type_url, &req.resource_names)?;
        Some(Prospect {
            type_names,
            subscribed: Held { names, bytes },
            initial: Held::default(),
        })
    }

    fn encode(out: Outgoing) -> SotwResponse {
        SotwResponse {
            version_info: out.version,
            resources: out.resources,
            type_url: out.type_url,
            nonce: out.nonce,
        }
    }
}

/// Incremental.
pub enum Delta {}

impl Wire for Delta {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaResponse;
    const PROTOCOL: Protocol = Protocol::Delta;

    fn node(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn fold(state: &mut StreamState, req: &DeltaDiscoveryRequest) -> RequestOutcome {
        state.on_delta_request(
            &req.type_url,
            &req.response_nonce,
            &req.resource_names_subscribe,
            &req.resource_names_unsubscribe,
            &req.initial_resource_versions,
            req.error_detail
                .as_ref()
                .map(|e| bounds::clip(&e.message, bounds::NACK_MESSAGE))
                .as_deref(),
        )
    }

    fn scanned(req: &DeltaDiscoveryRequest) -> Scan {
        Scan {
            subscribe: req.resource_names_subscribe.len() + req.resource_locators_subscribe.len(),
            subscribe_bytes: names_len(&req.resource_names_subscribe),
            unsubscribe: req.resource_names_unsubscribe.len()
                + req.resource_locators_unsubscribe.len(),
            initial_versions: req.initial_resource_versions.len(),
            initial_bytes: initial_len(req),
            nonce: req.response_nonce.len(),
            ..Scan::default()
        }
    }

    fn prospect(state: &StreamState, req: &DeltaDiscoveryRequest) -> Option<Prospect> {
        let (type_names, names, bytes) = state.names_after_delta(
            &req.type_url,
            &req.resource_names_subscribe,
            &req.resource_names_unsubscribe,
        )?;
        // Initial versions are taken on a type's first request only.
        let initial = if state.requested(&req.type_url) {
            Held::default()
        } else {
            Held {
                names: req.initial_resource_versions.len(),
                bytes: initial_len(req),
            }
        };
        Some(Prospect {
            type_names,
            subscribed: Held { names, bytes },
            initial,
        })
    }

    fn encode(out: Outgoing) -> DeltaResponse {
        DeltaResponse {
            system_version_info: out.version,
            resources: out.resources.into_list(),
            type_url: out.type_url,
            nonce: out.nonce,
            removed_resources: out.removed,
        }
    }
}

fn names_len(names: &[String]) -> usize {
    names.iter().map(String::len).sum()
}

/// Bytes of the names and versions of a delta request's `initial_resource_versions`.
fn initial_len(req: &DeltaDiscoveryRequest) -> usize {
    req.initial_resource_versions
        .iter()
        .map(|(n, v)| n.len() + v.len())
        .sum()
}

/// What one request lists, counted from its encoding ([`super::budget::scan`]) or its decoded form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Names (and resource locators) subscribed to: SotW's list, delta's subscriptions.
    pub subscribe: usize,
    pub subscribe_bytes: usize,
    /// Names (and locators) unsubscribed from (delta).
    pub unsubscribe: usize,
    /// `initial_resource_versions` entries (delta) and their encoded bytes.
    pub initial_versions: usize,
    pub initial_bytes: usize,
    pub version_info: usize,
    pub nonce: usize,
}

/// Names and bytes held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub names: usize,
    pub bytes: usize,
}

/// What a request would leave a stream holding, were it folded ([`Wire::prospect`]; a stream's budget admits it or not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prospect {
    /// Names subscribed of the request's type.
    pub type_names: usize,
    /// Names and bytes subscribed over every type.
    pub subscribed: Held,
    /// Initial versions the request adds (delta, a type's first request).
    pub initial: Held,
}

/// A response written part by part, so a stream can frame it lazily: part 0 holds the fields
/// before the resources, parts `1..=n` one resource each (or one shared piece of
/// [`AnyFields`] each), the last part the fields after them.
pub trait Parts: prost::Message {
    /// Number of parts (resources + 2).
    fn parts(&self) -> usize;
    /// Writes part `i`, in prost's field order.
    fn write_part(&self, i: usize, out: &mut impl Sink);
    /// Writes the message compressed, if it carries a shared piece worth it (at least
    /// [`PACK_MIN`] bytes): the bytes around the shared pieces go to [`Packer::raw`], the
    /// shared pieces as their one compressed frame. `false`: it goes uncompressed.
    fn pack(&self, out: &mut Packer) -> bool;
}

/// Writes the `Any` field holding `r`, a large encoding as its shared compressed frame.
fn pack_any(tag: u32, r: &Resource, out: &mut Packer) {
    if r.encoded.len() < PACK_MIN {
        return put_any(tag, r, out.raw());
    }
    put_delimited(tag, any_len(r), out.raw());
    put_scalar(1, r.type_url.as_bytes(), out.raw());
    put_delimited(2, r.encoded.len(), out.raw());
    out.frame(r.packed.get_or_compress([r.encoded.as_ref()]));
}

/// Whether any of `list` is large enough to send compressed.
fn any_large(list: &[Arc<Resource>]) -> bool {
    list.iter().any(|r| r.encoded.len() >= PACK_MIN)
}

/// prost's `encode_raw` for a [`Parts`] message (used by tests and `encode_to_vec`; streams
/// frame through [`GrpcFrames`]).
fn encode_parts(message: &impl Parts, buf: &mut impl BufMut) {
    let mut out = Vec::with_capacity(message.encoded_len());
    for i in 0..message.parts() {
        message.write_part(i, &mut out);
    }
    buf.put_slice(&out);
}

/// A `DiscoveryResponse` (state of the world): version_info = 1, resources = 2 (`Any`),
/// type_url = 4, nonce = 5.
#[derive(Clone, Debug, Default)]
pub struct SotwResponse {
    pub version_info: String,
    pub resources: Resources,
    pub type_url: &'static str,
    pub nonce: String,
}

impl Parts for SotwResponse {
    fn parts(&self) -> usize {
        match &self.resources {
            Resources::Listed(list) => list.len() + 2,
            Resources::Whole(_, fields) => fields.segments().len() + 2,
        }
    }

    fn write_part(&self, i: usize, out: &mut impl Sink) {
        if i == 0 {
            put_scalar(1, self.version_info.as_bytes(), out.raw());
            return;
        }
        match &self.resources {
            Resources::Listed(list) => {
                if let Some(r) = list.get(i - 1) {
                    return put_any(2, r, out);
                }
            }
            Resources::Whole(_, fields) => {
                if let Some(segment) = fields.segments().get(i - 1) {
                    return out.shared(segment);
                }
            }
        }
        put_scalar(4, self.type_url.as_bytes(), out.raw());
        put_scalar(5, self.nonce.as_bytes(), out.raw());
    }

    fn pack(&self, out: &mut Packer) -> bool {
        match &self.resources {
            Resources::Whole(_, fields) if fields.len() >= PACK_MIN => {
                put_scalar(1, self.version_info.as_bytes(), out.raw());
                out.frame(fields.packed());
            }
            Resources::Listed(list) if any_large(list) => {
                put_scalar(1, self.version_info.as_bytes(), out.raw());
                for r in list {
                    pack_any(2, r, out);
                }
            }
            _ => return false,
        }
        put_scalar(4, self.type_url.as_bytes(), out.raw());
        put_scalar(5, self.nonce.as_bytes(), out.raw());
        true
    }
}

impl prost::Message for SotwResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_parts(self, buf);
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
        let resources = match &self.resources {
            Resources::Listed(list) => list.iter().map(|r| field_len(any_len(r))).sum(),
            Resources::Whole(_, fields) => fields.len(),
        };
        scalar_len(self.version_info.as_bytes())
            + resources
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

impl Parts for DeltaResponse {
    fn parts(&self) -> usize {
        self.resources.len() + 2
    }

    fn write_part(&self, i: usize, out: &mut impl Sink) {
        if i == 0 {
            put_scalar(1, self.system_version_info.as_bytes(), out.raw());
        } else if let Some(r) = self.resources.get(i - 1) {
            put_delimited(2, delta_resource_len(r), out.raw());
            put_scalar(1, r.version.as_bytes(), out.raw());
            put_any(2, r, out);
            put_scalar(3, r.name.as_bytes(), out.raw());
        } else {
            self.write_tail(out.raw());
        }
    }

    fn pack(&self, out: &mut Packer) -> bool {
        if !any_large(&self.resources) {
            return false;
        }
        put_scalar(1, self.system_version_info.as_bytes(), out.raw());
        for r in &self.resources {
            put_delimited(2, delta_resource_len(r), out.raw());
            put_scalar(1, r.version.as_bytes(), out.raw());
            pack_any(2, r, out);
            put_scalar(3, r.name.as_bytes(), out.raw());
        }
        self.write_tail(out.raw());
        true
    }
}

impl DeltaResponse {
    /// The fields after the resources.
    fn write_tail(&self, buf: &mut Vec<u8>) {
        put_scalar(4, self.type_url.as_bytes(), buf);
        put_scalar(5, self.nonce.as_bytes(), buf);
        for name in &self.removed_resources {
            // Repeated strings are written even when empty.
            put_delimited(6, name.len(), buf);
            buf.put_slice(name.as_bytes());
        }
    }
}

impl prost::Message for DeltaResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_parts(self, buf);
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::type_url;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource as DeltaResource,
    };
    use envoy_types::pb::google::protobuf::Any;
    use meshplane_xds_core::testing::mk_resource;
    use prost::Message;

    pub(crate) fn res(name: &str, type_url: &'static str, body: Vec<u8>) -> Arc<Resource> {
        mk_resource(type_url, name, body)
    }

    /// Resources of every size class a length prefix can take, and an empty one.
    pub(crate) fn resources() -> Vec<Arc<Resource>> {
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

    /// Both forms of a response's resources: listed, and framed once for a whole snapshot.
    fn both_forms(resources: &[Arc<Resource>]) -> [Resources; 2] {
        let snapshot = crate::ads::snapshot::TypeSnapshot::new(resources);
        [Resources::Listed(resources.to_vec()), snapshot.whole()]
    }

    #[test]
    fn sotw_responses_are_byte_identical_to_prost_encoding() {
        // Many small resources too, so the whole form spans several pieces.
        let many: Vec<Arc<Resource>> = (0..100)
            .map(|i| res(&format!("c{i:03}"), type_url::CLUSTER, vec![i as u8; 2_000]))
            .collect();
        for (resources, version, nonce) in [
            (resources(), "v1", "7"),
            (Vec::new(), "", ""),
            (resources()[..1].to_vec(), "", "1"),
            (many, "v2", "9"),
        ] {
            for form in both_forms(&resources) {
                let ours = SotwResponse {
                    version_info: version.into(),
                    resources: form,
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
