//! The Lua scripts the Redis store runs. Each is sent with `EVAL` (the bodies are short and
//! the server caches them by SHA1, so there is no `NOSCRIPT` to handle after a restart or on a
//! new cluster node).

/// The Lua script of [`ExpireCommand::Script`](super::ExpireCommand::Script): `PEXPIRE` of
/// every key in `KEYS` by `ARGV[1]` milliseconds. No shebang, so it runs on Redis before 7.0
/// too.
pub const EXPIRE_SCRIPT: &str =
    "for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end return #KEYS";

/// Raises generation keys atomically (one script run is atomic on the server): `KEYS` are the
/// generation keys of one call (one hash slot on a cluster), `ARGV[1]` the TTL in ms (`0`:
/// none), `ARGV[2]` the generation for each key packed as the keys store it (4 bytes little
/// endian per key, in `KEYS` order). A key keeps a larger generation; the reply lists the
/// generation each key holds afterwards.
///
/// One `MGET` per 500 keys and, without a TTL, one `MSET` (`SET .. PX` per key with one, as
/// Redis has no multi-key set with a deadline). Each key is named once per call (see
/// [`KvStore::raise_generations`](crate::KvStore::raise_generations)). For 256 keys on a
/// single node this took 0.26-0.30 ms of server time where a `GET` and a `SET` per key with
/// one argument per generation took 0.45-0.47 ms (a raw `MSET` of the same keys: 0.18-0.31
/// ms; one noisy run).
pub const RAISE_GENERATIONS_SCRIPT: &str = "\
local ttl = tonumber(ARGV[1]) \
local g = ARGV[2] \
local n = #KEYS \
local out = {} \
local i = 1 \
while i <= n do \
  local j = math.min(i + 499, n) \
  local cur = redis.call('MGET', unpack(KEYS, i, j)) \
  local set = {} \
  for x = i, j do \
    local want = struct.unpack('<I4', g, 4 * x - 3) \
    local v = cur[x - i + 1] \
    local have = -1 \
    if v then have = struct.unpack('<I4', v) end \
    if have > want then \
      out[x] = have \
    else \
      out[x] = want \
      if ttl > 0 then redis.call('SET', KEYS[x], string.sub(g, 4 * x - 3, 4 * x), 'PX', ttl) \
      else set[#set + 1] = KEYS[x] set[#set + 1] = string.sub(g, 4 * x - 3, 4 * x) end \
    end \
  end \
  if #set > 0 then redis.call('MSET', unpack(set)) end \
  i = j + 1 \
end \
return out";

/// Deletes generation keys atomically unless a newer sample raised them: `KEYS` are the
/// generation keys of one call (one hash slot on a cluster); `ARGV[1]` packs the largest
/// generation each key may hold to be deleted, 4 bytes little endian per key, in `KEYS` order
/// (as `packed_generations` builds it).
///
/// One `MGET` and one `DEL` per 1000 keys (`unpack` has a stack limit) rather than a `GET` and a
/// `DEL` per key, and one packed argument rather than one per key: for 256 keys on a single
/// node the per-key form took 0.31 ms of server time and this one 0.16 ms (a raw `UNLINK` of
/// the same keys: 0.09 ms); passing a Lua string per argument is most of the difference.
pub const CLEAR_GENERATIONS_SCRIPT: &str = "\
local n = #KEYS \
local i = 1 \
while i <= n do \
  local j = math.min(i + 999, n) \
  local cur = redis.call('MGET', unpack(KEYS, i, j)) \
  local gone = {} \
  for x = i, j do \
    local v = cur[x - i + 1] \
    if v and struct.unpack('<I4', v) <= struct.unpack('<I4', ARGV[1], 4 * x - 3) then \
      gone[#gone + 1] = KEYS[x] \
    end \
  end \
  if #gone > 0 then redis.call('DEL', unpack(gone)) end \
  i = j + 1 \
end \
return 0";

/// [`CLEAR_GENERATIONS_SCRIPT`] for keys of many hash slots served by one cluster node: no
/// `KEYS` (declared keys must share a slot); `ARGV` holds the keys, then the packed
/// generations. The `allow-cross-slot-keys` flag (Redis 7.0) lets it touch keys of every slot
/// the node serves; a key the node does not serve (a slot moved) fails the script, and the call
/// then goes per slot. A multi-key `MGET` may not span slots even here, hence a `GET` per key.
/// Replacing the ~85 per-slot scripts a node ran for 256 samples, it took 0.10 ms of server
/// time instead of 0.33 ms (85 pipelined single-key `UNLINK`s: 0.05 ms).
pub const CLEAR_GENERATIONS_CROSS_SLOT_SCRIPT: &str = "#!lua flags=allow-cross-slot-keys\n\
local n = #ARGV - 1 \
local g = ARGV[n + 1] \
for x = 1, n do \
  local v = redis.call('GET', ARGV[x]) \
  if v and struct.unpack('<I4', v) <= struct.unpack('<I4', g, 4 * x - 3) then \
    redis.call('DEL', ARGV[x]) \
  end \
end \
return 0";

/// Generations as one script argument: 4 bytes little endian each (as generation keys hold
/// them, `codec::encode_generation`).
pub(super) fn packed_generations<'a>(gens: impl Iterator<Item = &'a u32>) -> Vec<u8> {
    gens.flat_map(|g| g.to_le_bytes()).collect()
}
