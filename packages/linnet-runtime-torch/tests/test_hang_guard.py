"""The tests' hang guard (support.run_guarded, issue 38 item 23): a child that waits without
output or CPU time is stopped; one that computes silently on a slow machine is not."""

import sys

import pytest
from support import run_guarded


def test_a_child_that_waits_silently_is_stopped_as_a_hang():
    with pytest.raises(pytest.fail.Exception, match="no output and no CPU time"):
        run_guarded([sys.executable, "-c", "import time; time.sleep(60)"], idle=2)


def test_a_child_that_computes_silently_is_not_stopped():
    # 4 s of arithmetic with no output, twice the idle guard: alive by its CPU time.
    busy = (
        "import time\nt = time.time()\nwhile time.time() - t < 4: sum(range(1000))\nprint('done')"
    )
    done = run_guarded([sys.executable, "-c", busy], idle=2)
    assert done.returncode == 0 and done.stdout.strip() == "done"


def test_a_child_past_the_whole_limit_is_stopped():
    busy = "while True: sum(range(1000))"
    with pytest.raises(pytest.fail.Exception, match="still running after 3 s"):
        run_guarded([sys.executable, "-c", busy], idle=60, limit=3)
