//! Configuration from the environment, checked once at start-up with an
//! error that names the variable.

use std::time::Duration;

use serde_json::Value;

use std::sync::Arc;

use crate::key::{json_type, Recipe};
use crate::lease::{LeasePolicy, DEFAULT_FIXED_LEASE, DEFAULT_LEASE_MARGIN};
use crate::pipeline::{ChainedInput, Graph, Node};
use crate::step::BoundStep;
use crate::steps::StepRegistry;

pub const ENV_TABLE: &str = "MEDIAONCE_TABLE";
/// The references table (default `<MEDIAONCE_TABLE>-refs`).
pub const ENV_REFS_TABLE: &str = "MEDIAONCE_REFS_TABLE";
pub const ENV_OUTPUT_BUCKET: &str = "MEDIAONCE_OUTPUT_BUCKET";
pub const ENV_OUTPUT_PREFIX: &str = "MEDIAONCE_OUTPUT_PREFIX";
pub const ENV_RECIPES: &str = "MEDIAONCE_RECIPES";
pub const ENV_CONCURRENCY: &str = "MEDIAONCE_CONCURRENCY";
pub const ENV_LEASE_MARGIN_SECS: &str = "MEDIAONCE_LEASE_MARGIN_SECS";
pub const ENV_LEASE_SECS: &str = "MEDIAONCE_LEASE_SECS";
pub const ENV_MAX_ATTEMPTS: &str = "MEDIAONCE_MAX_ATTEMPTS";
pub const ENV_DEADLINE_MARGIN_SECS: &str = "MEDIAONCE_DEADLINE_MARGIN_SECS";
pub const ENV_RELEASE_ON_DELETE_MARKER: &str = "MEDIAONCE_RELEASE_ON_DELETE_MARKER";
pub const ENV_GC_GRACE_SECS: &str = "MEDIAONCE_GC_GRACE_SECS";
/// The EventBridge bus (name or ARN) completion events go to; unset: none.
pub const ENV_EVENT_BUS: &str = "MEDIAONCE_EVENT_BUS";
/// The SQS queue URL a split job's chunk messages go to; unset: the queue
/// its own message came from.
pub const ENV_CHUNK_QUEUE_URL: &str = "MEDIAONCE_CHUNK_QUEUE_URL";
/// The state machine (`statemachine/hls-split.asl.json`) that runs a long
/// video's split: an `arn:aws:states:...:stateMachine:<name>` ARN.
pub const ENV_SPLIT_MACHINE_ARN: &str = "MEDIAONCE_SPLIT_MACHINE_ARN";
/// How many chunks of one split run at once (the Map's `MaxConcurrency`).
pub const ENV_SPLIT_MAX_CONCURRENCY: &str = "MEDIAONCE_SPLIT_MAX_CONCURRENCY";
pub use crate::metrics::{DEFAULT_NAMESPACE, ENV_METRICS, ENV_METRICS_NAMESPACE};
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(86_400);
pub use crate::identity::{IdentityMode, ENV_IDENTITY};
/// Owned by the thumbnail step, which is built with it.
pub use crate::steps::thumbnail::{DEFAULT_MAX_PIXELS, ENV_MAX_PIXELS};
/// Owned by the store, whose S3 calls carry it.
pub use crate::store::ENV_EXPECTED_BUCKET_OWNER;

pub const DEFAULT_OUTPUT_PREFIX: &str = "derived/";
pub const DEFAULT_RECIPES: &str = r#"[{"step":"probe","version":1,"params":{}}]"#;
pub const DEFAULT_CONCURRENCY: usize = 8;
pub const DEFAULT_MAX_ATTEMPTS: u64 = 3;
pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {problem}")]
pub struct ConfigError {
    pub variable: &'static str,
    pub problem: String,
}

fn invalid(variable: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        variable,
        problem: problem.into(),
    }
}

/// Which objects a recipe applies to: a key matches when it starts with
/// any of `prefixes` (exactly) and ends with any of `suffixes` (ASCII case
/// ignored: cameras write `.JPG`). An empty list places no condition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyMatch {
    pub prefixes: Vec<String>,
    pub suffixes: Vec<String>,
}

impl KeyMatch {
    pub fn matches(&self, key: &str) -> bool {
        let key = key.as_bytes();
        let prefix = |p: &String| key.starts_with(p.as_bytes());
        let suffix = |s: &String| {
            key.len() >= s.len() && key[key.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes())
        };
        (self.prefixes.is_empty() || self.prefixes.iter().any(prefix))
            && (self.suffixes.is_empty() || self.suffixes.iter().any(suffix))
    }
}

