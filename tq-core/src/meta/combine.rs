//! Batch operations that build a new [`BatchMeta`] out of others: field and sample
//! selection, chunks, concatenation and union (what `BatchMeta`'s Python methods call).

use super::BatchMeta;
use crate::{Error, FieldMeta, Result};
use std::collections::BTreeMap;

impl BatchMeta {
    /// Keeps only the named fields (and their backend meta). Unknown names are `Invalid`.
    pub fn select_fields<S: AsRef<str>>(&self, names: &[S]) -> Result<BatchMeta> {
        let mut fields = BTreeMap::new();
        for n in names {
            let n = n.as_ref();
            let s = self.fields.get(n).ok_or_else(|| {
                Error::invalid(format!(
                    "partition `{}`: field `{n}` is not in this batch (fields: {:?})",
                    self.partition,
                    self.fields.keys().collect::<Vec<_>>()
                ))
            })?;
            fields.insert(n.to_string(), s.clone());
        }
        let backend_meta = self
            .backend_meta
            .iter()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| fields.contains_key(k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .collect();
        let links = self
            .links
            .iter()
            .map(|l| {
                l.iter()
                    .filter(|(k, _)| fields.contains_key(k.as_str()))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect()
            })
            .collect();
        Ok(BatchMeta {
            partition: self.partition.clone(),
            samples: self.samples.clone(),
            fields,
            production: self.production.clone(),
            tags: self.tags.clone(),
            backend_meta,
            lease: self.lease,
            links,
        })
    }

    /// The samples at `positions`, in that order (duplicates allowed). Out of range is `Invalid`.
    pub fn select_samples(&self, positions: &[usize]) -> Result<BatchMeta> {
        if let Some(&bad) = positions.iter().find(|&&p| p >= self.len()) {
            return Err(Error::invalid(format!(
                "position {bad} out of range for a batch of {} samples",
                self.len()
            )));
        }
        Ok(BatchMeta {
            partition: self.partition.clone(),
            samples: positions.iter().map(|&p| self.samples[p]).collect(),
            fields: self
                .fields
                .iter()
                .map(|(k, s)| Ok((k.clone(), s.select_rows(k, positions)?)))
                .collect::<Result<_>>()?,
            production: positions.iter().map(|&p| self.production[p]).collect(),
            tags: positions.iter().map(|&p| self.tags[p].clone()).collect(),
            backend_meta: positions
                .iter()
                .map(|&p| self.backend_meta[p].clone())
                .collect(),
            lease: self.lease,
            links: positions.iter().map(|&p| self.links[p].clone()).collect(),
        })
    }

    /// Splits into `n` consecutive pieces; the first `len % n` pieces get one extra sample.
    /// More pieces than samples yields empty pieces; `n == 0` is `Invalid`.
    pub fn chunk(&self, n: usize) -> Result<Vec<BatchMeta>> {
        if n == 0 {
            return Err(Error::invalid("chunk count must be at least 1"));
        }
        let (base, extra) = (self.len() / n, self.len() % n);
        let mut out = Vec::with_capacity(n);
        let mut start = 0;
        for i in 0..n {
            let size = base + usize::from(i < extra);
            let positions: Vec<usize> = (start..start + size).collect();
            out.push(self.select_samples(&positions)?);
            start += size;
        }
        Ok(out)
    }

    /// Appends batches row-wise. All must be of the same partition with the same field names and
    /// compatible dtypes; differing shapes promote fields to ragged. Empty pieces are skipped.
    pub fn concat(parts: &[BatchMeta]) -> Result<BatchMeta> {
        let parts: Vec<&BatchMeta> = parts.iter().filter(|p| !p.is_empty()).collect();
        let Some(first) = parts.first() else {
            return Ok(BatchMeta::default());
        };
        for p in &parts[1..] {
            if p.partition != first.partition {
                return Err(Error::invalid(format!(
                    "cannot concat batches of partitions `{}` and `{}`",
                    first.partition, p.partition
                )));
            }
            if !p.fields.keys().eq(first.fields.keys()) {
                return Err(Error::invalid(format!(
                    "cannot concat batches with different fields: {:?} vs {:?}",
                    first.fields.keys().collect::<Vec<_>>(),
                    p.fields.keys().collect::<Vec<_>>()
                )));
            }
        }
        let mut fields = BTreeMap::new();
        for name in first.fields.keys() {
            let pieces: Vec<(&FieldMeta, usize)> =
                parts.iter().map(|p| (&p.fields[name], p.len())).collect();
            fields.insert(name.clone(), FieldMeta::concat(name, &pieces)?);
        }
        Ok(BatchMeta {
            partition: first.partition.clone(),
            samples: parts
                .iter()
                .flat_map(|p| p.samples.iter().copied())
                .collect(),
            fields,
            production: parts
                .iter()
                .flat_map(|p| p.production.iter().copied())
                .collect(),
            tags: parts.iter().flat_map(|p| p.tags.iter().cloned()).collect(),
            backend_meta: parts
                .iter()
                .flat_map(|p| p.backend_meta.iter().cloned())
                .collect(),
            links: parts.iter().flat_map(|p| p.links.iter().cloned()).collect(),
            // Pieces of one hand-out keep its lease; mixed hand-outs have none in common.
            lease: first
                .lease
                .filter(|l| parts.iter().all(|p| p.lease == Some(*l))),
        })
    }

    /// Merges the fields of `other`, which must describe the same samples in the same order.
    /// `other` wins on field clashes; production is AND-ed; tags and backend meta merge per row.
    pub fn union(&self, other: &BatchMeta) -> Result<BatchMeta> {
        if other.is_empty() {
            return Ok(self.clone());
        }
        if self.is_empty() {
            return Ok(other.clone());
        }
        if self.partition != other.partition {
            return Err(Error::invalid(format!(
                "cannot union batches of partitions `{}` and `{}`",
                self.partition, other.partition
            )));
        }
        if self.samples != other.samples {
            return Err(Error::invalid(
                "cannot union batches whose samples do not match",
            ));
        }
        let mut out = self.clone();
        out.fields
            .extend(other.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
        for (p, q) in out.production.iter_mut().zip(&other.production) {
            *p &= *q;
        }
        for (t, u) in out.tags.iter_mut().zip(&other.tags) {
            t.extend(u.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        for (m, n) in out.backend_meta.iter_mut().zip(&other.backend_meta) {
            m.extend(n.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        for (m, n) in out.links.iter_mut().zip(&other.links) {
            // A field `other` describes is described by `other` alone, links included.
            m.retain(|f, _| !other.fields.contains_key(f));
            m.extend(n.iter().map(|(k, v)| (k.clone(), *v)));
        }
        Ok(out)
    }
}
