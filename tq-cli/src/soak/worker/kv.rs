//! The KV role: rounds of puts, updates, links, field clears, reads checked against what was
//! written, and clears checked to read `NotFound`, over keys of the worker's own.

use super::{Ctx, KV_PARTITION, PUBLIC_PARTITION};
use crate::soak::content::{self, FIELDS};
use crate::soak::ledger::sample_id;
use tq_client::LinkOptions;
use tq_core::{Batch, Column, ErrorKind, MergeOp, Result, Tensor};

/// Keys per KV worker, in three groups of what is done to them each round.
const KV_KEYS: usize = 16;
const UPDATED: std::ops::Range<usize> = 0..8;
const LINKED: std::ops::Range<usize> = 8..12;
const FIELD_CLEARED: std::ops::Range<usize> = 12..16;
const PUBLIC_KEYS: usize = 4;

/// What a key must read as.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    /// Cleared (or never written): reads are `NotFound`.
    Absent,
    /// Written at `ver`; `n` is one of `n` (several after an update whose outcome is unknown;
    /// none after its field clear); `p` is linked when `linked`.
    Written { ver: i64, n: Vec<i64>, linked: bool },
    /// A write failed half-way: nothing is checked until the next clear.
    Unknown,
}

struct Keys {
    names: Vec<String>,
    ids: Vec<i64>,
    expect: Vec<Expect>,
    public: Vec<String>,
    /// False once the backend answered `kv_link` with `Unsupported` (KV storage resolves no
    /// links): the linked group is then written and read like the others, without `p`.
    linking: bool,
    /// Whether any link was made (the public rows are swept at the end only then: a public
    /// row never linked is not swept, by design).
    linked_once: bool,
}

impl Keys {
    fn of(worker: u64) -> Keys {
        Keys {
            names: (0..KV_KEYS).map(|k| format!("w{worker}-k{k}")).collect(),
            ids: (0..KV_KEYS).map(|k| sample_id(worker, k as u64)).collect(),
            expect: vec![Expect::Absent; KV_KEYS],
            public: (0..PUBLIC_KEYS)
                .map(|k| format!("w{worker}-pub{k}"))
                .collect(),
            linking: true,
            linked_once: false,
        }
    }

    fn public_id(&self, key: usize) -> i64 {
        -1 - (key % PUBLIC_KEYS) as i64
    }
}

fn public_row(id: i64, width: usize) -> Result<Batch> {
    let p: Vec<i64> = content::payload(id, 0, width).collect();
    Batch::from_columns([("p", Column::Dense(Tensor::from_slice(vec![1, width], &p)?))])
}

pub(super) async fn kv_rounds(ctx: &Ctx) {
    let partition = ctx.tq.partition(KV_PARTITION);
    let public = ctx.tq.partition(PUBLIC_PARTITION);
    let mut keys = Keys::of(ctx.args.worker);
    if let Err(e) = write_public_rows(ctx, &keys).await {
        return ctx.log.line(&format!("V {e}"));
    }
    let mut round = 0i64;
    while !ctx.stopped() {
        round += 1;
        kv_round(ctx, &partition, &mut keys, round).await;
        ctx.log.line("R");
    }
    // Leave nothing behind: the keys, then the public rows no key links to any more.
    if let Err(e) = ctx
        .retrying("clear", true, || partition.kv_clear(&keys.names))
        .await
    {
        ctx.error("final clear", &e);
    }
    if !keys.linked_once {
        // Never linked: not the sweep's to remove.
        if let Err(e) = ctx
            .retrying("public clear", true, || public.kv_clear(&keys.public))
            .await
        {
            ctx.error("public clear", &e);
        }
        return;
    }
    let prefix = format!("w{}-pub", ctx.args.worker);
    match ctx
        .retrying("public sweep", true, || {
            public.kv_clear_unlinked_public(&prefix)
        })
        .await
    {
        Ok(swept) if swept.len() != PUBLIC_KEYS => ctx.log.line(&format!(
            "V the sweep of unlinked public rows removed {swept:?}, not the {PUBLIC_KEYS} rows"
        )),
        Ok(_) => {}
        Err(e) => ctx.error("public sweep", &e),
    }
}

/// Writes the public rows the linked keys point at (again, after a fault destroyed them).
async fn write_public_rows(ctx: &Ctx, keys: &Keys) -> Result<()> {
    let public = ctx.tq.partition(PUBLIC_PARTITION);
    for (k, name) in keys.public.iter().enumerate() {
        let row = public_row(keys.public_id(k), ctx.args.width)?;
        ctx.retrying("public put", true, || public.kv_put(name, &row, None))
            .await
            .map_err(|e| e.context(format!("cannot write public row {name}")))?;
    }
    Ok(())
}

