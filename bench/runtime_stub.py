"""A local stand-in for the Lambda Runtime API (and for DynamoDB's one
start-up GetItem), to time a cold start: from exec of the bootstrap to its
first `GET /2018-06-01/runtime/invocation/next`.

    python3 bench/runtime_stub.py BOOTSTRAP [RUNS]

Prints one line per run: `cold_start_ms <ms>`, and the same for exec of
/bin/true as the baseline measured alongside.
"""

import http.server
import os
import subprocess
import sys
import threading
import time

first_poll = threading.Event()


class Stub(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.endswith("/runtime/invocation/next"):
            first_poll.set()
            # Hold the poll open: the process is ready; we are done with it.
            time.sleep(5)
        self.send_response(200)
        self.end_headers()

    def do_POST(self):
        # DynamoDB's GetItem (the table check at start): no item.
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main():
    bootstrap = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AWS_LAMBDA_RUNTIME_API": address,
        "AWS_LAMBDA_FUNCTION_NAME": "mediaonce-bench",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_ENDPOINT_URL": f"http://{address}",
        "MEDIAONCE_TABLE": "jobs",
        "MEDIAONCE_OUTPUT_BUCKET": "out",
    }
    for _ in range(runs):
        first_poll.clear()
        started = time.perf_counter()
        child = subprocess.Popen([bootstrap], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if not first_poll.wait(10):
            child.kill()
            sys.exit("the bootstrap never polled: " + child.stderr.read().decode(errors="replace")[-2000:])
        print(f"cold_start_ms {(time.perf_counter() - started) * 1e3:.2f}")
        child.kill()
        child.wait()
        started = time.perf_counter()
        subprocess.run(["/bin/true"])
        print(f"exec_true_ms {(time.perf_counter() - started) * 1e3:.2f}")


main()
