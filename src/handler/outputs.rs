//! Where an object's outputs are: for each configured recipe that matches
//! its key, the job the handler would key (the same identity, cache and
//! reads), its row and its manifest (`mediaonce outputs`).

use super::identify::identify;
use super::job::BatchJobs;
use super::App;
use crate::config::{split_s3_location, RecipeRule};
use crate::fingerprint::FingerprintSource;
use crate::key::job_key;
use crate::ledger::JobRow;
use crate::step::{Manifest, OutputFile, MANIFEST_NAME};
use crate::store::{ErrorKind, ObjectRef};

/// One recipe's job for an object.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RecipeOutputs {
    pub recipe: serde_json::Value,
    pub job_key: String,
    pub input_hash_source: FingerprintSource,
    /// `none` when the job has no row (never run, or collected).
    pub status: String,
    pub refs: Option<u64>,
    pub attempts: Option<u64>,
    /// Where the outputs are (the row's, else where this configuration
    /// would put them).
    pub output_prefix: String,
    /// The manifest's files; empty when there is no manifest (yet).
    pub files: Vec<OutputFile>,
}

impl App {
    /// The outputs of `object` (a version when it names one), recipe by
    /// recipe. `Err` with a one-line reason when the object does not exist
    /// or a call fails.
    pub async fn outputs_of(&self, object: &ObjectRef) -> Result<Vec<RecipeOutputs>, String> {
        let head = self
            .store
            .head(object)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{object} does not exist"))?;
        let rules: Vec<&RecipeRule> = self.config.recipes_for(&object.key);
        if rules.is_empty() {
            return Ok(Vec::new());
        }
        let identified = identify(self, &BatchJobs::default(), head, &rules)
            .await
            .map_err(|(_, reason)| reason)?;
        let fingerprint = &identified.fingerprint;
        let mut found = Vec::with_capacity(rules.len());
        for rule in rules {
            let key = job_key(&fingerprint.input_hash, &rule.recipe_hash);
            let row: Option<JobRow> = self.ledger.get(&key).await.map_err(|e| e.to_string())?;
            let output_prefix = row
                .as_ref()
                .map(|r| r.output_prefix.clone())
                .unwrap_or_else(|| self.config.output_location(&key));
            let files = match split_s3_location(&output_prefix) {
                Some((bucket, prefix)) if row.is_some() => {
                    self.manifest(bucket, &format!("{prefix}{MANIFEST_NAME}"))
                        .await?
                        .map(|m| m.outputs)
                        .unwrap_or_default()
                }
                _ => Vec::new(),
            };
            found.push(RecipeOutputs {
                recipe: rule.recipe.to_value(),
                job_key: key.clone(),
                input_hash_source: fingerprint.source,
                status: row
                    .as_ref()
                    .map_or("none", |r| r.status.as_str())
                    .to_string(),
                refs: match &row {
                    Some(_) => Some(
                        self.ledger
                            .references(&key)
                            .await
                            .map_err(|e| e.to_string())?
                            .len() as u64,
                    ),
                    None => None,
                },
                attempts: row.as_ref().map(|r| r.attempts),
                output_prefix,
                files,
            });
        }
        Ok(found)
    }

    /// The manifest of the job whose outputs are at `location`
    /// (`s3://bucket/prefix/`), if it has been written.
    pub(super) async fn manifest_at(&self, location: &str) -> Result<Option<Manifest>, String> {
        let (bucket, prefix) = split_s3_location(location)
            .ok_or_else(|| format!("{location:?} is not an s3://bucket/prefix/ location"))?;
        self.manifest(bucket, &format!("{prefix}{MANIFEST_NAME}"))
            .await
    }

    /// A job's manifest, if it has been written: one GET, a 404 is none.
    async fn manifest(&self, bucket: &str, key: &str) -> Result<Option<Manifest>, String> {
        let object = ObjectRef {
            bucket: bucket.to_string(),
            key: key.to_string(),
            version_id: None,
            if_match: None,
        };
        let body = match self.store.get(&object).await {
            Ok(body) => body,
            Err(err) if err.kind == ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err.to_string()),
        };
        let bytes = body
            .collect()
            .await
            .map_err(|e| format!("reading s3://{bucket}/{key}: {e}"))?
            .into_bytes();
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("s3://{bucket}/{key} is not a manifest: {e}"))
    }
}
