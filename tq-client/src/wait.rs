//! Waiting for an async operation from a thread outside the runtime, without paying a sleeping
//! thread's wake-up on every answer.
//!
//! `Runtime::block_on` parks the calling thread whenever the operation waits, and the worker
//! that reads the answer must then wake it (a futex call on the worker's side and a scheduler
//! wake-up across cores on the caller's). For a remote request that is most of what a small
//! call costs beyond the wire: on the 2-core VM a one-key lookup took 0.29 ms from `block_on`
//! and 0.12 ms from a task of the runtime (docs/benchmarks.md, "A put and a get step by
//! step"). Running the call as a task instead was tried and rejected: an in-process call that
//! never waits then has to wake a worker and be woken back.
//!
//! [`wait_for`] keeps the call on the calling thread (a call that never waits costs one poll)
//! and, when it waits, first stays awake for up to [`STAY_AWAKE`], giving its core to any other
//! runnable thread at each turn (`sched_yield`), before it parks. An answer that arrives in
//! that window sets a flag the caller sees at its next turn: no futex call, no wake-up.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// How long a waiting caller stays awake before it parks. Long enough for a controller or unit
/// round trip on one host (tens of microseconds), short enough that a call waiting for data
/// that is not there yet (a blocking fetch) costs no more than this in CPU before it sleeps.
pub const STAY_AWAKE: Duration = Duration::from_micros(60);

/// The waker of a waiting caller: a flag it checks while awake, and its thread for when it is
/// parked.
struct Signal {
    woken: AtomicBool,
    thread: Thread,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        // A thread that is not parked only gets a token here (one atomic swap, no system call).
        self.thread.unpark();
    }
}

/// Runs `future` to completion on the calling thread, inside `runtime`'s context (its timers,
/// I/O and `spawn` work as in a task); the runtime's workers drive the I/O. Not for use from
/// inside a runtime's task (it blocks its thread).
pub fn wait_for<F: Future>(runtime: &Handle, future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(out) = wait_at_most(runtime, future.as_mut(), Duration::from_secs(3600))
        {
            return out;
        }
    }
}

/// Polls `future` on the calling thread until it is ready or `limit` has passed (then
/// `Pending`: the caller keeps the future and may call again, e.g. after checking for
/// signals). Like [`wait_for`], it stays awake for [`STAY_AWAKE`] each time the future waits
/// before it parks.
pub fn wait_at_most<F: Future + ?Sized>(
    runtime: &Handle,
    mut future: Pin<&mut F>,
    limit: Duration,
) -> Poll<F::Output> {
    let _context = runtime.enter();
    let signal = Arc::new(Signal {
        woken: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let waker = Waker::from(signal.clone());
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + limit;
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Poll::Ready(out);
        }
        if !sleep_until_woken(&signal, deadline) {
            return Poll::Pending;
        }
    }
}

/// Waits until `signal` is raised (true, and lowers it) or `deadline` passes (false).
fn sleep_until_woken(signal: &Signal, deadline: Instant) -> bool {
    let awake_until = Instant::now() + STAY_AWAKE;
    let mut turns = 0u32;
    loop {
        if signal.woken.swap(false, Ordering::Acquire) {
            return true;
        }
        // Reading the clock every turn would cost more than a turn; every 8th is enough.
        turns = turns.wrapping_add(1);
        if !turns.is_multiple_of(8) {
            std::thread::yield_now();
            continue;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        if now < awake_until {
            std::thread::yield_now();
        } else {
            // A wake before this park leaves a token, so the park returns at once; a spurious
            // return only sends us round the loop again.
            std::thread::park_timeout(deadline - now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_future_answered_by_a_worker_completes_whether_the_caller_is_awake_or_parked() {
        let rt = runtime();
        for delay_us in [0u64, 20, 2_000, 20_000] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            rt.spawn(async move {
                tokio::time::sleep(Duration::from_micros(delay_us)).await;
                tx.send(delay_us).unwrap();
            });
            assert_eq!(wait_for(rt.handle(), rx).unwrap(), delay_us);
        }
    }

    #[test]
    fn a_future_that_is_not_ready_by_the_limit_is_kept_for_the_next_call() {
        let rt = runtime();
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut rx = std::pin::pin!(rx);
        assert!(wait_at_most(rt.handle(), rx.as_mut(), Duration::from_millis(5)).is_pending());
        tx.send(7).unwrap();
        match wait_at_most(rt.handle(), rx.as_mut(), Duration::from_secs(5)) {
            Poll::Ready(v) => assert_eq!(v.unwrap(), 7),
            Poll::Pending => panic!("the answer sent before the second call was not seen"),
        }
    }

    #[test]
    fn no_wake_is_lost_when_many_threads_wait_on_answers_around_the_awake_window() {
        // Answers land before, inside and after each waiter's awake window, from two workers,
        // while four threads wait at once: a wake lost between the flag check and the park
        // would leave a thread parked until its 1-hour limit and the test would hang.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let handle = rt.handle().clone();
                scope.spawn(move || {
                    for i in 0..300u64 {
                        let delay = Duration::from_micros((i * 7 + t * 13) % 120);
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        handle.spawn(async move {
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            let _ = tx.send(i);
                        });
                        assert_eq!(wait_for(&handle, rx).unwrap(), i);
                    }
                });
            }
        });
    }

    #[test]
    fn the_runtime_context_is_entered_for_timers_and_spawns() {
        let rt = runtime();
        let out = wait_for(rt.handle(), async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            tokio::spawn(async { 5 }).await.unwrap()
        });
        assert_eq!(out, 5);
    }
}
