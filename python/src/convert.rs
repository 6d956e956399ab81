//! Data across the boundary: numpy arrays in (checked here; copied once, or taken over without
//! a copy), `Buffer`s out (tq's bytes, viewed by numpy without a copy), tags both ways.

use super::raise;
use bytes::BytesMut;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use tq::{Bytes, Column, DType, TagValue, Tags, Tensor};

/// numpy's type string (`__array_interface__["typestr"]`) for each tq dtype that numpy has;
/// bf16 has none (it crosses through torch, as its raw 16-bit pattern).
fn typestr(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::F16 => "<f2",
        DType::Bf16 => "<u2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
    }
}

fn dtype_of_typestr(s: &str) -> Option<DType> {
    Some(match s {
        "|b1" => DType::Bool,
        "|u1" => DType::U8,
        "|i1" => DType::I8,
        "<i2" => DType::I16,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "<u2" => DType::U16,
        "<u4" => DType::U32,
        "<u8" => DType::U64,
        "<f2" => DType::F16,
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        _ => return None,
    })
}

/// tq's bytes of one tensor, owned by this object and described to numpy through
/// `__array_interface__`, so `numpy.asarray(buffer)` is a view: no copy, and the array keeps
/// this buffer alive as its `base`. The view is writable only when the bytes belong to this
/// buffer alone (a batch assembled for this read); bytes tq shares (the store's own, for a
/// single key) are read-only.
#[pyclass(frozen, module = "tq._native")]
pub struct Buffer {
    data: Data,
    dtype: DType,
    shape: Vec<usize>,
}

enum Data {
    /// Shared with tq (the store, another reader): never written through.
    Shared(Bytes),
    /// This buffer's alone: numpy may write into it.
    Owned(BytesMut),
    /// This buffer's alone, from tq's pool of read buffers (warm memory), to which it returns
    /// when the buffer is dropped.
    Pooled(tq::buffer::PoolBuffer),
    /// This buffer's alone: a column a read packed into a buffer of tq's pool, or mapped
    /// copy-on-write from shared memory, and that this buffer claimed
    /// ([`tq::buffer::BufferPool::claim_filled`]);
    /// a pooled one returns to the pool when the buffer is dropped.
    Claimed(Bytes),
}

impl Data {
    fn address(&self) -> usize {
        match self {
            Data::Shared(b) => b.as_ptr() as usize,
            Data::Owned(b) => b.as_ptr() as usize,
            Data::Pooled(b) => b.as_ptr() as usize,
            Data::Claimed(b) => b.as_ptr() as usize,
        }
    }

    fn len(&self) -> usize {
        match self {
            Data::Shared(b) => b.len(),
            Data::Owned(b) => b.len(),
            Data::Pooled(b) => b.len(),
            Data::Claimed(b) => b.len(),
        }
    }
}

#[pymethods]
impl Buffer {
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", typestr(self.dtype))?;
        let readonly = matches!(self.data, Data::Shared(_));
        d.set_item("data", (self.data.address(), readonly))?;
        Ok(d)
    }

    /// tq's name of the element type (`"f32"`, `"bf16"`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.data.len()
    }

    /// Whether the bytes are this buffer's alone (so a view of them may be written).
    #[getter]
    fn writable(&self) -> bool {
        !matches!(self.data, Data::Shared(_))
    }

    /// This buffer if its bytes are its own, else a copy of them that is (what a torch tensor,
    /// always writable, needs). A large copy goes into a buffer of tq's read pool: warm memory
    /// that returns to the pool when the copy is dropped, instead of numpy's copy into fresh
    /// pages (8.4 ms against 5 ms for 32 MiB here: the kernel zeroes fresh pages first).
    fn writable_copy(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let this = slf.borrow();
        let Data::Shared(bytes) = &this.data else {
            drop(this);
            return Ok(slf);
        };
        let data = if bytes.len() < tq::buffer::POOL_MIN_BYTES {
            Data::Owned(BytesMut::from(&bytes[..]))
        } else {
            let mut copy = tq::buffer::BufferPool::global().buffer(bytes.len());
            copy.copy_from_slice(bytes);
            Data::Pooled(copy)
        };
        let out = Buffer {
            data,
            dtype: this.dtype,
            shape: this.shape.clone(),
        };
        Bound::new(slf.py(), out)
    }

    /// Where the bytes are (for tests that check a view is not a copy).
    #[getter]
    fn address(&self) -> usize {
        self.data.address()
    }

    fn __repr__(&self) -> String {
        format!("Buffer(dtype={}, shape={:?})", self.dtype, self.shape)
    }
}

