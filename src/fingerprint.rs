//! The input hash: what identifies an object's bytes. Pure: no I/O (the
//! HeadObject that feeds it lives in [`crate::store`]; which form a job
//! gets is [`crate::identity`]'s decision).
//!
//! Two forms, and the key changes exactly when the bytes can have changed:
//! - a SHA-256 of the bytes themselves, so identical uploads anywhere share
//!   a key: S3's full-object SHA-256 checksum, or one mediaonce computed
//!   ([`ContentHasher`]) and may have cached;
//! - a fingerprint of where the bytes live and which version they are:
//!   `s3-version-etag\n<bucket>\n<key>\n<version id or empty>\n<ETag>`.

use base64::Engine;

use sha2::{Digest, Sha256};

use crate::key::sha256_hex;

/// What HeadObject told us about the object version we will process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectHead {
    pub bucket: String,
    pub key: String,
    /// The id the version was headed by: `null` when S3's null version was
    /// headed by that id under newer versions, so reads through this head
    /// stay pinned to it. [`ObjectHead::version_name`] names the version.
    pub version_id: Option<String>,
    /// Without quotes.
    pub etag: String,
    pub size: u64,
    /// `x-amz-checksum-sha256`, base64 as S3 returns it.
    pub checksum_sha256: Option<String>,
    /// `x-amz-checksum-type`: `FULL_OBJECT` or `COMPOSITE`, when S3 said.
    pub checksum_type: Option<String>,
    pub content_type: Option<String>,
    /// `Cache-Control`, as S3 serves it with every GET.
    pub cache_control: Option<String>,
    /// `x-amz-checksum-crc64nvme`, base64: S3 attaches one to every upload
    /// that carries no other checksum. Never a key (a CRC is not
    /// collision-resistant); it only narrows the hash cache's entry.
    pub checksum_crc64nvme: Option<String>,
    /// A SHA-256 the uploader declared in the object's metadata
    /// (`x-amz-meta-sha256`). Never trusted as a key: compared with a
    /// computed hash, and a mismatch is a warning.
    pub declared_sha256: Option<String>,
    /// The ETag is the MD5 of the bytes: a single-part upload (no `-N`
    /// part count) not encrypted with SSE-KMS or SSE-C. `false`: nothing
    /// is known of it, and another ETag does not prove other bytes.
    pub etag_md5: bool,
}

impl ObjectHead {
    /// The version's name: its id, `None` for S3's `null` version however
    /// it was headed (plainly in an unversioned bucket, or as
    /// `versionId=null` under newer versions). Keys and rows use this.
    pub fn version_name(&self) -> Option<&str> {
        self.version_id.as_deref().filter(|id| *id != "null")
    }
}

/// The user metadata key (`x-amz-meta-sha256`) whose value is a declared hash.
pub const DECLARED_SHA256_METADATA: &str = "sha256";

/// Where an input hash came from: `input_hash_source` in every job's log
/// event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum FingerprintSource {
    /// S3's full-object SHA-256 checksum of the bytes (S3 verified it when
    /// they were uploaded).
    S3Checksum,
    /// mediaonce hashed the bytes as it read them, for this job.
    Computed,
    /// mediaonce hashed this object version's bytes earlier and cached it.
    Cached,
    /// Bucket, key, version and ETag: not a hash of the bytes.
    VersionEtag,
    /// The SHA-256 that the upstream job's manifest records for the file a
    /// chained job reads (mediaonce hashed it when it wrote the file).
    UpstreamManifest,
}

impl FingerprintSource {
    pub fn as_str(self) -> &'static str {
        match self {
            FingerprintSource::S3Checksum => "s3-checksum",
            FingerprintSource::Computed => "computed",
            FingerprintSource::Cached => "cached",
            FingerprintSource::VersionEtag => "version-etag",
            FingerprintSource::UpstreamManifest => "upstream-manifest",
        }
    }

    /// Whether the input hash is the SHA-256 of the bytes, which a step
    /// reading them all can check.
    pub fn is_content(self) -> bool {
        self != FingerprintSource::VersionEtag
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// 64 lowercase hex digits.
    pub input_hash: String,
    pub source: FingerprintSource,
}

/// The input hash of an object version from its head alone: S3's
/// full-object SHA-256 when it has one, else version and ETag (the
/// `checksum` identity).
pub fn fingerprint(head: &ObjectHead) -> Fingerprint {
    s3_checksum(head).unwrap_or_else(|| version_etag(head))
}

/// S3's full-object SHA-256 of the object, if it has one.
pub fn s3_checksum(head: &ObjectHead) -> Option<Fingerprint> {
    full_object_sha256_hex(head).map(|hex| Fingerprint {
        input_hash: hex,
        source: FingerprintSource::S3Checksum,
    })
}

/// The fingerprint of where the bytes are and which version they are.
pub fn version_etag(head: &ObjectHead) -> Fingerprint {
    let text = format!(
        "s3-version-etag\n{}\n{}\n{}\n{}",
        head.bucket,
        head.key,
        head.version_name().unwrap_or(""),
        head.etag.trim_matches('"'),
    );
    Fingerprint {
        input_hash: sha256_hex(text.as_bytes()),
        source: FingerprintSource::VersionEtag,
    }
}

