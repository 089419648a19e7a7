//! The ledger in DynamoDB: each [`LedgerTable`] call is one request.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{TransactWriteItem, Update};

use crate::identity::{attr as cache_attr, ObjectVersion};
use crate::references::{attr as ref_attr, RefChange, VersionName, VersionRefs};

use super::{
    attr, Claim, ClaimRequest, Conditional, Finish, JobRow, JobStatus, LedgerError, LedgerTable,
    RefWrite,
};

type Item = HashMap<String, AttributeValue>;

impl JobRow {
    /// Reads a row, naming the attribute that is missing or malformed.
    pub fn from_item(item: &Item) -> Result<Self, String> {
        let string = |name: &str| -> Result<String, String> {
            match item.get(name) {
                Some(AttributeValue::S(s)) => Ok(s.clone()),
                Some(_) => Err(format!("attribute {name} is not a string")),
                None => Err(format!("attribute {name} is missing")),
            }
        };
        let number = |name: &str| -> Result<u64, String> {
            match item.get(name) {
                Some(AttributeValue::N(n)) => n
                    .parse()
                    .map_err(|_| format!("attribute {name} is not a non-negative integer: {n}")),
                Some(_) => Err(format!("attribute {name} is not a number")),
                None => Err(format!("attribute {name} is missing")),
            }
        };
        let status_text = string(attr::STATUS)?;
        let status = JobStatus::parse(&status_text)
            .ok_or_else(|| format!("attribute status has unknown value {status_text:?}"))?;
        let attempts = number(attr::ATTEMPTS)?;
        Ok(JobRow {
            job_key: string(attr::JOB_KEY)?,
            step: string(attr::STEP)?,
            input_hash: string(attr::INPUT_HASH)?,
            status,
            lease_until_ms: number(attr::LEASE_UNTIL_MS)?,
            attempts,
            owner: string(attr::OWNER)?,
            output_prefix: string(attr::OUTPUT_PREFIX)?,
            error: match item.get(attr::ERROR) {
                None => None,
                Some(AttributeValue::S(error)) => Some(error.clone()),
                Some(_) => return Err(format!("attribute {} is not a string", attr::ERROR)),
            },
            updated_at_ms: number(attr::UPDATED_AT_MS)?,
            failures: match item.get(attr::FAILURES) {
                Some(_) => number(attr::FAILURES)?,
                // Written before failures were counted apart, when every
                // run counted: a failed row's attempts, as then.
                None if status == JobStatus::Failed => attempts,
                None => 0,
            },
            permanent: match item.get(attr::PERMANENT) {
                None => false,
                Some(AttributeValue::Bool(permanent)) => *permanent,
                Some(_) => return Err(format!("attribute {} is not a boolean", attr::PERMANENT)),
            },
            refs: match item.get(ref_attr::REFS) {
                None => None,
                Some(_) => Some(number(ref_attr::REFS)?),
            },
            released_at_ms: match item.get(ref_attr::RELEASED_AT_MS) {
                None => None,
                Some(_) => Some(number(ref_attr::RELEASED_AT_MS)?),
            },
        })
    }

    pub fn to_item(&self) -> Item {
        let mut item = Item::from([
            (attr::JOB_KEY.into(), s(&self.job_key)),
            (attr::STEP.into(), s(&self.step)),
            (attr::INPUT_HASH.into(), s(&self.input_hash)),
            (attr::STATUS.into(), s(self.status.as_str())),
            (attr::LEASE_UNTIL_MS.into(), n(self.lease_until_ms)),
            (attr::ATTEMPTS.into(), n(self.attempts)),
            (attr::OWNER.into(), s(&self.owner)),
            (attr::OUTPUT_PREFIX.into(), s(&self.output_prefix)),
            (attr::UPDATED_AT_MS.into(), n(self.updated_at_ms)),
        ]);
        if let Some(error) = &self.error {
            item.insert(attr::ERROR.into(), s(error));
        }
        item.insert(attr::FAILURES.into(), n(self.failures));
        if self.permanent {
            item.insert(attr::PERMANENT.into(), AttributeValue::Bool(true));
        }
        if let Some(refs) = self.refs {
            item.insert(ref_attr::REFS.into(), n(refs));
        }
        if let Some(at) = self.released_at_ms {
            item.insert(ref_attr::RELEASED_AT_MS.into(), n(at));
        }
        item
    }
}

