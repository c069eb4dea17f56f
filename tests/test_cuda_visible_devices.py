"""cuda.visible_devices: the judge over facts for every finding, and the whole
check through the runner with the fake NVML and with no NVML at all."""

from __future__ import annotations

import pytest

from envdoctor import nvml
from envdoctor.checks.cuda_visible_devices import CHECK, Gpu, VisibleFacts, judge
from envdoctor.context import Session
from envdoctor.errors import Unavailable
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one
from fake_pynvml import FakeDevice, FakeNvml

H100 = "NVIDIA H100 80GB HBM3"


def gpus(n, names=None):
    names = names or [H100] * n
    return tuple(Gpu(i, names[i], f"GPU-{i}{i}{i}{i}aaaa-{i}", ()) for i in range(n))


def facts(cvd=None, gpu_list=None, order=None, nvd=None, local_rank=None, reason="no NVIDIA driver here"):
    return VisibleFacts(cvd, order, nvd, local_rank, gpu_list, None if gpu_list is not None else reason)


def test_unset_is_ok_with_the_count():
    r = judge(facts(gpu_list=gpus(4)), {})
    assert r.status is Status.OK and "all 4 GPUs" in r.summary
    assert r.facts["physical_count"] == 4 and r.facts["visible_count"] == 4 and r.facts["visible"] == [0, 1, 2, 3]


def test_unset_without_nvml_is_ok_and_says_what_it_could_not_know():
    r = judge(facts(), {})
    assert r.status is Status.OK and "GPU count unknown: no NVIDIA driver here" in r.summary
    assert r.facts["physical_count"] is None and r.facts["unverified"]


@pytest.mark.parametrize("value, fix", [("0-3", "0,1,2,3"), ("0 1", "0,1"), ("0;1", "0,1"), ("2,0-1", "2,0,1"),
                                         ("1-5", "1,2,3")])
def test_a_range_or_a_list_split_otherwise_fails_and_is_fixed_to_the_gpus_meant(value, fix):
    """helper-80: '0-3' warned as "read as 0" and was fixed to 0: one GPU, where four were
    meant. CUDA takes no ranges (PITFALLS): the GPUs meant are hidden, a fail, and the fix
    lists them, those the node has."""
    r = judge(facts(value, gpus(4)), {})
    assert r.status is Status.FAIL and "CUDA takes neither ranges nor lists" in r.summary, r.summary
    assert f"export CUDA_VISIBLE_DEVICES={fix}" in r.remediation, r.remediation
    again = judge(facts(fix, gpus(4)), {})
    assert again.status is Status.OK, again.summary


def test_an_entry_with_trailing_letters_still_warns_as_read():
    r = judge(facts("1gpu2", gpus(4)), {})
    assert r.status is Status.WARN and "'1gpu2' is read as 1" in r.summary
    assert "export CUDA_VISIBLE_DEVICES=1" in r.remediation


def test_a_consistent_value_is_ok():
    r = judge(facts("2,3", gpus(4), local_rank="1"), {})
    assert r.status is Status.OK, r.summary
    assert r.facts["visible"] == [2, 3] and r.facts["visible_count"] == 2 and r.facts["local_rank"] == 1
    assert "2 of 4" in r.summary


def test_duplicate_fails():
    r = judge(facts("0,1,0", gpus(4)), {})
    assert r.status is Status.FAIL and "lists 0 twice" in r.summary
    assert r.remediation == "export CUDA_VISIBLE_DEVICES=0,1"
    assert r.facts["visible_count"] == 0


def test_invalid_entry_hiding_later_ones_fails():
    r = judge(facts("0,,2,3"), {})
    assert r.status is Status.FAIL
    assert "ignores 2, 3" in r.summary and r.facts["ignored"] == ["2", "3"] and r.facts["visible"] == [0]
    assert r.remediation == "export CUDA_VISIBLE_DEVICES=0,2,3"
    assert "not checked against the GPUs: no NVIDIA driver here" in r.summary


def test_quotes_kept_by_an_env_file_fail_with_an_explanation():
    r = judge(facts('"0,1"'), {})
    assert r.status is Status.FAIL and "quote characters" in r.summary
    assert r.remediation == "export CUDA_VISIBLE_DEVICES=0,1"


