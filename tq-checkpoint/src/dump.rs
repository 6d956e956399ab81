//! Dump and load of one partition's keys, with their links (the original system's
//! `dump_data_by_key` / `load_data_by_key`): [`Dumps::kv_dump`] and [`Dumps::kv_load`].
//!
//! ```text
//! DIR/rows-<unix ms>.bin           magic "TQROWS01" | postcard: per key, its tags, the fields
//!                                  it holds itself, and its links (field, public partition,
//!                                  public key, fingerprint of the public cell)
//! DIR/dump-<unix ms>-<page>.cells  the keys' own cells (the checkpoint cells format; the
//!                                  "sample" of a cell is its row number in the rows file)
//! DIR/DUMP.toml                    format, tq version, partition, counts, every file's size
//!                                  and CRC-32; last line: its own CRC-32. Written last.
//! ```
//!
//! A link records which public key a field reads, not the bytes, so a dump stays small when
//! many keys share one prompt. The danger is the one upstream's review found: the public key
//! is cleared and written again with other bytes between the dump and the load, and the
//! loaded keys silently read the new bytes. So each link carries a fingerprint of the public
//! cell at dump time (dtype, shape, length and CRC-32 of its bytes), and a load whose public
//! cell differs is refused before anything is written. A dump taken with
//! [`DumpOptions::dereference_links`] stores the public bytes as the keys' own cells instead,
//! so it loads whatever happened to the public key since.

use crate::checkpoint::{cells, crc_hex, read_checked, seal, unseal, CheckpointFile};
use crate::place::Place;
use crate::On;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use tq_client::{LinkOptions, Partition};
use tq_core::cells::{page_of, FieldCells};
use tq_core::{Batch, Bytes, Column, DType, Error, FieldName, Result, SampleId, Tags, Value};

/// The dump format this build writes; it reads this one and older.
pub const DUMP_FORMAT: u32 = 1;

const MANIFEST: &str = "DUMP.toml";
const ROWS_MAGIC: &[u8; 8] = b"TQROWS01";
const WHAT: &str = "dump";

/// How [`Dumps::kv_dump`] treats linked fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpOptions {
    /// Store the bytes a linked field reads as the key's own cell (the load then does not
    /// need the public key, and makes a private copy), instead of the link and a fingerprint.
    pub dereference_links: bool,
}

/// What `DUMP.toml` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpManifest {
    pub format: u32,
    pub tq_version: String,
    pub created_unix_ms: u64,
    pub partition: String,
    pub keys: u64,
    /// Cells the keys hold themselves (in the `.cells` files).
    pub cells: u64,
    /// Links recorded (field of a key → public key).
    pub links: u64,
    pub dereferenced_links: bool,
    pub files: Vec<CheckpointFile>,
}

/// What identifies the bytes of a public cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Fingerprint {
    /// `None` for an object.
    dtype: Option<DType>,
    shape: Vec<usize>,
    bytes: u64,
    crc32: u32,
}

