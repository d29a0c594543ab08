//! Operator invocation from Python: `mx.nd.<op>(*args, **kwargs)` lands in [`invoke`].

use std::sync::Arc;

use oxnet::imperative::{PushSite, Site};
use oxnet::ndarray::NDArray;
use oxnet::op::{self, Attrs};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

use crate::errors::IntoPyResult;
use crate::ndarray::{current_context, wrap, NDArrayHandle};

/// The Python `NDArray` class and the package directory, registered once at import.
static NDARRAY_CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static PACKAGE_DIR: PyOnceLock<String> = PyOnceLock::new();
/// The `handle` and `writable` slots of the registered class (None when it does not declare
/// them as its own data descriptors: attribute access then).
static NDARRAY_SLOTS: PyOnceLock<Option<NDArraySlots>> = PyOnceLock::new();

#[pyfunction]
fn _register_python(py: Python<'_>, ndarray_class: Bound<'_, PyType>, package_dir: String) -> PyResult<()> {
    let slots = NDArraySlots::of(&ndarray_class)?;
    let _ = NDARRAY_SLOTS.set(py, slots);
    let _ = NDARRAY_CLASS.set(py, ndarray_class.unbind());
    let _ = PACKAGE_DIR.set(py, package_dir);
    Ok(())
}

/// A data descriptor of the NDArray class (a `__slots__` member) with its getter and setter:
/// reading and writing an instance's slot through them is what `obj.handle` and `obj.handle =
/// h` end up doing, without looking the name up in the class and its bases on every operator
/// call (those lookups and the generic attribute paths were ~5% of a 2x2 add).
struct SlotAccess {
    descriptor: Py<PyAny>,
    get: pyo3::ffi::descrgetfunc,
    set: pyo3::ffi::descrsetfunc,
}

struct NDArraySlots {
    handle: SlotAccess,
    writable: SlotAccess,
}

impl NDArraySlots {
    fn of(class: &Bound<'_, PyType>) -> PyResult<Option<NDArraySlots>> {
        let own = class.getattr(pyo3::intern!(class.py(), "__dict__"))?;
        let slot = |name: &str| -> PyResult<Option<SlotAccess>> {
            let Ok(descriptor) = own.get_item(name) else { return Ok(None) };
            // SAFETY: `descriptor` is a live object (we hold the GIL and a reference), so its
            // type pointer is valid; PyType_GetSlot accepts static types from Python 3.10 on
            // (this module needs 3.11) and returns NULL for an absent slot.
            let (get, set) = unsafe {
                let ty = pyo3::ffi::Py_TYPE(descriptor.as_ptr());
                (pyo3::ffi::PyType_GetSlot(ty, pyo3::ffi::Py_tp_descr_get), pyo3::ffi::PyType_GetSlot(ty, pyo3::ffi::Py_tp_descr_set))
            };
            if get.is_null() || set.is_null() {
                return Ok(None);
            }
            // SAFETY: the tp_descr_get and tp_descr_set slots hold functions of exactly these
            // C signatures (Python's descrgetfunc and descrsetfunc); both are non-null.
            let (get, set) = unsafe {
                (
                    std::mem::transmute::<*mut std::ffi::c_void, pyo3::ffi::descrgetfunc>(get),
                    std::mem::transmute::<*mut std::ffi::c_void, pyo3::ffi::descrsetfunc>(set),
                )
            };
            Ok(Some(SlotAccess { descriptor: descriptor.unbind(), get, set }))
        };
        Ok(match (slot("handle")?, slot("writable")?) {
            (Some(handle), Some(writable)) => Some(NDArraySlots { handle, writable }),
            _ => None,
        })
    }
}

impl SlotAccess {
    /// The slot's value in `obj` (an instance of the class the descriptor belongs to).
    fn get<'py>(&self, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = obj.py();
        // SAFETY: a descriptor getter takes (descriptor, instance, owner type) and returns a
        // new reference, or NULL with an exception set (an unset slot raises AttributeError,
        // a foreign instance TypeError); all three pointers are live while we hold the GIL.
        unsafe { Bound::from_owned_ptr_or_err(py, (self.get)(self.descriptor.as_ptr(), obj.as_ptr(), obj.get_type().as_ptr())) }
    }

    /// Store `value` in `obj`'s slot.
    fn set(&self, obj: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        // SAFETY: a descriptor setter takes (descriptor, instance, value), takes its own
        // reference to `value` and returns 0, or -1 with an exception set; all three pointers
        // are live while we hold the GIL.
        if unsafe { (self.set)(self.descriptor.as_ptr(), obj.as_ptr(), value.as_ptr()) } == 0 {
            Ok(())
        } else {
            Err(PyErr::fetch(obj.py()))
        }
    }
}