def test_a_single_bad_value_fails():
    r = judge(facts("GPU0"), {})
    assert r.status is Status.FAIL and "CUDA sees no GPU" in r.summary


@pytest.mark.parametrize("value", ["", "-1", " "])
def test_hiding_every_gpu_on_purpose_warns(value):
    r = judge(facts(value, gpus(2)), {})
    assert r.status is Status.WARN and "hides every GPU" in r.summary
    assert r.facts["visible_count"] == 0


def test_trailing_minus_one_is_fine_and_trailing_junk_warns():
    assert judge(facts("0,1,-1", gpus(2)), {}).status is Status.OK
    assert judge(facts("0,1,", gpus(2)), {}).status is Status.OK
    r = judge(facts("0,1,abc", gpus(2)), {})
    assert r.status is Status.WARN and "'abc' is invalid" in r.summary


def test_lenient_reading_warns():
    r = judge(facts("1gpu2", gpus(4)), {})
    assert r.status is Status.WARN and "read as 1" in r.summary and r.facts["visible"] == [1]


def test_index_beyond_the_gpus_fails():
    r = judge(facts("0,4,1", gpus(4)), {})
    assert r.status is Status.FAIL
    assert "GPU 4 does not exist: this node has 4 GPUs (0-3)" in r.summary and "also ignores 1" in r.summary
    assert r.facts["visible"] == [0] and r.facts["visible_count"] == 1
    assert r.remediation == "export CUDA_VISIBLE_DEVICES=0,1,2,3"


def test_uuids_are_matched_by_unique_prefix():
    g = gpus(3)
    r = judge(facts(f"{g[2].uuid},{g[0].uuid[:8]}", g), {})
    assert r.status is Status.OK and r.facts["visible"] == [g[2].uuid, g[0].uuid]
    r = judge(facts("GPU-9999", g), {})
    assert r.status is Status.FAIL and "matches no GPU" in r.summary
    r = judge(facts("GPU-", g), {})
    assert r.status is Status.FAIL and "matches no GPU" in r.summary  # a bare prefix names none (seen on an H200)
    r = judge(facts("GPU-0", g), {})
    assert r.status is Status.OK  # one character after it is a prefix
    r = judge(facts("GPU-", gpus(1)), {})
    assert r.status is Status.FAIL
    r = judge(facts(f"{g[1].uuid},{g[1].uuid[:7]}", g), {})
    assert r.status is Status.FAIL and "same GPU" in r.summary


def test_mig_uuids():
    g = (Gpu(0, "NVIDIA A100-SXM4-80GB", "GPU-a100", ("MIG-11112222", "MIG-33334444")),)
    assert judge(facts("MIG-3333", g), {}).status is Status.OK
    assert judge(facts("MIG-5555", g), {}).status is Status.FAIL


def test_a_process_enumerates_one_mig_device_however_many_are_listed():
    """Helper-97: NVIDIA's MIG User Guide ("CUDA Device Enumeration": a single CUDA process
    can only enumerate a single MIG device) and torch (device_count() 1 with two MIG UUIDs,
    pytorch/pytorch#92315). Two were counted, and LOCAL_RANK=1 passed."""
    g = (Gpu(0, "NVIDIA A100-SXM4-80GB", "GPU-a100", ("MIG-11112222", "MIG-33334444", "MIG-55556666")),)
    two = judge(facts("MIG-1111,MIG-3333", g), {})
    assert two.status is Status.WARN and "a CUDA process enumerates only one: this one uses MIG-11112222" in two.summary
    assert two.facts["visible_count"] == 1
    assert judge(facts("MIG-1111,MIG-3333", g, local_rank="1"), {}).status is Status.FAIL
    unset = judge(facts(None, g + (Gpu(1, "NVIDIA A100-SXM4-80GB", "GPU-b100", ("MIG-77778888",)),)), {})
    assert unset.status is Status.OK and "one MIG device, the first of 4" in unset.summary, unset.summary
    assert unset.facts["visible_count"] == 1
    assert judge(facts(None, g, local_rank="1"), {}).status is Status.FAIL


