//! Gets whose large rows land straight in their column's final buffer (remote units that read
//! into buffers): the plan per field ([`Placement`]) and [`SimpleStorage::get_placed`].

use super::*;

impl SimpleStorage {
    /// A get from units that [read into buffers](StorageUnit::reads_into_buffers) (remote
    /// units): every tensor field whose rows are all at least [`PLACE_MIN_ROW_BYTES`] (dense, or
    /// ragged with per-row shapes in the metadata) gets one buffer for all its rows up front,
    /// split into one piece per row, and each unit's answer lands straight in the pieces of its
    /// rows. A dense column joins its pieces back for free (adjacent parts of one allocation);
    /// a ragged column keeps one tensor per piece. This saves the copy that packing received
    /// rows would make (a second pass over every byte, and on fresh memory a second round of
    /// page faults), and the one buffer can use huge pages (`tq_core::buffer`). A field whose
    /// cells do not come back as planned (another dtype or shape than the metadata says, a
    /// retried answer) is built from the values as usual.
    ///
    /// `None` when nothing would be placed (in-process units, linked rows, small rows).
    pub(super) async fn get_placed(
        &self,
        meta: &BatchMeta,
        fields: &[FieldName],
    ) -> Result<Option<Batch>> {
        if meta.has_links() || !self.units.iter().all(|u| u.reads_into_buffers()) {
            return Ok(None);
        }
        let len = meta.len();
        let plans: Vec<Option<Placement>> = fields
            .iter()
            .map(|f| Placement::plan(meta.fields().get(f)?, len))
            .collect();
        if plans.iter().all(Option::is_none) {
            return Ok(None);
        }
        let mut pieces: Vec<Vec<Option<BytesMut>>> = plans
            .iter()
            .map(|plan| match plan {
                Some(plan) => {
                    let mut whole = tq_core::buffer::zeroed_mut(plan.row_bytes.iter().sum());
                    plan.row_bytes
                        .iter()
                        .map(|&n| Some(whole.split_to(n)))
                        .collect()
                }
                None => (0..len).map(|_| None).collect(),
            })
            .collect();
        let samples = meta.samples();
        let routes = self.route(samples);
        let calls: Vec<_> = routes
            .iter()
            .enumerate()
            .filter(|(_, positions)| !positions.is_empty())
            .map(|(u, positions)| {
                let unit_samples: Vec<SampleId> = positions.iter().map(|&p| samples[p]).collect();
                let buffers: Vec<Vec<Option<BytesMut>>> = pieces
                    .iter_mut()
                    .map(|field| positions.iter().map(|&p| field[p].take()).collect())
                    .collect();
                let unit = &self.units[u];
                async move { (u, unit.get_into(fields, &unit_samples, buffers).await) }
            })
            .collect();
        let replies = self.collect("get", meta, join_all(calls).await)?;

        let mut cells: Vec<Vec<Option<Fetched>>> = (0..fields.len())
            .map(|_| (0..len).map(|_| None).collect())
            .collect();
        for (u, reply) in replies {
            let positions = &routes[u];
            self.check_get_reply(meta, u, fields.len(), positions.len(), &reply)?;
            for (per_field, column) in cells.iter_mut().zip(reply) {
                for (cell, &pos) in column.into_iter().zip(positions) {
                    per_field[pos] = Some(cell);
                }
            }
        }
        let mut batch = Batch::empty(len);
        for ((field, plan), column) in fields.iter().zip(&plans).zip(cells) {
            let column: Vec<Fetched> = column
                .into_iter()
                .collect::<Option<Vec<Fetched>>>()
                .ok_or_else(|| unrouted(meta, field))?;
            let as_planned = plan.as_ref().filter(|plan| {
                column.iter().enumerate().all(|(r, c)| {
                    matches!(c, Fetched::Placed { dtype, shape, .. }
                        if *dtype == plan.dtype && shape.as_slice() == plan.row_shape(r))
                })
            });
            let column = match as_planned {
                Some(Placement {
                    dtype,
                    shapes: RowShapes::Dense(shape),
                    ..
                }) => {
                    let mut whole = BytesMut::new();
                    for cell in column {
                        if let Fetched::Placed { bytes, .. } = cell {
                            // Adjacent pieces of one allocation: joins without copying.
                            whole.unsplit(bytes);
                        }
                    }
                    let mut full = Vec::with_capacity(shape.len() + 1);
                    full.push(len);
                    full.extend_from_slice(shape);
                    Column::Dense(Tensor::new(*dtype, full, whole.freeze())?)
                }
                Some(plan) => Column::Ragged(
                    column
                        .into_iter()
                        .map(|cell| match cell {
                            Fetched::Placed { shape, bytes, .. } => {
                                Tensor::new(plan.dtype, shape, bytes.freeze())
                            }
                            Fetched::Value(_) => unreachable!("checked: every cell was placed"),
                        })
                        .collect::<Result<Vec<_>>>()?,
                ),
                None => {
                    let values = column
                        .into_iter()
                        .map(Fetched::into_value)
                        .collect::<Result<Vec<_>>>()?;
                    column_of(field, values)?
                }
            };
            batch
                .insert(field.clone(), column)
                .map_err(|e| e.context(format!("partition `{}`: get", meta.partition())))?;
        }
        Ok(Some(batch))
    }
}