/// A configured recipe, bound to its step, and the objects it applies to.
#[derive(Debug, Clone)]
pub struct RecipeRule {
    /// Its place in `MEDIAONCE_RECIPES`.
    pub index: usize,
    /// Its `name`, or its step's when it has none. Not part of the recipe
    /// hash: renaming a recipe runs nothing again.
    pub name: String,
    /// Set when the recipe runs on another recipe's output file instead of
    /// the upload ([`crate::pipeline`]).
    pub input: Option<ChainedInput>,
    /// Whether `name` was given.
    pub named: bool,
    pub recipe: Recipe,
    /// The recipe hash, computed once.
    pub recipe_hash: String,
    pub key_match: KeyMatch,
    /// The recipe's step with its params parsed, once, at load.
    pub step: Arc<dyn BoundStep>,
}

/// The references table's name when `MEDIAONCE_REFS_TABLE` is not set.
pub fn default_refs_table(table: &str) -> String {
    format!("{table}-refs")
}

#[derive(Debug, Clone)]
pub struct Config {
    pub table: String,
    /// One item per (job, version) reference (DESIGN.md, "References").
    pub refs_table: String,
    /// Where every job's outputs go, whatever bucket its input was in.
    pub output_bucket: String,
    /// Ends with `/` (or is empty).
    pub output_prefix: String,
    pub recipes: Vec<RecipeRule>,
    /// Which recipes feed which, checked at load.
    pub graph: Graph,
    /// The step that runs one span of an `hls-package` job as a job of its
    /// own (`hls-chunk`), bound per chunk; `None` when the registry has
    /// none.
    pub chunk_step: Option<Arc<dyn crate::step::AnyStep>>,
    pub concurrency: usize,
    pub lease: LeasePolicy,
    /// A job that failed this many times is poisoned: not run again.
    pub max_attempts: u64,
    /// No job starts when less than this (plus the slowest configured step's
    /// declared need) remains before the invocation deadline.
    pub deadline_margin: Duration,
    /// The account that must own every bucket mediaonce reads or writes
    /// (S3's `ExpectedBucketOwner` on each call); `None`: not checked.
    pub expected_bucket_owner: Option<String>,
    /// How a job is keyed when S3 has no full-object SHA-256 of its input.
    pub identity: IdentityMode,
    /// Whether a delete marker releases the references of every version of
    /// its key (by default it releases nothing: the versions still exist
    /// and can be restored).
    pub release_on_delete_marker: bool,
    /// How long a job nothing references keeps its outputs before it may be
    /// collected (0: at once, by the release that freed it).
    pub gc_grace: Duration,
    /// The CloudWatch namespace of the batches' EMF metrics; `None`: off.
    pub metrics_namespace: Option<String>,
    /// Where completion events go (a bus name or ARN); `None`: none.
    pub event_bus: Option<String>,
    /// Where chunk messages go (`MEDIAONCE_CHUNK_QUEUE_URL`); `None`: the
    /// queue of the message that split the job.
    pub chunk_queue_url: Option<String>,
    /// The state machine that runs a split (`MEDIAONCE_SPLIT_MACHINE_ARN`);
    /// `None`: the hand-made protocol (until it goes, issue 38).
    pub split_machine_arn: Option<String>,
    /// The Map's `MaxConcurrency` (`MEDIAONCE_SPLIT_MAX_CONCURRENCY`,
    /// default 40; 0 is Step Functions' unbounded).
    pub split_max_concurrency: u32,
}

