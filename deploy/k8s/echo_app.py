"""A demo app for trying tiergate as a sidecar: answers every request with what it received.

The reply shows the method, path, body and every `x-*` request header, so the decision headers
tiergate adds (x-tiergate-action, x-tiergate-risk-score, ...) are visible. Standard library only.

    python3 deploy/k8s/echo_app.py            # listens on 127.0.0.1:3000 (env HOST, PORT)
"""

import http.server
import json
import os


class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the proxy's connection pool is exercised

    def _body(self):
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _reply(self):
        received = {
            "app": "echo",
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items() if k.lower().startswith("x-")},
            "body": self._body().decode("utf-8", "replace"),
        }
        out = (json.dumps(received, indent=2, ensure_ascii=False) + "\n").encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _reply


if __name__ == "__main__":
    addr = (os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "3000")))
    print(f"echo app on http://{addr[0]}:{addr[1]}", flush=True)
    http.server.ThreadingHTTPServer(addr, Echo).serve_forever()
