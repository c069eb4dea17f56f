"""Plug-ins that misbehave in ways a plug-in author can easily reach: an id that is
already taken, an exporter whose render breaks. Each becomes one clear row or one
line with a reason, never two rows with one id, a traceback or a hang."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from helpers import cli


def _site(tmp_path: Path, name: str, module: str, entry_points: str) -> Path:
    """A distribution `name` on a private sys.path entry, with `module` as its code."""
    site = tmp_path / "site"
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (site / f"{name}.py").write_text(module)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    return site


_DUPLICATE = '''
from envdoctor.check import Check
from envdoctor.model import fail

CHECK = Check(id="shm.size", title="a copy", run=lambda ctx: fail("the plug-in's verdict"))
'''


def test_a_plugin_registering_a_built_in_id_gives_one_row_per_id(tmp_path):
    site = _site(tmp_path, "dupplug", _DUPLICATE,
                 "[envdoctor.checks]\nshm.size = dupplug:CHECK\n")
    env = {"PYTHONPATH": str(site)}
    proc = cli("check", "--only", "shm.size", "-f", "json", env=env)
    assert "Traceback" not in proc.stderr
    rows = json.loads(proc.stdout)["results"]
    ids = [r["check"] for r in rows]
    assert sorted(ids) == ["dupplug:shm.size", "shm.size"], ids  # the built-in's row and the plug-in's error
    by_id = {r["check"]: r for r in rows}
    assert by_id["shm.size"]["status"] != "error"  # the built-in's verdict, not hidden
    assert by_id["dupplug:shm.size"]["status"] == "error" and "already provided by envdoctor" in by_id["dupplug:shm.size"]["summary"]
    # the report is still the shipped schema's (helper-114: its dotted-id pattern refused the error row's id)
    schema = json.loads((Path(__file__).resolve().parents[1] / "envdoctor" / "schema" / "report-v1.json").read_text())
    jsonschema.validate(json.loads(proc.stdout), schema)
    with pytest.raises(jsonschema.ValidationError):  # only an error row may leave the dotted form
        jsonschema.validate({**json.loads(proc.stdout), "results": [{**by_id["dupplug:shm.size"], "status": "fail"}]}, schema)

    prom = cli("check", "--only", "shm.size", "-f", "prometheus", env=env).stdout
    success = [line for line in prom.splitlines() if line.startswith("envdoctor_check_success{")]
    assert len(success) == len(set(line.split("}")[0] for line in success)) == 2, success

    listing = cli("checks", env=env).stdout
    assert "dupplug:shm.size" in listing and "already provided" in listing


def test_the_row_id_of_a_failure_is_accepted_wherever_an_id_is(tmp_path):
    """Helper-16: `checks` listed dupplug:shm.size, and --skip, --only and the config refused it."""
    site = _site(tmp_path, "dupplug", _DUPLICATE, "[envdoctor.checks]\nshm.size = dupplug:CHECK\n")
    env = {"PYTHONPATH": str(site)}

    def ids(*args, cwd=None):
        proc = cli("check", *args, "-f", "json", env=env, cwd=cwd)
        assert proc.returncode in (0, 1), proc.stderr
        return sorted(r["check"] for r in json.loads(proc.stdout)["results"])

    assert ids("--only", "dupplug:shm.size") == ["dupplug:shm.size"]
    assert ids("--only", "shm.size,dist.env", "--skip", "dupplug:shm.size") == ["dist.env", "shm.size"]
    (tmp_path / "envdoctor.toml").write_text('[check."dupplug:shm.size"]\nenabled = false\n')
    assert ids("--only", "shm.size", "--config", str(tmp_path / "envdoctor.toml")) == ["shm.size"]


def test_a_broken_plugins_row_can_be_switched_off_from_a_shell(tmp_path):
    """`dupplug:shm.size` has a `:` that no shell takes in a variable's name; its
    variable spells every such character as `_`, and only ENABLED means anything."""
    import subprocess

    site = _site(tmp_path, "dup-plug", _DUPLICATE.replace("dupplug", "dup_plug"),
                 "[envdoctor.checks]\nshm.size = dup_plug:CHECK\n")
    env = {"PYTHONPATH": str(site)}
    assert "dup-plug:shm.size" in cli("checks", env=env).stdout
    explained = cli("explain", "dup-plug:shm.size", env=env).stdout
    assert "ENVDOCTOR_CHECK__DUP_PLUG_SHM_SIZE__ENABLED=0" in explained, explained

    # set the way a user would: through a shell, which refuses a name with `-` or `:`
    shell = subprocess.run(["bash", "-c", "export ENVDOCTOR_CHECK__DUP_PLUG_SHM_SIZE__ENABLED=0 && echo set"],
                           capture_output=True, text=True)
    assert shell.stdout.strip() == "set", shell.stderr
    proc = cli("check", "--only", "shm.size", "-f", "json",
               env={**env, "ENVDOCTOR_CHECK__DUP_PLUG_SHM_SIZE__ENABLED": "0"})
    assert proc.returncode in (0, 1), proc.stderr
    assert [r["check"] for r in json.loads(proc.stdout)["results"]] == ["shm.size"]

    wrong = cli("check", env={**env, "ENVDOCTOR_CHECK__DUP_PLUG_SHM_SIZE__TIMEOUT": "5"})
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert "did not load; only ENABLED" in wrong.stderr, wrong.stderr


def test_two_ids_that_read_alike_as_a_variable_are_refused_by_it():
    from envdoctor import config as config_module
    from envdoctor.errors import ConfigError

    with pytest.raises(ConfigError, match="names a-b:x.y and a_b:x.y alike"):
        config_module.load({}, environ={"ENVDOCTOR_CHECK__A_B_X_Y__ENABLED": "0"}, known_ids={"a-b:x.y", "a_b:x.y"},
                           explicit_file=None, cwd=Path("/nonexistent-envdoctor-dir"))


def test_failures_sharing_a_name_get_distinct_row_ids():
    from envdoctor.registry import LoadFailure, _row_ids

    failures = [LoadFailure("acme.x", "a:X", "acme", "import failed"), LoadFailure("acme.x", "b:X", "acme", "import failed"),
                LoadFailure("acme.x", "c:X", "other", "import failed"), LoadFailure("shm.size", "d:X", "acme", "dup")]
    rows = [f.row or f.name for f in _row_ids(failures, {"shm.size"})]
    assert rows == ["acme.x", "acme:acme.x", "other:acme.x", "acme:shm.size"]


_FORMATS = '''
import sys, time
from envdoctor.export import Exporter

RAISES = Exporter(name="raises", render=lambda report, options: {}["missing"])
NONE = Exporter(name="none", render=lambda report, options: None)
BYTES = Exporter(name="bytes", render=lambda report, options: b"x")
EXITS = Exporter(name="exits", render=lambda report, options: sys.exit(0))
HANGS = Exporter(name="hangs", render=lambda report, options: time.sleep(3600))


def _wedge(report, options):
    import re
    re.match(r"(a+)+$", "a" * 40 + "b")  # holds the interpreter lock for hours


class _Unprintable(Exception):
    def __str__(self):
        raise ValueError("str broke")

    __repr__ = __str__


def _unprintable(report, options):
    raise _Unprintable()


class _Text(str):
    def encode(self, *args, **kwargs):
        raise RuntimeError("encode of subclass")


def _leaks(report, options):
    import os
    raise RuntimeError("leak " + os.environ["MY_API_TOKEN"])


def _os_exit(report, options):
    import os
    os._exit(0)


def _spawns(report, options):
    import os, subprocess
    subprocess.Popen(["sh", "-c", f"sleep {os.environ['MARK']} & sleep {os.environ['MARK']}"])
    return "rendered\\n"


def _noisy(report, options):
    import os, sys
    print("RENDER-STDOUT-NOISE", flush=True)
    print("RENDER-STDERR-NOISE " + os.environ["MY_API_TOKEN"], file=sys.stderr, flush=True)
    raise RuntimeError("noisy")


WEDGES = Exporter(name="wedges", render=_wedge)
SPAWNS = Exporter(name="spawns", render=_spawns)
NOISY = Exporter(name="noisy", render=_noisy)
HUGE = Exporter(name="huge", render=lambda report, options: ("x" * 1023 + "\\n") * 61440)  # 60 MiB
UNPRINTABLE = Exporter(name="unprintable", render=_unprintable)
SUBCLASS = Exporter(name="subclass", render=lambda report, options: _Text("a str subclass\\n"))
SURROGATES = Exporter(name="surrogates", render=lambda report, options: "bad \\udcff \\ud800 end\\n")
LEAKS = Exporter(name="leaks", render=_leaks)
OSEXIT = Exporter(name="osexit", render=_os_exit)
'''
_FORMAT_NAMES = ("raises", "none", "bytes", "exits", "hangs", "wedges", "unprintable", "subclass", "surrogates",
                 "leaks", "osexit", "spawns", "noisy", "huge")


def _format_site(tmp_path):
    return _site(tmp_path, "fmtplug", _FORMATS, "[envdoctor.exporters]\n" + "".join(
        f"{name} = fmtplug:{name.upper()}\n" for name in _FORMAT_NAMES))


@pytest.mark.parametrize("fmt, reason", [
    ("raises", "broke while rendering: KeyError"),
    ("none", "returned NoneType, not text"),
    ("bytes", "returned bytes, not text"),
    ("exits", "broke while rendering: raised SystemExit(0)"),
    ("hangs", "did not render within 10 s"),
    ("wedges", "did not render within 10 s"),  # helper-16: the deadman's 20 s and a stack dump
    ("unprintable", "_Unprintable: <its message could not be read>"),  # helper-16: a traceback
    ("osexit", "its render process died without an answer"),  # helper-16: exit 0, no report
    ("leaks", "RuntimeError: leak ***"),  # helper-16: the token itself
    ("noisy", "RuntimeError: noisy"),  # helper-17: its own stderr line first, with the token
])
def test_a_plugin_format_that_breaks_is_one_line_exit_2_and_keeps_the_output_file(tmp_path, fmt, reason):
    """Helper-15: each of these gave a traceback, a hang or exit 0 with no report."""
    out = tmp_path / "report.txt"
    out.write_text("the previous report\n")
    env = {"PYTHONPATH": str(_format_site(tmp_path)), "MY_API_TOKEN": "hunter2hunter2"}
    proc = cli("check", "--only", "shm.size", "-f", fmt, "-o", str(out), env=env, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert f"format '{fmt}' (fmtplug)" in proc.stderr and reason in proc.stderr, proc.stderr
    assert "hunter2" not in proc.stderr and proc.stdout == ""
    assert out.read_text() == "the previous report\n"


def _marked(mark: str) -> list[int]:
    """Live processes whose command line holds `mark`."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mark.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_what_a_plugin_format_starts_ends_with_its_render(tmp_path):
    """Helper-17: `sh -c 'sleep & sleep'` started by a render outlived envdoctor (only direct
    children were killed), and a 60 MB answer took past the deadline to come back (the
    transfer was quadratic: forked.call moved 60 MiB in 22 s, now in 0.6 s)."""
    import os
    import time

    mark = f"3{os.getpid() % 1000:03d}.{time.monotonic_ns() % 997}"
    env = {"PYTHONPATH": str(_format_site(tmp_path)), "MARK": mark}
    try:
        proc = cli("check", "--only", "shm.size", "-f", "spawns", "-o", str(tmp_path / "r.txt"), env=env)
        assert proc.returncode in (0, 1), proc.stderr
        assert (tmp_path / "r.txt").read_text() == "rendered\n"
        time.sleep(0.3)
        assert _marked(mark) == []
    finally:
        for pid in _marked(mark):
            os.kill(pid, 9)
    big = cli("check", "--only", "shm.size", "-f", "huge", "-o", str(tmp_path / "big.txt"), env=env)
    assert big.returncode in (0, 1), big.stderr
    assert (tmp_path / "big.txt").stat().st_size == 1024 * 61440


