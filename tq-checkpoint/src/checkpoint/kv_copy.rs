//! KV payloads copied into a checkpoint (on request: by default they stay in their store).
//!
//! The controller snapshot is taken with a hold on removals (clears and overwrites wait; see
//! `tq_controller`'s `snapshot_holding_removals`), the cells it names are read from the store
//! by the backend ([`PayloadCopy::export`], one page per chunk of samples), and the hold is
//! lifted. Pages go into `kv-<stamp>-<n>.pages` files of about 64 MiB:
//!
//! ```text
//! magic "TQKVCPY1" | then per page: length u64 LE | the backend's page
//! ```
//!
//! Loading checks every page ([`PayloadCopy::check`]) before the controller changes, then
//! writes them back after the state is restored, under a fresh epoch the load gives the
//! controller (so no key a store already holds is in the way).

use super::cells::PAGE_BYTES;
use super::{CheckpointFile, UnitCells};
use crate::place::Place;
use futures::{StreamExt, TryStreamExt};
use tq_core::cells::{CopiedCells, PayloadCopy};
use tq_core::{BatchMeta, Bytes, Error, Result};

const MAGIC: &[u8; 8] = b"TQKVCPY1";

/// Samples per export call: one store round trip (per store) of their cells per call. Small
/// enough that the reads of the next pages overlap the writing of a file.
const SAMPLES_PER_PAGE: usize = 64;

/// Export calls in flight at once (the store's own per-call limits apply inside each).
const PAGES_IN_FLIGHT: usize = 4;

/// A data file of KV payload copies.
pub(super) fn is_copy_file(name: &str) -> bool {
    name.starts_with("kv-") && name.ends_with(".pages")
}

/// Reads every cell the snapshot `state` names and writes them as `kv-<stamp>-<n>.pages`.
pub(super) async fn save(
    place: &Place,
    copy: &dyn PayloadCopy,
    state: &[u8],
    stamp: u64,
) -> Result<UnitCells> {
    let chunks: Vec<BatchMeta> = tq_controller::snapshot_cells(state)?
        .into_iter()
        .flat_map(|(partition, cells)| {
            cells
                .chunks(SAMPLES_PER_PAGE)
                .map(|chunk| {
                    let (samples, rows): (Vec<_>, Vec<_>) = chunk.iter().cloned().unzip();
                    BatchMeta::new(partition.clone(), samples).with_backend_meta(rows)
                })
                .collect::<Vec<_>>()
        })
        .collect::<Result<_>>()?;
    let mut out = UnitCells {
        cells: 0,
        bytes: 0,
        files: Vec::new(),
    };
    let mut file: Vec<Bytes> = Vec::new();
    let mut file_bytes = 0u64;
    // The export futures are made up front (they do nothing until polled): a closure in the
    // stream itself would keep the save's future from being provably `Send`, which the
    // `Checkpoints` trait promises (rustc's higher-ranked lifetime limitation, #102211).
    let exports: Vec<_> = chunks.iter().map(|meta| copy.export(meta)).collect();
    let mut pages = futures::stream::iter(exports).buffered(PAGES_IN_FLIGHT);
    while let Some((page, counts)) = pages.try_next().await? {
        out.cells += counts.cells;
        out.bytes += counts.bytes;
        let len: u64 = page.iter().map(|p| p.len() as u64).sum();
        file_bytes += len;
        file.push(Bytes::copy_from_slice(&len.to_le_bytes()));
        file.extend(page);
        if file_bytes >= PAGE_BYTES {
            write_file(place, &mut out, std::mem::take(&mut file), stamp).await?;
            file_bytes = 0;
        }
    }
    if !file.is_empty() {
        write_file(place, &mut out, file, stamp).await?;
    }
    Ok(out)
}

async fn write_file(
    place: &Place,
    out: &mut UnitCells,
    pages: Vec<Bytes>,
    stamp: u64,
) -> Result<()> {
    let name = format!("kv-{stamp}-{:05}.pages", out.files.len());
    let mut parts = Vec::with_capacity(pages.len() + 1);
    parts.push(Bytes::from_static(MAGIC));
    parts.extend(pages);
    let (bytes, crc) = place.put_parts(&name, parts).await?;
    out.files.push(CheckpointFile {
        name,
        bytes,
        crc32: format!("{crc:08x}"),
    });
    Ok(())
}

/// The pages of one `.pages` file (already checked against its size and CRC-32), each
/// checked by the backend; `what` names the file in errors.
pub(super) fn decode(
    file: Bytes,
    copy: &dyn PayloadCopy,
    what: &str,
) -> Result<(Vec<Bytes>, CopiedCells)> {
    let bad = |why: String| Error::corrupted(format!("checkpoint: `{what}` {why}"));
    if file.len() < MAGIC.len() || &file[..MAGIC.len()] != MAGIC {
        return Err(bad("is not a tq KV payload copy".into()));
    }
    let mut at = MAGIC.len();
    let mut pages = Vec::new();
    let mut total = CopiedCells::default();
    while at < file.len() {
        let len = file
            .get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| bad(format!("ends inside the length of page {}", pages.len())))?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|n| (at + 8).checked_add(n))
            .filter(|&e| e <= file.len())
            .ok_or_else(|| bad(format!("ends inside page {}", pages.len())))?;
        let page = file.slice(at + 8..end);
        let counts = copy.check(&page, &format!("`{what}` page {}", pages.len()))?;
        total.cells += counts.cells;
        total.bytes += counts.bytes;
        pages.push(page);
        at = end;
    }
    Ok((pages, total))
}
