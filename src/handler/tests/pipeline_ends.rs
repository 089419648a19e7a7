//! Pipelines end, once, with an event an app can trust (issue 41), on
//! in-memory clients: completion events, hand-ons, jobs no invocation of
//! the function can start, recipes a deployment removed.

use std::collections::HashMap;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};

use super::*;

#[tokio::test]
async fn a_completion_event_is_published_before_the_message_goes_and_repeats_its_id() {
    let (app, objects, bus) = app_with_bus(None);
    let etag = objects.insert("in", "a.bin", b"abc", true);

    // The bus refuses: the job ran, but the message comes back.
    bus.refuse(Some("ThrottlingException"));
    let first = handle(&app, vec![message("1", "a.bin", &etag)]).await;
    assert_eq!(first.jobs().next().unwrap().outcome, Outcome::Ran);
    assert_eq!(first.response().batch_item_failures.len(), 1, "{first:?}");
    assert_eq!(
        (first.usage.events_published, first.usage.event_publish_failures),
        (0, 1)
    );
    assert!(bus.events().is_empty());

    // Redelivered: reused, published, acknowledged.
    bus.refuse(None);
    let again = handle(&app, vec![message("1", "a.bin", &etag)]).await;
    assert!(again.response().batch_item_failures.is_empty(), "{again:?}");
    assert_eq!(again.usage.events_published, 1);
    let events = bus.events();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].bus.as_str(), events[0].source.as_str(), events[0].detail_type.as_str()),
        ("media", "mediaonce", "Media Pipeline Succeeded")
    );
    assert_eq!(events[0].resources, ["arn:aws:s3:::in/a.bin"]);
    let detail: serde_json::Value = serde_json::from_str(&events[0].detail).unwrap();
    assert_eq!(detail["key"], "a.bin");
    assert_eq!(detail["eTag"], etag.as_str());
    assert_eq!(detail["inputHash"], sha256_hex(b"abc"));
    assert_eq!(detail["status"], "succeeded");
    let job = &detail["jobs"][0];
    assert_eq!((job["recipe"].as_str(), job["outcome"].as_str()), (Some("probe"), Some("reused")));
    assert_eq!(job["files"][0]["name"], "probe.json");
    assert_eq!(job["files"][0]["contentType"], "application/json");
    assert!(job["outputPrefix"].as_str().unwrap().ends_with(&format!("{}/", job["jobKey"].as_str().unwrap())));

    // Another delivery: the same event, the same id.
    handle(&app, vec![message("2", "a.bin", &etag)]).await;
    let events = bus.events();
    assert_eq!(events.len(), 2);
    let second: serde_json::Value = serde_json::from_str(&events[1].detail).unwrap();
    assert_eq!(second["eventId"], detail["eventId"]);
}

#[tokio::test]
async fn a_handed_on_pipeline_is_announced_by_the_message_that_ends_it() {
    // hls-package chained to the probe's file: 70 s it declares leave no
    // room in a 30 s invocation, so it is handed on.
    let recipes = r#"[{"name":"probe","step":"probe","version":1,"params":{}},
        {"name":"hls","step":"hls-package","version":1,"params":{"ladder":[360]},
         "input":{"recipe":"probe","file":"probe.json"}}]"#;
    let f = fixture_with_vars(&[("MEDIAONCE_RECIPES", recipes), ("MEDIAONCE_EVENT_BUS", "media")]);
    let bus = Arc::new(crate::bus::RecordingBus::default());
    let app = Arc::new(
        App::new(
            f.app.config.clone(),
            Ledger::new(InMemoryTable::new("jobs")),
            ObjectStore::new(f.objects.clone()),
            Queue::new(f.queue.clone()),
        )
        .with_bus(crate::bus::Bus::new(bus.clone())),
    );
    let etag = f.objects.insert("in", "a.mp4", b"not a movie", true);
    let mut event = SqsEvent::default();
    event.records = vec![message("1", "a.mp4", &etag)];
    let invocation = Invocation {
        request_id: "req-1".into(),
        deadline_ms: Some(app.now_ms() + 30_000),
        timeout_ms: None,
    };
    let first = handle_batch(app.clone(), event, invocation).await;
    let outcomes: Vec<Outcome> = first.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Ran, Outcome::HandedOn], "{first:?}");
    assert!(first.response().batch_item_failures.is_empty(), "{first:?}");
    assert!(bus.events().is_empty(), "the pipeline is not over: no event yet");

    // The hand-on message, with no deadline: the probe is reused, the
    // chained job fails for good, and the event says so.
    let sent = f.queue.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let mut hand_on = message("2", "a.mp4", &etag);
    hand_on.body = Some(sent[0].1.clone());
    let mut event = SqsEvent::default();
    event.records = vec![hand_on];
    let invocation = Invocation {
        request_id: "req-2".into(),
        deadline_ms: None,
        timeout_ms: None,
    };
    let second = handle_batch(app.clone(), event, invocation).await;
    let outcomes: Vec<Outcome> = second.jobs().map(|j| j.outcome).collect();
    // An input no run can process: the message is done, its event sent.
    assert_eq!(
        outcomes,
        [Outcome::Reused, Outcome::Unprocessable],
        "{second:?}"
    );
    assert!(second.response().batch_item_failures.is_empty(), "{second:?}");
    let events = bus.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].detail_type, "Media Pipeline Failed");
    let detail: serde_json::Value = serde_json::from_str(&events[0].detail).unwrap();
    let statuses: Vec<(&str, &str)> = detail["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["recipe"].as_str().unwrap(), j["status"].as_str().unwrap()))
        .collect();
    assert_eq!(statuses, [("probe", "done"), ("hls", "failed")]);
    assert_eq!(detail["jobs"][1]["error"]["class"], "permanent");
}

