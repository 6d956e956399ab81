//! The key scheme and the cell value format.
//!
//! # Keys
//!
//! ```text
//! cell:       <ns>[/<epoch>]/{<partition>/<index>}/<generation>/<field>[%v<version>]
//! generation: <ns>[/<epoch>]/{<partition>/<index>}/gen
//! ```
//!
//! `<partition>` and `<field>` are escaped (`%` → `%25`, `/` → `%2F`, `{` → `%7B`, `}` → `%7D`),
//! so distinct (partition, index, generation, field) give distinct keys. `%v<version>` (16 hex
//! digits; an escaped field never holds `%v`, and a cell key is never a prefix directory of
//! another, which file-system stores need) is present only on cells written over existing ones: an overwrite writes beside the
//! cells it replaces, never over them (see the manager's `cells` module). Because the generation is
//! part of a cell key, a reused index never reads, overwrites or deletes a newer sample's cells.
//! The braces are a Redis Cluster hash tag: every key of one sample lands in one slot, so a
//! sample's cells go to one node in one command. The generation key records the newest
//! generation written at that index; it lets a stale writer be refused and a stale reader be told
//! so.
//!
//! # Values
//!
//! A cell value is a header followed by the raw payload:
//!
//! ```text
//! magic "TQ" | version u8 = 1 | kind u8 (0 tensor, 1 object) | dtype u8 | ndim u8 | ndim × u64 LE | payload
//! ```
//!
//! Decoding slices the payload out of the value's `Bytes`: no copy.

use bytes::{BufMut, Bytes};
use tq_core::{DType, Error, Result, SampleId, Tensor, Value};

const MAGIC: &[u8; 2] = b"TQ";
const VERSION: u8 = 1;
const KIND_TENSOR: u8 = 0;
const KIND_OBJECT: u8 = 1;
const FIXED_HEADER: usize = 6;

const DTYPES: [DType; 13] = [
    DType::Bool,
    DType::U8,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::F16,
    DType::Bf16,
    DType::F32,
    DType::F64,
];

/// The stored code of `d`: its position in [`DTYPES`]. An exhaustive match, so a new dtype
/// cannot compile without a code (a unit test checks the two agree).
fn dtype_code(d: DType) -> u8 {
    match d {
        DType::Bool => 0,
        DType::U8 => 1,
        DType::I8 => 2,
        DType::I16 => 3,
        DType::I32 => 4,
        DType::I64 => 5,
        DType::U16 => 6,
        DType::U32 => 7,
        DType::U64 => 8,
        DType::F16 => 9,
        DType::Bf16 => 10,
        DType::F32 => 11,
        DType::F64 => 12,
    }
}

/// The header of `value` (the payload is `value.bytes()`).
pub fn encode_header(value: &Value) -> Bytes {
    match value {
        Value::Object(_) => Bytes::from_static(&[b'T', b'Q', VERSION, KIND_OBJECT, 0, 0]),
        Value::Tensor(t) => encode_tensor_header(t.dtype(), t.shape()),
    }
}

/// The header of a tensor cell of `dtype` and `shape`.
pub fn encode_tensor_header(dtype: DType, shape: &[usize]) -> Bytes {
    let mut h = Vec::with_capacity(FIXED_HEADER + 8 * shape.len());
    h.extend_from_slice(MAGIC);
    h.put_u8(VERSION);
    h.put_u8(KIND_TENSOR);
    h.put_u8(dtype_code(dtype));
    h.put_u8(shape.len() as u8);
    for &d in shape {
        h.put_u64_le(d as u64);
    }
    Bytes::from(h)
}