def test_a_wedged_check_ends_even_when_its_stderr_is_a_socket_nobody_reads(tmp_path):
    """Helper-17: a socket cannot be reopened non-blocking, the dump blocked in
    sock_alloc_send_pskb, and the process never exited; SIGALRM is the backstop. The
    plug-in shortens the backstop (300 s) to 5 s past the dump's deadline, for the test."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from envdoctor.deadman import WEDGED_SECONDS

    backstop = WEDGED_SECONDS + 5
    shorter = f"import envdoctor.deadman\nenvdoctor.deadman.BACKSTOP_SECONDS = {backstop}\nenvdoctor.deadman.beat()\n"
    module = _WEDGED.replace("import re\n", "import re\n" + shorter)
    site = _site(tmp_path, "wedgeplug", module, "[envdoctor.checks]\nwedge.regex = wedgeplug:CHECK\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("ENVDOCTOR_CONFIG", None)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "envdoctor", "check", "--only", "wedge.regex", "-f", "json"],
                                env=env, stdout=subprocess.DEVNULL, stderr=theirs.fileno())
        try:
            code = proc.wait(timeout=backstop + 40)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code in (-signal.SIGPROF, -signal.SIGALRM), code
    assert time.monotonic() - started < backstop + 20


@pytest.mark.parametrize("fmt, written", [("subclass", "a str subclass\n"), ("surrogates", "bad \\xff \\ud800 end\n")])
def test_a_plugin_formats_odd_text_is_written_as_plain_utf8(tmp_path, fmt, written):
    """Helper-16: a str subclass whose encode() raised, and lone surrogates, gave tracebacks."""
    out = tmp_path / "report.txt"
    proc = cli("check", "--only", "shm.size", "-f", fmt, "-o", str(out), env={"PYTHONPATH": str(_format_site(tmp_path))})
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    assert out.read_text(encoding="utf-8") == written


def test_checks_and_explain_mask_a_secret_a_plugins_own_text_quotes(tmp_path):
    module = ("import os\nfrom envdoctor.check import Check\nfrom envdoctor.model import ok\n"
              "CHECK = Check(id='leak.title', title='title ' + os.environ['MY_API_TOKEN'], run=lambda ctx: ok('x'),\n"
              "              explain='reads ' + os.environ['MY_API_TOKEN'])\n")
    site = _site(tmp_path, "leakplug", module, "[envdoctor.checks]\nleak.title = leakplug:CHECK\n")
    env = {"PYTHONPATH": str(site), "MY_API_TOKEN": "topsecretvalue42"}
    listing, page = cli("checks", env=env), cli("explain", "leak.title", env=env)
    assert "title ***" in listing.stdout and "reads ***" in page.stdout, (listing.stdout, page.stdout)
    assert "topsecretvalue42" not in listing.stdout + page.stdout


def test_explain_names_a_broken_plugin_that_checks_lists(tmp_path):
    site = _site(tmp_path, "dupplug", _DUPLICATE, "[envdoctor.checks]\nshm.size = dupplug:CHECK\n")
    page = cli("explain", "dupplug:shm.size", env={"PYTHONPATH": str(site)})
    assert page.returncode == 0 and "dupplug:shm.size: BROKEN plug-in from dupplug" in page.stdout, page.stderr


def test_checks_masks_a_secret_a_broken_plugin_quotes(tmp_path):
    site = _site(tmp_path, "secplug", "import os\nraise RuntimeError('cannot load with ' + os.environ['MY_API_TOKEN'])\n",
                 "[envdoctor.checks]\nsec.broken = secplug:CHECK\n")
    proc = cli("checks", env={"PYTHONPATH": str(site), "MY_API_TOKEN": "topsecretvalue42"})
    assert "sec.broken" in proc.stdout and "cannot load with ***" in proc.stdout, proc.stdout
    assert "topsecretvalue42" not in proc.stdout + proc.stderr


_WEDGED = '''
import re
from envdoctor.check import Check
from envdoctor.model import ok


def _run(ctx):
    re.match(r"(a+)+$", "a" * 40 + "b")  # hours inside _sre, holding the interpreter lock
    return ok("never")


CHECK = Check(id="wedge.regex", title="holds the GIL", run=_run)
'''


_WEDGED_AT_IMPORT = _WEDGED.replace("CHECK = Check(", "_run(None)\nCHECK = Check(")


def _threads_of(pid: int) -> str:
    """Each thread's name, state, CPU and wait channel, and the process's signal masks: what
    a hang of the deadman's test is made of, for the report of a test that timed out."""
    lines = []
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        lines += [line for line in status.splitlines() if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd"))]
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            task = f"/proc/{pid}/task/{tid}"
            stat = Path(f"{task}/stat").read_text()
            name, rest = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:].split()
            wchan = Path(f"{task}/wchan").read_text() if os.path.exists(f"{task}/wchan") else "?"
            lines.append(f"{tid} {name} state={rest[0]} cpu={rest[36]} utime={rest[11]} wchan={wchan}")
    except (OSError, IndexError) as exc:
        lines.append(f"({exc})")
    return "\n".join(lines)


