//! A real pipeline on the emulators: a bucket notifying a queue, a claim
//! table, the handler's `App`, and the helpers to drive and inspect them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketVersioningStatus, ChecksumAlgorithm, Event, NotificationConfiguration,
    QueueConfiguration, VersioningConfiguration,
};
use aws_sdk_sqs::types::QueueAttributeName;
use mediaonce::config::{Config, ENV_OUTPUT_BUCKET, ENV_RECIPES, ENV_TABLE};
use mediaonce::faults::{Call, FaultPlan};
use mediaonce::handler::{App, BatchReport};
use mediaonce::ledger::dynamodb::DynamoDbTable;
use mediaonce::ledger::faults::{FaultyTable, Pause};
use mediaonce::ledger::{JobRow, Ledger, RetryPolicy};
use mediaonce::queue::Queue;
use mediaonce::steps::StepRegistry;
use mediaonce::store::faults::FaultyObjects;
use mediaonce::store::s3::S3Objects;
use mediaonce::store::ObjectStore;

use super::counting::{CallCounter, ReadCounter};
use super::sqs::{handle_with, lambda_message, queue_arn, receive_from};
use super::steps::{quiet_injected_panics, CountedProbe, GatedProbe, HangingStep, PanickingStep};
use super::{unique, SkewedClock};

#[derive(Default)]
pub struct Options {
    pub versioned: bool,
    /// A separate output bucket; by default outputs go to the input bucket.
    pub separate_output_bucket: bool,
    pub recipes: Option<String>,
    /// More configuration variables.
    pub vars: Vec<(&'static str, String)>,
}

pub struct Pipeline {
    pub s3: aws_sdk_s3::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub bucket: String,
    pub output_bucket: String,
    pub queue_url: String,
    pub queue_arn: String,
    pub table: String,
    pub app: Arc<App>,
    /// Counts the DynamoDB calls the handler's ledger makes.
    pub ledger_calls: CallCounter,
    /// Counts the S3 calls the handler's store makes.
    pub s3_calls: CallCounter,
    /// Runs of the `counted-probe` step.
    pub counted: CountedProbe,
    /// The `gated-probe` step's gate.
    pub gate: GatedProbe,
    /// The handler's reads of input objects.
    pub reads: ReadCounter,
    config: Config,
    counted_dynamodb: aws_sdk_dynamodb::Client,
    /// The completion events' bus, when the configuration names one.
    bus: Option<mediaonce::bus::Bus>,
    /// Step Functions, when the configuration names a state machine.
    executions: Option<Arc<dyn mediaonce::executions::ExecutionClient>>,
    /// The configuration's variables, for a worker whose configuration
    /// differs ([`Pipeline::worker_with`]).
    vars: HashMap<String, String>,
}

pub fn require_emulators() {
    if std::env::var_os("AWS_ENDPOINT_URL").is_none() {
        panic!(
            "integration tests need the emulators: run `make test`, or start them with \
             `scripts/emulators.sh start` and `eval \"$(scripts/emulators.sh env)\"`"
        );
    }
}

impl Pipeline {
    pub async fn new(options: Options) -> Pipeline {
        require_emulators();
        quiet_injected_panics();
        let sdk = mediaonce::aws::load_sdk_config().await;
        let s3 = mediaonce::aws::s3_client(&sdk);
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let dynamodb = mediaonce::aws::dynamodb_client(&sdk);
        let ledger_calls = CallCounter::default();
        let counted_dynamodb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk)
                .interceptor(ledger_calls.clone())
                .build(),
        );

        let bucket = unique("in");
        let table = unique("jobs");
        let queue_name = unique("q");
        s3.create_bucket()
            .bucket(&bucket)
            .send()
            .await
            .expect("create bucket");
        if options.versioned {
            enable_versioning(&s3, &bucket).await;
        }
        let output_bucket = if options.separate_output_bucket {
            let out = unique("out");
            s3.create_bucket()
                .bucket(&out)
                .send()
                .await
                .expect("create output bucket");
            out
        } else {
            bucket.clone()
        };