/// An EventBridge bus: a name (1 to 256 of letters, digits and `._-/`)
/// or an `arn:...:events:...:event-bus/<name>` ARN.
fn event_bus(text: &str) -> Result<String, ConfigError> {
    let name = match text.strip_prefix("arn:") {
        Some(_) => text
            .split_once(":event-bus/")
            .filter(|(head, _)| head.split(':').nth(2) == Some("events"))
            .map(|(_, name)| name),
        None => Some(text),
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/".contains(c);
    match name {
        Some(name) if !name.is_empty() && name.len() <= 256 && name.chars().all(allowed) => {
            Ok(text.to_string())
        }
        _ => Err(invalid(
            ENV_EVENT_BUS,
            format!(
                "{text:?} is not an EventBridge bus name (letters, digits and ._-/) or \
                 event-bus ARN"
            ),
        )),
    }
}

/// A CloudWatch namespace: 1 to 255 of letters, digits and `.-_/#:`, not
/// starting with `AWS/` (reserved for AWS's own).
fn metrics_namespace(text: Option<String>) -> Result<String, ConfigError> {
    let Some(text) = text else {
        return Ok(DEFAULT_NAMESPACE.to_string());
    };
    let text = text.trim();
    let allowed = |c: char| c.is_ascii_alphanumeric() || ".-_/#: ".contains(c);
    if text.len() > 255 || !text.chars().all(allowed) || text.starts_with("AWS/") {
        return Err(invalid(
            ENV_METRICS_NAMESPACE,
            format!(
                "{text:?} is not a CloudWatch namespace (1 to 255 letters, digits, \
                 spaces and .-_/#:, not starting with AWS/)"
            ),
        ));
    }
    Ok(text.to_string())
}

impl Config {
    /// The root recipes that apply to an uploaded object at `key`, in
    /// configured order (the recipes chained to them follow: [`Graph`]).
    pub fn recipes_for(&self, key: &str) -> Vec<&RecipeRule> {
        self.recipes
            .iter()
            .filter(|rule| rule.input.is_none() && rule.key_match.matches(key))
            .collect()
    }

    /// The recipes that take their input from `rule`'s outputs.
    pub fn chained_to(&self, rule: &RecipeRule) -> Vec<&RecipeRule> {
        self.graph
            .children(rule.index)
            .iter()
            .map(|&child| &self.recipes[child])
            .collect()
    }

    /// The recipe `rule` takes its input from, if it is chained.
    pub fn upstream_of(&self, rule: &RecipeRule) -> Option<&RecipeRule> {
        self.graph.parent(rule.index).map(|up| &self.recipes[up])
    }

    /// Reads the process environment.
    pub fn from_env(steps: &StepRegistry) -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok(), steps)
    }

    /// Reads configuration through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        steps: &StepRegistry,
    ) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let table = get(ENV_TABLE)
            .ok_or_else(|| invalid(ENV_TABLE, "is required (the DynamoDB table of job claims)"))?;
        let refs_table = get(ENV_REFS_TABLE).unwrap_or_else(|| default_refs_table(&table));
        // A job key names bytes, not a bucket: the same bytes uploaded to two
        // buckets share one job, so its outputs must have one home that does
        // not depend on which upload ran first.
        let output_bucket = get(ENV_OUTPUT_BUCKET).ok_or_else(|| {
            invalid(
                ENV_OUTPUT_BUCKET,
                "is required (the bucket every job's outputs go to: a job key names the bytes, \
                 not the bucket they were uploaded to, so its outputs need one place)",
            )
        })?;
        let output_prefix = get(ENV_OUTPUT_PREFIX).unwrap_or_else(|| DEFAULT_OUTPUT_PREFIX.into());
        if output_prefix.starts_with('/') || !output_prefix.ends_with('/') {
            return Err(invalid(
                ENV_OUTPUT_PREFIX,
                format!("must end with '/' and not start with one, got {output_prefix:?}"),
            ));
        }
        let recipes = parse_recipes(
            &get(ENV_RECIPES).unwrap_or_else(|| DEFAULT_RECIPES.into()),
            steps,
        )?;
        let graph = recipe_graph(&recipes)?;
        let concurrency = positive(
            ENV_CONCURRENCY,
            get(ENV_CONCURRENCY),
            DEFAULT_CONCURRENCY as u64,
        )? as usize;
        let max_attempts = positive(
            ENV_MAX_ATTEMPTS,
            get(ENV_MAX_ATTEMPTS),
            DEFAULT_MAX_ATTEMPTS,
        )?;
        let lease = LeasePolicy {
            deadline_margin: seconds(
                ENV_LEASE_MARGIN_SECS,
                get(ENV_LEASE_MARGIN_SECS),
                DEFAULT_LEASE_MARGIN,
            )?,
            fixed: seconds(ENV_LEASE_SECS, get(ENV_LEASE_SECS), DEFAULT_FIXED_LEASE)?,
        };
        if lease.fixed.is_zero() {
            return Err(invalid(ENV_LEASE_SECS, "must be more than 0"));
        }
        // Checked here so that a bad value names its variable at start-up;
        // the thumbnail step is built with it (`StepRegistry::builtin_from`).
        crate::steps::thumbnail::max_pixels(get(ENV_MAX_PIXELS).as_deref())
            .map_err(|problem| invalid(ENV_MAX_PIXELS, problem))?;
        let expected_bucket_owner = get(ENV_EXPECTED_BUCKET_OWNER)
            .map(|account| {
                let account = account.trim().to_string();
                if account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit()) {
                    Ok(account)
                } else {
                    Err(invalid(
                        ENV_EXPECTED_BUCKET_OWNER,
                        format!("must be a 12-digit AWS account id, got {account:?}"),
                    ))
                }
            })
            .transpose()?;
        let identity = get(ENV_IDENTITY)
            .map(|text| IdentityMode::parse(&text).map_err(|p| invalid(ENV_IDENTITY, p)))
            .transpose()?
            .unwrap_or_default();
        let release_on_delete_marker =
            match get(ENV_RELEASE_ON_DELETE_MARKER).as_deref().map(str::trim) {
                None | Some("false") => false,
                Some("true") => true,
                Some(other) => {
                    return Err(invalid(
                        ENV_RELEASE_ON_DELETE_MARKER,
                        format!("must be true or false, not {other:?}"),
                    ))
                }
            };
        let gc_grace = match get(ENV_GC_GRACE_SECS) {
            None => DEFAULT_GC_GRACE,
            Some(text) => Duration::from_secs(text.trim().parse().map_err(|_| {
                invalid(
                    ENV_GC_GRACE_SECS,
                    format!("must be a whole number of seconds (0 or more), got {text:?}"),
                )
            })?),
        };
        let metrics_namespace = match get(ENV_METRICS).as_deref().map(str::trim) {
            Some("off") => None,
            None | Some("on") => Some(metrics_namespace(get(ENV_METRICS_NAMESPACE))?),
            Some(other) => {
                return Err(invalid(
                    ENV_METRICS,
                    format!("must be on or off, not {other:?}"),
                ))
            }
        };
        let event_bus = get(ENV_EVENT_BUS)
            .map(|bus| event_bus(bus.trim()))
            .transpose()?;
        let chunk_queue_url = match get(ENV_CHUNK_QUEUE_URL)
            .map(|url| url.trim().to_string())
            .filter(|url| !url.is_empty())
        {
            Some(url) if !url.starts_with("https://") && !url.starts_with("http://") => {
                return Err(invalid(
                    ENV_CHUNK_QUEUE_URL,
                    format!("{url:?} is not an SQS queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>)"),
                ))
            }
            // Step Functions sends the chunk tasks with no message group,
            // and one group would run a split's chunks one at a time.
            Some(url) if crate::queue::is_fifo_queue(&url) => {
                return Err(invalid(
                    ENV_CHUNK_QUEUE_URL,
                    format!("{url:?} is a FIFO queue: a split's chunk tasks need a standard queue"),
                ))
            }
            other => other,
        };
        let split_machine_arn = match get(ENV_SPLIT_MACHINE_ARN)
            .map(|arn| arn.trim().to_string())
            .filter(|arn| !arn.is_empty())
        {
            Some(arn) if crate::executions::executions_prefix(&arn).is_none() => {
                return Err(invalid(
                    ENV_SPLIT_MACHINE_ARN,
                    format!("{arn:?} is not a state machine ARN (arn:aws:states:<region>:<account>:stateMachine:<name>)"),
                ))
            }
            other => other,
        };
        let split_max_concurrency = match get(ENV_SPLIT_MAX_CONCURRENCY) {
            None => 40,
            Some(text) => text.trim().parse::<u32>().map_err(|_| {
                invalid(
                    ENV_SPLIT_MAX_CONCURRENCY,
                    format!("must be a whole number, not {text:?}"),
                )
            })?,
        };
        Ok(Config {
            event_bus,
            chunk_queue_url,
            split_machine_arn,
            split_max_concurrency,
            identity,
            release_on_delete_marker,
            gc_grace,
            metrics_namespace,
            table,
            refs_table,
            output_bucket,
            output_prefix,
            recipes,
            graph,
            chunk_step: steps.get(crate::steps::hls::chunk_job::CHUNK_STEP),
            concurrency,
            lease,
            max_attempts,
            expected_bucket_owner,
            deadline_margin: seconds(
                ENV_DEADLINE_MARGIN_SECS,
                get(ENV_DEADLINE_MARGIN_SECS),
                DEFAULT_DEADLINE_MARGIN,
            )?,
        })
    }

    /// Whether an object is one of our own outputs (the recursion guard).
    pub fn is_own_output(&self, bucket: &str, key: &str) -> bool {
        bucket == self.output_bucket && key.starts_with(&self.output_prefix)
    }

    /// Where this configuration puts a job's outputs:
    /// `s3://<output bucket>/<output prefix><job key>/`.
    pub fn output_location(&self, job_key: &str) -> String {
        format!(
            "s3://{}/{}{}/",
            self.output_bucket, self.output_prefix, job_key
        )
    }
}

