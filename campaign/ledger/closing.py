"""A base for objects that hold database resources and release them in ``close()``."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """``with obj:`` calls ``obj.close()`` on the way out, error or not."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