        let queue_url = sqs
            .create_queue()
            .queue_name(&queue_name)
            .attributes(QueueAttributeName::VisibilityTimeout, "30")
            .send()
            .await
            .expect("create queue")
            .queue_url
            .expect("queue url");
        let queue_arn = queue_arn(&sqs, &queue_url).await;
        s3.put_bucket_notification_configuration()
            .bucket(&bucket)
            .notification_configuration(
                NotificationConfiguration::builder()
                    .queue_configurations(
                        QueueConfiguration::builder()
                            .queue_arn(&queue_arn)
                            .events(Event::S3ObjectCreated)
                            .events(Event::S3ObjectRemoved)
                            .build()
                            .expect("queue configuration"),
                    )
                    .build(),
            )
            .send()
            .await
            .expect("bucket notifications");

        create_table(&dynamodb, &table).await;

        let mut vars = HashMap::from([
            (ENV_TABLE.to_string(), table.clone()),
            (ENV_OUTPUT_BUCKET.to_string(), output_bucket.clone()),
        ]);
        for (name, value) in options.vars {
            vars.insert(name.to_string(), value);
        }
        if let Some(recipes) = options.recipes {
            vars.insert(ENV_RECIPES.into(), recipes);
        }
        let counted = CountedProbe::default();
        // The steps' settings: the test's variables, else the environment
        // (make test sets MEDIAONCE_FFMPEG there).
        let mut steps = StepRegistry::builtin_from(|name| {
            vars.get(name).cloned().or_else(|| std::env::var(name).ok())
        });
        steps.register(counted.clone());
        steps.register(PanickingStep);
        steps.register(HangingStep);
        let gate = GatedProbe::default();
        steps.register(gate.clone());
        let config = Config::from_lookup(|name| vars.get(name).cloned(), &steps).expect("config");
        let s3_calls = CallCounter::default();
        let counted_s3 = aws_sdk_s3::Client::from_conf(
            s3.config()
                .to_builder()
                .interceptor(s3_calls.clone())
                .build(),
        );
        let reads = ReadCounter::new(S3Objects::new(counted_s3));
        let mut app = App::new(
            config.clone(),
            Ledger::dynamodb(counted_dynamodb.clone(), table.clone()),
            ObjectStore::new(reads.clone()),
            Queue::sqs(sqs.clone()),
        );
        // As App::from_config attaches EventBridge when a bus is named.
        let bus = config
            .event_bus
            .is_some()
            .then(|| mediaonce::bus::Bus::eventbridge(mediaonce::aws::eventbridge_client(&sdk)));
        if let Some(bus) = &bus {
            app = app.with_bus(bus.clone());
        }
        // As App::from_config attaches Step Functions when a state machine
        // is named.
        let executions = config.split_machine_arn.is_some().then(|| {
            let sfn = aws_sdk_sfn::Client::new(&sdk);
            Arc::new(mediaonce::executions::SfnExecutions::new(sfn))
                as Arc<dyn mediaonce::executions::ExecutionClient>
        });
        if let Some(executions) = &executions {
            app = app.with_executions(executions.clone());
        }
        let app = Arc::new(app);
        app.ledger.check_table().await.expect("table is usable");

