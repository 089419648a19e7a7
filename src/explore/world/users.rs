//! The users: uploads of a few contents to a few keys (in parts or not,
//! with S3's SHA-256 or without), reprocess clicks, deletes, and in a
//! versioned bucket delete markers and versions removed for good (a DELETE
//! naming one, or a lifecycle expiration); S3's notification of each,
//! sometimes twice.

use super::{Bucket, Object, World, BUCKET};
use crate::event::{created_notification, marker_notification, removed_notification};
use crate::key::sha256_hex;
use crate::store::{ObjectClient, ObjectRef};

/// The bytes of the world's content number `content`.
pub(super) fn content_bytes(content: u32) -> Vec<u8> {
    format!("content {content}").into_bytes()
}

impl Object {
    /// Its bytes.
    pub(super) fn bytes(&self) -> Vec<u8> {
        content_bytes(self.content)
    }
}

impl World {
    /// One user action on one of the keys.
    pub(super) fn user(&mut self) {
        let key = format!("k{}", self.rng.u32(0..self.options.keys));
        let current = self.current_of(&key);
        if let (Some(name), 0) = (&current, self.rng.u32(0..10)) {
            // A user's "reprocess" (or `backfill`): a create with no ETag.
            let version = self.inputs[name].version.clone();
            self.act("reprocess", 0, format!("reprocess {key}"));
            let body = created_notification(BUCKET, &key, version.as_deref(), None, None);
            self.enqueue(body, 0);
            return;
        }
        let versions = self.versions_of(&key);
        if self.bucket == Bucket::Versioned && !versions.is_empty() && self.rng.u32(0..6) == 0 {
            let name = versions[self.rng.usize(0..versions.len())].clone();
            let lifecycle = self.rng.bool();
            return self.delete_version(name, lifecycle);
        }
        if current.is_none() || self.rng.u32(0..10) < 6 {
            self.upload(key);
        } else {
            self.delete(key);
        }
    }

    /// The live object the key shows now: its name in `inputs`.
    pub(super) fn current_of(&self, key: &str) -> Option<String> {
        match self.bucket {
            Bucket::Versioned => {
                let version = self.parts.objects.current_version(BUCKET, key)?;
                let name = format!("{key}@{version}");
                self.inputs.contains_key(&name).then_some(name)
            }
            _ => self.inputs.contains_key(key).then(|| key.to_string()),
        }
    }

