//! Behaviour of the hybrid memory/SSD unit, with real files in temporary directories, through
//! both I/O engines.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use async_trait::async_trait;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tq_backend_simple::{SimpleStorage, StorageUnit, UnitConfig, UnitPut, UnitRows, UnitUpdate};
use tq_backend_ssd::FALLBACK_VALUES_TOTAL;
use tq_backend_ssd::{
    build_engine, uring_available, EngineKind, IoEngine, ReadOp, SsdConfig, SsdUnit, WriteOp,
    ROOT_DIR,
};
use tq_core::{ErrorKind, FieldFilter, MergeOp, SampleId, StorageManager, Tensor, Value};

/// The engines every test runs with. io_uring is expected on Linux; where the kernel refuses it
/// the test says so and runs psync only — or fails, with `TQ_REQUIRE_URING=1` (CI), so that
/// the io_uring engine is never skipped silently there.
fn engines() -> Vec<EngineKind> {
    let mut v = vec![EngineKind::Psync];
    if uring_available() {
        v.push(EngineKind::Uring);
    } else if std::env::var("TQ_REQUIRE_URING").is_ok_and(|v| v == "1") {
        panic!("io_uring is not available here but TQ_REQUIRE_URING=1");
    } else {
        eprintln!("io_uring not available here: testing the psync engine only");
    }
    v
}

const THRESHOLD: usize = 1024;

fn config(path: &Path, engine: EngineKind) -> SsdConfig {
    SsdConfig::enabled_at(path)
        .with_threshold(THRESHOLD)
        .with_engine(engine)
}

fn unit(path: &Path, engine: EngineKind, id: &str) -> SsdUnit {
    SsdUnit::new(id, UnitConfig::default(), config(path, engine)).expect("unit starts")
}

fn big(seed: u8, len: usize) -> Value {
    Value::Object(Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect::<Vec<u8>>(),
    ))
}

fn big_tensor(seed: f32, n: usize) -> Value {
    let v: Vec<f32> = (0..n).map(|i| i as f32 + seed).collect();
    Value::Tensor(Tensor::from_slice(vec![n / 4, 4], &v).unwrap())
}

fn small(seed: i64) -> Value {
    Value::Tensor(Tensor::from_slice(vec![2], &[seed, seed + 1]).unwrap())
}

fn ids(indexes: &[u32], generation: u32) -> Vec<SampleId> {
    indexes
        .iter()
        .map(|&i| SampleId::new(i, generation))
        .collect()
}

fn put(samples: Vec<SampleId>, fields: Vec<(&str, Vec<Value>)>) -> UnitPut {
    UnitPut {
        samples,
        fields: fields
            .into_iter()
            .map(|(f, v)| (f.to_string(), UnitRows::separate(v)))
            .collect(),
    }
}

/// The cell files in the unit's directory, sorted.
fn files(u: &SsdUnit) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(u.dir().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn names(fields: &[&str]) -> Vec<String> {
    fields.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn round_trip_of_mixed_small_and_large_cells() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let u = unit(dir.path(), engine, "u0");
        assert_eq!(
            u.engine_name(),
            Some(match engine {
                EngineKind::Uring => "uring",
                _ => "psync",
            })
        );
        let s = ids(&[0, 2, 5, 9], 1);
        let large: Vec<Value> = (0..4).map(|i| big(i as u8, 5000 + i * 100)).collect();
        let tensors: Vec<Value> = (0..4).map(|i| big_tensor(i as f32, 1024)).collect();
        let smalls: Vec<Value> = (0..4).map(small).collect();
        // A field mixing a small and large rows.
        let mixed = vec![
            small(7),
            big(9, THRESHOLD),
            small(8),
            big(10, 3 * THRESHOLD),
        ];
        u.put(put(
            s.clone(),
            vec![
                ("large", large.clone()),
                ("tensor", tensors.clone()),
                ("small", smalls.clone()),
                ("mixed", mixed.clone()),
            ],
        ))
        .await
        .unwrap();
        let st = u.stats().await.unwrap();
        assert_eq!(
            (st.rows, st.cells, st.offloaded_cells),
            (4, 16, 10),
            "{engine:?}"
        );
        assert_eq!(files(&u).len(), 10);
        let got = u
            .get(&names(&["mixed", "large", "small", "tensor"]), &s)
            .await
            .unwrap();
        assert_eq!(
            got,
            vec![mixed, large.clone(), smalls, tensors],
            "{engine:?}"
        );
        // Duplicated samples in one read.
        let dup = vec![s[1], s[1], s[0]];
        let got = u.get(&names(&["large"]), &dup).await.unwrap();
        assert_eq!(
            got[0],
            vec![large[1].clone(), large[1].clone(), large[0].clone()]
        );
    }
}

