//! Copies of KV payloads for checkpoints ([`PayloadCopy`]): the stored values of the cells a
//! controller snapshot names, read as they are and written back under the same keys.
//!
//! A page is one partition's cells, as stored (header and payload, never decoded):
//!
//! ```text
//! u32 LE: header length | postcard header (format, partition, per cell: sample index and
//! generation, field, store tag, write version, value length) | the values, back to back
//! ```
//!
//! Keys are rebuilt from those parts on import, with the importing manager's namespace and the
//! checkpoint's epoch, so a copy loads into another store or namespace. Each sample's
//! generation key is written back too (a read checks it), set to the sample's generation.

use super::*;
use serde::{Deserialize, Serialize};
use tq_core::cells::{CopiedCells, PayloadCopy};

/// The page format this build writes and reads.
const PAGE_FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct PageHead {
    format: u32,
    partition: String,
    cells: Vec<CellHead>,
}

#[derive(Serialize, Deserialize)]
struct CellHead {
    index: u32,
    generation: u32,
    field: String,
    tag: Vec<u8>,
    version: u64,
    len: u64,
}

/// A decoded page: its header and the values, sliced out of the page without copying.
struct Page {
    head: PageHead,
    values: Vec<Bytes>,
}

fn decode_page(page: &Bytes, what: &str) -> Result<Page> {
    let bad = |why: String| Error::corrupted(format!("kv payload copy {what}: {why}"));
    let len_bytes: [u8; 4] = page
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| bad(format!("{} bytes, too short for a page", page.len())))?;
    let head_len = u32::from_le_bytes(len_bytes) as usize;
    let head_end = 4usize
        .checked_add(head_len)
        .filter(|&e| e <= page.len())
        .ok_or_else(|| {
            bad(format!(
                "a header of {head_len} bytes in {} bytes",
                page.len()
            ))
        })?;
    let head: PageHead = postcard::from_bytes(&page[4..head_end])
        .map_err(|e| bad(format!("the header does not decode: {e}")))?;
    if head.format > PAGE_FORMAT {
        return Err(Error::invalid(format!(
            "kv payload copy {what}: page format {}, newer than this build reads (up to \
             {PAGE_FORMAT})",
            head.format
        )));
    }
    let mut values = Vec::with_capacity(head.cells.len());
    let mut at = head_end;
    for c in &head.cells {
        let end = usize::try_from(c.len)
            .ok()
            .and_then(|l| at.checked_add(l))
            .filter(|&e| e <= page.len())
            .ok_or_else(|| {
                bad(format!(
                    "cell `{}` of sample {}/{} runs past the page's end",
                    c.field, c.index, c.generation
                ))
            })?;
        values.push(page.slice(at..end));
        at = end;
    }
    if at != page.len() {
        return Err(bad(format!(
            "{} bytes after the last cell",
            page.len() - at
        )));
    }
    Ok(Page { head, values })
}

impl KvStorageManager {
    /// The store of every cell of `page`, checked before anything is written.
    fn stores_of(&self, page: &Page, what: &str) -> Result<Vec<usize>> {
        let mut tags = self.tags();
        page.head
            .cells
            .iter()
            .map(|c| {
                tags.resolve(&Bytes::copy_from_slice(&c.tag))
                    .map_err(|e| e.context(format!("kv payload copy {what}")))
            })
            .collect()
    }
}

