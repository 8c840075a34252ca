"""A bounded LRU map: the prefix index and the session map never grow past their configured size."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedLru(Generic[K, V]):
    """``OrderedDict`` with move-to-end on read and eviction of the oldest entry beyond ``max_entries``."""

    __slots__ = ("_data", "evictions", "max_entries")

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[K, V] = OrderedDict()
        self.evictions = 0

    def get(self, key: K) -> V | None:
        data = self._data
        value = data.get(key)
        if value is not None:
            data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        data = self._data
        data[key] = value
        data.move_to_end(key)
        while len(data) > self.max_entries:
            data.popitem(last=False)
            self.evictions += 1

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data
