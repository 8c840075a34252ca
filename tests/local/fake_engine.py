"""A stand-in for `vllm serve` in the fast lifecycle tests: answers like vLLM's OpenAI server, in ms.

`inferstack local` runs ``$INFERSTACK_ENGINE_PYTHON -c LAUNCHER ARGS``; the tests point that variable
at a wrapper that runs this file with the same arguments. Like vLLM, it forks a child (vLLM's
EngineCore), so the tests see that stopping takes the whole process group. ``FAKE_ENGINE_FAIL=1``
makes it die at start with a message, as a broken model would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _arg(argv: list[str], flag: str, default: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["-c"]:
        argv = argv[2:]  # the launcher's source
    port = int(_arg(argv, "--port", "0"))
    name = _arg(argv, "--served-model-name", "fake")
    if os.environ.get("FAKE_ENGINE_FAIL"):
        print(f"ValueError: cannot load model {argv[0]}: fake failure", flush=True)
        sys.exit(3)
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # like EngineCore
    served = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            return

        def _send(self, status: int, body: object, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"", "text/plain")
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
            elif self.path == "/metrics":
                text = (
                    f'vllm:num_requests_running{{model_name="{name}"}} 0\n'
                    f'vllm:num_requests_waiting{{model_name="{name}"}} 0\n'
                    f'vllm:kv_cache_usage_perc{{model_name="{name}"}} 0\n'
                )
                self._send(200, text.encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            served["n"] += 1
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            if self.path == "/v1/chat/completions":
                message = {"role": "assistant", "content": f"port {port}"}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                self._send(
                    200,
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "created": 0,
                        "model": name,
                        "choices": [choice],
                        "usage": usage,
                    },
                )
            elif self.path == "/v1/embeddings":
                inputs = body.get("input")
                items = inputs if isinstance(inputs, list) else [inputs]
                data = [
                    {"index": i, "object": "embedding", "embedding": [0.6, 0.8]} for i in range(len(items))
                ]
                self._send(200, {"object": "list", "model": name, "data": data, "usage": usage})
            else:
                self._send(404, {"error": "not found"})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    time.sleep(float(os.environ.get("FAKE_ENGINE_DELAY_S", "0.3")))  # engines take a while to come up
    try:
        server.serve_forever()
    finally:
        core.kill()


if __name__ == "__main__":
    main()