/// A version row as read; `Err` names the malformed attribute.
fn version_refs_from_item(item: &Item) -> Result<VersionRefs, String> {
    let job_keys = match item.get(ref_attr::JOB_KEYS) {
        None => Default::default(),
        Some(AttributeValue::Ss(keys)) => keys.iter().cloned().collect(),
        Some(_) => {
            return Err(format!(
                "attribute {} is not a string set",
                ref_attr::JOB_KEYS
            ))
        }
    };
    let sequencer = match item.get(ref_attr::SEQUENCER) {
        None => None,
        Some(AttributeValue::S(text)) => Some(text.clone()),
        Some(_) => return Err(format!("attribute {} is not a string", ref_attr::SEQUENCER)),
    };
    let gen = match item.get(ref_attr::GEN) {
        Some(AttributeValue::N(text)) => text
            .parse()
            .map_err(|_| format!("attribute {} is not a count: {text}", ref_attr::GEN))?,
        _ => {
            return Err(format!(
                "attribute {} is missing or not a number",
                ref_attr::GEN
            ))
        }
    };
    let deleted = matches!(
        item.get(ref_attr::DELETED),
        Some(AttributeValue::Bool(true))
    );
    let etag = match item.get(ref_attr::ETAG) {
        None => None,
        Some(AttributeValue::S(text)) => Some(text.clone()),
        Some(_) => return Err(format!("attribute {} is not a string", ref_attr::ETAG)),
    };
    Ok(VersionRefs {
        job_keys,
        sequencer,
        etag,
        gen,
        deleted,
    })
}

/// The version row's update in a reference transaction.
fn version_update(
    table: &str,
    version: &VersionName,
    change: &RefChange,
    now_ms: u64,
) -> Result<Update, String> {
    let next = &change.next;
    let mut set = vec![
        "#bucket = :bucket",
        "#object_key = :object_key",
        "#version_id = :version_id",
        "#gen = :gen",
        "#deleted = :deleted",
    ];
    let mut remove = Vec::new();
    let mut update = Update::builder()
        .table_name(table)
        .key(attr::JOB_KEY, s(&version.row_key()))
        .expression_attribute_names("#bucket", ref_attr::BUCKET)
        .expression_attribute_names("#object_key", ref_attr::OBJECT_KEY)
        .expression_attribute_names("#version_id", ref_attr::VERSION_ID)
        .expression_attribute_names("#gen", ref_attr::GEN)
        .expression_attribute_names("#deleted", ref_attr::DELETED)
        .expression_attribute_names("#job_keys", ref_attr::JOB_KEYS)
        .expression_attribute_names("#sequencer", ref_attr::SEQUENCER)
        .expression_attribute_names("#expires_at", ref_attr::EXPIRES_AT)
        .expression_attribute_names("#etag", ref_attr::ETAG)
        .expression_attribute_values(":bucket", s(&version.bucket))
        .expression_attribute_values(":object_key", s(&version.key))
        .expression_attribute_values(
            ":version_id",
            s(version.version_id.as_deref().unwrap_or("null")),
        )
        .expression_attribute_values(":gen", n(next.gen))
        .expression_attribute_values(":deleted", AttributeValue::Bool(next.deleted))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
    if next.job_keys.is_empty() {
        remove.push("#job_keys");
    } else {
        set.push("#job_keys = :job_keys");
        update = update.expression_attribute_values(
            ":job_keys",
            AttributeValue::Ss(next.job_keys.iter().cloned().collect()),
        );
    }
    match &next.sequencer {
        Some(sequencer) => {
            set.push("#sequencer = :sequencer");
            update = update.expression_attribute_values(":sequencer", s(sequencer));
        }
        None => remove.push("#sequencer"),
    }
    match &next.etag {
        Some(etag) => {
            set.push("#etag = :etag");
            update = update.expression_attribute_values(":etag", s(etag));
        }
        None => remove.push("#etag"),
    }
    if next.deleted {
        set.push("#expires_at = :expires_at");
        update = update.expression_attribute_values(
            ":expires_at",
            n(now_ms / 1000 + crate::references::TOMBSTONE_SECS),
        );
    } else {
        remove.push("#expires_at");
    }
    let mut expression = format!("SET {}", set.join(", "));
    if !remove.is_empty() {
        expression.push_str(&format!(" REMOVE {}", remove.join(", ")));
    }
    update = update.update_expression(expression);
    update = match change.seen_gen {
        None => update
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", attr::JOB_KEY),
        Some(gen) => update
            .condition_expression("#gen = :seen_gen")
            .expression_attribute_values(":seen_gen", n(gen)),
    };
    update.build().map_err(|e| e.to_string())
}

