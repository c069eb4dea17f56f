"""serve works out each target's secrets once, not every run (envdoctor.serve.secrets_memo),
and its answer is always the one redact.secret_values gives for the same environments."""

from __future__ import annotations

import os
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from envdoctor import redact
from envdoctor.serve.secrets_memo import SecretsMemo, digest
from serve_support import assert_each_jobs_secret_masked, runs_over_jobs_with_secrets

OWN = {"PATH": "/usr/bin:/bin", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIK7MDENGbPxRfiCY"}


def test_an_environment_seen_again_is_answered_from_memory_and_a_changed_one_is_not():
    memo = SecretsMemo()
    job = {"HF_TOKEN": "hf_Qz8vN3xT5mK1pL7wR", "OMP_NUM_THREADS": "4", "MY_SETTING": "some-long-value-1"}
    first = memo.secret_values([OWN, job])
    assert first == redact.secret_values([OWN, job]) and memo.worked_out == 1
    memo.next_pass()
    assert memo.secret_values([OWN, dict(job)]) == first and memo.worked_out == 1  # an equal env read again
    changed = {**job, "HF_TOKEN": "hf_another_token_0000"}
    assert memo.secret_values([OWN, changed]) == redact.secret_values([OWN, changed]) and memo.worked_out == 2
    assert "hf_another_token_0000" in memo.secret_values([OWN, changed])
    # the order of the environments matters (a credential is judged against the others' shown values)
    memo.secret_values([job, OWN])
    assert memo.worked_out == 3


def test_an_answer_not_asked_for_in_a_whole_run_is_forgotten():
    memo = SecretsMemo()
    job = {"HF_TOKEN": "hf_Qz8vN3xT5mK1pL7wR"}
    memo.secret_values([OWN, job])
    memo.next_pass()  # the job is still there, but not asked for in this run
    memo.next_pass()
    memo.secret_values([OWN, job])
    assert memo.worked_out == 2


def test_a_callers_list_is_its_own():
    memo = SecretsMemo()
    job = {"HF_TOKEN": "hf_Qz8vN3xT5mK1pL7wR"}
    memo.secret_values([OWN, job]).clear()
    assert "hf_Qz8vN3xT5mK1pL7wR" in memo.secret_values([OWN, job]) and memo.worked_out == 1


def test_answers_are_forgotten_when_the_hosts_public_names_change(monkeypatch):
    """A value equal to the host name is public, not a secret: when the host is renamed (or an
    interface appears) the answers worked out before it may be wrong, and are worked out again."""
    name = f"gpu-node-{os.getpid()}-renamed"
    job = {"MY_SETTING": name}  # an unknown variable's value: a secret, unless it is public anyway
    memo = SecretsMemo()
    assert memo.secret_values([job]) == [name]
    monkeypatch.setattr(redact, "_HOST_PUBLIC", (time.monotonic(), redact.public_host_names() | {name}))
    assert memo.secret_values([job]) == [] == redact.secret_values([job])
    assert memo.worked_out == 2
    # the same names again, as a new object (they are asked of the kernel every 10 s): kept
    monkeypatch.setattr(redact, "_HOST_PUBLIC", (time.monotonic(), frozenset(redact.public_host_names())))
    assert memo.secret_values([job]) == [] and memo.worked_out == 2


def test_digests_tell_apart_environments_that_join_alike():
    pairs = [({"A": "b", "C": "d"}, {"C": "d", "A": "b"}),  # order: a process's environ is a list
             ({"A": "bC"}, {"AbC": ""}), ({"A": "\udcff"}, {"A": "\udcfe"}), ({"A": "é"}, {"A": "e\u0301"}),
             ({}, {"": ""}),
             # helper-111: a NUL inside a name or value (no real environment has one) joined alike
             ({"NOTE": "a\0X", "PATH": "correcthorsebatterystaple"}, {"NOTE": "a", "X\0PATH": "correcthorsebatterystaple"}),
             ({"A\0b": "c"}, {"A": "b\0c"}), ({"A": "b\0c"}, {"A": "b", "c": ""})]
    for one, other in pairs:
        assert digest(one) != digest(other), (one, other)
    assert digest({"A": "b"}) == digest(dict([("A", "b")]))


NAMES = st.sampled_from(["HF_TOKEN", "OMP_NUM_THREADS", "MY_SETTING", "PATH", "DB_PASSWORD", "LOCAL_RANK", "X"])
VALUES = st.sampled_from(["", "1", "4", "hf_Qz8vN3xT5mK1pL7wR", "some-long-value-1", "/usr/bin", "\udcff\udcfe-long-x",
                          "--strict-mode", "hf_Qz8v", "wJalrXUtnFEMIK7MDENGbPxRfiCY"])
ENVS = st.dictionaries(NAMES, VALUES, max_size=5)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(ENVS, min_size=1, max_size=2), st.booleans()), max_size=12))
def test_every_answer_is_what_secret_values_gives(asks):
    """Whatever the environments and the runs between the questions: never a stale answer."""
    memo = SecretsMemo()
    for envs, new_run in asks:
        if new_run:
            memo.next_pass()
        assert memo.secret_values(envs) == redact.secret_values(envs), envs


COUNT_ASKED = """
real = redact.secret_values
def counted_call(envs, **kwargs):
    envs = list(envs)
    if any(env.get("HF_TOKEN") in secrets for env in envs):
        counted.append(1)
    return real(envs, **kwargs)
redact.secret_values = counted_call
"""


def test_serve_works_out_a_jobs_secrets_in_its_first_run_only_and_masks_them_in_every_run(tmp_path):
    runs, pids, secrets = runs_over_jobs_with_secrets(COUNT_ASKED, tmp_path, "SECRETS", runs=3)
    assert [run["counted"] for run in runs] == [2, 0, 0]  # secret_values asked: was 2 every run
    for run in runs:
        assert_each_jobs_secret_masked(run, pids, secrets)


def test_the_first_environment_is_digested_once_while_it_is_the_same_object(monkeypatch):
    """serve passes its own environment first, one dict for a whole run: digested once, not
    once a target; an equal dict made for the next run is digested again (it may differ)."""
    import envdoctor.serve.secrets_memo as secrets_memo

    digested: list[int] = []
    real = secrets_memo.digest
    monkeypatch.setattr(secrets_memo, "digest", lambda env: digested.append(id(env)) or real(env))
    memo = SecretsMemo()
    own = dict(OWN)
    jobs = [{"HF_TOKEN": f"hf_Qz8vN3xT5mK1pL7wR{n}"} for n in range(5)]
    for job in jobs:
        memo.secret_values([own, job])
    assert digested.count(id(own)) == 1 and len(digested) == 6
    own_next_run = dict(OWN)
    memo.secret_values([own_next_run, jobs[0]])
    assert digested.count(id(own_next_run)) == 1 and memo.worked_out == 5
