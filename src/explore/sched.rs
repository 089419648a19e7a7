//! The explorer's scheduler: every ledger and object call of every actor
//! waits at the gate ([`CallGate`]) until the explorer chooses it, so that
//! one seed chooses one interleaving. Actors run as tasks of one
//! current-thread runtime; a task knows its actor by a task-local id
//! ([`ACTOR`], inherited by the tasks a batch spawns).

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

pub use crate::faults::ACTOR;
use crate::faults::{Call, CallGate};

/// A call held at the gate.
#[derive(Debug)]
pub struct Held {
    pub actor: u64,
    pub call: Call,
    pub key: String,
    /// Lets it go, or answers it with an error instead.
    go: oneshot::Sender<Option<String>>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// Actors that crashed: a call of theirs never goes ahead.
    crashed: std::collections::BTreeSet<u64>,
    /// Held calls, in the order they arrived.
    held: BTreeMap<u64, Held>,
    /// Calls that arrived, ever: the explorer waits for the runtime to
    /// settle by watching it.
    arrived: u64,
}

/// The gate every client call of an actor passes.
#[derive(Debug, Default)]
pub struct Scheduler {
    state: Mutex<State>,
}

impl Scheduler {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The held calls: (ticket, actor, call, key), in arrival order.
    pub fn held(&self) -> Vec<(u64, u64, Call, String)> {
        self.state()
            .held
            .iter()
            .map(|(ticket, h)| (*ticket, h.actor, h.call, h.key.clone()))
            .collect()
    }

    pub fn arrived(&self) -> u64 {
        self.state().arrived
    }

    /// Lets the call with `ticket` go ahead.
    pub fn release(&self, ticket: u64) -> Option<Held> {
        self.answer(ticket, None)
    }

    /// Answers the call with `ticket` with `error` (a contention code the
    /// service would answer it with under load) instead of letting it go:
    /// it has no effect, and its caller retries it or gives up.
    pub fn refuse(&self, ticket: u64, error: &str) -> Option<Held> {
        self.answer(ticket, Some(error.to_string()))
    }

    fn answer(&self, ticket: u64, error: Option<String>) -> Option<Held> {
        let held = self.state().held.remove(&ticket)?;
        let _ = held.go.send(error);
        // The sender is spent; the rest of `Held` says what went.
        Some(Held {
            go: oneshot::channel().0,
            ..held
        })
    }

    /// `actor` crashed: the calls it holds never go ahead, nor does any
    /// it makes later (a task of its that was between calls stops at its
    /// next one), as a process that died makes no more calls.
    pub fn crash(&self, actor: u64) {
        let mut state = self.state();
        state.crashed.insert(actor);
        state.held.retain(|_, h| h.actor != actor);
    }
}

#[async_trait::async_trait]
impl CallGate for Scheduler {
    async fn pass(&self, call: Call, key: &str) -> Option<String> {
        let actor = ACTOR.try_with(|a| *a).unwrap_or(0);
        if actor == 0 {
            return None;
        }
        let (go, wait) = oneshot::channel();
        let crashed = {
            let mut state = self.state();
            let crashed = state.crashed.contains(&actor);
            state.next += 1;
            state.arrived += 1;
            let ticket = state.next;
            state.held.insert(
                ticket,
                Held {
                    actor,
                    call,
                    key: key.to_string(),
                    go,
                },
            );
            if crashed {
                state.held.remove(&ticket);
            }
            crashed
        };
        if crashed {
            return std::future::pending().await;
        }
        // A dropped sender (its actor crashed) never resumes it.
        match wait.await {
            Ok(answer) => answer,
            Err(_) => std::future::pending().await,
        }
    }
}
