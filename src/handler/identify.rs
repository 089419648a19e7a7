//! A record's input hash, found as [`crate::identity`] plans it: from the
//! head, from the hash cache, or by reading the object once, hashing it as
//! it streams past and keeping the bytes for the record's jobs.

use std::sync::Arc;

use super::job::BatchJobs;
use super::{App, Outcome};
use crate::config::RecipeRule;
use crate::fingerprint::{version_etag, Fingerprint, FingerprintSource, ObjectHead};
use crate::identity::{declared_mismatch, plan, ObjectVersion, OnMiss, Plan};
use crate::step::{InputUse, ObjectBytes};

/// A record's object version, keyed: its input hash and its bytes (read
/// already, or on a step's first need).
pub(super) struct Identified {
    pub fingerprint: Fingerprint,
    pub bytes: Arc<ObjectBytes>,
}

/// Finds the input hash of `head` for the jobs of `rules` (once per batch
/// for each object version). `Err` with the outcome when there is none
/// (the read to hash it failed).
pub(super) async fn identify(
    app: &App,
    batch: &BatchJobs,
    head: ObjectHead,
    rules: &[&RecipeRule],
) -> Result<Identified, (Outcome, String)> {
    let uses: Vec<InputUse> = rules.iter().map(|rule| rule.step.input_use()).collect();
    let version = ObjectVersion::of(&head);
    let bytes = app.object_bytes(head.clone(), &uses);
    let fingerprint = batch
        .input_hash(&version.row_key())
        .get_or_try_init(|| find(app, &head, &uses, &version, &bytes))
        .await?
        .clone();
    if let Some(warning) = declared_mismatch(&head, &fingerprint) {
        tracing::warn!(object = %bytes.object(), "{warning}");
    }
    Ok(Identified { fingerprint, bytes })
}

async fn find(
    app: &App,
    head: &ObjectHead,
    uses: &[InputUse],
    version: &ObjectVersion,
    bytes: &ObjectBytes,
) -> Result<Fingerprint, (Outcome, String)> {
    Ok(match plan(app.config.identity, head, uses) {
        Plan::Known(fingerprint) => fingerprint,
        Plan::LookUp { on_miss } => match cached(app, version).await {
            Some(input_hash) => Fingerprint {
                input_hash,
                source: FingerprintSource::Cached,
            },
            None if on_miss == OnMiss::VersionEtag => version_etag(head),
            None => {
                let loaded = bytes.load().await.map_err(|err| {
                    if err.replaced {
                        (
                            Outcome::Skipped,
                            format!(
                                "{} was replaced while it was read to be hashed: {}; \
                                 the new version's event runs it",
                                bytes.object(),
                                err.message
                            ),
                        )
                    } else {
                        (Outcome::Failed, err.message)
                    }
                })?;
                if let Err(err) = app
                    .ledger
                    .cache_input_hash(version, &loaded.sha256, app.now_ms())
                    .await
                {
                    // The next delivery reads the object again; nothing worse.
                    tracing::warn!(object = %bytes.object(), error = %err, "caching the input hash failed");
                }
                Fingerprint {
                    input_hash: loaded.sha256.clone(),
                    source: FingerprintSource::Computed,
                }
            }
        },
    })
}

/// The cached hash of `version`; a failed lookup is a miss (logged).
async fn cached(app: &App, version: &ObjectVersion) -> Option<String> {
    match app.ledger.cached_input_hash(version).await {
        Ok(hash) => hash,
        Err(err) => {
            tracing::warn!(
                bucket = version.bucket.as_str(),
                key = version.key.as_str(),
                error = %err,
                "looking up the input hash cache failed: treated as a miss"
            );
            None
        }
    }
}

/// After the record's jobs: a cached hash that the bytes, once read,
/// disproved is forgotten (the next delivery hashes them afresh).
pub(super) async fn forget_if_disproved(app: &App, identified: &Identified) {
    let Identified { fingerprint, bytes } = identified;
    let Some(loaded) = bytes.if_loaded() else {
        return;
    };
    if fingerprint.source != FingerprintSource::Cached || loaded.sha256 == fingerprint.input_hash {
        return;
    }
    let version = ObjectVersion::of(&bytes.head);
    tracing::warn!(
        object = %bytes.object(),
        cached = fingerprint.input_hash.as_str(),
        actual = loaded.sha256.as_str(),
        "the cached input hash does not match the bytes: forgotten"
    );
    if let Err(err) = app.ledger.forget_input_hash(&version).await {
        tracing::warn!(object = %bytes.object(), error = %err, "forgetting the input hash failed");
    }
}
