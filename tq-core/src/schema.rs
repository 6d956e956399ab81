//! [`FieldMeta`]: what a batch's metadata says about one field, and the ragged-promotion rule.
//!
//! The layout is private and every constructor keeps its invariants, so a `FieldMeta` that
//! exists is always consistent: a tensor field has a dtype, a dense field one shape, a ragged
//! field one shape per row, an object field neither. A `FieldMeta` received from a peer (or
//! parsed from a file) is checked as it is deserialized: a malformed one is an error there,
//! never a panic later.

use crate::{DType, Error, Result};
use serde::{Deserialize, Serialize};

/// How a field's cells are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldKind {
    /// Tensors of one dtype and one per-sample shape.
    Dense,
    /// Tensors of one dtype whose per-sample shapes differ.
    Ragged,
    /// Opaque serialized objects.
    Object,
}

/// The metadata of one field over the rows of a batch: its dtype, its kind, and its
/// per-sample shape (dense) or one shape per row (ragged). A [`crate::BatchMeta`] maps each
/// field name to one of these; the name is the map's key, so the two cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireFieldMeta", into = "WireFieldMeta")]
pub struct FieldMeta {
    layout: Layout,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    Dense {
        dtype: DType,
        shape: Vec<usize>,
    },
    Ragged {
        dtype: DType,
        shapes: Vec<Vec<usize>>,
    },
    Object,
}

/// The serialized form (unchanged from earlier versions: the same postcard and JSON layout).
#[derive(Serialize, Deserialize)]
struct WireFieldMeta {
    dtype: Option<DType>,
    kind: FieldKind,
    sample_shape: Option<Vec<usize>>,
    per_sample_shapes: Option<Vec<Vec<usize>>>,
}

impl TryFrom<WireFieldMeta> for FieldMeta {
    type Error = Error;

    fn try_from(w: WireFieldMeta) -> Result<FieldMeta> {
        let layout = match (w.kind, w.dtype, w.sample_shape, w.per_sample_shapes) {
            (FieldKind::Dense, Some(dtype), Some(shape), None) => Layout::Dense { dtype, shape },
            (FieldKind::Ragged, Some(dtype), None, Some(shapes)) => {
                Layout::Ragged { dtype, shapes }
            }
            (FieldKind::Object, None, None, None) => Layout::Object,
            (kind, dtype, shape, shapes) => {
                return Err(Error::invalid(format!(
                    "malformed field metadata: kind {kind:?} with dtype {}, {} sample shape, {} \
                     per-sample shapes (dense needs a dtype and a shape, ragged a dtype and \
                     per-sample shapes, object neither)",
                    dtype.map_or("none", DType::name),
                    if shape.is_some() { "a" } else { "no" },
                    if shapes.is_some() { "" } else { "no" },
                )))
            }
        };
        Ok(FieldMeta { layout })
    }
}

impl From<FieldMeta> for WireFieldMeta {
    fn from(m: FieldMeta) -> WireFieldMeta {
        let kind = m.kind();
        match m.layout {
            Layout::Dense { dtype, shape } => WireFieldMeta {
                dtype: Some(dtype),
                kind,
                sample_shape: Some(shape),
                per_sample_shapes: None,
            },
            Layout::Ragged { dtype, shapes } => WireFieldMeta {
                dtype: Some(dtype),
                kind,
                sample_shape: None,
                per_sample_shapes: Some(shapes),
            },
            Layout::Object => WireFieldMeta {
                dtype: None,
                kind,
                sample_shape: None,
                per_sample_shapes: None,
            },
        }
    }
}

impl FieldMeta {
    /// A tensor field whose rows all have `sample_shape`.
    pub fn dense(dtype: DType, sample_shape: Vec<usize>) -> Self {
        FieldMeta {
            layout: Layout::Dense {
                dtype,
                shape: sample_shape,
            },
        }
    }

