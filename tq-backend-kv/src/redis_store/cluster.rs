//! Redis Cluster routing: hash slots, the slot map, and sending a call's per-slot requests as
//! one pipeline per node (or one cross-slot request per node), with the per-slot fallback
//! when the map is stale.

use super::*;

/// Slot ranges `(first, last)` and the primary `(host, port)` serving them.
pub(super) type SlotMap = Vec<(u16, u16, String, u16)>;

/// The Redis Cluster hash slot of `key` (CRC16/XMODEM of the hash tag, mod 16384).
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            key[open + 1..]
                .iter()
                .position(|&b| b == b'}')
                .filter(|&len| len > 0)
                .map(|len| &key[open + 1..open + 1 + len])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

impl RedisStore {
    /// Runs a request that may cover keys of many hash slots on one node (`per_node`, such as
    /// a script with the `allow-cross-slot-keys` flag): on a cluster one per node, the nodes in
    /// parallel; elsewhere, and whenever a node request fails (a slot moved, a failover), one
    /// `per_slot` request per group as [`Self::run`] sends them. Both must be idempotent: a
    /// node request that failed may have done part of its work. Under the call deadline.
    pub(super) async fn run_across_slots(
        &self,
        keys: impl Iterator<Item = impl AsRef<str>>,
        per_node: &Build<'_>,
        per_slot: &Build<'_>,
    ) -> Result<()> {
        let groups = self.groups(keys);
        self.within_deadline(async {
            if self.is_cluster() && groups.len() > 1 {
                let conn = self.cluster_conn().await?;
                if let Some(nodes) = self.merged_by_node(conn, &groups).await {
                    match self.run_by_node(conn, &nodes, per_node).await {
                        Ok(Some(_)) => return Ok(()),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "node request failed; sending per slot");
                            *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = None;
                        }
                    }
                }
            }
            self.run_untimed(groups, per_slot).await.map(|_| ())
        })
        .await
    }

    /// The cluster connection, made on first use.
    pub(super) async fn cluster_conn(&self) -> Result<&ClusterConnection> {
        let Conn::Cluster { client, conn } = &self.conn else {
            return Err(Error::internal(format!(
                "{}: a cluster connection asked of a single-node store",
                self.what
            )));
        };
        conn.get_or_try_init(|| async {
            client
                .get_async_connection()
                .await
                .map_err(|e| map_err(&self.what, e))
        })
        .await
    }

    /// Splits key positions `0..n` into groups a single command may cover: everything on a
    /// single node, one group per hash slot on a cluster.
    pub(super) fn groups(
        &self,
        keys: impl Iterator<Item = impl AsRef<str>>,
    ) -> Vec<(u16, Vec<usize>)> {
        match self.conn {
            Conn::Single { .. } => vec![(0, keys.enumerate().map(|(i, _)| i).collect())],
            Conn::Cluster { .. } => {
                let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
                for (i, k) in keys.enumerate() {
                    by_slot
                        .entry(key_slot(k.as_ref().as_bytes()))
                        .or_default()
                        .push(i);
                }
                by_slot.into_iter().collect()
            }
        }
    }

    /// The cluster's slot ranges and the primary serving each, from `CLUSTER SLOTS`; cached
    /// until a node pipeline fails (resharding, failover).
    pub(super) async fn slot_map(&self, conn: &ClusterConnection) -> Result<SlotMap> {
        if let Some(map) = self.slots.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(map);
        }
        let mut c = conn.clone();
        let reply = c
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            )
            .await
            .map_err(|e| map_err(&self.what, e))?;
        let bad = || Error::corrupted(format!("{}: unexpected CLUSTER SLOTS reply", self.what));
        let redis::Value::Array(ranges) = reply else {
            return Err(bad());
        };
        let mut map = Vec::with_capacity(ranges.len());
        for r in ranges {
            let redis::Value::Array(parts) = r else {
                return Err(bad());
            };
            let (
                Some(redis::Value::Int(start)),
                Some(redis::Value::Int(end)),
                Some(redis::Value::Array(primary)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                return Err(bad());
            };
            let host = match primary.first() {
                Some(redis::Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
                Some(redis::Value::SimpleString(h)) => h.clone(),
                _ => return Err(bad()),
            };
            let Some(redis::Value::Int(port)) = primary.get(1) else {
                return Err(bad());
            };
            map.push((*start as u16, *end as u16, host, *port as u16));
        }
        *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = Some(map.clone());
        Ok(map)
    }

    /// The indices of `groups` by the primary serving their slot, from the slot map; `None`
    /// when there is no usable map (it could not be fetched, or a slot is not in it).
    pub(super) async fn by_node(
        &self,
        conn: &ClusterConnection,
        groups: &[(u16, Vec<usize>)],
    ) -> Option<HashMap<(String, u16), Vec<usize>>> {
        let map = self.slot_map(conn).await.ok()?;
        let mut by_node: HashMap<(String, u16), Vec<usize>> = HashMap::new();
        for (g, (slot, _)) in groups.iter().enumerate() {
            let (_, _, host, port) = map.iter().find(|(a, b, _, _)| *a <= *slot && *slot <= *b)?;
            by_node.entry((host.clone(), *port)).or_default().push(g);
        }
        Some(by_node)
    }

    /// `groups` merged into one group per node (named by one of its slots, so that
    /// [`Self::run_by_node`] sends it to that node); `None` as for [`Self::by_node`].
    pub(super) async fn merged_by_node(
        &self,
        conn: &ClusterConnection,
        groups: &[(u16, Vec<usize>)],
    ) -> Option<Vec<(u16, Vec<usize>)>> {
        let by_node = self.by_node(conn, groups).await?;
        Some(
            by_node
                .into_values()
                .map(|members| {
                    let slot = groups[members[0]].0;
                    let pos = members.iter().flat_map(|&g| groups[g].1.iter().copied());
                    (slot, pos.collect())
                })
                .collect(),
        )
    }

    /// Cluster: sends the per-slot requests as one pipeline per node, nodes in parallel (one
    /// round trip per node instead of one per slot). Returns the replies of every request in
    /// order, or `None` when the slot map could not be used (then the caller sends per slot).
    pub(super) async fn run_by_node(
        &self,
        conn: &ClusterConnection,
        groups: &[(u16, Vec<usize>)],
        build: &Build<'_>,
    ) -> Result<Option<Vec<redis::Value>>> {
        let Some(by_node) = self.by_node(conn, groups).await else {
            return Ok(None);
        };
        let limit = self.options.max_concurrent_calls.max(1);
        let sends = by_node.into_iter().map(|((host, port), members)| {
            let reqs: Vec<Req> = members.iter().map(|&g| build(&groups[g].1)).collect();
            // Replies per request; `None` for a single command (its reply is not an array).
            let counts: Vec<Option<usize>> = reqs
                .iter()
                .map(|r| matches!(r, Req::Pipe(_)).then(|| r.replies()))
                .collect();
            let total: usize = reqs.iter().map(Req::replies).sum();
            let mut pipe = redis::Pipeline::with_capacity(total);
            for r in reqs {
                r.append_to(&mut pipe);
            }
            let mut c = conn.clone();
            async move {
                let replies = c
                    .route_pipeline(
                        pipe,
                        0,
                        total,
                        SingleNodeRoutingInfo::ByAddress { host, port },
                    )
                    .await?;
                Ok::<_, redis::RedisError>((members, counts, replies))
            }
        });
        let results: Vec<_> = futures::stream::iter(sends)
            .buffer_unordered(limit)
            .collect()
            .await;
        let mut out: Vec<redis::Value> = vec![redis::Value::Nil; groups.len()];
        for r in results {
            match r {
                Ok((members, counts, replies)) => {
                    // Errors inside a node pipeline come back as values; a command's error
                    // fails the call as it would on a single node.
                    if let Some(e) = replies
                        .iter()
                        .find(|v| matches!(v, redis::Value::ServerError(_)))
                    {
                        return Err(match e.clone().extract_error() {
                            Err(e) => map_err(&self.what, e),
                            Ok(_) => Error::internal(format!(
                                "{}: a server error reply did not convert to an error",
                                self.what
                            )),
                        });
                    }
                    let mut it = replies.into_iter();
                    for (g, n) in members.into_iter().zip(counts) {
                        out[g] = match n {
                            None => it.next().unwrap_or(redis::Value::Nil),
                            Some(n) => redis::Value::Array(it.by_ref().take(n).collect()),
                        };
                    }
                }
                Err(e) => {
                    // Slots moved (or a node failed): forget the map; the caller falls back to
                    // per-slot requests, which the cluster connection routes and redirects.
                    tracing::debug!(error = %e, "node pipeline failed; sending per slot");
                    *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    return Ok(None);
                }
            }
        }
        Ok(Some(out))
    }
}
