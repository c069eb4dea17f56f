"""registry.NOT_IN_EXEC and NOT_IN_SERVE (envdoctor's checks that exec's pre-flight and the
serve daemon do not import) say what each check's own `modes` say, and exec and serve
treat those ids as they did when they imported them: known to the config, refused by
--only with the same reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from exec_log import events
from test_plugin_misbehaviour import _site

from envdoctor import registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("mode", ["exec", "serve"])
def test_the_table_is_every_builtin_check_that_does_not_run_in_the_mode(mode):
    builtins = [ep for ep in registry.entry_points_of(registry.GROUP) if ep.value.startswith(registry.BUILTIN_MODULE_PREFIX)]
    assert len(builtins) >= 13
    not_in_mode = {ep.value: ep.load().id for ep in builtins if not ep.load().runs_in(mode)}
    assert not_in_mode == registry.NOT_IN[mode]


@pytest.mark.parametrize("mode", ["exec", "serve"])
def test_a_load_for_the_mode_imports_none_of_them_and_names_them(mode):
    code = ("import sys\nfrom envdoctor import registry\n"
            f"r = registry.load(for_mode={mode!r})\n"
            "print(sorted(r.not_imported))\n"
            "print(sorted(m for m in sys.modules if m.startswith('envdoctor.checks.')))\n"
            "print(sorted(r.checks))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
                         timeout=60).stdout.splitlines()
    assert eval(out[0]) == sorted(registry.NOT_IN[mode].values())
    imported = eval(out[1])
    assert not [m for m in imported if f"{m}:CHECK" in registry.NOT_IN[mode]], imported
    assert set(eval(out[2])) == {c.id for c in registry.load().checks.values() if c.runs_in(mode)}


def _exec(*args, env=None):
    full = {**os.environ, "PYTHONPATH": REPO, **(env or {})}  # env may give its own PYTHONPATH
    full.pop("ENVDOCTOR_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "envdoctor", "exec", *args], capture_output=True, text=True,
                          env=full, timeout=120, cwd=REPO)


def test_only_naming_one_is_refused_with_the_reason_it_always_had():
    proc = _exec("--only", "onnx.opset,shm.size", "--", "true")
    assert proc.returncode == 2, proc.stderr
    line = events(proc.stderr)[-1]["msg"]
    assert "--only onnx.opset: does not run in exec" in line and "exec runs: cpu.threads" in line, line
    proc = _exec("--", "true", env={"ENVDOCTOR_ONLY": "torch.pin_memory,dist.master_port"})
    assert proc.returncode == 2
    assert "the config's only (or ENVDOCTOR_ONLY) dist.master_port, torch.pin_memory: does not run in exec" \
        in events(proc.stderr)[-1]["msg"]


def test_their_ids_are_known_to_skip_and_to_the_config():
    proc = _exec("--skip", "onnx.opset", "--", "true",
                 env={"ENVDOCTOR_CHECK__ONNX_OPSET__ENABLED": "false", "ENVDOCTOR_CHECK__TORCH_PIN_MEMORY__TIMEOUT": "5"})
    assert proc.returncode == 0, proc.stderr
    assert events(proc.stderr)[-1]["action"] == "start"
    proc = _exec("--only", "onnx.opsett", "--", "true")  # a typo is still a typo
    assert proc.returncode == 2 and "unknown check id 'onnx.opsett'" in proc.stderr


def _ran(tmp_path, *args, env=None):
    marker = tmp_path / "ran"
    marker.unlink(missing_ok=True)
    proc = _exec(*args, "--", "touch", str(marker), env=env)
    return proc, marker.exists()


def test_one_of_them_asked_and_skipped_is_skipped_as_before(tmp_path):
    """helper-61: refused before --skip was applied, exec stopped jobs it used to start."""
    for args, env in ((("--only", "cpu.threads,onnx.opset", "--skip", "onnx.opset"), None),
                      ((), {"ENVDOCTOR_ONLY": "cpu.threads,onnx.opset", "ENVDOCTOR_SKIP": "onnx.opset"}),
                      (("--skip", "onnx.opset"), {"ENVDOCTOR_ONLY": "cpu.threads,onnx.opset"})):
        proc, ran = _ran(tmp_path, "--strict", *args, env=env)
        assert proc.returncode == 0 and ran, (args, env, proc.stderr)
        assert events(proc.stderr)[-1]["checks"] == "1"


def test_a_plugin_asked_beside_one_of_them_is_named_too(tmp_path):
    site = _site(tmp_path, "checkonly", "from envdoctor.check import Check\nfrom envdoctor.model import ok\n"
                 "CHECK = Check(id='acme.checkonly', title='t', run=lambda ctx: ok('fine'), modes=('check',))\n",
                 "[envdoctor.checks]\nacme.checkonly = checkonly:CHECK\n")
    proc, ran = _ran(tmp_path, "--only", "acme.checkonly,onnx.opset", env={"PYTHONPATH": f"{site}:{REPO}"})
    assert proc.returncode == 2 and not ran
    assert "--only acme.checkonly, onnx.opset: does not run in exec" in events(proc.stderr)[-1]["msg"]


@pytest.mark.parametrize("autoload", ["0", "1"])
def test_their_variables_stay_theirs_beside_a_plugin_named_alike(tmp_path, autoload):
    """helper-61: a plug-in entry point `onnx_opset` (left out, or failing to load) and the
    unimported onnx.opset both read as ONNX_OPSET: exec called the variable ambiguous and
    stopped the job; with onnx.opset loaded (check, or exec before) it is the built-in's."""
    site = _site(tmp_path, "alike", "raise ImportError('never loads')\n", "[envdoctor.checks]\nonnx_opset = alike:CHECK\n")
    env = {"PYTHONPATH": f"{site}:{REPO}", "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": autoload,
           "ENVDOCTOR_CHECK__ONNX_OPSET__ENABLED": "0"}
    proc, ran = _ran(tmp_path, env=env)
    assert proc.returncode == 0 and ran, proc.stderr
    assert "names onnx.opset and onnx_opset alike" not in proc.stderr


