"""Fault injection: a seam FOR TESTS ONLY.

Production code calls :func:`check` at the few places where the field's faults strike: the backend
contract (a model's run, the Vulkan device's allocations and fence waits) and the package/cache file
I/O (writes of packages and the pipeline cache, reads of weights stores). Unless the process was
started with ``INFERD_TESTING=1`` *and* ``INFERD_FAULTS`` set, :func:`check` is one test of a
module-level bool: nothing is parsed, counted or raised.

``INFERD_FAULTS`` is a comma-separated list of ``SITE:KIND@N`` or ``SITE:KIND@N/EVERY`` rules:
the Nth call at SITE (counting from 1) fails with KIND, and with ``/EVERY`` again every EVERY calls
after that (``@3/5``: calls 3, 8, 13, ...). ``*N`` after the rule bounds the number of faults
(``backend.run:device_lost@2/4*100``: 100 faults, then the site works again).

Sites: ``backend.run`` (a model's run, CPU or Vulkan), ``backend.load`` (building a model's backend:
allocations at load), ``vulkan.alloc`` (``VulkanDevice.allocate_region``), ``vulkan.fence``
(``VulkanDevice.wait_fence``), ``cache.write`` (package and pipeline cache writes), ``cache.read``
(weights store reads).

Kinds: ``device_lost``, ``oom`` (out of device memory), ``timeout`` (a fence that never signals),
``enospc``, ``eio``, ``erofs`` (the last three as ``OSError`` with that errno).
"""
from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass

from .errors import DeviceLostError, DeviceOutOfMemoryError, DeviceTimeoutError

SITES = ("backend.run", "backend.load", "vulkan.alloc", "vulkan.fence", "cache.write", "cache.read")
KINDS = ("device_lost", "oom", "timeout", "enospc", "eio", "erofs")


@dataclass
class Rule:
    site: str
    kind: str
    first: int
    every: int = 0
    limit: int = 0  # 0: no bound
    fired: int = 0

    def due(self, n: int) -> bool:
        if self.limit and self.fired >= self.limit:
            return False
        if n == self.first:
            return True
        return self.every > 0 and n > self.first and (n - self.first) % self.every == 0


def parse(spec: str) -> list[Rule]:
    """The rules of an ``INFERD_FAULTS`` value; ValueError naming the bad part."""
    rules = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        try:
            site, rest = part.split(":", 1)
            kind, when = rest.split("@", 1)
            limit = 0
            if "*" in when:
                when, lim = when.split("*", 1)
                limit = int(lim)
            first, _, every = when.partition("/")
            rule = Rule(site.strip(), kind.strip(), int(first), int(every or 0), limit)
        except ValueError:
            raise ValueError(f"INFERD_FAULTS: {part!r} is not SITE:KIND@N[/EVERY][*LIMIT]") from None
        if rule.site not in SITES:
            raise ValueError(f"INFERD_FAULTS: unknown site {rule.site!r}; known: {list(SITES)}")
        if rule.kind not in KINDS:
            raise ValueError(f"INFERD_FAULTS: unknown kind {rule.kind!r}; known: {list(KINDS)}")
        if rule.first < 1 or rule.every < 0 or rule.limit < 0:
            raise ValueError(f"INFERD_FAULTS: {part!r}: N must be >= 1, EVERY and LIMIT >= 0")
        rules.append(rule)
    return rules


def make_error(kind: str, site: str) -> BaseException:
    what = f"injected fault at {site}"
    if kind == "device_lost":
        return DeviceLostError(f"VK_ERROR_DEVICE_LOST ({what})")
    if kind == "oom":
        return DeviceOutOfMemoryError(f"VK_ERROR_OUT_OF_DEVICE_MEMORY ({what})", asked=1 << 20, free=0)
    if kind == "timeout":
        return DeviceTimeoutError(f"the GPU did not finish within the timeout ({what})")
    code = {"enospc": errno.ENOSPC, "eio": errno.EIO, "erofs": errno.EROFS}[kind]
    return OSError(code, f"{os.strerror(code)} ({what})")


_lock = threading.Lock()
_rules: list[Rule] = []
_counts: dict[str, int] = {}
enabled = False


def configure(spec: str | None) -> None:
    """Install the rules of ``spec`` (None or "": none) and reset the call counts."""
    global enabled, _rules
    rules = parse(spec) if spec else []
    with _lock:
        _rules = rules
        _counts.clear()
        enabled = bool(rules)


def check(site: str) -> None:
    """Raise the injected fault when the current call at ``site`` is due one (tests only)."""
    if not enabled:
        return
    with _lock:
        n = _counts.get(site, 0) + 1
        _counts[site] = n
        for r in _rules:
            if r.site == site and r.due(n):
                r.fired += 1
                raise make_error(r.kind, site)


def fired() -> dict[str, int]:
    """Faults raised so far per ``site:kind`` (status shows it while the seam is on)."""
    with _lock:
        out: dict[str, int] = {}
        for r in _rules:
            key = f"{r.site}:{r.kind}"
            out[key] = out.get(key, 0) + r.fired
        return out


def from_environ(environ: "os._Environ[str] | dict[str, str] | None" = None) -> None:
    """Read ``INFERD_FAULTS``, only when ``INFERD_TESTING=1`` (the test flag) is set too."""
    env = os.environ if environ is None else environ
    if env.get("INFERD_TESTING") == "1" and env.get("INFERD_FAULTS"):
        configure(env["INFERD_FAULTS"])


from_environ()
