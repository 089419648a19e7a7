"""moto's server, with DynamoDB requests made atomic.

moto's DynamoDB backend is not thread-safe: under concurrent clients two
conditional PutItems on the same key can both succeed. Real DynamoDB makes
every conditional write atomic, so this wrapper serialises the requests whose
X-Amz-Target names a DynamoDB operation. Without it, the concurrency tests
would prove nothing.

moto's TransactWriteItems backs itself up for a rollback by deep-copying
every table the transaction touches, once per item: a cost that grows with
the table (a soak of a few hundred uploads spends seconds per transaction)
and, for a table with a sort key, memory that is not given back (1,000
transactions of a version row and a reference item: 4.5x the time of two
hash-key items, and 800 MB). Since the requests are serialised here, the
backup is made of the touched items instead (by partition key, and by sort
key where the table has one), and restored the same way.

Usage: python moto_dynamodb.py HOST PORT
"""

import copy
import sys
import threading

import moto.dynamodb.models as dynamodb_models
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table

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


class _TablesKept:
    """Stands in for the `copy` module inside moto's transact_write_items:
    tables are not copied (their touched items are, beforehand)."""

    @staticmethod
    def deepcopy(value, memo=None):
        return value if isinstance(value, Table) else copy.deepcopy(value, memo)


_transact_write_items = DynamoDBBackend.transact_write_items


def _transact_write_items_backed_up_by_item(self, transact_items):
    backups = []
    for entry in transact_items:
        _, op = next(iter(entry.items()))
        table = self.tables.get(op.get("TableName"))
        if table is None:
            continue
        key = op.get("Key") or op.get("Item") or {}
        if table.hash_key_attr not in key:
            continue
        hash_value = DynamoType(key[table.hash_key_attr])
        if table.range_key_attr is None:
            backups.append((table, hash_value, None, copy.deepcopy(table.items.get(hash_value))))
            continue
        if table.range_key_attr not in key:
            continue
        range_value = DynamoType(key[table.range_key_attr])
        # Read without creating the partition (items is a defaultdict).
        partition = table.items[hash_value] if hash_value in table.items else {}
        backups.append(
            (table, hash_value, range_value, copy.deepcopy(partition.get(range_value)))
        )
    saved = dynamodb_models.copy
    dynamodb_models.copy = _TablesKept
    try:
        return _transact_write_items(self, transact_items)
    except Exception:
        for table, hash_value, range_value, item in reversed(backups):
            if range_value is None:
                if item is None:
                    table.items.pop(hash_value, None)
                else:
                    table.items[hash_value] = item
            elif item is None:
                if hash_value in table.items:
                    table.items[hash_value].pop(range_value, None)
            else:
                table.items[hash_value][range_value] = item
        raise
    finally:
        dynamodb_models.copy = saved


DynamoDBBackend.transact_write_items = _transact_write_items_backed_up_by_item


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