def test_a_bare_prefix_names_no_gpu_and_a_gpu_uuid_written_as_mig_warns():
    """On an H200 (driver 580.159.04, CUDA 13.0, torch 2.11): CUDA_VISIBLE_DEVICES=GPU- gave "No
    CUDA GPUs are available" (torch.cuda.device_count() said 1; envdoctor said ok), and
    MIG-<the GPU's UUID> ran on the GPU (envdoctor failed it)."""
    g = (Gpu(0, "NVIDIA H200", "GPU-4ac4f060-4d98-05b4-66bc-37cbe0e1acea", ()),)
    bare = judge(facts("GPU-", g), {})
    assert bare.status is Status.FAIL and "GPU- matches no GPU" in bare.summary, bare.summary
    as_mig = judge(facts("MIG-4ac4f060-4d98-05b4-66bc-37cbe0e1acea", g), {})
    assert as_mig.status is Status.WARN and "GPU UUIDs with a MIG- prefix" in as_mig.summary, as_mig.summary
    assert as_mig.remediation == "export CUDA_VISIBLE_DEVICES=GPU-4ac4f060-4d98-05b4-66bc-37cbe0e1acea"
    assert as_mig.facts["visible_count"] == 1
    assert judge(facts("MIG-ffff", g), {}).status is Status.FAIL
    # helper-98: counted as the GPUs they name, so a rank on the first passes (it failed: "CUDA sees no GPU")
    two = gpus(2)
    ranked = judge(facts(f"MIG-{two[0].uuid[4:]},MIG-{two[1].uuid[4:]}", two, local_rank="1"), {})
    assert ranked.status is Status.WARN and ranked.facts["visible_count"] == 2, ranked.summary


def test_indices_of_gpus_in_mig_mode_give_one_mig_device_and_the_rank_fix_says_so():
    """Helper-98: '0,1' on two GPUs in MIG mode counted 2 and passed LOCAL_RANK=1, and the fix for
    an unset list was that same '0,1'."""
    m = lambda i: tuple(f"MIG-{i}{j}cafe" for j in range(2))  # noqa: E731
    g = (Gpu(0, "A100", "GPU-0000aaaa-0", m(0)), Gpu(1, "A100", "GPU-1111aaaa-1", m(1)))
    listed = judge(facts("0,1", g, local_rank="1"), {})
    assert listed.status is Status.FAIL and listed.facts["visible_count"] == 1, listed.summary
    unset = judge(facts(None, g, local_rank="1"), {})
    assert unset.status is Status.FAIL and "its own MIG device" in unset.remediation and "=0,1" not in unset.remediation


def test_mixed_gpus_without_pci_order_warn():
    g = gpus(2, ["NVIDIA A100-SXM4-80GB", "Tesla T4"])
    r = judge(facts("1", g), {})
    assert r.status is Status.WARN and "CUDA_DEVICE_ORDER is unset" in r.summary
    assert r.remediation == "export CUDA_DEVICE_ORDER=PCI_BUS_ID"
    assert judge(facts("1", g, order="PCI_BUS_ID"), {}).status is Status.OK
    assert judge(facts(g[1].uuid, g), {}).status is Status.OK  # a UUID names one card whatever the order


@pytest.mark.parametrize("cvd, n, rank, status", [("2,3", 4, "2", Status.FAIL), ("2,3", 4, "1", Status.OK),
                                                  (None, 2, "2", Status.FAIL), ("5", None, "1", Status.FAIL),
                                                  (None, None, "7", Status.OK), ("0", 4, "x", Status.OK)])
def test_local_rank_against_the_visible_count(cvd, n, rank, status):
    r = judge(facts(cvd, gpus(n) if n else None, local_rank=rank), {})
    assert r.status is status, r.summary
    if status is Status.FAIL:
        assert "invalid device ordinal" in r.summary
        beyond_node = n is not None and int(rank) >= n  # no list serves it: fewer ranks per node
        assert ("torchrun --nproc-per-node=" if beyond_node else "cuda:0 instead of cuda:LOCAL_RANK") in r.remediation


