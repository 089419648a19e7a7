//! The DynamoDB items of the rows that share the claim table: job rows,
//! hash cache rows (`input-hash#…`) and version rows (`version#…`), and the
//! updates of a reference transaction. Pure: no calls.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, Put, ReturnValuesOnConditionCheckFailure, Update,
};

use super::{attr, JobRow, JobStatus};
use crate::identity::{attr as cache_attr, ObjectVersion};
use crate::references::{
    attr as ref_attr, ref_item_attr, RefChange, RefHolder, RefItem, VersionName, VersionRefs,
};

pub(super) type Item = HashMap<String, AttributeValue>;

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
            ref_items: match item.get(ref_attr::REF_ITEMS) {
                None => false,
                Some(AttributeValue::Bool(items)) => *items,
                Some(_) => {
                    return Err(format!(
                        "attribute {} is not a boolean",
                        ref_attr::REF_ITEMS
                    ))
                }
            },
            free_mark: match item.get(ref_attr::FREE_MARK) {
                None => None,
                Some(_) => Some(string(ref_attr::FREE_MARK)?),
            },
            released_at_ms: match item.get(ref_attr::RELEASED_AT_MS) {
                None => None,
                Some(_) => Some(number(ref_attr::RELEASED_AT_MS)?),
            },
            deletes_started_at_ms: match item.get(attr::DELETES_STARTED_AT_MS) {
                None => None,
                Some(_) => Some(number(attr::DELETES_STARTED_AT_MS)?),
            },
            collect_failures: match item.get(attr::COLLECT_FAILURES) {
                None => 0,
                Some(_) => number(attr::COLLECT_FAILURES)?,
            },
            collect_retry_at_ms: match item.get(attr::COLLECT_RETRY_AT_MS) {
                None => None,
                Some(_) => Some(number(attr::COLLECT_RETRY_AT_MS)?),
            },
            execution: match item.get(attr::SPLIT_EXECUTION) {
                None => None,
                Some(_) => Some(string(attr::SPLIT_EXECUTION)?),
            },
            collected_from: match item.get(attr::COLLECTED_FROM) {
                None => None,
                Some(_) => {
                    let text = string(attr::COLLECTED_FROM)?;
                    Some(JobStatus::parse(&text).ok_or_else(|| {
                        format!(
                            "attribute {} has unknown value {text:?}",
                            attr::COLLECTED_FROM
                        )
                    })?)
                }
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
        if self.ref_items {
            item.insert(ref_attr::REF_ITEMS.into(), AttributeValue::Bool(true));
        }
        if let Some(mark) = &self.free_mark {
            item.insert(ref_attr::FREE_MARK.into(), s(mark));
        }
        if let Some(at) = self.released_at_ms {
            item.insert(ref_attr::RELEASED_AT_MS.into(), n(at));
        }
        if let Some(at) = self.deletes_started_at_ms {
            item.insert(attr::DELETES_STARTED_AT_MS.into(), n(at));
        }
        if self.collect_failures > 0 {
            item.insert(attr::COLLECT_FAILURES.into(), n(self.collect_failures));
        }
        if let Some(at) = self.collect_retry_at_ms {
            item.insert(attr::COLLECT_RETRY_AT_MS.into(), n(at));
        }
        if let Some(from) = self.collected_from {
            item.insert(attr::COLLECTED_FROM.into(), s(from.as_str()));
        }
        if let Some(execution) = &self.execution {
            item.insert(attr::SPLIT_EXECUTION.into(), s(execution));
        }
        item
    }
}

/// A version row as read; `Err` names the malformed attribute.
pub(super) fn version_refs_from_item(item: &Item) -> Result<VersionRefs, String> {
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
    // An optional string attribute: absent is `None`, another type an error.
    let optional = |name: &str| match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::S(text)) => Ok(Some(text.clone())),
        Some(_) => Err(format!("attribute {name} is not a string")),
    };
    let etag = optional(ref_attr::ETAG)?;
    let ref_items = matches!(
        item.get(ref_attr::REF_ITEMS),
        Some(AttributeValue::Bool(true))
    );
    let sha256 = optional(ref_attr::SHA256)?;
    let crc64nvme = optional(ref_attr::CRC64NVME)?;
    let etag_md5 = matches!(
        item.get(ref_attr::ETAG_MD5),
        Some(AttributeValue::Bool(true))
    );
    Ok(VersionRefs {
        job_keys,
        etag,
        sha256,
        etag_md5,
        crc64nvme,
        gen,
        deleted,
        ref_items,
    })
}