#[tokio::test]
async fn dense_columns_come_back_dense_through_simple_storage() {
    use tq_core::{Batch, BatchMeta, Column};
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let units: Vec<Arc<dyn StorageUnit>> = (0..2)
            .map(|i| Arc::new(unit(dir.path(), engine, &format!("d{i}"))) as Arc<dyn StorageUnit>)
            .collect();
        let storage = SimpleStorage::new(units).unwrap();
        let n = 6;
        let data: Vec<f32> = (0..n * 512).map(|i| i as f32).collect();
        let batch = Batch::from_columns([(
            "x",
            Column::Dense(Tensor::from_slice(vec![n, 512], &data).unwrap()),
        )])
        .unwrap();
        let meta = BatchMeta::new("p", ids(&[0, 1, 2, 3, 4, 5], 0))
            .with_fields(batch.schemas())
            .unwrap();
        storage.put(&meta, &batch).await.unwrap();
        let got = storage.get(&meta).await.unwrap();
        assert!(matches!(got.column("x"), Some(Column::Dense(_))));
        assert_eq!(got.column("x"), batch.column("x"), "{engine:?}");
        let stats = storage.stats().await.unwrap();
        assert_eq!(stats.iter().map(|s| s.offloaded_cells).sum::<usize>(), n);
    }
}

#[tokio::test]
async fn conformance_with_most_cells_on_disk() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let n = Arc::new(AtomicUsize::new(0));
        tq_core::testkit::run_all(|| {
            let path = path.clone();
            let n = n.clone();
            async move {
                let k = n.fetch_add(1, Ordering::Relaxed);
                let units: Vec<Arc<dyn StorageUnit>> = (0..3)
                    .map(|i| {
                        let cfg = SsdConfig::enabled_at(&path)
                            .with_threshold(8)
                            .with_engine(engine);
                        Arc::new(
                            SsdUnit::new(format!("c{k}-{i}"), UnitConfig::default(), cfg).unwrap(),
                        ) as Arc<dyn StorageUnit>
                    })
                    .collect();
                Arc::new(SimpleStorage::new(units).unwrap()) as Arc<dyn StorageManager>
            }
        })
        .await;
    }
}

/// An engine that fails chosen writes after creating (and half-writing) their files, like a
/// disk that fills up mid-request.
#[derive(Debug)]
struct Faulty {
    inner: Arc<dyn IoEngine>,
    fail_last: AtomicBool,
    fail_all: AtomicBool,
}

impl Faulty {
    fn new(kind: EngineKind) -> Arc<Faulty> {
        Arc::new(Faulty {
            inner: build_engine(kind).unwrap(),
            fail_last: AtomicBool::new(false),
            fail_all: AtomicBool::new(false),
        })
    }
}

#[async_trait]
impl IoEngine for Faulty {
    fn name(&self) -> &'static str {
        "faulty"
    }

    async fn write_files(&self, mut ops: Vec<WriteOp>) -> Vec<io::Result<()>> {
        let n = ops.len();
        let failing: Vec<bool> = (0..n)
            .map(|i| {
                self.fail_all.load(Ordering::Relaxed)
                    || (self.fail_last.load(Ordering::Relaxed) && i + 1 == n)
            })
            .collect();
        for (op, f) in ops.iter_mut().zip(&failing) {
            if *f {
                op.data = op.data.slice(..op.data.len() / 2);
            }
        }
        let results = self.inner.write_files(ops).await;
        results
            .into_iter()
            .zip(failing)
            .map(|(r, f)| {
                if f {
                    Err(io::Error::from_raw_os_error(libc::ENOSPC))
                } else {
                    r
                }
            })
            .collect()
    }

    async fn read_files(&self, ops: Vec<ReadOp>) -> Vec<io::Result<Bytes>> {
        self.inner.read_files(ops).await
    }
}

