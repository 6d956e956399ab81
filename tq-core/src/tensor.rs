//! Tensors and cell values.

use crate::{DType, Element, Error, Result};
use bytes::Bytes;

/// Dimensions held inline by [`Shape`]; covers a dense column of rank-4 samples and every row
/// of rank up to 4 — the cells stores and readers handle one by one.
const INLINE_DIMS: usize = 4;

/// A tensor's dimensions, inline up to [`INLINE_DIMS`] and on the heap beyond.
///
/// Row slices and cell clones happen once per cell on the put/get paths; with a `Vec<usize>`
/// each of them was a heap allocation (and a free when the cell went away).
#[derive(Clone)]
enum Shape {
    Inline { len: u8, dims: [usize; INLINE_DIMS] },
    Heap(Box<[usize]>),
}

impl Shape {
    fn from_slice(dims: &[usize]) -> Self {
        if dims.len() <= INLINE_DIMS {
            let mut inline = [0; INLINE_DIMS];
            inline[..dims.len()].copy_from_slice(dims);
            Shape::Inline {
                len: dims.len() as u8,
                dims: inline,
            }
        } else {
            Shape::Heap(dims.into())
        }
    }

    /// Reuses the vector's allocation when the shape does not fit inline.
    fn from_vec(dims: Vec<usize>) -> Self {
        if dims.len() <= INLINE_DIMS {
            Shape::from_slice(&dims)
        } else {
            Shape::Heap(dims.into_boxed_slice())
        }
    }

    fn as_slice(&self) -> &[usize] {
        match self {
            Shape::Inline { len, dims } => &dims[..*len as usize],
            Shape::Heap(dims) => dims,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [usize] {
        match self {
            Shape::Inline { len, dims } => &mut dims[..*len as usize],
            Shape::Heap(dims) => dims,
        }
    }
}

impl PartialEq for Shape {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

/// A row-major, contiguous, little-endian tensor. Cloning and row slicing never copy the bytes
/// and, for shapes of up to four dimensions, never allocate.
#[derive(Clone, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    data: Bytes,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape())
            .field("nbytes", &self.data.len())
            .finish()
    }
}

/// Number of elements of a shape (1 for a scalar shape `[]`).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Whether `data` is as long as a tensor of `dtype` and `shape` (the product checked, so a shape
/// from a peer cannot overflow).
fn check_len(dtype: DType, shape: &[usize], data: &Bytes) -> Result<()> {
    let expected = shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::invalid(format!("tensor shape {shape:?} overflows")))?;
    if data.len() != expected {
        return Err(Error::invalid(format!(
            "tensor of dtype {dtype} and shape {shape:?} needs {expected} bytes, got {}",
            data.len()
        )));
    }
    Ok(())
}

impl Tensor {
    /// Wraps `data` as a tensor; its length must be `numel(shape) * dtype.size()`.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Bytes) -> Result<Self> {
        check_len(dtype, &shape, &data)?;
        Ok(Tensor {
            dtype,
            shape: Shape::from_vec(shape),
            data,
        })
    }

    /// [`Tensor::new`] with a borrowed shape: no allocation for shapes of up to four
    /// dimensions. For decoders that describe many cells with one shape.
    pub fn with_shape(dtype: DType, shape: &[usize], data: Bytes) -> Result<Self> {
        check_len(dtype, shape, &data)?;
        Ok(Tensor {
            dtype,
            shape: Shape::from_slice(shape),
            data,
        })
    }

    /// Copies `values` into a new tensor of the given shape.
    pub fn from_slice<T: Element>(shape: Vec<usize>, values: &[T]) -> Result<Self> {
        let mut out = Vec::with_capacity(values.len() * T::DTYPE.size());
        for v in values {
            v.write_le(&mut out);
        }
        Tensor::new(T::DTYPE, shape, Bytes::from(out))
    }

    /// A 1-D tensor holding `values`.
    pub fn from_vec<T: Element>(values: Vec<T>) -> Self {
        let n = values.len();
        #[allow(clippy::expect_used)] // a 1-D shape of `n` always matches `n` values
        Tensor::from_slice(vec![n], &values).expect("1-D shape always matches its data")
    }

    /// Copies the elements out as `T`; `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::invalid(format!(
                "cannot view a {} tensor as {}",
                self.dtype,
                T::DTYPE
            )));
        }
        let w = self.dtype.size();
        Ok(self.data.chunks_exact(w).map(T::read_le).collect())
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        self.shape.as_slice()
    }
    /// The raw little-endian bytes.
    pub fn data(&self) -> &Bytes {
        &self.data
    }
    pub fn into_data(self) -> Bytes {
        self.data
    }
    pub fn numel(&self) -> usize {
        numel(self.shape())
    }
    pub fn nbytes(&self) -> usize {
        self.data.len()
    }

    /// Number of rows (size of dimension 0); a scalar has none.
    pub fn rows(&self) -> usize {
        self.shape().first().copied().unwrap_or(0)
    }

    /// Bytes of one row (product of the trailing dimensions times the element size).
    pub fn row_nbytes(&self) -> usize {
        numel(self.shape().get(1..).unwrap_or(&[])) * self.dtype.size()
    }

    /// Row `i` as a tensor of shape `shape[1..]`, sharing this tensor's bytes.
    pub fn row(&self, i: usize) -> Tensor {
        let w = self.row_nbytes();
        Tensor {
            dtype: self.dtype,
            shape: Shape::from_slice(&self.shape()[1..]),
            data: self.data.slice(i * w..(i + 1) * w),
        }
    }

    /// Rows `start..end` as a tensor, sharing this tensor's bytes.
    pub fn slice_rows(&self, start: usize, end: usize) -> Tensor {
        let w = self.row_nbytes();
        let mut shape = self.shape.clone();
        shape.as_mut_slice()[0] = end - start;
        Tensor {
            dtype: self.dtype,
            shape,
            data: self.data.slice(start * w..end * w),
        }
    }
}

