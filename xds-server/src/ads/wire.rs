//! The transport: the ADS gRPC service over the codec's messages ([`AdsService`]; the
//! generated server fixes its responses to prost's types), the listener and the HTTP/2 server.
//! It frames each response itself, lazily, in data frames of about 64 KiB that HTTP/2 asks for
//! as it writes, with large resource encodings passed on shared rather than copied
//! ([`GrpcFrames`]). To a client that accepts zstd, a response carrying a large shared piece
//! goes compressed, the piece's compressed frame made once and shared as well
//! ([`super::compressed`]).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use http_body::Frame;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::BufferSettings;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::NamedService;
use tonic::{Status, Streaming};

use super::codec::{Delta, Parts, Sotw, Wire};
use super::compressed::{accepts_zstd, Packer};
use super::frames::{Chunker, Sink, CHUNK};
use super::server::AdsServer;
use super::stream::shutting_down;

/// The connections accepted on `listener`, with TCP_NODELAY: a response written while the
/// previous one awaits its TCP ACK must not wait for the proxy's delayed ACK (40 ms on Linux).
/// Without it a route configuration sent on a cluster's ACK reached state-of-the-world
/// proxies 40 ms after the cluster. Both ports, plaintext and TLS, accept through it.
pub(crate) fn accepted(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

impl AdsServer {
    /// The tonic service to mount on a server (requests up to [`crate::bounds::MAX_REQUEST`]).
    pub fn into_service(self) -> AdsService {
        AdsService::new(self)
    }

    /// Serves ADS on `listener` until `shutdown` turns true (streams end first, so the server
    /// can drain).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
    ) -> Result<(), tonic::transport::Error> {
        let mut shutdown = self.shutdown.clone();
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .max_concurrent_streams(self.limits().streams_per_connection)
            .add_service(self.into_service())
            .serve_with_incoming_shutdown(accepted(listener), async move {
                shutting_down(&mut shutdown).await
            })
            .await
    }
}

/// gRPC service name of ADS.
pub const SERVICE_NAME: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
/// Method path of state-of-the-world ADS (the load generator calls it too).
pub const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// Method path of incremental (delta) ADS.
pub const DELTA_PATH: &str =
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

/// Capacity a stream's request decoder starts with: requests are small (acknowledgements,
/// subscriptions); the buffer grows for a larger one.
const REQUEST_BUFFER: usize = 1024;

/// Header naming the compression of a call's messages.
const GRPC_ENCODING: &str = "grpc-encoding";
/// Header listing the compressions a client can read.
const GRPC_ACCEPT_ENCODING: &str = "grpc-accept-encoding";

/// Length of the gRPC message prefix (flag and length).
const GRPC_HEADER: usize = 5;

/// Runs one ADS call of variant `W` on `server`.
///
/// Requests are decoded by tonic's `Streaming`; responses are framed here, each into a buffer
/// of its exact length that is freed once HTTP/2 has written it. tonic's server encoder keeps
/// one buffer per stream as large as the largest response it ever sent, which made most of
/// what an idle connected proxy costs the server.
async fn call<W: Wire, B>(
    server: Arc<AdsServer>,
    req: http::Request<B>,
) -> http::Response<tonic::body::Body>
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    // Envoy does not compress its requests; nothing else is accepted (as tonic answers).
    if let Some(encoding) = req
        .headers()
        .get(GRPC_ENCODING)
        .filter(|e| e.as_bytes() != b"identity")
    {
        let named = String::from_utf8_lossy(encoding.as_bytes()).into_owned();
        return Status::unimplemented(format!(
            "requests compressed with {} are not supported",
            crate::bounds::echo(&named)
        ))
        .into_http();
    }
    // The node agent accepts zstd: large responses go compressed ([`super::compressed`]).
    let zstd = accepts_zstd(
        req.headers()
            .get(GRPC_ACCEPT_ENCODING)
            .map(http::HeaderValue::as_bytes),
    );
    // The streams of one connection share a budget: it is known by its addresses.
    let (local, remote) = req
        .extensions()
        .get::<tonic::transport::server::TcpConnectInfo>()
        .map_or((None, None), |c| (c.local_addr(), c.remote_addr()));
    let connection = server.connection_budget(local, remote);
    let (decoder, awaiting) =
        server.decoder::<W>(BufferSettings::new(REQUEST_BUFFER, REQUEST_BUFFER));
    let request =
        tonic::Request::from_http(req.map(|body| {
            Streaming::new_request(decoder, body, None, Some(crate::bounds::MAX_REQUEST))
        }));
    match server.open::<W>(request, connection, awaiting).await {
        Err(status) => status.into_http(),
        Ok(responses) => {
            let frames = GrpcFrames::new(responses).compressing(zstd);
            let body = http_body_util::StreamBody::new(frames);
            let mut response = http::Response::new(tonic::body::Body::new(body));
            let headers = response.headers_mut();
            headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            if zstd {
                headers.insert(GRPC_ENCODING, http::HeaderValue::from_static("zstd"));
            }
            response
        }
    }
}