async fn kv_round(ctx: &Ctx, partition: &tq_client::Partition, keys: &mut Keys, round: i64) {
    let width = ctx.args.width;
    // 1. Put every key at version `round`, with `n` = 0.
    let samples: Vec<(i64, i64)> = keys.ids.iter().map(|&id| (id, round)).collect();
    let batch = content::rows(&samples, width).and_then(|mut b| {
        b.insert(
            "n",
            Column::Dense(Tensor::from_slice(vec![KV_KEYS], &[0i64; KV_KEYS])?),
        )?;
        Ok(b)
    });
    let batch = match batch {
        Ok(b) => b,
        Err(e) => return ctx.log.line(&format!("V building a KV batch: {e}")),
    };
    let put = ctx
        .retrying("kv put", true, || {
            partition.kv_batch_put(&keys.names, &batch, None)
        })
        .await;
    match put {
        Ok(_) => {
            for e in keys.expect.iter_mut() {
                let linked = matches!(e, Expect::Written { linked: true, .. });
                *e = Expect::Written {
                    ver: round,
                    n: vec![0],
                    linked,
                };
            }
        }
        Err(e) => {
            ctx.error("kv put", &e);
            return reset(ctx, partition, keys).await;
        }
    }
    // 2. Add 1 to `n` of the first group (not idempotent: repeated only when nothing happened).
    let names = &keys.names[UPDATED];
    let ones = Batch::from_columns([(
        "n",
        Column::Dense(Tensor::from_vec(vec![1i64; UPDATED.len()])),
    )]);
    let updated = match ones {
        Ok(ones) => {
            ctx.retrying("kv update", false, || {
                partition.kv_batch_update(names, &ones, &MergeOp::Add)
            })
            .await
        }
        Err(e) => Err(e),
    };
    for k in UPDATED {
        if let Expect::Written { n, .. } = &mut keys.expect[k] {
            let before = n.clone();
            *n = match &updated {
                Ok(_) => before.iter().map(|v| v + 1).collect(),
                // Either outcome may have happened.
                Err(_) => before.iter().flat_map(|&v| [v, v + 1]).collect(),
            };
        }
    }
    if let Err(e) = &updated {
        ctx.error("kv update", e);
    }
    // 3. Link `p` of the second group to the public rows, where not linked yet.
    let unlinked: Vec<usize> = LINKED
        .filter(|&k| {
            keys.linking && matches!(keys.expect[k], Expect::Written { linked: false, .. })
        })
        .collect();
    if !unlinked.is_empty() {
        let names: Vec<&str> = unlinked.iter().map(|&k| keys.names[k].as_str()).collect();
        let targets: Vec<&str> = unlinked
            .iter()
            .map(|&k| keys.public[k % PUBLIC_KEYS].as_str())
            .collect();
        let options = LinkOptions {
            public_partition: PUBLIC_PARTITION.to_string(),
            ..LinkOptions::default()
        };
        match ctx
            .retrying("kv link", true, || {
                partition.kv_link(&names, &targets, &["p"], &options)
            })
            .await
        {
            Ok(_) => {
                keys.linked_once = true;
                for &k in &unlinked {
                    if let Expect::Written { linked, .. } = &mut keys.expect[k] {
                        *linked = true;
                    }
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::Unsupported { .. }) => {
                ctx.say_first("kv link", &e);
                keys.linking = false;
            }
            Err(e) => {
                ctx.error("kv link", &e);
                return reset(ctx, partition, keys).await;
            }
        }
    }
    // 4. Clear `n` of the third group.
    let names = &keys.names[FIELD_CLEARED];
    match ctx
        .retrying("kv clear fields", true, || {
            partition.kv_clear_fields(names, &["n"])
        })
        .await
    {
        Ok(()) => {
            for k in FIELD_CLEARED {
                if let Expect::Written { n, .. } = &mut keys.expect[k] {
                    n.clear();
                }
            }
        }
        Err(e) => {
            ctx.error("kv clear fields", &e);
            return reset(ctx, partition, keys).await;
        }
    }
    // 5. Read everything back; after a loss, write the keys (and the public rows, which may
    //    have been lost too) again from scratch.
    if !verify(ctx, partition, keys).await {
        reset(ctx, partition, keys).await;
        if let Err(e) = write_public_rows(ctx, keys).await {
            ctx.error("public put", &e);
        }
        return;
    }
    // 6. Every third round: clear, and check the keys read as gone.
    if round % 3 == 0 {
        reset(ctx, partition, keys).await;
        if keys.expect.iter().all(|e| *e == Expect::Absent) {
            match partition.kv_batch_get(&keys.names[..2], None).await {
                Ok(_) => ctx.log.line(&format!(
                    "V keys {:?} read as data after their clear",
                    &keys.names[..2]
                )),
                Err(e) if e.kind() == &ErrorKind::NotFound => {}
                Err(e) => ctx.error("read after clear", &e),
            }
        }
    }
}

/// Clears every key; they are then `Absent`, or `Unknown` when the clear failed.
async fn reset(ctx: &Ctx, partition: &tq_client::Partition, keys: &mut Keys) {
    let cleared = ctx
        .retrying("kv clear", true, || partition.kv_clear(&keys.names))
        .await;
    let after = match cleared {
        Ok(()) => Expect::Absent,
        Err(e) => {
            ctx.error("kv clear", &e);
            Expect::Unknown
        }
    };
    keys.expect.iter_mut().for_each(|e| *e = after.clone());
}

/// Reads every key and checks it against `keys.expect`; false when data was reported lost
/// (the keys are then cleared and written again).
async fn verify(ctx: &Ctx, partition: &tq_client::Partition, keys: &Keys) -> bool {
    let mut with_n: Vec<&str> = FIELDS.to_vec();
    with_n.push("n");
    let groups: [(std::ops::Range<usize>, Vec<&str>); 4] = [
        (UPDATED, with_n.clone()),
        (LINKED, with_n),
        (if keys.linking { LINKED } else { 0..0 }, vec!["p"]),
        (FIELD_CLEARED, FIELDS.to_vec()),
    ];
    let mut verified = 0usize;
    for (range, fields) in groups {
        if range.is_empty()
            || keys.expect[range.clone()]
                .iter()
                .any(|e| !matches!(e, Expect::Written { .. }))
        {
            continue;
        }
        let names = &keys.names[range.clone()];
        let read = ctx
            .retrying("kv read", true, || {
                partition.kv_batch_get(names, Some(&fields))
            })
            .await;
        let batch = match read {
            Ok(b) => b,
            Err(e) if matches!(e.kind(), ErrorKind::DataLost | ErrorKind::NotFound) => {
                ctx.log.line(&format!("KL {} {:?}", names.len(), e.kind()));
                return false;
            }
            Err(e) => {
                ctx.error("kv read", &e);
                return false;
            }
        };
        if fields == ["p"] {
            verified += check_public(ctx, keys, range, &batch);
        } else {
            verified += check_rows(ctx, keys, range, &batch);
        }
    }
    // The field-cleared group must not read `n` as data.
    if let Expect::Written { n, .. } = &keys.expect[FIELD_CLEARED.start] {
        if n.is_empty() {
            match partition
                .kv_batch_get(&keys.names[FIELD_CLEARED], Some(&["n"]))
                .await
            {
                Ok(_) => ctx.log.line(&format!(
                    "V field `n` of {:?} read as data after its field clear",
                    &keys.names[FIELD_CLEARED]
                )),
                Err(e) if e.kind() == &ErrorKind::NotFound => {}
                Err(e) => ctx.error("read of a cleared field", &e),
            }
        }
    }
    ctx.log.line(&format!("G {verified}"));
    true
}

fn check_rows(ctx: &Ctx, keys: &Keys, range: std::ops::Range<usize>, batch: &Batch) -> usize {
    let rows = match content::check(batch) {
        Ok(rows) if rows.len() == range.len() => rows,
        Ok(rows) => {
            ctx.log.line(&format!(
                "M {} keys read as {} rows",
                range.len(),
                rows.len()
            ));
            return 0;
        }
        Err(what) => {
            ctx.log
                .line(&format!("M keys {:?}: {what}", &keys.names[range]));
            return 0;
        }
    };
    let ns: Option<Vec<i64>> = match batch.column("n") {
        Some(Column::Dense(t)) => t.to_vec::<i64>().ok(),
        _ => None,
    };
    let mut ok = 0;
    for (r, k) in range.enumerate() {
        let Expect::Written { ver, n, .. } = &keys.expect[k] else {
            continue;
        };
        let row = rows[r];
        let n_read = ns.as_ref().and_then(|v| v.get(r).copied());
        let n_ok = n.is_empty() || n_read.is_some_and(|v| n.contains(&v));
        if row.intact && row.id == keys.ids[k] && row.ver == *ver && n_ok {
            ok += 1;
        } else {
            ctx.log.line(&format!(
                "M key {}: expected version {ver} n in {n:?}, read sample {} version {} n {n_read:?} (checksum {})",
                keys.names[k],
                row.id,
                row.ver,
                if row.intact { "holds" } else { "fails" }
            ));
        }
    }
    ok
}

fn check_public(ctx: &Ctx, keys: &Keys, range: std::ops::Range<usize>, batch: &Batch) -> usize {
    let Some(Column::Dense(p)) = batch.column("p") else {
        ctx.log.line("M a read of linked field `p` without it");
        return 0;
    };
    let Ok(values) = p.to_vec::<i64>() else {
        ctx.log.line("M linked field `p` of another dtype");
        return 0;
    };
    let width = ctx.args.width;
    let mut ok = 0;
    for (r, k) in range.enumerate() {
        let expected: Vec<i64> = content::payload(keys.public_id(k), 0, width).collect();
        if values.get(r * width..(r + 1) * width) == Some(expected.as_slice()) {
            ok += 1;
        } else {
            ctx.log.line(&format!(
                "M key {}: linked field `p` does not hold public row {}",
                keys.names[k],
                keys.public[k % PUBLIC_KEYS]
            ));
        }
    }
    ok
}
