//! Applying a [`MergeOp`] to one cell. Shared by every backend that supports `update`.

use crate::{DType, Error, MergeFn, MergeOp, Result, Tensor, Value};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;

/// Merge functions registered on the storage side, looked up by [`MergeOp::Named`].
#[derive(Clone, Default)]
pub struct MergeRegistry {
    functions: HashMap<String, MergeFn>,
}

impl MergeRegistry {
    pub fn register(&mut self, name: impl Into<String>, f: MergeFn) {
        self.functions.insert(name.into(), f);
    }

    pub fn get(&self, name: &str) -> Option<&MergeFn> {
        self.functions.get(name)
    }

    /// Every registered function with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &MergeFn)> {
        self.functions.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }
}

impl std::fmt::Debug for MergeRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.functions.keys()).finish()
    }
}

/// Computes `op(old, new)` and checks that the result keeps the stored cell's kind and dtype.
pub fn apply_merge(
    op: &MergeOp,
    registry: &MergeRegistry,
    old: &Value,
    new: &Value,
) -> Result<Value> {
    let out = match op {
        MergeOp::Replace => new.clone(),
        MergeOp::Add => elementwise(old, new, "add", Arith::Add)?,
        MergeOp::Max => elementwise(old, new, "max", Arith::Max)?,
        MergeOp::Concat { dim } => concat(old, new, *dim)?,
        MergeOp::Named(name) => {
            let f = registry.get(name).ok_or_else(|| {
                Error::invalid(format!("no merge function named `{name}` is registered"))
            })?;
            f(old, new)?
        }
        MergeOp::Custom(f) => f(old, new)?,
    };
    match (old, &out) {
        (Value::Object(_), Value::Object(_)) => Ok(out),
        (Value::Tensor(a), Value::Tensor(b)) if a.dtype() == b.dtype() => Ok(out),
        _ => Err(Error::invalid(format!(
            "merge {op:?} turned a stored {} into {}",
            old.describe(),
            out.describe()
        ))),
    }
}

#[derive(Clone, Copy)]
enum Arith {
    Add,
    Max,
}

fn same_tensors<'a>(
    old: &'a Value,
    new: &'a Value,
    what: &str,
) -> Result<(&'a Tensor, &'a Tensor)> {
    match (old, new) {
        (Value::Tensor(a), Value::Tensor(b))
            if a.dtype() == b.dtype() && a.shape() == b.shape() =>
        {
            Ok((a, b))
        }
        _ => Err(Error::invalid(format!(
            "merge `{what}` needs two tensors of equal dtype and shape, got {} and {}",
            old.describe(),
            new.describe()
        ))),
    }
}

fn elementwise(old: &Value, new: &Value, what: &str, op: Arith) -> Result<Value> {
    let (a, b) = same_tensors(old, new, what)?;
    macro_rules! go {
        ($t:ty, $add:expr) => {{
            let w = std::mem::size_of::<$t>();
            let mut out = Vec::with_capacity(a.nbytes());
            for (x, y) in a.data().chunks_exact(w).zip(b.data().chunks_exact(w)) {
                let x = <$t>::from_le_bytes(x.try_into().unwrap());
                let y = <$t>::from_le_bytes(y.try_into().unwrap());
                let r: $t = match op {
                    Arith::Add => $add(x, y),
                    Arith::Max => {
                        if y > x {
                            y
                        } else {
                            x
                        }
                    }
                };
                out.extend_from_slice(&r.to_le_bytes());
            }
            out
        }};
    }
    let bytes = match a.dtype() {
        DType::U8 => go!(u8, u8::wrapping_add),
        DType::I8 => go!(i8, i8::wrapping_add),
        DType::I16 => go!(i16, i16::wrapping_add),
        DType::U16 => go!(u16, u16::wrapping_add),
        DType::I32 => go!(i32, i32::wrapping_add),
        DType::U32 => go!(u32, u32::wrapping_add),
        DType::I64 => go!(i64, i64::wrapping_add),
        DType::U64 => go!(u64, u64::wrapping_add),
        DType::F32 => go!(f32, |x: f32, y: f32| x + y),
        DType::F64 => go!(f64, |x: f64, y: f64| x + y),
        DType::Bool => match op {
            Arith::Max => a
                .data()
                .iter()
                .zip(b.data().iter())
                .map(|(x, y)| x | y)
                .collect(),
            Arith::Add => {
                return Err(Error::invalid(
                    "merge `add` is not defined for bool tensors",
                ))
            }
        },
        d @ (DType::F16 | DType::Bf16) => {
            return Err(Error::invalid(format!(
                "merge `{what}` is not implemented for {d} tensors; use a named merge function"
            )))
        }
    };
    Ok(Value::Tensor(Tensor::new(
        a.dtype(),
        a.shape().to_vec(),
        Bytes::from(bytes),
    )?))
}

