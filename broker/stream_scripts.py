"""The Lua scripts of the queue streams (``broker.streams``), each with its contract.

Redis runs a script atomically; both are cluster-safe (every key they touch is in
KEYS, and a fleet's keys share its prefix's hash tag).
"""

from __future__ import annotations

# Why a script: XREADGROUP's COUNT applies to each stream separately, so one call
# over k streams can hand this consumer up to k * COUNT entries, more than the free
# slots the caller has. The script reads the streams in priority order (every
# recovery lane, then every normal lane), taking only what is still missing, atomically.
READ_SCRIPT = """
--[[ runfleet: deliver at most ARGV[3] new entries across streams, in priority order.
KEYS[1..n] = streams ({prefix}:recovery:{queue} lanes, then {prefix}:q:{queue}), highest
             priority first
ARGV[1]    = consumer group name
ARGV[2]    = consumer name
ARGV[3]    = maximum number of entries to deliver in total (>= 1)
Returns    { entries, tails }
  entries  = list of { index into KEYS (1-based), entry id, { field, value, ... } }
  tails    = per KEYS[i], the id of its newest entry ("0-0" if empty); a caller that
             got no entries waits (XREAD BLOCK) for anything newer than these ids.
Errors     NOGROUP when a stream or its group is missing; the caller recreates both.
]]
local remaining = tonumber(ARGV[3])
local entries = {}
local tails = {}
for i, key in ipairs(KEYS) do
  if remaining > 0 then
    local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2],
                             'COUNT', remaining, 'STREAMS', key, '>')
    if reply then
      for _, entry in ipairs(reply[1][2]) do
        entries[#entries + 1] = { i, entry[1], entry[2] }
        remaining = remaining - 1
      end
    end
  end
  local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  if newest[1] then tails[i] = newest[1][1] else tails[i] = '0-0' end
end
return { entries, tails }
"""

# Why a script for many messages: one XADD per run costs a producer's enqueue_many and a
# worker's wake batch a command each to pack, send and parse (redis-py packs in Python);
# one script call per stream carries the whole batch, appended in order, atomically.
PUBLISH_SCRIPT = """
--[[ runfleet: append each of ARGV[3..n] to the stream KEYS[1] as one entry, in order.
ARGV[1]    = approximate MAXLEN of the stream
ARGV[2]    = the entry's one field name
ARGV[3..n] = the entries' values (encoded messages)
Returns    the new entries' ids, in order
]]
local ids = {}
for i = 3, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', ARGV[2], ARGV[i])
end
return ids
"""

# Why a script for a sweep's wakes: the dispatch must know whether the group will deliver
# what it appended (a group moved past the stream's ids takes every append and delivers
# none: broker.stream_health). Read after the append in a second round trip, an idle
# reader's doorbell could take the entry in between and make it look passed; inside the
# script nothing runs between the appends and the reading.
PUBLISH_CHECKED_SCRIPT = """
--[[ runfleet: append each of ARGV[4..n] to the stream KEYS[1], then read its group.
ARGV[1]    = approximate MAXLEN of the stream
ARGV[2]    = the consumer group name
ARGV[3]    = the entry's one field name
ARGV[4..n] = the entries' values (encoded messages)
Returns    { ids, delivered }
  ids       = the new entries' ids, in order
  delivered = the group's last delivered id after the appends ('' without the group: the
              next read recreates it from id 0 and delivers everything)
]]
local ids = {}
for i = 4, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', ARGV[3], ARGV[i])
end
local delivered = ''
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, last = nil, nil
  for j = 1, #group, 2 do
    if group[j] == 'name' then name = group[j + 1] end
    if group[j] == 'last-delivered-id' then last = group[j + 1] end
  end
  if name == ARGV[2] then delivered = last end
end
return { ids, delivered }
"""
