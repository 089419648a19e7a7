//! The ledger in DynamoDB: each [`LedgerTable`] call is one request.

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{DeleteRequest, PutRequest, TransactWriteItem, WriteRequest};

use crate::identity::ObjectVersion;
use crate::references::{
    attr as ref_attr, partition_of, ref_item_attr, RefChange, RefItem, VersionName, VersionRefs,
};

use super::items::{
    cache_row, cache_row_is_of, n, ref_holder_from_item, ref_item_delete, ref_item_put, s,
    version_refs_from_item, version_update, Item,
};

use super::{
    attr, max_runs, Claim, ClaimRequest, CollectDue, CollectRequest, Conditional, Contention,
    DeferCollect, ExecutionRecord, Finish, JobRow, JobStatus, LedgerError, LedgerTable, RefWrite,
};

/// When a row is due for collection ([`super::collectable`]): the
/// collection's condition and the sweep's filter, written once.
/// (A failed row from before `failures` was counted is never due here.)
const COLLECTABLE: &str = "(attribute_not_exists(#retry) OR #retry <= :now) AND (\
     (#status = :done AND #ref_items = :true AND attribute_exists(#mark) \
     AND #released <= :cutoff) \
     OR (#status = :collecting AND #lease <= :now) \
     OR (#status = :running AND #lease <= :cutoff AND #attempts < :max_runs) \
     OR (#status = :failed AND #updated <= :cutoff AND #attempts < :max_runs \
         AND #failures < :max_attempts \
         AND (attribute_not_exists(#permanent) OR #permanent = :false)))";

/// A done row from before reference items ([`super::unsealed`]).
const UNSEALED: &str = "#status = :done AND attribute_not_exists(#ref_items)";

fn collectable_names() -> std::collections::HashMap<String, String> {
    [
        ("#status", attr::STATUS),
        ("#lease", attr::LEASE_UNTIL_MS),
        ("#ref_items", ref_attr::REF_ITEMS),
        ("#mark", ref_attr::FREE_MARK),
        ("#released", ref_attr::RELEASED_AT_MS),
        ("#attempts", attr::ATTEMPTS),
        ("#updated", attr::UPDATED_AT_MS),
        ("#failures", attr::FAILURES),
        ("#permanent", attr::PERMANENT),
        ("#retry", attr::COLLECT_RETRY_AT_MS),
    ]
    .into_iter()
    .map(|(name, attribute)| (name.to_string(), attribute.to_string()))
    .collect()
}

