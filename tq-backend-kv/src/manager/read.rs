//! Reading cells: every cell, with its sample's generation key, and the store each came from.

use super::*;

impl KvStorageManager {
    /// Reads the cells of `fields` for every sample of `meta`: values in field-major order
    /// (`f * n + row`) and the store each came from. `on_cell(position, value)` sees every value
    /// as its call completes, while later calls are still in flight (get packs columns there);
    /// a value it saw may be replaced by the same cell from a lower-numbered store, which it
    /// then sees too. Nothing it saw counts unless this returns `Ok`.
    pub(super) async fn read_cells(
        &self,
        meta: &BatchMeta,
        fields: &[&str],
        on_cell: &mut (dyn FnMut(usize, &Bytes) + Send),
    ) -> Result<(Vec<Bytes>, Vec<usize>)> {
        let n = meta.len();
        let ks = self.keys(meta.partition());
        let mut plan = Plan::new(self.stores.len());
        let mut tags = self.tags();
        let cell_count = fields.len() * n;
        // Sample-major (see `KvStorageManager::put`); `f * n + r` is the cell's position. Each
        // sample's generation key (on the first store, position `cell_count + r`) follows its
        // cells: it shares their hash slot, so on a cluster it rides in the sample's command
        // instead of costing a command of its own.
        for (r, s) in meta.samples().iter().enumerate() {
            for (f, field) in fields.iter().enumerate() {
                self.plan_existing(
                    &mut plan,
                    &mut tags,
                    &ks,
                    *s,
                    meta.backend_meta().get(r),
                    field,
                    f * n + r,
                )?;
            }
            plan.push(0, ks.generation(s.index), cell_count + r);
        }
        let mut cells: Vec<Option<(Bytes, usize)>> = vec![None; cell_count + n];
        let mut arrivals = futures::stream::select_all(
            plan.keys
                .iter()
                .enumerate()
                .filter(|(_, k)| !k.is_empty())
                .map(|(i, keys)| {
                    self.stores[i]
                        .store
                        .mget_chunks(keys)
                        .map_ok(move |(offset, values)| (i, offset, values))
                }),
        );
        let receive = async {
            while let Some((i, offset, values)) = arrivals.try_next().await? {
                for (slot, v) in plan.slots[i][offset..].iter().zip(values) {
                    let Some(v) = v else { continue };
                    // With several candidate stores, the lowest-numbered one holding the
                    // cell wins, whatever order the answers come in.
                    if cells[*slot].as_ref().is_some_and(|(_, from)| *from < i) {
                        continue;
                    }
                    if *slot < cell_count {
                        on_cell(*slot, &v);
                    }
                    cells[*slot] = Some((v, i));
                }
            }
            Ok::<_, Error>(())
        };
        receive.await.map_err(|e| e.context(self.ctx(meta)))?;
        let gens = cells
            .drain(cell_count..)
            .zip(meta.samples())
            .map(|(g, s)| {
                g.map(|(raw, _)| decode_generation(&ks.generation(s.index), &raw))
                    .transpose()
            })
            .collect::<Result<Vec<Option<u32>>>>()
            .map_err(|e| e.context(self.ctx(meta)))?;
        for (r, (s, g)) in meta.samples().iter().zip(&gens).enumerate() {
            // The generation key is authoritative: a whole-sample clear deletes it at once
            // (even when the cells themselves only expire later).
            let stored_here = *g == Some(s.generation);
            let newer = g.is_some_and(|g| g > s.generation);
            let any_present = (0..fields.len()).any(|f| cells[f * n + r].is_some());
            if newer || (!stored_here && any_present) {
                return Err(Error::not_found(format!(
                    "{}: sample index {} generation {} is not stored ({})",
                    self.ctx(meta),
                    s.index,
                    s.generation,
                    match g {
                        Some(g) if *g > s.generation => format!("the store holds generation {g}"),
                        _ => "it was cleared".to_string(),
                    }
                )));
            }
        }
        let missing: Vec<usize> = (0..cells.len()).filter(|&i| cells[i].is_none()).collect();
        if let Some(&first) = missing.first() {
            let (f, r) = (first / n, first % n);
            return Err(Error::data_lost(format!(
                "{}: cell `{}` (sample {}, field `{}`) is missing from the kv store{}",
                self.ctx(meta),
                Self::existing_key(
                    &ks,
                    meta.samples()[r],
                    meta.backend_meta().get(r),
                    fields[f]
                ),
                meta.samples()[r],
                fields[f],
                if missing.len() > 1 {
                    format!(" ({} cells missing in all)", missing.len())
                } else {
                    String::new()
                }
            )));
        }
        Ok(cells.into_iter().flatten().unzip())
    }
}

/// The column of a field the metadata declares dense, filled row by row as values arrive.
/// Any row whose value is not a tensor of the declared dtype and shape spoils it, and the
/// column is then built from the values instead.
pub(super) struct DenseSink {
    pub(super) dtype: DType,
    pub(super) shape: Vec<usize>,
    pub(super) rows: usize,
    /// The header every row's value must start with (codec): comparing bytes is all the
    /// decoding a matching row needs.
    pub(super) head: Bytes,
    pub(super) row_bytes: usize,
    /// From the read-buffer pool (`tq_core::buffer`), like every packed column.
    pub(super) buf: tq_core::buffer::PoolBuffer,
    pub(super) spoiled: bool,
}

impl DenseSink {
    pub(super) fn for_field(schema: &FieldMeta, rows: usize) -> Option<DenseSink> {
        if schema.kind() != FieldKind::Dense {
            return None;
        }
        let (dtype, shape) = (schema.dtype()?, schema.sample_shape()?.to_vec());
        let row_bytes = shape.iter().product::<usize>().checked_mul(dtype.size())?;
        Some(DenseSink {
            head: encode_tensor_header(dtype, &shape),
            dtype,
            shape,
            rows,
            row_bytes,
            // Every row is written before use.
            buf: tq_core::buffer::BufferPool::global().buffer(row_bytes.checked_mul(rows)?),
            spoiled: false,
        })
    }

    pub(super) fn copy_row(&mut self, row: usize, raw: &Bytes) {
        if self.spoiled {
            return;
        }
        // Anything else (another shape or dtype, a damaged cell) is left to the fallback,
        // which decodes every value and names the key of a bad one.
        if raw.len() != self.head.len() + self.row_bytes || !raw.starts_with(&self.head) {
            self.spoiled = true;
            return;
        }
        let at = row * self.row_bytes;
        self.buf[at..at + self.row_bytes].copy_from_slice(&raw[self.head.len()..]);
    }

    /// The column, once every row was copied (the caller checked that every cell arrived).
    pub(super) fn finish(self) -> Option<Tensor> {
        if self.spoiled {
            return None;
        }
        let mut shape = Vec::with_capacity(self.shape.len() + 1);
        shape.push(self.rows);
        shape.extend_from_slice(&self.shape);
        Tensor::new(self.dtype, shape, self.buf.freeze()).ok()
    }
}
