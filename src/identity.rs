//! Content identity: where a job's input hash comes from. Pure: the reads
//! and the cache calls are the handler's ([`crate::handler`]); DESIGN.md
//! ("Content identity") has the table and the trust argument.
//!
//! An input hash is trusted only when S3 computed or verified it (a
//! full-object SHA-256 checksum) or when mediaonce computed it from the
//! bytes (and cached it under the exact object version). A hash the
//! uploader merely declares is never a key: a `done` job is reused without
//! reading a byte, so a declared hash would hand anyone the outputs of
//! content they do not have. A CRC (CRC32, CRC32C, CRC64NVME) is never a
//! key either: it is not collision-resistant.

use base64::Engine;

use crate::fingerprint::{s3_checksum, version_etag, Fingerprint, ObjectHead};
use crate::key::sha256_hex;
use crate::step::{InputUse, Keep};

/// The variable choosing the identity: `checksum`, `content` or `auto`.
pub const ENV_IDENTITY: &str = "MEDIAONCE_IDENTITY";

/// How jobs are keyed when S3 has no full-object SHA-256 of the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdentityMode {
    /// Version and ETag: no byte is read to key a job.
    Checksum,
    /// Always a SHA-256 of the bytes: cached, or computed by reading them once.
    Content,
    /// By content when a job's step reads every byte anyway (hashing is then
    /// free), or when the hash is cached; else version and ETag.
    #[default]
    Auto,
}

impl IdentityMode {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "checksum" => Ok(IdentityMode::Checksum),
            "content" => Ok(IdentityMode::Content),
            "auto" => Ok(IdentityMode::Auto),
            other => Err(format!("must be checksum, content or auto, not {other:?}")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            IdentityMode::Checksum => "checksum",
            IdentityMode::Content => "content",
            IdentityMode::Auto => "auto",
        }
    }
}

/// How a record's input hash is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// From the head alone: S3's full-object SHA-256, or version and ETag.
    Known(Fingerprint),
    /// Look the object version up in the hash cache; on a miss, `on_miss`.
    LookUp { on_miss: OnMiss },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMiss {
    /// Read every byte once, hashing them (and keep them for the steps).
    Read,
    /// Key by version and ETag: no job of the record reads every byte.
    VersionEtag,
}

/// How the input hash of an object is found, given how the record's
/// jobs will read it (`uses`, one per job).
pub fn plan(mode: IdentityMode, head: &ObjectHead, uses: &[InputUse]) -> Plan {
    if let Some(fingerprint) = s3_checksum(head) {
        return Plan::Known(fingerprint);
    }
    match mode {
        IdentityMode::Checksum => Plan::Known(version_etag(head)),
        IdentityMode::Content => Plan::LookUp {
            on_miss: OnMiss::Read,
        },
        IdentityMode::Auto if uses.iter().any(|u| u.reads_whole(head.size)) => Plan::LookUp {
            on_miss: OnMiss::Read,
        },
        IdentityMode::Auto => Plan::LookUp {
            on_miss: OnMiss::VersionEtag,
        },
    }
}

/// Where a record's bytes are kept once read, so that no job reads them
/// twice: a file when a step needs one, memory when a step decodes a buffer
/// (and the input is within its limit), else nowhere.
pub fn keep(uses: &[InputUse], size: u64) -> Keep {
    if uses
        .iter()
        .any(|u| matches!(u, InputUse::File { .. }) && u.reads_whole(size))
    {
        Keep::File
    } else if uses
        .iter()
        .any(|u| matches!(u, InputUse::Memory { .. }) && u.reads_whole(size))
    {
        Keep::Memory
    } else {
        Keep::Nothing
    }
}

/// The object version a cached hash belongs to: any change to the bytes
/// changes it (a new version id, or in an unversioned bucket a new ETag;
/// the size and S3's CRC64NVME, when it has one, narrow it further).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion {
    pub bucket: String,
    pub key: String,
    /// `None` in an unversioned bucket (S3's `null` version).
    pub version_id: Option<String>,
    pub etag: String,
    pub size: u64,
    pub crc64nvme: Option<String>,
}

/// The prefix of a hash cache row's partition key in the claim table; a job
/// key is 64 hex digits, so the two never meet.
pub const CACHE_ROW_PREFIX: &str = "input-hash#";

/// How long a hash cache row is kept (its `expires_at`, the claim table's
/// TTL attribute): 90 days, far past the 14 days SQS keeps a message, so
/// the events of an upload find it; a later `reprocess` or `refs rebuild`
/// of the version hashes the bytes again.
pub const HASH_CACHE_SECS: u64 = 90 * 24 * 3600;

