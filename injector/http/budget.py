"""A budget of bytes that admission requests may hold at once in one process.

Why: a body is held while it is read and grows several times once parsed; without a bound, many
large requests at once (or slow ones) take the process past its memory limit. A request takes its
share before reading (by Content-Length) and gives it back when answered; one that cannot get it
within `wait` seconds is refused with 429, so the API server retries it later.
"""

from __future__ import annotations

import asyncio
from collections import deque


class BudgetExhausted(Exception):
    """The bytes could not be had within the wait."""


class ByteBudget:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a byte budget needs a positive capacity")
        self.capacity = capacity
        self.available = capacity
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def take(self, amount: int, *, wait: float) -> int:
        """Take `amount` bytes (at most the capacity); raises BudgetExhausted after `wait` seconds."""
        amount = min(max(amount, 0), self.capacity)
        if not self._waiters and self.available >= amount:
            self.available -= amount
            return amount
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (amount, future)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(future, wait)
        except TimeoutError:
            raise BudgetExhausted(f"{amount} bytes were not free within {wait:g}s") from None
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
        return amount

    def give(self, amount: int) -> None:
        self.available = min(self.capacity, self.available + amount)
        while self._waiters and self._waiters[0][0] <= self.available:
            want, future = self._waiters.popleft()
            if future.done():  # timed out meanwhile
                continue
            self.available -= want
            future.set_result(None)