#[tokio::test]
async fn a_failed_write_on_the_last_file_changes_nothing() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = Faulty::new(engine);
        let u = SsdUnit::with_engine(
            "u-fail",
            UnitConfig::default(),
            config(dir.path(), engine),
            faulty.clone(),
        )
        .unwrap();
        let s = ids(&[1, 3, 4], 2);
        let old_a: Vec<Value> = (0..3).map(|i| big(i, 2000)).collect();
        let old_b: Vec<Value> = (0..3).map(small).collect();
        u.put(put(
            s.clone(),
            vec![("a", old_a.clone()), ("b", old_b.clone())],
        ))
        .await
        .unwrap();
        let before = files(&u);
        assert_eq!(before.len(), 3);

        faulty.fail_last.store(true, Ordering::Relaxed);
        let new_a: Vec<Value> = (0..3).map(|i| big(i + 50, 3000)).collect();
        let new_c: Vec<Value> = (0..3).map(|i| big(i + 90, 1500)).collect();
        let err = u
            .put(put(
                s.clone(),
                vec![
                    ("a", new_a),
                    ("b", (10..13).map(small).collect()),
                    ("c", new_c),
                ],
            ))
            .await
            .unwrap_err();
        assert_eq!(*err.kind(), ErrorKind::CapacityExceeded, "{err}");
        let msg = err.to_string();
        assert!(msg.contains("storage unit `u-fail`"), "{msg}");
        assert!(
            msg.contains(&u.dir().unwrap().display().to_string()),
            "{msg}"
        );
        assert!(msg.contains("field `c`"), "{msg}");
        // Old values intact, only this request's files gone.
        assert_eq!(files(&u), before, "{engine:?}");
        let got = u.get(&names(&["a", "b"]), &s).await.unwrap();
        assert_eq!(got, vec![old_a, old_b]);
        let e = u.get(&names(&["c"]), &s).await.unwrap_err();
        assert_eq!(*e.kind(), ErrorKind::NotFound);
        let st = u.stats().await.unwrap();
        assert_eq!(
            (
                st.cells,
                st.offloaded_cells,
                st.counters[FALLBACK_VALUES_TOTAL]
            ),
            (6, 3, 0)
        );
    }
}

#[tokio::test]
async fn memory_fallback_keeps_values_and_counts_them() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = Faulty::new(engine);
        faulty.fail_all.store(true, Ordering::Relaxed);
        let mut cfg = config(dir.path(), engine);
        cfg.memory_fallback = true;
        let u = SsdUnit::with_engine("u-fb", UnitConfig::default(), cfg, faulty.clone()).unwrap();
        let s = ids(&[0, 1], 0);
        let a: Vec<Value> = (0..2).map(|i| big(i, 4096)).collect();
        u.put(put(s.clone(), vec![("a", a.clone())])).await.unwrap();
        assert!(files(&u).is_empty(), "failed files removed");
        let st = u.stats().await.unwrap();
        assert_eq!(
            (st.offloaded_cells, st.counters[FALLBACK_VALUES_TOTAL]),
            (0, 2)
        );
        assert_eq!(u.get(&names(&["a"]), &s).await.unwrap(), vec![a]);
        // The counter is monotonic: clearing does not lower it.
        u.clear(&s, &FieldFilter::All).await.unwrap();
        assert_eq!(u.stats().await.unwrap().counters[FALLBACK_VALUES_TOTAL], 2);
    }
}