    /// The live objects of a key: its versions (of a versioned bucket), or
    /// its one object.
    pub(super) fn versions_of(&self, key: &str) -> Vec<String> {
        self.inputs
            .iter()
            .filter(|(_, object)| object.key == key)
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn upload(&mut self, key: String) {
        // One upload in four to a live key sends its bytes again (a user
        // uploading the same file twice, a sync tool), half of those in
        // parts: the same bytes, another ETag.
        let again = self
            .current_of(&key)
            .filter(|_| self.rng.u32(0..4) == 0)
            .map(|name| self.inputs[&name].content);
        let content = again.unwrap_or_else(|| self.rng.u32(0..self.options.contents));
        let bytes = content_bytes(content);
        let sha256 = self.rng.bool();
        let multipart = self.rng.u32(0..if again.is_some() { 2 } else { 4 }) == 0;
        let etag = if multipart {
            self.parts
                .objects
                .insert_multipart(BUCKET, &key, &bytes, sha256)
        } else {
            self.parts.objects.insert(BUCKET, &key, &bytes, sha256)
        };
        let etag = etag.trim_matches('"').to_string();
        let version = self.parts.objects.current_version(BUCKET, &key);
        let written = self.report.steps;

        // What the handler keys the bytes by: their SHA-256 when S3 has it
        // or the identity is by content, else (`auto`, read by ranges) the
        // version and ETag.
        let input_hash = if self.parts.by_content || sha256 {
            sha256_hex(&bytes)
        } else {
            let object = ObjectRef {
                bucket: BUCKET.into(),
                key: key.clone(),
                version_id: version.clone(),
                if_match: None,
            };
            use futures::FutureExt;
            match self.parts.objects.head_object(&object).now_or_never() {
                Some(Ok(Some(head))) => crate::fingerprint::version_etag(&head).input_hash,
                _ => sha256_hex(&bytes),
            }
        };
        let jobs = self.jobs_of(&input_hash, &bytes);
        let name = match &version {
            Some(version) => format!("{key}@{version}"),
            None => key.clone(),
        };
        for job in self.jobs_ever(&input_hash, &bytes) {
            self.keyed.entry(job).or_default().insert(name.clone());
        }
        // The same bytes again over the same version (another ETag,
        // perhaps): what was promised of the jobs they still key to stays
        // promised, for a version's references of the same bytes only
        // grow (DESIGN.md, "References"). Keyed by version and ETag, the
        // root job is another, and the chained one (keyed by the root's
        // output) the same.
        let was = self
            .inputs
            .get(&name)
            .filter(|was| was.content == content && self.deployment.generation == was.generation);
        let promised = was.is_some_and(|was| was.promised && was.jobs[0] == jobs[0]);
        let walked = promised && was.is_some_and(|was| was.walked);
        let chained_done =
            was.is_some_and(|was| was.chained_done && was.jobs.get(1) == jobs.get(1));
        self.superseded(&key);
        self.inputs.insert(
            name.clone(),
            Object {
                key: key.clone(),
                version: version.clone(),
                input_hash,
                configured: true,
                generation: self.deployment.generation,
                jobs,
                content,
                etag: etag.clone(),
                written,
                promised,
                walked,
                chained_done,
                dead_lettered: false,
                backfilled: false,
                hidden: false,
            },
        );
        let how = match (multipart, sha256) {
            (true, true) => " (in parts, SHA-256)",
            (true, false) => " (in parts)",
            (false, true) => " (SHA-256)",
            (false, false) => "",
        };
        let kept = match (promised, chained_done) {
            (true, true) => ", its promise kept",
            (false, true) => ", its chained job's promise kept",
            (true, false) => ", its root job's promise kept",
            (false, false) => "",
        };
        self.act(
            "upload",
            0,
            format!("upload {name} content {content}{how}{kept}"),
        );
        let size = bytes.len() as u64;
        self.notify(created_notification(
            BUCKET,
            &key,
            version.as_deref(),
            Some(&etag),
            Some(size),
        ));
    }

    /// A user deletes `key`: in an unversioned bucket the object goes; in
    /// a versioning-suspended one its null version goes for good and a null
    /// marker is put; in a versioned one a delete marker is put and every
    /// version stays.
    pub(super) fn delete(&mut self, key: String) {
        let body = match self.bucket {
            Bucket::Unversioned => {
                self.inputs.remove(&key);
                self.parts.objects.remove(BUCKET, &key);
                self.act("delete", 0, format!("delete {key}"));
                removed_notification(BUCKET, &key, None)
            }
            Bucket::Suspended => {
                self.inputs.remove(&key);
                self.parts.objects.delete_suspended(BUCKET, &key);
                self.act("delete", 0, format!("delete {key} (null marker)"));
                marker_notification(BUCKET, &key, "null")
            }
            Bucket::Versioned => {
                self.superseded(&key);
                let marker = self.parts.objects.put_delete_marker(BUCKET, &key);
                let hides = if self.parts.release_on_marker {
                    // The versions it hides are gone to mediaonce: nothing
                    // of theirs is promised any more, though S3 keeps them
                    // (and they may keep their jobs: a leak bounded by
                    // their life, DESIGN.md "References").
                    for name in self.versions_of(&key) {
                        let object = self.inputs.get_mut(&name).expect("listed");
                        object.promised = false;
                        object.walked = false;
                        object.chained_done = false;
                        object.configured = false;
                        object.hidden = true;
                    }
                    ", releasing what it hides"
                } else {
                    ""
                };
                self.act(
                    "delete",
                    0,
                    format!("delete {key} (marker {marker}{hides})"),
                );
                marker_notification(BUCKET, &key, &marker)
            }
        };
        self.notify(body);
    }

    /// A versioned key's current version is no longer current: a
    /// backfill's create for the key, if still on its way, is not its.
    fn superseded(&mut self, key: &str) {
        for name in self.versions_of(key) {
            let object = self.inputs.get_mut(&name).expect("listed");
            if object.backfilled {
                object.backfilled = false;
                object.configured = false;
            }
        }
    }

    /// A version of a versioned bucket removed for good: by a user's
    /// DELETE naming it, or by a lifecycle rule's expiration.
    pub(super) fn delete_version(&mut self, name: String, lifecycle: bool) {
        let Some(object) = self.inputs.remove(&name) else {
            return;
        };
        let version = object.version.clone().unwrap_or_default();
        self.parts
            .objects
            .delete_version(BUCKET, &object.key, &version);
        let how = if lifecycle { "expire" } else { "delete" };
        self.act("delete", 0, format!("{how} {name}"));
        let mut body = removed_notification(BUCKET, &object.key, Some(&version));
        if lifecycle {
            body = body.replace("ObjectRemoved:Delete", "LifecycleExpiration:Delete");
        }
        self.notify(body);
    }

    /// Every live object gone: each key deleted, and in a versioned bucket
    /// each version removed for good.
    pub(super) fn teardown(&mut self) {
        let names: Vec<String> = self.inputs.keys().cloned().collect();
        for name in names {
            match self.bucket {
                Bucket::Versioned => {
                    let lifecycle = self.rng.bool();
                    self.delete_version(name, lifecycle)
                }
                _ => self.delete(name),
            }
        }
    }

    /// S3's notification, after up to 2 s, sometimes twice.
    fn notify(&mut self, body: String) {
        let delay = self.rng.u64(0..2_000);
        self.enqueue(body.clone(), delay);
        if self.rng.u32(0..10) == 0 {
            let again = delay + self.rng.u64(0..2_000);
            self.enqueue(body, again);
        }
    }
}