/// An `s3://bucket/prefix/` location split into bucket and key prefix;
/// `None` when it is not one.
pub fn split_s3_location(location: &str) -> Option<(&str, &str)> {
    let rest = location.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/')?;
    (!bucket.is_empty() && prefix.ends_with('/')).then_some((bucket, prefix))
}

fn positive(
    variable: &'static str,
    text: Option<String>,
    default: u64,
) -> Result<u64, ConfigError> {
    match text {
        None => Ok(default),
        Some(text) => match text.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(invalid(
                variable,
                format!("must be a positive integer, got {text:?}"),
            )),
        },
    }
}

fn seconds(
    variable: &'static str,
    text: Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match text {
        None => Ok(default),
        Some(text) => text
            .trim()
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| {
                invalid(
                    variable,
                    format!("must be a whole number of seconds, got {text:?}"),
                )
            }),
    }
}

/// Parses `MEDIAONCE_RECIPES`: a JSON array of `{step, version, params, match?}`.
pub fn parse_recipes(text: &str, steps: &StepRegistry) -> Result<Vec<RecipeRule>, ConfigError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| invalid(ENV_RECIPES, format!("is not valid JSON: {e}")))?;
    let items = value.as_array().ok_or_else(|| {
        invalid(
            ENV_RECIPES,
            format!("must be a JSON array, got {}", json_type(&value)),
        )
    })?;
    if items.is_empty() {
        return Err(invalid(ENV_RECIPES, "must name at least one recipe"));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            parse_rule(index, item, steps).map_err(|p| {
                // Named by its place and, when it has one, its step.
                let name = match item.get("step").and_then(Value::as_str) {
                    Some(step) => format!("recipe {index} ({step})"),
                    None => format!("recipe {index}"),
                };
                invalid(ENV_RECIPES, format!("{name}: {p}"))
            })
        })
        .collect()
}

