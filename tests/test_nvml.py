"""The NVML facade over the fake library in every state, and over the real pynvml.

The real-library tests run here too: on a machine without a driver they prove
the no-driver path (a skip reason with a hint, no traceback); on a GPU machine
the well-formedness test reads every real device.
"""

from __future__ import annotations

import threading
import time

import pynvml
import pytest

from envdoctor import nvml
from envdoctor.errors import Unavailable
from fake_pynvml import GIB, FakeDevice, FakeNvml

TIMEOUT = 0.4


@pytest.fixture
def fakes():
    """Build fakes through this so every blocked call is released at teardown."""
    made: list[FakeNvml] = []

    def make(*args, **kwargs) -> FakeNvml:
        fake = FakeNvml(*args, **kwargs)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.release()


def connect(fake: FakeNvml) -> nvml.Nvml:
    return nvml.connect(lib=fake, timeout=TIMEOUT)


# -- system queries ----------------------------------------------------------------------


def test_system_queries(fakes):
    n = connect(fakes(devices=[FakeDevice(), FakeDevice()], driver="550.54.15", cuda=12040))
    assert n.driver_version() == "550.54.15"
    assert n.cuda_driver_version() == (12, 4)
    assert n.device_count() == 2


def test_the_drivers_versions_are_asked_once_per_facade_and_a_failure_is_not_kept(fakes):
    fake = fakes(driver="550.54.15", cuda=12040)
    n = connect(fake)
    for _ in range(3):
        assert n.driver_version() == "550.54.15" and n.cuda_driver_version() == (12, 4)
    asked = [fn for fn, _ in fake.calls if fn.startswith("nvmlSystemGet")]
    assert asked.count("nvmlSystemGetDriverVersion") == 1 and len(asked) == 2, asked
    fake.driver = "560.35.03"
    assert connect(fake).driver_version() == "560.35.03"  # the next run's facade asks again

    hung = fakes(system_hangs={"nvmlSystemGetDriverVersion"})
    n = connect(hung)
    with pytest.raises(nvml.NvmlHung):
        n.driver_version()
    hung.release()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and n._state.stuck_since("driver_version") is not None:
        time.sleep(0.02)
    assert n.driver_version() == "550.54.15"  # asked again once the stuck call returned


@pytest.mark.parametrize("raw, expected", [(12040, (12, 4)), (11080, (11, 8)), (12000, (12, 0)), (13010, (13, 1))])
def test_cuda_driver_version_decoding(fakes, raw, expected):
    assert connect(fakes(cuda=raw)).cuda_driver_version() == expected


def test_cuda_driver_version_not_supported_is_none(fakes):
    assert connect(fakes(cuda=None)).cuda_driver_version() is None


def test_init_is_done_once_per_library(fakes):
    fake = fakes()
    connect(fake)
    connect(fake)
    assert [c for c in fake.calls if c[0] == "nvmlInit"] == [("nvmlInit", None)]


# -- no driver, no permission: Unavailable with a hint ----------------------------------------


@pytest.mark.parametrize(
    "error, words",
    [
        (pynvml.NVMLError_LibraryNotFound, ["--gpus all", "driver"]),
        (pynvml.NVMLError_DriverNotLoaded, ["kernel driver is not loaded", "nvidia-smi"]),
        (pynvml.NVMLError_NoPermission, ["permission denied", "/dev/nvidia"]),
        (pynvml.NVMLError_LibRmVersionMismatch, ["reboot"]),
        (pynvml.NVMLError_Unknown, ["NVML failed to initialise", "Unknown Error"]),
    ],
)
def test_init_failures_become_unavailable_with_a_hint(fakes, error, words):
    with pytest.raises(Unavailable) as caught:
        connect(fakes(init_error=error))
    said = f"{caught.value} {caught.value.hint}"  # the reason, and the fix column's hint
    for word in words:
        assert word in said


def test_a_failed_init_is_retried_on_the_next_connect(fakes):
    fake = fakes(no_library=True)
    with pytest.raises(Unavailable):
        connect(fake)
    fake.init_error = None  # the driver got installed / mounted
    assert connect(fake).device_count() == 1