@pytest.mark.parametrize("when", ["in its check", "at import"])
@pytest.mark.parametrize("command", [["check", "--only", "wedge.regex,shm.size", "--timeout", "2"],
                                     ["serve", "--web.listen-address", "127.0.0.1:0", "--interval", "5"]])
def test_a_check_holding_the_interpreter_lock_ends_the_process_with_its_stack(tmp_path, command, when):
    """Helper-15: no Python thread runs while the regex holds the lock, so no timeout fired,
    SIGTERM was ignored, and `check` and `serve` hung for good. The deadman's C thread ends
    the process once no Python ran for WEDGED_SECONDS, naming the stuck plug-in. Helper-16:
    at import, before the deadman was armed, both still hung. Since 2026-11-27 it counts CPU
    time, and SIGPROF ends the process once the stacks are written."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from envdoctor.deadman import WEDGED_SECONDS

    module = _WEDGED if when == "in its check" else _WEDGED_AT_IMPORT
    site = _site(tmp_path, "wedgeplug", module, "[envdoctor.checks]\nwedge.regex = wedgeplug:CHECK\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("ENVDOCTOR_CONFIG", None)
    if when == "at import":
        command = [c if c != "wedge.regex,shm.size" else "shm.size" for c in command]
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "envdoctor", *command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=WEDGED_SECONDS + 60)
    except subprocess.TimeoutExpired:
        seen = _threads_of(proc.pid)  # why it still runs, read before it is killed (CI, once)
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"still running after {WEDGED_SECONDS + 60:.0f} s; its threads:\n{seen}\nstderr: {err[-2000:]}")
    took = time.monotonic() - started
    assert proc.returncode == -signal.SIGPROF, (proc.returncode, stderr[-2000:])
    assert "most recent call first" in stderr, stderr[-2000:]
    assert "wedgeplug.py" in stderr and "in _run" in stderr  # names the stuck plug-in
    assert took < WEDGED_SECONDS + 30, took


def test_the_deadman_still_exits_when_stderr_is_a_full_pipe_nobody_reads(tmp_path):
    """Helper-16: the dump blocked writing to a full stderr pipe, and the process never exited."""
    import fcntl
    import os
    import signal
    import subprocess
    import sys
    import time

    from envdoctor.deadman import WEDGED_SECONDS

    site = _site(tmp_path, "wedgeplug", _WEDGED, "[envdoctor.checks]\nwedge.regex = wedgeplug:CHECK\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("ENVDOCTOR_CONFIG", None)
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETFL, os.O_NONBLOCK)
        try:
            while True:
                os.write(w, b"x" * 4096)
        except BlockingIOError:
            pass  # full: nothing more fits until someone reads
        fcntl.fcntl(w, fcntl.F_SETFL, 0)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "envdoctor", "check", "--only", "wedge.regex", "-f", "json"],
                                env=env, stdout=subprocess.DEVNULL, stderr=w)
        try:
            code = proc.wait(timeout=WEDGED_SECONDS + 40)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == -signal.SIGPROF and time.monotonic() - started < WEDGED_SECONDS + 30
    finally:
        os.close(r)
        os.close(w)


_WANDERER = '''
import os
import re
from envdoctor.check import Check
from envdoctor.model import ok


def _run(ctx):
    os.chdir(os.environ["WANDER_TO"])
    os.umask(0o777)
    return ok("moved the working directory and masked every permission bit")


CHECK = Check(id="wander.off", title="chdir and umask", run=_run)
'''


def test_a_check_that_changes_directory_and_umask_moves_no_output(tmp_path):
    """Helper-15: `-o rel.json` landed under the check's new directory, with mode 000."""
    import os
    import stat

    site = _site(tmp_path, "wanderplug", _WANDERER, "[envdoctor.checks]\nwander.off = wanderplug:CHECK\n")
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    proc = cli("check", "--only", "wander.off", "-f", "json", "-o", "rel.json", cwd=work,
               env={"PYTHONPATH": str(site), "WANDER_TO": str(elsewhere)})
    assert proc.returncode == 0, proc.stderr
    assert (work / "rel.json").is_file() and not (elsewhere / "rel.json").exists()
    old = os.umask(0o022)
    os.umask(old)
    assert stat.S_IMODE((work / "rel.json").stat().st_mode) == 0o644 & ~old