/// Attribute names of a hash cache row (besides `job_key`, `input_hash` and
/// `expires_at`).
pub mod attr {
    pub const BUCKET: &str = "bucket";
    pub const OBJECT_KEY: &str = "object_key";
    pub const VERSION_ID: &str = "version_id";
    pub const ETAG: &str = "etag";
    pub const SIZE: &str = "size";
    pub const CRC64NVME: &str = "crc64nvme";
    pub const COMPUTED_AT_MS: &str = "computed_at_ms";
}

impl ObjectVersion {
    pub fn of(head: &ObjectHead) -> Self {
        ObjectVersion {
            bucket: head.bucket.clone(),
            key: head.key.clone(),
            version_id: head.version_name().map(str::to_string),
            etag: head.etag.trim_matches('"').to_string(),
            size: head.size,
            crc64nvme: head.checksum_crc64nvme.clone(),
        }
    }

    /// The cache row's partition key: the prefix and a SHA-256 of every
    /// field, newline-separated (no field holds a newline but the key,
    /// which comes last but for fixed-form fields).
    pub fn row_key(&self) -> String {
        let text = format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            self.bucket,
            self.version_id.as_deref().unwrap_or("null"),
            self.etag,
            self.size,
            self.crc64nvme.as_deref().unwrap_or(""),
            self.key,
        );
        format!("{CACHE_ROW_PREFIX}{}", sha256_hex(text.as_bytes()))
    }
}

/// The SHA-256 an uploader declared in the object's metadata, in lowercase
/// hex (declared as hex or as base64), if it is one.
pub fn declared_sha256(head: &ObjectHead) -> Option<String> {
    let value = head.declared_sha256.as_deref()?.trim();
    if value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some(value.to_ascii_lowercase());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value)
        .ok()?;
    (bytes.len() == 32).then(|| hex::encode(bytes))
}

