//! The built-in steps, and the registry that names steps for recipes.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::bmff::BmffError;
use crate::step::{AnyStep, Step, StepError};

pub mod ffmpeg;
pub mod hls;
pub mod poster;
pub mod probe;
pub mod storyboard;
pub mod thumbnail;

/// Steps by name.
#[derive(Clone, Default)]
pub struct StepRegistry {
    steps: BTreeMap<String, Arc<dyn AnyStep>>,
}

impl StepRegistry {
    /// The built-in steps, set up from the process environment.
    pub fn builtin() -> Self {
        Self::builtin_from(|name| std::env::var(name).ok())
    }

    /// The built-in steps, set up from `lookup` (the environment, or a map
    /// in tests): `thumbnail` with `MEDIAONCE_MAX_PIXELS`, the movie steps
    /// with `MEDIAONCE_FFMPEG`.
    pub fn builtin_from(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut registry = StepRegistry::default();
        registry.register(probe::Probe);
        registry.register(thumbnail::Thumbnail::from_lookup(&lookup));
        registry.register(hls::HlsPackage::from_lookup(&lookup));
        registry.register(hls::chunk_job::HlsChunk(hls::HlsPackage::from_lookup(
            &lookup,
        )));
        registry.register(poster::Poster::from_lookup(&lookup));
        registry.register(storyboard::Storyboard::from_lookup(&lookup));
        registry
    }

    /// Adds a step, replacing one of the same name.
    pub fn register<S: Step>(&mut self, step: S) {
        let step: Arc<dyn AnyStep> = Arc::new(Arc::new(step));
        self.steps.insert(step.name().to_string(), step);
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn AnyStep>> {
        self.steps.get(name).cloned()
    }

    pub fn names(&self) -> Vec<&str> {
        self.steps.keys().map(String::as_str).collect()
    }
}

impl std::fmt::Debug for StepRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.steps.keys()).finish()
    }
}

/// A movie that could not be read, as a step's error: unprocessable when
/// the file itself is at fault (reading it again gives the same answer),
/// else a failure worth retrying; `what` says what was being read.
pub fn movie_error(err: BmffError, what: &str) -> StepError {
    let message = format!("{what}: {err}");
    if err.is_permanent() {
        StepError::Unprocessable(message)
    } else {
        StepError::Failed(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_steps() {
        assert_eq!(
            StepRegistry::builtin().names(),
            vec![
                "hls-chunk",
                "hls-package",
                "poster",
                "probe",
                "storyboard",
                "thumbnail"
            ]
        );
    }
}