/// A job's count update in a reference transaction.
fn count_update(table: &str, job_key: &str, add: bool, now_ms: u64) -> Result<Update, String> {
    let update = Update::builder()
        .table_name(table)
        .key(attr::JOB_KEY, s(job_key))
        .expression_attribute_names("#refs", ref_attr::REFS)
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
    let update = if add {
        update
            .update_expression("ADD #refs :one")
            .condition_expression("#status = :done AND attribute_exists(#refs)")
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":done", s(JobStatus::Done.as_str()))
    } else {
        update
            .update_expression("ADD #refs :minus_one SET #released = :now")
            .condition_expression("#refs > :zero")
            .expression_attribute_names("#released", ref_attr::RELEASED_AT_MS)
            .expression_attribute_values(":minus_one", AttributeValue::N("-1".into()))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":now", n(now_ms))
    };
    update.build().map_err(|e| e.to_string())
}

fn s(text: &str) -> AttributeValue {
    AttributeValue::S(text.to_string())
}

fn n(number: u64) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

/// Job rows in a DynamoDB table (partition key `job_key`, a string).
#[derive(Debug, Clone)]
pub struct DynamoDbTable {
    client: Client,
    table: String,
}

impl DynamoDbTable {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoDbTable {
            client,
            table: table.into(),
        }
    }

    fn service_error<E>(&self, operation: &'static str, err: SdkError<E>) -> LedgerError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        LedgerError::Service {
            operation,
            table: self.table.clone(),
            message: crate::aws::describe_error(&err),
            kind: crate::error::ErrorKind::of_sdk(&err),
        }
    }

    fn version_row(&self, row_key: &str, item: &Item) -> Result<VersionRefs, LedgerError> {
        version_refs_from_item(item).map_err(|problem| LedgerError::MalformedRow {
            table: self.table.clone(),
            job_key: row_key.to_string(),
            problem,
        })
    }

    fn row(&self, job_key: &str, item: &Item) -> Result<JobRow, LedgerError> {
        JobRow::from_item(item).map_err(|problem| LedgerError::MalformedRow {
            table: self.table.clone(),
            job_key: job_key.to_string(),
            problem,
        })
    }

    /// A failed condition, with the row DynamoDB returned (ALL_OLD).
    fn rejected<T>(
        &self,
        job_key: &str,
        item: Option<&Item>,
    ) -> Result<Conditional<T>, LedgerError> {
        Ok(Conditional::Rejected(
            item.map(|i| self.row(job_key, i)).transpose()?,
        ))
    }

    /// An UpdateItem's outcome: applied, with the attributes it returned; or
    /// rejected, with the row that failed the condition.
    fn update_outcome<T>(
        &self,
        job_key: &str,
        result: Result<
            aws_sdk_dynamodb::operation::update_item::UpdateItemOutput,
            SdkError<UpdateItemError>,
        >,
    ) -> Result<Result<Option<Item>, Conditional<T>>, LedgerError> {
        match result {
            Ok(output) => Ok(Ok(output.attributes)),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    Ok(Err(self.rejected(job_key, failed.item())?))
                }
                _ => Err(self.service_error("UpdateItem", err)),
            },
        }
    }
}

