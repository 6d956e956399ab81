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
            self.with_wait(match &ms {
                None => {
                    let bytes = pos.iter().map(|&i| items[i].0.len() + items[i].1.len());
                    let mut c = cmd_with("MSET", 2 * pos.len(), bytes.sum());
                    for &i in pos {
                        c.arg(&items[i].0).arg(ValueArg(&items[i].1));
                    }
                    Req::Cmd(c)
                }
                Some(ms) => Req::Pipe(
                    pos.iter()
                        .map(|&i| {
                            let (k, v) = &items[i];
                            let mut c = cmd_with("SET", 4, k.len() + v.len() + 2 + ms.len());
                            c.arg(k).arg(ValueArg(v)).arg("PX").arg(ms.as_str());
                            c
                        })
                        .collect(),
                ),
            })
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

    /// One [`CLEAR_GENERATIONS_SCRIPT`] call per call (per hash slot on a cluster).
    async fn clear_generations(&self, items: Vec<(String, u32)>) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let build = |pos: &[usize]| {
            let bytes: usize = pos.iter().map(|&i| items[i].0.len() + 10).sum();
            let mut c = cmd_with(
                "EVAL",
                2 * pos.len() + 2,
                CLEAR_GENERATIONS_SCRIPT.len() + 8 + bytes,
            );
            c.arg(CLEAR_GENERATIONS_SCRIPT).arg(pos.len());
            for &i in pos {
                c.arg(&items[i].0);
            }
            for &i in pos {
                c.arg(items[i].1);
            }
            Req::Cmd(c)
        };
        self.run(self.groups(items.iter().map(|(k, _)| k)), &build)
            .await
            .map(|_| ())
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
            let bytes: usize = pos.iter().map(|&i| items[i].0.len() + 10).sum();
            let mut c = cmd_with(
                "EVAL",
                2 * pos.len() + 3,
                RAISE_GENERATIONS_SCRIPT.len() + 8 + bytes,
            );
            c.arg(RAISE_GENERATIONS_SCRIPT).arg(pos.len());
            for &i in pos {
                c.arg(&items[i].0);
            }
            c.arg(ms.as_str());
            for &i in pos {
                c.arg(items[i].1);
            }
            self.with_wait(Req::Cmd(c))
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
                out[i] = match h {
                    redis::Value::Int(g) => u32::try_from(g).map_err(|_| {
                        Error::corrupted(format!(
                            "{}: generation key `{}` holds {g}",
                            self.what, items[i].0
                        ))
                    })?,
                    other => {
                        return Err(Error::corrupted(format!(
                            "{}: generation key `{}`: script answered {other:?}",
                            self.what, items[i].0
                        )))
                    }
                };
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