/// Issue 41, defect 1: a recipe whose jobs need more than any Lambda
/// invocation lasts to start (an `hls-package` with `min_seconds: 900`:
/// 5 s of margin, 900 s and 10 s) is named at start-up; the default one
/// fits.
#[test]
fn a_recipe_no_invocation_can_start_is_named_at_start_up() {
    let fits = fixture_with(Some(r#"[{"name":"hls","step":"hls-package","version":1,"params":{"ladder":[240]}}]"#));
    assert_eq!(fits.app.recipe_beyond(super::LAMBDA_MAX_TIMEOUT), None);
    let never = fixture_with(Some(
        r#"[{"name":"probe","step":"probe","version":1,"params":{}},
            {"name":"hls","step":"hls-package","version":1,"params":{"ladder":[240],"min_seconds":900}}]"#,
    ));
    let problem = never.app.recipe_beyond(super::LAMBDA_MAX_TIMEOUT).unwrap();
    assert!(problem.starts_with("recipe 1 (hls) needs 915 s"), "{problem}");
    assert!(problem.contains("at most 900 s"), "{problem}");
}

/// Writes `count` one-byte segments: a long video's package, as far as an
/// event is concerned.
struct ManyFiles;

#[async_trait::async_trait]
impl crate::step::Step for ManyFiles {
    type Params = u64;

    fn name(&self) -> &'static str {
        "many-files"
    }

    fn params(&self, params: &serde_json::Map<String, serde_json::Value>) -> Result<u64, String> {
        params["count"].as_u64().ok_or_else(|| "count is a number".into())
    }

    async fn run(
        &self,
        count: &u64,
        _context: &crate::step::StepContext<'_>,
        outputs: &mut crate::step::JobOutputs,
    ) -> Result<(), crate::step::StepError> {
        for n in 0..*count {
            let name = format!("1080p/segment-{n:05}.ts");
            outputs.put_bytes(&name, "video/mp2t", vec![n as u8]).await?;
        }
        Ok(())
    }
}

/// Issue 41, defect 3: two chained recipes whose file a 7,205-file
/// package never wrote. Their reasons named every file (279 KB), and
/// PutEvents refused the entry on every delivery: the message ended in the
/// dead-letter queue and the event never came. Now the reasons name a few
/// files and the detail is cut to fit; the recording bus refuses entries
/// over EventBridge's limit as EventBridge does.
#[tokio::test]
async fn a_failure_event_of_a_long_package_fits_an_entry() {
    let recipes = r#"[{"name":"package","step":"many-files","version":1,"params":{"count":7205}},
        {"name":"thumbs","step":"probe","version":1,"params":{},
         "input":{"recipe":"package","file":"poster.jpg"}},
        {"name":"captions","step":"probe","version":2,"params":{},
         "input":{"recipe":"package","file":"captions.vtt"}}]"#;
    let (app, objects, bus) = app_with_bus(Some(recipes));
    let etag = objects.insert("in", "long.mp4", b"a long video", true);
    let report = handle(&app, vec![message("1", "long.mp4", &etag)]).await;
    let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
    assert_eq!(outcomes, [Outcome::Ran, Outcome::Poisoned, Outcome::Poisoned]);
    assert_eq!(report.usage.event_publish_failures, 0, "{:?}", report.messages[0].error);
    let events = bus.events();
    assert_eq!(events.len(), 1);
    assert!(events[0].entry_size() <= crate::bus::MAX_ENTRY_BYTES);
    let detail: serde_json::Value = serde_json::from_str(&events[0].detail).unwrap();
    assert_eq!(detail["status"], "failed");
    let thumbs = &detail["jobs"][1];
    let message = thumbs["error"]["message"].as_str().unwrap();
    assert!(message.contains("wrote no poster.jpg"), "{message}");
    assert!(message.ends_with("and 7195 more)"), "{message}");
    assert_eq!(detail["jobs"][0]["fileCount"], 7205);
}

