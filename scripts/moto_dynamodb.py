"""moto's server, with DynamoDB requests made atomic.

moto's DynamoDB backend is not thread-safe: under concurrent clients two
conditional PutItems on the same key can both succeed. Real DynamoDB makes
every conditional write atomic, so this wrapper serialises the requests whose
X-Amz-Target names a DynamoDB operation. Without it, the concurrency tests
would prove nothing.

Usage: python moto_dynamodb.py HOST PORT
"""

import sys
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


class SerializedDynamoDB:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if not target.startswith("DynamoDB_"):
            return self.app(environ, start_response)
        with self.lock:
            # Materialise the body inside the lock: the backend work happens
            # while the response iterable is produced.
            return list(self.app(environ, start_response))


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        host,
        port,
        SerializedDynamoDB(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
