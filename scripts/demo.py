"""mediaonce on the emulators, end to end.

Creates an input bucket that notifies a queue, a claim table, uploads the
sample image twice under two names, receives the real S3 -> SQS messages,
runs `mediaonce invoke` over them, shows the outputs, then delivers the
same messages again to show them reused.

Usage (make demo does this): python scripts/demo.py path/to/mediaonce
The AWS_* variables of `scripts/emulators.sh env` must be set.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import boto3

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUCKET = "mediaonce-demo"
QUEUE = "mediaonce-demo-jobs"
TABLE = "mediaonce-demo-jobs"


def section(title):
    print(f"\n== {title}", flush=True)


def setup(s3, sqs, dynamodb):
    try:
        s3.create_bucket(Bucket=BUCKET)
    except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        pass
    queue_url = sqs.create_queue(QueueName=QUEUE, Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    s3.put_bucket_notification_configuration(
        Bucket=BUCKET,
        NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": queue_arn, "Events": ["s3:ObjectCreated:*"]}]
        },
    )
    # A fresh start each run: no rows, no outputs from an earlier demo.
    for obj in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=obj["Key"])
    # The claim table and its references table (template.yaml's two).
    tables = {
        TABLE: [("job_key", "HASH")],
        TABLE + "-refs": [("job_shard", "HASH"), ("version", "RANGE")],
    }
    for name, keys in tables.items():
        try:
            dynamodb.delete_table(TableName=name)
        except dynamodb.exceptions.ResourceNotFoundException:
            pass
        try:
            dynamodb.create_table(
                TableName=name,
                KeySchema=[{"AttributeName": a, "KeyType": k} for a, k in keys],
                AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a, _ in keys],
                BillingMode="PAY_PER_REQUEST",
            )
        except dynamodb.exceptions.ResourceInUseException:
            pass
        dynamodb.get_waiter("table_exists").wait(TableName=name)
    sqs.purge_queue(QueueUrl=queue_url)
    return queue_url, queue_arn


def receive(sqs, queue_url, queue_arn, want):
    """Receives `want` S3 event messages, long-polling; drops test events."""
    records = []
    for _ in range(30):
        if len(records) >= want:
            break
        response = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for m in response.get("Messages", []):
            if "s3:TestEvent" in m["Body"]:
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
                continue
            records.append(
                {
                    "messageId": m["MessageId"],
                    "receiptHandle": m["ReceiptHandle"],
                    "body": m["Body"],
                    "md5OfBody": m["MD5OfBody"],
                    "attributes": {},
                    "messageAttributes": {},
                    "eventSource": "aws:sqs",
                    "eventSourceARN": queue_arn,
                    "awsRegion": os.environ.get("AWS_REGION", "us-east-1"),
                }
            )
    if len(records) < want:
        sys.exit(f"demo: expected {want} notifications, got {len(records)}")
    return {"Records": records}


def invoke(mediaonce, event):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(event, f)
    env = dict(os.environ, MEDIAONCE_TABLE=TABLE, MEDIAONCE_OUTPUT_BUCKET=BUCKET)
    result = subprocess.run([mediaonce, "invoke", "--event", f.name], env=env, capture_output=True, text=True)
    os.unlink(f.name)
    sys.stdout.write(result.stderr)
    if result.returncode != 0:
        sys.exit(f"demo: mediaonce invoke exited {result.returncode}")
    response = result.stdout.strip().splitlines()[-1]
    print(f"response: {response}")
    return json.loads(response)


def main():
    mediaonce = sys.argv[1]
    s3, sqs, dynamodb = boto3.client("s3"), boto3.client("sqs"), boto3.client("dynamodb")
    section("setting up: bucket -> queue notifications, claim table")
    queue_url, queue_arn = setup(s3, sqs, dynamodb)
    print(f"bucket s3://{BUCKET}, queue {queue_url}, table {TABLE}")

    section("uploading the same bytes under two names, with SHA-256 checksums")
    sample = (ROOT / "events" / "sample.png").read_bytes()
    for key in ("uploads/cat.png", "uploads/cat copy.png"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=sample, ChecksumAlgorithm="SHA256")
        print(f"put s3://{BUCKET}/{key} ({len(sample)} bytes)")
    event = receive(sqs, queue_url, queue_arn, 2)

    section("first delivery: one job for both uploads (same content, same recipe)")
    first = invoke(mediaonce, event)

    section("outputs")
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix="derived/")
    for obj in listing.get("Contents", []):
        print(f"s3://{BUCKET}/{obj['Key']} ({obj['Size']} bytes)")
        if obj["Key"].endswith("probe.json"):
            print(s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read().decode().rstrip())

    section("the job row")
    for item in dynamodb.scan(TableName=TABLE)["Items"]:
        print({k: list(v.values())[0] for k, v in sorted(item.items())})

    section("second delivery of the same messages (an SQS redelivery): reused, nothing runs")
    second = invoke(mediaonce, event)
    if first["batchItemFailures"] or second["batchItemFailures"]:
        sys.exit("demo: unexpected batch item failures")
    print("\ndemo: done")


if __name__ == "__main__":
    main()
