"""clocks.py — the GPU's SM clock, power draw and throttle reasons while a timing runs.

A figure measured at a capped clock is not the figure of the same kernel at full clock: on
session 57's H100 the long prefills drew 700-800 W against a 700 W limit and ran at
1215-1710 MHz, not 1980, with the software power cap active the whole time. So the referee and
ab.py say beside each GPU time what the clock was: `nvidia-smi -lms` runs in a background process
for the whole run, a thread stamps each sample with the host's clock as it arrives, and
`window(t0, t1)` summarises the samples taken while one timing ran.

    s = Sampler(); s.start()
    t0 = time.time(); ...timing...; t1 = time.time()
    s.window(t0, t1)  # {'sm_mhz': 1552, 'power_w': 741, 'power_capped': 1.0, 'samples': 18} or {}

No nvidia-smi, or a query it refuses, leaves the sampler empty: every window is {} and the
figures go out without a clock (start() returns the reason). A timing shorter than the sample
period gets {} too: a decode step's 20 µs is not resolved, a prefill's seconds are.
"""
import os
import select
import shutil
import subprocess
import threading
import time

PERIOD_MS = 50
# clocks_throttle_reasons.active bits that mean power: the software power cap (0x4) and the
# hardware power brake (0x80)
POWER_BITS = 0x4 | 0x80
# the first query wants the instantaneous draw (nvidia-smi 535+); older ones get the averaged one
QUERIES = ("clocks.sm,power.draw.instant,clocks_throttle_reasons.active",
           "clocks.sm,power.draw,clocks_throttle_reasons.active")


def parse(line):
    """One CSV sample (noheader, nounits) -> (sm MHz, watts or None, reasons int or None), or None
    for a line that is not one (a header, an error)."""
    f = [x.strip() for x in line.split(",")]
    if len(f) != 3:
        return None
    try:
        mhz = float(f[0])
    except ValueError:
        return None
    try:
        watts = float(f[1])
    except ValueError:
        watts = None  # "[N/A]"
    try:
        reasons = int(f[2], 16)
    except ValueError:
        reasons = None
    return mhz, watts, reasons


class Sampler:
    """nvidia-smi's samples, stamped on arrival; see the file comment."""

    def __init__(self, cmd=None, period_ms=PERIOD_MS):
        self.cmd = cmd or os.environ.get("KILN_NVIDIA_SMI") or shutil.which("nvidia-smi")
        self.period_ms = period_ms
        self.samples = []  # (host time, mhz, watts, reasons)
        self.proc = None
        self.thread = None
        self.query = None

    def _spawn(self, query):
        args = [self.cmd, f"--query-gpu={query}", "--format=csv,noheader,nounits", f"-lms={self.period_ms}"]
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def start(self):
        """Start sampling; returns '' or the reason there will be no samples."""
        if not self.cmd:
            return "no nvidia-smi"
        for q in QUERIES:
            try:
                p = self._spawn(q)
            except OSError as e:
                return f"nvidia-smi: {e}"
            # the first sample, or EOF if the query is refused (10 s at most: a hung driver)
            ready = select.select([p.stdout], [], [], 10)[0]
            first = p.stdout.readline() if ready else ""
            if parse(first):
                self.proc, self.query = p, q
                self._add(first)
                self.thread = threading.Thread(target=self._read, daemon=True)
                self.thread.start()
                return ""
            p.kill()
            p.wait()
            p.stdout.close()
        return "nvidia-smi refused the queries"

    def _add(self, line):
        s = parse(line)
        if s:
            self.samples.append((time.time(),) + s)

    def _read(self):
        for line in self.proc.stdout:
            self._add(line)

    def stop(self):
        """Stop sampling (the samples stay for window())."""
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.thread.join(5)  # the reader sees EOF
            self.proc.stdout.close()
            self.proc = None

    def window(self, t0, t1):
        """The samples stamped in [t0, t1] (host time.time()): mean SM MHz and W, the share with a
        power throttle reason, and their number; {} when none."""
        w = [s for s in list(self.samples) if t0 <= s[0] <= t1]
        if not w:
            return {}
        out = dict(sm_mhz=round(sum(s[1] for s in w) / len(w)), samples=len(w))
        watts = [s[2] for s in w if s[2] is not None]
        if watts:
            out["power_w"] = round(sum(watts) / len(watts))
        reasons = [s[3] for s in w if s[3] is not None]
        if reasons:
            out["power_capped"] = round(sum(1 for r in reasons if r & POWER_BITS) / len(reasons), 2)
        return out


def describe(c):
    """A window's summary as a short text: '1552 MHz 741 W capped 100%' ('' for {})."""
    if not c:
        return ""
    t = f"{c['sm_mhz']} MHz"
    if "power_w" in c:
        t += f" {c['power_w']} W"
    if c.get("power_capped"):
        t += f" capped {100 * c['power_capped']:.0f}%"
    return t


CLOCKS = Sampler()