#[async_trait::async_trait]
impl LedgerTable for DynamoDbTable {
    fn name(&self) -> &str {
        &self.table
    }

    async fn get(&self, job_key: &str) -> Result<Option<JobRow>, LedgerError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(job_key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.service_error("GetItem", e))?;
        output
            .item()
            .map(|item| self.row(job_key, item))
            .transpose()
    }

    async fn put_new(&self, row: &JobRow) -> Result<Conditional<()>, LedgerError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(row.to_item()))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", attr::JOB_KEY)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(Conditional::Applied(())),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    self.rejected(&row.job_key, failed.item())
                }
                _ => Err(self.service_error("PutItem", err)),
            },
        }
    }

    async fn take_over(
        &self,
        seen: &JobRow,
        request: &ClaimRequest,
    ) -> Result<Conditional<u64>, LedgerError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&request.job_key))
            .update_expression(
                "SET #status = :running, #owner = :owner, #lease = :lease, #attempts = #attempts + :one, \
                 #updated = :now, #step = :step, #input = :input, #refs = if_not_exists(#refs, :zero)",
            )
            .condition_expression("#owner = :seen_owner AND #status = :seen_status")
            .expression_attribute_names("#refs", ref_attr::REFS)
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#lease", attr::LEASE_UNTIL_MS)
            .expression_attribute_names("#attempts", attr::ATTEMPTS)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_names("#step", attr::STEP)
            .expression_attribute_names("#input", attr::INPUT_HASH)
            .expression_attribute_values(":running", s(JobStatus::Running.as_str()))
            .expression_attribute_values(":owner", s(&request.owner))
            .expression_attribute_values(":lease", n(request.lease_until_ms))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":now", n(request.now_ms))
            .expression_attribute_values(":step", s(&request.step))
            .expression_attribute_values(":input", s(&request.input_hash))
            .expression_attribute_values(":seen_owner", s(&seen.owner))
            .expression_attribute_values(":seen_status", s(seen.status.as_str()))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        Ok(match self.update_outcome(&request.job_key, update)? {
            Ok(new) => {
                let attempts = match new.as_ref().and_then(|a| a.get(attr::ATTEMPTS)) {
                    Some(AttributeValue::N(n)) => n.parse().unwrap_or(seen.attempts + 1),
                    _ => seen.attempts + 1,
                };
                Conditional::Applied(attempts)
            }
            Err(rejected) => rejected,
        })
    }

    async fn finish(
        &self,
        claim: &Claim,
        finish: Finish<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&claim.job_key))
            .condition_expression("#owner = :me AND #status = :running")
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_names("#error", attr::ERROR)
            .expression_attribute_values(":me", s(&claim.owner))
            .expression_attribute_values(":running", s(JobStatus::Running.as_str()))
            .expression_attribute_values(":now", n(now_ms))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let update = match finish {
            Finish::Done => update
                .update_expression("SET #status = :status, #updated = :now REMOVE #error")
                .expression_attribute_values(":status", s(JobStatus::Done.as_str())),
            Finish::Failed { error, permanent } => {
                let update = update
                    .expression_attribute_names("#failures", attr::FAILURES)
                    .expression_attribute_values(":status", s(JobStatus::Failed.as_str()))
                    .expression_attribute_values(":error", s(error))
                    .expression_attribute_values(":zero", n(0))
                    .expression_attribute_values(":one", n(1));
                let counted = "SET #status = :status, #updated = :now, #error = :error, \
                               #failures = if_not_exists(#failures, :zero) + :one";
                if permanent {
                    update
                        .update_expression(format!("{counted}, #permanent = :true"))
                        .expression_attribute_names("#permanent", attr::PERMANENT)
                        .expression_attribute_values(":true", AttributeValue::Bool(true))
                } else {
                    update.update_expression(counted)
                }
            }
        };
        Ok(
            match self.update_outcome(&claim.job_key, update.send().await)? {
                Ok(_) => Conditional::Applied(()),
                Err(rejected) => rejected,
            },
        )
    }

    async fn release(&self, claim: &Claim) -> Result<Conditional<()>, LedgerError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&claim.job_key))
            .condition_expression("#owner = :me AND #status = :running")
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_values(":me", s(&claim.owner))
            .expression_attribute_values(":running", s(JobStatus::Running.as_str()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Conditional::Applied(())),
            Err(err) => match err.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(failed)) => {
                    self.rejected(&claim.job_key, failed.item())
                }
                _ => Err(self.service_error("DeleteItem", err)),
            },
        }
    }

    async fn reset_attempts(
        &self,
        job_key: &str,
        now_ms: u64,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(job_key))
            .update_expression(
                "SET #attempts = :zero, #failures = :zero, #updated = :now REMOVE #permanent",
            )
            .condition_expression("#status = :failed OR (#status = :running AND #lease <= :now)")
            .expression_attribute_names("#attempts", attr::ATTEMPTS)
            .expression_attribute_names("#failures", attr::FAILURES)
            .expression_attribute_names("#permanent", attr::PERMANENT)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_names("#lease", attr::LEASE_UNTIL_MS)
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":failed", s(JobStatus::Failed.as_str()))
            .expression_attribute_values(":running", s(JobStatus::Running.as_str()))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match self.update_outcome(job_key, update)? {
            Ok(Some(old)) => Ok(Conditional::Applied(self.row(job_key, &old)?)),
            // Applied but nothing came back: there was no row (cannot pass
            // the condition), so this does not happen; say so plainly.
            Ok(None) => Ok(Conditional::Rejected(None)),
            Err(rejected) => Ok(rejected),
        }
    }

    async fn get_input_hash(&self, version: &ObjectVersion) -> Result<Option<String>, LedgerError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&version.row_key()))
            .send()
            .await
            .map_err(|e| self.service_error("GetItem", e))?;
        Ok(output
            .item()
            .filter(|item| cache_row_is_of(item, version))
            .and_then(|item| item.get(attr::INPUT_HASH)?.as_s().ok().cloned()))
    }

    async fn put_input_hash(
        &self,
        version: &ObjectVersion,
        input_hash: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(cache_row(version, input_hash, now_ms)))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| self.service_error("PutItem", e))
    }

    async fn forget_input_hash(&self, version: &ObjectVersion) -> Result<(), LedgerError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&version.row_key()))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| self.service_error("DeleteItem", e))
    }

    async fn get_version_refs(
        &self,
        version: &VersionName,
    ) -> Result<Option<VersionRefs>, LedgerError> {
        let row_key = version.row_key();
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&row_key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.service_error("GetItem", e))?;
        output
            .item()
            .map(|item| self.version_row(&row_key, item))
            .transpose()
    }

    async fn change_refs(
        &self,
        version: &VersionName,
        change: &RefChange,
        now_ms: u64,
    ) -> Result<RefWrite, LedgerError> {
        let malformed = |problem: String| LedgerError::MalformedRow {
            table: self.table.clone(),
            job_key: version.row_key(),
            problem,
        };
        let mut items = vec![TransactWriteItem::builder()
            .update(version_update(&self.table, version, change, now_ms).map_err(malformed)?)
            .build()];
        let jobs: Vec<&String> = change.add.iter().chain(&change.remove).collect();
        for (index, job_key) in jobs.iter().enumerate() {
            let add = index < change.add.len();
            items.push(
                TransactWriteItem::builder()
                    .update(count_update(&self.table, job_key, add, now_ms).map_err(malformed)?)
                    .build(),
            );
        }
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(RefWrite::Applied),
            Err(err) => err,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
            err.as_service_error()
        else {
            return Err(self.service_error("TransactWriteItems", err));
        };
        let reasons = cancelled.cancellation_reasons();
        let failed = |index: usize| {
            reasons
                .get(index)
                .is_some_and(|r| r.code() == Some("ConditionalCheckFailed"))
        };
        if reasons.is_empty()
            || reasons
                .iter()
                .any(|r| !matches!(r.code(), None | Some("None" | "ConditionalCheckFailed")))
        {
            // A conflict with another transaction, throttling: retried by
            // the message like any transient failure.
            return Err(self.service_error("TransactWriteItems", err));
        }
        let version_state = if failed(0) {
            let row_key = version.row_key();
            Some(
                reasons[0]
                    .item()
                    .map(|item| self.version_row(&row_key, item))
                    .transpose()?,
            )
        } else {
            None
        };
        let mut refused = Vec::new();
        for (index, job_key) in jobs.iter().enumerate() {
            if failed(index + 1) {
                let row = reasons[index + 1]
                    .item()
                    .map(|item| self.row(job_key, item))
                    .transpose()?;
                refused.push((job_key.to_string(), row));
            }
        }
        Ok(RefWrite::Cancelled {
            version: version_state,
            refused,
        })
    }
}

