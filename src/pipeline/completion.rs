//! The completion event of an upload version's pipeline: published once
//! every job of it is terminal (done, or failed for good), with what an
//! application needs to update its own records without another call.
//! Pure: built from the jobs' outcomes and manifests.
//!
//! Source `mediaonce`; detail-type [`SUCCEEDED`] when every job is done,
//! [`FAILED`] when any failed for good. The detail's `eventId` is the same
//! for every delivery of the same result (a hash of the version, its
//! bytes and each job's key and status), so a consumer deduplicates a
//! redelivery's copy by it.

use serde::Serialize;

use crate::fingerprint::FingerprintSource;
use crate::key::sha256_hex;

pub const SOURCE: &str = "mediaonce";
pub const SUCCEEDED: &str = "Media Pipeline Succeeded";
pub const FAILED: &str = "Media Pipeline Failed";

/// One output file, as the job's manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletedFile {
    pub name: String,
    pub size: u64,
    pub sha256: String,
    pub content_type: String,
}

/// A job lists at most this many files in its event: an HLS package of a
/// long video has thousands of segments, and EventBridge takes at most
/// 256 KB an entry.
pub const MAX_LISTED_FILES: usize = 100;

/// The files a job's event lists: all, or, when there are more than
/// [`MAX_LISTED_FILES`], the first of those that are not media segments
/// (an HLS package's playlists: what a player is given). Pure.
pub fn listed(files: Vec<CompletedFile>) -> Vec<CompletedFile> {
    if files.len() <= MAX_LISTED_FILES {
        return files;
    }
    files
        .into_iter()
        .filter(|file| file.content_type != "video/mp2t")
        .take(MAX_LISTED_FILES)
        .collect()
}

/// Why a job failed for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobError {
    /// `permanent` (the step refused its input or ran out of attempts) or
    /// `upstream` (the job it reads from failed).
    pub class: String,
    pub message: String,
}

/// One job of the pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletedJob {
    pub recipe: String,
    pub step: String,
    pub version: u64,
    /// Empty for a job that could not be keyed (its upstream failed).
    pub job_key: String,
    /// `done` or `failed`.
    pub status: String,
    /// This version's outcome: `ran`, `reused`, `poisoned`...
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_prefix: Option<String>,
    /// The files of a done job: all of them, or past
    /// [`MAX_LISTED_FILES`] the ones not media segments ([`listed`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<CompletedFile>,
    /// How many files a done job has (its manifest lists every one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<JobError>,
}

/// The event's detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Completion {
    pub event_id: String,
    pub bucket: String,
    pub key: String,
    pub version_id: Option<String>,
    #[serde(rename = "eTag")]
    pub etag: String,
    pub input_hash: String,
    pub input_hash_source: FingerprintSource,
    /// `succeeded` or `failed`.
    pub status: String,
    pub jobs: Vec<CompletedJob>,
    /// What the event left out to fit EventBridge's entry size
    /// ([`Completion::fit`], [`crate::bus::MAX_ENTRY_BYTES`]); absent when
    /// nothing was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted: Option<Omitted>,
}

/// What an event left out to fit, counted. Each job's manifest, under its
/// `outputPrefix`, still lists every file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Omitted {
    /// Files not listed (past those [`listed`] already leaves out).
    pub files: u64,
    /// Jobs not listed (done ones first).
    pub jobs: u64,
}

impl Completion {
    /// The detail for `jobs` of the version; its status and id follow
    /// from them.
    pub fn new(
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        etag: &str,
        input: (&str, FingerprintSource),
        jobs: Vec<CompletedJob>,
    ) -> Self {
        let failed = jobs.iter().any(|job| job.status != "done");
        let mut lines: Vec<String> = jobs
            .iter()
            .map(|job| format!("{}\n{}\n{}", job.recipe, job.job_key, job.status))
            .collect();
        lines.sort();
        let text = format!(
            "mediaonce-completion\n{bucket}\n{key}\n{}\n{etag}\n{}",
            version_id.unwrap_or("null"),
            lines.join("\n")
        );
        Completion {
            event_id: sha256_hex(text.as_bytes()),
            bucket: bucket.to_string(),
            key: key.to_string(),
            version_id: version_id.map(str::to_string),
            etag: etag.to_string(),
            input_hash: input.0.to_string(),
            input_hash_source: input.1,
            status: if failed { "failed" } else { "succeeded" }.to_string(),
            jobs,
            omitted: None,
        }
    }