        Pipeline {
            config,
            counted_dynamodb,
            gate,
            reads,
            s3,
            sqs,
            dynamodb,
            bucket,
            output_bucket,
            queue_url,
            queue_arn,
            table,
            app,
            ledger_calls,
            s3_calls,
            counted,
            bus,
            executions,
            vars,
        }
    }

    /// Another worker on the same pipeline whose configuration has `vars`
    /// changed (a deployment that edited a recipe, say).
    pub fn worker_with(&self, vars: &[(&str, String)]) -> Arc<App> {
        let mut all = self.vars.clone();
        for (name, value) in vars {
            all.insert(name.to_string(), value.clone());
        }
        let steps = StepRegistry::builtin_from(|name| {
            all.get(name).cloned().or_else(|| std::env::var(name).ok())
        });
        let config = Config::from_lookup(|name| all.get(name).cloned(), &steps).expect("config");
        let mut app = App::new(
            config,
            Ledger::dynamodb(self.counted_dynamodb.clone(), self.table.clone()),
            ObjectStore::new(S3Objects::new(self.s3.clone())),
            Queue::sqs(self.sqs.clone()),
        );
        if let Some(bus) = &self.bus {
            app = app.with_bus(bus.clone());
        }
        if let Some(executions) = &self.executions {
            app = app.with_executions(executions.clone());
        }
        Arc::new(app)
    }

    /// Another worker on the same pipeline: its clock `clock_offset_ms` off
    /// the system's, its DynamoDB and S3 calls failing as `faults` says.
    pub fn worker(&self, clock_offset_ms: i64, faults: Arc<FaultPlan>) -> Arc<App> {
        self.seeded_worker(clock_offset_ms, faults, fastrand::u64(..))
    }

    /// The same, its owner tokens and jitter drawn from `seed`.
    pub fn seeded_worker(
        &self,
        clock_offset_ms: i64,
        faults: Arc<FaultPlan>,
        seed: u64,
    ) -> Arc<App> {
        self.seeded_worker_over(
            S3Objects::new(self.s3.clone()),
            clock_offset_ms,
            faults,
            seed,
        )
    }

    /// The same, its objects going through `objects` (which wraps S3).
    pub fn seeded_worker_over(
        &self,
        objects: impl mediaonce::store::ObjectClient + 'static,
        clock_offset_ms: i64,
        faults: Arc<FaultPlan>,
        seed: u64,
    ) -> Arc<App> {
        let app = App::new(
            self.config.clone(),
            // Contended calls retried at once: the backoff's waits are
            // the unit tests' (paused time), not the emulators'.
            Ledger::new(FaultyTable::new(
                DynamoDbTable::new(self.counted_dynamodb.clone(), self.table.clone()),
                faults.clone(),
            ))
            .with_retry(RetryPolicy::immediate()),
            ObjectStore::new(FaultyObjects::new(objects, faults)),
            Queue::sqs(self.sqs.clone()),
        )
        .with_clock(SkewedClock(clock_offset_ms))
        .with_seed(seed);
        Arc::new(match &self.bus {
            Some(bus) => app.with_bus(bus.clone()),
            None => app,
        })
    }

    /// Another worker on the same pipeline whose `nth` ledger call of
    /// kind `call` (0: the first) waits until the test lets it go.
    pub fn paused_worker(&self, call: Call, nth: usize) -> (Arc<App>, Arc<Pause>) {
        let faults = Arc::new(FaultPlan::new());
        let (table, pause) = FaultyTable::new(
            DynamoDbTable::new(self.counted_dynamodb.clone(), self.table.clone()),
            faults.clone(),
        )
        .pause_before(call, nth);
        let app = App::new(
            self.config.clone(),
            Ledger::new(table).with_retry(RetryPolicy::immediate()),
            ObjectStore::new(FaultyObjects::new(S3Objects::new(self.s3.clone()), faults)),
            Queue::sqs(self.sqs.clone()),
        );
        let app = match &self.bus {
            Some(bus) => app.with_bus(bus.clone()),
            None => app,
        };
        (Arc::new(app), pause)
    }

    /// Another worker on the same pipeline whose objects go through `store`.
    pub fn app_with_store(&self, store: ObjectStore) -> Arc<App> {
        Arc::new(App::new(
            self.config.clone(),
            Ledger::dynamodb(self.counted_dynamodb.clone(), self.table.clone()),
            store,
            Queue::sqs(self.sqs.clone()),
        ))
    }

    /// Enables versioning on the input bucket (objects already there keep
    /// their `null` version).
    pub async fn enable_versioning(&self) {
        enable_versioning(&self.s3, &self.bucket).await;
    }

    /// Suspends versioning on the bucket: every put is then the key's
    /// null version, and a plain DELETE removes it for good and puts a
    /// null delete marker.
    pub async fn suspend_versioning(&self) {
        set_versioning(&self.s3, &self.bucket, BucketVersioningStatus::Suspended).await;
    }

    /// Uploads an object; with `sha256`, S3 stores its full-object SHA-256.
    pub async fn put(
        &self,
        key: &str,
        bytes: &[u8],
        sha256: bool,
    ) -> aws_sdk_s3::operation::put_object::PutObjectOutput {
        let mut put = self
            .s3
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(bytes.to_vec()));
        if sha256 {
            put = put.checksum_algorithm(ChecksumAlgorithm::Sha256);
        }
        put.send().await.expect("put object")
    }

    /// Receives at least `count` S3 event messages (not test events) from
    /// the real queue, long-polling. Test events are deleted.
    pub async fn receive(&self, count: usize) -> Vec<SqsMessage> {
        let mut got = Vec::new();
        for _ in 0..30 {
            if got.len() >= count {
                break;
            }
            for message in self.receive_batch().await {
                let body = message.body.clone().unwrap_or_default();
                if body.contains("s3:TestEvent") {
                    self.delete(&message.receipt_handle.clone().unwrap_or_default())
                        .await;
                    continue;
                }
                got.push(self.lambda_message(message));
            }
        }
        assert!(
            got.len() >= count,
            "expected {count} messages, received {}",
            got.len()
        );
        got
    }

    /// One long-poll of the pipeline's queue: up to 10 messages.
    pub async fn receive_batch(&self) -> Vec<aws_sdk_sqs::types::Message> {
        receive_from(&self.sqs, &self.queue_url).await
    }

    async fn delete(&self, receipt_handle: &str) {
        self.sqs
            .delete_message()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt_handle)
            .send()
            .await
            .expect("delete message");
    }

    /// Sends a raw body to the queue and receives it back as Lambda would see it.
    pub async fn send_raw(&self, body: &str) -> SqsMessage {
        let id = self
            .sqs
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .send()
            .await
            .expect("send")
            .message_id
            .expect("message id");
        for _ in 0..30 {
            for message in self.receive_batch().await {
                if message.message_id.as_deref() == Some(id.as_str()) {
                    return self.lambda_message(message);
                }
            }
        }
        panic!("sent message {id} never arrived");
    }

    /// An SQS message as the Lambda event source mapping delivers it.
    pub fn lambda_message(&self, message: aws_sdk_sqs::types::Message) -> SqsMessage {
        lambda_message(message, &self.queue_arn)
    }

    pub async fn handle(&self, messages: Vec<SqsMessage>) -> BatchReport {
        handle_with(self.app.clone(), messages).await
    }

    /// Writes a row unconditionally, as another worker would have left it.
    pub async fn seed_row(&self, row: &JobRow) {
        self.dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(row.to_item()))
            .send()
            .await
            .expect("seed row");
    }

    /// How many versions reference each job: one Scan of the references
    /// table (all pages), for checks over many jobs.
    pub async fn ref_counts(&self) -> std::collections::BTreeMap<String, u64> {
        let mut counts = std::collections::BTreeMap::new();
        let pages: Vec<_> = self
            .dynamodb
            .scan()
            .table_name(mediaonce::config::default_refs_table(&self.table))
            .consistent_read(true)
            .into_paginator()
            .send()
            .collect()
            .await;
        for page in pages {
            for item in page.expect("scan the references").items() {
                if let Some(job) = item.get("job_key").and_then(|v| v.as_s().ok()) {
                    *counts.entry(job.clone()).or_default() += 1;
                }
            }
        }
        counts
    }

    /// How many versions reference `job_key` (its reference items).
    pub async fn refs(&self, job_key: &str) -> u64 {
        Ledger::dynamodb(self.dynamodb.clone(), self.table.clone())
            .references(job_key)
            .await
            .expect("query references")
            .len() as u64
    }

    pub async fn row(&self, job_key: &str) -> Option<JobRow> {
        Ledger::dynamodb(self.dynamodb.clone(), self.table.clone())
            .get(job_key)
            .await
            .expect("get row")
    }

    pub async fn output(&self, key: &str) -> Vec<u8> {
        self.s3
            .get_object()
            .bucket(&self.output_bucket)
            .key(key)
            .send()
            .await
            .unwrap_or_else(|e| panic!("get s3://{}/{key}: {e:?}", self.output_bucket))
            .body
            .collect()
            .await
            .expect("read body")
            .into_bytes()
            .to_vec()
    }

    pub async fn output_keys(&self, prefix: &str) -> Vec<String> {
        // Every page: a soak's outputs pass ListObjectsV2's 1,000 keys.
        let mut keys = Vec::new();
        let mut from: Option<String> = None;
        loop {
            let listing = self
                .s3
                .list_objects_v2()
                .bucket(&self.output_bucket)
                .prefix(prefix)
                .set_continuation_token(from)
                .send()
                .await
                .expect("list");
            keys.extend(
                listing
                    .contents()
                    .iter()
                    .filter_map(|o| o.key().map(str::to_string)),
            );
            match listing.next_continuation_token() {
                Some(next) => from = Some(next.to_string()),
                None => break,
            }
        }
        keys.sort();
        keys
    }
}

