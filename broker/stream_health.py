"""Queue streams checked, not trusted: what a Redis client did to a lane, and its repair.

Any client with write access to Redis can leave a queue's lane unable to deliver: a
consumer group whose last delivered id is ahead of its stream's last id (``XGROUP SETID``
to a future id, a group recreated there) delivers nothing until the stream's ids pass it,
which may be never; a group destroyed, a stream deleted or flushed, or a key of another
type at the stream's name (``SET``) refuse every read. Workers look at their lanes every
sweep tick (``worker.wake_marks``) and repair what they find with one script that checks
and mends atomically, so a lane a reader moved on meanwhile is never moved back by a
stale reading. ``runfleet doctor`` asks the same script, read-only, to name a stranded
queue.

A repair loses nothing durable: entries skipped by rewinding a group to its stream's last
id are wakes, and the lost-wake sweep dispatches again every run they named (Postgres
decides; Redis hints). A rewind to an id the caller saw delivered before the fault redelivers
what the fault hid at once instead; redelivery is harmless (the claim is a CAS).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from redis.asyncio import Redis

from runfleet.broker.keys import GROUP

# Why a script: the check and the repair must see the same state. A group that is ahead
# in a reading taken now may have been repaired and moved on by another worker a moment
# later; a SETID computed from the old reading would move it back (duplicates only, but
# every one a claim). Inside a script nothing else runs between them.
HEALTH_SCRIPT = """
--[[ runfleet: check one queue lane, and repair it unless ARGV[3] is '0'.
KEYS[1]  = the lane's stream
ARGV[1]  = the consumer group name
ARGV[2]  = an id to rewind a group that is ahead to, used only if not past the stream's
           last id ('' = none: the stream's last id)
ARGV[3]  = '1' to repair, '0' to only check
Returns  { fault, delivered, written, found }
  fault     = '' (deliverable), 'missing' (no key), 'no-group', 'group-ahead', 'wrong-type'
  delivered = the group's last delivered id before any repair ('' without a group)
  written   = the stream's last generated id ('' unless a stream)
  found     = the key's type, and after a repair the id the group now starts from
Repairs  missing, no-group: XGROUP CREATE ... 0 MKSTREAM (every entry left is delivered);
         wrong-type: DEL, then the same; group-ahead: XGROUP SETID to min(ARGV[2], written).
]]
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then ms, seq = id, '0' end
  return ms, seq
end
local function cmp_num(a, b)  -- decimal strings without leading zeros, any length
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end
local function cmp(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  local c = cmp_num(ams, bms)
  if c ~= 0 then return c end
  return cmp_num(aseq, bseq)
end
local function field(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
  return nil
end
local repair = ARGV[3] ~= '0'
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  if repair then redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM') end
  return { 'missing', '', '', repair and '0-0' or kind }
end
if kind ~= 'stream' then
  if repair then
    redis.call('DEL', KEYS[1])
    redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
  end
  return { 'wrong-type', '', '', kind }
end
local written = field(redis.call('XINFO', 'STREAM', KEYS[1]), 'last-generated-id')
local delivered = nil
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  if field(group, 'name') == ARGV[1] then delivered = field(group, 'last-delivered-id') end
end
if not delivered then
  if repair then redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0') end
  return { 'no-group', '', written, '0-0' }
end
if cmp(delivered, written) > 0 then
  local target = written
  if ARGV[2] ~= '' and cmp(ARGV[2], written) <= 0 then target = ARGV[2] end
  if repair then redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], target) end
  return { 'group-ahead', delivered, written, target }
end
return { '', delivered, written, '' }
"""


class Fault(enum.StrEnum):
    """What keeps a lane from delivering what is written to it."""

    MISSING = "missing"
    """No key at the stream's name (deleted, flushed, or never written)."""
    NO_GROUP = "no-group"
    """A stream without the ``workers`` group (``XGROUP DESTROY``)."""
    GROUP_AHEAD = "group-ahead"
    """The group's last delivered id is past the stream's last id: nothing written up to
    that id is ever delivered (``XGROUP SETID`` or ``CREATE`` at a future id)."""
    WRONG_TYPE = "wrong-type"
    """Another type of key at the stream's name: every read and write fails."""

    @property
    def strands(self) -> bool:
        """Whether the fault stops wakes even while workers read. A missing stream or
        group does not: the next read recreates both from id 0 (every entry left is
        delivered), and a producer's first append makes a stream before any worker made
        its group."""
        return self in (Fault.GROUP_AHEAD, Fault.WRONG_TYPE)


@dataclass(frozen=True, slots=True)
class LaneHealth:
    """One lane as the script found it (and, when asked to, left it)."""

    key: str
    fault: Fault | None
    delivered: str
    """The group's last delivered id before any repair ('' without a group)."""
    written: str
    """The stream's last generated id ('' unless the key is a stream)."""
    found: str
    """The key's type for ``wrong-type``; after a repair, the id the group starts from."""


class StreamHealth:
    """Checks (and repairs) queue lanes with ``HEALTH_SCRIPT``."""

    def __init__(self, redis: Redis) -> None:
        self._script = redis.register_script(HEALTH_SCRIPT)

    async def check(self, key: str) -> LaneHealth:
        """How the lane at ``key`` stands; changes nothing (``runfleet doctor``)."""
        return await self._call(key, "", repair=False)

    async def repair(self, key: str, rewind_to: str = "") -> LaneHealth:
        """Check the lane at ``key`` and repair it if needed, atomically.

        ``rewind_to``: a group ahead of its stream goes back to this id if it is not past
        the stream's last id (an id the caller saw delivered before the fault: what the
        fault hid is delivered again at once), else to the stream's last id.
        """
        return await self._call(key, rewind_to, repair=True)

    async def _call(self, key: str, rewind_to: str, *, repair: bool) -> LaneHealth:
        reply = await self._script(keys=[key], args=[GROUP, rewind_to, "1" if repair else "0"])
        fault, delivered, written, found = (_text(v) for v in reply)
        return LaneHealth(key, Fault(fault) if fault else None, delivered, written, found)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
