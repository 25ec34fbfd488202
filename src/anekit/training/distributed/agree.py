"""``agree``: the ranks of a run compare what must be the same on all of them before any step.

Every rank sends its fields (a canonical JSON of name -> value, in the order given) to every other
(``all_gather_bytes``); each rank then finds the first field, in rank 0's order, whose value is not the
same on every rank, and raises one line naming it, the ranks and both values (shortened). Every rank
sees the same records, so every rank refuses, with the same line, or none does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from anekit.training.distributed.transport import DistributedError, Transport

SHOWN = 24  # characters of a value the line shows (sha256s are told apart by their start)
MISSING = "(no such field)"


def _short(value: str) -> str:
    return repr(value) if len(value) <= SHOWN else repr(value[: SHOWN - 3] + "...")


def _decode(record: bytes, rank: int, what: str) -> dict[str, str]:
    try:
        pairs = json.loads(record.decode("utf-8"))
        return {str(k): str(v) for k, v in pairs}
    except (UnicodeDecodeError, ValueError, TypeError) as e:
        raise DistributedError(
            f"[distributed] {what}: rank {rank} sent a record that is not a field list ({e})"
        ) from None


def agree(transport: Transport, fields: Mapping[str, str], what: str) -> None:
    """Return when every rank gave the same ``fields``; else raise DistributedError naming the first field
    that differs, the ranks and their values (module docstring)."""
    mine = json.dumps(
        [[str(k), str(v)] for k, v in fields.items()], ensure_ascii=False, separators=(",", ":")
    )
    records = transport.all_gather_bytes(mine.encode("utf-8"), what)
    tables = [_decode(r, i, what) for i, r in enumerate(records)]
    names = list(tables[0]) + [n for t in tables[1:] for n in t if n not in tables[0]]
    for name in names:
        first = tables[0].get(name, MISSING)
        for rank, table in enumerate(tables[1:], start=1):
            value = table.get(name, MISSING)
            if value != first:
                raise DistributedError(
                    f"[distributed] {what}: the ranks differ in {name}: rank 0 has {_short(first)}, "
                    f"rank {rank} has {_short(value)}; every rank must run the same job"
                )
