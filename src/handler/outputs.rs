//! Where an object's outputs are: its version's pipeline as a tree. For
//! each root recipe that matches its key, the job the handler would key
//! (the same identity, cache and reads), its row and its manifest; under
//! it, the recipes chained to it, keyed by the SHA-256 that manifest
//! records for their input file (`mediaonce outputs`).

use super::identify::identify;
use super::job::BatchJobs;
use super::App;
use crate::config::{split_s3_location, RecipeRule};
use crate::fingerprint::FingerprintSource;
use crate::key::job_key;
use crate::ledger::JobRow;
use crate::step::{Manifest, OutputFile, MANIFEST_NAME};
use crate::store::{ErrorKind, ObjectRef};

/// One recipe's job for an object, and the jobs chained to it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RecipeOutputs {
    /// The recipe's name (its step's when it has none).
    pub name: String,
    pub recipe: serde_json::Value,
    /// Empty when it cannot be keyed yet: a chained job whose upstream has
    /// no manifest, or whose manifest lists no such file.
    pub job_key: String,
    pub input_hash_source: FingerprintSource,
    /// `none` when the job has no row (never run, or collected);
    /// `unkeyed` when it has no key yet.
    pub status: String,
    pub refs: Option<u64>,
    pub attempts: Option<u64>,
    /// Where the outputs are (the row's, else where this configuration
    /// would put them); empty when unkeyed.
    pub output_prefix: String,
    /// The manifest's files; empty when there is no manifest (yet).
    pub files: Vec<OutputFile>,
    /// The recipes that read this one's output files.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub downstream: Vec<RecipeOutputs>,
    /// The recipe's place in the configuration.
    #[serde(skip)]
    recipe_index: usize,
}

impl App {
    /// The outputs of `object` (a version when it names one): its
    /// pipeline's root recipes, each with the recipes chained to it. `Err`
    /// with a one-line reason when the object does not exist or a call
    /// fails.
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
            found.push(self.job_outputs(rule, key, fingerprint.source).await?);
        }
        // Level by level: each job's children are keyed by its manifest.
        let mut level: Vec<&mut RecipeOutputs> = found.iter_mut().collect();
        while !level.is_empty() {
            let mut next = Vec::new();
            for upstream in level {
                let rule = &self.config.recipes[upstream.recipe_index];
                for child in self.config.chained_to(rule) {
                    let file = &child.input.as_ref().expect("a chained recipe").file;
                    let keyed = upstream.files.iter().find(|f| &f.name == file);
                    let outputs = match keyed {
                        Some(file) => {
                            let key = job_key(&file.sha256, &child.recipe_hash);
                            let source = FingerprintSource::UpstreamManifest;
                            self.job_outputs(child, key, source).await?
                        }
                        None => RecipeOutputs::unkeyed(child),
                    };
                    upstream.downstream.push(outputs);
                }
                next.extend(upstream.downstream.iter_mut());
            }
            level = next;
        }
        Ok(found)
    }

    /// `rule`'s job `key`: its row, references and manifest.
    async fn job_outputs(
        &self,
        rule: &RecipeRule,
        key: String,
        input_hash_source: FingerprintSource,
    ) -> Result<RecipeOutputs, String> {
        let row: Option<JobRow> = self.ledger.get(&key).await.map_err(|e| e.to_string())?;
        let output_prefix = row
            .as_ref()
            .map(|r| r.output_prefix.clone())
            .unwrap_or_else(|| self.config.output_location(&key));
        let files = match split_s3_location(&output_prefix) {
            Some((bucket, prefix)) if row.is_some() => self
                .manifest_under(bucket, prefix)
                .await?
                .map(|m| m.outputs)
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let refs = match &row {
            Some(_) => Some(
                self.ledger
                    .references(&key)
                    .await
                    .map_err(|e| e.to_string())?
                    .len() as u64,
            ),
            None => None,
        };
        Ok(RecipeOutputs {
            name: rule.name.clone(),
            recipe: rule.recipe.to_value(),
            job_key: key,
            input_hash_source,
            status: row
                .as_ref()
                .map_or("none", |r| r.status.as_str())
                .to_string(),
            refs,
            attempts: row.as_ref().map(|r| r.attempts),
            output_prefix,
            files,
            downstream: Vec::new(),
            recipe_index: rule.index,
        })
    }

    /// The manifest of the job whose outputs are under `prefix` in
    /// `bucket`, if it has been written.
    pub(super) async fn manifest_under(
        &self,
        bucket: &str,
        prefix: &str,
    ) -> Result<Option<Manifest>, String> {
        self.manifest(bucket, &format!("{prefix}{MANIFEST_NAME}"))
            .await
    }

    /// A job's manifest, if it has been written: one GET, a 404 is none.
    async fn manifest(&self, bucket: &str, key: &str) -> Result<Option<Manifest>, String> {
        self.json_object(bucket, key, "a manifest").await
    }

    /// A JSON object one of our jobs wrote (`what` it should be, for the
    /// error), if it exists: one GET, a 404 is none.
    pub(super) async fn json_object<T: serde::de::DeserializeOwned>(
        &self,
        bucket: &str,
        key: &str,
        what: &str,
    ) -> Result<Option<T>, String> {
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
            .map_err(|e| format!("s3://{bucket}/{key} is not {what}: {e}"))
    }
}