/// Decodes a stored cell; `key` names it in errors. The payload shares `raw`'s buffer.
pub fn decode_value(key: &str, raw: Bytes) -> Result<Value> {
    let bad = |why: &str| Error::corrupted(format!("kv cell `{key}`: {why}"));
    if raw.len() < FIXED_HEADER || &raw[..2] != MAGIC {
        return Err(bad("not a tq cell (bad magic)"));
    }
    if raw[2] != VERSION {
        return Err(bad(&format!("unknown format version {}", raw[2])));
    }
    match raw[3] {
        KIND_OBJECT => Ok(Value::Object(raw.slice(FIXED_HEADER..))),
        KIND_TENSOR => {
            let dtype = *DTYPES
                .get(raw[4] as usize)
                .ok_or_else(|| bad(&format!("unknown dtype code {}", raw[4])))?;
            let ndim = raw[5] as usize;
            let start = FIXED_HEADER + 8 * ndim;
            if raw.len() < start {
                return Err(bad("truncated header"));
            }
            let shape = (0..ndim)
                .map(|i| {
                    let o = FIXED_HEADER + 8 * i;
                    let mut word = [0u8; 8];
                    word.copy_from_slice(&raw[o..o + 8]);
                    u64::from_le_bytes(word) as usize
                })
                .collect();
            Tensor::new(dtype, shape, raw.slice(start..))
                .map(Value::Tensor)
                .map_err(|e| bad(e.message()))
        }
        k => Err(bad(&format!("unknown kind {k}"))),
    }
}

fn escape_into(out: &mut String, s: &str) {
    // Most names need no escape: copy them whole.
    if !s.bytes().any(|b| matches!(b, b'%' | b'/' | b'{' | b'}')) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// Builds keys for one partition under one namespace.
#[derive(Debug, Clone)]
pub struct KeyScheme {
    /// `<ns>/{<escaped partition>/`
    prefix: String,
}

impl KeyScheme {
    pub fn new(namespace: &str, partition: &str) -> Self {
        Self::in_epoch(namespace, 0, partition)
    }

    /// The keys of `partition` in controller epoch `epoch` (0: no epoch component):
    /// `<ns>/<epoch, 16 hex digits>/{<partition>/...`, so a controller restarted without its
    /// state never meets the keys of its earlier life.
    pub fn in_epoch(namespace: &str, epoch: u64, partition: &str) -> Self {
        use std::fmt::Write;
        let mut prefix = String::with_capacity(namespace.len() + partition.len() + 21);
        escape_into(&mut prefix, namespace);
        if epoch != 0 {
            let _ = write!(prefix, "/{epoch:016x}");
        }
        prefix.push_str("/{");
        escape_into(&mut prefix, partition);
        prefix.push('/');
        KeyScheme { prefix }
    }

    /// The key of one cell at write version 0 (a first write).
    pub fn cell(&self, sample: SampleId, field: &str) -> String {
        self.cell_at(sample, field, 0)
    }

    /// The key of one cell at write `version`.
    ///
    /// Built by hand rather than with `format!`: a put, get or clear builds one key per cell,
    /// and the formatting machinery was a third of a Redis clear's client time (perf, 256
    /// samples × 4 fields).
    pub fn cell_at(&self, sample: SampleId, field: &str, version: u64) -> String {
        let mut k = String::with_capacity(self.prefix.len() + field.len() + 41);
        k.push_str(&self.prefix);
        push_decimal(&mut k, sample.index);
        k.push_str("}/");
        push_decimal(&mut k, sample.generation);
        k.push('/');
        escape_into(&mut k, field);
        if version != 0 {
            k.push_str("%v");
            push_hex16(&mut k, version);
        }
        k
    }

    /// The key holding the newest generation written at `index`.
    pub fn generation(&self, index: u32) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 15);
        k.push_str(&self.prefix);
        push_decimal(&mut k, index);
        k.push_str("}/gen");
        k
    }
}

/// Appends `n` in decimal, as `{}` would.
fn push_decimal(out: &mut String, n: u32) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `n` as 16 lower-case hex digits, as `{:016x}` would.
fn push_hex16(out: &mut String, n: u64) {
    for shift in (0..16).rev() {
        let nibble = ((n >> (shift * 4)) & 0xf) as u8;
        out.push(char::from(if nibble < 10 {
            b'0' + nibble
        } else {
            b'a' + nibble - 10
        }));
    }
}

