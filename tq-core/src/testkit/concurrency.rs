//! Conformance cases about concurrent requests on the same samples.

// A kit reports a violated contract by panicking with the case's name, like any test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

/// A put and a clear of the same samples, concurrently: afterwards a read returns all of the
/// put's rows (the clear ran first) or reports them missing (it ran last) — never a mix.
pub async fn a_put_racing_a_clear_leaves_all_or_nothing(s: &dyn StorageManager) {
    for round in 0..20i64 {
        let batch = i64_column(INDEXES.len(), round * 10);
        let meta = meta_for(
            INDEXES
                .iter()
                .map(|&i| SampleId::new(i + 1000, round as u32))
                .collect(),
            Some(&batch),
        );
        let (put, clear) = tokio::join!(s.put(&meta, &batch), s.clear(&meta, &FieldFilter::All));
        put.expect("race: put");
        clear.expect("race: clear");
        match s.get(&meta).await {
            Ok(got) => assert_same_rows("race: put after clear", &batch, &got),
            Err(e) => assert!(
                matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DataLost),
                "race round {round}: {e}"
            ),
        }
        // Whatever happened, each sample reads whole or not at all.
        for pos in 0..INDEXES.len() {
            let one = meta.select_samples(&[pos]).unwrap();
            if let Ok(got) = s.get(&one).await {
                assert_same_rows(
                    "race: one sample",
                    &batch.select_rows(&[pos]).unwrap(),
                    &got,
                );
            }
        }
        s.clear(&meta, &FieldFilter::All).await.expect("race: tidy");
    }
}

/// A writer still holding the old generation of an index races the writer of the sample that
/// reused it: the new sample always reads its own data, and the old generation reads nothing.
pub async fn a_stale_writer_racing_index_reuse_never_wins(s: &dyn StorageManager) {
    for round in 0..20u32 {
        let index = 2000 + round;
        let stale = i64_column(1, -1);
        let fresh = i64_column(1, i64::from(round));
        let stale_meta = meta_for(vec![SampleId::new(index, 0)], Some(&stale));
        let fresh_meta = meta_for(vec![SampleId::new(index, 1)], Some(&fresh));
        let (a, b) = tokio::join!(s.put(&stale_meta, &stale), s.put(&fresh_meta, &fresh));
        b.expect("reuse race: the new generation's put");
        if let Err(e) = a {
            assert_eq!(e.kind(), &ErrorKind::Conflict, "reuse race: stale put: {e}");
        }
        let got = s
            .get(&fresh_meta)
            .await
            .expect("reuse race: read the new sample");
        assert_same_rows("reuse race", &fresh, &got);
        assert_missing("reuse race: the old generation", s.get(&stale_meta).await);
    }
}