#[tokio::test]
async fn clear_removes_exactly_the_files_of_the_cleared_cells() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let u = unit(dir.path(), engine, "u-clear");
        let s = ids(&[0, 1, 2, 3], 4);
        u.put(put(
            s.clone(),
            vec![
                ("a", (0..4).map(|i| big(i, 2048)).collect()),
                ("b", (0..4).map(|i| big(i + 4, 2048)).collect()),
                ("m", (0..4).map(small).collect()),
            ],
        ))
        .await
        .unwrap();
        assert_eq!(files(&u).len(), 8);
        // Whole sample 0, field `a` of sample 1, and a stale clear of sample 2 (older gen).
        u.clear(&[s[0]], &FieldFilter::All).await.unwrap();
        u.clear(&[s[1]], &FieldFilter::Only(names(&["a"])))
            .await
            .unwrap();
        u.clear(&[SampleId::new(2, 3)], &FieldFilter::All)
            .await
            .unwrap();
        let left = files(&u);
        let per_index = |i: u32| {
            left.iter()
                .filter(|f| f.starts_with(&format!("{i}-g4-")))
                .count()
        };
        assert_eq!(
            (per_index(0), per_index(1), per_index(2), per_index(3)),
            (0, 1, 2, 2),
            "{left:?}"
        );
        let st = u.stats().await.unwrap();
        assert_eq!((st.rows, st.cells, st.offloaded_cells), (3, 8, 5));
        assert_eq!(st.offloaded_bytes, 5 * 2048);
        // What is left still reads back; what was cleared is NotFound.
        u.get(&names(&["b", "m"]), &s[1..]).await.unwrap();
        let e = u.get(&names(&["a"]), &[s[1]]).await.unwrap_err();
        assert_eq!(*e.kind(), ErrorKind::NotFound);
        // Clearing everything leaves an empty directory.
        u.clear(&s, &FieldFilter::All).await.unwrap();
        assert!(files(&u).is_empty());
        assert_eq!(u.stats().await.unwrap().cells, 0);
    }
}

#[tokio::test]
async fn generation_rules_hold_for_disk_cells() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let u = unit(dir.path(), engine, "u-gen");
        let g1 = ids(&[7], 1);
        u.put(put(
            g1.clone(),
            vec![("a", vec![big(1, 2000)]), ("b", vec![big(2, 2000)])],
        ))
        .await
        .unwrap();
        // Same generation, one field rewritten: its old file goes, the other stays.
        u.put(put(g1.clone(), vec![("a", vec![small(5)])]))
            .await
            .unwrap();
        assert_eq!(files(&u).len(), 1);
        assert_eq!(u.get(&names(&["a"]), &g1).await.unwrap()[0], vec![small(5)]);

        // Newer generation purges every cell of the older one, files included.
        let g2 = ids(&[7], 2);
        u.put(put(g2.clone(), vec![("c", vec![big(3, 3000)])]))
            .await
            .unwrap();
        assert_eq!(files(&u), vec![files(&u)[0].clone()]);
        assert!(files(&u)[0].starts_with("7-g2-"));
        let e = u.get(&names(&["b"]), &g2).await.unwrap_err();
        assert_eq!(*e.kind(), ErrorKind::NotFound);
        let msg = e.to_string();
        assert!(
            msg.contains("u-gen") && msg.contains("`b`") && msg.contains("7@g2"),
            "{msg}"
        );
        // A get needs the exact generation.
        let e = u.get(&names(&["c"]), &g1).await.unwrap_err();
        assert_eq!(*e.kind(), ErrorKind::NotFound);

        // A stale put is Conflict and leaves no file behind.
        let e = u
            .put(put(g1.clone(), vec![("c", vec![big(4, 3000)])]))
            .await
            .unwrap_err();
        assert_eq!(*e.kind(), ErrorKind::Conflict);
        assert_eq!(files(&u).len(), 1);
        assert_eq!(
            u.get(&names(&["c"]), &g2).await.unwrap()[0],
            vec![big(3, 3000)]
        );

        // A stale clear deletes nothing; a current one deletes the file.
        u.clear(&g1, &FieldFilter::All).await.unwrap();
        assert_eq!(files(&u).len(), 1);
        u.clear(&g2, &FieldFilter::All).await.unwrap();
        assert!(files(&u).is_empty());
    }
}