def test_without_nvml_nvidia_visible_devices_shows_what_the_container_has():
    r = judge(facts("2,3", nvd="2,3"), {})
    assert r.status is Status.WARN and "hides every GPU" in r.summary and "container's own numbering" in r.summary
    assert r.remediation == "export CUDA_VISIBLE_DEVICES=0,1"
    assert judge(facts("0,1", nvd="2,3"), {}).status is Status.OK
    assert judge(facts("0,1", nvd="all"), {}).status is Status.OK
    r = judge(facts("0", nvd="none"), {})
    assert r.status is Status.WARN and "given no GPU" in r.summary
    r = judge(facts("GPU-ffff", nvd="GPU-aaaa,GPU-bbbb"), {})
    assert r.status is Status.WARN


# -- through the runner --------------------------------------------------------------------------


def run(env, fake=None, reason="no NVIDIA driver here (test)"):
    def factory():
        if fake is None:
            raise Unavailable(reason)
        return nvml.connect(lib=fake, timeout=1)

    session = Session(env_override=env, nvml_factory=factory)
    return run_one(Plan(CHECK, {}, 5), session)


def test_check_with_fake_nvml():
    fake = FakeNvml(devices=[FakeDevice() for _ in range(2)])
    r = run({"CUDA_VISIBLE_DEVICES": "0,2,1"}, fake)
    assert r.check == "cuda.visible_devices" and r.status is Status.FAIL
    assert "GPU 2 does not exist: this node has 2 GPUs (0-1)" in r.summary
    r = run({"CUDA_VISIBLE_DEVICES": fake.devices[1].uuid, "LOCAL_RANK": "0"}, fake)
    assert r.status is Status.OK and r.facts["visible"] == [fake.devices[1].uuid]


def test_check_without_nvml_runs_the_syntax_checks():
    r = run({"CUDA_VISIBLE_DEVICES": "0,0"})
    assert r.status is Status.FAIL and "twice" in r.summary and "no NVIDIA driver here (test)" in r.summary
    r = run({})
    assert r.status is Status.OK


def test_check_with_a_lost_gpu_still_counts_it():
    fake = FakeNvml(devices=[FakeDevice(), FakeDevice(lost=True)])
    r = run({"CUDA_VISIBLE_DEVICES": "1"}, fake)
    assert r.status is Status.OK and r.facts["physical_count"] == 2


def test_explain_and_metric_are_declared():
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in CHECK.explain and "before" in CHECK.explain
    assert CHECK.metrics[0].fact == "visible_count"


@pytest.mark.parametrize("value", ["", "-1"])
@pytest.mark.parametrize("node", ["no driver", "no GPU"])
def test_a_cpu_job_that_hides_the_gpus_on_a_node_without_any_is_ok(value, node):
    """Helper-49: a CPU-only torchrun (gloo) with CUDA_VISIBLE_DEVICES='' failed here
    ("LOCAL_RANK=0 but CUDA sees no GPU"), and exec --strict refused to start it; '-1' on a
    node without GPUs warned, so --fail-on warn refused it too. It never calls set_device."""
    gpu_list, reason = (None, nvml.NO_DRIVER_REASON) if node == "no driver" else ((), None)
    r = judge(VisibleFacts(value, None, None, "0", gpu_list, reason), {})
    assert r.status is Status.OK, r.summary
    assert "hides every GPU, and this node has none: the job runs on the CPU" in r.summary


def test_hiding_every_gpu_on_a_gpu_node_warns_once_with_the_nodes_own_indices():
    r = judge(facts("-1", gpus(2), local_rank="0"), {})
    assert r.status is Status.WARN and "hides every GPU" in r.summary and "invalid device ordinal" not in r.summary
    assert r.remediation == "unset CUDA_VISIBLE_DEVICES  # all GPUs; or export CUDA_VISIBLE_DEVICES=0,1"
    one = judge(facts("-1", gpus(1)), {})
    assert one.remediation == "unset CUDA_VISIBLE_DEVICES  # all GPUs; or export CUDA_VISIBLE_DEVICES=0"