/// The handle inside a Python NDArray (or a bare handle); None for anything else.
pub fn as_array(obj: &Bound<'_, PyAny>) -> PyResult<Option<NDArray>> {
    if let Ok(h) = obj.cast::<NDArrayHandle>() {
        return Ok(Some(h.get().inner.clone()));
    }
    let py = obj.py();
    match NDARRAY_CLASS.get(py) {
        // The exact class first: isinstance walks the class hierarchy, at a tenth of a small op's cost.
        Some(cls) if obj.get_type().is(cls.bind(py)) => {
            let handle = match NDARRAY_SLOTS.get(py) {
                Some(Some(slots)) => slots.handle.get(obj)?,
                _ => obj.getattr(pyo3::intern!(py, "handle"))?,
            };
            Ok(Some(handle.cast::<NDArrayHandle>()?.get().inner.clone()))
        }
        // A subclass may define `handle` its own way: attribute access.
        Some(cls) if obj.is_instance(cls.bind(py))? => {
            let handle = obj.getattr(pyo3::intern!(py, "handle"))?;
            Ok(Some(handle.cast::<NDArrayHandle>()?.get().inner.clone()))
        }
        _ => Ok(None),
    }
}

/// A Python `NDArray` object around a core array (a bare handle before the class is registered).
pub fn python_ndarray(py: Python<'_>, array: NDArray) -> PyResult<Bound<'_, PyAny>> {
    let handle = wrap(py, array)?;
    let Some(cls) = NDARRAY_CLASS.get(py) else {
        return Ok(handle.into_bound(py).into_any());
    };
    // What `NDArray(handle)` makes, without running `__init__` in the interpreter (that call
    // cost a tenth of a small op): a fresh instance, as `object.__new__(NDArray)` allocates it.
    // SAFETY: `cls` is a type object (the registered NDArray class) and we hold the GIL;
    // PyType_GenericAlloc returns a new reference or NULL with an exception set.
    let array = unsafe { Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyType_GenericAlloc(cls.bind(py).as_type_ptr(), 0))? };
    match NDARRAY_SLOTS.get(py) {
        Some(Some(slots)) => {
            slots.handle.set(&array, handle.bind(py))?;
            slots.writable.set(&array, PyBool::new(py, true).as_any())?;
        }
        _ => {
            array.setattr(pyo3::intern!(py, "handle"), handle)?;
            array.setattr(pyo3::intern!(py, "writable"), true)?;
        }
    }
    Ok(array)
}

/// A call's arguments as MXNet's generated functions take them: the positional values that are
/// inputs (arrays or symbols) in order, the other positional values filling the operator's
/// parameters in declaration order, keyword inputs by name and the other keywords as parameters
/// in MXNet's text form.
pub(crate) struct CallArguments<T> {
    pub inputs: Vec<T>,
    pub keyword_inputs: Vec<(String, T)>,
    pub attrs: Attrs,
}

/// What a keyword given as `None` means.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum NoneKeyword {
    /// A parameter's value (`axis=None`), given to the operator as `None`.
    IsParameter,
    /// Nothing: an absent optional input or a parameter left at its default (`mx.sym`).
    Absent,
}

/// Sort `args` and `kwargs` of a call of operator `def` (see [`CallArguments`]); `input` says
/// which values are inputs.
pub(crate) fn sort_arguments<'py, T>(
    name: &str,
    def: &op::OpDef,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
    none_keyword: NoneKeyword,
    input: impl Fn(&Bound<'py, PyAny>) -> PyResult<Option<T>>,
) -> PyResult<CallArguments<T>> {
    let mut sorted = CallArguments { inputs: Vec::with_capacity(args.len()), keyword_inputs: Vec::new(), attrs: Attrs::new() };
    let mut parameters = Vec::new();
    for a in args.iter() {
        match input(&a)? {
            Some(value) => sorted.inputs.push(value),
            None => parameters.push(a),
        }
    }
    if !parameters.is_empty() {
        let specs = (def.params)();
        if parameters.len() > specs.len() {
            return Err(crate::errors::to_py(oxnet::err!(
                Param,
                "operator {name}: {} positional parameter value(s) given, but it has {} parameter(s)",
                parameters.len(),
                specs.len()
            )));
        }
        for (v, spec) in parameters.iter().zip(specs) {
            sorted.attrs.insert(spec.name.to_string(), attr_string(v)?);
        }
    }
    for (k, v) in kwargs.iter().flat_map(|kw| kw.iter()) {
        let key: String = k.extract()?;
        match input(&v)? {
            Some(value) => sorted.keyword_inputs.push((key, value)),
            None if none_keyword == NoneKeyword::Absent && v.is_none() => {}
            None => {
                sorted.attrs.insert(key, attr_string(&v)?);
            }
        }
    }
    Ok(sorted)
}