    /// Cuts the detail to at most `max_bytes` of JSON: the job listing the
    /// most files gives up half of them, again and again; with no file
    /// left, jobs go from the end, done ones first (a failure is what an
    /// application most needs to see). What went is counted in
    /// `omitted`; the status and `eventId` stay those of every job.
    /// Returns the detail as it fits (JSON text), serialized once when it
    /// fits at once.
    pub fn fit(&mut self, max_bytes: usize) -> String {
        loop {
            let detail = self.to_detail();
            if detail.len() <= max_bytes {
                return detail;
            }
            let omitted = self.omitted.get_or_insert_with(Omitted::default);
            if let Some(job) = self
                .jobs
                .iter_mut()
                .filter(|job| !job.files.is_empty())
                .max_by_key(|job| job.files.len())
            {
                let keep = job.files.len() / 2;
                omitted.files += (job.files.len() - keep) as u64;
                job.files.truncate(keep);
                continue;
            }
            let Some(last) = self
                .jobs
                .iter()
                .rposition(|job| job.status == "done")
                .or(self.jobs.len().checked_sub(1))
            else {
                return detail;
            };
            self.jobs.remove(last);
            omitted.jobs += 1;
        }
    }

    pub fn detail_type(&self) -> &'static str {
        if self.status == "succeeded" {
            SUCCEEDED
        } else {
            FAILED
        }
    }

    /// The detail as JSON text.
    pub fn to_detail(&self) -> String {
        serde_json::to_string(self).expect("a completion serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(recipe: &str, key: &str, status: &str, outcome: &str) -> CompletedJob {
        CompletedJob {
            recipe: recipe.into(),
            step: "thumbnail".into(),
            version: 1,
            job_key: key.into(),
            status: status.into(),
            outcome: outcome.into(),
            output_prefix: Some(format!("s3://out/derived/{key}/")),
            files: vec![CompletedFile {
                name: "thumb-320.jpg".into(),
                size: 10,
                sha256: "ab".into(),
                content_type: "image/jpeg".into(),
            }],
            file_count: Some(1),
            error: None,
        }
    }

    #[test]
    fn a_long_package_lists_its_playlists_and_counts_its_segments() {
        let file = |name: &str, content_type: &str| CompletedFile {
            name: name.into(),
            size: 1,
            sha256: "ab".into(),
            content_type: content_type.into(),
        };
        let mut files: Vec<CompletedFile> = (0..2_000)
            .map(|n| file(&format!("1080p/seg-{n:05}.ts"), "video/mp2t"))
            .collect();
        files.push(file("1080p/index.m3u8", "application/vnd.apple.mpegurl"));
        files.push(file("master.m3u8", "application/vnd.apple.mpegurl"));
        let names: Vec<String> = listed(files).into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["1080p/index.m3u8", "master.m3u8"]);
        let few = vec![file("a/seg-00000.ts", "video/mp2t")];
        assert_eq!(listed(few.clone()), few);
    }

    fn completion(jobs: Vec<CompletedJob>) -> Completion {
        Completion::new(
            "in",
            "a.jpg",
            Some("v1"),
            "e",
            ("h", FingerprintSource::S3Checksum),
            jobs,
        )
    }

    #[test]
    fn the_same_result_has_the_same_id_whoever_ran_it() {
        let ran = completion(vec![
            job("a", "K1", "done", "ran"),
            job("b", "K2", "done", "ran"),
        ]);
        let reused = completion(vec![
            job("b", "K2", "done", "reused"),
            job("a", "K1", "done", "reused"),
        ]);
        assert_eq!(ran.event_id, reused.event_id);
        assert_eq!(ran.detail_type(), SUCCEEDED);
        let other = Completion::new(
            "in",
            "a.jpg",
            Some("v2"),
            "e",
            ("h", FingerprintSource::S3Checksum),
            vec![],
        );
        assert_ne!(other.event_id, ran.event_id);
        let failed = completion(vec![job("a", "K1", "failed", "poisoned")]);
        assert_ne!(
            failed.event_id,
            completion(vec![job("a", "K1", "done", "ran")]).event_id
        );
        assert_eq!(
            (failed.detail_type(), failed.status.as_str()),
            (FAILED, "failed")
        );
    }

    /// Issue 41, defect 3: a 3-hour video's package (7,205 files, 100
    /// listed) and two chained jobs whose reasons name every file fit in
    /// an entry once cut; the counts say what went, and the id and status
    /// are those of every job.
    #[test]
    fn an_event_too_large_for_an_entry_is_cut_and_says_what_it_left_out() {
        let mut package = job("hls", "K1", "done", "ran");
        package.files = (0..MAX_LISTED_FILES)
            .map(|n| CompletedFile {
                name: format!("1080p/index-{n:04}-with-a-long-name.m3u8"),
                size: 1,
                sha256: "ab".repeat(32),
                content_type: "application/vnd.apple.mpegurl".into(),
            })
            .collect();
        package.file_count = Some(7_205);
        let mut failed = job("thumbs", "", "failed", "poisoned");
        failed.files.clear();
        failed.error = Some(JobError {
            class: "upstream".into(),
            message: "x".repeat(2_000),
        });
        let mut jobs = vec![package];
        jobs.extend((0..200).map(|n| CompletedJob {
            recipe: format!("chained-{n}"),
            ..failed.clone()
        }));
        let mut event = completion(jobs);
        let (id, status) = (event.event_id.clone(), event.status.clone());
        assert!(event.to_detail().len() > crate::bus::MAX_ENTRY_BYTES);
        let detail = event.fit(200_000);
        assert_eq!(detail, event.to_detail());
        assert!(detail.len() <= 200_000, "{}", detail.len());
        let omitted = event.omitted.clone().unwrap();
        assert_eq!(omitted.files, MAX_LISTED_FILES as u64, "{omitted:?}");
        assert!(omitted.jobs > 0 && event.jobs.iter().all(|j| j.status == "failed"));
        assert_eq!((event.event_id, event.status), (id, status));
        let value: serde_json::Value = serde_json::from_str(&detail).unwrap();
        assert_eq!(value["omitted"]["files"], MAX_LISTED_FILES as u64);

        let mut small = completion(vec![job("a", "K1", "done", "ran")]);
        let before = small.to_detail();
        assert_eq!(
            small.fit(crate::bus::MAX_ENTRY_BYTES),
            before,
            "nothing to cut"
        );
        assert_eq!(small.omitted, None);
    }

    #[test]
    fn the_detail_names_what_an_application_needs() {
        let detail: serde_json::Value =
            serde_json::from_str(&completion(vec![job("a", "K1", "done", "ran")]).to_detail())
                .unwrap();
        assert_eq!(detail["eTag"], "e");
        assert_eq!(detail["versionId"], "v1");
        assert_eq!(detail["inputHashSource"], "s3-checksum");
        let job = &detail["jobs"][0];
        assert_eq!(job["jobKey"], "K1");
        assert_eq!(job["outputPrefix"], "s3://out/derived/K1/");
        assert_eq!(job["files"][0]["contentType"], "image/jpeg");
        assert!(job.get("error").is_none());
    }

    /// Every object's keys, by path (`jobs[]`, `jobs[].files[]`).
    fn shape(value: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, inner) in map {
                    out.push(format!("{path}.{key}"));
                    shape(inner, &format!("{path}.{key}"), out);
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    shape(item, &format!("{path}[]"), out);
                }
            }
            _ => {}
        }
        out.sort();
        out.dedup();
    }

    #[test]
    fn the_sample_event_has_the_detail_we_publish() {
        let sample: serde_json::Value =
            serde_json::from_str(include_str!("../../events/completion-succeeded.json")).unwrap();
        assert_eq!(sample["source"], SOURCE);
        assert_eq!(sample["detail-type"], SUCCEEDED);
        let published: serde_json::Value =
            serde_json::from_str(&completion(vec![job("a", "K1", "done", "ran")]).to_detail())
                .unwrap();
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        shape(&published, "", &mut ours);
        shape(&sample["detail"], "", &mut theirs);
        assert_eq!(ours, theirs);
    }
}