/// An app on in-memory clients with `recipes` (the built-in steps and
/// [`ManyFiles`]; the default recipe without), publishing to a recording
/// bus.
fn app_with_bus(
    recipes: Option<&str>,
) -> (Arc<App>, Arc<InMemoryObjects>, Arc<crate::bus::RecordingBus>) {
    let objects = InMemoryObjects::new();
    let bus = Arc::new(crate::bus::RecordingBus::default());
    let app = app_on(objects.clone(), recipes, bus.clone());
    (app, objects, bus)
}

/// An app on `objects` and in-memory clients with `recipes`, publishing
/// through `bus`.
fn app_on(
    objects: Arc<InMemoryObjects>,
    recipes: Option<&str>,
    bus: impl crate::bus::BusClient + 'static,
) -> Arc<App> {
    let mut steps = StepRegistry::builtin();
    steps.register(ManyFiles);
    let mut vars = HashMap::from([
        ("MEDIAONCE_TABLE", "jobs"),
        ("MEDIAONCE_OUTPUT_BUCKET", "in"),
        ("MEDIAONCE_EVENT_BUS", "media"),
    ]);
    vars.extend(recipes.map(|recipes| ("MEDIAONCE_RECIPES", recipes)));
    let config = Config::from_lookup(|name| vars.get(name).map(|v| v.to_string()), &steps).unwrap();
    Arc::new(
        App::new(
            config,
            Ledger::new(InMemoryTable::new("jobs")),
            ObjectStore::new(objects),
            Queue::new(Arc::new(RecordingQueue::default())),
        )
        .with_bus(crate::bus::Bus::new(bus)),
    )
}

/// Issue 41, defect 5: two unnamed chained recipes of one step, versions 1
/// and 2, are each reported with their own version. The event matched a
/// report to its rule by a key computed from the upload's hash, which a
/// chained job's never is, and fell back to the first rule of the name:
/// both said version 1.
#[tokio::test]
async fn unnamed_chained_recipes_report_their_own_versions() {
    let recipes = r#"[{"name":"first","step":"probe","version":1,"params":{}},
        {"step":"probe","version":1,"params":{},"input":{"recipe":"first","file":"probe.json"}},
        {"step":"probe","version":2,"params":{},"input":{"recipe":"first","file":"probe.json"}}]"#;
    let (app, objects, bus) = app_with_bus(Some(recipes));
    let etag = objects.insert("in", "a.bin", b"abc", true);
    let report = handle(&app, vec![message("1", "a.bin", &etag)]).await;
    assert!(report.response().batch_item_failures.is_empty(), "{report:?}");
    let events = bus.events();
    assert_eq!(events.len(), 1);
    let detail: serde_json::Value = serde_json::from_str(&events[0].detail).unwrap();
    let versions: Vec<(String, u64)> = detail["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| (job["recipe"].as_str().unwrap().to_string(), job["version"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        versions,
        [("first".to_string(), 1), ("probe".to_string(), 1), ("probe".to_string(), 2)]
    );
}

/// Suspected in issue 41: a done job whose manifest is missing was
/// reported succeeded with no files. Its event now waits: the message
/// comes back, and no event says the job succeeded.
#[tokio::test]
async fn a_done_job_without_its_manifest_is_never_announced_succeeded() {
    let (app, objects, bus) = app_with_bus(None);
    let etag = objects.insert("in", "a.bin", b"abc", true);
    handle(&app, vec![message("1", "a.bin", &etag)]).await;
    assert_eq!(bus.events().len(), 1);
    let key = job_key(&sha256_hex(b"abc"), &app.config.recipes[0].recipe_hash);
    objects.remove("in", &format!("derived/{key}/{}", crate::step::MANIFEST_NAME));
    let report = handle(&app, vec![message("2", "a.bin", &etag)]).await;
    assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Reused);
    assert_eq!(report.response().batch_item_failures.len(), 1, "{report:?}");
    assert!(
        report.messages[0].error.as_deref().unwrap().contains("manifest is missing"),
        "{report:?}"
    );
    assert_eq!(bus.events().len(), 1, "no second event");
}

