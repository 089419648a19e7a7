//! The tests' own steps: counted, panicking, hanging and gated ones, and
//! the panic hook that keeps injected panics quiet.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mediaonce::step::{JobOutputs, Step, StepContext, StepError};
use mediaonce::steps::probe::Probe;
use mediaonce::steps::probe::ProbeParams;

/// The probe step under another name, counting how often it runs: what
/// "exactly once" is about is step executions, not reported outcomes.
#[derive(Debug, Default, Clone)]
pub struct CountedProbe(Arc<AtomicUsize>);

impl CountedProbe {
    pub const NAME: &'static str = "counted-probe";

    pub fn runs(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Step for CountedProbe {
    type Params = ProbeParams;

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn params(
        &self,
        params: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<ProbeParams, String> {
        Probe.params(params)
    }

    async fn run(
        &self,
        params: &ProbeParams,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Probe.run(params, context, outputs).await
    }
}

/// Params for the tests' steps that take none: any object.
fn no_params(_params: &serde_json::Map<String, serde_json::Value>) -> Result<(), String> {
    Ok(())
}

/// A step that panics: a bug in a step must fail its job, not the batch,
/// and must not leave the claim running.
#[derive(Debug, Default, Clone)]
pub struct PanickingStep;

#[async_trait::async_trait]
impl Step for PanickingStep {
    type Params = ();

    fn name(&self) -> &'static str {
        "panics"
    }

    fn params(&self, params: &serde_json::Map<String, serde_json::Value>) -> Result<(), String> {
        no_params(params)
    }

    async fn run(
        &self,
        _params: &(),
        _context: &StepContext<'_>,
        _outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        panic!("{INJECTED_PANIC}: a bug in the step")
    }
}

/// How every panic the tests inject on purpose begins: the hook that
/// [`quiet_injected_panics`] installs prints nothing for them.
pub const INJECTED_PANIC: &str = "injected panic";

/// Installs (once per process) a panic hook that is silent for the tests'
/// injected panics, which the handler catches and reports as failed jobs,
/// and hands every other panic, with its backtrace, to the default hook.
pub fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or_default();
            if !message.starts_with(INJECTED_PANIC) {
                default(info);
            }
        }));
    });
}

/// A step that never finishes on its own, as a stuck decoder would not:
/// only the invocation deadline ends it.
#[derive(Debug, Default, Clone)]
pub struct HangingStep;

#[async_trait::async_trait]
impl Step for HangingStep {
    type Params = ();

    fn name(&self) -> &'static str {
        "hangs"
    }

    fn params(&self, params: &serde_json::Map<String, serde_json::Value>) -> Result<(), String> {
        no_params(params)
    }

    async fn run(
        &self,
        _params: &(),
        _context: &StepContext<'_>,
        _outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        std::future::pending().await
    }
}

/// The probe step behind a gate: the first run waits at the gate until the
/// test opens it (a worker stalled mid-job); later runs pass straight on.
#[derive(Debug, Default, Clone)]
pub struct GatedProbe {
    first_taken: Arc<std::sync::atomic::AtomicBool>,
    arrived: Arc<tokio::sync::Notify>,
    open: Arc<tokio::sync::Notify>,
}

impl GatedProbe {
    /// Waits until the first run stands at the gate.
    pub async fn first_arrived(&self) {
        self.arrived.notified().await
    }

    /// Lets the first run go on.
    pub fn open(&self) {
        self.open.notify_one()
    }
}

#[async_trait::async_trait]
impl Step for GatedProbe {
    type Params = ProbeParams;

    fn name(&self) -> &'static str {
        "gated-probe"
    }

    fn params(
        &self,
        params: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<ProbeParams, String> {
        Probe.params(params)
    }

    async fn run(
        &self,
        params: &ProbeParams,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        if !self.first_taken.swap(true, Ordering::SeqCst) {
            let opened = self.open.notified();
            self.arrived.notify_one();
            opened.await;
        }
        Probe.run(params, context, outputs).await
    }
}