/// A claim request for a probe job at `now_ms` holding until `lease_until_ms`.
pub fn claim_request(
    key: &str,
    owner: &str,
    now_ms: u64,
    lease_until_ms: u64,
) -> mediaonce::ledger::ClaimRequest {
    mediaonce::ledger::ClaimRequest {
        job_key: key.to_string(),
        step: "probe".into(),
        input_hash: "i".repeat(64),
        output_prefix: format!("s3://out/derived/{key}/"),
        owner: owner.to_string(),
        lease_until_ms,
        now_ms,
        max_attempts: 3,
    }
}

/// A ledger on a new, empty DynamoDB table.
async fn enable_versioning(s3: &aws_sdk_s3::Client, bucket: &str) {
    set_versioning(s3, bucket, BucketVersioningStatus::Enabled).await;
}

async fn set_versioning(s3: &aws_sdk_s3::Client, bucket: &str, status: BucketVersioningStatus) {
    s3.put_bucket_versioning()
        .bucket(bucket)
        .versioning_configuration(VersioningConfiguration::builder().status(status).build())
        .send()
        .await
        .expect("set the bucket's versioning");
}

pub async fn fresh_ledger() -> Ledger {
    let sdk = mediaonce::aws::load_sdk_config().await;
    let client = mediaonce::aws::dynamodb_client(&sdk);
    let table = unique("ledger");
    create_table(&client, &table).await;
    Ledger::dynamodb(client, table)
}

/// The claim table `table` and its references table `<table>-refs`, as
/// `template.yaml` declares them.
pub async fn create_table(dynamodb: &aws_sdk_dynamodb::Client, table: &str) {
    let key = |name: &str, key_type: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(key_type)
            .build()
            .unwrap()
    };
    let string = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .unwrap()
    };
    dynamodb
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(string("job_key"))
        .key_schema(key("job_key", KeyType::Hash))
        .send()
        .await
        .expect("create table");
    let refs_table = mediaonce::config::default_refs_table(table);
    dynamodb
        .create_table()
        .table_name(&refs_table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(string("job_shard"))
        .attribute_definitions(string("version"))
        .key_schema(key("job_shard", KeyType::Hash))
        .key_schema(key("version", KeyType::Range))
        .send()
        .await
        .expect("create the references table");
    // Real DynamoDB creates tables asynchronously; the emulators answer ACTIVE at once.
    let waiter_timeout = Duration::from_secs(60);
    for name in [table, refs_table.as_str()] {
        aws_sdk_dynamodb::client::Waiters::wait_until_table_exists(dynamodb)
            .table_name(name)
            .wait(waiter_timeout)
            .await
            .expect("table becomes active");
    }
}
