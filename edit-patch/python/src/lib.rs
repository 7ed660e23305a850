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

use pyo3::create_exception;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

create_exception!(ec_patch, PatchError, pyo3::exceptions::PyValueError, "An edit patch could not be made, read or applied; `.code` names the kind.");

fn to_py(e: ecp::PatchError) -> PyErr {
    let err = PatchError::new_err(e.to_string());
    Python::attach(|py| {
        let _ = err.value(py).setattr("code", e.code());
    });
    err
}

/// Makes the patch that turns `base` into `new`; by default checks it applies back exactly.
#[pyfunction]
#[pyo3(signature = (base, new, *, verify = true, binary = false))]
fn diff<'py>(py: Python<'py>, base: &[u8], new: &[u8], verify: bool, binary: bool) -> PyResult<Bound<'py, PyBytes>> {
    let opts = ecp::DiffOptions { force_binary: binary, ..Default::default() };
    let out = py
        .detach(|| if verify { ecp::diff_verified(base, new, &opts) } else { ecp::diff(base, new, &opts).map(|p| ecp::encode(&p)) })
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Rebuilds the new file from `base` and `patch`; raises unless its SHA-256 matches.
#[pyfunction]
fn apply<'py>(py: Python<'py>, base: &[u8], patch: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let out = py.detach(|| ecp::apply_to_vec(base, patch, &ecp::Limits::default())).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Summarises a patch as a dict (the same fields as `ecsync inspect --json`).
#[pyfunction]
#[pyo3(signature = (patch, base = None))]
fn inspect(py: Python<'_>, patch: &[u8], base: Option<&[u8]>) -> PyResult<Py<PyAny>> {
    let s = ecp::inspect(patch, base, &ecp::Limits::default()).map_err(to_py)?;
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
fn apply_content<'py>(py: Python<'py>, base: &[u8], delta: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let out = py.detach(|| ecp::delta::decode_and_apply(base, delta, &ecp::Limits::default())).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

#[pymodule]
fn ec_patch(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PatchError", m.py().get_type::<PatchError>())?;
    m.add("FORMAT_VERSION", ecp::VERSION)?;
    m.add_function(wrap_pyfunction!(diff, m)?)?;
    m.add_function(wrap_pyfunction!(apply, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(diff_content, m)?)?;
    m.add_function(wrap_pyfunction!(apply_content, m)?)?;
    Ok(())
}
