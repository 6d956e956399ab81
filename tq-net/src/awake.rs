//! Waiting for the next message while staying awake for a moment first.
//!
//! On a virtual machine an idle virtual core halts, and waking a thread on a halted core costs
//! an inter-processor interrupt, a trip through the hypervisor and a reschedule: `tq bench`
//! measures it as the round trip to a thread that sleeps between messages, 40–120 µs here
//! against a few µs for a thread that is awake. A server that parks right after answering pays
//! it again for the next request of a conversation that comes back within microseconds (a put's
//! write, then its notice). [`awake_for`] keeps the waiting task runnable for a short window:
//! each turn it yields to the OS scheduler (any runnable thread on the core goes first) and to
//! the tokio runtime, which polls its I/O driver without blocking before running the task again,
//! so a message arriving in the window is read by a thread that never slept. After the window
//! the task waits as usual, so an idle connection costs one window of CPU per message, not more.

use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

/// `fut`'s output, polling it in a loop that stays awake for up to `window` while it is
/// pending, then awaiting it normally. `fut` is polled in place throughout, so it is never
/// dropped midway (safe for a read that has consumed part of a frame).
pub(crate) async fn awake_for<F: Future>(fut: F, window: Duration) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    if window.is_zero() {
        return fut.await;
    }
    let mut started: Option<Instant> = None;
    loop {
        let polled = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = polled {
            return out;
        }
        let since = *started.get_or_insert_with(Instant::now);
        if since.elapsed() >= window {
            return fut.await;
        }
        std::thread::yield_now();
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ready_future_is_answered_at_once() {
        assert_eq!(awake_for(async { 7 }, Duration::from_millis(5)).await, 7);
    }

    #[tokio::test]
    async fn a_value_sent_within_the_window_is_received() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sender = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(3).unwrap();
        });
        assert_eq!(awake_for(rx, Duration::from_secs(5)).await.unwrap(), 3);
        sender.await.unwrap();
    }

    #[tokio::test]
    async fn after_the_window_it_waits_as_usual() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn(awake_for(rx, Duration::from_micros(50)));
        // Long after the window: the waiter must have gone to sleep and still be woken.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        tx.send(9).unwrap();
        assert_eq!(waiter.await.unwrap().unwrap(), 9);
    }
}