/// Issue 41, defect 6: a hand-on received after a deployment changed the
/// recipes' `match` so that none matches its key any more ends its
/// pipeline with a failure event saying so. It was acknowledged with "no
/// recipe matches the key", and the pipeline's event never came.
#[tokio::test]
async fn a_hand_on_no_recipe_matches_since_a_deployment_ends_with_an_event() {
    let recipes = r#"[{"name":"probe","step":"probe","version":1,"params":{},"match":{"prefix":"videos/"}},
        {"name":"probe-of-probe","step":"probe","version":2,"params":{},
         "input":{"recipe":"probe","file":"probe.json"}}]"#;
    let (app, objects, bus) = app_with_bus(Some(recipes));
    let etag = objects.insert("in", "uploads/a.bin", b"abc", true);
    let hand_on = crate::pipeline::HandOn::new(
        "in",
        "uploads/a.bin",
        None,
        &etag,
        3,
        vec!["probe-of-probe".into()],
        1,
    );
    let mut message = message("1", "uploads/a.bin", &etag);
    message.body = Some(hand_on.to_body());
    let report = handle(&app, vec![message]).await;
    assert!(report.response().batch_item_failures.is_empty(), "{report:?}");
    let events = bus.events();
    assert_eq!(events.len(), 1, "{report:?}");
    assert_eq!(events[0].detail_type, "Media Pipeline Failed");
    let detail: serde_json::Value = serde_json::from_str(&events[0].detail).unwrap();
    assert_eq!(detail["key"], "uploads/a.bin");
    assert_eq!(detail["inputHash"], sha256_hex(b"abc"));
    let job = &detail["jobs"][0];
    assert_eq!(
        (job["recipe"].as_str(), job["version"].as_u64(), job["outcome"].as_str()),
        (Some("probe-of-probe"), Some(2), Some("unmatched"))
    );
    assert_eq!(job["error"]["class"], "configuration");
    assert!(job["error"]["message"]
        .as_str()
        .unwrap()
        .contains("does not run this recipe on s3://in/uploads/a.bin"));

    // The version gone: nothing to announce, acknowledged.
    objects.remove("in", "uploads/a.bin");
    let mut gone = message_for_hand_on(&hand_on);
    gone.message_id = Some("2".into());
    let report = handle(&app, vec![gone]).await;
    assert!(report.response().batch_item_failures.is_empty(), "{report:?}");
    assert_eq!(bus.events().len(), 1);
}

fn message_for_hand_on(hand_on: &crate::pipeline::HandOn) -> SqsMessage {
    let mut message = message("h", &hand_on.key, &hand_on.etag);
    message.body = Some(hand_on.to_body());
    message
}

/// A bus on which another writer overwrites `in/a.bin` just before each
/// event is recorded: the window between a roots-only pipeline's
/// reconcile and its PutEvents.
#[derive(Debug)]
struct OverwritingBus {
    objects: Arc<InMemoryObjects>,
    inner: Arc<crate::bus::RecordingBus>,
}

#[async_trait::async_trait]
impl crate::bus::BusClient for OverwritingBus {
    async fn put_event(&self, event: &crate::bus::BusEvent) -> Result<(), crate::bus::PublishError> {
        self.objects.insert("in", "a.bin", b"the bytes after", true);
        crate::bus::BusClient::put_event(&self.inner, event).await
    }
}