def test_the_umask_is_read_without_being_changed():
    import os

    from envdoctor.atomicfile import current_umask

    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027
    finally:
        os.umask(old)


def test_serves_textfile_stays_where_it_was_named_when_a_check_changes_directory(tmp_path):
    site = _site(tmp_path, "wanderplug", _WANDERER, "[envdoctor.checks]\nwander.off = wanderplug:CHECK\n")
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    proc = cli("serve", "--once", "--textfile", "rel.prom", cwd=work,
               env={"PYTHONPATH": str(site), "WANDER_TO": str(elsewhere)})
    assert proc.returncode == 0, proc.stderr
    assert 'check="wander.off"' in (work / "rel.prom").read_text()  # the check did run, and moved
    assert not (elsewhere / "rel.prom").exists()
    assert f"textfile={work / 'rel.prom'}" in proc.stderr  # the log names where it really is


_SPAWNS_AND_HANGS = '''
import os, subprocess, time
from envdoctor.check import Check
from envdoctor.model import ok


def _run(ctx):
    subprocess.Popen(["sh", "-c", f"sleep {os.environ['MARK']} & sleep {os.environ['MARK']}"])
    time.sleep(3600)
    return ok("never")


CHECK = Check(id="spawn.hang", title="starts a tree, then hangs", run=_run, modes=("check", "exec"))
'''


