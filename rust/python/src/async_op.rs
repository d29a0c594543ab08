//! `push_async`: an engine op whose work is done by a Python thread (the distributed KVStore's
//! communication thread), so that communication is ordered with the computation that produces
//! and consumes its arrays while no engine worker, and no GIL, is held during it.
//!
//! The op's engine body only hands its completion over to the [`AsyncOp`] ticket and returns.
//! Python waits (GIL released) for the ticket to start, works on the arrays' memory in place
//! (mpi4py releases the GIL inside MPI calls) and completes the ticket; until then the op holds the
//! arrays' vars, so readers wait for the result and writers for the end of the communication.

use std::sync::{Arc, Condvar, Mutex};

use oxnet::engine::{self, Completion, PushProps};
use oxnet::ndarray::NDArray;
use oxnet::DeviceType;
use pyo3::prelude::*;

use crate::errors::{IntoPyResult, MXNetError};
use crate::ndarray::NDArrayHandle;

enum Stage {
    /// The op waits for its dependencies.
    Waiting,
    /// Its dependencies are met: the arrays are the op's until it is completed.
    Started(Completion),
    /// It will not run: an input holds this failure (already stored on what it writes).
    Skipped(String),
    Completed,
}

struct Shared {
    /// Moved forward only: Waiting -> Started | Skipped, Started -> Completed. The lock is held
    /// only to read or move the stage, never while the GIL is being acquired.
    stage: Mutex<Stage>,
    /// Signalled when the stage leaves Waiting.
    changed: Condvar,
}

/// How many async ops have started (or been skipped) so far, and the condition signalled at each,
/// so that a thread serving many ops can sleep until any of them starts. The lock is held only to
/// read or bump the count.
struct StartCount {
    count: Mutex<u64>,
    changed: Condvar,
}

static STARTS: StartCount = StartCount { count: Mutex::new(0), changed: Condvar::new() };

/// A pushed asynchronous op, returned by `push_async`.
#[pyclass(module = "oxnet._core", name = "AsyncOp", frozen)]
pub struct AsyncOp {
    shared: Arc<Shared>,
    /// The op's arrays, reads then writes as pushed (kept alive until the ticket is dropped).
    arrays: Vec<NDArray>,
    name: String,
}

#[pymethods]
impl AsyncOp {
    /// Whether the op left the waiting stage (started, skipped or completed), without blocking.
    fn started(&self) -> bool {
        !matches!(*self.shared.stage.lock().unwrap(), Stage::Waiting)
    }

    /// Block, with the GIL released, until the engine starts the op; raise MXNetError naming the
    /// failure when the op will not run because one of its inputs failed.
    fn wait_started(&self, py: Python<'_>) -> PyResult<()> {
        let shared = self.shared.clone();
        let skipped = py.detach(move || {
            let mut stage = shared.stage.lock().unwrap();
            while matches!(*stage, Stage::Waiting) {
                stage = shared.changed.wait(stage).unwrap();
            }
            match &*stage {
                Stage::Skipped(message) => Some(message.clone()),
                _ => None,
            }
        });
        match skipped {
            Some(message) => Err(MXNetError::new_err(format!("{} did not run: {message}", self.name))),
            None => Ok(()),
        }
    }

    /// (address, bytes) of each array, reads then writes, for work on their memory in place. Only
    /// while the op is started: then no other op touches them.
    fn addresses(&self) -> PyResult<Vec<(usize, usize)>> {
        if !matches!(*self.shared.stage.lock().unwrap(), Stage::Started(_)) {
            return Err(MXNetError::new_err(format!("{}: its arrays are only accessible while the op is started", self.name)));
        }
        self.arrays
            .iter()
            .map(|a| {
                if a.context().device_type != DeviceType::Cpu {
                    return Err(MXNetError::new_err(format!("{}: array on {} is not in host memory", self.name, a.context())));
                }
                Ok((a.data_ptr().py()? as usize, a.nbytes()))
            })
            .collect()
    }

    /// End the started op: its vars go to the ops waiting for them; an `error` message fails it,
    /// to be raised at the next wait on what it writes.
    #[pyo3(signature = (error=None))]
    fn complete(&self, py: Python<'_>, error: Option<String>) -> PyResult<()> {
        let stage = std::mem::replace(&mut *self.shared.stage.lock().unwrap(), Stage::Completed);
        let Stage::Started(completion) = stage else {
            return Err(MXNetError::new_err(format!("{}: complete() needs a started, not yet completed op", self.name)));
        };
        let result = error.map_or(Ok(()), |message| Err(oxnet::err!(Runtime, "{message}")));
        py.detach(move || completion.done(result));
        Ok(())
    }
}

/// Push an op reading `reads` and writing `writes` whose work the caller does on its own thread:
/// wait for `wait_started()`, work on `addresses()`, then `complete()`. A ticket dropped while
/// started fails the op instead of leaving its arrays held forever.
#[pyfunction]
fn push_async(reads: Vec<PyRef<'_, NDArrayHandle>>, writes: Vec<PyRef<'_, NDArrayHandle>>, name: String) -> AsyncOp {
    let shared = Arc::new(Shared { stage: Mutex::new(Stage::Waiting), changed: Condvar::new() });
    let read_arrays: Vec<NDArray> = reads.iter().map(|h| h.inner.clone()).collect();
    let write_arrays: Vec<NDArray> = writes.iter().map(|h| h.inner.clone()).collect();
    let read_vars: Vec<_> = read_arrays.iter().map(|a| a.var().clone()).collect();
    let write_vars: Vec<_> = write_arrays.iter().map(|a| a.var().clone()).collect();
    let notify = shared.clone();
    engine::push_async(
        Box::new(move |start| {
            let mut stage = notify.stage.lock().unwrap();
            *stage = match start {
                Ok(completion) => Stage::Started(completion),
                Err(error) => Stage::Skipped(error.message),
            };
            notify.changed.notify_all();
            drop(stage);
            *STARTS.count.lock().unwrap() += 1;
            STARTS.changed.notify_all();
        }),
        &read_vars,
        &write_vars,
        // Starting only hands the completion over: cheaper here than on another thread.
        PushProps { inline_if_ready: true },
        Box::new(name.clone()),
    );
    AsyncOp { shared, arrays: read_arrays.into_iter().chain(write_arrays).collect(), name }
}

/// How many async ops have left the waiting stage so far (see `wait_async_op_starts`).
#[pyfunction]
fn async_op_starts() -> u64 {
    *STARTS.count.lock().unwrap()
}

/// Block, with the GIL released, until more than `seen` async ops have started or `timeout`
/// seconds have passed; return the count then.
#[pyfunction]
fn wait_async_op_starts(py: Python<'_>, seen: u64, timeout: f64) -> u64 {
    let timeout = std::time::Duration::from_secs_f64(timeout.max(0.0));
    py.detach(move || {
        let count = STARTS.count.lock().unwrap();
        let (count, _) = STARTS.changed.wait_timeout_while(count, timeout, |count| *count <= seen).unwrap();
        *count
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<AsyncOp>()?;
    m.add_function(wrap_pyfunction!(push_async, m)?)?;
    m.add_function(wrap_pyfunction!(async_op_starts, m)?)?;
    m.add_function(wrap_pyfunction!(wait_async_op_starts, m)?)?;
    Ok(())
}
