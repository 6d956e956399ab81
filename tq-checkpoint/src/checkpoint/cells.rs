//! The cells of storage units in a checkpoint: one or more `.cells` files per unit, each a page
//! of the unit's capture (see [`tq_core::cells`] for how the capture is taken consistently).
//!
//! ```text
//! magic "TQCELLS1" | header length u64 LE | header (postcard) | the cells' bytes, in order
//! header: per field, its name, its samples (index, generation) and one entry per cell
//!         (tensor dtype, shape and byte length, or object byte length)
//! ```
//!
//! The file's size and CRC-32 are in the manifest, so the header needs no checksum of its own.
//! Loaded cells are slices of the file's one buffer (no copy per cell).

use super::{CheckpointFile, UnitCells};
use crate::place::Place;
use serde::{Deserialize, Serialize};
use tq_core::cells::{CaptureInfo, FieldCells, PayloadCheckpoint};
use tq_core::{Bytes, DType, Error, FieldName, Result, SampleId, Tensor, Value};

const MAGIC: &[u8; 8] = b"TQCELLS1";

/// How much of a unit's cells one file holds (about; a larger cell gets a file of its own).
pub(crate) const PAGE_BYTES: u64 = 64 << 20;

#[derive(Debug, Serialize, Deserialize)]
enum FileCell {
    Tensor {
        dtype: DType,
        shape: Vec<usize>,
        len: u64,
    },
    Object {
        len: u64,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct FileField {
    field: FieldName,
    samples: Vec<SampleId>,
    cells: Vec<FileCell>,
}

/// A page of cells as the parts of one file.
pub(crate) fn encode(fields: Vec<FieldCells>) -> Result<Vec<Bytes>> {
    let mut payload = Vec::new();
    let header: Vec<FileField> = fields
        .into_iter()
        .map(|fc| {
            let cells = fc
                .values
                .iter()
                .map(|v| match v {
                    Value::Tensor(t) => FileCell::Tensor {
                        dtype: t.dtype(),
                        shape: t.shape().to_vec(),
                        len: t.nbytes() as u64,
                    },
                    Value::Object(b) => FileCell::Object {
                        len: b.len() as u64,
                    },
                })
                .collect();
            payload.extend(fc.values.iter().map(|v| v.bytes().clone()));
            FileField {
                field: fc.field,
                samples: fc.samples,
                cells,
            }
        })
        .collect();
    let header = postcard::to_allocvec(&header)
        .map_err(|e| Error::internal(format!("checkpoint: cannot encode a cells header: {e}")))?;
    let mut lead = Vec::with_capacity(16 + header.len());
    lead.extend_from_slice(MAGIC);
    lead.extend_from_slice(&(header.len() as u64).to_le_bytes());
    lead.extend_from_slice(&header);
    let mut parts = Vec::with_capacity(1 + payload.len());
    parts.push(Bytes::from(lead));
    parts.extend(payload);
    Ok(parts)
}

/// The cells of a `.cells` file (already checked against its size and CRC-32); `what` names
/// the file in errors.
pub(crate) fn decode(file: Bytes, what: &str) -> Result<Vec<FieldCells>> {
    let bad = |why: String| Error::corrupted(format!("checkpoint: `{what}` {why}"));
    if file.len() < 16 || &file[..8] != MAGIC {
        return Err(bad("is not a tq cells file".into()));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&file[8..16]);
    let header_len = usize::try_from(u64::from_le_bytes(len))
        .ok()
        .filter(|n| *n <= file.len() - 16)
        .ok_or_else(|| bad("has a header longer than the file".into()))?;
    let header: Vec<FileField> = postcard::from_bytes(&file[16..16 + header_len])
        .map_err(|e| bad(format!("has a header that does not decode: {e}")))?;
    let mut at = 16 + header_len;
    let mut out = Vec::with_capacity(header.len());
    for f in header {
        if f.samples.len() != f.cells.len() {
            return Err(bad(format!(
                "lists {} samples and {} cells for field `{}`",
                f.samples.len(),
                f.cells.len(),
                f.field
            )));
        }
        let mut values = Vec::with_capacity(f.cells.len());
        for (cell, sample) in f.cells.into_iter().zip(&f.samples) {
            let len = match &cell {
                FileCell::Tensor { len, .. } | FileCell::Object { len } => *len,
            };
            let end = usize::try_from(len)
                .ok()
                .and_then(|n| at.checked_add(n))
                .filter(|end| *end <= file.len())
                .ok_or_else(|| {
                    bad(format!(
                        "ends inside field `{}` of sample {sample}",
                        f.field
                    ))
                })?;
            let bytes = file.slice(at..end);
            at = end;
            values.push(match cell {
                FileCell::Object { .. } => Value::Object(bytes),
                FileCell::Tensor { dtype, shape, .. } => {
                    Value::Tensor(Tensor::new(dtype, shape, bytes).map_err(|e| {
                        bad(format!(
                            "holds a bad tensor for field `{}` of sample {sample}: {}",
                            f.field,
                            e.message()
                        ))
                    })?)
                }
            });
        }
        out.push(FieldCells {
            field: f.field,
            samples: f.samples,
            values,
        });
    }
    if at != file.len() {
        return Err(bad(format!(
            "has {} bytes after its last cell",
            file.len() - at
        )));
    }
    Ok(out)
}

/// Writes every part's capture as `unit-<part>-<stamp>-<page>.cells` files.
pub(super) async fn save(
    place: &Place,
    payloads: &dyn PayloadCheckpoint,
    captures: &[CaptureInfo],
    stamp: u64,
) -> Result<Vec<UnitCells>> {
    let mut units = Vec::with_capacity(captures.len());
    for (part, capture) in captures.iter().enumerate() {
        let mut unit = UnitCells {
            cells: capture.cells,
            bytes: capture.bytes,
            files: Vec::new(),
        };
        let mut offset = Some(0);
        while let Some(at) = offset {
            if capture.cells == 0 {
                break;
            }
            let page = payloads.page(part, capture.id, at, PAGE_BYTES).await?;
            offset = page.next;
            let name = format!("unit-{part}-{stamp}-{:05}.cells", unit.files.len());
            let (bytes, crc) = place.put_parts(&name, encode(page.fields)?).await?;
            unit.files.push(CheckpointFile {
                name,
                bytes,
                crc32: format!("{crc:08x}"),
            });
        }
        units.push(unit);
    }
    Ok(units)
}