/// The recipes' graph: which feed which, checked (a bad graph names the
/// recipe at fault).
pub fn recipe_graph(recipes: &[RecipeRule]) -> Result<Graph, ConfigError> {
    let nodes: Vec<Node> = recipes
        .iter()
        .map(|rule| Node {
            name: rule.name.clone(),
            named: rule.named,
            input: rule.input.clone(),
            has_match: rule.key_match != KeyMatch::default(),
        })
        .collect();
    Graph::new(&nodes).map_err(|e| invalid(ENV_RECIPES, e.to_string()))
}

fn parse_rule(index: usize, item: &Value, steps: &StepRegistry) -> Result<RecipeRule, String> {
    let mut object = item
        .as_object()
        .cloned()
        .ok_or_else(|| format!("must be an object, got {}", json_type(item)))?;
    let name = match object.remove("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if !name.trim().is_empty() => Some(name),
        Some(other) => {
            return Err(format!(
                "name must be a non-empty string, got {}",
                json_type(&other)
            ))
        }
    };
    let input = match object.remove("input") {
        None | Some(Value::Null) => None,
        Some(value) => Some(chained_input(&value)?),
    };
    let key_match = match object.remove("match") {
        None | Some(Value::Null) => KeyMatch::default(),
        Some(Value::Object(m)) => {
            // A string, or a non-empty array of strings (any of them matches).
            let field = |name: &str| -> Result<Vec<String>, String> {
                let wrong = |what: String| {
                    format!("match.{name} must be a string or a non-empty array of strings, {what}")
                };
                match m.get(name) {
                    None | Some(Value::Null) => Ok(Vec::new()),
                    Some(Value::String(s)) => Ok(vec![s.clone()]),
                    Some(Value::Array(items)) if items.is_empty() => {
                        Err(wrong("got an empty array".into()))
                    }
                    Some(Value::Array(items)) => items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| match item {
                            Value::String(s) => Ok(s.clone()),
                            other => Err(wrong(format!("got {} at [{i}]", json_type(other)))),
                        })
                        .collect(),
                    Some(other) => Err(wrong(format!("got {}", json_type(other)))),
                }
            };
            if let Some(unknown) = m
                .keys()
                .find(|k| !matches!(k.as_str(), "prefix" | "suffix"))
            {
                return Err(format!(
                    "match has an unknown field {unknown:?} (expected prefix, suffix)"
                ));
            }
            KeyMatch {
                prefixes: field("prefix")?,
                suffixes: field("suffix")?,
            }
        }
        Some(other) => {
            return Err(format!(
                "match must be an object, got {}",
                json_type(&other)
            ))
        }
    };
    let recipe = Recipe::from_value(&Value::Object(object)).map_err(|e| e.to_string())?;
    let step = steps.get(&recipe.step).ok_or_else(|| {
        format!(
            "unknown step {:?} (known: {})",
            recipe.step,
            steps.names().join(", ")
        )
    })?;
    let step = step.bind(&recipe.params)?;
    Ok(RecipeRule {
        index,
        named: name.is_some(),
        name: name.unwrap_or_else(|| recipe.step.clone()),
        input,
        recipe_hash: recipe.hash(),
        recipe,
        key_match,
        step,
    })
}

