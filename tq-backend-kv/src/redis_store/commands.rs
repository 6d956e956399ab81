//! The Redis commands behind each [`KvStore`] operation: `MSET`/`SET PX`, `MGET`, `UNLINK`/`DEL`,
//! `PEXPIRE` or the expire script, and the generation script; each followed by `WAIT` when
//! replicas must confirm writes.

use super::*;

#[async_trait]
impl KvStore for RedisStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> KvCapabilities {
        KvCapabilities {
            native_ttl: true,
            native_expire: true,
            max_keys_per_call: self.options.max_keys_per_call,
            max_concurrent_calls: self.options.max_concurrent_calls,
            atomic_generations: true,
        }
    }

    async fn mset(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let groups = self.groups(items.iter().map(|(k, _)| k));
        let ms = ttl.map(|t| (t.as_millis().max(1) as u64).to_string());
        let build = |pos: &[usize]| {
            let cmds = write_commands(&items, pos, ms.as_deref(), pos.len());
            self.with_wait(Req::from_commands(cmds))
        };
        for (_, reply) in self.run(groups, &build).await? {
            self.checked_wait(reply)?;
        }
        Ok(())
    }

    async fn mget(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>> {
        let mut out = vec![None; keys.len()];
        if keys.is_empty() {
            return Ok(out);
        }
        let build = |pos: &[usize]| {
            let mut c = cmd_with("MGET", pos.len(), pos.iter().map(|&i| keys[i].len()).sum());
            for &i in pos {
                c.arg(&keys[i]);
            }
            Req::Cmd(c)
        };
        for (pos, v) in self.run(self.groups(keys.iter()), &build).await? {
            let redis::Value::Array(values) = v else {
                return Err(Error::corrupted(format!(
                    "{}: MGET answered {v:?}",
                    self.what
                )));
            };
            if values.len() != pos.len() {
                return Err(Error::corrupted(format!(
                    "{}: MGET of {} keys answered {} values",
                    self.what,
                    pos.len(),
                    values.len()
                )));
            }
            for (i, v) in pos.into_iter().zip(values) {
                out[i] = match v {
                    redis::Value::Nil => None,
                    redis::Value::BulkString(b) => Some(Bytes::from(b)),
                    other => {
                        return Err(Error::corrupted(format!(
                            "{}: key `{}` holds {other:?}",
                            self.what, keys[i]
                        )))
                    }
                };
            }
        }
        Ok(out)
    }

    /// One [`CLEAR_GENERATIONS_SCRIPT`] call per call; on a cluster one
    /// [`CLEAR_GENERATIONS_CROSS_SLOT_SCRIPT`] per node, or per hash slot when the node
    /// script cannot be used.
    async fn clear_generations(&self, items: Vec<(String, u32)>) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let per_slot = |pos: &[usize]| Req::Cmd(clear_command(&items, pos, true));
        let per_node = |pos: &[usize]| Req::Cmd(clear_command(&items, pos, false));
        self.run_across_slots(items.iter().map(|(k, _)| k), &per_node, &per_slot)
            .await
    }

    /// One `UNLINK` (or `DEL`) per call, one per hash slot on a cluster.
    async fn delete(&self, keys: &[String]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let name = match self.options.delete {
            DeleteCommand::Unlink => "UNLINK",
            DeleteCommand::Del => "DEL",
        };
        let build = |pos: &[usize]| {
            let mut c = cmd_with(name, pos.len(), pos.iter().map(|&i| keys[i].len()).sum());
            for &i in pos {
                c.arg(&keys[i]);
            }
            Req::Cmd(c)
        };
        self.run(self.groups(keys.iter()), &build).await.map(|_| ())
    }

    /// One [`RAISE_GENERATIONS_SCRIPT`] call per call (per hash slot on a cluster).
    async fn raise_generations(
        &self,
        items: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        let mut out = vec![0u32; items.len()];
        if items.is_empty() {
            return Ok(out);
        }
        let ms = ttl.map_or(0, |t| t.as_millis().max(1) as u64).to_string();
        let build = |pos: &[usize]| {
            let chunk: Vec<&(String, u32)> = pos.iter().map(|&i| &items[i]).collect();
            self.with_wait(Req::Cmd(raise_command(&chunk, &ms)))
        };
        for (pos, v) in self
            .run(self.groups(items.iter().map(|(k, _)| k)), &build)
            .await?
        {
            let v = self.checked_wait(v)?;
            let redis::Value::Array(held) = v else {
                return Err(Error::corrupted(format!(
                    "{}: the generation script answered {v:?}",
                    self.what
                )));
            };
            if held.len() != pos.len() {
                return Err(Error::corrupted(format!(
                    "{}: the generation script answered {} values for {} keys",
                    self.what,
                    held.len(),
                    pos.len()
                )));
            }
            for (i, h) in pos.into_iter().zip(held) {
                out[i] = generation_held(&self.what, &items[i].0, h)?;
            }
        }
        Ok(out)
    }

    /// One pipeline per call (per node on a cluster): the cells' `MSET`s (or `SET PX`s), then
    /// the generation script for the generation keys among them (or, for a lone key without
    /// a TTL, `SET NX GET`), then `WAIT` if configured.
    /// A sample's generation key shares its cells' hash slot, so on a cluster each slot's
    /// cells and key go to the same node, in that order, on one connection.
    async fn mset_then_raise(
        &self,
        items: Vec<(String, KvValue)>,
        raise: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        let mut out = vec![0u32; raise.len()];
        if items.is_empty() && raise.is_empty() {
            return Ok(out);
        }
        let n = items.len();
        let per_call = self.options.max_keys_per_call.max(1);
        let px = ttl.map(|t| (t.as_millis().max(1) as u64).to_string());
        let raise_ms = ttl.map_or(0, |t| t.as_millis().max(1) as u64).to_string();
        // Positions below `n` are cells, the rest generation keys; cells first, in order.
        let split =
            |pos: &[usize]| -> (Vec<usize>, Vec<usize>) { pos.iter().partition(|&&i| i < n) };
        let cell_commands = |cells: usize| match px {
            None => cells.div_ceil(per_call),
            Some(_) => cells,
        };
        let build = |pos: &[usize]| {
            let (cells, gens) = split(pos);
            let mut cmds = write_commands(&items, &cells, px.as_deref(), per_call);
            if let ([i], None) = (gens.as_slice(), &px) {
                // One key (a slot's on a cluster): `SET NX GET` sets an absent key, which is
                // what a first write meets, at a fraction of a script call's cost; a key found
                // holding a smaller generation is raised by the script afterwards.
                let (k, g) = &raise[i - n];
                let mut c = cmd_with("SET", 4, k.len() + 9);
                c.arg(k)
                    .arg(&crate::codec::encode_generation(*g)[..])
                    .arg("NX")
                    .arg("GET");
                cmds.push(c);
                return self.with_wait(Req::Pipe(cmds));
            }
            for chunk in gens.chunks(per_call) {
                let chunk: Vec<&(String, u32)> = chunk.iter().map(|&i| &raise[i - n]).collect();
                cmds.push(raise_command(&chunk, &raise_ms));
            }
            self.with_wait(Req::Pipe(cmds))
        };
        let keys = items
            .iter()
            .map(|(k, _)| k.as_str())
            .chain(raise.iter().map(|(k, _)| k.as_str()));
        // Keys `SET NX GET` found holding a smaller generation: raised by the script after.
        let mut smaller: Vec<usize> = Vec::new();
        for (pos, reply) in self.run(self.groups(keys), &build).await? {
            let (cells, gens) = split(&pos);
            let commands = cell_commands(cells.len()) + gens.len().div_ceil(per_call);
            let reply = self.checked_wait(reply)?;
            // `checked_wait` unwraps a lone reply; without `WAIT` a pipeline's replies are an
            // array even for one command.
            let replies = match reply {
                _ if commands == 1 && self.options.wait_replicas > 0 => vec![reply],
                redis::Value::Array(r) if r.len() == commands => r,
                other => {
                    return Err(Error::corrupted(format!(
                        "{}: a put of {} cells and {} generation keys answered {other:?}",
                        self.what,
                        cells.len(),
                        gens.len()
                    )))
                }
            };
            let mut raised = replies.into_iter().skip(cell_commands(cells.len()));
            if let ([i], None) = (gens.as_slice(), &px) {
                let (key, want) = &raise[i - n];
                match raised.next() {
                    Some(redis::Value::Nil) => out[i - n] = *want,
                    Some(redis::Value::BulkString(b)) => {
                        let have = crate::codec::decode_generation(key, &b)?;
                        if have >= *want {
                            out[i - n] = have;
                        } else {
                            smaller.push(i - n);
                        }
                    }
                    other => {
                        return Err(Error::corrupted(format!(
                            "{}: SET NX GET of generation key `{key}` answered {other:?}",
                            self.what
                        )))
                    }
                }
                continue;
            }
            for (chunk, held) in gens.chunks(per_call).zip(raised) {
                let redis::Value::Array(held) = held else {
                    return Err(Error::corrupted(format!(
                        "{}: the generation script answered {held:?}",
                        self.what
                    )));
                };
                if held.len() != chunk.len() {
                    return Err(Error::corrupted(format!(
                        "{}: the generation script answered {} values for {} keys",
                        self.what,
                        held.len(),
                        chunk.len()
                    )));
                }
                for (&i, h) in chunk.iter().zip(held) {
                    out[i - n] = generation_held(&self.what, &raise[i - n].0, h)?;
                }
            }
        }
        if !smaller.is_empty() {
            let items = smaller.iter().map(|&r| raise[r].clone()).collect();
            let held = crate::store::KvStoreExt::raise_generations_all(self, items, ttl).await?;
            for (r, h) in smaller.into_iter().zip(held) {
                out[r] = h;
            }
        }
        Ok(out)
    }

    /// See [`ExpireCommand`]: pipelined `PEXPIRE`s or one [`EXPIRE_SCRIPT`] call per call (per
    /// hash slot on a cluster). Absent keys are fine either way (`PEXPIRE` answers 0).
    async fn expire(&self, keys: &[String], after: Duration) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let ms = (after.as_millis().max(1) as u64).to_string();
        let build = |pos: &[usize]| match self.options.expire {
            ExpireCommand::Pipeline => Req::Pipe(
                pos.iter()
                    .map(|&i| {
                        let mut c = cmd_with("PEXPIRE", 2, keys[i].len() + ms.len());
                        c.arg(&keys[i]).arg(ms.as_str());
                        c
                    })
                    .collect(),
            ),
            ExpireCommand::Script => {
                let bytes: usize = pos.iter().map(|&i| keys[i].len()).sum();
                let mut c = cmd_with("EVAL", pos.len() + 3, EXPIRE_SCRIPT.len() + 8 + bytes);
                c.arg(EXPIRE_SCRIPT).arg(pos.len());
                for &i in pos {
                    c.arg(&keys[i]);
                }
                c.arg(ms.as_str());
                Req::Cmd(c)
            }
        };
        self.run(self.groups(keys.iter()), &build).await.map(|_| ())
    }
}

