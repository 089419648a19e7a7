//! Metrics in CloudWatch's Embedded Metric Format (EMF): JSON documents
//! written as raw log lines, from which CloudWatch Logs extracts metrics
//! without a `PutMetricData` call. Pure: the documents of a batch; the
//! handler writes them (stdout in Lambda, stderr for `mediaonce invoke`).
//!
//! A small serde emitter rather than a crate: `metrics_cloudwatch_embedded`
//! hangs off the `metrics` facade's process-global recorder and flushes on
//! its own schedule, while a batch's metrics are a function of its
//! [`BatchReport`], written when the batch ends, and tested as values.
//!
//! Per batch:
//! - one document per (Step, Outcome) pair: `Jobs` (Count) with dimensions
//!   `Step`, `Outcome` and with `Outcome` alone, and `JobDuration` (Milliseconds, one value per job,
//!   at most [`MAX_VALUES`] per document) with dimension `Step`;
//! - one document with no dimension: `BatchSize`, `BatchItemFailures`,
//!   `InputBytesRead`, `OutputBytesWritten`, `DynamoDbCalls`, and
//!   `ColdStart` on the process's first batch.
//!
//! EMF's limits: 100 metrics per document, 100 values per metric, 30
//! dimensions per set; these documents hold at most 6 metrics and 2
//! dimensions, and durations are cut into documents of 100 values.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{json, Map, Value};

use crate::report::BatchReport;

/// `off` disables the metrics; anything else (or unset) enables them.
pub const ENV_METRICS: &str = "MEDIAONCE_METRICS";
/// The CloudWatch namespace (default [`DEFAULT_NAMESPACE`]).
pub const ENV_METRICS_NAMESPACE: &str = "MEDIAONCE_METRICS_NAMESPACE";
pub const DEFAULT_NAMESPACE: &str = "mediaonce";

/// Every metric the documents hold.
pub const METRIC_NAMES: [&str; 10] = [
    "Jobs",
    "JobDuration",
    "BatchSize",
    "BatchItemFailures",
    "InputBytesRead",
    "OutputBytesWritten",
    "DynamoDbCalls",
    "ColdStart",
    "JobsCollected",
    "CollectionFailures",
];

/// EMF's most values for one metric in one document.
pub const MAX_VALUES: usize = 100;

static COLD: AtomicBool = AtomicBool::new(true);

/// `true` the first time a process asks: its first batch is a cold start.
pub fn take_cold_start() -> bool {
    COLD.swap(false, Ordering::Relaxed)
}

/// The EMF documents of one batch, at `timestamp_ms`.
pub fn batch_documents(
    namespace: &str,
    report: &BatchReport,
    cold_start: bool,
    timestamp_ms: u64,
) -> Vec<Value> {
    let mut documents = Vec::new();
    // (step, outcome) → the jobs' durations, in a stable order.
    let mut pairs: BTreeMap<(&str, &str), Vec<u64>> = BTreeMap::new();
    for job in report.jobs() {
        pairs
            .entry((job.step.as_str(), job.outcome.as_str()))
            .or_default()
            .push(job.duration_ms);
    }
    for ((step, outcome), durations) in pairs {
        for (index, chunk) in durations.chunks(MAX_VALUES).enumerate() {
            let mut metrics = vec![(Directive::new(&[&["Step"]]), "JobDuration", "Milliseconds")];
            let mut fields = Map::new();
            fields.insert("Step".into(), json!(step));
            fields.insert("Outcome".into(), json!(outcome));
            fields.insert("JobDuration".into(), json!(chunk));
            if index == 0 {
                // By outcome alone too: the poisoned-jobs alarm and the
                // dashboard read `Jobs` by `Outcome` across steps.
                metrics.push((
                    Directive::new(&[&["Step", "Outcome"], &["Outcome"]]),
                    "Jobs",
                    "Count",
                ));
                fields.insert("Jobs".into(), json!(durations.len()));
            }
            documents.push(document(namespace, timestamp_ms, &metrics, fields));
        }
    }
    let usage = &report.usage;
    let mut fields = Map::new();
    let mut metrics = Vec::new();
    let mut add = |name: &'static str, unit: &'static str, value: u64| {
        metrics.push((Directive::new(&[&[]]), name, unit));
        fields.insert(name.into(), json!(value));
    };
    add("BatchSize", "Count", report.messages.len() as u64);
    add(
        "BatchItemFailures",
        "Count",
        report.response().batch_item_failures.len() as u64,
    );
    add("InputBytesRead", "Bytes", usage.input_bytes_read);
    add("OutputBytesWritten", "Bytes", usage.output_bytes_written);
    add("DynamoDbCalls", "Count", usage.dynamodb_calls);
    add("DynamoDbRetries", "Count", usage.dynamodb_retries);
    add("EventsPublished", "Count", usage.events_published);
    add(
        "EventPublishFailures",
        "Count",
        usage.event_publish_failures,
    );
    if cold_start {
        add("ColdStart", "Count", 1);
    }
    documents.push(document(namespace, timestamp_ms, &metrics, fields));
    documents
}