impl RecipeOutputs {
    /// A chained recipe whose upstream gave it no input (yet).
    fn unkeyed(rule: &RecipeRule) -> Self {
        RecipeOutputs {
            name: rule.name.clone(),
            recipe: rule.recipe.to_value(),
            job_key: String::new(),
            input_hash_source: FingerprintSource::UpstreamManifest,
            status: "unkeyed".into(),
            refs: None,
            attempts: None,
            output_prefix: String::new(),
            files: Vec::new(),
            downstream: Vec::new(),
            recipe_index: rule.index,
        }
    }
}

/// The pipeline as an operator reads it: one line per job (recipe, job
/// key, status, references, files), the chained ones indented under their
/// upstream. Pure.
pub fn render_tree(roots: &[RecipeOutputs]) -> String {
    fn walk(jobs: &[RecipeOutputs], indent: &str, out: &mut String) {
        for (i, job) in jobs.iter().enumerate() {
            let last = i + 1 == jobs.len();
            let branch = if indent.is_empty() {
                ""
            } else if last {
                "└─ "
            } else {
                "├─ "
            };
            let key = if job.job_key.is_empty() {
                "-".to_string()
            } else {
                job.job_key.chars().take(12).collect()
            };
            let refs = job.refs.map_or("-".to_string(), |n| n.to_string());
            let files: Vec<&str> = job.files.iter().map(|f| f.name.as_str()).collect();
            out.push_str(&format!(
                "{indent}{branch}{} {key} {} refs={refs} [{}]\n",
                job.name,
                job.status,
                files.join(", ")
            ));
            let deeper = match (indent.is_empty(), last) {
                (true, _) => "  ".to_string(),
                (false, true) => format!("{indent}   "),
                (false, false) => format!("{indent}│  "),
            };
            walk(&job.downstream, &deeper, out);
        }
    }
    let mut out = String::new();
    walk(roots, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, key: &str, status: &str, downstream: Vec<RecipeOutputs>) -> RecipeOutputs {
        RecipeOutputs {
            name: name.into(),
            recipe: serde_json::Value::Null,
            job_key: key.into(),
            input_hash_source: FingerprintSource::UpstreamManifest,
            status: status.into(),
            refs: (!key.is_empty()).then_some(1),
            attempts: None,
            output_prefix: String::new(),
            files: Vec::new(),
            downstream,
            recipe_index: 0,
        }
    }

    #[test]
    fn a_tree_of_jobs_one_line_each() {
        let roots = vec![
            job(
                "poster",
                "aaaaaaaaaaaaaaaaaaaa",
                "done",
                vec![
                    job("thumbs", "bbbbbbbbbbbbbbbb", "done", vec![]),
                    job("crop", "", "unkeyed", vec![job("crop-webp", "", "unkeyed", vec![])]),
                ],
            ),
            job("hls", "cccccccccccccccc", "none", vec![]),
        ];
        assert_eq!(
            render_tree(&roots),
            "poster aaaaaaaaaaaa done refs=1 []\n\
             \x20 ├─ thumbs bbbbbbbbbbbb done refs=1 []\n\
             \x20 └─ crop - unkeyed refs=- []\n\
             \x20    └─ crop-webp - unkeyed refs=- []\n\
             hls cccccccccccc none refs=1 []\n"
        );
    }
}