/// The version row's update in a reference transaction.
pub(super) fn version_update(
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
        "#ref_items = :true",
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
        .expression_attribute_names("#sha256", ref_attr::SHA256)
        .expression_attribute_names("#etag_md5", ref_attr::ETAG_MD5)
        .expression_attribute_names("#crc64nvme", ref_attr::CRC64NVME)
        .expression_attribute_names("#ref_items", ref_attr::REF_ITEMS)
        .expression_attribute_values(":true", AttributeValue::Bool(true))
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
    // Written before issue 24; never read now.
    remove.push("#sequencer");
    // What names the row's bytes: each set when known, removed when not.
    for (name, set_it, value, known) in [
        ("#etag", "#etag = :etag", ":etag", &next.etag),
        ("#sha256", "#sha256 = :sha256", ":sha256", &next.sha256),
        (
            "#crc64nvme",
            "#crc64nvme = :crc64nvme",
            ":crc64nvme",
            &next.crc64nvme,
        ),
    ] {
        match known {
            Some(text) => {
                set.push(set_it);
                update = update.expression_attribute_values(value, s(text));
            }
            None => remove.push(name),
        }
    }
    if next.etag_md5 {
        set.push("#etag_md5 = :true");
    } else {
        remove.push("#etag_md5");
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

/// A reference item's put in a reference transaction (unconditional: a
/// put of an item that exists changes nothing but its time).
/// A reference item's put; `version`: the version it names (a holder's
/// names none).
pub(super) fn ref_item_put(
    table: &str,
    item: &RefItem,
    version: Option<&VersionName>,
    now_ms: u64,
) -> Result<Put, String> {
    let mut put = Put::builder()
        .table_name(table)
        .item(ref_item_attr::JOB_SHARD, s(&item.partition()))
        .item(ref_item_attr::VERSION, s(&item.version_row))
        .item(ref_item_attr::JOB_KEY, s(&item.job_key))
        .item(ref_item_attr::CREATED_AT_MS, n(now_ms));
    if let Some(version) = version {
        put = put
            .item(ref_item_attr::BUCKET, s(&version.bucket))
            .item(ref_item_attr::OBJECT_KEY, s(&version.key));
        if let Some(id) = &version.version_id {
            put = put.item(ref_item_attr::VERSION_ID, s(id));
        }
    }
    put.build().map_err(|e| e.to_string())
}

/// The holder a job's Query found in `item`.
pub(super) fn ref_holder_from_item(item: &Item) -> Option<RefHolder> {
    let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
    let version_row = text(ref_item_attr::VERSION)?;
    let version = match (text(ref_item_attr::BUCKET), text(ref_item_attr::OBJECT_KEY)) {
        (Some(bucket), Some(key)) => Some(VersionName {
            bucket,
            key,
            version_id: text(ref_item_attr::VERSION_ID),
        }),
        _ => None,
    };
    let created_at_ms = item
        .get(ref_item_attr::CREATED_AT_MS)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok());
    Some(RefHolder {
        version_row,
        version,
        created_at_ms,
    })
}

/// A reference item's delete in a reference transaction; `exact`:
/// conditioned on the item existing, so a mismatch is seen.
pub(super) fn ref_item_delete(table: &str, item: &RefItem, exact: bool) -> Result<Delete, String> {
    let delete = Delete::builder()
        .table_name(table)
        .key(ref_item_attr::JOB_SHARD, s(&item.partition()))
        .key(ref_item_attr::VERSION, s(&item.version_row));
    let delete = if exact {
        delete
            .condition_expression("attribute_exists(#p)")
            .expression_attribute_names("#p", ref_item_attr::JOB_SHARD)
    } else {
        delete
    };
    delete.build().map_err(|e| e.to_string())
}

pub(super) fn s(text: &str) -> AttributeValue {
    AttributeValue::S(text.to_string())
}

pub(super) fn n(number: u64) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

/// A hash cache row: the version in full (so that a read can check it is
/// the one asked for) and its hash.
pub(super) fn cache_row(version: &ObjectVersion, input_hash: &str, now_ms: u64) -> Item {
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
        // DynamoDB's TTL removes the row once no event of the version is
        // likely to come; a version's bytes never change, so a row read
        // after it expired (TTL deletes lazily) still names them.
        (
            ref_attr::EXPIRES_AT,
            n(now_ms / 1000 + crate::identity::HASH_CACHE_SECS),
        ),
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
pub(super) fn cache_row_is_of(item: &Item, version: &ObjectVersion) -> bool {
    let mut expected = cache_row(version, "", 0);
    for ignored in [
        attr::INPUT_HASH,
        cache_attr::COMPUTED_AT_MS,
        ref_attr::EXPIRES_AT,
    ] {
        expected.remove(ignored);
    }
    expected
        .iter()
        .all(|(name, value)| item.get(name) == Some(value))
        && (version.crc64nvme.is_some() || !item.contains_key(cache_attr::CRC64NVME))
}