/// MXNet's textual form of a parameter value: `True`, `(2, 3)`, `0.5`, `float32`.
pub(crate) fn attr_string(v: &Bound<'_, PyAny>) -> PyResult<String> {
    if v.is_none() {
        return Ok("None".into());
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(if b.is_true() { "True" } else { "False" }.into());
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(s.to_str()?.to_string());
    }
    if v.is_instance_of::<PyInt>() {
        // An integer beyond i64 keeps its digits: the operator's parameter parser then rejects
        // it naming the operator and the parameter, instead of Python's bare OverflowError.
        return match v.extract::<i64>() {
            Ok(i) => Ok(i.to_string()),
            Err(_) => Ok(v.call_method0("__index__")?.str()?.to_str()?.to_string()),
        };
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return Ok(format!("{:?}", f.value()));
    }
    if v.is_instance_of::<PyTuple>() || v.is_instance_of::<PyList>() {
        let items: Vec<String> = v.try_iter()?.map(|i| attr_string(&i?)).collect::<PyResult<_>>()?;
        return Ok(if items.len() == 1 { format!("({},)", items[0]) } else { format!("({})", items.join(", ")) });
    }
    if let Some(name) = numpy_dtype_name(v)? {
        return Ok(name);
    }
    Ok(v.str()?.to_str()?.to_string())
}

/// The name MXNet writes for a NumPy dtype or scalar type given as a parameter (`np.float16`,
/// `np.dtype('float16')`, and MXNet's bfloat16 stand-in, a record dtype with one field named
/// `bfloat16`); None for any other value.
fn numpy_dtype_name(v: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let py = v.py();
    let from_numpy = |t: &Bound<'_, PyType>| -> PyResult<bool> {
        let module: String = t.getattr(pyo3::intern!(py, "__module__"))?.extract()?;
        Ok(module == "numpy" || module.starts_with("numpy."))
    };
    if let Ok(scalar_type) = v.cast::<PyType>() {
        return Ok(if from_numpy(scalar_type)? { Some(scalar_type.getattr(pyo3::intern!(py, "__name__"))?.extract()?) } else { None });
    }
    if !from_numpy(&v.get_type())? || !v.hasattr(pyo3::intern!(py, "names"))? {
        return Ok(None);
    }
    let fields = v.getattr(pyo3::intern!(py, "names"))?;
    if !fields.is_none() && fields.extract::<Vec<String>>()? == ["bfloat16"] {
        return Ok(Some("bfloat16".into()));
    }
    Ok(Some(v.getattr(pyo3::intern!(py, "name"))?.extract()?))
}

/// The innermost caller outside the oxnet package: its code object and instruction offset. The
/// line number is only computed if the op fails (computing it costs more than a small op).
struct PythonSite {
    code: Py<PyAny>,
    lasti: i64,
}

/// Resolved sites by (code object address, instruction offset), each with its code object.
type LocationCache = std::collections::HashMap<(usize, i64), (Py<PyAny>, String)>;

thread_local! {
    /// A profile resolves the same few lines for thousands of operators. An entry keeps its code
    /// object alive, so the address cannot be reused by another code object while it is cached.
    static LOCATIONS: std::cell::RefCell<LocationCache> = Default::default();
}

/// Cached sites at most; past that the cache starts over.
const MAX_CACHED_LOCATIONS: usize = 4096;

impl PushSite for PythonSite {
    fn location(&self) -> String {
        let key = (self.code.as_ptr() as usize, self.lasti);
        if let Some(found) = LOCATIONS.with(|cache| cache.borrow().get(&key).map(|(_, text)| text.clone())) {
            return found;
        }
        let text = self.resolve();
        LOCATIONS.with(|cache| {
            let mut cache = cache.borrow_mut();
            if cache.len() >= MAX_CACHED_LOCATIONS {
                cache.clear();
            }
            let code = Python::attach(|py| self.code.clone_ref(py));
            cache.insert(key, (code, text.clone()));
        });
        text
    }
}