/// A recipe's `input`: `{"recipe": <name>, "file": <output file name>}`.
fn chained_input(value: &Value) -> Result<ChainedInput, String> {
    let object = value
        .as_object()
        .ok_or_else(|| format!("input must be an object, got {}", json_type(value)))?;
    if let Some(unknown) = object
        .keys()
        .find(|k| !matches!(k.as_str(), "recipe" | "file"))
    {
        return Err(format!(
            "input has an unknown field {unknown:?} (expected recipe, file)"
        ));
    }
    let field = |name: &str| match object.get(name) {
        Some(Value::String(text)) if !text.is_empty() => Ok(text.clone()),
        Some(other) => Err(format!(
            "input.{name} must be a non-empty string, got {}",
            json_type(other)
        )),
        None => Err(format!("input.{name} is required")),
    };
    let file = field("file")?;
    // A name in the upstream job's manifest: a path under its prefix.
    if file.starts_with('/') || file.split('/').any(|part| part == ".." || part.is_empty()) {
        return Err(format!(
            "input.file {file:?} must name a file of the upstream job's outputs"
        ));
    }
    Ok(ChainedInput {
        recipe: field("recipe")?,
        file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The configuration from `vars`, with an output bucket unless they name one.
    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        config_exactly(&[&[(ENV_OUTPUT_BUCKET, "out")], vars].concat())
    }

    fn config_exactly(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| map.get(name).cloned(), &StepRegistry::builtin())
    }

    #[test]
    fn defaults() {
        let c = config(&[(ENV_TABLE, "jobs"), (ENV_OUTPUT_BUCKET, "out")]).unwrap();
        assert_eq!(c.output_prefix, "derived/");
        assert_eq!(c.concurrency, 8);
        assert_eq!(c.output_bucket, "out");
        assert_eq!(c.recipes.len(), 1);
        assert_eq!(c.recipes[0].recipe.step, "probe");
        assert_eq!(c.lease, LeasePolicy::default());
        assert_eq!(c.max_attempts, 3);
        assert_eq!(c.deadline_margin, Duration::from_secs(5));
        assert_eq!(c.expected_bucket_owner, None);
        assert_eq!(c.identity, IdentityMode::Auto);
        assert!(!c.release_on_delete_marker);
        assert_eq!(c.gc_grace, Duration::from_secs(86_400));
    }

    #[test]
    fn splits_need_a_state_machine_arn_and_a_standard_chunk_queue() {
        let c = config(&[(ENV_TABLE, "t")]).unwrap();
        assert_eq!((c.split_machine_arn, c.split_max_concurrency), (None, 40));
        let machine = "arn:aws:states:us-east-1:123456789012:stateMachine:split";
        let c = config(&[
            (ENV_TABLE, "t"),
            (ENV_SPLIT_MACHINE_ARN, machine),
            (ENV_SPLIT_MAX_CONCURRENCY, "0"),
        ])
        .unwrap();
        assert_eq!(c.split_machine_arn.as_deref(), Some(machine));
        assert_eq!(c.split_max_concurrency, 0);
        for (variable, value) in [
            (
                ENV_SPLIT_MACHINE_ARN,
                "arn:aws:sqs:us-east-1:123456789012:split",
            ),
            (ENV_SPLIT_MAX_CONCURRENCY, "many"),
            (
                ENV_CHUNK_QUEUE_URL,
                "https://sqs.us-east-1.amazonaws.com/1/chunks.fifo",
            ),
        ] {
            let e = config(&[(ENV_TABLE, "t"), (variable, value)]).unwrap_err();
            assert_eq!(e.variable, variable, "{e}");
        }
    }

    #[test]
    fn errors_name_the_variable() {
        assert_eq!(config(&[]).unwrap_err().variable, ENV_TABLE);
        let e = config(&[(ENV_TABLE, "t"), (ENV_CONCURRENCY, "0")]).unwrap_err();
        assert_eq!(e.variable, ENV_CONCURRENCY);
        let e = config(&[(ENV_TABLE, "t"), (ENV_MAX_ATTEMPTS, "-1")]).unwrap_err();
        assert_eq!(e.variable, ENV_MAX_ATTEMPTS);
        let e = config(&[(ENV_TABLE, "t"), (ENV_OUTPUT_PREFIX, "derived")]).unwrap_err();
        assert_eq!(e.variable, ENV_OUTPUT_PREFIX);
        let e = config(&[(ENV_TABLE, "t"), (ENV_LEASE_SECS, "soon")]).unwrap_err();
        assert_eq!(e.variable, ENV_LEASE_SECS);
        let e = config(&[(ENV_TABLE, "t"), (ENV_MAX_PIXELS, "0")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MEDIAONCE_MAX_PIXELS: must be a positive integer, got \"0\""
        );
        let e = config(&[(ENV_TABLE, "t"), (ENV_EXPECTED_BUCKET_OWNER, "12345")]).unwrap_err();
        assert_eq!(e.variable, ENV_EXPECTED_BUCKET_OWNER);
        let c = config(&[
            (ENV_TABLE, "t"),
            (ENV_EXPECTED_BUCKET_OWNER, "123456789012"),
        ])
        .unwrap();
        assert_eq!(c.expected_bucket_owner.as_deref(), Some("123456789012"));
        let e = config(&[(ENV_TABLE, "t"), (ENV_IDENTITY, "crc64")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MEDIAONCE_IDENTITY: must be checksum, content or auto, not \"crc64\""
        );
        let c = config(&[(ENV_TABLE, "t"), (ENV_IDENTITY, "content")]).unwrap();
        assert_eq!(c.identity, IdentityMode::Content);
        let e = config(&[(ENV_TABLE, "t"), (ENV_RELEASE_ON_DELETE_MARKER, "yes")]).unwrap_err();
        assert_eq!(e.variable, ENV_RELEASE_ON_DELETE_MARKER);
        let c = config(&[(ENV_TABLE, "t"), (ENV_RELEASE_ON_DELETE_MARKER, "true")]).unwrap();
        assert!(c.release_on_delete_marker);
        let e = config(&[(ENV_TABLE, "t"), (ENV_GC_GRACE_SECS, "-1")]).unwrap_err();
        assert_eq!(e.variable, ENV_GC_GRACE_SECS);
        let c = config(&[(ENV_TABLE, "t"), (ENV_GC_GRACE_SECS, "0")]).unwrap();
        assert_eq!(c.gc_grace, Duration::ZERO);
        assert_eq!(c.metrics_namespace.as_deref(), Some("mediaonce"));
        let c = config(&[(ENV_TABLE, "t"), (ENV_METRICS, "off")]).unwrap();
        assert_eq!(c.metrics_namespace, None);
        let c = config(&[(ENV_TABLE, "t"), (ENV_METRICS_NAMESPACE, "media/prod")]).unwrap();
        assert_eq!(c.metrics_namespace.as_deref(), Some("media/prod"));
        for (variable, value) in [
            (ENV_METRICS, "maybe"),
            (ENV_METRICS_NAMESPACE, "AWS/Lambda"),
            (ENV_METRICS_NAMESPACE, "bad\nname"),
        ] {
            let e = config(&[(ENV_TABLE, "t"), (variable, value)]).unwrap_err();
            assert_eq!(e.variable, variable);
        }
        let e = config(&[
            (ENV_TABLE, "t"),
            (ENV_RECIPES, r#"[{"step":"nope","version":1,"params":{}}]"#),
        ])
        .unwrap_err();
        assert_eq!(e.variable, ENV_RECIPES);
        assert!(e.problem.contains("unknown step \"nope\""), "{}", e.problem);
        let e = config(&[
            (ENV_TABLE, "t"),
            (ENV_RECIPES, r#"[{"step":"probe","version":0,"params":{}}]"#),
        ])
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("MEDIAONCE_RECIPES: recipe 0 (probe): "),
            "{e}"
        );
    }

    #[test]
    fn match_takes_a_string_or_a_list_and_suffixes_ignore_case() {
        let c = config(&[
            (ENV_TABLE, "t"),
            (
                ENV_RECIPES,
                r#"[{"step":"probe","version":1,"params":{},
                     "match":{"prefix":["in/","up/"],"suffix":[".jpg",".jpeg",".png"]}}]"#,
            ),
        ])
        .unwrap();
        let m = &c.recipes[0].key_match;
        for key in ["in/a.jpg", "up/b.JPG", "in/c.Jpeg", "up/d.PNG"] {
            assert!(m.matches(key), "{key}");
        }
        // Prefixes compare exactly; a suffix must be whole.
        for key in [
            "IN/a.jpg",
            "out/a.jpg",
            "in/a.gif",
            "in/jpg",
            "in/a.jpg.txt",
        ] {
            assert!(!m.matches(key), "{key}");
        }
        // A multi-byte key shorter or longer than a suffix never panics.
        assert!(!m.matches("in/é"));
        assert!(!m.matches("up/写真.heic"));
    }

    #[test]
    fn bad_match_fields_name_the_recipe_and_the_field() {
        for (matcher, expected) in [
            (r#"{"suffix":[]}"#, "match.suffix must be a string or a non-empty array of strings, got an empty array"),
            (r#"{"suffix":[".jpg",3]}"#, "match.suffix must be a string or a non-empty array of strings, got a number at [1]"),
            (r#"{"prefix":{"a":1}}"#, "match.prefix must be a string or a non-empty array of strings, got an object"),
            (r#"{"suffixes":".jpg"}"#, "match has an unknown field \"suffixes\" (expected prefix, suffix)"),
        ] {
            let recipes = format!(
                r#"[{{"step":"probe","version":1,"params":{{}}}},
                    {{"step":"thumbnail","version":1,"params":{{"sizes":[64]}},"match":{matcher}}}]"#
            );
            let e = config(&[(ENV_TABLE, "t"), (ENV_RECIPES, &recipes)]).unwrap_err();
            assert_eq!(e.variable, ENV_RECIPES);
            assert_eq!(e.problem, format!("recipe 1 (thumbnail): {expected}"), "{matcher}");
        }
    }

    #[test]
    fn match_selects_by_prefix_and_suffix() {
        let c = config(&[
            (ENV_TABLE, "t"),
            (ENV_RECIPES, r#"[{"step":"probe","version":1,"params":{},"match":{"prefix":"in/","suffix":".jpg"}}]"#),
        ])
        .unwrap();
        let m = &c.recipes[0].key_match;
        assert!(m.matches("in/a.jpg"));
        assert!(!m.matches("in/a.png"));
        assert!(!m.matches("out/a.jpg"));
    }

    #[test]
    fn recursion_guard_only_in_the_output_bucket() {
        let same = config(&[(ENV_TABLE, "t"), (ENV_OUTPUT_BUCKET, "media")]).unwrap();
        assert!(same.is_own_output("media", "derived/abc/probe.json"));
        assert!(!same.is_own_output("media", "uploads/derived/x"));
        let separate = config(&[(ENV_TABLE, "t"), (ENV_OUTPUT_BUCKET, "out")]).unwrap();
        assert!(!separate.is_own_output("media", "derived/abc/probe.json"));
        assert!(separate.is_own_output("out", "derived/abc/probe.json"));
        assert_eq!(separate.output_location("k"), "s3://out/derived/k/");
    }

    #[test]
    fn the_output_bucket_is_required_and_says_why() {
        let e = config_exactly(&[(ENV_TABLE, "t")]).unwrap_err();
        assert_eq!(e.variable, ENV_OUTPUT_BUCKET);
        assert!(e.problem.contains("a job key names the bytes"), "{e}");
    }

    #[test]
    fn s3_locations_split_into_bucket_and_prefix() {
        assert_eq!(
            split_s3_location("s3://out/derived/k/"),
            Some(("out", "derived/k/"))
        );
        assert_eq!(split_s3_location("s3://out/k/"), Some(("out", "k/")));
        for bad in [
            "out/derived/k/",
            "s3:///k/",
            "s3://out",
            "s3://out/derived/k",
        ] {
            assert_eq!(split_s3_location(bad), None, "{bad}");
        }
    }

    /// The pipeline of the pipelines issue, as its README documents it.
    const PIPELINE: &str = r#"[
      {"name": "poster", "step": "poster", "version": 1, "params": {"at": 0.1}, "match": {"suffix": [".mp4", ".mov"]}},
      {"name": "poster-thumbs", "step": "thumbnail", "version": 1, "params": {"widths": [320, 1280]}, "input": {"recipe": "poster", "file": "poster.jpg"}},
      {"name": "hls", "step": "hls-package", "version": 1, "params": {"ladder": ["1080", "720", "360"]}, "match": {"suffix": [".mp4", ".mov"]}}
    ]"#;

    #[test]
    fn a_pipeline_loads_with_its_graph() {
        let c = config(&[(ENV_TABLE, "t"), (ENV_RECIPES, PIPELINE)]).unwrap();
        let names: Vec<&str> = c.recipes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["poster", "poster-thumbs", "hls"]);
        // Uploads start the roots; the chained recipe follows its root.
        let roots: Vec<&str> = c
            .recipes_for("v/a.MOV")
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(roots, ["poster", "hls"]);
        assert!(c.recipes_for("a.jpg").is_empty());
        let chained: Vec<&str> = c
            .chained_to(&c.recipes[0])
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(chained, ["poster-thumbs"]);
        assert_eq!(c.upstream_of(&c.recipes[1]).map(|r| r.index), Some(0));
        // A name is not hashed: the recipe's key is the unnamed one's.
        let unnamed = config(&[
            (ENV_TABLE, "t"),
            (
                ENV_RECIPES,
                r#"[{"step": "thumbnail", "version": 1, "params": {"widths": [320, 1280]}}]"#,
            ),
        ])
        .unwrap();
        assert_eq!(unnamed.recipes[0].recipe_hash, c.recipes[1].recipe_hash);
        assert_eq!(unnamed.recipes[0].name, "thumbnail");
    }

    #[test]
    fn a_bad_pipeline_fails_start_up_naming_the_recipe() {
        let bad = |recipes: &str| config(&[(ENV_TABLE, "t"), (ENV_RECIPES, recipes)]).unwrap_err();
        let missing = bad(&PIPELINE.replace(r#""recipe": "poster""#, r#""recipe": "frame""#));
        assert_eq!(missing.variable, ENV_RECIPES);
        assert_eq!(
            missing.problem,
            "recipe 1 (poster-thumbs): input.recipe \"frame\" names no recipe"
        );
        let twice = bad(&PIPELINE.replace(r#""name": "hls""#, r#""name": "poster""#));
        assert!(
            twice.problem.starts_with("recipe 2 (poster): the name"),
            "{twice}"
        );
        let matched = bad(&PIPELINE.replace(
            r#""input": {"recipe": "poster", "file": "poster.jpg"}"#,
            r#""input": {"recipe": "poster", "file": "poster.jpg"}, "match": {"suffix": ".jpg"}"#,
        ));
        assert!(matched.problem.contains("no match of its own"), "{matched}");
        let escape = bad(&PIPELINE.replace("poster.jpg", "../x.jpg"));
        assert!(escape.problem.contains("must name a file"), "{escape}");
        let unknown = bad(&PIPELINE.replace(
            r#""file": "poster.jpg""#,
            r#""file": "poster.jpg", "bucket": "b""#,
        ));
        assert!(
            unknown.problem.contains("unknown field \"bucket\""),
            "{unknown}"
        );
    }

    #[test]
    fn the_event_bus_is_a_name_or_an_arn() {
        let bus = |text: &str| config(&[(ENV_TABLE, "t"), (ENV_EVENT_BUS, text)]);
        assert_eq!(config(&[(ENV_TABLE, "t")]).unwrap().event_bus, None);
        assert_eq!(
            bus("default").unwrap().event_bus.as_deref(),
            Some("default")
        );
        let arn = "arn:aws:events:eu-west-1:123456789012:event-bus/media";
        assert_eq!(bus(arn).unwrap().event_bus.as_deref(), Some(arn));
        for bad in ["media bus", "arn:aws:sqs:eu-west-1:123456789012:q"] {
            let e = bus(bad).unwrap_err();
            assert_eq!(e.variable, ENV_EVENT_BUS, "{bad}");
        }
    }
}