def test_a_mask_smaller_than_the_ranks_fails_on_a_gpu_node_and_is_a_note_without_gpus():
    """Helper-51: on a node without a driver, CUDA_VISIBLE_DEVICES=0 with LOCAL_RANK=1 still
    failed (exec --strict refused a CPU gloo job); the explain text said it would not."""
    on_gpus = judge(facts("0", gpus(2), local_rank="1"), {})
    assert on_gpus.status is Status.FAIL and "invalid device ordinal" in on_gpus.summary
    assert on_gpus.remediation.startswith("export CUDA_VISIBLE_DEVICES=0,1")
    r = judge(VisibleFacts("0", None, None, "1", None, nvml.NO_DRIVER_REASON), {})
    assert r.status is Status.OK, r.summary
    assert "LOCAL_RANK=1 is beyond the 1 GPU CUDA_VISIBLE_DEVICES shows: not judged, since this node has no GPU" \
        in r.summary
    # a driver that lists no GPU is a node whose GPUs are gone: index 0 names none, as before
    assert judge(VisibleFacts("0", None, None, "1", (), None), {}).status is Status.FAIL


@pytest.mark.parametrize("value", ['""', "'-1'", "-1,-1", ",-1", '"-1"'])
def test_quoted_or_repeated_no_gpu_values_are_a_cpu_job_too(value):
    """Helper-51: '""' and "'-1'" (quotes an env file keeps) failed where '' and -1 pass; on a
    GPU node the fix reversed the intent (unset: all GPUs) instead of dropping the quotes."""
    none_here = judge(VisibleFacts(value, None, None, "0", None, nvml.NO_DRIVER_REASON), {})
    assert none_here.status is Status.OK, none_here.summary
    on_gpus = judge(facts(value, gpus(2), local_rank="0"), {})
    assert on_gpus.status is Status.WARN and "hides every GPU" in on_gpus.summary, on_gpus.summary
    assert "invalid device ordinal" not in on_gpus.summary and not on_gpus.fix_env
    if "'" in value or '"' in value:
        assert on_gpus.remediation.startswith("export CUDA_VISIBLE_DEVICES=-1  # as meant, without the quotes")


def test_a_list_starting_with_minus_one_is_not_made_a_gpu_list_by_fix():
    """Helper-51: exec --fix turned '-1,0' (CUDA: no GPU) into '0', making a CPU job a GPU job,
    and on a node with no GPU into a value the check itself fails."""
    r = judge(facts("-1,0", gpus(2), local_rank="0"), {})
    assert r.status is Status.WARN and "ignores 0 after it, so the job runs on the CPU" in r.summary, r.summary
    assert not r.fix_env and r.remediation.startswith("export CUDA_VISIBLE_DEVICES=-1  # no GPU, as now")
    assert judge(VisibleFacts("-1,0", None, None, None, (), None), {}).status is Status.OK
    typo = judge(facts(",0,1", gpus(2)), {})  # an empty first entry is a typo: fixed as before
    assert typo.status is Status.FAIL and typo.fix_env == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_a_bad_entry_whose_fix_serves_the_rank_gives_one_fix_not_two():
    """Helper-51: '0,x,1' with LOCAL_RANK=1 printed the entry's fix (0,1) and the LOCAL_RANK
    fix (0,1,2,3...) one after the other; the first already gives rank 1 its GPU."""
    r = judge(facts("0,x,1", gpus(4), local_rank="1"), {})
    assert r.status is Status.FAIL and "invalid device ordinal" in r.summary, r.summary  # true of the value as set
    assert r.remediation == "export CUDA_VISIBLE_DEVICES=0,1" and r.fix_env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    # helper-53: where the clean list (0) cannot serve rank 3 but the node's GPUs can, one list serves both
    wide = judge(facts("0,x", gpus(4), local_rank="3"), {})
    assert wide.remediation == "export CUDA_VISIBLE_DEVICES=0,1,2,3" and "invalid device ordinal" in wide.summary
    assert judge(facts(wide.fix_env["CUDA_VISIBLE_DEVICES"], gpus(4), local_rank="3"), {}).status is Status.OK
    # '00,0' is GPU 0 twice: the fix lists it once (it wrote '00,0', a duplicate again)
    assert judge(facts("00,0", gpus(4)), {}).fix_env == {"CUDA_VISIBLE_DEVICES": "0"}


