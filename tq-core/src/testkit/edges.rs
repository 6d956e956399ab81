//! Conformance cases about expiry, declared capabilities and unusual values.

// A kit reports a violated contract by panicking with the case's name, like any test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

/// `expire` removes cells like `clear` does (at once without `native_expire`, within
/// [`KitOptions::expire_settles_within`] with it), is idempotent, and never reaches the sample
/// that reuses the index afterwards — the deadline of the old cells must not delete the new.
pub async fn expire_hides_cells_and_spares_the_next_sample(
    s: &dyn StorageManager,
    options: KitOptions,
) {
    let old = i64_column(INDEXES.len(), 0);
    let old_meta = meta_for(ids(0), Some(&old));
    s.put(&old_meta, &old).await.expect("expire: put");
    s.expire(&old_meta, &FieldFilter::All)
        .await
        .expect("expire");
    s.expire(&old_meta, &FieldFilter::All)
        .await
        .expect("expire is idempotent");
    let never = meta_for(vec![SampleId::new(998, 0)], None);
    s.expire(&never, &FieldFilter::All)
        .await
        .expect("expire of a never-written sample");
    if !s.capabilities().native_expire {
        assert_missing(
            "expire without native_expire clears",
            s.get(&old_meta).await,
        );
    }
    // The index is reused: the new sample must outlive the old cells' deadline.
    let new = i64_column(INDEXES.len(), 100);
    let new_meta = meta_for(ids(1), Some(&new));
    s.put(&new_meta, &new)
        .await
        .expect("expire: put after reuse");
    // A stale expire (the old generation) is a no-op for the new sample.
    s.expire(&old_meta, &FieldFilter::All)
        .await
        .expect("stale expire");
    if s.capabilities().native_expire {
        // Waiting for a store's own deadline to pass (not synchronisation with another task).
        tokio::time::sleep(options.expire_settles_within + Duration::from_millis(200)).await;
        assert_missing(
            "expired cells are gone once settled",
            s.get(&old_meta).await,
        );
    }
    let got = s.get(&new_meta).await.expect("expire: new sample intact");
    assert_same_rows("expire spares the next sample", &new, &got);
}

/// A backend does what its [`Capabilities`] declare, and refuses what they do not: with
/// `links`, a linked field reads the source sample's cell; without, a linked read is an error,
/// never the wrong sample's data.
pub async fn declared_capabilities_are_honoured(s: &dyn StorageManager) {
    let public = SampleId::new(50, 0);
    let private = SampleId::new(51, 0);
    let prompt = |base| {
        Batch::from_columns([(
            "prompt",
            Column::Dense(Tensor::from_slice(vec![1, 2], &[base, base + 1]).expect("sized")),
        )])
        .expect("one column")
    };
    let shared = prompt(7i64);
    s.put(&meta_for(vec![public], Some(&shared)), &shared)
        .await
        .expect("links: put the public sample");
    // The private sample holds a value of its own under the same field name: a backend that
    // ignored the link would return it.
    let own = prompt(-1i64);
    s.put(&meta_for(vec![private], Some(&own)), &own)
        .await
        .expect("links: put the private sample");
    let linked = meta_for(vec![private], Some(&shared))
        .with_links(vec![Links::from([("prompt".to_string(), public)])])
        .expect("one link row");
    let got = s.get(&linked).await;
    if s.capabilities().links {
        let got = got.expect("links: a linked read");
        assert_same_rows("links: the link is followed", &shared, &got);
    } else {
        assert!(
            got.is_err(),
            "links: a backend without the links capability returned data for a linked read"
        );
    }
}

/// Tensors with no elements (a zero in the shape) and empty objects round-trip like any other.
pub async fn zero_size_tensors_and_empty_objects(s: &dyn StorageManager) {
    let n = INDEXES.len();
    let batch = Batch::from_columns([
        (
            "empty_rows",
            Column::Dense(Tensor::from_slice::<f32>(vec![n, 0], &[]).expect("sized")),
        ),
        (
            "empty_obj",
            Column::Objects((0..n).map(|_| Bytes::new()).collect()),
        ),
        (
            "mixed",
            Column::Ragged(
                (0..n)
                    .map(|i| {
                        Tensor::from_slice(vec![i % 2], &vec![i as i32; i % 2]).expect("sized")
                    })
                    .collect(),
            ),
        ),
    ])
    .expect("columns of n rows");
    let meta = meta_for(ids(0), Some(&batch));
    s.put(&meta, &batch).await.expect("empty values: put");
    let got = s.get(&meta).await.expect("empty values: get");
    assert_same_rows("empty values", &batch, &got);
}

/// A read may name the same sample more than once; each row comes back, in request order.
pub async fn duplicate_rows_in_one_get(s: &dyn StorageManager) {
    let batch = sample_batch(INDEXES.len(), 13);
    let meta = meta_for(ids(0), Some(&batch));
    s.put(&meta, &batch).await.expect("duplicates: put");
    let positions = [2, 0, 2, 2, 4];
    let twice = meta.select_samples(&positions).unwrap();
    let got = s.get(&twice).await.expect("duplicates: get");
    assert_same_rows(
        "duplicate rows",
        &batch.select_rows(&positions).unwrap(),
        &got,
    );
}
