//! A unit server belongs to one controller epoch at a time, over real loopback TCP: requests of
//! another epoch are refused, and when its controller turns out to have restarted without its
//! state, the unit is made anew (the earlier epoch's cells are gone, so their generations
//! cannot refuse the new epoch's writes at the same indexes).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
#![cfg(feature = "net")]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tq_core::{ErrorKind, Retry, SampleId, Tensor, Value};
use tq_net::{ClientConfig, Endpoint, Pool, Server, ServerConfig};
use tq_unit::{MemoryUnit, RemoteUnit, StorageUnit, UnitPut, UnitRows, UnitServer};

fn put_of(sample: SampleId, v: i64) -> UnitPut {
    let value = Value::Tensor(Tensor::from_slice(vec![2], &[v, v]).unwrap());
    UnitPut {
        samples: vec![sample],
        fields: BTreeMap::from([("x".to_string(), UnitRows::separate(vec![value]))]),
    }
}

#[tokio::test]
async fn a_unit_refuses_other_epochs_and_starts_anew_on_a_new_one() {
    let made = Arc::new(AtomicUsize::new(0));
    let factory = {
        let made = made.clone();
        move || -> tq_core::Result<Arc<dyn StorageUnit>> {
            made.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(MemoryUnit::new("u0")))
        }
    };
    let handler =
        Arc::new(UnitServer::new(Arc::new(MemoryUnit::new("u0"))).with_factory(Box::new(factory)));
    assert!(
        !handler.adopt_epoch(11).unwrap(),
        "a first epoch is adopted"
    );
    let server = Server::bind(
        &Endpoint::tcp("127.0.0.1:0"),
        ServerConfig::default(),
        handler.clone(),
    )
    .await
    .unwrap();
    let pool = Pool::new(ClientConfig::default());
    let stub = |epoch| {
        RemoteUnit::new("u0", server.local_endpoint().clone(), pool.clone()).with_epoch(epoch)
    };
    let (old, new) = (stub(11), stub(22));
    let fields = ["x".to_string()];

    // Index 0 reaches generation 3 in epoch 11.
    old.put(put_of(SampleId::new(0, 3), 1)).await.unwrap();
    let e = new.get(&fields, &[SampleId::new(0, 3)]).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
    assert_eq!(e.retry(), Retry::Never);
    assert!(e.message().contains("restarted without its state"), "{e}");

    // The controller restarted without its state: epoch 22. The unit starts anew.
    assert!(handler.adopt_epoch(22).unwrap());
    assert_eq!(made.load(Ordering::SeqCst), 1);
    assert!(
        !handler.adopt_epoch(22).unwrap(),
        "the same epoch again changes nothing"
    );
    let e = old.get(&fields, &[SampleId::new(0, 3)]).await.unwrap_err();
    assert!(e.message().contains("restarted without its state"), "{e}");
    // Generation 0 of index 0 is writable (generation 3 is gone with its epoch) and reads back.
    new.put(put_of(SampleId::new(0, 0), 5)).await.unwrap();
    let got = new.get(&fields, &[SampleId::new(0, 0)]).await.unwrap();
    assert_eq!(
        got[0][0],
        Value::Tensor(Tensor::from_slice(vec![2], &[5i64, 5]).unwrap())
    );
    server.shutdown().await;
}