# -- snapshots in each state ------------------------------------------------------------------


def test_healthy_device_snapshot_is_complete(fakes):
    n = connect(fakes(devices=[FakeDevice(memory_used=GIB, processes=[(4242, GIB)], pci_bus_id="00000000:3B:00.0")]))
    [gpu] = n.devices()
    assert gpu.index == 0 and gpu.name == "NVIDIA H100 80GB HBM3" and gpu.uuid.startswith("GPU-")
    assert gpu.pci_bus_id == "00000000:3B:00.0"
    assert gpu.compute_capability == (9, 0)
    assert gpu.memory_total_bytes == 80 * GIB and gpu.memory_used_bytes == GIB
    assert gpu.memory_free_bytes == 79 * GIB
    assert gpu.temperature_c == 34 and gpu.power_watts == 70.0
    assert gpu.throttle_reasons == ["gpu_idle"]
    assert gpu.ecc_uncorrected == 0 and gpu.retired_pages_pending is False
    assert gpu.remapped_rows_pending is False and gpu.remapped_rows_failure is False
    assert gpu.persistence_mode is True and gpu.compute_mode == "default"
    assert gpu.mig_mode is None and "mig_mode" in gpu.unsupported  # this GPU has no MIG
    assert gpu.processes == [(4242, GIB)]
    assert not gpu.lost and not gpu.timed_out and gpu.errors == {}
    d = gpu.to_dict()
    assert d["compute_capability"] == [9, 0] and d["processes"] == [{"pid": 4242, "used_memory_bytes": GIB}]


def test_faults_are_reported(fakes):
    n = connect(fakes(devices=[
        FakeDevice(ecc_uncorrected=3, ecc_uncorrected_aggregate=7),
        FakeDevice(retired_pages_pending=True),
        FakeDevice(remapped_rows=(0, 2, 1, 0)),
        FakeDevice(remapped_rows=(0, 9, 0, 1)),
        FakeDevice(throttle=0x4 | 0x40, temperature=91),
        FakeDevice(compute_mode=3, persistence=0),
    ]))
    g = n.devices()
    assert g[0].ecc_uncorrected == 3 and g[0].ecc_uncorrected_aggregate == 7
    assert g[1].retired_pages_pending is True
    assert g[2].remapped_rows_pending is True and g[2].remapped_rows_uncorrectable == 2
    assert g[3].remapped_rows_failure is True
    assert g[4].throttle_reasons == ["sw_power_cap", "hw_thermal_slowdown"] and g[4].throttle_reasons_mask == 0x44
    assert g[5].compute_mode == "exclusive_process" and g[5].persistence_mode is False


def test_not_supported_fields_are_none_not_errors(fakes):
    n = connect(fakes(devices=[FakeDevice(unsupported={"ecc", "retired_pages", "remapped_rows", "power"})]))
    [gpu] = n.devices()
    assert gpu.ecc_uncorrected is None and gpu.retired_pages_pending is None and gpu.power_watts is None
    assert gpu.remapped_rows_failure is None
    assert {"ecc", "ecc_aggregate", "retired_pages", "remapped_rows", "power"} <= set(gpu.unsupported)
    assert gpu.errors == {}
    assert gpu.memory_total_bytes == 80 * GIB  # the rest is still read


def test_other_errors_are_recorded_per_field(fakes):
    n = connect(fakes(devices=[FakeDevice(errors={"processes": pynvml.NVMLError_NoPermission,
                                                  "temperature": pynvml.NVMLError_Unknown})]))
    [gpu] = n.devices()
    assert "no permission" in gpu.errors["processes"]
    assert gpu.errors["temperature"] == "Unknown Error"
    assert gpu.temperature_c is None and gpu.name is not None


def test_lost_gpu_is_marked_and_the_others_are_read(fakes):
    n = connect(fakes(devices=[FakeDevice(), FakeDevice(lost=True), FakeDevice()]))
    g = n.devices()
    assert g[1].lost and g[1].errors == {"handle": "GPU is lost"} and g[1].name is None
    assert not g[0].lost and not g[2].lost and g[2].memory_total_bytes == 80 * GIB


