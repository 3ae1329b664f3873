"""A gRPC echo service and a proxyless gRPC client for the e2e scenarios (Python grpcio).

serve:  answers /meshplane.e2e.Echo/Who with --name (raw bytes: no generated stubs needed) on
        0.0.0.0:--port.
client: holds one channel to --target (an xds:/// target: gRPC's own xDS client, configured by
        the bootstrap the injector put in GRPC_XDS_BOOTSTRAP_CONFIG) for as long as it runs, and
        serves HTTP on 0.0.0.0:--listen: GET /calls?count=N makes N calls on that channel and
        answers one JSON object {"answers": {name: count}, "errors": [first few errors]}.
        One channel across calls is the point: the test checks that it follows route changes.
"""

import argparse
import json
import signal
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import grpc

SERVICE = "meshplane.e2e.Echo"
METHOD = f"/{SERVICE}/Who"
MAX_CALLS = 1000


def serve(port: int, name: str) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: name.encode())
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Who": handler}),))
    if server.add_insecure_port(f"0.0.0.0:{port}") == 0:
        sys.exit(f"cannot listen on port {port}")
    server.start()
    print(f"serving {name} on {port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


def client(target: str, listen: int, timeout: float) -> None:
    channel = grpc.insecure_channel(target)
    who = channel.unary_unary(METHOD)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path != "/calls":
                self.send_error(404)
                return
            try:
                count = int(parse_qs(url.query).get("count", ["1"])[0])
            except ValueError:
                self.send_error(400, "count is not a number")
                return
            if not 0 < count <= MAX_CALLS:
                self.send_error(400, f"count must be in 1..{MAX_CALLS}")
                return
            answers: dict = {}
            errors: list = []
            with lock:
                for _ in range(count):
                    try:
                        # wait_for_ready: a call made before xDS has answered waits (bounded
                        # by the timeout) instead of failing at once.
                        answer = who(b"", timeout=timeout, wait_for_ready=True).decode()
                        answers[answer] = answers.get(answer, 0) + 1
                    except grpc.RpcError as error:
                        if len(errors) < 5:
                            errors.append(f"{error.code()}: {error.details()}")
            body = json.dumps({"answers": answers, "errors": errors}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("0.0.0.0", listen), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown).start())
    print(f"client of {target} on {listen}", flush=True)
    httpd.serve_forever()
    channel.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--name", required=True)
    c = sub.add_parser("client")
    c.add_argument("--target", required=True)
    c.add_argument("--listen", type=int, required=True)
    c.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.port, args.name)
    else:
        client(args.target, args.listen, args.timeout)


if __name__ == "__main__":
    main()