impl Chunker {
    /// Queues `message` compressed, prefix and frames, if it is worth compressing and fits a
    /// gRPC message; `false`: it was not queued.
    fn compressed(&mut self, message: &impl Parts) -> bool {
        let mut packer = Packer::default();
        if !message.pack(&mut packer) {
            return false;
        }
        let Some((frames, len)) = packer.finish() else {
            return false;
        };
        let Ok(len) = u32::try_from(len) else {
            return false;
        };
        // Compressed, then the big-endian length.
        let mut prefix = [1u8; GRPC_HEADER];
        prefix[1..].copy_from_slice(&len.to_be_bytes());
        self.raw().extend_from_slice(&prefix);
        for frame in frames {
            // Frames of a few bytes join the prefix; the shared ones go as they are.
            self.shared(&frame);
        }
        self.flush();
        true
    }
}

/// The HTTP/2 body of a streaming gRPC response: each message length-prefixed, then the
/// status as trailers (`grpc-status: 0` when the stream simply ends). A message is framed
/// lazily, about [`CHUNK`] bytes per data frame as HTTP/2 asks for the next (hyper polls the
/// body only while the stream's send buffer has room), and large resource encodings are
/// sent as they are shared: a stream never holds a copy of a whole multi-megabyte response.
struct GrpcFrames<M> {
    messages: ReceiverStream<Result<M, Status>>,
    /// The message being framed and its next part.
    current: Option<(M, usize)>,
    out: Chunker,
    done: bool,
    /// Whether the client accepts zstd: then a message that carries a large shared piece goes
    /// compressed, whole, as frames shared or made when it is taken off the queue.
    zstd: bool,
}

impl<M> GrpcFrames<M> {
    fn new(messages: ReceiverStream<Result<M, Status>>) -> Self {
        Self {
            messages,
            current: None,
            out: Chunker::new(),
            done: false,
            zstd: false,
        }
    }

    fn compressing(mut self, zstd: bool) -> Self {
        self.zstd = zstd;
        self
    }
}

impl<M: Parts + Unpin> Stream for GrpcFrames<M> {
    type Item = Result<Frame<bytes::Bytes>, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(data) = this.out.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            if let Some((message, next)) = &mut this.current {
                while *next < message.parts()
                    && this.out.ready.is_empty()
                    && this.out.buf.len() < CHUNK
                {
                    message.write_part(*next, &mut this.out);
                    *next += 1;
                }
                if *next == message.parts() {
                    this.current = None;
                    this.out.flush();
                } else if this.out.buf.len() >= CHUNK {
                    this.out.flush();
                }
                continue;
            }
            let status = match std::task::ready!(Pin::new(&mut this.messages).poll_next(cx)) {
                Some(Ok(message)) if this.zstd && this.out.compressed(&message) => continue,
                Some(Ok(message)) => match u32::try_from(message.encoded_len()) {
                    Ok(len) => {
                        // Not compressed, then the big-endian length.
                        let mut prefix = [0u8; GRPC_HEADER];
                        prefix[1..].copy_from_slice(&len.to_be_bytes());
                        this.out.raw().extend_from_slice(&prefix);
                        this.current = Some((message, 0));
                        continue;
                    }
                    Err(_) => Status::resource_exhausted(format!(
                        "a response of {} bytes",
                        message.encoded_len()
                    )),
                },
                Some(Err(status)) => status,
                None => Status::ok(""),
            };
            this.done = true;
            return Poll::Ready(Some(Ok(trailers(&status))));
        }
    }
}