/// The object's SHA-256 in hex when it is a checksum of the whole object.
///
/// A composite (multipart) checksum is a hash of part hashes, not of the
/// bytes, and two uploads of the same bytes in different part sizes differ:
/// it is marked `COMPOSITE` and its value ends in `-N`. When S3 does not say
/// the type (older emulators), a value without `-N` is a full-object one.
fn full_object_sha256_hex(head: &ObjectHead) -> Option<String> {
    let value = head.checksum_sha256.as_deref()?;
    let composite = head.checksum_type.as_deref() == Some("COMPOSITE") || value.contains('-');
    if composite {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value)
        .ok()?;
    (bytes.len() == 32).then(|| hex::encode(bytes))
}

/// Whether the object HeadObject found is the one the event announced.
///
/// In a versioned bucket we asked for the event's version, so it is. In an
/// unversioned one, a different ETag means the key was overwritten since the
/// event: those bytes belong to a later event, and this one is skipped.
pub fn replaced_since_event(
    event_etag: Option<&str>,
    event_version: Option<&str>,
    head: &ObjectHead,
) -> bool {
    match (event_version, event_etag) {
        (Some(_), _) => false,
        (None, Some(etag)) => etag.trim_matches('"') != head.etag.trim_matches('"'),
        (None, None) => false,
    }
}

/// The SHA-256 of bytes as they stream past, and how many there were: the
/// one hashing path for content (probe's `verify`, the outputs' manifest
/// entries, `bench/sha256.sh`). `sha2` picks SHA-NI or the ARMv8 SHA
/// extensions at run time; the release profile builds it at `opt-level = 3`.
#[derive(Debug, Clone, Default)]
pub struct ContentHasher {
    hasher: Sha256,
    size: u64,
}

impl ContentHasher {
    pub fn new() -> Self {
        ContentHasher::default()
    }

    /// Takes the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
    }

    /// Bytes taken so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The lowercase hex SHA-256 of every byte taken.
    pub fn finish(self) -> String {
        hex::encode(self.hasher.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> ObjectHead {
        ObjectHead {
            bucket: "in".into(),
            key: "a b.jpg".into(),
            version_id: Some("v1".into()),
            etag: "\"d41d8cd98f00b204e9800998ecf8427e\"".into(),
            size: 0,
            ..Default::default()
        }
    }

    #[test]
    fn full_object_checksum_is_the_hash_in_hex() {
        // SHA-256 of the empty string.
        let h = ObjectHead {
            checksum_sha256: Some("47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=".into()),
            checksum_type: Some("FULL_OBJECT".into()),
            ..head()
        };
        let fp = fingerprint(&h);
        assert_eq!(fp.source, FingerprintSource::S3Checksum);
        assert_eq!(
            fp.input_hash,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn composite_checksum_falls_back_to_version_and_etag() {
        let h = ObjectHead {
            checksum_sha256: Some("47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=-3".into()),
            ..head()
        };
        assert_eq!(fingerprint(&h).source, FingerprintSource::VersionEtag);
        let typed = ObjectHead {
            checksum_sha256: Some("47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=".into()),
            checksum_type: Some("COMPOSITE".into()),
            ..head()
        };
        assert_eq!(fingerprint(&typed).source, FingerprintSource::VersionEtag);
    }

    #[test]
    fn version_etag_form_is_documented_string() {
        let expected =
            sha256_hex(b"s3-version-etag\nin\na b.jpg\nv1\nd41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(fingerprint(&head()).input_hash, expected);
        let unversioned = ObjectHead {
            version_id: None,
            ..head()
        };
        let expected =
            sha256_hex(b"s3-version-etag\nin\na b.jpg\n\nd41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(fingerprint(&unversioned).input_hash, expected);
        // The null version headed by its id under newer versions is the
        // same version, keyed the same.
        let null_by_id = ObjectHead {
            version_id: Some("null".into()),
            ..head()
        };
        assert_eq!(fingerprint(&null_by_id).input_hash, expected);
        assert_eq!(null_by_id.version_name(), None);
    }

    #[test]
    fn every_part_of_the_fingerprint_changes_the_key() {
        let base = fingerprint(&head()).input_hash;
        for changed in [
            ObjectHead {
                bucket: "other".into(),
                ..head()
            },
            ObjectHead {
                key: "a+b.jpg".into(),
                ..head()
            },
            ObjectHead {
                version_id: Some("v2".into()),
                ..head()
            },
            ObjectHead {
                etag: "abc".into(),
                ..head()
            },
        ] {
            assert_ne!(fingerprint(&changed).input_hash, base);
        }
    }

    #[test]
    fn replaced_only_when_unversioned_and_etag_differs() {
        let h = head();
        assert!(!replaced_since_event(
            Some("d41d8cd98f00b204e9800998ecf8427e"),
            None,
            &h
        ));
        assert!(replaced_since_event(Some("0000"), None, &h));
        assert!(!replaced_since_event(Some("0000"), Some("v1"), &h));
        assert!(!replaced_since_event(None, None, &h));
    }

    #[test]
    fn content_hashes_do_not_depend_on_the_chunks() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut whole = ContentHasher::new();
        whole.update(&bytes);
        let mut pieces = ContentHasher::new();
        for chunk in bytes.chunks(4_093) {
            pieces.update(chunk);
        }
        pieces.update(&[]);
        assert_eq!((whole.size(), pieces.size()), (100_000, 100_000));
        let expected = sha256_hex(&bytes);
        assert_eq!(whole.finish(), expected);
        assert_eq!(pieces.finish(), expected);
        // FIPS 180-2's "abc".
        let mut abc = ContentHasher::new();
        abc.update(b"abc");
        assert_eq!(
            abc.finish(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