    /// A tensor field from per-row shapes: dense when all rows agree (or there are none),
    /// ragged otherwise.
    pub fn from_shapes(dtype: DType, shapes: Vec<Vec<usize>>) -> Self {
        match shapes.first() {
            Some(first) if shapes.iter().any(|s| s != first) => FieldMeta {
                layout: Layout::Ragged { dtype, shapes },
            },
            first => FieldMeta::dense(dtype, first.cloned().unwrap_or_default()),
        }
    }

    /// A field of opaque objects.
    pub fn object() -> Self {
        FieldMeta {
            layout: Layout::Object,
        }
    }

    pub fn kind(&self) -> FieldKind {
        match self.layout {
            Layout::Dense { .. } => FieldKind::Dense,
            Layout::Ragged { .. } => FieldKind::Ragged,
            Layout::Object => FieldKind::Object,
        }
    }

    /// The element type of a tensor field; `None` for objects.
    pub fn dtype(&self) -> Option<DType> {
        match self.layout {
            Layout::Dense { dtype, .. } | Layout::Ragged { dtype, .. } => Some(dtype),
            Layout::Object => None,
        }
    }

    /// The per-sample shape of a dense field.
    pub fn sample_shape(&self) -> Option<&[usize]> {
        match &self.layout {
            Layout::Dense { shape, .. } => Some(shape),
            _ => None,
        }
    }

    /// One shape per row of a ragged field.
    pub fn per_sample_shapes(&self) -> Option<&[Vec<usize>]> {
        match &self.layout {
            Layout::Ragged { shapes, .. } => Some(shapes),
            _ => None,
        }
    }

    pub fn is_tensor(&self) -> bool {
        !matches!(self.layout, Layout::Object)
    }

    /// The shape of row `i`, for tensor fields.
    pub fn row_shape(&self, i: usize) -> Option<&[usize]> {
        match &self.layout {
            Layout::Dense { shape, .. } => Some(shape),
            Layout::Ragged { shapes, .. } => shapes.get(i).map(Vec::as_slice),
            Layout::Object => None,
        }
    }

    /// Checks that `rows` matches the per-row data this metadata carries.
    pub fn check_rows(&self, field: &str, rows: usize) -> Result<()> {
        if let Some(shapes) = self.per_sample_shapes() {
            if shapes.len() != rows {
                return Err(Error::invalid(format!(
                    "field `{field}`: metadata has {} per-sample shapes for {rows} rows",
                    shapes.len()
                )));
            }
        }
        Ok(())
    }

    /// The metadata of the rows at `positions` (in that order). `Invalid` when a position is
    /// past the rows of a ragged field.
    pub fn select_rows(&self, field: &str, positions: &[usize]) -> Result<FieldMeta> {
        match &self.layout {
            Layout::Ragged { dtype, shapes } => {
                let picked = positions
                    .iter()
                    .map(|&p| {
                        shapes.get(p).cloned().ok_or_else(|| {
                            Error::invalid(format!(
                                "field `{field}`: row {p} of {} selected",
                                shapes.len()
                            ))
                        })
                    })
                    .collect::<Result<_>>()?;
                Ok(FieldMeta::from_shapes(*dtype, picked))
            }
            _ => Ok(self.clone()),
        }
    }

    /// Checks that `other` may describe the same field: same kind of payload (tensor or object)
    /// and same dtype. Shapes may differ (that promotes to ragged).
    pub fn check_compatible(&self, field: &str, other: &FieldMeta) -> Result<()> {
        if self.is_tensor() != other.is_tensor() {
            return Err(Error::invalid(format!(
                "field `{field}`: kind mismatch, {} vs {}",
                kind_name(self),
                kind_name(other)
            )));
        }
        if self.dtype() != other.dtype() {
            return Err(Error::invalid(format!(
                "field `{field}`: dtype mismatch, {} vs {}",
                dtype_name(self.dtype()),
                dtype_name(other.dtype())
            )));
        }
        Ok(())
    }

