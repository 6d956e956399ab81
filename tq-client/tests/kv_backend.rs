//! The embedded client on `storage.backend = "kv"` (the in-memory KV store; Redis and
//! object_store are tested in tq-backend-kv).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use tq_client::*;
use tq_core::{Batch, Bytes, Column, ErrorKind, Tensor};

#[tokio::test]
async fn embedded_client_on_the_kv_backend() {
    let config = Config::from_toml(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\ndata_ttl_ms = 60000\n\
         stores = [{ name = \"a\", url = \"memory://\" }, { name = \"b\", url = \"memory://\" }]\n\
         routing = { kind = \"by-field\", fields = { text = \"b\" }, default = \"a\" }\n",
    )
    .unwrap();
    let tq = Client::embedded(config).unwrap();
    let one = Batch::from_columns([
        (
            "ids",
            Column::Dense(Tensor::from_slice(vec![1, 3], &[1i64, 2, 3]).unwrap()),
        ),
        ("text", Column::Objects(vec![Bytes::from_static(b"hello")])),
    ])
    .unwrap();
    tq.partition("p").kv_put("k", &one, None).await.unwrap();
    let got = tq.partition("p").kv_batch_get(&["k"], None).await.unwrap();
    assert_eq!(got.column("ids"), one.column("ids"));
    assert_eq!(got.column("text"), one.column("text"));
    tq.partition("p").kv_clear(&["k"]).await.unwrap();
    let e = tq
        .partition("p")
        .kv_batch_get(&["k"], None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    // The reused index gets a new generation and reads back its own data.
    tq.partition("p").kv_put("k2", &one, None).await.unwrap();
    let got = tq.partition("p").kv_batch_get(&["k2"], None).await.unwrap();
    assert_eq!(got.column("ids"), one.column("ids"));
}

mod overwrite {
    //! An overwrite through the client is all-or-nothing on the KV backend: a store failure
    //! half-way leaves every key reading its old fields, all of them; a write that succeeds
    //! retires the cells it replaced, so nothing is left behind.
    use super::*;
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tq_backend_kv::{
        KvCapabilities, KvOptions, KvStorageManager, KvStore, KvValue, MemoryKvStore,
    };
    use tq_core::{Error, MergeOp, Result};

    /// Passes everything on, except that the write call numbered `fail_at` (from 1, counting
    /// since the last arming) fails; `usize::MAX`: none.
    struct Flaky {
        inner: MemoryKvStore,
        calls: AtomicUsize,
        fail_at: AtomicUsize,
        /// The next this many delete or expire calls fail (a store loading its data).
        removals_refused: AtomicUsize,
    }

    impl Flaky {
        fn arm(&self, fail_at: usize) {
            self.calls.store(0, Ordering::SeqCst);
            self.fail_at.store(fail_at, Ordering::SeqCst);
        }

        fn new() -> Flaky {
            Flaky {
                inner: MemoryKvStore::new(),
                calls: AtomicUsize::new(0),
                fail_at: AtomicUsize::new(usize::MAX),
                removals_refused: AtomicUsize::new(0),
            }
        }

        /// `Unavailable` if a refusal is armed (and uses it up).
        fn refuse_removal(&self) -> Result<()> {
            let armed =
                self.removals_refused
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            match armed {
                Ok(_) => Err(Error::unavailable(
                    "injected: BusyLoading, the store is loading its data",
                )),
                Err(_) => Ok(()),
            }
        }
    }

    #[async_trait]
    impl KvStore for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn capabilities(&self) -> KvCapabilities {
            KvCapabilities {
                // Three cells per call: a call boundary falls between the fields of a key.
                max_keys_per_call: 3,
                max_concurrent_calls: 1,
                ..self.inner.capabilities()
            }
        }
        async fn mset(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()> {
            if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at.load(Ordering::SeqCst)
            {
                return Err(Error::unavailable(
                    "injected: the store went away mid-write",
                ));
            }
            self.inner.mset(items, ttl).await
        }
        async fn mget(&self, keys: &[String]) -> Result<Vec<Option<tq_core::Bytes>>> {
            self.inner.mget(keys).await
        }
        async fn delete(&self, keys: &[String]) -> Result<()> {
            self.refuse_removal()?;
            self.inner.delete(keys).await
        }
        async fn expire(&self, keys: &[String], after: Duration) -> Result<()> {
            self.refuse_removal()?;
            self.inner.expire(keys, after).await
        }
        async fn raise_generations(
            &self,
            items: Vec<(String, u32)>,
            ttl: Option<Duration>,
        ) -> Result<Vec<u32>> {
            self.inner.raise_generations(items, ttl).await
        }
    }

    fn rows(base: i64) -> Batch {
        let x: Vec<i64> = (base..base + 8).collect();
        let y: Vec<f32> = (base..base + 8).map(|v| v as f32).collect();
        Batch::from_columns([
            (
                "x",
                Column::Dense(Tensor::from_slice(vec![4, 2], &x).unwrap()),
            ),
            (
                "y",
                Column::Dense(Tensor::from_slice(vec![4, 2], &y).unwrap()),
            ),
        ])
        .unwrap()
    }

    /// Keys the store holds once expired ones are swept, waiting (up to 10 s) for the count
    /// to fall to `want`: retired cells expire after `clear_expire_after`.
    async fn settle_to(store: &Flaky, want: usize) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            store.inner.sweep();
            let n = store.inner.resident_keys();
            if n == want || std::time::Instant::now() > deadline {
                return n;
            }
            tokio::task::yield_now().await;
        }
    }

    /// An embedded client on a fresh [`Flaky`] store (retired cells expire after 1 ms).
    fn client_on_flaky() -> (Arc<Flaky>, Client) {
        let store = Arc::new(Flaky::new());
        let kv = KvStorageManager::new(
            store.clone(),
            KvOptions {
                clear_expire_after: Duration::from_millis(1),
                ..KvOptions::default()
            },
        )
        .unwrap();
        let tq = Client::builder()
            .config(Config::default())
            .storage(Arc::new(kv))
            .build()
            .unwrap();
        (store, tq)
    }

    #[tokio::test]
    async fn a_failed_overwrite_leaves_every_key_old_and_whole() {
        let (store, tq) = client_on_flaky();
        let p = tq.partition("p");
        let keys = ["a", "b", "c", "d"];
        let old = rows(0);
        p.kv_batch_put(&keys, &old, None).await.unwrap();
        let resident = settle_to(&store, 12).await;
        assert_eq!(resident, 12, "8 cells and 4 generation keys");

        let new = rows(100);
        for fail_at in 1..=3 {
            store.arm(fail_at);
            let e = p.kv_batch_put(&keys, &new, None).await.unwrap_err();
            assert_eq!(e.kind(), &ErrorKind::Unavailable, "{e}");
            store.arm(usize::MAX);
            let got = p.kv_batch_get(&keys, None).await.unwrap();
            assert_eq!(got.column("x"), old.column("x"), "fail at call {fail_at}");
            assert_eq!(got.column("y"), old.column("y"), "fail at call {fail_at}");
            assert_eq!(
                settle_to(&store, 12).await,
                12,
                "fail at call {fail_at}: leftovers"
            );
        }

        // A failed merge leaves the old values too.
        store.arm(2);
        let e = p
            .kv_batch_update(&keys, &rows(1), &MergeOp::Add)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Unavailable, "{e}");
        store.arm(usize::MAX);
        let got = p.kv_batch_get(&keys, None).await.unwrap();
        assert_eq!(got.column("x"), old.column("x"));
        assert_eq!(
            settle_to(&store, 12).await,
            12,
            "a failed update left cells"
        );

        // Writes that succeed read new, and the replaced cells go.
        p.kv_batch_put(&keys, &new, None).await.unwrap();
        let got = p.kv_batch_get(&keys, None).await.unwrap();
        assert_eq!(got.column("x"), new.column("x"));
        assert_eq!(got.column("y"), new.column("y"));
        assert_eq!(
            settle_to(&store, 12).await,
            12,
            "replaced cells were not retired"
        );
        p.kv_batch_update(&keys, &rows(0), &MergeOp::Add)
            .await
            .unwrap();
        let got = p.kv_batch_get(&keys, Some(&["x"])).await.unwrap();
        let want: Vec<i64> = (0..8).map(|v| 100 + v + v).collect();
        assert_eq!(
            got.column("x"),
            Some(&Column::Dense(
                Tensor::from_slice(vec![4, 2], &want).unwrap()
            ))
        );
        assert_eq!(
            settle_to(&store, 12).await,
            12,
            "merged-over cells were not retired"
        );
        p.kv_clear(&keys).await.unwrap();
        assert_eq!(settle_to(&store, 0).await, 0, "a clear leaves nothing");
    }

    /// An overwrite is published, then the store refuses to remove the cells it replaced for a
    /// moment (Redis answering `BusyLoading` after a restart): the writer asks again, so the
    /// old cells do not stay behind (nothing else names them once the controller describes the
    /// new ones).
    #[tokio::test]
    async fn replaced_cells_go_even_if_the_store_refuses_their_removal_for_a_moment() {
        let (store, tq) = client_on_flaky();
        let p = tq.partition("p");
        let keys = ["a", "b", "c", "d"];
        p.kv_batch_put(&keys, &rows(0), None).await.unwrap();
        assert_eq!(
            settle_to(&store, 12).await,
            12,
            "8 cells and 4 generation keys"
        );

        store.removals_refused.store(3, Ordering::SeqCst);
        p.kv_batch_put(&keys, &rows(100), None).await.unwrap();
        assert_eq!(
            store.removals_refused.load(Ordering::SeqCst),
            0,
            "the refusals were met"
        );
        let got = p.kv_batch_get(&keys, None).await.unwrap();
        assert_eq!(got.column("x"), rows(100).column("x"));
        assert_eq!(
            settle_to(&store, 12).await,
            12,
            "the replaced cells stayed in the store"
        );
    }
}