/// The trailers carrying `status`.
fn trailers(status: &Status) -> Frame<bytes::Bytes> {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        // Only a message that cannot be a header value fails: the code alone still goes.
        map.clear();
        map.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
    }
    Frame::trailers(map)
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
    use crate::ads::codec::tests::{res, resources};
    use crate::ads::codec::{DeltaResponse, SotwResponse};
    use crate::ads::compressed::Compress;
    use crate::ads::frames::SHARE_MIN;
    use crate::ads::payload::Resources;
    use crate::model::{type_url, Resource};
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse;
    use prost::Message;

    /// How many data frames of `out` are `piece` itself (sent by reference, not copied).
    fn by_reference(out: &[Frame<bytes::Bytes>], piece: &bytes::Bytes) -> usize {
        out.iter()
            .filter_map(|f| f.data_ref())
            .filter(|d| d.as_ptr() == piece.as_ptr() && d.len() == piece.len())
            .count()
    }

    /// Two SotW responses (nonces 1 and 2) carrying the whole snapshot of `clusters`.
    fn whole_responses(clusters: &[Arc<Resource>]) -> [SotwResponse; 2] {
        let snapshot = crate::ads::snapshot::TypeSnapshot::new(clusters);
        ["1", "2"].map(|nonce| SotwResponse {
            version_info: snapshot.version.clone(),
            resources: snapshot.whole(),
            type_url: type_url::CLUSTER,
            nonce: nonce.into(),
        })
    }

    /// A whole snapshot is framed once: every stream that sends it passes on the same pieces.
    #[tokio::test]
    async fn a_whole_snapshot_is_framed_once_for_every_stream() {
        let many: Vec<Arc<Resource>> = (0..100)
            .map(|i| res(&format!("c{i:03}"), type_url::CLUSTER, vec![i as u8; 2_000]))
            .chain(resources())
            .collect();
        let [one, two] = whole_responses(&many);
        let (Resources::Whole(_, a), Resources::Whole(_, b)) = (&one.resources, &two.resources)
        else {
            panic!("whole snapshots");
        };
        assert!(Arc::ptr_eq(a, b), "framed once");
        let pieces: Vec<bytes::Bytes> = a.segments().to_vec();
        assert!(pieces.len() > 2);
        let out = frames(vec![one.clone(), two.clone()], None).await;
        let mut expected = Vec::new();
        for m in [&one, &two] {
            let encoded = m.encode_to_vec();
            expected.push(0u8);
            expected.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
            expected.extend_from_slice(&encoded);
        }
        assert_eq!(data(&out), expected);
        // Every piece long enough to go by reference went out as itself, once per response.
        let shared = |p: &bytes::Bytes| by_reference(&out, p);
        let long: Vec<&bytes::Bytes> = pieces.iter().filter(|p| p.len() >= SHARE_MIN).collect();
        assert!(long.len() >= 2);
        for p in long {
            assert_eq!(shared(p), 2);
        }
    }

    /// The frames of a response stream of `messages` then `end` (`None`: it just ends).
    async fn frames(messages: Vec<SotwResponse>, end: Option<Status>) -> Vec<Frame<bytes::Bytes>> {
        frames_of(messages, end, false).await
    }

    /// The frames of a response stream of `messages` then `end`, to a client that accepts
    /// zstd if `zstd`.
    async fn frames_of<M: Parts + Unpin + Send + 'static>(
        messages: Vec<M>,
        end: Option<Status>,
        zstd: bool,
    ) -> Vec<Frame<bytes::Bytes>> {
        use futures::StreamExt;
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        for m in messages {
            tx.send(Ok(m)).await.expect("open");
        }
        if let Some(status) = end {
            tx.send(Err(status)).await.expect("open");
        }
        drop(tx);
        GrpcFrames::new(ReceiverStream::new(rx))
            .compressing(zstd)
            .map(|f| f.expect("infallible"))
            .collect()
            .await
    }

    /// A response of many small resources is framed in pieces of about [`CHUNK`], each made
    /// when the body is polled for it, and the pieces are the encoding.
    #[tokio::test]
    async fn a_large_response_is_framed_lazily_in_chunks() {
        use futures::StreamExt;
        let small: Vec<Arc<Resource>> = (0..200)
            .map(|i| res(&format!("c{i}"), type_url::CLUSTER, vec![i as u8; 4_000]))
            .collect();
        let response = DeltaResponse {
            system_version_info: "v".into(),
            resources: small,
            type_url: type_url::CLUSTER,
            nonce: "3".into(),
            removed_resources: vec!["gone".into()],
        };
        let encoded = response.encode_to_vec();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(Ok(response)).await.expect("open");
        drop(tx);
        let mut body = GrpcFrames::new(ReceiverStream::new(rx));
        let first = body.next().await.expect("a frame").expect("infallible");
        let first = first.into_data().expect("data");
        assert!(
            first.len() >= CHUNK && first.len() < CHUNK + SHARE_MIN,
            "{}",
            first.len()
        );
        // Only the first chunk was framed yet.
        assert!(body.out.ready.is_empty() && body.out.buf.is_empty());
        let mut all = first.to_vec();
        let rest: Vec<Frame<bytes::Bytes>> = body.map(|f| f.expect("infallible")).collect().await;
        assert!(rest.len() > 2, "several chunks, then the trailers");
        all.extend(data(&rest));
        assert_eq!(&all[GRPC_HEADER..], encoded.as_slice());
        assert_eq!(&all[1..GRPC_HEADER], &(encoded.len() as u32).to_be_bytes());
    }

    fn grpc_status(frame: &Frame<bytes::Bytes>) -> Option<&str> {
        frame
            .trailers_ref()
            .and_then(|t| t.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
    }

    /// The bytes of the data frames before the trailers.
    fn data(frames: &[Frame<bytes::Bytes>]) -> Vec<u8> {
        frames
            .iter()
            .filter_map(|f| f.data_ref())
            .flat_map(|d| d.iter().copied())
            .collect()
    }

    #[tokio::test]
    async fn responses_are_length_prefixed_frames_then_the_status_as_trailers() {
        let response = SotwResponse {
            version_info: "v1".into(),
            resources: resources().into(),
            type_url: type_url::ENDPOINT,
            nonce: "1".into(),
        };
        let encoded = response.encode_to_vec();
        let out = frames(vec![response.clone(), response.clone()], None).await;
        let mut one = vec![0u8];
        one.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        one.extend_from_slice(&encoded);
        assert_eq!(data(&out), [one.clone(), one].concat());
        let last = out.last().expect("frames");
        assert_eq!(grpc_status(last), Some("0"));
        assert!(out[..out.len() - 1].iter().all(|f| f.is_data()));
        // The large resource goes as the shared bytes themselves, once per message.
        let Resources::Listed(listed) = &response.resources else {
            panic!("listed");
        };
        let big = &listed[6].encoded;
        assert!(big.len() >= SHARE_MIN);
        assert_eq!(by_reference(&out, big), 2);

        let refused = frames(Vec::new(), Some(Status::permission_denied("not a member"))).await;
        assert_eq!(refused.len(), 1, "the status ends the stream");
        assert_eq!(
            grpc_status(&refused[0]),
            Some((tonic::Code::PermissionDenied as i32).to_string().as_str())
        );
        let status = refused[0]
            .trailers_ref()
            .and_then(Status::from_header_map)
            .expect("a status in the trailers");
        assert_eq!(status.message(), "not a member");
    }

    /// The gRPC messages of `data`: whether each was compressed, and its bytes (decompressed
    /// as a gRPC client does).
    fn messages(mut data: &[u8]) -> Vec<(bool, Vec<u8>)> {
        let mut out = Vec::new();
        while !data.is_empty() {
            let (prefix, rest) = data.split_at(GRPC_HEADER);
            let len = u32::from_be_bytes(prefix[1..].try_into().expect("four bytes")) as usize;
            let (body, rest) = rest.split_at(len);
            let bytes = if prefix[0] == 1 {
                let mut plain = Vec::new();
                let mut decoder = zstd::stream::read::Decoder::new(body).expect("decoder");
                std::io::copy(&mut decoder, &mut plain).expect("zstd");
                plain
            } else {
                body.to_vec()
            };
            out.push((prefix[0] == 1, bytes));
            data = rest;
        }
        out
    }

    /// A body of `len` bytes that compresses as configuration does: a repeated pattern with
    /// names that differ (pseudo-random bytes), so it compresses to about a third.
    fn config_like(len: usize, seed: u8) -> Vec<u8> {
        let mut state = u32::from(seed) + 1;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            out.extend_from_slice(b"retry_on: connect-failure,refused-stream; host: ");
            for _ in 0..16 {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                out.push((state >> 16) as u8);
            }
        }
        out.truncate(len);
        out
    }

    /// To a client that accepts zstd, a response carrying a large shared piece goes
    /// compressed, its large piece compressed once for every stream; the bytes it decompresses
    /// to are the response's encoding. Small responses, and clients that do not accept zstd,
    /// get the plain encoding.
    #[tokio::test]
    async fn large_responses_go_compressed_their_large_pieces_compressed_once() {
        let route = res(
            "80",
            type_url::ROUTE,
            config_like(crate::ads::compressed::PACK_MIN + 1, 7),
        );
        let response = |nonce: &str, resources: Vec<Arc<Resource>>| SotwResponse {
            version_info: "v".into(),
            resources: resources.into(),
            type_url: type_url::ROUTE,
            nonce: nonce.into(),
        };
        let big = || {
            response(
                "1",
                vec![
                    Arc::clone(&route),
                    res("small", type_url::ROUTE, vec![1; 10]),
                ],
            )
        };
        let small = response("2", resources()[..5].to_vec());
        let sent = vec![
            big(),
            small.clone(),
            response("3", vec![Arc::clone(&route)]),
        ];
        let out = frames_of(sent.clone(), None, true).await;
        let got = messages(&data(&out));
        let flags: Vec<bool> = got.iter().map(|(z, _)| *z).collect();
        assert_eq!(flags, [true, false, true]);
        for ((_, bytes), message) in got.iter().zip(&sent) {
            assert_eq!(bytes, &message.encode_to_vec());
        }
        let wire = data(&out).len();
        let plain_wire = data(&frames_of(sent.clone(), None, false).await).len();
        assert!(
            wire < plain_wire / 2,
            "{wire} bytes on the wire, {plain_wire} plain"
        );
        // The route's frame was made once, kept with the resource, sent by reference twice.
        let packed = route
            .packed
            .get_or_compress([&b"not looked at"[..]])
            .expect("packed");
        assert_eq!(by_reference(&out, &packed), 2);

        // A client that does not accept zstd gets the plain encoding of the same responses.
        let plain = messages(&data(&frames_of(sent.clone(), None, false).await));
        assert!(plain.iter().all(|(z, _)| !z));
        assert_eq!(plain.len(), 3);
        for ((_, bytes), message) in plain.iter().zip(&sent) {
            assert_eq!(bytes, &message.encode_to_vec());
        }
    }

    /// A whole snapshot large enough goes as the snapshot's one compressed frame; delta
    /// responses carrying a large resource go compressed as well.
    #[tokio::test]
    async fn whole_snapshots_and_delta_responses_go_compressed() {
        let many: Vec<Arc<Resource>> = (0..200u8)
            .map(|i| {
                res(
                    &format!("c{i:03}"),
                    type_url::CLUSTER,
                    config_like(2_000, i),
                )
            })
            .collect();
        let sent = whole_responses(&many).to_vec();
        let out = frames_of(sent.clone(), None, true).await;
        let got = messages(&data(&out));
        assert_eq!(got.len(), 2);
        for ((zstd, bytes), message) in got.iter().zip(&sent) {
            assert!(zstd);
            assert_eq!(bytes, &message.encode_to_vec());
        }
        let Resources::Whole(_, fields) = &sent[0].resources else {
            panic!("whole");
        };
        let packed = fields.packed().expect("packed");
        assert_eq!(by_reference(&out, &packed), 2, "one frame for both streams");

        let delta = DeltaResponse {
            system_version_info: "s".into(),
            resources: vec![
                res("80", type_url::ROUTE, config_like(300_000, 1)),
                res("81", type_url::ROUTE, vec![2; 40]),
            ],
            type_url: type_url::ROUTE,
            nonce: "4".into(),
            removed_resources: vec!["82".into()],
        };
        let got = messages(&data(&frames_of(vec![delta.clone()], None, true).await));
        assert_eq!(got, [(true, delta.encode_to_vec())]);
        assert_eq!(
            DeltaDiscoveryResponse::decode(got[0].1.as_slice())
                .expect("decodes")
                .resources
                .len(),
            2
        );
    }
}

#[cfg(test)]
mod accept_tests {
    use tokio_stream::StreamExt as _;

    /// Both ports accept through `accepted`: its connections have Nagle's algorithm off.
    #[tokio::test]
    async fn accepted_connections_send_without_waiting_for_delayed_acks() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut incoming = super::accepted(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let conn = incoming
            .next()
            .await
            .expect("a connection")
            .expect("accepted");
        assert!(conn.nodelay().expect("TCP_NODELAY readable"));
    }
}