fn collectable_values(due: &CollectDue) -> Item {
    [
        (":collecting", s(JobStatus::Collecting.as_str())),
        (":done", s(JobStatus::Done.as_str())),
        (":running", s(JobStatus::Running.as_str())),
        (":failed", s(JobStatus::Failed.as_str())),
        (":now", n(due.now_ms)),
        (":cutoff", n(due.before_ms)),
        (":true", AttributeValue::Bool(true)),
        (":max_runs", n(max_runs(due.max_attempts))),
        (":max_attempts", n(due.max_attempts)),
        (":false", AttributeValue::Bool(false)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect()
}

/// Job rows in a DynamoDB table (partition key `job_key`, a string), and
/// reference items in another (partition key `job_shard`, sort key
/// `version`, both strings).
#[derive(Debug, Clone)]
pub struct DynamoDbTable {
    client: Client,
    table: String,
    refs_table: String,
}

impl DynamoDbTable {
    /// The claim table `table`, its references in `<table>-refs`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let table = table.into();
        let refs_table = crate::config::default_refs_table(&table);
        DynamoDbTable::with_refs_table(client, table, refs_table)
    }

    pub fn with_refs_table(
        client: Client,
        table: impl Into<String>,
        refs_table: impl Into<String>,
    ) -> Self {
        DynamoDbTable {
            client,
            table: table.into(),
            refs_table: refs_table.into(),
        }
    }

    fn service_error<E>(&self, operation: &'static str, err: SdkError<E>) -> LedgerError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        Self::error_on(&self.table, operation, err)
    }

    /// A call on the references table failed.
    fn refs_error<E>(&self, operation: &'static str, err: SdkError<E>) -> LedgerError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        Self::error_on(&self.refs_table, operation, err)
    }

    fn error_on<E>(table: &str, operation: &'static str, err: SdkError<E>) -> LedgerError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        // What is left of a throttle after the SDK's own retries, or a
        // write on an item in a transaction: retried in-process.
        if let Some(contention) = err
            .as_service_error()
            .and_then(|e| e.code())
            .and_then(Contention::of_code)
        {
            return LedgerError::Contended {
                operation,
                table: table.to_string(),
                contention,
            };
        }
        LedgerError::Service {
            operation,
            table: table.to_string(),
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

    /// An UpdateItem of `job_key`'s row on the condition that the collector
    /// `owner` still holds it ([`HELD_BY_COLLECTOR`]), returning the row on
    /// a failed condition; the caller adds what it sets.
    fn collector_update(&self, job_key: &str, owner: &str) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(job_key))
            .condition_expression(HELD_BY_COLLECTOR)
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_values(":me", s(owner))
            .expression_attribute_values(":collecting", s(JobStatus::Collecting.as_str()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
    }

    /// A conditional UpdateItem sent: applied, or rejected with the row.
    async fn send_conditional(
        &self,
        job_key: &str,
        update: UpdateItemFluentBuilder,
    ) -> Result<Conditional<()>, LedgerError> {
        Ok(match self.update_outcome(job_key, update.send().await)? {
            Ok(_) => Conditional::Applied(()),
            Err(rejected) => rejected,
        })
    }
}

/// The condition of a collector's writes: it still holds the row.
const HELD_BY_COLLECTOR: &str = "#owner = :me AND #status = :collecting";

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
                 #updated = :now, #step = :step, #input = :input, #ref_items = :true \
                 REMOVE #released, #mark, #deletes, #collected_from, #execution",
            )
            .condition_expression("#owner = :seen_owner AND #status = :seen_status")
            .expression_attribute_names("#execution", attr::SPLIT_EXECUTION)
            .expression_attribute_names("#collected_from", attr::COLLECTED_FROM)
            .expression_attribute_names("#ref_items", ref_attr::REF_ITEMS)
            .expression_attribute_names("#released", ref_attr::RELEASED_AT_MS)
            .expression_attribute_names("#mark", ref_attr::FREE_MARK)
            .expression_attribute_names("#deletes", attr::DELETES_STARTED_AT_MS)
            .expression_attribute_values(":true", AttributeValue::Bool(true))
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
            // Removed by every finish: a stale one (left by a takeover of
            // code from before it) must not be read by a later collection.
            .expression_attribute_names("#collected_from", attr::COLLECTED_FROM)
            .expression_attribute_values(":me", s(&claim.owner))
            .expression_attribute_values(":running", s(JobStatus::Running.as_str()))
            .expression_attribute_values(":now", n(now_ms))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let update = match finish {
            // Marked: a job whose versions all went while it ran is
            // collected after the grace (the sweep reads its references).
            Finish::Done => update
                .update_expression(
                    "SET #status = :status, #updated = :now, #released = :now, #mark = :me \
                     REMOVE #error, #collected_from",
                )
                .expression_attribute_names("#released", ref_attr::RELEASED_AT_MS)
                .expression_attribute_names("#mark", ref_attr::FREE_MARK)
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
                        .update_expression(format!(
                            "{counted}, #permanent = :true REMOVE #collected_from"
                        ))
                        .expression_attribute_names("#permanent", attr::PERMANENT)
                        .expression_attribute_values(":true", AttributeValue::Bool(true))
                } else {
                    update.update_expression(format!("{counted} REMOVE #collected_from"))
                }
            }
            Finish::Spent { error, failures } => update
                .update_expression(
                    "SET #status = :status, #updated = :now, #error = :error, \
                     #failures = :failures REMOVE #collected_from",
                )
                .expression_attribute_names("#failures", attr::FAILURES)
                .expression_attribute_values(":status", s(JobStatus::Failed.as_str()))
                .expression_attribute_values(":error", s(error))
                .expression_attribute_values(":failures", n(failures)),
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
        let row_key = version.row_key();
        let malformed = |problem: String| LedgerError::MalformedRow {
            table: self.table.clone(),
            job_key: row_key.clone(),
            problem,
        };
        let mut items = vec![TransactWriteItem::builder()
            .update(version_update(&self.table, version, change, now_ms).map_err(malformed)?)
            .build()];
        for job_key in &change.add {
            let item = RefItem {
                job_key: job_key.clone(),
                version_row: row_key.clone(),
            };
            items.push(
                TransactWriteItem::builder()
                    .put(
                        ref_item_put(&self.refs_table, &item, Some(version), now_ms)
                            .map_err(malformed)?,
                    )
                    .build(),
            );
        }
        for job_key in &change.remove {
            let item = RefItem {
                job_key: job_key.clone(),
                version_row: row_key.clone(),
            };
            items.push(
                TransactWriteItem::builder()
                    .delete(
                        ref_item_delete(&self.refs_table, &item, change.exact)
                            .map_err(malformed)?,
                    )
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
        // A conflict with another transaction or a throttled item: nothing
        // was written, and the SDK does not retry it (its standard strategy
        // knows neither code): retried in-process (`Ledger::retrying`).
        // A conflict outranks a failed condition: the condition may hold
        // once the other transaction is done.
        if let Some(contention) = reasons
            .iter()
            .filter_map(|r| r.code().and_then(Contention::of_code))
            .min_by_key(|c| *c != Contention::TransactionConflict)
        {
            return Err(LedgerError::Contended {
                operation: "TransactWriteItems",
                table: self.table.clone(),
                contention,
            });
        }
        if reasons.is_empty()
            || reasons
                .iter()
                .any(|r| !matches!(r.code(), None | Some("None" | "ConditionalCheckFailed")))
        {
            return Err(self.service_error("TransactWriteItems", err));
        }
        let version_state = if failed(0) {
            Some(
                reasons[0]
                    .item()
                    .map(|item| self.version_row(&row_key, item))
                    .transpose()?,
            )
        } else {
            None
        };
        let first_delete = 1 + change.add.len();
        let missing = change
            .remove
            .iter()
            .enumerate()
            .filter(|(index, _)| failed(first_delete + index))
            .map(|(_, job_key)| job_key.clone())
            .collect();
        Ok(RefWrite::Cancelled {
            version: version_state,
            missing,
        })
    }

    async fn keep_collected(
        &self,
        job_key: &str,
        owner: &str,
        back: JobStatus,
        clear_mark: Option<&str>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let update = self
            .collector_update(job_key, owner)
            .expression_attribute_names("#lease", attr::LEASE_UNTIL_MS)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_names("#collected_from", attr::COLLECTED_FROM)
            .expression_attribute_values(":back", s(back.as_str()))
            .expression_attribute_values(":now", n(now_ms));
        let set = "SET #status = :back, #lease = :now, #updated = :now";
        let update = match clear_mark {
            Some(mark) => update
                .update_expression(format!("{set} REMOVE #collected_from, #mark"))
                .condition_expression(format!("{HELD_BY_COLLECTOR} AND #mark = :mark"))
                .expression_attribute_names("#mark", ref_attr::FREE_MARK)
                .expression_attribute_values(":mark", s(mark)),
            None => update.update_expression(format!("{set} REMOVE #collected_from")),
        };
        self.send_conditional(job_key, update).await
    }

    async fn start_deletes(
        &self,
        job_key: &str,
        owner: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let update = self
            .collector_update(job_key, owner)
            .update_expression("SET #deletes = :now, #updated = :now")
            .expression_attribute_names("#deletes", attr::DELETES_STARTED_AT_MS)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_values(":now", n(now_ms));
        self.send_conditional(job_key, update).await
    }

    async fn mark_released(
        &self,
        job_key: &str,
        nonce: &str,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(job_key))
            .update_expression("SET #mark = :nonce, #released = :now")
            .condition_expression("attribute_exists(#key)")
            .expression_attribute_names("#mark", ref_attr::FREE_MARK)
            .expression_attribute_names("#released", ref_attr::RELEASED_AT_MS)
            .expression_attribute_names("#key", attr::JOB_KEY)
            .expression_attribute_values(":nonce", s(nonce))
            .expression_attribute_values(":now", n(now_ms));
        self.send_conditional(job_key, update).await
    }

    async fn query_refs(
        &self,
        job_key: &str,
        shard: u8,
        limit: Option<u32>,
        from: Option<&str>,
    ) -> Result<(Vec<crate::references::RefHolder>, Option<String>), LedgerError> {
        let partition = partition_of(job_key, shard);
        let output = self
            .client
            .query()
            .table_name(&self.refs_table)
            .consistent_read(true)
            .key_condition_expression("#p = :p")
            .expression_attribute_names("#p", ref_item_attr::JOB_SHARD)
            .expression_attribute_values(":p", s(&partition))
            .projection_expression("#v, #b, #k, #i, #c")
            .expression_attribute_names("#c", ref_item_attr::CREATED_AT_MS)
            .expression_attribute_names("#v", ref_item_attr::VERSION)
            .expression_attribute_names("#b", ref_item_attr::BUCKET)
            .expression_attribute_names("#k", ref_item_attr::OBJECT_KEY)
            .expression_attribute_names("#i", ref_item_attr::VERSION_ID)
            .set_limit(limit.map(|l| l as i32))
            .set_exclusive_start_key(from.map(|version| {
                Item::from([
                    (ref_item_attr::JOB_SHARD.to_string(), s(&partition)),
                    (ref_item_attr::VERSION.to_string(), s(version)),
                ])
            }))
            .send()
            .await
            .map_err(|e| self.refs_error("Query", e))?;
        let versions = output
            .items()
            .iter()
            .filter_map(ref_holder_from_item)
            .collect();
        let next = output
            .last_evaluated_key()
            .and_then(|key| key.get(ref_item_attr::VERSION))
            .and_then(|v| v.as_s().ok())
            .cloned();
        Ok((versions, next))
    }

    async fn begin_collect(
        &self,
        request: &CollectRequest,
    ) -> Result<Conditional<JobRow>, LedgerError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&request.job_key))
            // `collected_from` first, read from the status as it was (as
            // DynamoDB evaluates every operand on the item before the
            // update); a stopped collection taken over keeps the first's.
            .update_expression(
                "SET #collected_from = if_not_exists(#collected_from, #status), \
                 #status = :collecting, #owner = :owner, #lease = :lease, #updated = :now",
            )
            .condition_expression(COLLECTABLE)
            // The whole map first: `set_` replaces what came before it.
            .set_expression_attribute_names(Some(collectable_names()))
            .set_expression_attribute_values(Some(collectable_values(&request.due)))
            .expression_attribute_names("#collected_from", attr::COLLECTED_FROM)
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_values(":owner", s(&request.owner))
            .expression_attribute_values(":lease", n(request.lease_until_ms))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        Ok(match self.update_outcome(&request.job_key, update)? {
            Ok(Some(new)) => Conditional::Applied(self.row(&request.job_key, &new)?),
            Ok(None) => Conditional::Rejected(None),
            Err(rejected) => rejected,
        })
    }

    async fn end_collect(
        &self,
        job_key: &str,
        owner: &str,
    ) -> Result<Conditional<()>, LedgerError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(job_key))
            .condition_expression(HELD_BY_COLLECTOR)
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_values(":me", s(owner))
            .expression_attribute_values(":collecting", s(JobStatus::Collecting.as_str()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Conditional::Applied(())),
            Err(err) => match err.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(failed)) => {
                    self.rejected(job_key, failed.item())
                }
                _ => Err(self.service_error("DeleteItem", err)),
            },
        }
    }

    async fn defer_collect(&self, request: &DeferCollect) -> Result<Conditional<()>, LedgerError> {
        let update = self
            .collector_update(&request.job_key, &request.owner)
            .update_expression(
                "SET #lease = :now, #updated = :now, #retry = :retry ADD #failures :one",
            )
            .expression_attribute_names("#lease", attr::LEASE_UNTIL_MS)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_names("#retry", attr::COLLECT_RETRY_AT_MS)
            .expression_attribute_names("#failures", attr::COLLECT_FAILURES)
            .expression_attribute_values(":now", n(request.now_ms))
            .expression_attribute_values(":retry", n(request.retry_at_ms))
            .expression_attribute_values(":one", n(1));
        self.send_conditional(&request.job_key, update).await
    }

    async fn scan_collectable(
        &self,
        due: &CollectDue,
        from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError> {
        self.scan_page(
            COLLECTABLE,
            collectable_names(),
            collectable_values(due),
            from,
        )
        .await
    }

    async fn scan_unsealed(
        &self,
        from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError> {
        let names = [
            ("#status", attr::STATUS),
            ("#ref_items", ref_attr::REF_ITEMS),
        ]
        .into_iter()
        .map(|(name, attribute)| (name.to_string(), attribute.to_string()))
        .collect();
        let values = Item::from([(":done".to_string(), s(JobStatus::Done.as_str()))]);
        self.scan_page(UNSEALED, names, values, from).await
    }

    async fn seal_refs(&self, row: &JobRow, now_ms: u64) -> Result<Conditional<()>, LedgerError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(&row.job_key))
            .update_expression("SET #ref_items = :true, #mark = :mark, #released = :now")
            .condition_expression("#status = :done AND attribute_not_exists(#ref_items)")
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_names("#ref_items", ref_attr::REF_ITEMS)
            .expression_attribute_names("#mark", ref_attr::FREE_MARK)
            .expression_attribute_names("#released", ref_attr::RELEASED_AT_MS)
            .expression_attribute_values(":done", s(JobStatus::Done.as_str()))
            .expression_attribute_values(":true", AttributeValue::Bool(true))
            .expression_attribute_values(":mark", s(&super::seal_mark(&row.job_key, now_ms)))
            .expression_attribute_values(":now", n(now_ms))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        self.send_conditional(&row.job_key, update).await
    }

    async fn record_execution(
        &self,
        job_key: &str,
        record: ExecutionRecord<'_>,
        now_ms: u64,
    ) -> Result<Conditional<()>, LedgerError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::JOB_KEY, s(job_key))
            .update_expression("SET #execution = :execution, #lease = :lease, #updated = :now")
            .condition_expression("#owner = :me AND #status = :running")
            .expression_attribute_names("#execution", attr::SPLIT_EXECUTION)
            .expression_attribute_names("#lease", attr::LEASE_UNTIL_MS)
            .expression_attribute_names("#updated", attr::UPDATED_AT_MS)
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#status", attr::STATUS)
            .expression_attribute_values(":execution", s(record.execution))
            .expression_attribute_values(":lease", n(record.lease_until_ms))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":me", s(record.owner))
            .expression_attribute_values(":running", s(JobStatus::Running.as_str()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        self.send_conditional(job_key, update).await
    }

    async fn write_holder_refs(
        &self,
        holder: &str,
        add: &[String],
        remove: &[String],
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        let malformed = |problem: String| LedgerError::MalformedRow {
            table: self.refs_table.clone(),
            job_key: holder.to_string(),
            problem,
        };
        let item = |job_key: &String| RefItem {
            job_key: job_key.clone(),
            version_row: holder.to_string(),
        };
        let mut requests = Vec::with_capacity(add.len() + remove.len());
        for job_key in add {
            let put =
                ref_item_put(&self.refs_table, &item(job_key), None, now_ms).map_err(malformed)?;
            let request = PutRequest::builder()
                .set_item(Some(put.item().clone()))
                .build()
                .map_err(|e| malformed(e.to_string()))?;
            requests.push(WriteRequest::builder().put_request(request).build());
        }
        for job_key in remove {
            let item = item(job_key);
            let request = DeleteRequest::builder()
                .key(ref_item_attr::JOB_SHARD, s(&item.partition()))
                .key(ref_item_attr::VERSION, s(&item.version_row))
                .build()
                .map_err(|e| malformed(e.to_string()))?;
            requests.push(WriteRequest::builder().delete_request(request).build());
        }
        // 25 requests a call; what DynamoDB leaves unprocessed is sent
        // again (a throttled partition), a bounded number of times.
        for batch in requests.chunks(25) {
            let mut pending = batch.to_vec();
            for _ in 0..8 {
                if pending.is_empty() {
                    break;
                }
                let output = self
                    .client
                    .batch_write_item()
                    .request_items(&self.refs_table, pending)
                    .send()
                    .await
                    .map_err(|e| self.refs_error("BatchWriteItem", e))?;
                pending = output
                    .unprocessed_items()
                    .and_then(|items| items.get(&self.refs_table))
                    .cloned()
                    .unwrap_or_default();
            }
            if !pending.is_empty() {
                return Err(LedgerError::Contended {
                    operation: "BatchWriteItem",
                    table: self.refs_table.clone(),
                    contention: Contention::Throttled,
                });
            }
        }
        Ok(())
    }
}