def test_gpu_lost_mid_read_keeps_what_was_read(fakes):
    fake = fakes(devices=[FakeDevice(lost_on="power")])
    [gpu] = connect(fake).devices()
    assert gpu.lost and gpu.errors == {"power": "GPU is lost"}
    assert gpu.temperature_c == 34 and gpu.power_watts is None
    assert not any(fn == "nvmlDeviceGetCurrentClocksEventReasons" for fn, _ in fake.calls), "stopped at the lost GPU"


def test_mig_devices_are_listed(fakes):
    n = connect(fakes(devices=[FakeDevice(mig=True, mig_uuids=("MIG-0b1c0a6e-aaaa", "MIG-5a2e8d1f-bbbb")), FakeDevice(mig=False)]))
    g = n.devices()
    assert g[0].mig_mode is True and g[0].mig_devices == ["MIG-0b1c0a6e-aaaa", "MIG-5a2e8d1f-bbbb"]
    assert g[1].mig_mode is False and g[1].mig_devices == []


def test_old_driver_falls_back_to_older_functions(fakes):
    fake = fakes(devices=[FakeDevice(memory_used=GIB, throttle=0x20, processes=[(7, None)])], old_driver=True)
    n = connect(fake)
    assert n.cuda_driver_version() == (12, 4)
    [gpu] = n.devices()
    assert gpu.temperature_c == 34 and gpu.throttle_reasons == ["sw_thermal_slowdown"]
    assert gpu.memory_used_bytes == GIB + 512 * 1024**2  # v1 memory info counts the driver's reservation
    assert gpu.processes == [(7, None)]
    assert gpu.errors == {} and "throttle" not in gpu.unsupported


def test_driver_gone_mid_read_is_unavailable(fakes):
    n = connect(fakes(devices=[FakeDevice(errors={"memory": pynvml.NVMLError_DriverNotLoaded})]))
    with pytest.raises(Unavailable, match="went away"):
        n.devices()


def test_snapshot_is_shared_for_max_age_and_is_a_copy(fakes):
    fake = fakes()
    n = connect(fake)
    first = n.devices()
    first[0].name = "scribbled"
    calls = len(fake.calls)
    again = n.devices(max_age=60)
    assert len(fake.calls) == calls and again[0].name == "NVIDIA H100 80GB HBM3"
    n.devices(max_age=0)
    assert len(fake.calls) > calls


def test_a_callers_copy_shares_nothing_mutable_with_the_snapshot(fakes):
    """devices() copies each record one level down (nvml._copy_info): that is a deep copy
    only while every field is immutable, or a list or dict of immutable values. Every
    field of records with everything filled in is held to that here."""
    fake = fakes(devices=[FakeDevice(processes=[(4242, GIB), (4243, None)], throttle=0x4 | 0x40, mig=True,
                                     mig_uuids=["MIG-a", "MIG-b"], errors={"power": pynvml.NVMLError_NoPermission},
                                     unsupported={"ecc"}),
                          FakeDevice(lost=True)])
    n = connect(fake)
    immutable = (str, int, float, bool, type(None))

    def frozen(value) -> bool:
        return isinstance(value, immutable) or (isinstance(value, tuple) and all(frozen(v) for v in value))

    first = n.devices()
    for info in first:
        for name, value in vars(info).items():
            if type(value) is list:
                assert all(frozen(v) for v in value), (name, value)
            elif type(value) is dict:
                assert all(frozen(k) and frozen(v) for k, v in value.items()), (name, value)
            else:
                assert frozen(value), (name, value)
    assert first[0].processes and first[0].errors and first[0].throttle_reasons and first[0].mig_devices
    for info in first:
        for value in vars(info).values():
            if type(value) in (list, dict):
                value.clear()
    again = n.devices(max_age=60)
    assert again[0].processes == [(4242, GIB), (4243, None)] and again[0].mig_devices == ["MIG-a", "MIG-b"]
    assert again[0].errors and again[0].unsupported == ["ecc", "ecc_aggregate"] and again[0].throttle_reasons
    assert again == n.devices(max_age=60) and again[1].lost


