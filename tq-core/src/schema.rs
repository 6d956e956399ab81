//! Field schemas and the ragged-promotion rule.

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

/// The schema of one field over the rows of a batch.
///
/// `per_sample_shapes` is present exactly when `kind == Ragged` and then has one entry per row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldSchema {
    pub dtype: Option<DType>,
    pub kind: FieldKind,
    /// Per-sample shape of a dense field.
    pub sample_shape: Option<Vec<usize>>,
    /// One shape per row of a ragged field.
    pub per_sample_shapes: Option<Vec<Vec<usize>>>,
}

impl FieldSchema {
    pub fn dense(dtype: DType, sample_shape: Vec<usize>) -> Self {
        FieldSchema {
            dtype: Some(dtype),
            kind: FieldKind::Dense,
            sample_shape: Some(sample_shape),
            per_sample_shapes: None,
        }
    }

    /// A tensor field from per-row shapes: dense when all rows agree (or there are none),
    /// ragged otherwise.
    pub fn from_shapes(dtype: DType, shapes: Vec<Vec<usize>>) -> Self {
        match shapes.first() {
            Some(first) if shapes.iter().any(|s| s != first) => FieldSchema {
                dtype: Some(dtype),
                kind: FieldKind::Ragged,
                sample_shape: None,
                per_sample_shapes: Some(shapes),
            },
            first => FieldSchema::dense(dtype, first.cloned().unwrap_or_default()),
        }
    }

    pub fn object() -> Self {
        FieldSchema {
            dtype: None,
            kind: FieldKind::Object,
            sample_shape: None,
            per_sample_shapes: None,
        }
    }

    pub fn is_tensor(&self) -> bool {
        self.kind != FieldKind::Object
    }

    /// The shape of row `i`, for tensor fields.
    pub fn row_shape(&self, i: usize) -> Option<&[usize]> {
        match self.kind {
            FieldKind::Dense => self.sample_shape.as_deref(),
            FieldKind::Ragged => self
                .per_sample_shapes
                .as_ref()
                .and_then(|s| s.get(i))
                .map(Vec::as_slice),
            FieldKind::Object => None,
        }
    }

    /// Checks that `rows` matches the per-row data this schema carries.
    pub fn check_rows(&self, field: &str, rows: usize) -> Result<()> {
        if let Some(shapes) = &self.per_sample_shapes {
            if shapes.len() != rows {
                return Err(Error::invalid(format!(
                    "field `{field}`: schema has {} per-sample shapes for {rows} rows",
                    shapes.len()
                )));
            }
        }
        Ok(())
    }

    /// The schema of the rows at `positions` (in that order).
    pub fn select_rows(&self, positions: &[usize]) -> FieldSchema {
        match &self.per_sample_shapes {
            Some(shapes) => {
                let picked = positions.iter().map(|&p| shapes[p].clone()).collect();
                FieldSchema::from_shapes(self.dtype.expect("ragged fields are tensors"), picked)
            }
            None => self.clone(),
        }
    }

    /// Checks that `other` may describe the same field: same kind of payload (tensor or object)
    /// and same dtype. Shapes may differ (that promotes to ragged).
    pub fn check_compatible(&self, field: &str, other: &FieldSchema) -> Result<()> {
        if self.is_tensor() != other.is_tensor() {
            return Err(Error::invalid(format!(
                "field `{field}`: kind mismatch, {} vs {}",
                kind_name(self),
                kind_name(other)
            )));
        }
        if self.dtype != other.dtype {
            return Err(Error::invalid(format!(
                "field `{field}`: dtype mismatch, {} vs {}",
                dtype_name(self.dtype),
                dtype_name(other.dtype)
            )));
        }
        Ok(())
    }

    /// Appends the rows of several schemas of one field (`rows[i]` rows each). Differing dense
    /// shapes promote the result to ragged; dtype or kind conflicts are `Invalid`.
    pub fn concat(field: &str, parts: &[(&FieldSchema, usize)]) -> Result<FieldSchema> {
        let Some((first, _)) = parts.first() else {
            return Err(Error::invalid(format!(
                "field `{field}`: nothing to concatenate"
            )));
        };
        for (p, _) in &parts[1..] {
            first.check_compatible(field, p)?;
        }
        if !first.is_tensor() {
            return Ok(FieldSchema::object());
        }
        let mut shapes = Vec::new();
        for (p, rows) in parts {
            for i in 0..*rows {
                shapes.push(p.row_shape(i).unwrap_or(&[]).to_vec());
            }
        }
        Ok(FieldSchema::from_shapes(
            first.dtype.expect("tensor"),
            shapes,
        ))
    }
}

fn kind_name(s: &FieldSchema) -> &'static str {
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
        let a = FieldSchema::dense(DType::F32, vec![2]);
        let b = FieldSchema::dense(DType::F32, vec![3]);
        let c = FieldSchema::concat("f", &[(&a, 2), (&b, 1)]).unwrap();
        assert_eq!(c.kind, FieldKind::Ragged);
        assert_eq!(
            c.per_sample_shapes.as_ref().unwrap(),
            &vec![vec![2], vec![2], vec![3]]
        );
        // Selecting only equal-shaped rows demotes back to dense.
        let d = c.select_rows(&[0, 1]);
        assert_eq!(d, FieldSchema::dense(DType::F32, vec![2]));
    }

    #[test]
    fn dtype_and_kind_conflicts_are_invalid() {
        let a = FieldSchema::dense(DType::F32, vec![2]);
        let b = FieldSchema::dense(DType::I64, vec![2]);
        let e = FieldSchema::concat("f", &[(&a, 1), (&b, 1)]).unwrap_err();
        assert!(e.message().contains("dtype mismatch"), "{e}");
        let e = a.check_compatible("f", &FieldSchema::object()).unwrap_err();
        assert!(e.message().contains("kind mismatch"), "{e}");
    }
}