/// A tensor a read returned, as a buffer: writable when its bytes are the read's alone (a
/// fresh allocation, or a pooled column the read packed), read-only when tq shares them (a
/// store's own cell, a shared-memory segment).
fn buffer(tensor: Tensor) -> Buffer {
    let (dtype, shape) = (tensor.dtype(), tensor.shape().to_vec());
    let data = match tensor.into_data().try_into_mut() {
        Ok(alone) => Data::Owned(alone),
        Err(shared) if tq::buffer::BufferPool::global().claim_filled(&shared) => {
            Data::Claimed(shared)
        }
        Err(shared) => Data::Shared(shared),
    };
    Buffer { data, dtype, shape }
}

/// A numpy array's memory as `Bytes` without a copy: the `Bytes` holds a reference to the
/// array, so numpy cannot free it (and refuses to resize it) while any slice of it lives.
/// Nothing stops Python code from writing into the array meanwhile; the Python layer takes
/// arrays over only where the caller allowed it or the bytes outlive nothing but the call.
struct ArrayMemory {
    _array: Py<PyAny>,
    address: *const u8,
    len: usize,
}

// SAFETY: the memory is read only, through `as_ref`, and stays allocated as long as the
// reference to its array does; `Py<PyAny>` itself is Send + Sync (dropping it without the GIL
// queues the decrement for the next holder of the GIL).
unsafe impl Send for ArrayMemory {}
unsafe impl Sync for ArrayMemory {}

impl AsRef<[u8]> for ArrayMemory {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `address` and `len` describe the live array's buffer (see `tensor_from_array`).
        unsafe { std::slice::from_raw_parts(self.address, self.len) }
    }
}

/// A numpy array's bytes as a tensor: the array must be an `ndarray`, C-contiguous, of a
/// dtype tq has. Its bytes are copied once, with the GIL held (so nothing frees or resizes
/// the array meanwhile), or with `take` viewed where they are ([`ArrayMemory`]). `bf16`
/// relabels a `uint16` array holding bf16 bit patterns.
fn tensor_from_array(
    py: Python<'_>,
    field: &str,
    array: &Bound<'_, PyAny>,
    bf16: bool,
    take: bool,
) -> PyResult<Tensor> {
    let ndarray = py.import("numpy")?.getattr("ndarray")?;
    if !array.is_instance(&ndarray)? {
        return Err(PyTypeError::new_err(format!(
            "field `{field}`: expected a numpy array, got {}",
            array.get_type().name()?
        )));
    }
    let interface = array.getattr("__array_interface__")?;
    let interface = interface.cast::<PyDict>()?;
    let get = |key: &str| {
        interface
            .get_item(key)?
            .ok_or_else(|| PyValueError::new_err(format!("__array_interface__ without `{key}`")))
    };
    if !get("strides")?.is_none() {
        return Err(PyValueError::new_err(format!(
            "field `{field}`: the array is not C-contiguous (pass numpy.ascontiguousarray(a))"
        )));
    }
    let typestr: String = get("typestr")?.extract()?;
    let mut dtype = dtype_of_typestr(&typestr).ok_or_else(|| {
        PyValueError::new_err(format!(
            "field `{field}`: numpy dtype `{typestr}` has no tq dtype (bool, int8-64, uint8-64, \
             float16/32/64)"
        ))
    })?;
    if bf16 {
        if dtype != DType::U16 {
            return Err(PyValueError::new_err(format!(
                "field `{field}`: bf16 data must come as uint16 bit patterns"
            )));
        }
        dtype = DType::Bf16;
    }
    let shape: Vec<usize> = get("shape")?.extract()?;
    let (address, _readonly): (usize, bool) = get("data")?.extract()?;
    let nbytes = tq::numel(&shape) * dtype.size();
    let data = if nbytes == 0 {
        Bytes::new()
    } else if take {
        Bytes::from_owner(ArrayMemory {
            _array: array.clone().unbind(),
            address: address as *const u8,
            len: nbytes,
        })
    } else {
        // SAFETY: `array` is a live, C-contiguous numpy array (checked above) whose buffer
        // starts at `address` and holds `numel * itemsize` bytes; the GIL is held, so no other
        // thread can free or resize it while the bytes are copied.
        let bytes = unsafe { std::slice::from_raw_parts(address as *const u8, nbytes) };
        tq::buffer::copied(bytes)
    };
    Tensor::new(dtype, shape, data).map_err(|e| raise(py, e.context(format!("field `{field}`"))))
}