def test_gpu_use_is_the_snapshots_processes_and_memory_shared_until_it_is_read_again(fakes):
    fake = fakes(devices=[FakeDevice(processes=[(4242, 3 * GIB), (4243, None)], memory_total=80 * GIB,
                                     memory_used=20 * GIB),
                          FakeDevice(mig=True, mig_uuids=["MIG-1"])])
    n = connect(fake)
    use = n.gpu_use()
    [gpu0, gpu1] = n.devices(max_age=60)
    assert use[0] == (0, gpu0.mig_mode, gpu0.memory_total_bytes, gpu0.memory_free_bytes, ((4242, 3 * GIB), (4243, None)))
    assert use[0].memory_total_bytes == 80 * GIB and use[0].memory_free_bytes == gpu0.memory_free_bytes
    assert use[1].index == 1 and use[1].mig_mode is True
    calls = len(fake.calls)
    assert n.gpu_use(max_age=60) is use and len(fake.calls) == calls  # shared, not copied, not read again
    fake.devices[0].processes = [(5151, GIB)]
    n.devices(max_age=0)  # a new snapshot: gpu_use follows it
    assert n.gpu_use(max_age=60)[0].processes == ((5151, GIB),)
    assert n.gpu_use(max_age=0) is not use and len(fake.calls) > calls


def test_gpu_use_of_a_driver_that_went_away_is_unavailable(fakes):
    n = connect(fakes(devices=[FakeDevice(errors={"memory": pynvml.NVMLError_DriverNotLoaded})]))
    with pytest.raises(Unavailable, match="went away"):
        n.gpu_use()


# -- hangs: bounded, marked, not repeated ---------------------------------------------------------


def _nvml_threads() -> int:
    """NVML calls still stuck on the watchdog: each holds one worker thread."""
    from envdoctor.watchdog import default_watchdog

    return sum(1 for key in default_watchdog().stuck()
               if isinstance(key, tuple) and len(key) == 2 and str(key[1]).startswith(("device", "init", "count")))


def test_a_hung_device_is_bounded_marked_and_not_queried_again(fakes):
    fake = fakes(devices=[FakeDevice(), FakeDevice(hang="memory"), FakeDevice()])
    n = connect(fake)
    before = _nvml_threads()
    started = time.monotonic()
    g = n.devices()
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT + 1.5, f"devices() took {elapsed:.2f} s with a {TIMEOUT} s timeout"
    assert g[1].timed_out and "timed out" in g[1].errors["memory"]
    assert g[1].name == "NVIDIA H100 80GB HBM3", "fields read before the hang are kept"
    assert not g[0].timed_out and not g[2].timed_out and g[2].memory_total_bytes == 80 * GIB

    # later snapshots, even through a new connect (serve's next run), skip the stuck GPU quickly
    calls_on_gpu1 = sum(1 for _, i in fake.calls if i == 1)
    for _ in range(3):
        started = time.monotonic()
        g = connect(fake).devices(max_age=0)
        assert time.monotonic() - started < TIMEOUT + 1.0  # the proof is below: no new call on GPU 1
        assert g[1].timed_out and "not queried" in g[1].errors["device"]
        assert g[1].uuid is not None, "the stuck GPU is still named by its last known UUID"
    assert sum(1 for _, i in fake.calls if i == 1) == calls_on_gpu1
    assert _nvml_threads() - before <= 1, "threads piled up"

    fake.release()  # the call came back: the GPU is queried again
    deadline = time.monotonic() + 2
    while _nvml_threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    fake.devices[1].hang = None
    assert not connect(fake).devices(max_age=0)[1].timed_out