#[async_trait]
impl PayloadCopy for KvStorageManager {
    async fn export(&self, meta: &BatchMeta) -> Result<(Vec<Bytes>, CopiedCells)> {
        let ks = self.keys(meta.partition());
        let mut plan = Plan::new(self.stores.len());
        let mut heads = Vec::new();
        let mut tags = self.tags();
        for (s, row) in meta.samples().iter().zip(meta.backend_meta()) {
            for (field, raw) in row {
                let loc = CellLoc::decode(raw)?;
                let store = tags.resolve(&loc.tag)?;
                plan.push(store, ks.cell_at(*s, field, loc.version), heads.len());
                heads.push(CellHead {
                    index: s.index,
                    generation: s.generation,
                    field: field.clone(),
                    tag: loc.tag.to_vec(),
                    version: loc.version,
                    len: 0,
                });
            }
        }
        let reads =
            plan.keys
                .iter()
                .enumerate()
                .filter(|(_, k)| !k.is_empty())
                .map(|(i, keys)| async move {
                    self.stores[i].store.mget_all(keys).await.map(|v| (i, v))
                });
        let answers = futures::future::try_join_all(reads)
            .await
            .map_err(|e| e.context(self.ctx(meta)))?;
        let mut values: Vec<Option<Bytes>> = vec![None; heads.len()];
        for (i, got) in answers {
            for ((slot, key), value) in plan.slots[i].iter().zip(&plan.keys[i]).zip(got) {
                let value = value.ok_or_else(|| {
                    Error::data_lost(format!(
                        "{}: cell `{key}` is named by the controller but missing from the kv \
                         store; it cannot be copied",
                        self.ctx(meta)
                    ))
                })?;
                values[*slot] = Some(value);
            }
        }
        let mut bytes = 0u64;
        for (h, v) in heads.iter_mut().zip(&values) {
            h.len = v.as_ref().map_or(0, |v| v.len() as u64);
            bytes += h.len;
        }
        let counts = CopiedCells {
            cells: heads.len() as u64,
            bytes,
        };
        let head = postcard::to_allocvec(&PageHead {
            format: PAGE_FORMAT,
            partition: meta.partition().to_string(),
            cells: heads,
        })
        .map_err(|e| Error::internal(format!("cannot encode a kv payload copy: {e}")))?;
        let head_len = u32::try_from(head.len()).map_err(|_| {
            Error::invalid(format!(
                "{}: a kv payload copy header of {} bytes (copy fewer samples at a time)",
                self.ctx(meta),
                head.len()
            ))
        })?;
        let mut lead = Vec::with_capacity(4 + head.len());
        lead.extend_from_slice(&head_len.to_le_bytes());
        lead.extend_from_slice(&head);
        let mut parts = Vec::with_capacity(1 + values.len());
        parts.push(Bytes::from(lead));
        parts.extend(values.into_iter().flatten());
        Ok((parts, counts))
    }

    fn check(&self, page: &Bytes, what: &str) -> Result<CopiedCells> {
        let decoded = decode_page(page, what)?;
        self.stores_of(&decoded, what)?;
        Ok(CopiedCells {
            cells: decoded.values.len() as u64,
            bytes: decoded.values.iter().map(|v| v.len() as u64).sum(),
        })
    }

    async fn import(&self, page: Bytes, epoch: u64, what: &str) -> Result<CopiedCells> {
        let decoded = decode_page(&page, what)?;
        let stores = self.stores_of(&decoded, what)?;
        let ks = KeyScheme::in_epoch(&self.options.namespace, epoch, &decoded.head.partition);
        let mut per_store: Vec<Vec<(String, KvValue)>> = vec![Vec::new(); self.stores.len()];
        let mut generations: BTreeMap<u32, u32> = BTreeMap::new();
        let mut bytes = 0u64;
        for ((c, value), store) in decoded.head.cells.iter().zip(decoded.values).zip(stores) {
            let sample = SampleId::new(c.index, c.generation);
            bytes += value.len() as u64;
            per_store[store].push((ks.cell_at(sample, &c.field, c.version), value.into()));
            generations.insert(c.index, c.generation);
        }
        let cells = decoded.head.cells.len() as u64;
        per_store[0].extend(generations.into_iter().map(|(index, g)| {
            (
                ks.generation(index),
                KvValue::from(crate::codec::encode_generation(g)),
            )
        }));
        self.write(per_store).await.map_err(|e| {
            e.context(format!(
                "{} partition `{}`: kv payload copy {what}",
                self.name, decoded.head.partition
            ))
        })?;
        Ok(CopiedCells { cells, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(cells: &[(&str, &[u8])]) -> Bytes {
        let head = PageHead {
            format: PAGE_FORMAT,
            partition: "p".into(),
            cells: cells
                .iter()
                .enumerate()
                .map(|(i, (field, v))| CellHead {
                    index: i as u32,
                    generation: 1,
                    field: field.to_string(),
                    tag: b"memory".to_vec(),
                    version: 0,
                    len: v.len() as u64,
                })
                .collect(),
        };
        let head = postcard::to_allocvec(&head).unwrap();
        let mut out = (head.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&head);
        for (_, v) in cells {
            out.extend_from_slice(v);
        }
        Bytes::from(out)
    }

    #[test]
    fn pages_decode_and_refuse_damage() {
        let good = page(&[("a", b"xyz"), ("b", b"")]);
        let p = decode_page(&good, "t").unwrap();
        assert_eq!(p.values, vec![Bytes::from_static(b"xyz"), Bytes::new()]);
        // Cut short, one byte too many, a header longer than the page: refused, never a panic.
        for bad in [
            good.slice(..good.len() - 1),
            Bytes::from([&good[..], b"!"].concat()),
            Bytes::from_static(&[255, 255, 255, 255, 0]),
            Bytes::from_static(&[1]),
        ] {
            let e = decode_page(&bad, "t").err().expect("refused");
            assert_eq!(e.kind(), &tq_core::ErrorKind::Corrupted, "{e}");
        }
    }
}