def test_a_plain_keyboard_interrupt_during_a_builtins_import_stops_the_load(monkeypatch):
    """helper-105: a daemon serve re-executed has Python's own SIGINT handler (a plain
    KeyboardInterrupt, not envdoctor's Interrupted) until it installs its own; a Ctrl-C
    during its registry load became `onnx.opset could not be loaded`, and the daemon went
    on. It is the user's stop, as SIGTERM's Terminated is."""
    from envdoctor.entrypoints import EntryPoint

    def interrupted(self):
        if self.value == "envdoctor.checks.onnx_opset:CHECK":
            raise KeyboardInterrupt
        return real_load(self)

    real_load = EntryPoint.load
    monkeypatch.setattr(EntryPoint, "load", interrupted)
    with pytest.raises(KeyboardInterrupt):
        registry.load(autoload_plugins=False)


SERVE_IMPORTS = r"""
import json, sys
from envdoctor.serve import Daemon, Options
d = Daemon(Options(once=True, config_file=sys.argv[1]))
d.scheduler.run_once()
print(json.dumps(sorted(m for m in sys.modules if m.startswith("envdoctor.checks."))))
"""


def test_the_daemon_imports_no_check_that_never_runs_in_serve_and_its_config_may_still_set_them(tmp_path):
    """serve loads its registry for serve: a check that never runs there is not imported
    (its code stayed resident on every node), and the config that sets it up, in the file
    or the environment, is taken as before; a typo is still refused."""
    cfg = tmp_path / "envdoctor.toml"
    cfg.write_text('[serve]\nselect_env = ["ENVDOCTOR_NO_SUCH_TARGET"]\n\n[check."onnx.opset"]\ntimeout = 5\n')
    env = {**os.environ, "ENVDOCTOR_CHECK__TORCH_PIN_MEMORY__TIMEOUT": "5", "PYTHONPATH": REPO}
    env.pop("ENVDOCTOR_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", SERVE_IMPORTS, str(cfg)], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    imported = json.loads(out.stdout)
    assert "envdoctor.checks.cpu_threads" in imported  # it does load the ones it runs
    assert not [m for m in imported if f"{m}:CHECK" in registry.NOT_IN_SERVE], imported
    textfile = tmp_path / "out.prom"
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(textfile),
                           "--config", str(cfg)], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and "envdoctor_check_status" in textfile.read_text(), proc.stderr
    cfg.write_text('[check."onnx.opsett"]\ntimeout = 5\n')
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(textfile),
                           "--config", str(cfg)], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "onnx.opsett" in proc.stderr, proc.stderr


RELOAD_ONLY = r"""
import json, sys
from pathlib import Path
from envdoctor.serve import Daemon, Options
cfg = Path(sys.argv[1])
cfg.write_text('[serve]\nselect_env = ["ENVDOCTOR_NO_SUCH_TARGET"]\n')
d = Daemon(Options(once=True, config_file=str(cfg)))
rows = []
bogus = '[check."onnx.opset"]\nbogus = 1\ntimeout = "soon"\n'
for only in ('', 'only = ["onnx.opset", "shm.size"]\n', ''):
    cfg.write_text(only + '[serve]\nselect_env = ["ENVDOCTOR_NO_SUCH_TARGET"]\n' + bogus)
    d.scheduler.apply_reload()
    report = json.loads(d.scheduler.run_once().report)
    rows.append({r["check"]: [r["status"], r["summary"]] for r in report["results"]})
    rows[-1]["config_only"] = list(d.scheduler.config.only)
print(json.dumps(rows))
"""


def test_a_config_whose_only_names_one_of_them_gets_its_skip_row_in_serve_at_start_and_on_reload(tmp_path):
    """A config shared with `check` may name, in `only`, a check that never runs in serve:
    each target said why in a skip row when the daemon imported every check, and still
    does, from the start or from a reload (SIGHUP) that brings such an `only`; an `only`
    of such checks alone still runs (it did: the daemon must not refuse to start). The
    check is imported for its row alone: its settings stay unread in serve, reload after
    reload."""
    cfg = tmp_path / "envdoctor.toml"
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("ENVDOCTOR_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", RELOAD_ONLY, str(cfg)], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after, again = json.loads(out.stdout)
    # every reload was taken: a setting of a check serve never runs is read by `check` only,
    # whatever `only` says (helper-110: it was refused again after a reload that named one)
    assert [run["config_only"] for run in (before, after, again)] == [[], ["onnx.opset", "shm.size"], []]
    assert "onnx.opset" not in before and "shm.size" in before and "cpu.threads" in before
    assert set(again) == set(before)
    assert set(after) == {"onnx.opset", "shm.size", "config_only"}, after
    assert after["onnx.opset"][0] == "skip" and after["onnx.opset"][1].startswith("onnx.opset does not run in serve mode (it runs in: check)")
    textfile = tmp_path / "out.prom"
    cfg.write_text('[serve]\nselect_env = ["ENVDOCTOR_NO_SUCH_TARGET"]\n')
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(textfile),
                           "--config", str(cfg)], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**env, "ENVDOCTOR_ONLY": "torch.pin_memory"})
    assert proc.returncode == 0, proc.stderr
    assert 'envdoctor_check_status{check="torch.pin_memory",status="skip",target="node"} 1.0' in textfile.read_text()