/// A column from what the Python layer passes: `(kind, payload, bf16, take)` with kind
/// `"dense"` (an array), `"ragged"` (a list of arrays, one per row) or `"objects"` (a list of
/// `bytes`); `take` says the arrays may be used in place instead of copied.
pub fn column_from_py(py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<Column> {
    let (kind, payload, bf16, take): (String, Bound<'_, PyAny>, bool, bool) =
        value.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "field `{field}`: expected (kind, payload, bf16, take)"
            ))
        })?;
    match kind.as_str() {
        "dense" => Ok(Column::Dense(tensor_from_array(
            py, field, &payload, bf16, take,
        )?)),
        "ragged" => {
            let rows = payload.cast::<PyList>()?;
            let tensors = rows
                .iter()
                .map(|row| tensor_from_array(py, field, &row, bf16, take))
                .collect::<PyResult<Vec<_>>>()?;
            Ok(Column::Ragged(tensors))
        }
        "objects" => {
            let rows = payload.cast::<PyList>()?;
            let objects = rows
                .iter()
                .map(|row| {
                    row.cast::<PyBytes>()
                        .map(|b| Bytes::copy_from_slice(b.as_bytes()))
                        .map_err(|_| {
                            PyTypeError::new_err(format!(
                                "field `{field}`: objects must be encoded as bytes"
                            ))
                        })
                })
                .collect::<PyResult<Vec<_>>>()?;
            Ok(Column::Objects(objects))
        }
        other => Err(PyValueError::new_err(format!(
            "field `{field}`: unknown column kind `{other}`"
        ))),
    }
}

/// A column for the Python layer: `("dense", Buffer)`, `("ragged", [Buffer])` or
/// `("objects", [bytes])`.
pub fn column_to_py<'py>(py: Python<'py>, column: Column) -> PyResult<Bound<'py, PyTuple>> {
    let (kind, payload): (&str, Bound<'py, PyAny>) = match column {
        Column::Dense(t) => ("dense", Bound::new(py, buffer(t))?.into_any()),
        Column::Ragged(rows) => {
            let list = PyList::empty(py);
            for t in rows {
                list.append(Bound::new(py, buffer(t))?)?;
            }
            ("ragged", list.into_any())
        }
        Column::Objects(rows) => {
            let list = PyList::empty(py);
            for b in rows {
                list.append(PyBytes::new(py, &b))?;
            }
            ("objects", list.into_any())
        }
    };
    PyTuple::new(py, [kind.into_pyobject(py)?.into_any(), payload])
}

/// Tags from a dict of str → bool / int / float / str.
pub fn tags_from_py(d: &Bound<'_, PyDict>) -> PyResult<Tags> {
    let mut tags = Tags::new();
    for (k, v) in d.iter() {
        let k: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err("tag names must be str"))?;
        // bool before int: Python's bool is an int.
        let value = if let Ok(b) = v.cast::<pyo3::types::PyBool>() {
            TagValue::Bool(b.is_true())
        } else if let Ok(i) = v.extract::<i64>() {
            TagValue::Int(i)
        } else if let Ok(f) = v.extract::<f64>() {
            TagValue::Float(f)
        } else if let Ok(s) = v.extract::<String>() {
            TagValue::Str(s)
        } else {
            return Err(PyTypeError::new_err(format!(
                "tag `{k}`: values are bool, int, float or str"
            )));
        };
        tags.insert(k, value);
    }
    Ok(tags)
}

pub fn tags_to_py<'py>(py: Python<'py>, tags: &Tags) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in tags {
        match v {
            TagValue::Bool(b) => d.set_item(k, *b)?,
            TagValue::Int(i) => d.set_item(k, *i)?,
            TagValue::Float(f) => d.set_item(k, *f)?,
            TagValue::Str(s) => d.set_item(k, s)?,
            other => {
                return Err(PyTypeError::new_err(format!(
                    "tag `{k}`: {other:?} has no Python form in this version of tq's package"
                )))
            }
        }
    }
    Ok(d)
}