/// Suspected in issue 41: a roots-only pipeline publishes without heading
/// the version again after its reconcile. No HEAD could close that window
/// (an overwrite can follow any HEAD); the event stays true all the same:
/// it names the ETag it was made for, its outputs are there (kept for the
/// grace after the overwrite's release), and the overwrite's own create
/// brings an event of its own.
#[tokio::test]
async fn an_event_overtaken_by_an_overwrite_names_the_bytes_it_was_made_for() {
    let objects = InMemoryObjects::new();
    let recorded = Arc::new(crate::bus::RecordingBus::default());
    let bus = OverwritingBus {
        objects: objects.clone(),
        inner: recorded.clone(),
    };
    let app = app_on(objects.clone(), None, bus);
    let before = objects.insert("in", "a.bin", b"the bytes before", true);
    handle(&app, vec![message("1", "a.bin", &before)]).await;
    // The same bytes' ETag, as the in-memory store gives it.
    let after = objects.insert("elsewhere", "a.bin", b"the bytes after", true);
    assert_ne!(after, before, "overwritten before the event was recorded");
    let first: serde_json::Value = serde_json::from_str(&recorded.events()[0].detail).unwrap();
    assert_eq!(first["eTag"], before.as_str());
    assert_eq!(first["inputHash"], sha256_hex(b"the bytes before"));
    let prefix = first["jobs"][0]["outputPrefix"].as_str().unwrap();
    let key = prefix.trim_start_matches("s3://in/");
    assert!(!objects.keys("in", key).is_empty(), "its outputs are there");

    // The overwrite's own create: its own event, naming the new bytes; the
    // old job, released, keeps its outputs for the grace.
    handle(&app, vec![message("2", "a.bin", &after)]).await;
    let second: serde_json::Value = serde_json::from_str(&recorded.events()[1].detail).unwrap();
    assert_eq!(second["eTag"], after.as_str());
    assert_eq!(second["inputHash"], sha256_hex(b"the bytes after"));
    assert!(!objects.keys("in", key).is_empty(), "kept for the grace");
}

/// Issue 41 (a review): a job needing from its function's timeout to that
/// and 10 s was neither run nor refused (deferred at every receive, no
/// event). After one invocation the measured timeout is trusted only with
/// the slack; after several, their longest is the timeout, and a job
/// needing at least that much can never start.
#[test]
fn a_need_at_the_timeout_is_refused_once_the_timeout_is_known() {
    let app = fixture_app();
    let now = app.now_ms();
    // As the runtime measures it: the deadline a little less than the
    // timeout away by the time the handler runs.
    let invocation = Invocation {
        request_id: "r".into(),
        deadline_ms: Some(now + 19_990),
        timeout_ms: Some(20_000),
    };
    let at_timeout = Duration::from_secs(20);
    let past_slack = Duration::from_secs(31);
    app.invoked(&invocation);
    assert!(matches!(app.start_check(&invocation, at_timeout), StartCheck::Later(_)));
    assert!(matches!(app.start_check(&invocation, past_slack), StartCheck::Never(_)));
    app.invoked(&invocation);
    assert!(matches!(app.start_check(&invocation, at_timeout), StartCheck::Never(_)));
    assert!(matches!(
        app.start_check(&invocation, Duration::from_secs(19)),
        StartCheck::Now
    ));
    // A shorter measurement later (a retried init) does not lower it.
    let short = Invocation {
        timeout_ms: Some(9_000),
        deadline_ms: Some(now + 9_000),
        ..invocation.clone()
    };
    app.invoked(&short);
    assert!(matches!(
        app.start_check(&short, Duration::from_secs(19)),
        StartCheck::Later(_)
    ));
}

/// Issue 41 (a review): a job no invocation of this function can start is
/// judged as a claim would first. Held under a live lease by another
/// invocation (a function with a longer timeout) it is busy, not refused:
/// refusing it gave its version a failure event, and later, when the
/// other invocation finished, a success one.
#[tokio::test]
async fn a_job_too_long_for_this_function_but_running_elsewhere_is_busy() {
    // A 30 s step (AVIF) in a function whose invocations last 20 s.
    let recipes = r#"[{"name":"avif","step":"thumbnail","version":1,"params":{"widths":[16],"format":"avif"}}]"#;
    let f = fixture_with(Some(recipes));
    let etag = f.objects.insert("in", "a.png", b"not decoded here", true);
    let key = job_key(&sha256_hex(b"not decoded here"), &f.app.config.recipes[0].recipe_hash);
    let invoke = |id: &str| {
        let mut event = SqsEvent::default();
        event.records = vec![message(id, "a.png", &etag)];
        let invocation = Invocation {
            request_id: format!("req-{id}"),
            deadline_ms: Some(f.app.now_ms() + 20_000),
            timeout_ms: Some(20_000),
        };
        handle_batch(f.app.clone(), event, invocation)
    };
    // Nobody runs it: refused for good, with the reason.
    let refused = invoke("1").await;
    let job = refused.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Poisoned, "{refused:?}");
    assert!(job.reason.as_deref().unwrap().contains("no invocation can start it"));

    // Another function's invocation holds it: busy until its lease ends.
    let request = ClaimRequest {
        job_key: key.clone(),
        step: "thumbnail".into(),
        input_hash: sha256_hex(b"not decoded here"),
        output_prefix: f.app.config.output_location(&key),
        owner: "a-longer-function/1".into(),
        lease_until_ms: f.app.now_ms() + 600_000,
        now_ms: f.app.now_ms(),
        max_attempts: 3,
    };
    assert!(matches!(f.app.ledger.claim(&request).await.unwrap(), ClaimOutcome::Run(_)));
    let busy = invoke("2").await;
    let job = busy.jobs().next().unwrap();
    assert_eq!(job.outcome, Outcome::Busy, "{busy:?}");
    assert_eq!(job.busy_until_ms, Some(request.lease_until_ms));
}