/// The EMF document of one collection sweep (or of a collection made when
/// a release left a job unreferenced with no grace): `JobsCollected` and
/// `CollectionFailures` (Count, no dimension). The template alarms on
/// any failure.
pub fn sweep_document(
    namespace: &str,
    collected: usize,
    failures: usize,
    timestamp_ms: u64,
) -> Value {
    let metrics = [
        (Directive::new(&[&[]]), "JobsCollected", "Count"),
        (Directive::new(&[&[]]), "CollectionFailures", "Count"),
    ];
    let mut fields = Map::new();
    fields.insert("JobsCollected".into(), json!(collected));
    fields.insert("CollectionFailures".into(), json!(failures));
    document(namespace, timestamp_ms, &metrics, fields)
}

/// The dimension sets of one directive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Directive(Vec<Vec<&'static str>>);

impl Directive {
    fn new(sets: &[&[&'static str]]) -> Self {
        Directive(sets.iter().map(|set| set.to_vec()).collect())
    }
}

/// A document: one `CloudWatchMetrics` directive per dimension set.
fn document(
    namespace: &str,
    timestamp_ms: u64,
    metrics: &[(Directive, &str, &str)],
    mut fields: Map<String, Value>,
) -> Value {
    let mut directives: Vec<(Directive, Vec<Value>)> = Vec::new();
    for (dimensions, name, unit) in metrics {
        let definition = json!({"Name": name, "Unit": unit});
        match directives.iter_mut().find(|(d, _)| d == dimensions) {
            Some((_, list)) => list.push(definition),
            None => directives.push((dimensions.clone(), vec![definition])),
        }
    }
    let directives: Vec<Value> = directives
        .into_iter()
        .map(|(dimensions, metrics)| {
            json!({
                "Namespace": namespace,
                "Dimensions": dimensions.0,
                "Metrics": metrics,
            })
        })
        .collect();
    fields.insert(
        "_aws".into(),
        json!({"Timestamp": timestamp_ms, "CloudWatchMetrics": directives}),
    );
    Value::Object(fields)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::{BatchUsage, JobReport, MessageReport, Outcome};

    fn job(step: &str, outcome: Outcome, duration_ms: u64) -> JobReport {
        JobReport {
            job_key: "k".into(),
            recipe: step.into(),
            step: step.into(),
            version: 1,
            outcome,
            attempt: 1,
            duration_ms,
            reason: None,
            busy_until_ms: None,
            input_hash_source: None,
            outputs: None,
        }
    }

    /// What CloudWatch requires of a document (the EMF specification's
    /// schema): `_aws` with an integer `Timestamp` and `CloudWatchMetrics`;
    /// each directive a `Namespace` (1–255 characters), `Dimensions` (sets
    /// of at most 30 names, each a string member of the document),
    /// `Metrics` (at most 100, each with a `Name` that is a member whose
    /// value is a number or at most 100 numbers). Panics naming the fault.
    pub(crate) fn validate(document: &Value) {
        let aws = &document["_aws"];
        assert!(aws["Timestamp"].is_u64(), "Timestamp: {document}");
        let directives = aws["CloudWatchMetrics"]
            .as_array()
            .expect("CloudWatchMetrics");
        assert!(!directives.is_empty());
        for directive in directives {
            let namespace = directive["Namespace"].as_str().expect("Namespace");
            assert!((1..=255).contains(&namespace.len()));
            for set in directive["Dimensions"].as_array().expect("Dimensions") {
                let set = set.as_array().expect("a dimension set");
                assert!(set.len() <= 30);
                for name in set {
                    let name = name.as_str().expect("a dimension name");
                    assert!(document[name].is_string(), "dimension {name}: {document}");
                }
            }
            let metrics = directive["Metrics"].as_array().expect("Metrics");
            assert!(!metrics.is_empty() && metrics.len() <= 100);
            for metric in metrics {
                let name = metric["Name"].as_str().expect("Name");
                let value = &document[name];
                match value.as_array() {
                    Some(values) => {
                        assert!(values.len() <= MAX_VALUES && values.iter().all(Value::is_number))
                    }
                    None => assert!(value.is_number(), "{name}: {document}"),
                }
            }
        }
    }

    #[test]
    fn a_batchs_documents_count_its_jobs_by_step_and_outcome() {
        let mut jobs = vec![
            job("probe", Outcome::Ran, 40),
            job("probe", Outcome::Reused, 3),
            job("thumbnail", Outcome::Ran, 90),
            job("probe", Outcome::Ran, 50),
            job("thumbnail", Outcome::Poisoned, 1),
        ];
        // More than one document's worth of durations for one pair.
        jobs.extend((0..150).map(|i| job("probe", Outcome::Busy, i)));
        let report = BatchReport {
            messages: vec![
                MessageReport {
                    message_id: "m1".into(),
                    jobs,
                    error: None,
                },
                MessageReport {
                    message_id: "m2".into(),
                    jobs: vec![],
                    error: Some("not JSON".into()),
                },
            ],
            usage: BatchUsage {
                input_bytes_read: 1234,
                output_bytes_written: 99,
                dynamodb_calls: 7,
                dynamodb_retries: 2,
                events_published: 1,
                event_publish_failures: 0,
            },
        };
        let documents = batch_documents("ns", &report, true, 1_700_000_000_000);
        for document in &documents {
            validate(document);
            // Raw JSON lines: one line each, `_aws` at the top.
            let line = serde_json::to_string(document).unwrap();
            assert!(!line.contains('\n'));
        }
        let mut jobs: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut durations = 0;
        for document in &documents {
            if let Some(n) = document["Jobs"].as_u64() {
                let key = (
                    document["Step"].as_str().unwrap().to_string(),
                    document["Outcome"].as_str().unwrap().to_string(),
                );
                *jobs.entry(key).or_default() += n;
            }
            durations += document["JobDuration"].as_array().map_or(0, Vec::len);
        }
        let pair = |s: &str, o: &str| (s.to_string(), o.to_string());
        assert_eq!(
            jobs,
            BTreeMap::from([
                (pair("probe", "busy"), 150),
                (pair("probe", "ran"), 2),
                (pair("probe", "reused"), 1),
                (pair("thumbnail", "poisoned"), 1),
                (pair("thumbnail", "ran"), 1),
            ])
        );
        assert_eq!(durations, 155);
        let batch = documents.last().unwrap();
        assert_eq!(batch["BatchSize"], 2);
        assert_eq!(batch["BatchItemFailures"], 2);
        assert_eq!(batch["InputBytesRead"], 1234);
        assert_eq!(batch["OutputBytesWritten"], 99);
        assert_eq!(batch["DynamoDbCalls"], 7);
        assert_eq!(batch["DynamoDbRetries"], 2);
        assert_eq!(
            (
                batch["EventsPublished"].clone(),
                batch["EventPublishFailures"].clone()
            ),
            (1.into(), 0.into())
        );
        assert_eq!(batch["ColdStart"], 1);
        assert_eq!(
            batch["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([[]])
        );
        let warm = batch_documents("ns", &report, false, 1);
        assert!(warm.last().unwrap().get("ColdStart").is_none());
    }

    #[test]
    fn a_sweep_counts_its_collections_and_failures() {
        let document = sweep_document("mediaonce", 3, 1, 42);
        validate(&document);
        assert_eq!(document["JobsCollected"], 3);
        assert_eq!(document["CollectionFailures"], 1);
        let directive = &document["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(
            directive["Dimensions"],
            json!([[]]),
            "no dimension: one alarm"
        );
    }

    /// The template's alarms and dashboard read only metrics the documents
    /// hold, by dimensions they carry.
    #[test]
    fn the_template_reads_only_metrics_that_are_written() {
        let template = include_str!("../template.yaml");
        let mut read = Vec::new();
        for (at, _) in template.match_indices("\"${MetricsNamespace}\", \"") {
            let rest = &template[at + "\"${MetricsNamespace}\", \"".len()..];
            read.push(&rest[..rest.find('"').unwrap()]);
        }
        for (at, _) in template.match_indices("MetricName=\\\"") {
            let rest = &template[at + "MetricName=\\\"".len()..];
            read.push(&rest[..rest.find('\\').unwrap()]);
        }
        let alarm = template
            .split("PoisonedJobsAlarm:")
            .nth(1)
            .expect("the poisoned-jobs alarm");
        assert!(alarm.contains("Namespace: !Ref MetricsNamespace"));
        assert!(alarm.contains("MetricName: Jobs"));
        assert!(alarm.contains("- Name: Outcome\n          Value: poisoned"));
        let collection = template
            .split("CollectionFailuresAlarm:")
            .nth(1)
            .expect("the collection-failures alarm");
        assert!(collection.contains("Namespace: !Ref MetricsNamespace"));
        read.push("CollectionFailures");
        assert!(collection.contains("MetricName: CollectionFailures"));
        assert!(read.len() >= 8, "{read:?}");
        for name in read {
            assert!(METRIC_NAMES.contains(&name), "the template reads {name:?}");
        }
    }
}