def test_a_gpu_uuid_in_a_mig_list_is_dropped_by_the_fix():
    """Helper-49: 'MIG-a,GPU-b' was told to 'export CUDA_VISIBLE_DEVICES=MIG-a,GPU-b', its own
    value. CUDA stops at the GPU- entry; the fix keeps what it reads."""
    r = judge(facts("MIG-aaaa,GPU-bbbb"), {})
    assert r.status is Status.WARN and "'GPU-bbbb' is invalid" in r.summary
    assert r.remediation == "export CUDA_VISIBLE_DEVICES=MIG-aaaa"
    assert r.fix_env == {"CUDA_VISIBLE_DEVICES": "MIG-aaaa"}
    gpu_first = judge(facts("GPU-aaaa,MIG-bbbb,GPU-cccc"), {})
    assert gpu_first.fix_env == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-cccc"}


def test_a_fix_names_only_gpus_the_node_has():
    """Helper-52: '0,x,5' on four GPUs was fixed to '0,5', which fails again (GPU 5 does not
    exist) and hid the LOCAL_RANK failure; on a node whose driver lists no GPU, '0,x,1' was
    fixed to '0,1'. Where NVML lists the GPUs, the fix keeps only entries naming one."""
    r = judge(facts("0,x,5", gpus(4), local_rank="1"), {})
    assert r.fix_env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"} and "invalid device ordinal" in r.summary, r  # serves rank 1
    again = judge(facts(r.fix_env["CUDA_VISIBLE_DEVICES"], gpus(4), local_rank="1"), {})
    assert again.status is Status.OK, again.summary
    assert judge(facts("0,x,5", gpus(4)), {}).fix_env == {"CUDA_VISIBLE_DEVICES": "0"}  # no rank: what was written
    gone = judge(VisibleFacts("0,x,1", None, None, None, (), None), {})
    assert "CUDA_VISIBLE_DEVICES" not in gone.fix_env and "unset CUDA_VISIBLE_DEVICES" in gone.remediation
    g = gpus(2)
    uuid = judge(facts(f"{g[0].uuid},x,GPU-nosuch", g), {})
    assert uuid.fix_env == {"CUDA_VISIBLE_DEVICES": g[0].uuid}
    assert judge(facts("0,x,5"), {}).fix_env == {"CUDA_VISIBLE_DEVICES": "0,5"}  # without NVML: as written


def test_a_rank_beyond_the_nodes_gpus_is_told_to_launch_fewer_ranks():
    """Helper-52: '0,x,1' with LOCAL_RANK=2 on two GPUs gave the same export twice, and no
    CUDA_VISIBLE_DEVICES can give rank 2 a GPU there."""
    r = judge(facts("0,x,1", gpus(2), local_rank="2"), {})
    assert "this node has 2" in r.summary and "torchrun --nproc-per-node=2" in r.remediation, r.remediation
    assert r.remediation.count("export CUDA_VISIBLE_DEVICES=0,1") == 1


@pytest.mark.parametrize("value, n, rank", [("0,0", 2, "0"), ("00,0", 2, "0"), ("0,1,0", 4, "1"), ("0,x", 2, "2"),
                                            ("0,1gpu2", 2, "2"), ("0,x,1", 4, "1"), ("0,x", 4, "3")])