/// The generation the raise script says `key` holds.
fn generation_held(what: &str, key: &str, reply: redis::Value) -> Result<u32> {
    match reply {
        redis::Value::Int(g) => u32::try_from(g)
            .map_err(|_| Error::corrupted(format!("{what}: generation key `{key}` holds {g}"))),
        other => Err(Error::corrupted(format!(
            "{what}: generation key `{key}`: script answered {other:?}"
        ))),
    }
}

/// The commands writing the cells at `pos` of `items`: one `MSET` per `per_call` cells, or
/// with a TTL (`px`, milliseconds) one `SET PX` per cell.
fn write_commands(
    items: &[(String, KvValue)],
    pos: &[usize],
    px: Option<&str>,
    per_call: usize,
) -> Vec<redis::Cmd> {
    match px {
        None => pos
            .chunks(per_call.max(1))
            .map(|chunk| {
                let bytes = chunk.iter().map(|&i| items[i].0.len() + items[i].1.len());
                let mut c = cmd_with("MSET", 2 * chunk.len(), bytes.sum());
                for &i in chunk {
                    c.arg(&items[i].0).arg(ValueArg(&items[i].1));
                }
                c
            })
            .collect(),
        Some(ms) => pos
            .iter()
            .map(|&i| {
                let (k, v) = &items[i];
                let mut c = cmd_with("SET", 4, k.len() + v.len() + 2 + ms.len());
                c.arg(k).arg(ValueArg(v)).arg("PX").arg(ms);
                c
            })
            .collect(),
    }
}