    /// Appends the rows of several metadata of one field (`rows[i]` rows each). Differing dense
    /// shapes promote the result to ragged; dtype or kind conflicts are `Invalid`.
    pub fn concat(field: &str, parts: &[(&FieldMeta, usize)]) -> Result<FieldMeta> {
        let Some((first, _)) = parts.first() else {
            return Err(Error::invalid(format!(
                "field `{field}`: nothing to concatenate"
            )));
        };
        for (p, _) in &parts[1..] {
            first.check_compatible(field, p)?;
        }
        let Some(dtype) = first.dtype() else {
            return Ok(FieldMeta::object());
        };
        let mut shapes = Vec::new();
        for (p, rows) in parts {
            for i in 0..*rows {
                shapes.push(p.row_shape(i).unwrap_or(&[]).to_vec());
            }
        }
        Ok(FieldMeta::from_shapes(dtype, shapes))
    }
}

fn kind_name(s: &FieldMeta) -> &'static str {
    if s.is_tensor() {
        "tensor"
    } else {
        "object"
    }
}

fn dtype_name(d: Option<DType>) -> &'static str {
    d.map(DType::name).unwrap_or("none")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differing_shapes_promote_to_ragged() {
        let a = FieldMeta::dense(DType::F32, vec![2]);
        let b = FieldMeta::dense(DType::F32, vec![3]);
        let c = FieldMeta::concat("f", &[(&a, 2), (&b, 1)]).unwrap();
        assert_eq!(c.kind(), FieldKind::Ragged);
        assert_eq!(c.per_sample_shapes().unwrap(), &[vec![2], vec![2], vec![3]]);
        // Selecting only equal-shaped rows demotes back to dense.
        let d = c.select_rows("f", &[0, 1]).unwrap();
        assert_eq!(d, FieldMeta::dense(DType::F32, vec![2]));
        let e = c.select_rows("f", &[3]).unwrap_err();
        assert!(e.message().contains("row 3 of 3"), "{e}");
    }

    #[test]
    fn dtype_and_kind_conflicts_are_invalid() {
        let a = FieldMeta::dense(DType::F32, vec![2]);
        let b = FieldMeta::dense(DType::I64, vec![2]);
        let e = FieldMeta::concat("f", &[(&a, 1), (&b, 1)]).unwrap_err();
        assert!(e.message().contains("dtype mismatch"), "{e}");
        let e = a.check_compatible("f", &FieldMeta::object()).unwrap_err();
        assert!(e.message().contains("kind mismatch"), "{e}");
    }

    #[test]
    fn malformed_metadata_from_a_peer_is_refused_when_decoded() {
        let wire = |kind, dtype, shape: Option<Vec<usize>>, shapes: Option<Vec<Vec<usize>>>| {
            WireFieldMeta {
                dtype,
                kind,
                sample_shape: shape,
                per_sample_shapes: shapes,
            }
        };
        let bad = [
            wire(FieldKind::Dense, None, Some(vec![2]), None),
            wire(FieldKind::Dense, Some(DType::F32), None, None),
            wire(FieldKind::Ragged, Some(DType::F32), None, None),
            wire(FieldKind::Ragged, None, None, Some(vec![vec![1]])),
            wire(FieldKind::Object, Some(DType::U8), None, None),
            wire(
                FieldKind::Dense,
                Some(DType::F32),
                Some(vec![1]),
                Some(vec![vec![1]]),
            ),
        ];
        for w in bad {
            let bytes = postcard::to_allocvec(&w).unwrap();
            assert!(postcard::from_bytes::<FieldMeta>(&bytes).is_err());
            let e = FieldMeta::try_from(w).unwrap_err();
            assert_eq!(e.kind(), &crate::ErrorKind::Invalid);
            assert!(e.message().contains("malformed field metadata"), "{e}");
        }
        for good in [
            FieldMeta::dense(DType::I64, vec![3]),
            FieldMeta::from_shapes(DType::F32, vec![vec![1], vec![2]]),
            FieldMeta::object(),
        ] {
            let bytes = postcard::to_allocvec(&good).unwrap();
            assert_eq!(postcard::from_bytes::<FieldMeta>(&bytes).unwrap(), good);
        }
    }
}
