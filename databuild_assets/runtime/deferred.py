"""Modules imported on their first use rather than with the module that names them.

A `databuild-assets query` on a key the serving index holds reads SQLite only, yet the modules
of the Delta backend name pyarrow and deltalake at their top (with numpy behind them), and their
import was a large share of such a call (docs/decisions/0057). A module names them through
`deferred`, and the first attribute read imports them.

    pa = deferred("pyarrow")
    pa.table({"a": [1]})  # pyarrow is imported here
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _Deferred(ModuleType):
    """A stand-in for module `name`: an attribute not yet copied is read from the module,
    imported then (a submodule, such as deltalake.exceptions, too), and every attribute the
    module has then is copied, so that later reads are plain ones."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        module = importlib.import_module(self.__name__)
        if not hasattr(module, attribute):
            try:
                importlib.import_module(f"{self.__name__}.{attribute}")
            except ModuleNotFoundError:
                raise AttributeError(f"module {self.__name__!r} has no attribute {attribute!r}") from None
        # A copy first: another thread's first import of a submodule adds to the module meanwhile.
        names = dict(vars(module))
        self.__dict__.update({key: value for key, value in names.items() if not key.startswith("__")})
        return getattr(module, attribute)


def deferred(name: str) -> ModuleType:
    """Module `name`, imported on the first read of one of its attributes."""
    return _Deferred(name)


__all__ = ["deferred"]