impl Fingerprint {
    fn of(value: &Value) -> Fingerprint {
        let (dtype, shape) = match value {
            Value::Tensor(t) => (Some(t.dtype()), t.shape().to_vec()),
            Value::Object(_) => (None, Vec::new()),
        };
        Fingerprint {
            dtype,
            shape,
            bytes: value.nbytes() as u64,
            crc32: crc32fast::hash(value.bytes()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DumpLink {
    field: FieldName,
    public_partition: String,
    public_key: String,
    fingerprint: Fingerprint,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DumpRow {
    key: String,
    tags: Tags,
    /// Fields whose cells are in the `.cells` files.
    fields: Vec<FieldName>,
    links: Vec<DumpLink>,
}

fn is_dump_file(name: &str) -> bool {
    (name.starts_with("rows-") && name.ends_with(".bin"))
        || (name.starts_with("dump-") && name.ends_with(".cells"))
}

/// Dumps of a partition's keys, written and loaded through a partition handle (`use
/// tq::checkpoint::Dumps` to call them on a [`Partition`]).
pub trait Dumps {
    /// Dumps `keys` of this partition (`None`: every key) to `url` (a directory, `file://DIR`,
    /// or `s3://bucket/prefix` with feature `s3`): tags, the cells each key holds, and its
    /// links with a fingerprint of the public cell each reads (or, with
    /// [`DumpOptions::dereference_links`], the public bytes as its own cells). Fields not
    /// produced are not dumped. The dump is whole once `DUMP.toml` is written (last); a
    /// previous dump in the same place stays loadable until then.
    fn kv_dump(
        &self,
        url: &str,
        keys: Option<&[&str]>,
        options: &DumpOptions,
    ) -> impl Future<Output = Result<DumpManifest>> + Send;

    /// Loads a dump written by [`Dumps::kv_dump`] (of any partition) into this partition.
    /// Everything is checked before anything is written: the manifest and every file (format,
    /// sizes, CRC-32), that none of the keys exists here, and that every linked public cell
    /// still has the bytes it had at dump time (else the load is refused, naming the key, the
    /// field and the public key: dump again, or dump with dereferenced links). Links are made
    /// first (one atomic step per public partition and field, which checks the destination's
    /// schemas before it changes anything), then the keys' own cells are written; if a later
    /// step fails, the keys this load created are cleared again.
    fn kv_load(&self, url: &str) -> impl Future<Output = Result<DumpManifest>> + Send;
}

impl Dumps for Partition {
    async fn kv_dump(
        &self,
        url: &str,
        keys: Option<&[&str]>,
        options: &DumpOptions,
    ) -> Result<DumpManifest> {
        On(self).dump(url, keys, options).await
    }

    async fn kv_load(&self, url: &str) -> Result<DumpManifest> {
        On(self).load(url).await
    }
}

impl On<'_, Partition> {
    /// [`Dumps::kv_dump`].
    async fn dump(
        &self,
        url: &str,
        keys: Option<&[&str]>,
        options: &DumpOptions,
    ) -> Result<DumpManifest> {
        let place = Place::parse(url)?;
        let partition = self.name().to_string();
        let keys: Vec<String> = match keys {
            Some(k) => k.iter().map(|s| s.to_string()).collect(),
            None => self
                .kv_list()
                .await?
                .entries
                .into_iter()
                .map(|(k, _)| k)
                .collect(),
        };
        if keys.is_empty() {
            return Err(Error::invalid(format!(
                "dump of partition `{partition}`: no keys to dump"
            )));
        }
        let tags = self.kv_tags(&keys).await?;
        // Each key's produced fields and links.
        let control = self.client().control().clone();
        let mut described = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(64) {
            let calls = chunk.iter().map(|k| {
                let control = control.clone();
                let partition = partition.clone();
                async move {
                    control
                        .kv_retrieve_meta(&partition, std::slice::from_ref(k), false)
                        .await
                }
            });
            for (k, r) in chunk.iter().zip(futures::future::join_all(calls).await) {
                let m = r?;
                if !m.missing.is_empty() || m.meta.len() != 1 {
                    return Err(Error::not_found(format!(
                        "dump of partition `{partition}`: key `{k}` does not exist"
                    )));
                }
                let fields: Vec<FieldName> = m.meta.fields().keys().cloned().collect();
                let links = m.meta.links().first().cloned().unwrap_or_default();
                described.push((fields, links));
            }
        }
        // Public keys of the linked samples.
        let linked: BTreeSet<SampleId> = described
            .iter()
            .flat_map(|(_, l)| l.values().copied())
            .collect();
        let public = if linked.is_empty() || options.dereference_links {
            HashMap::new()
        } else {
            self.public_keys_of(&linked).await?
        };

        let mut rows = Vec::with_capacity(keys.len());
        let mut groups: BTreeMap<Vec<FieldName>, Vec<usize>> = BTreeMap::new();
        let mut fingerprints: BTreeMap<(String, FieldName), Vec<(usize, String)>> = BTreeMap::new();
        for (row, ((key, tags), (fields, links))) in
            keys.iter().zip(tags).zip(described).enumerate()
        {
            let own: Vec<FieldName> = if options.dereference_links {
                fields
            } else {
                fields
                    .into_iter()
                    .filter(|f| !links.contains_key(f))
                    .collect()
            };
            let mut row_links = Vec::new();
            if !options.dereference_links {
                for (field, src) in &links {
                    let (pp, pk) = public.get(src).ok_or_else(|| {
                        Error::not_found(format!(
                            "dump of partition `{partition}`: field `{field}` of key `{key}` \
                             links sample {src}, which no public key holds any more"
                        ))
                    })?;
                    fingerprints
                        .entry((pp.clone(), field.clone()))
                        .or_default()
                        .push((row, pk.clone()));
                    row_links.push(DumpLink {
                        field: field.clone(),
                        public_partition: pp.clone(),
                        public_key: pk.clone(),
                        fingerprint: Fingerprint {
                            dtype: None,
                            shape: Vec::new(),
                            bytes: 0,
                            crc32: 0,
                        },
                    });
                }
            }
            if !own.is_empty() {
                groups.entry(own.clone()).or_default().push(row);
            }
            rows.push(DumpRow {
                key: key.clone(),
                tags,
                fields: own,
                links: row_links,
            });
        }
        // Fingerprints of the public cells, read once per (public partition, field).
        for ((pp, field), users) in &fingerprints {
            let pkeys: Vec<&str> = users.iter().map(|(_, k)| k.as_str()).collect();
            let values = read_field(&self.client().partition(pp), &pkeys, field).await?;
            for ((row, _), v) in users.iter().zip(values) {
                let link = rows[*row]
                    .links
                    .iter_mut()
                    .find(|l| &l.field == field)
                    .ok_or_else(|| Error::internal("dump: a link went missing"))?;
                link.fingerprint = Fingerprint::of(&v);
            }
        }
        // The keys' own cells, read per group of keys with the same fields.
        let mut captured: Vec<FieldCells> = Vec::new();
        for (fields, members) in &groups {
            let gkeys: Vec<&str> = members.iter().map(|r| keys[*r].as_str()).collect();
            let names: Vec<&str> = fields.iter().map(String::as_str).collect();
            let batch = self.kv_batch_get(&gkeys, Some(names.as_slice())).await?;
            for f in fields {
                let column = batch.column(f).ok_or_else(|| {
                    Error::internal(format!("dump: the read of `{f}` came back without it"))
                })?;
                captured.push(FieldCells {
                    field: f.clone(),
                    samples: members
                        .iter()
                        .map(|r| SampleId::new(*r as u32, 0))
                        .collect(),
                    values: column.values(),
                });
            }
        }

        let created_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        place.prepare()?;
        let mut files = Vec::new();
        let rows_name = format!("rows-{created_unix_ms}.bin");
        let mut rows_file = ROWS_MAGIC.to_vec();
        rows_file.extend(
            postcard::to_allocvec(&rows)
                .map_err(|e| Error::internal(format!("dump: cannot encode the rows: {e}")))?,
        );
        files.push(CheckpointFile {
            name: rows_name.clone(),
            bytes: rows_file.len() as u64,
            crc32: crc_hex(&rows_file),
        });
        place.put(&rows_name, rows_file).await?;
        let n_cells: u64 = captured.iter().map(|f| f.values.len() as u64).sum();
        let mut offset = Some(0);
        while let Some(at) = offset.filter(|_| n_cells > 0) {
            let page = page_of(&captured, at, cells::PAGE_BYTES);
            offset = page.next;
            let name = format!("dump-{created_unix_ms}-{:05}.cells", files.len() - 1);
            let (bytes, crc) = place.put_parts(&name, cells::encode(page.fields)?).await?;
            files.push(CheckpointFile {
                name,
                bytes,
                crc32: format!("{crc:08x}"),
            });
        }
        let manifest = DumpManifest {
            format: DUMP_FORMAT,
            tq_version: env!("CARGO_PKG_VERSION").to_string(),
            created_unix_ms,
            partition,
            keys: rows.len() as u64,
            cells: n_cells,
            links: rows.iter().map(|r| r.links.len() as u64).sum(),
            dereferenced_links: options.dereference_links,
            files,
        };
        place
            .put(MANIFEST, seal(&manifest, WHAT)?.into_bytes())
            .await?;
        let ours: BTreeSet<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
        for old in place.files_matching(is_dump_file).await? {
            if !ours.contains(old.as_str()) {
                if let Err(e) = place.remove(&old).await {
                    tracing::warn!(file = %place.describe(&old), error = %e, "could not remove an earlier dump's file");
                }
            }
        }
        tracing::info!(at = %place.describe(MANIFEST), keys = manifest.keys, links = manifest.links, "dump written");
        Ok(manifest)
    }

    /// [`Dumps::kv_load`].
    async fn load(&self, url: &str) -> Result<DumpManifest> {
        let place = Place::parse(url)?;
        let text = place.get(MANIFEST).await?;
        let text = String::from_utf8(text).map_err(|_| {
            Error::corrupted(format!(
                "dump: `{}` is not UTF-8 text",
                place.describe(MANIFEST)
            ))
        })?;
        let manifest: DumpManifest = unseal(&text, &place.describe(MANIFEST), WHAT, DUMP_FORMAT)?;
        let Some((rows_file, cell_files)) = manifest.files.split_first() else {
            return Err(Error::corrupted(format!(
                "dump: `{}` lists no files",
                place.describe(MANIFEST)
            )));
        };
        let rows_bytes = read_checked(&place, rows_file, MANIFEST).await?;
        let rows: Vec<DumpRow> = rows_bytes
            .strip_prefix(ROWS_MAGIC.as_slice())
            .and_then(|b| postcard::from_bytes(b).ok())
            .ok_or_else(|| {
                Error::corrupted(format!(
                    "dump: `{}` is not a rows file this build reads",
                    place.describe(&rows_file.name)
                ))
            })?;
        let mut own: Vec<BTreeMap<FieldName, Value>> = vec![BTreeMap::new(); rows.len()];
        for f in cell_files {
            let bytes = read_checked(&place, f, MANIFEST).await?;
            for fc in cells::decode(Bytes::from(bytes), &place.describe(&f.name))? {
                for (s, v) in fc.samples.iter().zip(fc.values) {
                    let row = own.get_mut(s.index as usize).ok_or_else(|| {
                        Error::corrupted(format!(
                            "dump: `{}` holds a cell of row {}, the rows file has {}",
                            place.describe(&f.name),
                            s.index,
                            rows.len()
                        ))
                    })?;
                    row.insert(fc.field.clone(), v);
                }
            }
        }
        for (row, cells) in rows.iter().zip(&own) {
            let have: Vec<&FieldName> = cells.keys().collect();
            let want: Vec<&FieldName> = row.fields.iter().collect();
            if have != want {
                return Err(Error::corrupted(format!(
                    "dump: key `{}` should hold fields {want:?}, its cells are {have:?}",
                    row.key
                )));
            }
        }
        if rows.len() as u64 != manifest.keys {
            return Err(Error::corrupted(format!(
                "dump: `{}` says {} keys, the rows file has {}",
                place.describe(MANIFEST),
                manifest.keys,
                rows.len()
            )));
        }

        // Preflight against the deployment: the keys are new here, the public cells unchanged.
        let keys: Vec<String> = rows.iter().map(|r| r.key.clone()).collect();
        let existing = self
            .client()
            .control()
            .kv_retrieve_meta(self.name(), &keys, false)
            .await?;
        if !existing.meta.is_empty() {
            let present: Vec<&String> = existing.keys.iter().take(5).collect();
            return Err(Error::conflict(format!(
                "load of dump `{}` into partition `{}`: {} of its keys exist already (e.g. \
                 {present:?}); load into keys that do not exist",
                place.describe(MANIFEST),
                self.name(),
                existing.meta.len()
            )));
        }
        let mut link_groups: BTreeMap<(String, FieldName), Vec<(usize, &DumpLink)>> =
            BTreeMap::new();
        for (r, row) in rows.iter().enumerate() {
            for l in &row.links {
                link_groups
                    .entry((l.public_partition.clone(), l.field.clone()))
                    .or_default()
                    .push((r, l));
            }
        }
        for ((pp, field), users) in &link_groups {
            let pkeys: Vec<&str> = users.iter().map(|(_, l)| l.public_key.as_str()).collect();
            let values = read_field(&self.client().partition(pp), &pkeys, field)
                .await
                .map_err(|e| {
                    e.context(format!(
                        "load of dump `{}`: the public cells its links read",
                        place.describe(MANIFEST)
                    ))
                })?;
            for ((r, l), v) in users.iter().zip(values) {
                let now = Fingerprint::of(&v);
                if now != l.fingerprint {
                    return Err(Error::conflict(format!(
                        "load of dump `{}`: field `{field}` of key `{}` links public key `{}` \
                         of `{pp}`, whose cell changed since the dump ({} bytes, CRC-32 {:08x} \
                         then; {} bytes, CRC-32 {:08x} now); nothing was loaded. Dump again, \
                         or dump with dereferenced links to keep the bytes themselves",
                        place.describe(MANIFEST),
                        rows[*r].key,
                        l.public_key,
                        l.fingerprint.bytes,
                        l.fingerprint.crc32,
                        now.bytes,
                        now.crc32
                    )));
                }
            }
        }

        // Write: links, then own cells and tags; undo on failure.
        let written = self.write_dump(&rows, own, &link_groups).await;
        if let Err(e) = written {
            if let Err(undo) = self.kv_clear(&keys).await {
                tracing::warn!(error = %undo, "could not clear the keys of a failed dump load");
            }
            return Err(e.context(format!(
                "load of dump `{}` into partition `{}` (the keys it created were cleared again)",
                place.describe(MANIFEST),
                self.name()
            )));
        }
        tracing::info!(at = %place.describe(MANIFEST), keys = manifest.keys, "dump loaded");
        Ok(manifest)
    }

    async fn write_dump(
        &self,
        rows: &[DumpRow],
        own: Vec<BTreeMap<FieldName, Value>>,
        link_groups: &BTreeMap<(String, FieldName), Vec<(usize, &DumpLink)>>,
    ) -> Result<()> {
        for ((pp, field), users) in link_groups {
            let keys: Vec<&str> = users.iter().map(|(r, _)| rows[*r].key.as_str()).collect();
            let pkeys: Vec<&str> = users.iter().map(|(_, l)| l.public_key.as_str()).collect();
            let options = LinkOptions {
                public_partition: pp.clone(),
                ..LinkOptions::default()
            };
            self.kv_link(&keys, &pkeys, &[field.as_str()], &options)
                .await?;
        }
        let mut groups: BTreeMap<Vec<FieldName>, Vec<usize>> = BTreeMap::new();
        for (r, row) in rows.iter().enumerate() {
            groups.entry(row.fields.clone()).or_default().push(r);
        }
        let mut own: Vec<Option<BTreeMap<FieldName, Value>>> = own.into_iter().map(Some).collect();
        for (fields, members) in groups {
            let keys: Vec<&str> = members.iter().map(|r| rows[*r].key.as_str()).collect();
            let tags: Vec<Tags> = members.iter().map(|r| rows[*r].tags.clone()).collect();
            if fields.is_empty() {
                self.kv_set_tags(&keys, tags).await?;
                continue;
            }
            let mut columns: BTreeMap<FieldName, Vec<Value>> = BTreeMap::new();
            for r in &members {
                let cells = own[*r].take().unwrap_or_default();
                for (f, v) in cells {
                    columns.entry(f).or_default().push(v);
                }
            }
            let batch = Batch::from_columns(
                columns
                    .into_iter()
                    .map(|(f, values)| Column::from_values(&f, values).map(|c| (f, c)))
                    .collect::<Result<Vec<_>>>()?,
            )?;
            self.kv_batch_put(&keys, &batch, Some(tags)).await?;
        }
        Ok(())
    }

    /// The public partition and key of each of `samples`.
    async fn public_keys_of(
        &self,
        samples: &BTreeSet<SampleId>,
    ) -> Result<HashMap<SampleId, (String, String)>> {
        let control = self.client().control().clone();
        let mut out = HashMap::new();
        for p in self.client().list_partitions().await? {
            if !p.starts_with(tq_controller::PUBLIC_PARTITION) {
                continue;
            }
            let keys: Vec<String> = self
                .client()
                .partition(&p)
                .kv_list()
                .await?
                .entries
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            if keys.is_empty() {
                continue;
            }
            let m = control.kv_retrieve_meta(&p, &keys, false).await?;
            for (id, k) in m.meta.samples().iter().zip(m.keys) {
                if samples.contains(id) {
                    out.insert(*id, (p.clone(), k));
                }
            }
        }
        Ok(out)
    }
}

/// Field `field` of `keys` in `partition`, one value per key (keys may repeat: many keys
/// link one public key).
async fn read_field(partition: &Partition, keys: &[&str], field: &str) -> Result<Vec<Value>> {
    let mut unique: Vec<&str> = keys.to_vec();
    unique.sort_unstable();
    unique.dedup();
    let batch = partition.kv_batch_get(&unique, Some(&[field])).await?;
    let column = batch
        .column(field)
        .ok_or_else(|| Error::internal(format!("the read of `{field}` came back without it")))?;
    let by_key: HashMap<&str, Value> = unique.into_iter().zip(column.values()).collect();
    Ok(keys.iter().map(|k| by_key[k].clone()).collect())
}