impl PythonSite {
    fn resolve(&self) -> String {
        Python::attach(|py| {
            let code = self.code.bind(py);
            let file: String = code.getattr("co_filename").and_then(|f| f.extract()).unwrap_or_else(|_| "?".into());
            // co_lines() yields (start, end, line) ranges of instruction offsets (Python >= 3.10).
            let line = code.call_method0("co_lines").and_then(|it| it.try_iter().map(|i| i.collect::<Vec<_>>())).ok().and_then(|ranges| {
                ranges.into_iter().filter_map(|r| r.ok()?.extract::<(i64, i64, Option<i64>)>().ok()).find_map(|(start, end, line)| {
                    if start <= self.lasti && self.lasti < end {
                        line
                    } else {
                        None
                    }
                })
            });
            match line {
                Some(l) => format!("{file}:{l}"),
                None => file,
            }
        })
    }
}

thread_local! {
    /// Whether a code object belongs to the oxnet package, by address. Package code objects live
    /// as long as their modules, so a cached verdict stays right for them.
    static IN_PACKAGE: std::cell::RefCell<std::collections::HashMap<usize, bool>> = Default::default();
}

/// The site of the Python call now running, found only when an op must keep it (it is queued,
/// or it failed): walking the interpreter's frames costs more than a small op that runs at once.
struct CallerFrames;

impl PushSite for CallerFrames {
    fn location(&self) -> String {
        self.capture().map(|site| site.location()).unwrap_or_default()
    }
    fn is_deferred(&self) -> bool {
        true
    }
    fn capture(&self) -> Site {
        capture_site()
    }
}

/// The site of the calling Python code, for an op pushed now.
pub fn push_site() -> Site {
    static CALLER: std::sync::OnceLock<Arc<dyn PushSite>> = std::sync::OnceLock::new();
    Some(CALLER.get_or_init(|| Arc::new(CallerFrames)).clone())
}

/// The innermost Python frame outside the oxnet package, as it is now.
fn capture_site() -> Site {
    Python::attach(|py| {
        let package = PACKAGE_DIR.get(py)?;
        // SAFETY: PyEval_GetFrame returns a borrowed reference to the running frame (or NULL),
        // valid while we hold the GIL; from_borrowed_ptr_or_opt takes a new reference.
        let mut frame = unsafe { Bound::from_borrowed_ptr_or_opt(py, pyo3::ffi::PyEval_GetFrame() as *mut pyo3::ffi::PyObject) }?;
        for _ in 0..16 {
            let code = frame.getattr(pyo3::intern!(py, "f_code")).ok()?;
            let key = code.as_ptr() as usize;
            let in_package = IN_PACKAGE.with(|c| c.borrow().get(&key).copied()).unwrap_or_else(|| {
                let file: String = code.getattr(pyo3::intern!(py, "co_filename")).and_then(|f| f.extract()).unwrap_or_default();
                let verdict = file.starts_with(package.as_str());
                IN_PACKAGE.with(|c| c.borrow_mut().insert(key, verdict));
                verdict
            });
            if !in_package {
                let lasti: i64 = frame.getattr(pyo3::intern!(py, "f_lasti")).ok()?.extract().ok()?;
                return Some(Arc::new(PythonSite { code: code.unbind(), lasti }) as Arc<dyn PushSite>);
            }
            frame = frame.getattr(pyo3::intern!(py, "f_back")).ok().filter(|f| !f.is_none())?;
        }
        None
    })
}

/// Invoke a registered operator. Positional arrays are inputs in order, other positional values
/// fill the operator's parameters in declaration order; keyword arrays are inputs by name. Returns
/// the output as a Python `NDArray`, or a list of them for an operator with several outputs.
#[pyfunction]
#[pyo3(signature = (name, args, kwargs=None, out=None))]
fn invoke<'py>(
    py: Python<'py>,
    name: &str,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    // MXNet's name for this entry point, so that profiles compare with MXNet's side by side.
    let _api = oxnet::profiler::api_call("MXImperativeInvokeEx");
    catching_panics(name, || invoke_checked(py, name, args, kwargs, out))
}