#[tokio::test]
async fn capacity_counts_samples_and_a_refused_put_leaves_no_file() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let u = SsdUnit::new(
            "u-cap",
            UnitConfig {
                capacity: Some(2),
                ..UnitConfig::default()
            },
            config(dir.path(), engine),
        )
        .unwrap();
        u.put(put(
            ids(&[0, 1], 0),
            vec![("a", vec![big(0, 2000), big(1, 2000)])],
        ))
        .await
        .unwrap();
        // More fields of stored samples fit.
        u.put(put(
            ids(&[0, 1], 0),
            vec![("b", vec![big(2, 2000), small(1)])],
        ))
        .await
        .unwrap();
        let e = u
            .put(put(
                ids(&[1, 2], 0),
                vec![("a", vec![big(5, 2000), big(6, 2000)])],
            ))
            .await
            .unwrap_err();
        assert_eq!(*e.kind(), ErrorKind::CapacityExceeded);
        assert_eq!(files(&u).len(), 3, "{engine:?}");
        assert_eq!(
            u.get(&names(&["a"]), &ids(&[1], 0)).await.unwrap()[0],
            vec![big(1, 2000)]
        );
        let st = u.stats().await.unwrap();
        assert_eq!((st.rows, st.capacity), (2, Some(2)));
    }
}

#[tokio::test]
async fn update_merges_cells_that_live_on_disk() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let u = unit(dir.path(), engine, "u-upd");
        let s = ids(&[3, 4], 1);
        let old: Vec<Value> = (0..2).map(|i| big_tensor(i as f32, 512)).collect();
        u.put(put(s.clone(), vec![("t", old.clone())]))
            .await
            .unwrap();
        let before = files(&u);
        let inc: Vec<Value> = (0..2).map(|i| big_tensor(10.0 + i as f32, 512)).collect();
        let reply = u
            .update(
                UnitUpdate {
                    samples: s.clone(),
                    fields: BTreeMap::from([("t".to_string(), UnitRows::separate(inc))]),
                },
                &MergeOp::Concat { dim: 0 },
            )
            .await
            .unwrap();
        assert_eq!(reply.fields["t"].len(), 2);
        let got = u.get(&names(&["t"]), &s).await.unwrap();
        let t = got[0][0].as_tensor().unwrap();
        assert_eq!(t.shape(), &[256, 4]);
        let after = files(&u);
        assert_eq!(after.len(), 2);
        assert!(
            after.iter().all(|f| !before.contains(f)),
            "old files replaced"
        );
        // An update of a missing cell changes nothing.
        let e = u
            .update(
                UnitUpdate {
                    samples: ids(&[9], 1),
                    fields: BTreeMap::from([(
                        "t".to_string(),
                        UnitRows::separate(vec![big_tensor(0.0, 512)]),
                    )]),
                },
                &MergeOp::Add,
            )
            .await
            .unwrap_err();
        assert_eq!(*e.kind(), ErrorKind::NotFound);
        assert_eq!(files(&u), after);
    }
}

fn run_dirs(path: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(path.join(ROOT_DIR)) {
        Ok(rd) => rd
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[tokio::test]
async fn shutdown_and_drop_remove_the_run_but_not_the_user_directory() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("nested/offload");
        let a = unit(&user, engine, "a");
        let b = unit(&user, engine, "b");
        a.put(put(ids(&[0], 0), vec![("x", vec![big(0, 4096)])]))
            .await
            .unwrap();
        b.put(put(ids(&[1], 0), vec![("x", vec![big(1, 4096)])]))
            .await
            .unwrap();
        let runs = run_dirs(&user);
        assert_eq!(runs.len(), 1, "units of one process share a run");
        let run = runs[0].clone();
        // Explicit shutdown removes that unit's files; the run stays while `b` lives.
        a.shutdown().await.unwrap();
        assert!(!a.dir().unwrap().exists());
        assert!(run.exists());
        let e = a.get(&names(&["x"]), &ids(&[0], 0)).await.unwrap_err();
        assert_eq!(*e.kind(), ErrorKind::Closed);
        drop(a);
        // Dropping the last unit removes the run directory and our child of the user's one.
        drop(b);
        assert!(!run.exists());
        assert!(!user.join(ROOT_DIR).exists());
        assert!(user.is_dir(), "the user's directory stays");
    }
}