/// Issue 41 (a review): a hand-on naming a recipe the configuration
/// deployed since has removed, for a key other recipes still match: the
/// walk runs what matches, and the event names the removed recipe
/// `unmatched` (failed, class `configuration`) instead of dropping it
/// from a `succeeded` event.
#[tokio::test]
async fn a_handed_on_recipe_removed_since_is_named_in_the_event() {
    let (app, objects, bus) = app_with_bus(None);
    let etag = objects.insert("in", "a.bin", b"abc", true);
    let hand_on =
        crate::pipeline::HandOn::new("in", "a.bin", None, &etag, 3, vec!["old-thumbs".into()], 1);
    let report = handle(&app, vec![message_for_hand_on(&hand_on)]).await;
    let outcomes: Vec<(String, Outcome)> = report
        .jobs()
        .map(|j| (j.recipe.clone(), j.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("probe".to_string(), Outcome::Ran),
            ("old-thumbs".to_string(), Outcome::Unmatched)
        ]
    );
    assert!(report.response().batch_item_failures.is_empty(), "{report:?}");
    let events = bus.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].detail_type, "Media Pipeline Failed");
    let detail: serde_json::Value = serde_json::from_str(&events[0].detail).unwrap();
    let old = &detail["jobs"][1];
    assert_eq!(
        (old["recipe"].as_str(), old["outcome"].as_str(), old["version"].as_u64()),
        (Some("old-thumbs"), Some("unmatched"), Some(0))
    );
    assert_eq!(old["error"]["class"], "configuration");
}

/// Issue 38, case 4: a version handed on (a split's end, a pipeline's
/// walk) while a collection holds its job comes back when the
/// collector's lease ends, not seconds later: a long hold would otherwise
/// spend the queue's receives and dead-letter the hand-on.
#[tokio::test]
async fn a_hand_on_meeting_a_collection_comes_back_when_the_collectors_lease_ends() {
    let f = fixture();
    let etag = f.objects.insert("in", "v.mp4", b"video", true);
    let rule = &f.app.config.recipes[0];
    let key = job_key(&sha256_hex(b"video"), &rule.recipe_hash);
    let now = f.app.now_ms();
    let table = InMemoryTable::new("jobs");
    table.insert(JobRow {
        status: JobStatus::Collecting,
        collected_from: Some(JobStatus::Done),
        ..JobRow::claimed(&crate::ledger::ClaimRequest {
            job_key: key.clone(),
            step: rule.recipe.step.clone(),
            input_hash: sha256_hex(b"video"),
            output_prefix: f.app.config.output_location(&key),
            owner: "collector/1".into(),
            lease_until_ms: now + 300_000,
            now_ms: now,
            max_attempts: 3,
        })
    });
    let app = Arc::new(App::new(
        f.app.config.clone(),
        Ledger::new(table),
        ObjectStore::new(f.objects.clone()),
        Queue::new(f.queue.clone()),
    ));
    let hand_on = crate::pipeline::HandOn::new(
        "in",
        "v.mp4",
        None,
        etag.trim_matches('"'),
        5,
        vec![rule.name.clone()],
        1,
    );
    let mut m = SqsMessage::default();
    m.message_id = Some("h".into());
    m.receipt_handle = Some("receipt-h".into());
    m.body = Some(hand_on.to_body());
    m.event_source_arn = Some(ARN.into());
    let report = handle(&app, vec![m]).await;
    assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Busy, "{report:?}");
    assert_eq!(report.response().batch_item_failures.len(), 1);
    let delay = f.queue.delay_of("receipt-h").expect("a busy delay");
    assert!(delay >= 300, "back after the collector's lease, not in {delay} s");
}
