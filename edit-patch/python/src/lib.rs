//! Python binding of the edit-patch core, for the device proxy.
//!
//! ```python
//! import ec_patch
//! patch = ec_patch.diff(base, new)          # bytes; verified to apply back to `new`
//! new2 = ec_patch.apply(base, patch)        # bytes; SHA-256 checked
//! info = ec_patch.inspect(patch)            # dict, as `ecsync inspect --json`
//! ```
//! Every failure raises `ec_patch.PatchError` with attributes `code` (a
//! stable name such as "wrong_base") and the message of the Rust error. The
//! GIL is released while the core works.
//!
//! Every call takes the caller's limits (`ec_patch::Limits`), the defaults
//! when not given:
//!
//! ```python
//! lim = ec_patch.Limits(max_file_size=64 << 20, max_preflate_content=8 << 20)
//! new2 = ec_patch.apply(base, patch, limits=lim)   # limit_exceeded past them
//! ```

use pyo3::create_exception;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

create_exception!(
    ec_patch,
    PatchError,
    pyo3::exceptions::PyValueError,
    "An edit patch could not be made, read or applied; `.code` names the kind."
);

fn to_py(e: ecp::PatchError) -> PyErr {
    let err = PatchError::new_err(e.to_string());
    Python::attach(|py| {
        let _ = err.value(py).setattr("code", e.code());
    });
    err
}

/// The bounds on what one call may allocate, inflate or run (`ec_patch::Limits`
/// of the core): keyword arguments, each defaulting to the core's default.
/// Refused input raises `PatchError` with code `limit_exceeded` or `zip_bomb`.
#[pyclass(name = "Limits", module = "ec_patch", from_py_object)]
#[derive(Clone, Copy)]
struct Limits {
    inner: ecp::Limits,
}

macro_rules! limits_fields {
    ($($field:ident),* $(,)?) => {
        #[pymethods]
        impl Limits {
            #[new]
            #[pyo3(signature = (*, $($field = None),*))]
            // One keyword-only argument per limit, as Python callers name them.
            #[allow(clippy::too_many_arguments)]
            fn new($($field: Option<u64>),*) -> Self {
                let mut inner = ecp::Limits::default();
                $(if let Some(v) = $field { inner.$field = v; })*
                Limits { inner }
            }
            $(
                #[getter]
                fn $field(&self) -> u64 {
                    self.inner.$field
                }
            )*
            /// The limits as a dict of field names to values.
            fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
                let d = pyo3::types::PyDict::new(py);
                $(d.set_item(stringify!($field), self.inner.$field)?;)*
                Ok(d)
            }
            fn __repr__(&self) -> String {
                let parts: Vec<String> = vec![$(format!("{}={}", stringify!($field), self.inner.$field)),*];
                format!("Limits({})", parts.join(", "))
            }
        }
    };
}

limits_fields!(
    max_file_size,
    max_part_size,
    max_total_inflated,
    max_expansion_ratio,
    max_segments,
    preflate_block_allowance,
    preflate_bytes_per_block,
    max_preflate_content
);

fn limits_of(l: Option<Limits>) -> ecp::Limits {
    l.map(|l| l.inner).unwrap_or_default()
}

/// Makes the patch that turns `base` into `new`; by default checks it applies back exactly.
/// `quick`: spend no extra time for bytes (a large structured patch is checked against the
/// generic delta at zstd's everyday level, not level 19); an edit's patch is the same.
/// `spot_check`: check a block-parallel member's recipe on a sample of its blocks (where the
/// edit starts, the last block, every block boundary), not every block: the recipe is then a
/// claim that only the receiver's SHA-256 check confirms (a wrong one: `target_mismatch` at
/// apply, a whole-file resend for the device); keeps the last large contents for the next diff.
/// `max_version`: the newest edit-patch format version the receiver reads (default: the newest,
/// `FORMAT_VERSION`); the patch's version byte is the lowest that carries it.
#[pyfunction]
#[pyo3(signature = (base, new, *, verify = true, binary = false, limits = None, quick = false, spot_check = false, max_version = None))]
// One keyword-only argument per option, as Python callers name them.
#[allow(clippy::too_many_arguments)]
fn diff<'py>(
    py: Python<'py>,
    base: &[u8],
    new: &[u8],
    verify: bool,
    binary: bool,
    limits: Option<Limits>,
    quick: bool,
    spot_check: bool,
    max_version: Option<u8>,
) -> PyResult<Bound<'py, PyBytes>> {
    if let Some(v) = max_version.filter(|v| !ecp::VERSIONS.contains(v)) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!("max_version {v}: this build writes versions {:?}", ecp::VERSIONS)));
    }
    let opts = ecp::DiffOptions { force_binary: binary, limits: limits_of(limits), quick, spot_check, max_version, ..Default::default() };
    let out = py
        .detach(|| if verify { ecp::diff_verified(base, new, &opts) } else { ecp::diff(base, new, &opts).map(|p| ecp::encode(&p)) })
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Rebuilds the new file from `base` and `patch`; raises unless its SHA-256 matches.
#[pyfunction]
#[pyo3(signature = (base, patch, *, limits = None))]
fn apply<'py>(py: Python<'py>, base: &[u8], patch: &[u8], limits: Option<Limits>) -> PyResult<Bound<'py, PyBytes>> {
    let limits = limits_of(limits);
    let out = py.detach(|| ecp::apply_to_vec(base, patch, &limits)).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Learns, ahead of the next patch against `file`, the block layout and content of its
