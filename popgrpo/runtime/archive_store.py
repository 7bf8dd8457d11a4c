"""Redis write-through for the archive: every accepted elite is in Redis before its status returns.

One Redis hash per archive, ``popgrpo:<run_key>:archive:<id>``, field = cell index, value =
the elite as float64 bytes ``[reward, behaviour…, idea…]``. A cell's field is overwritten
when its elite improves, so the hash always equals the archive. Restoring re-inserts every
elite, so an archive actor that dies loses nothing it had accepted.

The password comes from the URL (``redis://:PASSWORD@host:port/db``) or, when the URL has
none, from the ``POPGRPO_REDIS_PASSWORD`` environment variable of the driver; it is never
logged.
"""

from __future__ import annotations

import os
from typing import cast
from urllib.parse import urlsplit

import numpy as np
import redis

__all__ = ["PASSWORD_ENV", "RedisArchiveStore", "resolve_redis_password"]

PASSWORD_ENV = "POPGRPO_REDIS_PASSWORD"


def resolve_redis_password(url: str) -> str | None:
    """The password to use with ``url``: its own, else ``$POPGRPO_REDIS_PASSWORD``, else None."""
    return urlsplit(url).password or os.environ.get(PASSWORD_ENV) or None


class RedisArchiveStore:
    def __init__(self, url: str, run_key: str, password: str | None = None, behaviour_dim: int = 2) -> None:
        self.client = redis.Redis.from_url(url, password=password) if password else redis.Redis.from_url(url)
        self.client.ping()  # fail at start-up, not at the first elite
        self.prefix = f"popgrpo:{run_key}:archive"
        self.behaviour_dim = behaviour_dim

    def _key(self, archive_id: int) -> str:
        return f"{self.prefix}:{archive_id}"

    def write(
        self, archive_id: int, cells: np.ndarray, rewards: np.ndarray, behaviours: np.ndarray, ideas: np.ndarray
    ) -> None:
        """Write accepted elites in batch order; a later elite of a cell overwrites an earlier one."""
        if len(cells) == 0:
            return
        rows = np.concatenate(
            [
                np.asarray(rewards, dtype=np.float64)[:, None],
                np.asarray(behaviours, np.float64),
                np.asarray(ideas, np.float64),
            ],
            axis=1,
        )
        mapping = {}
        for cell, row in zip(np.asarray(cells).tolist(), rows, strict=True):
            mapping[cell] = row.tobytes()  # dict keeps the last elite per cell
        self.client.hset(self._key(archive_id), mapping=mapping)

    def replace(self, archive_id: int, elites: dict) -> None:
        """Make the hash equal ``elites`` (after a rollback or a resume)."""
        pipe = self.client.pipeline()
        pipe.delete(self._key(archive_id))
        if len(elites["reward"]):
            rows = np.concatenate([elites["reward"][:, None], elites["behaviour"], elites["idea"]], axis=1).astype(
                np.float64
            )
            pipe.hset(
                self._key(archive_id), mapping={int(c): r.tobytes() for c, r in zip(elites["cell"], rows, strict=True)}
            )
        pipe.execute()

    def read(self, archive_id: int) -> dict[str, np.ndarray]:
        """``cell, reward, behaviour, idea`` arrays of every stored elite."""
        # cast: redis types replies as bytes | str whatever decode_responses says; this client's are bytes.
        raw = cast(dict[bytes, bytes], self.client.hgetall(self._key(archive_id)))
        cells = np.array(sorted(int(c) for c in raw), dtype=np.int64)
        rows = np.stack([np.frombuffer(raw[str(c).encode()], dtype=np.float64) for c in cells]) if len(cells) else None
        b = self.behaviour_dim
        if rows is None:
            return {"cell": cells, "reward": np.zeros(0), "behaviour": np.zeros((0, b)), "idea": np.zeros((0, 0))}
        return {"cell": cells, "reward": rows[:, 0], "behaviour": rows[:, 1 : 1 + b], "idea": rows[:, 1 + b :]}
