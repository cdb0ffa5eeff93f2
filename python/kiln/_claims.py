"""_claims.py — which wrapper planned last over each byte range of the float workspaces (the
guard that makes run() raise when another wrapper's plan overwrote its schedule)."""

import threading
import weakref


class _WorkspaceClaims:
    """Which wrapper planned last over each byte range of the float workspaces. A kiln plan
    keeps its schedule in its workspace, so once another wrapper has planned over a wrapper's
    range, that wrapper's run() would launch on the other's schedule: it raises instead
    (FlashInfer's wrappers may share one float workspace; kiln's may not). Owners are held
    weakly: a wrapper that is gone claims nothing. Captured CUDA graphs replay without run():
    a graph whose workspace another wrapper plans over is not caught here. `generation`
    counts the claims made: a run that saw no claim since its last check skips the scan."""

    def __init__(self):
        self._lock = threading.Lock()
        self.generation = 0
        self._claims = weakref.WeakKeyDictionary()  # owner -> (device, start, end, generation)

    def claim(self, owner, device, start, nbytes):
        """owner planned into [start, start + nbytes) of device's memory, after every claim
        made so far."""
        with self._lock:
            if self._claims.get(owner) == (device, start, start + nbytes, self.generation):
                return  # owner's claim is already the newest: nothing changes
            self.generation += 1
            self._claims[owner] = (device, start, start + nbytes, self.generation)

    def overtaken_by(self, owner):
        """The wrapper that planned over owner's range after owner did, or None."""
        with self._lock:
            mine = self._claims.get(owner)
            if mine is None:
                return None
            dev, a, b, g = mine
            for other, (d2, a2, b2, g2) in self._claims.items():
                if other is not owner and d2 == dev and g2 > g and a2 < b and a < b2:
                    return other
        return None


_CLAIMS = _WorkspaceClaims()  # the process-wide claims every wrapper records into
