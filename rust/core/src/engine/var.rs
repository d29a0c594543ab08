//! An engine variable: the dependency queue of one piece of mutable state.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::{ErrorCell, OprBlock};
use crate::error::Error;

#[derive(Default)]
struct VarState {
    /// Granted readers still running.
    running_reads: usize,
    /// A granted writer is running.
    writing: bool,
    /// Ops not yet granted, in push order; `true` marks a write.
    queue: VecDeque<(Arc<OprBlock>, bool)>,
    /// The error of the last failed write, until a later write succeeds. The cell is shared with
    /// every array the failure spread to; it is emptied once the error has been reported.
    error: Option<ErrorCell>,
}

/// Readers run together; a writer runs alone; everyone is served in push order.
#[derive(Default)]
pub struct Var {
    // One lock per var: held only for queue bookkeeping, never while an op runs, and never
    // together with another var's lock, so no lock-order cycle can form. It is taken inside the
    // engine's registration lock (see `register`) and encloses only error cells' locks.
    state: Mutex<VarState>,
}

impl Var {
    pub fn new() -> Arc<Var> {
        Arc::new(Var::default())
    }

    /// Register a read; true when it is granted at once.
    pub(crate) fn append_read(&self, blk: &Arc<OprBlock>) -> bool {
        let mut s = self.state.lock().unwrap();
        if !s.writing && s.queue.is_empty() {
            s.running_reads += 1;
            true
        } else {
            s.queue.push_back((blk.clone(), false));
            false
        }
    }

    /// Register a write; true when it is granted at once.
    pub(crate) fn append_write(&self, blk: &Arc<OprBlock>) -> bool {
        let mut s = self.state.lock().unwrap();
        if !s.writing && s.running_reads == 0 && s.queue.is_empty() {
            s.writing = true;
            true
        } else {
            s.queue.push_back((blk.clone(), true));
            false
        }
    }

    pub(crate) fn complete_read(&self, ready: &mut Vec<Arc<OprBlock>>) {
        let mut s = self.state.lock().unwrap();
        s.running_reads -= 1;
        if s.running_reads == 0 {
            if let Some((_, true)) = s.queue.front() {
                let (blk, _) = s.queue.pop_front().unwrap();
                s.writing = true;
                ready.push(blk);
            }
        }
    }

    /// Take the var for an op that runs at once without queueing (see `engine::run_if_free`):
    /// only when nothing runs or waits on it and it holds no error. The engine's registration
    /// lock must be held, so that nothing can be queued on the var until the op completes or
    /// `undo_acquire` gives the var back.
    pub(crate) fn try_acquire(&self, write: bool) -> bool {
        let mut s = self.state.lock().unwrap();
        let free = !s.writing && s.queue.is_empty() && s.error.is_none() && (!write || s.running_reads == 0);
        if free {
            if write {
                s.writing = true;
            } else {
                s.running_reads += 1;
            }
        }
        free
    }

    /// Give back what `try_acquire` took, under the same registration lock: the queue is still
    /// empty, so there is nobody to grant.
    pub(crate) fn undo_acquire(&self, write: bool) {
        let mut s = self.state.lock().unwrap();
        if write {
            s.writing = false;
        } else {
            s.running_reads -= 1;
        }
    }

    /// A write ended: store how it ended (a successful write replaces the var's content, so any
    /// earlier error goes; a failure stays until reported or overwritten) and grant the next ops.
    pub(crate) fn complete_write_storing(&self, error: Option<ErrorCell>, ready: &mut Vec<Arc<OprBlock>>) {
        let mut s = self.state.lock().unwrap();
        s.error = error;
        Self::grant_after_write(&mut s, ready);
    }

    pub(crate) fn complete_write(&self, ready: &mut Vec<Arc<OprBlock>>) {
        Self::grant_after_write(&mut self.state.lock().unwrap(), ready);
    }

    fn grant_after_write(s: &mut VarState, ready: &mut Vec<Arc<OprBlock>>) {
        s.writing = false;
        while let Some((_, false)) = s.queue.front() {
            let (blk, _) = s.queue.pop_front().unwrap();
            s.running_reads += 1;
            ready.push(blk);
        }
        if s.running_reads == 0 {
            if let Some((_, true)) = s.queue.front() {
                let (blk, _) = s.queue.pop_front().unwrap();
                s.writing = true;
                ready.push(blk);
            }
        }
    }

    /// Whether a read (or, with `for_write`, a write) pushed now would have to wait.
    pub(crate) fn is_busy(&self, for_write: bool) -> bool {
        let s = self.state.lock().unwrap();
        s.writing || !s.queue.is_empty() || (for_write && s.running_reads > 0)
    }

    /// The cell of the last failed write while it still holds an unreported error; an op reading
    /// this var inherits the cell, so reporting the error through any array reports it for all.
    pub(crate) fn unreported_error(&self) -> Option<ErrorCell> {
        // Lock order: a var's lock, then an error cell's lock (never the reverse).
        let s = self.state.lock().unwrap();
        s.error.as_ref().filter(|cell| cell.lock().unwrap().is_some()).cloned()
    }

    /// Report the unreported error of this var: return it and empty its cell, so neither this
    /// var, nor any other array the failure spread to, nor `wait_all` raises it again.
    pub(crate) fn take_error(&self) -> Option<Error> {
        let s = self.state.lock().unwrap();
        s.error.as_ref().and_then(|cell| cell.lock().unwrap().take())
    }
}