/// One [`RAISE_GENERATIONS_SCRIPT`] call for `items` (keys and generations), with the TTL
/// `ms` in milliseconds ("0": none).
fn raise_command(items: &[&(String, u32)], ms: &str) -> redis::Cmd {
    let bytes: usize = items.iter().map(|(k, _)| k.len() + 4).sum();
    let mut c = cmd_with(
        "EVAL",
        items.len() + 4,
        RAISE_GENERATIONS_SCRIPT.len() + 8 + ms.len() + bytes,
    );
    c.arg(RAISE_GENERATIONS_SCRIPT).arg(items.len());
    for (k, _) in items {
        c.arg(k);
    }
    c.arg(ms)
        .arg(packed_generations(items.iter().map(|(_, g)| g)));
    c
}

/// One generation clear of the keys at `pos` of `items`: [`CLEAR_GENERATIONS_SCRIPT`] with the
/// keys declared (`declared`: they share a slot, or the store is one node), else
/// [`CLEAR_GENERATIONS_CROSS_SLOT_SCRIPT`] with them as plain arguments. Either way the keys,
/// then the packed generations.
fn clear_command(items: &[(String, u32)], pos: &[usize], declared: bool) -> redis::Cmd {
    let (script, numkeys) = match declared {
        true => (CLEAR_GENERATIONS_SCRIPT, pos.len()),
        false => (CLEAR_GENERATIONS_CROSS_SLOT_SCRIPT, 0),
    };
    let bytes: usize = pos.iter().map(|&i| items[i].0.len() + 4).sum();
    let mut c = cmd_with("EVAL", pos.len() + 3, script.len() + 8 + bytes);
    c.arg(script).arg(numkeys);
    for &i in pos {
        c.arg(&items[i].0);
    }
    c.arg(packed_generations(pos.iter().map(|&i| &items[i].1)));
    c
}