/// A field's column from the values a get read: one tensor over the rows' own pages when
/// they are views of same-host units' shared memory that can be joined ([`joined_dense`]),
/// else packed or kept as they are ([`Column::from_values`]).
pub(super) fn column_of(field: &str, values: Vec<Value>) -> Result<Column> {
    match joined_dense(&values) {
        Some(tensor) => tensor.map(Column::Dense),
        None => Column::from_values(field, values),
    }
}

/// A dense column whose rows came back as views of same-host units' shared memory (rows of
/// whole pages, not copied into offered pieces), all of the first row's dtype and shape, as
/// one tensor over those pages mapped side by side: no copy at all. `None` when the rows are
/// not all such views of one dtype and shape, or cannot be joined (rows that alternate between
/// units' segments make runs too short to map: see [`tq_unit::net::join_shared_rows`]); the
/// column is then assembled by copying.
fn joined_dense(values: &[Value]) -> Option<Result<Tensor>> {
    #[cfg(feature = "net")]
    {
        let Some(Value::Tensor(first)) = values.first() else {
            return None;
        };
        if !tq_unit::net::in_shared_memory(first.data()) {
            return None;
        }
        let (dtype, shape) = (first.dtype(), first.shape());
        let uniform = values
            .iter()
            .all(|v| matches!(v, Value::Tensor(t) if t.dtype() == dtype && t.shape() == shape));
        if !uniform {
            return None;
        }
        let whole = tq_unit::net::join_shared_rows(values.iter().map(Value::bytes))?;
        let mut full = Vec::with_capacity(shape.len() + 1);
        full.push(values.len());
        full.extend_from_slice(shape);
        Some(Tensor::new(dtype, full, whole))
    }
    #[cfg(not(feature = "net"))]
    {
        let _ = values;
        None
    }
}

/// How [`SimpleStorage::get_placed`] receives one field: the dtype, the rows' shapes and the
/// bytes of each row.
pub(super) struct Placement {
    pub(super) dtype: DType,
    pub(super) shapes: RowShapes,
    pub(super) row_bytes: Vec<usize>,
}

/// One shape for every row of a dense field, one per row of a ragged one.
pub(super) enum RowShapes {
    Dense(Vec<usize>),
    Ragged(Vec<Vec<usize>>),
}

impl Placement {
    /// A plan for a tensor field of `rows` rows whose every row is at least
    /// [`PLACE_MIN_ROW_BYTES`]; `None` otherwise.
    pub(super) fn plan(schema: &FieldMeta, rows: usize) -> Option<Placement> {
        let dtype = schema.dtype()?;
        let bytes = |shape: &[usize]| dtype.size() * shape.iter().product::<usize>();
        let (shapes, row_bytes) = match schema.kind() {
            FieldKind::Dense => {
                let shape = schema.sample_shape()?.to_vec();
                let row_bytes = vec![bytes(&shape); rows];
                (RowShapes::Dense(shape), row_bytes)
            }
            FieldKind::Ragged => {
                let shapes = schema.per_sample_shapes()?.to_vec();
                if shapes.len() != rows {
                    return None;
                }
                let row_bytes = shapes.iter().map(|s| bytes(s)).collect();
                (RowShapes::Ragged(shapes), row_bytes)
            }
            FieldKind::Object => return None,
        };
        row_bytes
            .iter()
            .all(|&n| n >= PLACE_MIN_ROW_BYTES)
            .then_some(Placement {
                dtype,
                shapes,
                row_bytes,
            })
    }

    /// The shape row `r` must come back with.
    pub(super) fn row_shape(&self, r: usize) -> &[usize] {
        match &self.shapes {
            RowShapes::Dense(shape) => shape,
            RowShapes::Ragged(shapes) => &shapes[r],
        }
    }
}
