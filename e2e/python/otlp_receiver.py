"""An OpenTelemetry trace receiver for the e2e scenarios: OTLP over gRPC (Python grpcio and the
opentelemetry-proto messages), as a collector receives spans.

Serves opentelemetry.proto.collector.trace.v1.TraceService/Export on 0.0.0.0:--port and keeps
what it received (at most MAX_SPANS spans); serves HTTP on 0.0.0.0:--listen: GET /spans answers
one JSON object {"spans": [{"trace_id", "span_id", "parent_span_id", "name", "kind",
"service_name", "attributes": {key: value}}]}.
"""

import argparse
import json
import signal
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
MAX_SPANS = 10000

lock = threading.Lock()
spans = []


def value_of(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def export(request, context):
    received = []
    for rs in request.resource_spans:
        service = next(
            (value_of(a.value) for a in rs.resource.attributes if a.key == "service.name"), None
        )
        for ss in rs.scope_spans:
            for s in ss.spans:
                received.append(
                    {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": s.kind,
                        "service_name": service,
                        "attributes": {a.key: value_of(a.value) for a in s.attributes},
                    }
                )
    with lock:
        spans.extend(received[: max(0, MAX_SPANS - len(spans))])
    print(f"received {len(received)} spans", flush=True)
    return trace_service_pb2.ExportTraceServiceResponse()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/spans":
            self.send_error(404)
            return
        with lock:
            body = json.dumps({"spans": spans}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=4317)
    parser.add_argument("--listen", type=int, default=9411)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.unary_unary_rpc_method_handler(
        export,
        request_deserializer=trace_service_pb2.ExportTraceServiceRequest.FromString,
        response_serializer=trace_service_pb2.ExportTraceServiceResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
    if server.add_insecure_port(f"0.0.0.0:{args.port}") == 0:
        sys.exit(f"cannot listen on port {args.port}")
    server.start()
    http = ThreadingHTTPServer(("0.0.0.0", args.listen), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    print(f"receiving OTLP traces on {args.port}, spans on :{args.listen}/spans", flush=True)

    def stop(*_):
        http.shutdown()
        server.stop(0)

    signal.signal(signal.SIGTERM, stop)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
