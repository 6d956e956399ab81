//! A named background thread that runs one kind of job off the callers' path.
//!
//! Same-host transfers hand two costs to background threads: unmapping what a reader dropped
//! ([`super::unmap`]) and allocating segments ahead of the puts that will fill them
//! ([`super::spare`]). Both want the same things: a thread started on first use (a process that
//! never uses shared memory starts none), a bounded queue so that a stalled thread cannot grow
//! memory, the job handed back when the thread is missing or the queue full (the caller then
//! does the work itself or drops it), and, for tests, a way to wait until every job queued so
//! far is done.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;

enum Message<J> {
    Run(J),
    /// Answered once every job queued before it is done.
    #[cfg(test)]
    Settle(std::sync::mpsc::Sender<()>),
}

/// A background thread named `name` that runs each job with `run`, holding at most `queue`
/// jobs waiting. Meant to live in a `static`: the thread starts on the first job and lives as
/// long as the process.
pub(crate) struct Background<J: Send + 'static> {
    name: &'static str,
    queue: usize,
    run: fn(J),
    /// Said in the warning when the thread cannot be started: what callers do instead.
    fallback: &'static str,
    sender: OnceLock<Option<SyncSender<Message<J>>>>,
}

impl<J: Send + 'static> Background<J> {
    pub(crate) const fn new(
        name: &'static str,
        queue: usize,
        run: fn(J),
        fallback: &'static str,
    ) -> Self {
        Background {
            name,
            queue,
            run,
            fallback,
            sender: OnceLock::new(),
        }
    }

    fn sender(&self) -> Option<&SyncSender<Message<J>>> {
        self.sender
            .get_or_init(|| {
                let (tx, rx) = sync_channel(self.queue);
                let run = self.run;
                let started = std::thread::Builder::new()
                    .name(self.name.into())
                    .spawn(move || serve(rx, run));
                match started {
                    Ok(_) => Some(tx),
                    Err(e) => {
                        tracing::warn!(thread = self.name, error = %e, "cannot start a background thread: {}", self.fallback);
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Queues `job`, or gives it back when there is no thread or its queue is full.
    pub(crate) fn try_run(&self, job: J) -> Result<(), J> {
        let Some(sender) = self.sender() else {
            return Err(job);
        };
        match sender.try_send(Message::Run(job)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(Message::Run(job)))
            | Err(TrySendError::Disconnected(Message::Run(job))) => Err(job),
            #[cfg(test)]
            Err(_) => unreachable!("only jobs are sent here"),
        }
    }

    /// Waits until every job queued before this call is done.
    #[cfg(test)]
    pub(crate) fn settle(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(sender) = self.sender() {
            if sender.send(Message::Settle(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
    }
}

fn serve<J>(messages: Receiver<Message<J>>, run: fn(J)) {
    for message in messages {
        match message {
            Message::Run(job) => run(job),
            #[cfg(test)]
            Message::Settle(done) => {
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static DONE: AtomicUsize = AtomicUsize::new(0);
    static COUNTER: Background<usize> =
        Background::new("tq-test-background", 8, count, "the test counts itself");

    fn count(n: usize) {
        DONE.fetch_add(n, Ordering::SeqCst);
    }

    #[test]
    fn queued_jobs_are_done_once_settled() {
        for n in [1, 2, 3] {
            assert_eq!(COUNTER.try_run(n), Ok(()));
        }
        COUNTER.settle();
        assert_eq!(DONE.load(Ordering::SeqCst), 6);
    }
}
