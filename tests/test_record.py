"""The value objects that replaced dataclasses keep what callers relied on: keyword and
positional construction with per-instance defaults, equality, repr, replace(), hashing
of the frozen kinds, copy and pickle; and exec's pre-flight no longer imports dataclasses."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import pytest

from envdoctor.check import Check, Metric
from envdoctor.context import Target
from envdoctor.model import Finding, Result, Status

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_defaults_are_fresh_for_each_instance():
    a, b = Result(Status.OK, "one"), Result(Status.OK, "two")
    a.facts["x"] = 1
    assert b.facts == {} and a.fix_env == {} and a.fix_env is not b.fix_env


def test_equality_repr_and_positional_order():
    assert Finding(Status.WARN, "m", "fix") == Finding(status=Status.WARN, message="m", fix="fix", env={})
    assert Finding(Status.WARN, "m") != Finding(Status.FAIL, "m")
    assert repr(Target(7)) == "Target(pid=7, kind='process')"


def test_replace_changes_a_copy_and_refuses_unknown_fields():
    f = Finding(Status.WARN, "m", "fix")
    g = f.replace(fix="other")
    assert (f.fix, g.fix, g.message, type(g)) == ("fix", "other", "m", Finding)
    with pytest.raises(TypeError, match="no field nosuch"):
        f.replace(nosuch=1)


def test_frozen_kinds_hash_by_their_fields():
    assert {Target(3): "a"}[Target(3)] == "a"
    assert hash(Metric("m", "f", "h")) == hash(Metric("m", "f", "h"))
    with pytest.raises(TypeError):  # a mutable field: unhashable, as the frozen dataclass was
        hash(Finding(Status.OK, "m", env={"A": "1"}))


def test_copy_and_pickle_keep_type_and_fields():
    r = Result(Status.FAIL, "s", "fix", {"n": [1, 2]})
    for clone in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert clone == r and type(clone) is Result
    assert copy.deepcopy(r).facts["n"] is not r.facts["n"]


def test_check_still_validates_its_declaration():
    with pytest.raises(ValueError, match="dotted lower-case id"):
        Check(id="Bad Id", title="t", run=lambda ctx: None)
    check = Check(id="a.b", title="t", run=lambda ctx: None)
    assert check.config == {} and check.modes == ("check", "serve", "exec", "inprocess")


def test_exec_preflight_imports_no_dataclasses():
    """What the pre-flight child imports before its first check (exec_headstart._import_ahead)
    and the checks exec runs: dataclasses (and inspect under it) cost ~19 ms a start."""
    code = ("import sys\n"
            "from envdoctor import exec_headstart\n"
            "exec_headstart._import_ahead()\n"
            "from envdoctor import registry\n"
            "for ep in registry.entry_points_of('envdoctor.checks'):\n"
            "    ep.load()\n"
            "print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules))\n")

    def imported() -> str:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    # The first start after an install reads the entry points through importlib.metadata,
    # which imports inspect itself from Python 3.12 on; every later start finds them in
    # envdoctor's cache (envdoctor.entrypoints) and imports neither.
    assert "dataclasses" not in imported()
    assert imported() == "[]"


def test_positional_match_patterns_work():
    match Finding(Status.WARN, "m", "fix"):
        case Finding(Status.WARN, message, fix):
            assert (message, fix) == ("m", "fix")
        case _:
            pytest.fail("no match")


def test_replace_builds_anew_through_init():
    """helper-56: a copied Session kept the environment it had read, and a replaced Check
    skipped its validation; dataclasses.replace ran __init__ for both."""
    from envdoctor.context import Session

    session = Session(env_override={"A": "1"})
    assert session.env == {"A": "1"}
    assert session.replace(env_override={"A": "2"}).env == {"A": "2"}
    assert session.replace(target=Target(1)).target.label == "pid:1"
    check = Check(id="a.b", title="t", run=lambda ctx: None)
    with pytest.raises(ValueError, match="dotted lower-case id"):
        check.replace(id="NOT VALID")
    with pytest.raises(TypeError, match="no field _env"):
        session.replace(_env=None)


def test_equality_is_by_class_and_fields_only():
    from types import SimpleNamespace

    from envdoctor.context import Session

    assert Target() != SimpleNamespace(pid=None, kind="process")
    assert SimpleNamespace(pid=None, kind="process") != Target()

    class Louder(Finding):
        pass

    assert Louder(Status.WARN, "m") != Finding(Status.WARN, "m")
    a, b = Session(env_override={"A": "1"}), Session(env_override={"A": "1"})
    a.env  # noqa: B018 - reads and keeps the environment: state, not a field
    assert a.host is not b.host and a != b  # each made its own host session: fields differ
    shared = Session(env_override={"A": "1"}, host=a.host)
    assert shared == Session(env_override={"A": "1"}, host=a.host)
    with pytest.raises(TypeError):
        hash(Result(Status.OK, "s"))


def test_started_now_is_what_datetime_gave():
    from datetime import datetime, timezone

    from envdoctor.model import started_now

    for _ in range(3):  # a second boundary between the two calls: try again
        before = datetime.now(timezone.utc).isoformat(timespec="seconds")
        ours = started_now()
        if datetime.now(timezone.utc).isoformat(timespec="seconds") == before:
            assert ours == before
            return
    pytest.fail("three second boundaries in a row")


def test_repr_shows_fields_only_and_hides_what_a_class_hides():
    from envdoctor.serve.discovery import TargetInfo
    from envdoctor.serve.webconfig import WebConfig

    web = WebConfig(users={"u": b"$2b$hash"})
    web._ok[b"digest of a password"] = 1.0  # a cache, not a field
    assert "digest" not in repr(web) and "_lock" not in repr(web)
    info = TargetInfo("pid:1", 1, "torch", torch_maps="7f00-7f01 r-xp /venv/torch/lib/libtorch_python.so")
    assert "libtorch" not in repr(info) and repr(info).startswith("TargetInfo(label='pid:1', pid=1")


def test_no_module_of_ours_imports_dataclasses():
    """envdoctor/, checks/ and exporters/ (rich, for the text table, still imports it: a
    third party's business)."""
    import ast
    import glob

    importers = []
    for folder in ("envdoctor", "checks", "exporters"):
        for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True):
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) else [])
                if "dataclasses" in names:
                    importers.append(os.path.relpath(path, REPO))
    assert importers == []