/// The value of a generation key.
pub fn encode_generation(generation: u32) -> Bytes {
    Bytes::copy_from_slice(&generation.to_le_bytes())
}

pub fn decode_generation(key: &str, raw: &[u8]) -> Result<u32> {
    raw.try_into()
        .map(u32::from_le_bytes)
        .map_err(|_| Error::corrupted(format!("kv generation key `{key}` holds {raw:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_built_as_format_would_build_them() {
        let ks = KeyScheme::in_epoch("tq", 0xab, "p/1");
        for (index, generation) in [
            (0u32, 0u32),
            (7, 1),
            (10, 99),
            (u32::MAX, u32::MAX),
            (1_000_000, 42),
        ] {
            let s = SampleId::new(index, generation);
            for (field, escaped) in [("x", "x"), ("a%b/{c}", "a%25b%2F%7Bc%7D"), ("", "")] {
                for version in [0u64, 1, 0xab, u64::MAX, 0x0123_4567_89ab_cdef] {
                    let mut want =
                        format!("tq/00000000000000ab/{{p%2F1/{index}}}/{generation}/{escaped}");
                    if version != 0 {
                        want.push_str(&format!("%v{version:016x}"));
                    }
                    assert_eq!(ks.cell_at(s, field, version), want);
                }
            }
            assert_eq!(
                ks.generation(index),
                format!("tq/00000000000000ab/{{p%2F1/{index}}}/gen")
            );
        }
    }

    #[test]
    fn every_dtype_code_indexes_its_dtype() {
        for d in DTYPES {
            assert_eq!(DTYPES[dtype_code(d) as usize], d);
        }
    }

    #[test]
    fn keys_are_unique_and_escaped() {
        let k = KeyScheme::new("tq", "a/b");
        assert_eq!(k.cell(SampleId::new(3, 2), "x"), "tq/{a%2Fb/3}/2/x");
        assert_eq!(k.generation(3), "tq/{a%2Fb/3}/gen");
        assert_eq!(
            KeyScheme::in_epoch("tq", 0xbeef, "a/b").generation(3),
            "tq/000000000000beef/{a%2Fb/3}/gen"
        );
        assert_eq!(
            k.cell_at(SampleId::new(3, 2), "x", 0xab),
            "tq/{a%2Fb/3}/2/x%v00000000000000ab"
        );
        let other = KeyScheme::new("tq", "a");
        assert_ne!(
            k.cell(SampleId::new(3, 2), "x"),
            other.cell(SampleId::new(3, 2), "b/3}/2/x")
        );
        assert_ne!(
            k.cell(SampleId::new(3, 2), "x"),
            k.cell(SampleId::new(3, 3), "x")
        );
        assert_eq!(
            KeyScheme::new("tq", "p").cell(SampleId::new(1, 0), "%/{}"),
            "tq/{p/1}/0/%25%2F%7B%7D"
        );
    }

    #[test]
    fn values_round_trip_without_copy() {
        let t = Tensor::from_slice(vec![2, 3], &[1i32, 2, 3, 4, 5, 6]).unwrap();
        let v = Value::Tensor(t);
        let mut raw = encode_header(&v).to_vec();
        raw.extend_from_slice(v.bytes());
        let raw = Bytes::from(raw);
        let back = decode_value("k", raw.clone()).unwrap();
        assert_eq!(back, v);
        assert_eq!(
            back.bytes().as_ptr(),
            raw[raw.len() - 24..].as_ptr(),
            "payload shares the buffer"
        );
        let o = Value::Object(Bytes::from_static(b"hello"));
        let mut raw = encode_header(&o).to_vec();
        raw.extend_from_slice(b"hello");
        assert_eq!(decode_value("k", Bytes::from(raw)).unwrap(), o);
        let e = decode_value("k9", Bytes::from_static(b"xx")).unwrap_err();
        assert!(e.message().contains("k9"));
        assert!(decode_value("k", Bytes::from_static(b"TQ\x01\x00\x05\x01\x01")).is_err());
    }
}
