//! Inserts, fetches and production notices applied at most once per request id (a remote
//! client's retry after a lost answer gets the first answer), and the one path each takes with
//! or without an id.

use super::*;
use tq_core::BackendMeta;

impl Controller {
    /// [`ControlPlane::get_meta`] applied at most once for `id`: a request that comes again
    /// with the same id (a retry after a lost answer, also across a restart on the state
    /// dir) gets the first answer instead of a second insert or a second batch. A retry that
    /// overtakes its first attempt waits for it. See `controller/answers.rs`.
    pub async fn get_meta_once(&self, req: GetMetaRequest, id: RequestId) -> Result<BatchMeta> {
        let _turn = self.request_turn(&id).await;
        let first = self.shared().answers().lookup(&id)?;
        match first {
            Some(answers::Answer::Meta(meta)) => {
                tracing::debug!(client = %format_args!("{:016x}", id.client), seq = id.seq, partition = %req.partition, "a request came again: answered as the first time");
                return Ok(meta);
            }
            Some(other) => return Err(another_answer(&id, &other)),
            None => {}
        }
        self.get_meta_with(req, Some(&id)).await
    }

    /// [`ControlPlane::notify_production`] applied at most once for `id`: a notice that comes
    /// again (its answer lost) gets the first answer, even if its samples were consumed and
    /// cleared since, instead of a refusal as a stale write.
    pub async fn notify_once(
        &self,
        notice: ProductionNotice,
        id: RequestId,
    ) -> Result<Vec<BackendMeta>> {
        let _turn = self.request_turn(&id).await;
        let first = self.shared().answers().lookup(&id)?;
        match first {
            Some(answers::Answer::Replaced(replaced)) => return Ok(replaced),
            Some(other) => return Err(another_answer(&id, &other)),
            None => {}
        }
        self.notify_with(notice, Some(&id)).await
    }

    /// How many remembered answers the controller keeps (see [`Controller::get_meta_once`]).
    pub fn remembered_answers(&self) -> usize {
        self.shared().answers().len()
    }

    /// [`ControlPlane::get_meta`]; with `once`, an answer that changed the state is
    /// remembered under that id in the same critical section as the change.
    pub(super) async fn get_meta_with(
        &self,
        req: GetMetaRequest,
        once: Option<&RequestId>,
    ) -> Result<BatchMeta> {
        // Embedded calls that never wait must still let other tasks run (a NoWait poll loop).
        tokio::task::consume_budget().await;
        match &req.mode {
            GetMetaMode::Fetch {
                task,
                batch_size,
                wait,
                lease,
            } => {
                self.fetch(&req, task, *batch_size, *wait, *lease, once)
                    .await
            }
            GetMetaMode::Insert { count } => {
                if *count == 0 {
                    return Err(Error::invalid(format!(
                        "partition `{}`: insert of zero samples",
                        req.partition
                    )));
                }
                if *count > MAX_INSERT_COUNT {
                    return Err(Error::invalid(format!(
                        "partition `{}`: insert of {count} samples; at most {MAX_INSERT_COUNT} \
                         per request",
                        req.partition
                    )));
                }
                let too_many = |alloc: &IndexAllocator| {
                    Error::capacity_exceeded(format!(
                        "partition `{}`: insert of {count} samples, but only {} sample \
                         indexes are left{} (clear samples to reuse theirs)",
                        req.partition,
                        alloc.available(),
                        alloc.limit_note()
                    ))
                };
                let fits = |st: &State| {
                    let alloc = st.alloc();
                    if *count as u64 > alloc.available() {
                        return Err(too_many(&alloc));
                    }
                    Ok(())
                };
                self.in_partition(&req.partition, fits, |st, p| {
                    let slots = {
                        let mut alloc = st.alloc();
                        if *count as u64 > alloc.available() {
                            return Err(too_many(&alloc));
                        }
                        p.allocate(&mut alloc, *count)
                    };
                    // The fields the inserter is about to write (see `note_fields_written`).
                    p.note_fields_written(&req.fields);
                    let meta = p.build_meta(&slots, &[], Production::NoneReady);
                    if let Some(id) = once {
                        st.answers()
                            .remember(id, answers::Answer::Meta(meta.clone()));
                    }
                    Ok(meta)
                })
            }
            GetMetaMode::Force => {
                let st = self.shared();
                let meta = st.partition(&req.partition)?.force_meta(&req.fields);
                Ok(meta)
            }
        }
    }

    /// [`ControlPlane::notify_production`]; with `once`, its answer is remembered under that id
    /// in the same critical section as the change.
    pub(super) async fn notify_with(
        &self,
        notice: ProductionNotice,
        once: Option<&RequestId>,
    ) -> Result<Vec<BackendMeta>> {
        tokio::task::consume_budget().await;
        if notice.samples.is_empty() {
            return Ok(Vec::new());
        }
        // An overwrite waits while a checkpoint copies payloads: its writer retires the old
        // cells once answered, and the copy may still have to read them.
        let replaced = self
            .unless_held_shared(|st, held| {
                let applied = (|| {
                    st.refuse_linked(&notice.partition, &notice.samples, "write")?;
                    let mut p = st
                        .partitions
                        .lock_mut(&notice.partition)
                        .ok_or_else(|| gone_partition(&notice.partition))?;
                    if held && p.replaces_cells(&notice) {
                        return Ok(None);
                    }
                    let replaced = p.notify(&notice)?;
                    if let Some(id) = once {
                        st.answers()
                            .remember(id, answers::Answer::Replaced(replaced.clone()));
                    }
                    Ok(Some(replaced))
                })();
                applied.transpose()
            })
            .await?;
        self.wake(&notice.partition);
        Ok(replaced)
    }
}

/// A remembered answer of another kind than the request that came again asks for: the id was
/// reused for another request.
fn another_answer(id: &RequestId, found: &answers::Answer) -> Error {
    Error::invalid(format!(
        "request {} of client {:016x} came again as another kind of request (its first answer \
         was {}); a request id names one request",
        id.seq,
        id.client,
        match found {
            answers::Answer::Meta(_) => "a get_meta's",
            answers::Answer::Replaced(_) => "a production notice's",
        }
    ))
}