def test_execs_preflight_leaves_no_grandchild_of_a_plugin_check_behind(tmp_path):
    """Helper-17: the pre-flight child's grandchildren (`sh -c 'sleep & sleep'`) outlived it,
    held the job's stdout, and kept a `| cut` pipeline open for five minutes."""
    import os
    import time

    mark = f"4{os.getpid() % 1000:03d}.{time.monotonic_ns() % 997}"
    site = _site(tmp_path, "spawnplug", _SPAWNS_AND_HANGS, "[envdoctor.checks]\nspawn.hang = spawnplug:CHECK\n")
    try:
        proc = cli("exec", "--only", "spawn.hang", "--timeout", "3", "--", "true",
                   env={"PYTHONPATH": str(site), "MARK": mark}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        time.sleep(0.3)
        assert _marked(mark) == []
    finally:
        for pid in _marked(mark):
            os.kill(pid, 9)


_LEAVES_PROCESSES = '''
import subprocess
from envdoctor.check import Check
from envdoctor.model import ok

SECONDS = "{seconds}"


def _calls_a_hung_tool(ctx):
    subprocess.run(["sleep", SECONDS])  # a hung external tool (nvidia-smi on a wedged GPU)
    return ok("returned")


def _starts_a_daemon(ctx):
    subprocess.run(["sh", "-c", "setsid sleep " + SECONDS + " </dev/null >/dev/null 2>&1 &"], check=True)
    return ok("started a daemon")


HUNG = Check(id="leaky.hung_tool", title="waits on a tool that hangs", run=_calls_a_hung_tool, timeout=1)
DAEMON = Check(id="leaky.daemon", title="starts a double-forked daemon", run=_starts_a_daemon)
'''


def _sleepers(seconds: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[:2] == [b"sleep", seconds.encode()]:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _assert_gone_soon(seconds: str) -> None:
    deadline = time.monotonic() + 5  # a SIGKILLed process is gone at once; allow a loaded machine
    while _sleepers(seconds) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sleepers(seconds) == []


@pytest.mark.parametrize("command", [["check", "-f", "compact"], ["exec", "--", "sh", "-c", "sleep 1"]])
def test_nothing_a_plugin_started_outlives_the_command(tmp_path, command):
    """A check that timed out left the tool it waited on running, and a plug-in's
    `setsid daemon &` went to PID 1: both outlived `check` and exec's pre-flight."""
    seconds = str(400000 + os.getpid() % 100000)  # a unique command line to look for
    site = _site(tmp_path, "leaky", _LEAVES_PROCESSES.replace("{seconds}", seconds),
                 "[envdoctor.checks]\nleaky.hung_tool = leaky:HUNG\nleaky.daemon = leaky:DAEMON\n")
    try:
        proc = cli(*command, env={"PYTHONPATH": str(site), "ENVDOCTOR_ONLY": "leaky.hung_tool,leaky.daemon"},
                   timeout=60)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert "leaky.hung_tool" in proc.stdout + proc.stderr and "timed out" in proc.stdout + proc.stderr
        _assert_gone_soon(seconds)
    finally:
        for pid in _sleepers(seconds):
            os.kill(pid, 9)


def test_what_the_users_shell_started_before_envdoctor_is_left_alone(tmp_path):
    """`bash -c '( ...; sleep N ) & exec envdoctor check'`: the subshell became check's child,
    and what it started during the run (its `sleep`, a daemon it double-forked) was killed
    as if a check had started it (helper-20)."""
    seconds = str(500000 + os.getpid() % 100000)
    done = tmp_path / "done"
    # the job starts its daemon and its sleep while check samples for 3 s (--window)
    script = (f"( sleep 0.3; setsid sleep {seconds} </dev/null >/dev/null 2>&1 & sleep 1; sleep 4; echo ok > {done} ) & "
              f"exec {sys.executable} -m envdoctor check --only shm.size,memory.cache_growth --window 3 -f compact")
    try:
        started = time.monotonic()
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
        assert proc.returncode in (0, 1) and "Killed" not in proc.stderr, proc.stderr
        assert _sleepers(seconds), "the shell's own daemon was killed"
        deadline = time.monotonic() + 20
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.read_text().strip() == "ok"
        assert time.monotonic() - started >= 5, "its `sleep 4` was cut short"
    finally:
        for pid in _sleepers(seconds):
            os.kill(pid, 9)


def test_a_broken_plugin_whose_name_reads_like_a_built_in_never_takes_its_variables(tmp_path):
    """`shm_size = nosuchmod:CHECK` made ENVDOCTOR_CHECK__SHM_SIZE__MIN_BYTES "names shm.size
    and shm_size alike", exit 2 (helper-20): a loaded check keeps its variables."""
    site = _site(tmp_path, "brokenplug", "", "[envdoctor.checks]\nshm_size = nosuchmod:CHECK\n")
    env = {"PYTHONPATH": str(site), "ENVDOCTOR_CHECK__SHM_SIZE__MIN_BYTES": "1000"}
    proc = cli("check", "--only", "shm.size", "-f", "json", env=env)
    assert proc.returncode in (0, 1) and "alike" not in proc.stderr, proc.stderr
    row, = json.loads(proc.stdout)["results"]
    assert row["check"] == "shm.size" and row["facts"]["min_bytes"] == 1000, row


def test_a_subreaper_bit_given_to_envdoctor_does_not_make_a_shells_jobs_its_own(tmp_path):
    """A parent that set PR_SET_CHILD_SUBREAPER and exec'd a shell that exec'd envdoctor:
    the bit survives execve, and the shell job's orphaned daemon, adopted, was killed as
    if a check had started it (helper-21)."""
    seconds = str(600000 + os.getpid() % 100000)
    script = (f"( sleep 0.3; setsid sleep {seconds} </dev/null >/dev/null 2>&1 & ) & "
              f"exec {sys.executable} -m envdoctor check --only shm.size,memory.cache_growth --window 3 -f compact")
    launcher = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
                "os.execvp('bash', ['bash', '-c', sys.argv[1]])")
    try:
        proc = subprocess.run([sys.executable, "-c", launcher, script], capture_output=True, text=True, timeout=60)
        assert proc.returncode in (0, 1), proc.stderr
        assert _sleepers(seconds), "the shell's daemon was killed"
    finally:
        for pid in _sleepers(seconds):
            os.kill(pid, 9)


_MALFORMED = '''
from envdoctor.check import Check
from envdoctor.model import Finding, Result, Status, verdict

def _env(env):
    return lambda facts, settings: verdict([Finding(Status.WARN, "needs a variable", "set it", env=env)], facts, "fine")

EVERYWHERE = ("check", "exec", "serve")
STR_STATUS = Check(id="bad.str_status", title="a str status", run=lambda ctx: Result("ok", "plain str status"), modes=EVERYWHERE)
NONE_SUMMARY = Check(id="bad.none_summary", title="None fields", run=lambda ctx: Result(Status.WARN, None, None, None), modes=EVERYWHERE)
KEYS = Check(id="bad.keys", title="odd facts keys", run=lambda ctx: Result(Status.OK, "keys", "", {1: "a", ("t",): 2}), modes=EVERYWHERE)
ENV_NAME = Check(id="bad.env_name", title="a bad name", gather=lambda ctx: {}, judge=_env({"BAD NAME=1": "v"}), modes=EVERYWHERE)
ENV_VALUE = Check(id="bad.env_value", title="a bad value", gather=lambda ctx: {}, judge=_env({"PP_NUM": 5}), modes=EVERYWHERE)
'''
_MALFORMED_IDS = ("bad.str_status", "bad.none_summary", "bad.keys", "bad.env_name", "bad.env_value")


def _malformed_site(tmp_path: Path) -> Path:
    return _site(tmp_path, "badplug", _MALFORMED, "[envdoctor.checks]\n" + "".join(
        f"{i} = badplug:{name}\n" for i, name in zip(_MALFORMED_IDS, ("STR_STATUS", "NONE_SUMMARY", "KEYS", "ENV_NAME", "ENV_VALUE"))))


@pytest.mark.parametrize("fmt", ["json", "text", "prometheus"])
def test_a_malformed_result_is_that_checks_error_row_and_the_rest_stand(tmp_path, fmt):
    """Helper-37: Result(Status.WARN, None) or a Finding's env with a bad name from one
    plug-in gave a traceback and no report at all (check, serve --once), and exec lost
    every built-in's verdict."""
    env = {"PYTHONPATH": str(_malformed_site(tmp_path))}
    proc = cli("check", "--only", ",".join(("shm.size",) + _MALFORMED_IDS), "-f", fmt, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    if fmt != "json":
        assert "shm.size" in proc.stdout and "bad.env_value" in proc.stdout
        return
    rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    assert rows["shm.size"]["status"] != "error"
    for check_id in _MALFORMED_IDS:
        assert rows[check_id]["status"] == "error", rows[check_id]
        assert rows[check_id]["summary"].startswith("check returned a malformed Result: "), rows[check_id]
    assert "status is 'ok'" in rows["bad.str_status"]["summary"]
    assert "summary is a NoneType" in rows["bad.none_summary"]["summary"]
    assert "facts has the key 1" in rows["bad.keys"]["summary"]
    assert "'BAD NAME=1'" in rows["bad.env_name"]["summary"] and "PP_NUM is 5" in rows["bad.env_value"]["summary"]


def test_a_malformed_result_leaves_serve_once_and_exec_their_other_checks(tmp_path):
    env = {"PYTHONPATH": str(_malformed_site(tmp_path))}
    textfile = tmp_path / "node.prom"
    proc = cli("serve", "--once", "--textfile", str(textfile), env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    text = textfile.read_text()
    assert 'check="bad.env_name"' in text and 'check="shm.size"' in text

    report = tmp_path / "exec.json"
    proc = cli("exec", "--fix", "--report", str(report), "--", sys.executable, "-c", "import os; print(os.environ.get('PP_NUM'))",
               env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr
    rows = {r["check"]: r for r in json.loads(report.read_text())["results"]}
    assert rows["shm.size"]["status"] != "error" and rows["bad.env_value"]["status"] == "error"


_CONFIGURED = '''
from envdoctor.check import Check
from envdoctor.model import ok

CHECK = Check(id="acme.marker", title="a marker file", run=lambda ctx: ok(ctx.config["path"]), config={"path": "/etc/hostname"})
'''


def test_plugins_left_out_by_the_escape_hatch_keep_their_config_valid(tmp_path):
    """Helper-37: every broken plug-in's row advises ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1, and
    with it a config that set the plug-in up was 'unknown check id' (exit 2): following the
    advice broke the project. Its settings are not checked then, as for one that failed."""
    env = {"PYTHONPATH": str(_site(tmp_path, "acmeplug", _CONFIGURED, "[envdoctor.checks]\nacme.marker = acmeplug:CHECK\n"))}
    (tmp_path / "envdoctor.toml").write_text('[check."acme.marker"]\npath = "/etc/hosts"\n')
    loaded = cli("check", "--only", "acme.marker", "-f", "json", env=env, cwd=tmp_path)
    assert loaded.returncode == 0 and json.loads(loaded.stdout)["results"][0]["summary"] == "/etc/hosts", loaded.stderr

    off = {**env, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1", "ENVDOCTOR_CHECK__ACME_MARKER__PATH": "/etc/passwd"}
    for args in (("check", "--only", "shm.size"), ("check", "--only", "shm.size", "--skip", "acme.marker"),
                 ("exec", "--", "true"), ("serve", "--once", "--textfile", str(tmp_path / "n.prom"))):
        proc = cli(*args, env=off, cwd=tmp_path)
        assert proc.returncode in (0, 1) and "unknown" not in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
    rows = json.loads(cli("check", "-f", "json", env=off, cwd=tmp_path).stdout)["results"]
    assert "acme.marker" not in {r["check"] for r in rows}  # left out, not run
    assert cli("check", "--only", "acme.nothing", env=off, cwd=tmp_path).returncode == 2  # a typo is still one
    # helper-39: asked for by name it was dropped without a word; the row id a failure of it would
    # have (the README's way to switch a broken plug-in's row off) was "unknown", exit 2
    for command in ("check", "exec"):
        asked = cli(command, "--only", "acme.marker,shm.size", *(["--", "true"] if command == "exec" else []),
                    env=off, cwd=tmp_path)
        assert asked.returncode == 2 and "acme.marker: a plug-in left out by ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1" in asked.stderr
    (tmp_path / "only.toml").write_text('only = ["acme.marker"]\n')
    only = cli("check", "--config", str(tmp_path / "only.toml"), env=off, cwd=tmp_path)
    assert only.returncode == 2 and "leave no check to run; acme.marker: a plug-in left out" in only.stderr, only.stderr
    row_off = {**off, "ENVDOCTOR_CHECK__ACMEPLUG_ACME_MARKER__ENABLED": "0"}
    assert cli("exec", "--", "true", env=row_off, cwd=tmp_path).returncode == 0
    assert cli("check", "--only", "shm.size", "--skip", "acmeplug:acme.marker", env=row_off, cwd=tmp_path).returncode in (0, 1)


def test_a_plugin_whose_import_hangs_leaves_exec_time_for_the_other_checks(tmp_path):
    """Helper-37: the plug-in import bound (5 s) was all of exec's default budget (5 s), so
    one such plug-in meant 'nothing verified' on every start. It gets half of it now."""
    site = _site(tmp_path, "hangplug", "import time\ntime.sleep(600)\n", "[envdoctor.checks]\nhang.import = hangplug:CHECK\n")
    report = tmp_path / "r.json"
    started = time.monotonic()
    proc = cli("exec", "--report", str(report), "--", "true", env={"PYTHONPATH": str(site)}, timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rows = {r["check"]: r for r in json.loads(report.read_text())["results"]}
    assert rows["shm.size"]["status"] in ("ok", "warn", "fail"), rows["shm.size"]  # verified, not cut off
    assert rows["hang.import"]["status"] == "error", rows
    assert re.search(r"did not finish within 2\.\d+ s \(stuck at hangplug.py:2", rows["hang.import"]["summary"]), rows
    assert took < 5 + 3, took  # within exec's bound, not past it


def test_nothing_a_plugin_started_outlives_serve_once(tmp_path):
    """Helper-37: `serve --once` (cron, a Slurm epilog) left the hung tool a timed-out
    check waited on, and a plug-in's double-forked daemon, as orphans of PID 1; a
    cron job piled them up run after run."""
    seconds = str(300000 + os.getpid() % 100000)
    site = _site(tmp_path, "leaky", _LEAVES_PROCESSES.replace("{seconds}", seconds),
                 "[envdoctor.checks]\nleaky.hung_tool = leaky:HUNG\nleaky.daemon = leaky:DAEMON\n")
    try:
        proc = cli("serve", "--once", "--textfile", str(tmp_path / "node.prom"), env={"PYTHONPATH": str(site)}, timeout=90)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert 'check="leaky.hung_tool"' in (tmp_path / "node.prom").read_text()
        _assert_gone_soon(seconds)
    finally:
        for pid in _sleepers(seconds):
            os.kill(pid, 9)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGQUIT"])
def test_the_hung_tool_of_a_plugins_check_ends_with_the_serve_daemon(tmp_path, stop):
    """The daemon adopts no orphans (it runs for weeks), but the children its checks
    started (a tool a timed-out check still waits on) go when it stops. Helper-39: on
    SIGQUIT it died at the signal's default action and they ran on; now they go first,
    and it still dies by SIGQUIT."""
    import signal

    from serve_support import Serve

    seconds = str((200000 if stop == "SIGTERM" else 100000) + os.getpid() % 100000)
    site = _site(tmp_path, "leaky", _LEAVES_PROCESSES.replace("{seconds}", seconds),
                 "[envdoctor.checks]\nleaky.hung_tool = leaky:HUNG\n")
    serve = Serve("--interval", "1", env={"PYTHONPATH": str(site)},
                  command=["sh", "-c", 'ulimit -c 0; trap - QUIT; exec "$0" "$@"', sys.executable, "-m", "envdoctor"])
    try:
        deadline = time.monotonic() + 30
        while not _sleepers(seconds) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sleepers(seconds), "the check never started its tool"
        sig = getattr(signal, stop)
        assert serve.stop(sig) == (0 if sig == signal.SIGTERM else -sig)
        _assert_gone_soon(seconds)
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
        for pid in _sleepers(seconds):
            os.kill(pid, 9)


_ALIASED = '''
from envdoctor.check import Check
from envdoctor.export import Exporter
from envdoctor.model import ok

CHECK = Check(id="alias.real", title="registered twice", run=lambda ctx: ok("ran"))
EXPORTER = Exporter(name="tsv", render=lambda report, options: "tsv\\n", content_type="text/plain", extension="tsv")
'''


def test_two_names_for_one_object_are_two_entry_points(tmp_path):
    """Helper-37: entry points were told apart by their value only, so a format's alias
    (`tsv` and `tab` naming one EXPORTER) lost a name without a word, and a check under two
    names gave one row and no sign of the second."""
    site = _site(tmp_path, "aliased", _ALIASED, "[envdoctor.exporters]\ntsv = aliased:EXPORTER\ntab = aliased:EXPORTER\n"
                 "[envdoctor.checks]\nalias.real = aliased:CHECK\nalias.other = aliased:CHECK\n")
    env = {"PYTHONPATH": str(site)}
    for fmt in ("tsv", "tab"):
        proc = cli("check", "--only", "shm.size", "-f", fmt, env=env)
        assert proc.returncode in (0, 1) and proc.stdout == "tsv\n", (fmt, proc.stderr)
    rows = {r["check"]: r for r in json.loads(cli("check", "-f", "json", env=env).stdout)["results"]}
    assert rows["alias.real"]["status"] == "ok"
    (second,) = [r for check_id, r in rows.items() if check_id.endswith("alias.real") and check_id != "alias.real"]
    assert second["status"] == "error" and "already provided" in second["summary"], second


_ODD_FACTS = r'''
from envdoctor.check import Check, Metric
from envdoctor.model import Finding, Result, Status, verdict

EVERYWHERE = ("check", "exec", "serve")
ODD = (Metric(name="odd_value", fact="val", help="h"), Metric(name="odd_labelled", fact="lab", help="h", label="k"))
LOOP = {}
LOOP["me"] = LOOP
SHARED_LIST = [1, 2]

def _facts(facts):
    return lambda ctx: Result(Status.OK, "odd facts", "", facts)

def _env(env):
    return lambda facts, settings: verdict([Finding(Status.WARN, "needs a variable", "set it", env=env)], facts, "fine")

NESTED_KEY = Check(id="odd.nested_key", title="t", run=_facts({"links": {("gpu0", "gpu1"): "NVLink"}}), modes=EVERYWHERE)
LOOPED = Check(id="odd.loop", title="t", run=_facts(LOOP), modes=EVERYWHERE)
HUGE = Check(id="odd.huge", title="t", run=_facts({"x": 10 ** 5000}), modes=EVERYWHERE)
METRIC = Check(id="odd.metric", title="t", run=_facts({"val": 10 ** 400}), metrics=ODD, modes=EVERYWHERE)
LABELS = Check(id="odd.labels", title="t", run=_facts({"lab": {"a": 1, 2: 3}}), metrics=ODD, modes=EVERYWHERE)
SURROGATE = Check(id="odd.surrogate", title="t", gather=lambda ctx: {}, judge=_env({"EVIL_S": "\ud800"}), modes=EVERYWHERE)
SPACE = Check(id="odd.space", title="t", gather=lambda ctx: {}, judge=_env({"A B": "1"}), modes=EVERYWHERE)
SHARED = Check(id="fine.shared", title="t", run=_facts({"a": SHARED_LIST, "b": SHARED_LIST, "n": 10 ** 300, "s": {1, 2}}),
               metrics=ODD, modes=EVERYWHERE)
'''
_ODD_IDS = {"odd.nested_key": "NESTED_KEY", "odd.loop": "LOOPED", "odd.huge": "HUGE", "odd.metric": "METRIC",
            "odd.labels": "LABELS", "odd.surrogate": "SURROGATE", "odd.space": "SPACE", "fine.shared": "SHARED"}


def test_facts_no_reader_can_take_are_that_checks_error_row(tmp_path):
    """Helper-39: a tuple key one level down, facts that hold themselves, an integer JSON
    cannot write, a metric past a float, a lone surrogate or `A B` in a Finding's env:
    each still broke check, serve --once, every run of the daemon (503 for good) and
    exec's whole pre-flight. A plug-in's facts are now walked once, bounded."""
    site = _site(tmp_path, "oddplug", _ODD_FACTS, "[envdoctor.checks]\n" + "".join(
        f"{check_id} = oddplug:{name}\n" for check_id, name in _ODD_IDS.items()))
    env = {"PYTHONPATH": str(site)}
    only = ",".join(["shm.size", *_ODD_IDS])
    for fmt in ("json", "prometheus", "text"):
        proc = cli("check", "--only", only, "-f", fmt, env=env)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (fmt, proc.stderr)
    rows = {r["check"]: r for r in json.loads(cli("check", "--only", only, "-f", "json", env=env).stdout)["results"]}
    for check_id in _ODD_IDS:
        if check_id.startswith("odd."):
            assert rows[check_id]["status"] == "error", rows[check_id]
            assert rows[check_id]["summary"].startswith("check returned a malformed Result: "), rows[check_id]
    assert rows["fine.shared"]["status"] == "ok" and rows["shm.size"]["status"] != "error", rows  # shared, not a loop
    proc = cli("serve", "--once", "--textfile", str(tmp_path / "n.prom"), env=env)
    assert proc.returncode == 0 and 'check="odd.loop"' in (tmp_path / "n.prom").read_text(), proc.stderr
    report = tmp_path / "r.json"
    proc = cli("exec", "--fix", "--report", str(report), "--", "true", env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rows = {r["check"]: r for r in json.loads(report.read_text())["results"]}
    assert rows["odd.surrogate"]["status"] == "error" and rows["shm.size"]["status"] != "error", rows


def test_a_broken_plugin_named_by_only_keeps_its_error_row_where_the_file_skips_it(tmp_path):
    """Helper-51: after --only began to beat the config's skip (0b99d52), a broken plug-in
    named by --only and skipped in envdoctor.toml lost its error row in `check` (an empty
    report, exit 0) and exec refused the selection: the failure rows were still chosen with
    the old skip set. Both now run it and show the plug-in's error."""
    site = _site(tmp_path, "hwb", "", "[envdoctor.checks]\nhwb.broken = hwb_missing_module:CHECK\n")
    (tmp_path / "envdoctor.toml").write_text('skip = ["hwb.broken"]\n')
    env = {"PYTHONPATH": str(site)}
    proc = cli("check", "--only", "hwb.broken", "-f", "json", env=env, cwd=tmp_path)
    rows = json.loads(proc.stdout)["results"]
    assert proc.returncode == 1 and [r["status"] for r in rows] == ["error"], (proc.returncode, proc.stdout, proc.stderr)
    started = cli("exec", "--only", "hwb.broken", "--", sys.executable, "-c", "print('started')", env=env, cwd=tmp_path)
    assert started.returncode == 0 and started.stdout.strip() == "started", started.stderr
    assert "error" in started.stderr and "hwb" in started.stderr, started.stderr
    skipped = cli("check", "--only", "hwb.broken", "--skip", "hwb.broken", env=env, cwd=tmp_path)
    assert skipped.returncode == 2, skipped.stderr  # the command line's own --skip still wins


def test_a_beat_arms_both_deadlines_and_disarm_clears_them():
    """The dump's deadline counts the process's CPU (ITIMER_PROF), the backstop's real time
    (ITIMER_REAL); leaving the command gives both back, and SIGPROF's handler with them."""
    import signal

    from envdoctor import deadman

    if signal.getsignal(signal.SIGALRM) != signal.SIG_DFL or signal.getsignal(signal.SIGPROF) != signal.SIG_DFL:
        pytest.skip("SIGALRM or SIGPROF has a handler in this test process")
    try:
        deadman.beat()
        cpu, _ = signal.getitimer(signal.ITIMER_PROF)
        real, _ = signal.getitimer(signal.ITIMER_REAL)
    finally:
        deadman.disarm()
    assert deadman.WEDGED_SECONDS - 1 < cpu <= deadman.WEDGED_SECONDS + 0.1  # rounded up to a clock tick
    assert deadman.BACKSTOP_SECONDS - 1 < real <= deadman.BACKSTOP_SECONDS
    assert signal.getitimer(signal.ITIMER_PROF)[0] == 0 and signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_a_longer_backstop_is_kept_by_refresh_and_nothing_is_armed_after_disarm():
    """serve's idle main thread beats once a minute, with the backstop that much further
    (helper-105: an idle daemon stopped for 255 s died of SIGALRM); a connection's
    refresh keeps that backstop, and after disarm (the daemon stopping) arms nothing."""
    import signal

    from envdoctor import deadman

    if signal.getsignal(signal.SIGALRM) != signal.SIG_DFL or signal.getsignal(signal.SIGPROF) != signal.SIG_DFL:
        pytest.skip("SIGALRM or SIGPROF has a handler in this test process")
    longer = deadman.BACKSTOP_SECONDS + 60
    try:
        deadman.beat(longer)
        deadman.refresh()
        real, _ = signal.getitimer(signal.ITIMER_REAL)
    finally:
        deadman.disarm()
    assert longer - 1 < real <= longer
    deadman.refresh()
    assert signal.getitimer(signal.ITIMER_PROF)[0] == 0 and signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_the_deadman_leaves_a_sigprof_someone_else_uses_and_keeps_its_backstop():
    """A sampling profiler's SIGPROF handler and timer are not taken over; the real-time
    backstop is armed all the same (with no dump, a wedge still ends)."""
    import signal

    from envdoctor import deadman

    if signal.getsignal(signal.SIGALRM) != signal.SIG_DFL or signal.getsignal(signal.SIGPROF) != signal.SIG_DFL:
        pytest.skip("SIGALRM or SIGPROF has a handler in this test process")
    samples = []
    signal.signal(signal.SIGPROF, lambda *_: samples.append(1))
    signal.setitimer(signal.ITIMER_PROF, 1000.0)
    try:
        deadman.beat()
        cpu, _ = signal.getitimer(signal.ITIMER_PROF)
        real, _ = signal.getitimer(signal.ITIMER_REAL)
        deadman.disarm()
        after, _ = signal.getitimer(signal.ITIMER_PROF)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        deadman.disarm()
    assert cpu > deadman.WEDGED_SECONDS + 900 and after > deadman.WEDGED_SECONDS + 900  # the profiler's, untouched
    assert deadman.BACKSTOP_SECONDS - 1 < real <= deadman.BACKSTOP_SECONDS


def test_a_serve_stopped_longer_than_the_deadline_goes_on_when_continued(tmp_path):
    """Helper-89: `kill -STOP` (as docker pause, a cgroup freeze or a debugger stops it) for
    more than WEDGED_SECONDS, and on SIGCONT the deadman's wall-clock watchdog found its
    deadline gone and ended a healthy daemon with every stack. A stopped process spends no
    CPU, which is what the deadline counts now: it answers again and stops cleanly."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from envdoctor.deadman import WEDGED_SECONDS

    env = dict(os.environ)
    env.pop("ENVDOCTOR_CONFIG", None)
    log = tmp_path / "serve.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "envdoctor", "serve", "--web.listen-address", "127.0.0.1:0",
                                 "--interval", "2"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            for line in log.read_text().splitlines():  # the "listening" line names the port
                if "msg=listening" in line:
                    port = line.split("address=")[1].split()[0].rsplit(":", 1)[1]
        assert port, f"serve never listened: {log.read_text()[-1000:]}"
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(WEDGED_SECONDS + 5)
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(3)
        assert proc.poll() is None, f"ended after the stop, status {proc.returncode}: {log.read_text()[-1500:]}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert answer.status == 200
        proc.terminate()
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


_PRINTS = '''
import os
from envdoctor.check import Check
from envdoctor.model import ok

print("NOISE AT IMPORT")


def _run(ctx):
    print("NOISE FROM A CHECK")
    os.write(1, b"RAW NOISE ON FD 1\\n")
    return ok("printed")


CHECK = Check(id="noisy.print", title="prints", run=_run, modes=("check", "serve", "exec"))
'''


def test_what_a_plugin_prints_stays_out_of_the_report_and_the_jobs_output(tmp_path):
    """helper-85: a plug-in's print() at import or in its check, or a write to descriptor 1,
    landed inside `check -f json` (which no longer parsed), `-f prometheus`, `serve --once`'s
    exposition, and the job's own stdout under exec. It goes to stderr."""
    import json
    import os
    import subprocess
    import sys

    site = _site(tmp_path, "noisyplug", _PRINTS, "[envdoctor.checks]\nnoisy.print = noisyplug:CHECK\n")
    env = {"PYTHONPATH": str(site)}
    out = cli("check", "--only", "noisy.print,shm.size", "-f", "json", env=env)
    assert [r["check"] for r in json.loads(out.stdout)["results"]] == ["noisy.print", "shm.size"], out.stdout[:300]
    assert "NOISE AT IMPORT" in out.stderr and "NOISE FROM A CHECK" in out.stderr and "RAW NOISE ON FD 1" in out.stderr
    out = cli("check", "--only", "noisy.print", "-f", "prometheus", env=env)
    assert out.stdout.startswith("# HELP") and "NOISE" not in out.stdout, out.stdout[:200]
    out = cli("serve", "--once", env={**env, "ENVDOCTOR_ONLY": "noisy.print,shm.size"})
    assert out.returncode == 0 and out.stdout.startswith("# HELP") and "NOISE" not in out.stdout, out.stdout[:200]
    job = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--only", "noisy.print", "--", "echo", "JOB OUTPUT"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert job.returncode == 0 and job.stdout == "JOB OUTPUT\n", (job.stdout, job.stderr[-500:])


def test_a_plugin_that_crashes_the_interpreter_is_named_by_its_stack(tmp_path):
    """helper-85: a plug-in check that segfaults (its C code) ended `check` with status 139 and
    nothing on stderr. The crash now leaves every thread's stack, naming the plug-in."""
    module = _WEDGED.replace('re.match(r"(a+)+$", "a" * 40 + "b")  # hours inside _sre, holding the interpreter lock',
                             "import ctypes; ctypes.string_at(0)  # reads address 0: SIGSEGV")
    site = _site(tmp_path, "crashplug", module, "[envdoctor.checks]\nwedge.regex = crashplug:CHECK\n")
    proc = cli("check", "--only", "wedge.regex", env={"PYTHONPATH": str(site)})
    assert proc.returncode == -11, (proc.returncode, proc.stderr[-1000:])
    assert "Fatal Python error: Segmentation fault" in proc.stderr and "crashplug.py" in proc.stderr, proc.stderr[-2000:]


def test_what_a_plugin_prints_stays_out_with_stderr_closed_too(tmp_path):
    """helper-87: with stderr closed, the copy of stdout took number 2, and what plug-ins printed
    went into `serve --once`'s exposition and the job's output again. It is dropped."""
    import os
    import subprocess
    import sys

    site = _site(tmp_path, "noisyplug", _PRINTS, "[envdoctor.checks]\nnoisy.print = noisyplug:CHECK\n")
    env = {**os.environ, "PYTHONPATH": str(site), "ENVDOCTOR_ONLY": "noisy.print,shm.size"}
    env.pop("ENVDOCTOR_CONFIG", None)
    once = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, timeout=120, text=True, pass_fds=(), close_fds=True,
                          preexec_fn=lambda: os.close(2))
    assert once.returncode == 0 and once.stdout.startswith("# HELP") and "NOISE" not in once.stdout, once.stdout[:200]
    env.pop("ENVDOCTOR_ONLY")
    job = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--only", "noisy.print", "--", "echo", "JOB"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=120, text=True,
                         preexec_fn=lambda: os.close(2))
    assert job.returncode == 0 and job.stdout == "JOB\n", job.stdout
