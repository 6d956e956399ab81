//! Columns (one field over a batch) and batches (the TensorDict of tq).

use crate::{DType, Error, FieldMeta, Result, Tensor, Value};
use bytes::Bytes;
use std::collections::BTreeMap;

/// Field names are plain strings.
pub type FieldName = String;

/// One field's data for a batch of samples.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// One tensor whose dimension 0 is the batch; the fastest case.
    Dense(Tensor),
    /// One tensor per sample; shapes may differ.
    Ragged(Vec<Tensor>),
    /// One opaque object per sample.
    Objects(Vec<Bytes>),
}

impl Column {
    /// Number of rows.
    pub fn len(&self) -> usize {
        match self {
            Column::Dense(t) => t.rows(),
            Column::Ragged(v) => v.len(),
            Column::Objects(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total payload bytes.
    pub fn nbytes(&self) -> usize {
        match self {
            Column::Dense(t) => t.nbytes(),
            Column::Ragged(v) => v.iter().map(Tensor::nbytes).sum(),
            Column::Objects(v) => v.iter().map(Bytes::len).sum(),
        }
    }

    /// Row `i` as a cell, sharing this column's bytes.
    pub fn value(&self, i: usize) -> Value {
        match self {
            Column::Dense(t) => Value::Tensor(t.row(i)),
            Column::Ragged(v) => Value::Tensor(v[i].clone()),
            Column::Objects(v) => Value::Object(v[i].clone()),
        }
    }

    /// Every row as a cell, sharing this column's bytes.
    pub fn values(&self) -> Vec<Value> {
        (0..self.len()).map(|i| self.value(i)).collect()
    }

    /// The schema of this column (dtype, kind, shapes).
    pub fn schema(&self) -> FieldMeta {
        match self {
            Column::Dense(t) => FieldMeta::dense(t.dtype(), t.shape()[1..].to_vec()),
            Column::Ragged(v) => match v.first() {
                Some(first) => FieldMeta::from_shapes(
                    first.dtype(),
                    v.iter().map(|t| t.shape().to_vec()).collect(),
                ),
                None => FieldMeta::dense(DType::U8, vec![]),
            },
            Column::Objects(_) => FieldMeta::object(),
        }
    }

    /// Only what a field's type is made of: dtype and tensor-or-object (shapes left empty).
    /// What the controller checks a write against before the write reaches storage.
    pub fn type_schema(&self) -> FieldMeta {
        match self {
            Column::Dense(t) => FieldMeta::dense(t.dtype(), Vec::new()),
            Column::Ragged(v) => {
                FieldMeta::dense(v.first().map_or(DType::U8, Tensor::dtype), Vec::new())
            }
            Column::Objects(_) => FieldMeta::object(),
        }
    }

    /// Checks internal consistency: a dense tensor has a batch dimension; ragged rows share one dtype.
    pub fn validate(&self, field: &str) -> Result<()> {
        match self {
            Column::Dense(t) if t.shape().is_empty() => Err(Error::invalid(format!(
                "field `{field}`: a dense column needs a batch dimension, got a scalar"
            ))),
            Column::Ragged(v) => {
                if let Some(first) = v.first() {
                    if let Some(bad) = v.iter().find(|t| t.dtype() != first.dtype()) {
                        return Err(Error::invalid(format!(
                            "field `{field}`: ragged rows mix dtypes {} and {}",
                            first.dtype(),
                            bad.dtype()
                        )));
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The rows at `positions`, in that order. Dense columns are gathered into one new buffer
    /// (one copy); ragged and object rows are shared.
    pub fn select(&self, positions: &[usize]) -> Column {
        match self {
            Column::Dense(t) => {
                if is_contiguous_run(positions) {
                    let start = positions.first().copied().unwrap_or(0);
                    return Column::Dense(t.slice_rows(start, start + positions.len()));
                }
                let rows: Vec<Value> = positions.iter().map(|&p| Value::Tensor(t.row(p))).collect();
                let mut shape = t.shape().to_vec();
                shape[0] = positions.len();
                Column::Dense(pack_dense(t.dtype(), shape, &rows))
            }
            Column::Ragged(v) => Column::Ragged(positions.iter().map(|&p| v[p].clone()).collect()),
            Column::Objects(v) => {
                Column::Objects(positions.iter().map(|&p| v[p].clone()).collect())
            }
        }
    }

    /// Builds a column from cells, copying tensors into one contiguous buffer when they share
    /// dtype and shape (so readers get a dense column), sharing them otherwise.
    pub fn from_values(field: &str, values: Vec<Value>) -> Result<Column> {
        let Some(first) = values.first() else {
            return Err(Error::invalid(format!(
                "field `{field}`: cannot infer a column from zero values"
            )));
        };
        match first {
            Value::Object(_) => {
                let mut out = Vec::with_capacity(values.len());
                for v in values {
                    match v {
                        Value::Object(b) => out.push(b),
                        Value::Tensor(t) => {
                            return Err(Error::invalid(format!(
                                "field `{field}`: mixes objects and {} tensors",
                                t.dtype()
                            )))
                        }
                    }
                }
                Ok(Column::Objects(out))
            }
            Value::Tensor(first) => {
                let (dtype, shape) = (first.dtype(), first.shape().to_vec());
                let mut uniform = true;
                for v in &values {
                    match v {
                        Value::Tensor(t) if t.dtype() == dtype => {
                            uniform &= t.shape() == shape.as_slice();
                        }
                        other => {
                            return Err(Error::invalid(format!(
                                "field `{field}`: mixes {dtype} tensors and {}",
                                other.describe()
                            )))
                        }
                    }
                }
                if uniform {
                    let mut full = Vec::with_capacity(shape.len() + 1);
                    full.push(values.len());
                    full.extend_from_slice(&shape);
                    Ok(Column::Dense(pack_dense(dtype, full, &values)))
                } else {
                    Ok(Column::Ragged(
                        values
                            .into_iter()
                            .map(|v| match v {
                                Value::Tensor(t) => t,
                                Value::Object(_) => unreachable!("checked above"),
                            })
                            .collect(),
                    ))
                }
            }
        }
    }

    /// Appends several columns of one field. Dense parts of equal row shape stay dense (one copy);
    /// otherwise the result is ragged.
    pub fn concat(field: &str, parts: &[Column]) -> Result<Column> {
        let values: Vec<Value> = parts.iter().flat_map(Column::values).collect();
        if values.is_empty() {
            return parts
                .first()
                .cloned()
                .ok_or_else(|| Error::invalid(format!("field `{field}`: nothing to concatenate")));
        }
        Column::from_values(field, values)
    }
}

fn is_contiguous_run(positions: &[usize]) -> bool {
    positions.windows(2).all(|w| w[1] == w[0] + 1)
}

/// Copies equal-shaped tensor cells into one tensor of `shape` (the batch shape).
/// Callers pass rows they checked (or took from one tensor), so the sizes always agree.
fn pack_dense(dtype: DType, shape: Vec<usize>, rows: &[Value]) -> Tensor {
    // One row is its own column: its bytes are shared, not copied.
    let buf = match rows {
        [one] => one.bytes().clone(),
        _ => crate::buffer::concatenated(rows.iter().map(|r| &r.bytes()[..])),
    };
    #[allow(clippy::expect_used)] // every row has the checked dtype and row shape
    Tensor::new(dtype, shape, buf).expect("rows were checked to share dtype and shape")
}

/// A batch of samples: named columns of equal length. The TensorDict of tq.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    len: usize,
    columns: BTreeMap<FieldName, Column>,
}

impl Batch {
    /// An empty batch of `len` rows and no fields.
    pub fn empty(len: usize) -> Self {
        Batch {
            len,
            columns: BTreeMap::new(),
        }
    }

    /// Builds a batch from named columns; all must have the same number of rows (at least one
    /// column is needed to know the length).
    pub fn from_columns<I, S>(columns: I) -> Result<Self>
    where
        I: IntoIterator<Item = (S, Column)>,
        S: Into<FieldName>,
    {
        let mut batch: Option<Batch> = None;
        for (name, col) in columns {
            let name = name.into();
            let b = batch.get_or_insert_with(|| Batch::empty(col.len()));
            b.insert(name, col)?;
        }
        batch.ok_or_else(|| Error::invalid("a batch needs at least one column"))
    }

    /// Adds or replaces a column; its length must match the batch.
    pub fn insert(&mut self, name: impl Into<FieldName>, column: Column) -> Result<()> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::invalid("field names must not be empty"));
        }
        column.validate(&name)?;
        if column.len() != self.len {
            return Err(Error::invalid(format!(
                "field `{name}` has {} rows, the batch has {}",
                column.len(),
                self.len
            )));
        }
        self.columns.insert(name, column);
        Ok(())
    }

    /// Builder form of [`Batch::insert`].
    pub fn with(mut self, name: impl Into<FieldName>, column: Column) -> Result<Self> {
        self.insert(name, column)?;
        Ok(self)
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.get(name)
    }
    pub fn columns(&self) -> &BTreeMap<FieldName, Column> {
        &self.columns
    }
    pub fn into_columns(self) -> BTreeMap<FieldName, Column> {
        self.columns
    }
    /// Field names in sorted order.
    pub fn field_names(&self) -> impl Iterator<Item = &str> {
        self.columns.keys().map(String::as_str)
    }
    /// Total payload bytes over all columns.
    pub fn nbytes(&self) -> usize {
        self.columns.values().map(Column::nbytes).sum()
    }

    /// The schema of every column.
    pub fn schemas(&self) -> BTreeMap<FieldName, FieldMeta> {
        self.columns
            .iter()
            .map(|(k, c)| (k.clone(), c.schema()))
            .collect()
    }

    /// [`Column::type_schema`] of every column.
    pub fn type_schemas(&self) -> BTreeMap<FieldName, FieldMeta> {
        self.columns
            .iter()
            .map(|(k, c)| (k.clone(), c.type_schema()))
            .collect()
    }

    /// Only the named fields; an unknown name is `Invalid`.
    pub fn select_fields<S: AsRef<str>>(&self, names: &[S]) -> Result<Batch> {
        let mut out = Batch::empty(self.len);
        for n in names {
            let n = n.as_ref();
            let col = self.columns.get(n).ok_or_else(|| {
                Error::invalid(format!(
                    "field `{n}` is not in the batch (fields: {:?})",
                    self.columns.keys().collect::<Vec<_>>()
                ))
            })?;
            out.columns.insert(n.to_string(), col.clone());
        }
        Ok(out)
    }

    /// The rows at `positions` (in that order); every position must be in range.
    pub fn select_rows(&self, positions: &[usize]) -> Result<Batch> {
        if let Some(&bad) = positions.iter().find(|&&p| p >= self.len) {
            return Err(Error::invalid(format!(
                "row {bad} out of range for a batch of {} rows",
                self.len
            )));
        }
        Ok(Batch {
            len: positions.len(),
            columns: self
                .columns
                .iter()
                .map(|(k, c)| (k.clone(), c.select(positions)))
                .collect(),
        })
    }

    /// Appends batches with the same fields row-wise.
    pub fn concat(parts: &[Batch]) -> Result<Batch> {
        let Some(first) = parts.first() else {
            return Ok(Batch::empty(0));
        };
        let mut out = Batch::empty(parts.iter().map(Batch::len).sum());
        for name in first.columns.keys() {
            let cols = parts
                .iter()
                .map(|p| {
                    p.columns.get(name).cloned().ok_or_else(|| {
                        Error::invalid(format!("field `{name}` missing from a batch to concat"))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            out.columns
                .insert(name.clone(), Column::concat(name, &cols)?);
        }
        if let Some(p) = parts
            .iter()
            .find(|p| p.columns.len() != first.columns.len())
        {
            return Err(Error::invalid(format!(
                "cannot concat batches with different fields: {:?} vs {:?}",
                first.columns.keys().collect::<Vec<_>>(),
                p.columns.keys().collect::<Vec<_>>()
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_is_shared_not_copied_and_several_are_packed() {
        let row = Tensor::from_slice(vec![4], &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let one = Column::from_values("x", vec![Value::Tensor(row.clone())]).unwrap();
        let Column::Dense(t) = one else {
            panic!("one row of a tensor field is dense")
        };
        assert_eq!(t.shape(), &[1, 4]);
        assert_eq!(
            t.data().as_ptr(),
            row.data().as_ptr(),
            "the row's bytes are shared"
        );
        let two = Column::from_values(
            "x",
            vec![Value::Tensor(row.clone()), Value::Tensor(row.clone())],
        )
        .unwrap();
        let Column::Dense(t) = two else {
            panic!("rows of one shape are dense")
        };
        assert_eq!(t.shape(), &[2, 4]);
        assert_eq!(
            t.to_vec::<f32>().unwrap(),
            [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]
        );
    }

    #[test]
    fn length_mismatch_names_the_field() {
        let a = Column::Dense(Tensor::from_slice(vec![2, 1], &[1.0f32, 2.0]).unwrap());
        let b = Column::Objects(vec![Bytes::from_static(b"x")]);
        let e = Batch::from_columns([("a", a), ("b", b)]).unwrap_err();
        assert!(e.message().contains("`b`"), "{e}");
    }

    #[test]
    fn from_values_packs_dense_or_ragged() {
        let t1 = Tensor::from_vec(vec![1i64, 2]);
        let t2 = Tensor::from_vec(vec![3i64, 4]);
        let t3 = Tensor::from_vec(vec![5i64]);
        let d = Column::from_values("f", vec![t1.clone().into(), t2.clone().into()]).unwrap();
        match &d {
            Column::Dense(t) => {
                assert_eq!(t.shape(), &[2, 2]);
                assert_eq!(t.to_vec::<i64>().unwrap(), vec![1, 2, 3, 4]);
            }
            other => panic!("expected dense, got {other:?}"),
        }
        let r = Column::from_values("f", vec![t1.into(), t3.into()]).unwrap();
        assert!(matches!(r, Column::Ragged(ref v) if v.len() == 2));
        let e = Column::from_values("f", vec![t2.into(), Value::Object(Bytes::new())]).unwrap_err();
        assert!(e.message().contains("mixes"));
    }

    #[test]
    fn select_rows_gathers_in_order() {
        let t = Tensor::from_slice(vec![4, 1], &[0i32, 1, 2, 3]).unwrap();
        let b = Batch::from_columns([("x", Column::Dense(t))]).unwrap();
        let s = b.select_rows(&[3, 1]).unwrap();
        match s.column("x").unwrap() {
            Column::Dense(t) => assert_eq!(t.to_vec::<i32>().unwrap(), vec![3, 1]),
            other => panic!("{other:?}"),
        }
        assert!(b.select_rows(&[4]).is_err());
    }
}