def test_the_pasted_remediation_sets_what_fix_env_sets(value, n, rank):
    """Helper-55: '0,0' with LOCAL_RANK=0 gave fix_env 0 but pasted 'export ...=0; export ...=0,1',
    and '0,x' with LOCAL_RANK=2 on two GPUs put the export after a '# ...' comment, so it never
    ran. Pasted into bash, the line sets exactly what --fix sets."""
    import subprocess

    r = judge(facts(value, gpus(n), local_rank=rank), {})
    wanted = r.fix_env.get("CUDA_VISIBLE_DEVICES")
    pasted = subprocess.run(["bash", "-c", r.remediation + "\necho \"${CUDA_VISIBLE_DEVICES-unset}\""],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert pasted.stdout.strip() == (wanted or "unset"), (r.remediation, r.fix_env, pasted.stderr)


def test_a_huge_value_makes_a_bounded_summary():
    """helper-78: an 82 KB CUDA_VISIBLE_DEVICES made an 82 KB summary (and /report of 790 KB).
    The value and the entries ignored are cut, with how much more there was."""
    value = ",".join(["0", "x", *map(str, range(1, 20000))])
    r = judge(facts(value, gpus(4)), {})
    assert r.status is Status.FAIL and len(r.summary) < 1000, len(r.summary)
    assert "more characters)" in r.summary and "and 19983 more" in r.summary, r.summary


@pytest.mark.parametrize("value, fix", [("0-3", "0,1,2,3"), ("0 1 2 3", "0,1,2,3"), ("0-3,5", "0,1,2,3,5")])
def test_a_range_with_local_rank_gives_one_export(value, fix):
    """helper-83: '0-3' with LOCAL_RANK=3 on 8 GPUs printed `export ...=0,1,2,3; export
    ...=0,...,7`: two exports, the last one pasted wins. The range's fix serves the rank."""
    r = judge(facts(value, gpus(8), local_rank="3"), {})
    assert r.status is Status.FAIL and r.remediation.count("export CUDA_VISIBLE_DEVICES=") == 1, r.remediation
    assert f"export CUDA_VISIBLE_DEVICES={fix}" in r.remediation and r.fix_env == {"CUDA_VISIBLE_DEVICES": fix}


@pytest.mark.parametrize("value, fix_env", [("99999999999999999999", None), ("7,99999999999999999999,1", "7,1"),
                                             ("0," + "9" * 40 + ",1", "0,1")])
def test_an_index_too_large_for_any_gpu_is_dropped_by_the_fix_without_nvml(value, fix_env):
    """helper-114: without NVML the fix kept the entry the row calls invalid, so `exec --fix`
    started the job with the same bad value."""
    r = judge(facts(value), {})
    assert r.status is Status.FAIL and "far too large" in r.summary, r.summary
    assert "9" * 19 not in r.remediation, r.remediation
    assert r.fix_env == ({"CUDA_VISIBLE_DEVICES": fix_env} if fix_env else {}), r.fix_env


@pytest.mark.parametrize("value", ["NoDevFiles", "none", "void", "'NoDevFiles'"])
def test_a_value_that_means_no_gpu_was_given_is_not_fixed_by_unsetting_it(value):
    """helper-114: Slurm's NoDevFiles (a job given no GPU) was fixed with `unset
    CUDA_VISIBLE_DEVICES  # all GPUs`, which hands the job every GPU of a shared node."""
    for node in (None, gpus(4)):
        r = judge(facts(value, node), {})
        assert r.status is Status.FAIL and "sees no GPU" in r.summary, r.summary
        assert "unset" not in r.remediation.split(";")[0] and "ask the scheduler" in r.remediation, r.remediation
        assert not r.fix_env


def test_several_mig_devices_warn_without_nvml_too():
    """helper-114: without NVML 'MIG-a,MIG-b' was ok, "CUDA will use 2 MIG devices"; a CUDA
    process enumerates only the first, which needs no NVML to know."""
    r = judge(facts("MIG-a,MIG-b"), {})
    assert r.status is Status.WARN and "lists 2 MIG devices" in r.summary and "uses MIG-a" in r.summary, r.summary
    assert r.facts["visible_count"] == 1
    assert judge(facts("MIG-a"), {}).status is Status.OK


@pytest.mark.parametrize("value, status, fix", [("GPU-", Status.FAIL, None), ("MIG-", Status.FAIL, None),
                                                ("GPU-,GPU-abc", Status.FAIL, "GPU-abc"),
                                                ("GPU-abc,GPU-", Status.WARN, "GPU-abc")])
def test_a_bare_uuid_prefix_names_no_device_without_nvml_too(value, status, fix):
    """helper-114: without NVML, 'GPU-' was ok ("CUDA will use 1 GPU (GPU-)"); on an H200 CUDA
    found no GPU with it, and with NVML the check already failed it."""
    r = judge(facts(value), {})
    assert r.status is status and "is a bare prefix and names no device" in r.summary, r.summary
    assert r.fix_env == ({"CUDA_VISIBLE_DEVICES": fix} if fix else {}), r.fix_env
    assert judge(facts("GPU-abc"), {}).status is Status.OK