/// A warning when the object's metadata declares a SHA-256 other than the
/// content hash its job is keyed on. Never more than a warning: the
/// declared hash is the uploader's word.
pub fn declared_mismatch(head: &ObjectHead, fingerprint: &Fingerprint) -> Option<String> {
    if !fingerprint.source.is_content() {
        return None;
    }
    let declared = declared_sha256(head)?;
    (declared != fingerprint.input_hash).then(|| {
        format!(
            "the object's metadata declares SHA-256 {declared}, but its bytes hash to {} ({}): \
             the declared value is ignored",
            fingerprint.input_hash,
            fingerprint.source.as_str()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::FingerprintSource;

    const EMPTY_SHA256_B64: &str = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=";
    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const THUMBNAIL: InputUse = InputUse::Memory { max_bytes: 100 };
    const MOVIE: InputUse = InputUse::File { max_bytes: 1_000 };

    fn head(size: u64) -> ObjectHead {
        ObjectHead {
            bucket: "in".into(),
            key: "a.jpg".into(),
            version_id: None,
            etag: "abc".into(),
            size,
            ..Default::default()
        }
    }

    #[test]
    fn modes_parse_and_name_themselves() {
        for mode in [
            IdentityMode::Checksum,
            IdentityMode::Content,
            IdentityMode::Auto,
        ] {
            assert_eq!(IdentityMode::parse(mode.as_str()), Ok(mode));
        }
        assert_eq!(IdentityMode::default(), IdentityMode::Auto);
        let err = IdentityMode::parse("sha256").unwrap_err();
        assert!(err.contains("checksum, content or auto"), "{err}");
    }

    #[test]
    fn a_full_object_sha256_is_the_key_in_every_mode() {
        let h = ObjectHead {
            checksum_sha256: Some(EMPTY_SHA256_B64.into()),
            checksum_type: Some("FULL_OBJECT".into()),
            ..head(0)
        };
        for mode in [
            IdentityMode::Checksum,
            IdentityMode::Content,
            IdentityMode::Auto,
        ] {
            let Plan::Known(fp) = plan(mode, &h, &[InputUse::Ranges]) else {
                panic!("{mode:?} must use S3's checksum");
            };
            assert_eq!(fp.source, FingerprintSource::S3Checksum);
            assert_eq!(fp.input_hash, EMPTY_SHA256);
        }
    }

    #[test]
    fn composite_and_crc_checksums_are_never_keys() {
        let composite = ObjectHead {
            checksum_sha256: Some(format!("{EMPTY_SHA256_B64}-2")),
            checksum_type: Some("COMPOSITE".into()),
            ..head(10)
        };
        let crc_only = ObjectHead {
            checksum_crc64nvme: Some("AAAAAAAAAAA=".into()),
            checksum_type: Some("FULL_OBJECT".into()),
            ..head(10)
        };
        for h in [&composite, &crc_only] {
            assert_eq!(
                plan(IdentityMode::Content, h, &[InputUse::Ranges]),
                Plan::LookUp {
                    on_miss: OnMiss::Read
                }
            );
            assert_eq!(
                plan(IdentityMode::Checksum, h, &[THUMBNAIL]),
                Plan::Known(version_etag(h))
            );
        }
    }

    #[test]
    fn auto_reads_to_hash_only_for_a_job_that_reads_every_byte() {
        let small = head(100);
        let read = Plan::LookUp {
            on_miss: OnMiss::Read,
        };
        let no_read = Plan::LookUp {
            on_miss: OnMiss::VersionEtag,
        };
        assert_eq!(plan(IdentityMode::Auto, &small, &[THUMBNAIL]), read);
        assert_eq!(plan(IdentityMode::Auto, &small, &[MOVIE]), read);
        assert_eq!(plan(IdentityMode::Auto, &small, &[InputUse::Stream]), read);
        assert_eq!(
            plan(IdentityMode::Auto, &small, &[InputUse::Ranges, THUMBNAIL]),
            read
        );
        assert_eq!(
            plan(IdentityMode::Auto, &small, &[InputUse::Ranges]),
            no_read
        );
        // Over the thumbnail's limit: the step refuses it unread.
        assert_eq!(plan(IdentityMode::Auto, &head(101), &[THUMBNAIL]), no_read);
        // Over a movie's: its step reads it by ranges (or spools it
        // itself): keyed without a read of every byte.
        assert_eq!(plan(IdentityMode::Auto, &head(1_001), &[MOVIE]), no_read);
    }

    #[test]
    fn bytes_are_kept_where_the_steps_read_them() {
        assert_eq!(keep(&[InputUse::Ranges], 10), Keep::Nothing);
        assert_eq!(keep(&[InputUse::Stream], 10), Keep::Nothing);
        assert_eq!(keep(&[THUMBNAIL, InputUse::Ranges], 10), Keep::Memory);
        assert_eq!(keep(&[THUMBNAIL], 101), Keep::Nothing);
        assert_eq!(keep(&[THUMBNAIL, MOVIE], 10), Keep::File);
        assert_eq!(keep(&[THUMBNAIL, MOVIE], 1_001), Keep::Nothing);
    }

    #[test]
    fn every_part_of_the_version_changes_the_cache_row() {
        let base = ObjectVersion::of(&head(10));
        let rows: Vec<String> = [
            ObjectVersion {
                bucket: "other".into(),
                ..base.clone()
            },
            ObjectVersion {
                key: "b.jpg".into(),
                ..base.clone()
            },
            ObjectVersion {
                version_id: Some("v1".into()),
                ..base.clone()
            },
            ObjectVersion {
                etag: "abd".into(),
                ..base.clone()
            },
            ObjectVersion {
                size: 11,
                ..base.clone()
            },
            ObjectVersion {
                crc64nvme: Some("x".into()),
                ..base.clone()
            },
        ]
        .iter()
        .map(ObjectVersion::row_key)
        .collect();
        for row in &rows {
            assert_ne!(row, &base.row_key());
            assert!(row.starts_with(CACHE_ROW_PREFIX));
            assert_eq!(row.len(), CACHE_ROW_PREFIX.len() + 64);
        }
    }

    #[test]
    fn a_declared_hash_is_compared_never_trusted() {
        let fp = Fingerprint {
            input_hash: EMPTY_SHA256.into(),
            source: FingerprintSource::Computed,
        };
        let declaring = |value: &str| ObjectHead {
            declared_sha256: Some(value.into()),
            ..head(0)
        };
        assert_eq!(
            declared_sha256(&declaring(EMPTY_SHA256_B64)).as_deref(),
            Some(EMPTY_SHA256)
        );
        assert_eq!(
            declared_sha256(&declaring(&EMPTY_SHA256.to_uppercase())).as_deref(),
            Some(EMPTY_SHA256)
        );
        assert_eq!(declared_sha256(&declaring("not a hash")), None);
        assert_eq!(declared_mismatch(&declaring(EMPTY_SHA256), &fp), None);
        let other = "ab".repeat(32);
        let warning = declared_mismatch(&declaring(&other), &fp).unwrap();
        assert!(
            warning.contains(&other) && warning.contains("ignored"),
            "{warning}"
        );
        // Nothing to compare with a version/ETag key.
        let by_version = version_etag(&head(0));
        assert_eq!(declared_mismatch(&declaring(&other), &by_version), None);
    }
}
