"""The benchmarks' clock sampler (tools/bench/clocks.py) against a stand-in nvidia-smi: what a
timing's window reports, the fall-back query, and no nvidia-smi at all. CPU only."""
import os
import stat
import sys
import tempfile
import textwrap
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench"))

import clocks  # noqa: E402

# A stand-in for `nvidia-smi --query-gpu=Q --format=csv,noheader,nounits -lms=N`: for 0.3 s a
# power-capped GPU (1500 MHz, 700 W, reason 0x4), then an idle one (1980 MHz, 300 W, no reason),
# a sample every 20 ms. With FAKE_OLD set it refuses power.draw.instant as an old one does.
FAKE = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    q = [a for a in sys.argv if a.startswith("--query-gpu=")][0]
    if "instant" in q and os.environ.get("FAKE_OLD"):
        print('Field "power.draw.instant" is not a valid field to query.')
        sys.exit(2)
    t0 = time.time()
    while True:
        if time.time() - t0 < 0.3:
            print("1500, 700.00, 0x0000000000000004", flush=True)
        else:
            print("1980, [N/A], 0x0000000000000000" if "instant" not in q else
                  "1980, 300.00, 0x0000000000000000", flush=True)
        time.sleep(0.02)
    """)


class ClocksTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.smi = os.path.join(self.dir.name, "nvidia-smi")
        with open(self.smi, "w") as f:
            f.write(FAKE.format(python=sys.executable))
        os.chmod(self.smi, os.stat(self.smi).st_mode | stat.S_IEXEC)
        os.environ.pop("FAKE_OLD", None)

    def tearDown(self):
        os.environ.pop("FAKE_OLD", None)
        self.dir.cleanup()

    def windows(self):
        """Start a sampler on the stand-in; the windows of its capped phase and its idle one."""
        s = clocks.Sampler(cmd=self.smi)
        self.assertEqual(s.start(), "")
        try:
            t0 = time.time()
            time.sleep(0.15)
            capped = s.window(t0, time.time())
            time.sleep(0.35)  # past the switch at 0.3 s after the stand-in started
            t1 = time.time()
            time.sleep(0.15)
            idle = s.window(t1, time.time())
        finally:
            s.stop()
        return s, capped, idle

    def test_windows(self):
        s, capped, idle = self.windows()
        self.assertIn("instant", s.query)
        self.assertEqual((capped["sm_mhz"], capped["power_w"], capped["power_capped"]), (1500, 700, 1.0))
        self.assertGreaterEqual(capped["samples"], 3)
        self.assertEqual((idle["sm_mhz"], idle["power_w"], idle["power_capped"]), (1980, 300, 0.0))
        self.assertEqual(clocks.describe(capped), "1500 MHz 700 W capped 100%")
        self.assertEqual(clocks.describe(idle), "1980 MHz 300 W")
        self.assertEqual(s.window(0, 1), {})  # long before any sample

    def test_old_query(self):
        os.environ["FAKE_OLD"] = "1"
        s, capped, idle = self.windows()
        self.assertNotIn("instant", s.query)
        self.assertEqual(capped["sm_mhz"], 1500)
        self.assertNotIn("power_w", idle)  # "[N/A]" watts: no figure, not a zero
        self.assertEqual(idle["power_capped"], 0.0)

    def test_no_smi(self):
        s = clocks.Sampler(cmd=os.path.join(self.dir.name, "absent"))
        self.assertIn("nvidia-smi", s.start())
        self.assertEqual(s.window(0, time.time()), {})
        self.assertEqual(clocks.describe({}), "")

    def test_parse(self):
        self.assertEqual(clocks.parse("1755, 612.31, 0x0000000000000004"), (1755.0, 612.31, 4))
        self.assertEqual(clocks.parse("1755, [N/A], [N/A]"), (1755.0, None, None))
        self.assertIsNone(clocks.parse("clocks.current.sm [MHz], power.draw [W], x"))
        self.assertIsNone(clocks.parse("No devices were found"))


if __name__ == "__main__":
    unittest.main()