/// `call`'s result. Operators validate their inputs and return errors; should one still panic
/// (a bug), the caller gets an MXNetError naming the operator instead of pyo3's
/// PanicException, which is not an Exception and would escape `except Exception` handlers.
pub(crate) fn catching_panics<T>(name: &str, call: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        Err(crate::errors::to_py(oxnet::err!(Runtime, "internal error: operator {name} panicked: {message}")))
    })
}

fn invoke_checked<'py>(
    py: Python<'py>,
    name: &str,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let def = op::lookup(name).py()?;
    let CallArguments { mut inputs, keyword_inputs, mut attrs } = sort_arguments(name, def, args, kwargs, NoneKeyword::IsParameter, as_array)?;
    if def.variadic && !attrs.contains_key("num_args") {
        attrs.insert("num_args".into(), (inputs.len() + keyword_inputs.len()).to_string());
    }
    let instance = def.instantiate(name, &attrs).py()?;
    if !keyword_inputs.is_empty() {
        let names = instance.input_names();
        for (key, arr) in keyword_inputs {
            let Some(pos) = names.iter().position(|n| *n == key) else {
                return Err(crate::errors::to_py(oxnet::err!(Param, "operator {name}: unknown input '{key}'; inputs are: {}", names.join(", "))));
            };
            if pos != inputs.len() {
                return Err(crate::errors::to_py(oxnet::err!(
                    Param,
                    "operator {name}: input '{key}' given by keyword out of order; inputs are: {}",
                    names.join(", ")
                )));
            }
            inputs.push(arr);
        }
    }
    let out_objects: Option<Vec<Bound<'py, PyAny>>> = match out {
        None => None,
        Some(o) if o.is_none() => None,
        Some(o) if as_array(o)?.is_some() => Some(vec![o.clone()]),
        Some(o) => Some(o.try_iter()?.collect::<PyResult<Vec<_>>>()?),
    };
    let out_arrays = out_objects
        .as_ref()
        .map(|objs| {
            objs.iter()
                .map(|o| as_array(o)?.ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("out must be an NDArray or a list of NDArrays")))
                .collect::<PyResult<Vec<_>>>()
        })
        .transpose()?;
    let visible = instance.num_visible_outputs();
    let single = visible == 1;
    let mut outputs = oxnet::imperative::invoke_operator(name, instance, &attrs, &inputs, out_arrays, current_context(), push_site()).py()?;
    outputs.truncate(visible);
    if let Some(objs) = &out_objects {
        // A recorded call gives its `out` arrays new graph entries: the Python objects the caller
        // holds must now carry them (MXNet updates the handles in place the same way).
        for (obj, result) in objs.iter().zip(&outputs) {
            if result.autograd_entry().is_some() && !obj.is_instance_of::<NDArrayHandle>() {
                obj.setattr(pyo3::intern!(py, "handle"), wrap(py, result.clone())?)?;
            }
        }
    }
    if single {
        python_ndarray(py, outputs.into_iter().next().unwrap())
    } else {
        let arrays = outputs.into_iter().map(|a| python_ndarray(py, a)).collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, arrays)?.into_any())
    }
}

/// The registry as Python sees it: (name, aliases, doc, variadic, [(param, type, default, doc)]).
#[pyfunction]
fn list_ops() -> Vec<(String, Vec<String>, String, bool, Vec<(String, String, Option<String>, String)>)> {
    op::registry()
        .defs()
        .iter()
        .map(|d| {
            let params =
                (d.params)().into_iter().map(|p| (p.name.to_string(), p.type_name.to_string(), p.default, p.doc.trim().to_string())).collect();
            (d.name.to_string(), d.aliases.iter().map(|s| s.to_string()).collect(), d.doc.to_string(), d.variadic, params)
        })
        .collect()
}

/// The float32 (or bfloat16) multiply-add peak of `threads` cores in GFLOP/s, measured for
/// ~0.3 s (None without the kernel's CPU features): what GEMM benchmarks quote their
/// percentage of peak against.
#[pyfunction]
#[pyo3(signature = (threads, bf16 = false))]
fn cpu_peak_gflops(py: Python<'_>, threads: usize, bf16: bool) -> Option<f64> {
    py.detach(|| oxnet::op::cpu_peak_gflops(threads, bf16))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_register_python, m)?)?;
    m.add_function(wrap_pyfunction!(invoke, m)?)?;
    m.add_function(wrap_pyfunction!(list_ops, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_peak_gflops, m)?)?;
    Ok(())
}
