"""memsample against what a job (or a broken node) can put in front of it: an attached
document whose allocator figures have the wrong shape or absurd sizes, and cgroup or
/proc files that hold Unicode digits. The untrusted part is dropped; the measurements
envdoctor took itself (rss, cgroup) stay, and memory.cache_growth still judges."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from envdoctor.memsample import Sampler
from test_memory_sampler import MIB, PID, _write, make_tree


def _doc(cuda) -> dict:
    return {"schema": "envdoctor.attach/v1", "pid": PID, "published_at": time.time(), "interval_seconds": 5.0,
            "cuda": cuda}


HOSTILE_CUDA = [
    {"devices": [1, 2]},
    {"devices": "0"},
    {"devices": {"0": {"reserved_bytes": 10**400, "allocated_bytes": 10**400, "total_bytes": 10**400}}},
    {"devices": {"0": {"reserved_bytes": True, "allocated_bytes": -5, "total_bytes": 2}}},
    {"devices": {"0": {"reserved_bytes": 5, "num_alloc_retries": float("nan"), "inactive_split_bytes": float("inf")}}},
    {"devices": {"0": {"reserved_bytes": 5, "num_alloc_retries": 10**400, "inactive_split_bytes": True}}},
    {"devices": {"0": {"reserved_bytes": 5, "total_bytes": 8, "free_bytes": 10**400}}},
]


@pytest.mark.parametrize("cuda", HOSTILE_CUDA)
def test_a_hostile_allocator_section_costs_only_its_own_series(tmp_path, cuda):
    roots = make_tree(tmp_path, "v2")
    sample = Sampler(roots, PID, live=lambda: _doc(cuda)).sample()
    assert sample.values["rss"] == 102400 * 1024 and sample.values["cgroup"] == 250 * MIB
    for name, value in (*sample.values.items(), *sample.counters.items()):
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (name, value)
        assert 0 <= value < 1 << 62, (name, value)
        float(value)  # the trend fit converts every point; 10**400 raised OverflowError there
    for limit in sample.limits.values():
        assert limit.limit is None or limit.limit < 1 << 62
        assert abs(limit.headroom) < 1 << 62


def test_sane_allocator_figures_are_still_taken(tmp_path):
    roots = make_tree(tmp_path, "v2")
    cuda = {"devices": {"0": {"reserved_bytes": 4 * MIB, "allocated_bytes": 3 * MIB, "total_bytes": 80 * MIB,
                              "free_bytes": 70 * MIB, "num_alloc_retries": 2, "inactive_split_bytes": 1024}}}
    sample = Sampler(roots, PID, live=lambda: _doc(cuda)).sample()
    assert sample.values["cuda0_reserved"] == 4 * MIB and sample.values["cuda0_allocated"] == 3 * MIB
    assert sample.counters == {"cuda0_num_alloc_retries": 2, "cuda0_inactive_split_bytes": 1024}
    assert sample.limits["cuda0_allocated"].headroom == 71 * MIB


@pytest.mark.parametrize("file, text", [
    ("status", "Name:\tpython\nVmRSS:\t²³ kB\n"),
    ("stat", f"{PID} (python) " + " ".join(["S"] + ["0"] * 18 + ["٣"] + ["0"] * 20) + "\n"),
])
def test_unicode_digits_in_proc_files_are_not_numbers(tmp_path, file, text):
    """str.isdigit() accepts '²' and int() refuses it: the sample broke with ValueError."""
    roots = make_tree(tmp_path, "v2")
    _write(roots.procfs / str(PID) / file, text)
    sample = Sampler(roots, PID).sample()
    assert "cgroup" in sample.values


@pytest.mark.parametrize("name", ["memory.current", "memory.max", "memory.stat"])
def test_unicode_digits_in_cgroup_files_are_not_numbers(tmp_path, name):
    roots = make_tree(tmp_path, "v2")
    text = "anon 1\ninactive_file ²\n" if name == "memory.stat" else "١٢٣\n"
    _write(roots.sysfs / "fs" / "cgroup" / "kubepods" / "pod1" / name, text)
    sample = Sampler(roots, PID).sample()
    assert sample.values["rss"] == 102400 * 1024


def test_a_real_job_with_a_hostile_document_is_still_judged(tmp_path):
    """End to end: a real process, its document in the real /dev/shm with devices as a list;
    memory.cache_growth broke ('the check broke: AttributeError') before."""
    job = subprocess.Popen(["sleep", "60"])
    path = f"/dev/shm/envdoctor-attach-{job.pid}.json"
    try:
        doc = _doc({"devices": [1, 2]})
        doc["pid"] = job.pid
        with open(path, "w") as f:
            json.dump(doc, f)
        out = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--pid", str(job.pid), "--only",
                              "memory.cache_growth", "--window", "1", "-f", "json"],
                             capture_output=True, text=True, timeout=120)
    finally:
        job.kill()
        job.wait()
        try:
            import os

            os.unlink(path)
        except OSError:
            pass
    row = json.loads(out.stdout)["results"][0]
    assert row["status"] != "error", row


@pytest.mark.parametrize("change, why", [
    ({"published_at": float("nan")}, "no valid published_at"),
    ({"published_at": float("inf")}, "no valid published_at"),
    ({"interval_seconds": float("inf"), "published_at": 0}, "no valid published_at"),
    ({"published_at": True}, "no valid published_at"),
    ({"published_at": 1e300}, "future"),
    ({"pid": True}, "names pid"),
])
def test_a_document_that_would_never_go_stale_is_refused(change, why):
    """NaN compares false with everything, so a NaN (or far-future) date passed the staleness
    rule forever: a dead job's document stayed 'live'. (pid true equalled a container's PID 1.)"""
    from envdoctor.attach_reader import validate

    doc = {**_doc({}), "pid": 1, **change}
    assert why in (validate(doc, 1) or "accepted")
    assert validate(dict(_doc({}), pid=1), 1) is None


def test_a_document_naming_thousands_of_devices_adds_a_bounded_number_of_series(tmp_path):
    """Each device is two series of up to 720 points in serve's history, per process."""
    from envdoctor.memsample import MAX_DEVICES

    roots = make_tree(tmp_path, "v2")
    devices = {str(i): {"reserved_bytes": 1} for i in range(2000)}
    devices.update({"01": {"reserved_bytes": 2}, "0001": {"reserved_bytes": 3}})
    sample = Sampler(roots, PID, live=lambda: _doc({"devices": devices})).sample()
    cuda = [name for name in sample.values if name.startswith("cuda")]
    assert len(cuda) == MAX_DEVICES and all(name.endswith("_reserved") for name in cuda)
    assert "cuda01_reserved" not in sample.values and "cuda1_reserved" in sample.values