/// One cell: a tensor, or an opaque serialized object tq never looks inside.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Tensor(Tensor),
    Object(Bytes),
}

impl Value {
    /// Payload size in bytes.
    pub fn nbytes(&self) -> usize {
        match self {
            Value::Tensor(t) => t.nbytes(),
            Value::Object(b) => b.len(),
        }
    }

    /// The payload bytes (tensor data or object bytes).
    pub fn bytes(&self) -> &Bytes {
        match self {
            Value::Tensor(t) => t.data(),
            Value::Object(b) => b,
        }
    }

    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            Value::Object(_) => None,
        }
    }

    pub fn as_object(&self) -> Option<&Bytes> {
        match self {
            Value::Object(b) => Some(b),
            Value::Tensor(_) => None,
        }
    }

    /// Short description of the kind and type, for error messages.
    pub fn describe(&self) -> String {
        match self {
            Value::Tensor(t) => format!("{} tensor of shape {:?}", t.dtype(), t.shape()),
            Value::Object(b) => format!("object of {} bytes", b.len()),
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Self {
        Value::Tensor(t)
    }
}

impl From<Bytes> for Value {
    fn from(b: Bytes) -> Self {
        Value::Object(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_share_bytes() {
        let t = Tensor::from_slice(vec![3, 2], &[1i32, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(t.rows(), 3);
        let r = t.row(1);
        assert_eq!(r.shape(), &[2]);
        assert_eq!(r.to_vec::<i32>().unwrap(), vec![3, 4]);
        assert_eq!(r.data().as_ptr(), t.data()[8..].as_ptr());
        assert_eq!(
            t.slice_rows(1, 3).to_vec::<i32>().unwrap(),
            vec![3, 4, 5, 6]
        );
    }

    #[test]
    fn shapes_beyond_the_inline_capacity() {
        let dims = vec![2, 1, 1, 1, 1, 3];
        let t = Tensor::from_slice(dims.clone(), &[0u8, 1, 2, 3, 4, 5]).unwrap();
        assert_eq!(t.shape(), dims.as_slice());
        assert_eq!(t.row(1).shape(), &[1, 1, 1, 1, 3]);
        assert_eq!(t.row(1).row(0).shape(), &[1, 1, 1, 3]);
        assert_eq!(t.row(1).to_vec::<u8>().unwrap(), vec![3, 4, 5]);
        assert_eq!(t.slice_rows(1, 2).shape(), &[1, 1, 1, 1, 1, 3]);
        assert_eq!(t.slice_rows(0, 2), t);
        assert_ne!(t.row(0), t.row(1));
        let scalar = Tensor::new(DType::U8, vec![], Bytes::from_static(&[7])).unwrap();
        assert_eq!(
            (scalar.shape(), scalar.rows(), scalar.numel()),
            (&[][..], 0, 1)
        );
        assert_eq!(
            format!("{:?}", t.row(0)),
            "Tensor { dtype: U8, shape: [1, 1, 1, 1, 3], nbytes: 3 }"
        );
    }

    #[test]
    fn bad_length_is_invalid() {
        let e = Tensor::new(DType::F32, vec![2, 2], Bytes::from(vec![0u8; 15])).unwrap_err();
        assert_eq!(e.kind(), &crate::ErrorKind::Invalid);
        assert!(Tensor::from_vec(vec![1.0f32]).to_vec::<i32>().is_err());
    }
}
