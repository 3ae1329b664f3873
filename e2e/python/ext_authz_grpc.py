"""An external authorizer for the e2e scenarios: Envoy's ext_authz gRPC service
(envoy.service.auth.v3.Authorization/Check) on Python grpcio, as a team's authorizer runs it.

The messages are declared here as descriptors built at start-up, with the fields this
authorizer reads and writes and their numbers in Envoy's API (envoy/service/auth/v3,
envoy/config/core/v3, envoy/type/v3, google/rpc): protobuf skips the fields it does not declare,
so no code generation and no copy of Envoy's .proto files is needed.

Decisions, for HTTP checks: a request whose path contains `/ok` is allowed and the request
goes on with the header `x-authz-user: alice` added; any other is denied with status 403, the
body `denied by the grpc authorizer` and the header `x-authz-reason: not ok`. A check without
HTTP attributes (a TCP connection, from the network ext_authz filter) is allowed when its
destination port is one of --allow-ports, denied otherwise.

Serves gRPC on 0.0.0.0:--port; serves HTTP on 0.0.0.0:--listen, where GET /calls answers the
checks received so far, one per line: the path for HTTP checks, `tcp <port> <principal>` for
TCP ones (the principal is the client's SPIFFE ID when it came over mutual TLS).
"""

import argparse
import signal
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "envoy.service.auth.v3"
SERVICE = "envoy.service.auth.v3.Authorization"
MAX_CALLS = 10000

F = descriptor_pb2.FieldDescriptorProto


def field(name, number, kind, type_name=None, repeated=False):
    f = F(name=name, number=number, type=kind)
    f.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
    if type_name:
        f.type_name = f".{PACKAGE}.{type_name}"
    return f


def message(name, *fields, nested=()):
    m = descriptor_pb2.DescriptorProto(name=name)
    m.field.extend(fields)
    m.nested_type.extend(nested)
    return m


def string_map_entry(name):
    entry = message(
        name, field("key", 1, F.TYPE_STRING), field("value", 2, F.TYPE_STRING)
    )
    entry.options.map_entry = True
    return entry


def build_messages():
    """The subset of Envoy's check messages, by number."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="meshplane_e2e_ext_authz.proto", package=PACKAGE, syntax="proto3"
    )
    fd.message_type.extend(
        [
            # envoy.service.auth.v3.AttributeContext.HttpRequest
            message(
                "HttpRequest",
                field("method", 2, F.TYPE_STRING),
                field(
                    "headers", 3, F.TYPE_MESSAGE, "HttpRequest.HeadersEntry", repeated=True
                ),
                field("path", 4, F.TYPE_STRING),
                field("host", 5, F.TYPE_STRING),
                nested=[string_map_entry("HeadersEntry")],
            ),
            # AttributeContext.Request
            message("Request", field("http", 2, F.TYPE_MESSAGE, "HttpRequest")),
            # envoy.config.core.v3.SocketAddress / Address
            message(
                "SocketAddress",
                field("address", 2, F.TYPE_STRING),
                field("port_value", 3, F.TYPE_UINT32),
            ),
            message("Address", field("socket_address", 1, F.TYPE_MESSAGE, "SocketAddress")),
            # AttributeContext.Peer
            message(
                "Peer",
                field("address", 1, F.TYPE_MESSAGE, "Address"),
                field("principal", 4, F.TYPE_STRING),
            ),
            # AttributeContext
            message(
                "AttributeContext",
                field("source", 1, F.TYPE_MESSAGE, "Peer"),
                field("destination", 2, F.TYPE_MESSAGE, "Peer"),
                field("request", 4, F.TYPE_MESSAGE, "Request"),
            ),
            message("CheckRequest", field("attributes", 1, F.TYPE_MESSAGE, "AttributeContext")),
            # google.rpc.Status
            message("Status", field("code", 1, F.TYPE_INT32), field("message", 2, F.TYPE_STRING)),
            # envoy.config.core.v3.HeaderValue / HeaderValueOption
            message("HeaderValue", field("key", 1, F.TYPE_STRING), field("value", 2, F.TYPE_STRING)),
            message("HeaderValueOption", field("header", 1, F.TYPE_MESSAGE, "HeaderValue")),
            # envoy.type.v3.HttpStatus (its code is an enum: a varint on the wire)
            message("HttpStatus", field("code", 1, F.TYPE_INT32)),
            message(
                "DeniedHttpResponse",
                field("status", 1, F.TYPE_MESSAGE, "HttpStatus"),
                field("headers", 2, F.TYPE_MESSAGE, "HeaderValueOption", repeated=True),
                field("body", 3, F.TYPE_STRING),
            ),
            message(
                "OkHttpResponse",
                field("headers", 2, F.TYPE_MESSAGE, "HeaderValueOption", repeated=True),
            ),
            message(
                "CheckResponse",
                field("status", 1, F.TYPE_MESSAGE, "Status"),
                field("denied_response", 2, F.TYPE_MESSAGE, "DeniedHttpResponse"),
                field("ok_response", 3, F.TYPE_MESSAGE, "OkHttpResponse"),
            ),
        ]
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return lambda name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{PACKAGE}.{name}")
    )


cls = build_messages()
CheckRequest, CheckResponse = cls("CheckRequest"), cls("CheckResponse")
HeaderValueOption = cls("HeaderValueOption")

# google.rpc.Code
OK, PERMISSION_DENIED = 0, 7

lock = threading.Lock()
calls = []


def record(call):
    with lock:
        if len(calls) < MAX_CALLS:
            calls.append(call)


def header(key, value):
    option = HeaderValueOption()
    option.header.key = key
    option.header.value = value
    return option


def check(request, context):
    attributes = request.attributes
    response = CheckResponse()
    if attributes.request.HasField("http"):
        path = attributes.request.http.path
        record(path)
        if "/ok" in path:
            response.status.code = OK
            response.ok_response.headers.append(header("x-authz-user", "alice"))
        else:
            response.status.code = PERMISSION_DENIED
            response.denied_response.status.code = 403
            response.denied_response.headers.append(header("x-authz-reason", "not ok"))
            response.denied_response.body = "denied by the grpc authorizer"
        return response
    port = attributes.destination.address.socket_address.port_value
    record(f"tcp {port} {attributes.source.principal}")
    response.status.code = OK if port in ARGS.allow_ports else PERMISSION_DENIED
    return response


class Calls(BaseHTTPRequestHandler):
    def do_GET(self):
        with lock:
            body = "\n".join(calls).encode()
        self.send_response(200 if self.path == "/calls" else 404)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--listen", type=int, default=9001)
    parser.add_argument("--allow-ports", type=int, nargs="*", default=[])
    global ARGS
    ARGS = parser.parse_args()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    handler = grpc.unary_unary_rpc_method_handler(
        check,
        request_deserializer=CheckRequest.FromString,
        response_serializer=lambda m: m.SerializeToString(),
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Check": handler}),)
    )
    server.add_insecure_port(f"0.0.0.0:{ARGS.port}")
    server.start()
    http = ThreadingHTTPServer(("0.0.0.0", ARGS.listen), Calls)
    threading.Thread(target=http.serve_forever, daemon=True).start()

    def stop(*_):
        http.shutdown()
        server.stop(grace=None)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
