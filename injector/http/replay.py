"""Answering a repeated admission request without redoing the work.

A ReplicaSet scaling up, a rollout, a Job with parallelism: the API server sends the same pod,
byte for byte, many times in a row; only the AdmissionReview's `request.uid` differs. For such a
request the answer is a pure function of the body and the store snapshot, so it is kept, keyed
by the body with its uid blanked and by the snapshot version, and replayed with the new uid
spliced in. That skips JSON parsing, the engine and response encoding.

Bounded in size and in time: an entry lives `ttl` seconds, so the `updateTimestamp` recorded in a
replayed hash annotation is at most that old. Only bodies whose AdmissionReview opens the way the
API server writes it (`kind`, `apiVersion`, then `request` with `uid` first) are replayed; any
other shape simply takes the full path.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

_HEAD = re.compile(
    rb'\A\{"(?:kind":"AdmissionReview","apiVersion|apiVersion":"admission\.k8s\.io/v1(?:beta1)?","kind)'
    rb'":"[^"]+","request":\{"uid":"([0-9A-Za-z-]{1,64})"'
)


@dataclass(frozen=True, slots=True)
class Entry:
    before: bytes  # response bytes up to the uid
    after: bytes  # response bytes after the uid
    result: str  # metrics label of the original answer
    version: int
    expires: float


def request_key(body: bytes) -> tuple[bytes, str] | None:
    """(digest of the body without its uid, the uid), or None when the body is not replayable."""
    m = _HEAD.match(body)
    if m is None:
        return None
    start, end = m.span(1)
    digest = hashlib.blake2b(body[:start], digest_size=16)
    digest.update(body[end:])
    return digest.digest(), m.group(1).decode()


class ReplayCache:
    def __init__(self, *, ttl: float = 1.0, max_entries: int = 512, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()
        self.hits = 0

    def get(self, key: bytes, uid: str, version: int) -> tuple[str, bytes] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.version != version or entry.expires < self.clock():
            del self._entries[key]
            return None
        self.hits += 1
        return entry.result, entry.before + uid.encode() + entry.after

    def put(self, key: bytes, uid: str, version: int, result: str, response: bytes) -> None:
        marker = b'"uid":"' + uid.encode() + b'"'
        at = response.find(marker)
        if at < 0 or response.find(marker, at + 1) >= 0:
            return  # the uid must appear exactly once to be replaced safely
        at += len(b'"uid":"')
        self._entries[key] = Entry(response[:at], response[at + len(uid) :], result, version, self.clock() + self.ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