impl DynamoDbTable {
    /// One consistent Scan page of the job rows matching `filter`.
    async fn scan_page(
        &self,
        filter: &str,
        names: std::collections::HashMap<String, String>,
        values: Item,
        from: Option<&str>,
    ) -> Result<(Vec<JobRow>, Option<String>), LedgerError> {
        let output = self
            .client
            .scan()
            .table_name(&self.table)
            .consistent_read(true)
            .filter_expression(filter)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .set_exclusive_start_key(
                from.map(|key| Item::from([(attr::JOB_KEY.to_string(), s(key))])),
            )
            .send()
            .await
            .map_err(|e| self.service_error("Scan", e))?;
        let rows = output
            .items()
            .iter()
            .map(|item| {
                let key = match item.get(attr::JOB_KEY) {
                    Some(AttributeValue::S(key)) => key.clone(),
                    _ => String::new(),
                };
                self.row(&key, item)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let next = output
            .last_evaluated_key()
            .and_then(|key| key.get(attr::JOB_KEY))
            .and_then(|key| key.as_s().ok())
            .cloned();
        Ok((rows, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> JobRow {
        JobRow {
            execution: Some("arn:aws:states:us-east-1:1:execution:split:k-0".into()),
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
            ref_items: true,
            free_mark: Some("m".into()),
            released_at_ms: Some(3),
            deletes_started_at_ms: Some(4),
            collect_failures: 2,
            collect_retry_at_ms: Some(7),
            collected_from: Some(JobStatus::Failed),
        }
    }

    /// A hash cache row expires (the table's TTL attribute) 90 days after
    /// it was written, and is still read as the version's until removed.
    #[test]
    fn hash_cache_rows_expire() {
        let version = ObjectVersion {
            bucket: "in".into(),
            key: "a.bin".into(),
            version_id: Some("v1".into()),
            etag: "\"e\"".into(),
            size: 3,
            crc64nvme: None,
        };
        let item = cache_row(&version, "hash", 5_000);
        assert_eq!(
            item.get(crate::references::attr::EXPIRES_AT),
            Some(&n(5 + 90 * 24 * 3600))
        );
        assert!(cache_row_is_of(&item, &version));
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
