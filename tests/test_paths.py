"""A target's paths under the procfs root: kept from call to call, never mixed between roots."""

from __future__ import annotations

from pathlib import Path

from envdoctor.paths import Roots


def test_a_process_file_is_under_its_own_root_and_kept():
    host, container = Roots(), Roots(procfs=Path("/host/proc"))
    assert host.proc(None, "status") == Path("/proc/self/status")
    assert host.proc(42, "root", "usr/lib") == Path("/proc/42/root/usr/lib")
    assert container.proc(42, "root", "usr/lib") == Path("/host/proc/42/root/usr/lib")
    assert container.seen_by(42, "/etc/os-release") == Path("/host/proc/42/root/etc/os-release")
    assert Roots(procfs=Path("/host/proc")).proc(42, "environ") is container.proc(42, "environ")  # joined once