def test_every_device_hung_still_takes_one_timeout_not_n(fakes):
    fake = fakes(devices=[FakeDevice(hang="handle") for _ in range(6)])
    started = time.monotonic()
    g = connect(fake).devices()
    assert time.monotonic() - started < TIMEOUT + 1.5
    assert all(d.timed_out for d in g)


def test_hung_init_gives_a_hung_facade(fakes):
    fake = fakes(init_hangs=True)
    started = time.monotonic()
    n = connect(fake)
    assert time.monotonic() - started < TIMEOUT + 1.5
    assert n.hung and "nvmlInit" in n.hung
    with pytest.raises(nvml.NvmlHung):
        n.driver_version()
    with pytest.raises(Unavailable):  # NvmlHung is an Unavailable: other checks skip
        n.devices()
    again = connect(fake)  # no second nvmlInit while the first is stuck
    assert again.hung and [c for c in fake.calls if c[0] == "nvmlInit"] == [("nvmlInit", None)]


def test_hung_system_call_is_bounded_and_not_repeated(fakes):
    fake = fakes(system_hangs={"nvmlSystemGetDriverVersion"})
    n = connect(fake)
    started = time.monotonic()
    with pytest.raises(nvml.NvmlHung, match="driver_version"):
        n.driver_version()
    assert time.monotonic() - started < TIMEOUT + 1.5
    with pytest.raises(nvml.NvmlHung, match="has not returned"):
        n.driver_version()
    assert [c for c in fake.calls if c[0] == "nvmlSystemGetDriverVersion"] == [("nvmlSystemGetDriverVersion", None)]
    assert n.device_count() == 1  # other calls still work


# -- the real library ------------------------------------------------------------------------------


def _real_or_skip() -> nvml.Nvml:
    try:
        return nvml.connect()
    except Unavailable as exc:
        pytest.skip(f"no NVIDIA driver: {exc}")


@pytest.mark.real
def test_real_nvml_without_a_driver_is_unavailable_with_a_hint():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver; the no-driver path cannot be seen here")
    started = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        nvml.connect()
    assert time.monotonic() - started < 2
    assert "libnvidia-ml" in str(caught.value) and "--gpus all" in caught.value.hint
    assert caught.value.__cause__ is None and (caught.value.__context__ is None or caught.value.__suppress_context__)


@pytest.mark.real
@pytest.mark.gpu
def test_real_nvml_snapshot_is_well_formed():
    n = _real_or_skip()
    assert n.driver_version().count(".") >= 1
    cuda = n.cuda_driver_version()
    assert cuda is None or (cuda[0] >= 9 and 0 <= cuda[1] < 100)
    count = n.device_count()
    gpus = n.devices()
    assert len(gpus) == count
    for i, g in enumerate(gpus):
        assert g.index == i and not g.timed_out and not g.lost, g
        assert g.uuid and g.uuid.startswith("GPU-") and g.name
        assert g.memory_total_bytes and 0 <= g.memory_used_bytes <= g.memory_total_bytes
        assert g.compute_capability is None or g.compute_capability[0] >= 3
        assert all(isinstance(r, str) for r in g.throttle_reasons)
        for pid, used in g.processes:
            assert pid > 0 and (used is None or used >= 0)
        assert set(g.to_dict()) >= {"index", "uuid", "memory_total_bytes", "errors"}


@pytest.mark.real
def test_no_driver_is_known_without_importing_pynvml():
    """Without a driver, connect() answers from a dlopen of the same library pynvml
    loads, without paying for pynvml's (or ctypes') import on every start."""
    import subprocess
    import sys

    if nvml._driver_library_loads():
        pytest.skip("this machine has an NVIDIA driver")
    code = ("import sys\nfrom envdoctor import nvml\nfrom envdoctor.errors import Unavailable\n"
            "try:\n    nvml.connect()\nexcept Unavailable as exc:\n    print(exc, '|', exc.hint)\n"
            "print('pynvml' in sys.modules, 'ctypes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith(nvml.NO_DRIVER_REASON) and "--gpus all" in out[0]
    assert out[1] == "False False"  # nor ctypes' (~3 ms): _ctypes.dlopen asks as CDLL does