/// A hash cache row: the version in full (so that a read can check it is
/// the one asked for) and its hash.
fn cache_row(version: &ObjectVersion, input_hash: &str, now_ms: u64) -> Item {
    let mut item: Item = [
        (attr::JOB_KEY, s(&version.row_key())),
        (attr::INPUT_HASH, s(input_hash)),
        (cache_attr::BUCKET, s(&version.bucket)),
        (cache_attr::OBJECT_KEY, s(&version.key)),
        (
            cache_attr::VERSION_ID,
            s(version.version_id.as_deref().unwrap_or("null")),
        ),
        (cache_attr::ETAG, s(&version.etag)),
        (cache_attr::SIZE, n(version.size)),
        (cache_attr::COMPUTED_AT_MS, n(now_ms)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect();
    if let Some(crc) = &version.crc64nvme {
        item.insert(cache_attr::CRC64NVME.to_string(), s(crc));
    }
    item
}

/// Whether a cache row names exactly `version`.
fn cache_row_is_of(item: &Item, version: &ObjectVersion) -> bool {
    let mut expected = cache_row(version, "", 0);
    for ignored in [attr::INPUT_HASH, cache_attr::COMPUTED_AT_MS] {
        expected.remove(ignored);
    }
    expected
        .iter()
        .all(|(name, value)| item.get(name) == Some(value))
        && (version.crc64nvme.is_some() || !item.contains_key(cache_attr::CRC64NVME))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> JobRow {
        JobRow {
            job_key: "k".into(),
            step: "probe".into(),
            input_hash: "i".into(),
            status: JobStatus::Failed,
            lease_until_ms: 42,
            attempts: 1,
            owner: "o".into(),
            output_prefix: "derived/k/".into(),
            error: Some("boom".into()),
            updated_at_ms: 1,
            failures: 1,
            permanent: true,
            refs: None,
            released_at_ms: None,
        }
    }

    #[test]
    fn rows_round_trip_through_items() {
        let original = row();
        assert_eq!(JobRow::from_item(&original.to_item()), Ok(original));
    }

    #[test]
    fn malformed_rows_name_the_attribute() {
        let mut item = row().to_item();
        item.remove(attr::OWNER);
        assert_eq!(
            JobRow::from_item(&item),
            Err("attribute owner is missing".into())
        );
        item.insert(attr::OWNER.into(), s("o"));
        item.insert(attr::STATUS.into(), s("paused"));
        assert!(JobRow::from_item(&item).unwrap_err().contains("paused"));
        // Rows from before failures were counted apart: a failed row's
        // failures are its attempts.
        let mut item = row().to_item();
        item.remove(attr::FAILURES);
        item.remove(attr::PERMANENT);
        item.insert(attr::ATTEMPTS.into(), n(2));
        let old = JobRow::from_item(&item).unwrap();
        assert_eq!((old.failures, old.permanent), (2, false));
        let mut item = row().to_item();
        item.insert(attr::ERROR.into(), n(3));
        assert_eq!(
            JobRow::from_item(&item),
            Err("attribute error is not a string".into())
        );
    }
}
