"""``torch_tpu._internal.utils.annotations``: the lifecycle stage of a TorchTPU Python API, as
TorchTPU's API policy (``docs/developers/api_policy.md``) has its developers mark one.

``@experimental(reason)``, ``@stable(reason="")`` and ``@deprecated(version, reason)`` record the
stage on the function (``__tt_api_stage__``: ``"Experimental"``, ``"Stable"``,
``"Deprecated"``; ``__tt_stage_reason__``; ``__tt_deprecated_version__``) for tools that list a
package's APIs by stage. An experimental API warns once per process on its first call
(``UserWarning``), a deprecated one once (``DeprecationWarning``, naming the version and the
replacement); a stable one never warns and is returned unwrapped. A code base that marks its
own functions this way runs here with the same warnings.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["deprecated", "experimental", "stable"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _required(value: object, what: str, decorator: str, example: str = "") -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"@{decorator} requires a non-empty {what} string{example}.")
    return value


def _warn_once(func: _F, stage: dict[str, str], message: str, category: type[Warning]) -> _F:
    warned = False

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        if not warned:
            warned = True
            warnings.warn(message, category=category, stacklevel=2)
        return func(*args, **kwargs)

    for target in (func, wrapper):
        for key, value in stage.items():
            setattr(target, key, value)
    return wrapper  # type: ignore[return-value]


def experimental(reason: str) -> Callable[[_F], _F]:
    """Mark an API experimental: its first call in a process warns that it may change.

    Args:
        reason: why the API is experimental (non-empty).

    Returns:
        A decorator.

    Raises:
        ValueError: ``reason`` is empty.

    Example:
        >>> @experimental("the signature may change")
        ... def topk_fast(x): ...
    """
    _required(reason, "reason", "experimental")

    def decorate(func: _F) -> _F:
        name = getattr(func, "__name__", str(func))
        return _warn_once(func, {"__tt_api_stage__": "Experimental", "__tt_stage_reason__": reason},
                          f"{name} is experimental and subject to change: {reason}", UserWarning)

    return decorate


def stable(reason: str = "") -> Callable[[_F], _F]:
    """Mark an API stable: the stage is recorded, nothing warns, the function is unchanged.

    Args:
        reason: an optional note.

    Returns:
        A decorator.
    """

    def decorate(func: _F) -> _F:
        func.__tt_api_stage__ = "Stable"  # type: ignore[attr-defined]
        func.__tt_stage_reason__ = reason  # type: ignore[attr-defined]
        return func

    return decorate


def deprecated(version: str, reason: str) -> Callable[[_F], _F]:
    """Mark an API deprecated: its first call in a process warns, naming the version and the way out.

    Args:
        version: the TorchTPU version that deprecated it (``"2.13"``).
        reason: what to use instead, and when it goes.

    Returns:
        A decorator.

    Raises:
        ValueError: ``version`` or ``reason`` is empty.

    Example:
        >>> @deprecated("2.13", "use torch.accelerator.synchronize()")
        ... def sync(): ...
    """
    _required(version, "version", "deprecated", " (e.g. version='2.13')")
    _required(reason, "reason", "deprecated")

    def decorate(func: _F) -> _F:
        name = getattr(func, "__name__", str(func))
        stage = {"__tt_api_stage__": "Deprecated", "__tt_deprecated_version__": version,
                 "__tt_stage_reason__": reason}
        return _warn_once(func, stage, f"{name} is deprecated as of TorchTPU {version} and will be removed in a "
                          f"future release: {reason}", DeprecationWarning)

    return decorate
