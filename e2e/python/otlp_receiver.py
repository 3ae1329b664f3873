"""An OpenTelemetry receiver for the e2e scenarios, as a collector receives spans and logs:
OTLP over gRPC (Python grpcio and the opentelemetry-proto messages) and OTLP over HTTP
(protobuf bodies).

Serves opentelemetry.proto.collector.trace.v1.TraceService/Export and
opentelemetry.proto.collector.logs.v1.LogsService/Export on 0.0.0.0:--port, and HTTP on
0.0.0.0:--listen: POST /v1/traces takes an ExportTraceServiceRequest; GET /spans answers one
JSON object {"spans": [{"trace_id", "span_id", "parent_span_id", "name", "kind",
"service_name", "transport", "attributes": {key: value}}]} ("transport": "grpc" or "http");
GET /logs answers {"logs": [{"body", "service_name", "attributes": {key: value}}]}. It keeps
at most MAX_SPANS spans and MAX_LOGS log records.
"""

import argparse
import json
import signal
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
MAX_SPANS = 10000
MAX_LOGS = 10000

lock = threading.Lock()
spans = []
logs = []


def value_of(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def resource_service(resource):
    return next((value_of(a.value) for a in resource.attributes if a.key == "service.name"), None)


def keep_spans(request, transport):
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
                        "transport": transport,
                        "attributes": {a.key: value_of(a.value) for a in s.attributes},
                    }
                )
    with lock:
        spans.extend(received[: max(0, MAX_SPANS - len(spans))])
    print(f"received {len(received)} spans over {transport}", flush=True)


def export(request, context):
    keep_spans(request, "grpc")
    return trace_service_pb2.ExportTraceServiceResponse()


def export_logs(request, context):
    received = []
    for rl in request.resource_logs:
        service = resource_service(rl.resource)
        for sl in rl.scope_logs:
            for r in sl.log_records:
                received.append(
                    {
                        "body": value_of(r.body),
                        "service_name": service,
                        "attributes": {a.key: value_of(a.value) for a in r.attributes},
                    }
                )
    with lock:
        logs.extend(received[: max(0, MAX_LOGS - len(logs))])
    print(f"received {len(received)} log records", flush=True)
    return logs_service_pb2.ExportLogsServiceResponse()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, content_type, body):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with lock:
            if self.path == "/spans":
                body = json.dumps({"spans": spans}).encode()
            elif self.path == "/logs":
                body = json.dumps({"logs": logs}).encode()
            else:
                body = None
        if body is None:
            self.send_error(404)
            return
        self.reply(200, "application/json", body)

    def body(self):
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers, up to the empty line.
                    while self.rfile.readline().strip():
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def do_POST(self):
        data = self.body()
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        try:
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(data)
        except Exception as e:  # a body that is not an export request
            self.reply(400, "text/plain", str(e).encode())
            return
        print(f"OTLP/HTTP export: {len(data)} bytes, {self.headers.get('content-type')}", flush=True)
        keep_spans(request, "http")
        self.reply(200, "application/x-protobuf", trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

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
    logs_handler = grpc.unary_unary_rpc_method_handler(
        export_logs,
        request_deserializer=logs_service_pb2.ExportLogsServiceRequest.FromString,
        response_serializer=logs_service_pb2.ExportLogsServiceResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),
            grpc.method_handlers_generic_handler(LOGS_SERVICE, {"Export": logs_handler}),
        )
    )
    if server.add_insecure_port(f"0.0.0.0:{args.port}") == 0:
        sys.exit(f"cannot listen on port {args.port}")
    server.start()
    http = ThreadingHTTPServer(("0.0.0.0", args.listen), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    print(
        f"receiving OTLP traces and logs on {args.port}, OTLP/HTTP traces and the JSON views on :{args.listen}",
        flush=True,
    )

    def stop(*_):
        http.shutdown()
        server.stop(0)

    signal.signal(signal.SIGTERM, stop)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