fn lock(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::create(path).unwrap();
    // SAFETY: flock on a valid descriptor.
    assert_eq!(
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    f
}

#[tokio::test]
async fn leftovers_of_dead_runs_are_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join(ROOT_DIR);
    // A run that crashed (lock file present, nobody holds it) ...
    std::fs::create_dir_all(root.join("run-1-dead/u0")).unwrap();
    std::fs::write(root.join("run-1-dead/u0/0-g0-0.cell"), b"xxxx").unwrap();
    std::fs::write(root.join("run-1-dead.lock"), b"").unwrap();
    // ... one without its lock file, a stray lock file ...
    std::fs::create_dir_all(root.join("run-2-nolock/u0")).unwrap();
    std::fs::write(root.join("run-3-stray.lock"), b"").unwrap();
    // ... a run of another living process (its lock is held) and an unrelated user file.
    std::fs::create_dir_all(root.join("run-4-live/u0")).unwrap();
    let held = lock(&root.join("run-4-live.lock"));
    std::fs::write(dir.path().join("user-file"), b"keep").unwrap();

    let u = unit(dir.path(), EngineKind::Psync, "u0");
    assert!(!root.join("run-1-dead").exists());
    assert!(!root.join("run-1-dead.lock").exists());
    assert!(!root.join("run-2-nolock").exists());
    assert!(!root.join("run-3-stray.lock").exists());
    assert!(
        root.join("run-4-live/u0").exists(),
        "a live run is left alone"
    );
    assert!(dir.path().join("user-file").exists());
    drop(u);
    // Our run is gone; the live one (and so the root) stays.
    assert_eq!(run_dirs(dir.path()), vec![root.join("run-4-live")]);
    drop(held);
}

#[tokio::test]
async fn configuration_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let no_path = SsdConfig {
        enabled: true,
        ..SsdConfig::default()
    };
    let e = SsdUnit::new("u", UnitConfig::default(), no_path).unwrap_err();
    assert_eq!(*e.kind(), ErrorKind::Invalid);
    assert!(e.to_string().contains("ssd.path"), "{e}");

    // A path below a regular file cannot be created.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"").unwrap();
    let bad = file.join("sub");
    let e = SsdUnit::new("u", UnitConfig::default(), SsdConfig::enabled_at(&bad)).unwrap_err();
    assert!(e.to_string().contains(&bad.display().to_string()), "{e}");

    // Disabled (the default): a plain memory unit, no directory.
    let d = SsdUnit::new("u", UnitConfig::default(), SsdConfig::default()).unwrap();
    assert!(d.dir().is_none());
    d.put(put(ids(&[0], 0), vec![("a", vec![big(0, 1 << 21)])]))
        .await
        .unwrap();
    assert_eq!(d.stats().await.unwrap().offloaded_cells, 0);

    // Two units with one id under one path in one process.
    let _a = unit(dir.path(), EngineKind::Psync, "same");
    let e = SsdUnit::new(
        "same",
        UnitConfig::default(),
        config(dir.path(), EngineKind::Psync),
    )
    .unwrap_err();
    assert_eq!(*e.kind(), ErrorKind::Conflict, "{e}");
}

#[test]
fn defaults_are_documented_values() {
    let c = SsdConfig::default();
    assert!(!c.enabled);
    assert_eq!(c.path, None);
    assert_eq!(c.threshold_bytes, 1 << 20);
    assert_eq!(c.engine, EngineKind::Auto);
    assert!(!c.memory_fallback);
    assert!(c.trim_after_clear);
}