/// block-parallel members (LibreOffice's), so that the next diff (`spot_check=True`: the
/// spot-checked one) or apply against it is as quick as one against a version this process
/// made. For a version that became the base without being diffed. Returns the members learnt.
#[pyfunction]
#[pyo3(signature = (file, *, spot_check = false, limits = None))]
fn learn(py: Python<'_>, file: &[u8], spot_check: bool, limits: Option<Limits>) -> PyResult<usize> {
    let limits = limits_of(limits);
    py.detach(|| ecp::learn(file, &limits, spot_check)).map_err(to_py)
}

/// Summarises a patch as a dict (the same fields as `ecsync inspect --json`).
#[pyfunction]
#[pyo3(signature = (patch, base = None, *, limits = None))]
fn inspect(py: Python<'_>, patch: &[u8], base: Option<&[u8]>, limits: Option<Limits>) -> PyResult<Py<PyAny>> {
    let s = ecp::inspect(patch, base, &limits_of(limits)).map_err(to_py)?;
    let text = serde_json::to_string(&s).expect("summary serialises");
    let json = py.import("json")?;
    Ok(json.call_method1("loads", (text,))?.unbind())
}

/// ec-diff of one part: the content delta of `new` against `base`, encoded.
/// (Used by the diff benchmark; the patch format embeds the same delta.)
#[pyfunction]
fn diff_content<'py>(py: Python<'py>, base: &[u8], new: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let out = py.detach(|| ecp::delta::diff(base, new).map(|d| ecp::delta::encode(&d))).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Applies a content delta made by `diff_content`.
#[pyfunction]
#[pyo3(signature = (base, delta, *, limits = None))]
fn apply_content<'py>(py: Python<'py>, base: &[u8], delta: &[u8], limits: Option<Limits>) -> PyResult<Bound<'py, PyBytes>> {
    let limits = limits_of(limits);
    let out = py.detach(|| ecp::delta::decode_and_apply(base, delta, &limits)).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Bytes of document content this process keeps so that its next diff or apply against the
/// same document need not inflate it again (spot-check diffs' contents, apply's made contents).
#[pyfunction]
fn kept_bytes() -> usize {
    ecp::kept_bytes()
}

/// Lets go of the contents `kept_bytes` counts (for a process that goes idle); returns the bytes.
/// Later diffs and applies stay correct; they only inflate those members again.
#[pyfunction]
fn forget_kept() -> usize {
    ecp::forget_kept()
}

#[pymodule]
fn ec_patch(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PatchError", m.py().get_type::<PatchError>())?;
    m.add("FORMAT_VERSION", ecp::VERSION)?;
    m.add("FORMAT_VERSIONS", ecp::VERSIONS.iter().map(|&v| u32::from(v)).collect::<Vec<_>>())?;
    m.add_class::<Limits>()?;
    m.add_function(wrap_pyfunction!(diff, m)?)?;
    m.add_function(wrap_pyfunction!(apply, m)?)?;
    m.add_function(wrap_pyfunction!(learn, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(kept_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(forget_kept, m)?)?;
    m.add_function(wrap_pyfunction!(diff_content, m)?)?;
    m.add_function(wrap_pyfunction!(apply_content, m)?)?;
    Ok(())
}
