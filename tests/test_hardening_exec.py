"""`envdoctor exec` where the machine says no: here, no writable temporary directory for
--attach's start-up hook (a read-only root with a read-only /tmp, as hardened images
have). The job must still start, with one line saying why it is not attached."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare for a private mount")
def test_attach_without_a_writable_tmp_still_starts_the_job():
    """mkdtemp raised FileNotFoundError out of exec: a traceback, exit 1, and the job never ran."""
    script = (f"mount -t tmpfs -o ro none /tmp && mount -t tmpfs -o ro none /var/tmp && cd /proc && "
              f"TMPDIR=/tmp exec {sys.executable} -m envdoctor exec --attach -- sh -c 'echo job-ran'")
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "job-ran"
    assert "Traceback" not in proc.stderr
    assert "--attach: cannot write the start-up hook" in proc.stderr