fn concat(old: &Value, new: &Value, dim: usize) -> Result<Value> {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut out = BytesMut::with_capacity(a.len() + b.len());
            out.extend_from_slice(a);
            out.extend_from_slice(b);
            Ok(Value::Object(out.freeze()))
        }
        (Value::Tensor(a), Value::Tensor(b)) => {
            let (sa, sb) = (a.shape(), b.shape());
            let compatible = a.dtype() == b.dtype()
                && sa.len() == sb.len()
                && dim < sa.len()
                && sa
                    .iter()
                    .zip(sb)
                    .enumerate()
                    .all(|(i, (x, y))| i == dim || x == y);
            if !compatible {
                return Err(Error::invalid(format!(
                    "cannot concat {} and {} along dim {dim}",
                    old.describe(),
                    new.describe()
                )));
            }
            // Row-major: the tensor is `outer` blocks of (shape[dim] * inner) elements.
            let elem = a.dtype().size();
            let outer: usize = sa[..dim].iter().product();
            let inner: usize = sa[dim + 1..].iter().product::<usize>() * elem;
            let (ba, bb) = (sa[dim] * inner, sb[dim] * inner);
            let mut out = BytesMut::with_capacity(a.nbytes() + b.nbytes());
            for o in 0..outer {
                out.extend_from_slice(&a.data()[o * ba..(o + 1) * ba]);
                out.extend_from_slice(&b.data()[o * bb..(o + 1) * bb]);
            }
            let mut shape = sa.to_vec();
            shape[dim] += sb[dim];
            Ok(Value::Tensor(Tensor::new(a.dtype(), shape, out.freeze())?))
        }
        _ => Err(Error::invalid(format!(
            "cannot concat {} and {}",
            old.describe(),
            new.describe()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn t(shape: Vec<usize>, v: &[i32]) -> Value {
        Value::Tensor(Tensor::from_slice(shape, v).unwrap())
    }

    #[test]
    fn builtins() {
        let reg = MergeRegistry::default();
        let a = t(vec![2], &[1, 5]);
        let b = t(vec![2], &[3, 2]);
        let sum = apply_merge(&MergeOp::Add, &reg, &a, &b).unwrap();
        assert_eq!(
            sum.as_tensor().unwrap().to_vec::<i32>().unwrap(),
            vec![4, 7]
        );
        let max = apply_merge(&MergeOp::Max, &reg, &a, &b).unwrap();
        assert_eq!(
            max.as_tensor().unwrap().to_vec::<i32>().unwrap(),
            vec![3, 5]
        );
        let c = apply_merge(&MergeOp::Concat { dim: 0 }, &reg, &a, &t(vec![1], &[9])).unwrap();
        assert_eq!(
            c.as_tensor().unwrap().to_vec::<i32>().unwrap(),
            vec![1, 5, 9]
        );
        // 2x2 concat along dim 1 with 2x1 interleaves rows.
        let m = apply_merge(
            &MergeOp::Concat { dim: 1 },
            &reg,
            &t(vec![2, 2], &[1, 2, 3, 4]),
            &t(vec![2, 1], &[8, 9]),
        )
        .unwrap();
        let m = m.as_tensor().unwrap();
        assert_eq!(m.shape(), &[2, 3]);
        assert_eq!(m.to_vec::<i32>().unwrap(), vec![1, 2, 8, 3, 4, 9]);
    }

    #[test]
    fn kind_or_dtype_change_is_rejected() {
        let mut reg = MergeRegistry::default();
        reg.register(
            "to_object",
            Arc::new(|_: &Value, _: &Value| Ok(Value::Object(Bytes::from_static(b"x")))),
        );
        let a = t(vec![1], &[1]);
        let e = apply_merge(&MergeOp::Named("to_object".into()), &reg, &a, &a).unwrap_err();
        assert!(e.message().contains("turned"), "{e}");
        assert!(apply_merge(&MergeOp::Named("nope".into()), &reg, &a, &a).is_err());
        let f = Value::Tensor(Tensor::from_vec(vec![1.0f32]));
        assert!(apply_merge(&MergeOp::Replace, &reg, &a, &f).is_err());
        assert!(apply_merge(&MergeOp::Add, &reg, &a, &t(vec![2], &[1, 2])).is_err());
    }
}
