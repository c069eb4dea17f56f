"""A stderr that nobody reads (a stuck journald, a `tee` that stopped, a pipe whose
reader sleeps) must cost log lines, not the daemon: helper-70 filled serve's stderr
pipe and its runs stopped for good, SIGTERM included, because a blocked write held
the lock every thread logs through. Real pipes, shrunk to one page so that a few
dozen lines fill them."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from serve_support import free_port, get, wait_until

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ from Python 3.10 on Linux; spelled out for older builds


def _small_pipe() -> tuple[int, int]:
    read, write = os.pipe()
    fcntl.fcntl(write, F_SETPIPE_SZ, 4096)
    return read, write


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    return data


def _flood(count: int) -> None:
    """Log `count` lines from a thread; it must be done within a minute, however full the stream."""
    from envdoctor import log

    done = threading.Event()

    def flood() -> None:
        for i in range(count):
            log.event("info", "target appeared", target=f"pid:{i}", comm="python3")
        done.set()

    threading.Thread(target=flood, daemon=True).start()
    assert done.wait(60), "logging blocked on a full stream"


def _flood_then_read(stream, read_fd: int, count: int) -> tuple[bytes, bytes, int]:
    """Log `count` lines into `stream` while nobody reads `read_fd`, then read what was kept,
    log one more line and read that: (kept, after, lines dropped before the reading). Closes
    both ends and resets the log."""
    from envdoctor import log

    log.configure("info", stream)
    try:
        _flood(count)
        dropped = log._dropped
        kept = _drain(read_fd)
        log.event("info", "after the reader came back")
        after = _drain(read_fd)
    finally:
        log.configure("info", None)
        stream.close()
        os.close(read_fd)
    return kept, after, dropped


def test_a_full_stderr_drops_lines_counts_them_and_never_blocks(monkeypatch):
    from envdoctor import log

    read, write = _small_pipe()
    stream = os.fdopen(write, "w")
    monkeypatch.setattr(log, "STALL_SECONDS", 0.05)
    kept, after, _ = _flood_then_read(stream, read, 2000)
    lines = kept.decode().splitlines()
    assert 0 < len(lines) < 2000 and kept.endswith(b"\n")
    assert all(line.startswith("ts=") and "target appeared" in line for line in lines), lines[-3:]
    dropped = 2000 - len(lines)
    first, second = after.decode().splitlines()
    assert f'msg="log lines dropped" count={dropped} reason="stderr was not being read"' in first
    assert 'msg="after the reader came back"' in second


def test_settle_does_not_wait_again_after_a_line_waited_in_vain(monkeypatch):
    """helper-82: exec against a stderr nobody reads waited its patience for its first line,
    then once more in settle() before the job started. After a stall, settle() takes only
    the room there is now: the count is said if the reader came back, else dropped."""
    from envdoctor import log

    read, write = _small_pipe()
    stream = os.fdopen(write, "w")
    monkeypatch.setattr(log, "STALL_SECONDS", 0.05)
    log.configure("info", stream)
    asked = []
    room = log._room
    monkeypatch.setattr(log, "_room", lambda fd, seconds: asked.append(seconds) or room(fd, seconds))
    try:
        _flood(200)  # the pipe fills: lines dropped, the last write found no room
        assert log._stalled and log._dropped
        asked.clear()
        log.settle(30.0)
        assert asked == [0], asked  # looked, did not wait
        assert log._dropped  # still unsaid: nobody reads
        _drain(read)  # the reader comes back
        log.settle(30.0)
        assert b'msg="log lines dropped"' in _drain(read) and not log._dropped
    finally:
        log.configure("info", None)
        stream.close()
        os.close(read)
        log._stalled = False
        log._dropped = 0
        log._torn = False


def test_serve_runs_on_and_stops_on_sigterm_while_nobody_reads_its_stderr(tmp_path):
    tag = f"ENVDOCTOR_STALL_{os.getpid()}"
    cfg = tmp_path / "envdoctor.toml"
    cfg.write_text(f'[serve]\ninterval = 1\nselect_env = ["{tag}"]\n')
    port = free_port()
    read, write = _small_pipe()
    serve = subprocess.Popen([sys.executable, "-m", "envdoctor", "serve", "--config", str(cfg),
                              "--web.listen-address", f"127.0.0.1:{port}"],
                             stdout=subprocess.DEVNULL, stderr=write, env={**os.environ, "ENVDOCTOR_CONFIG": ""})
    os.close(write)
    url = f"http://127.0.0.1:{port}"
    sleepers: list[subprocess.Popen] = []
    try:
        assert wait_until(lambda: _answers(url + "/healthz"), timeout=60)
        sleepers = [subprocess.Popen(["sleep", "300"], env={**os.environ, tag: "1"}) for _ in range(60)]

        def examined() -> int:
            return _metrics(url).count('source="selector"')

        # 60 "target appeared" lines, then 60 "target gone": far past the 4 KiB the pipe holds
        assert wait_until(lambda: examined() == 60, timeout=60), examined()
        for s in sleepers:
            s.kill()
            s.wait()
        assert wait_until(lambda: examined() == 0, timeout=60), "runs stopped while stderr was full"
        assert get(url + "/healthz")[0] == 200
        kept = _drain(read)
        assert kept.endswith(b"\n") and all(line.startswith(b"ts=") for line in kept.splitlines())
        os.set_blocking(read, True)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=10) == 0
        rest = b""
        while chunk := os.read(read, 1 << 16):
            rest += chunk
    finally:
        for s in sleepers:
            s.kill()
            s.wait()
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        os.close(read)
    assert b'msg="log lines dropped"' in rest and b"stderr was not being read" in rest, rest.decode()[-2000:]


def _answers(url: str) -> bool:
    try:
        return get(url, timeout=2)[0] in (200, 503)
    except OSError:
        return False


def _metrics(url: str) -> str:
    try:
        return "\n".join(line for line in get(url + "/metrics", timeout=5)[1].decode().splitlines()
                         if line.startswith("envdoctor_target_info{"))
    except OSError:
        return ""


def test_a_terminal_nobody_reads_drops_lines_and_never_blocks(monkeypatch):
    """helper-73: on a terminal, poll() says writable while any room is left, so a blocking
    write of a whole line still slept in the tty driver, holding the log's lock (serve
    hung, SIGTERM included). Lines go through a non-blocking copy of the descriptor."""
    import pty

    from envdoctor import log

    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w")
    monkeypatch.setattr(log, "STALL_SECONDS", 0.05)
    kept, after, dropped = _flood_then_read(stream, master, 3000)
    assert dropped > 0
    lines = kept.decode().replace("\r\n", "\n").splitlines()
    assert lines and all(line.startswith("ts=") for line in lines if line), lines[-3:]
    said = after.decode().replace("\r\n", "\n").splitlines()
    said = [line for line in said if line]
    assert f'msg="log lines dropped" count={dropped} reason="stderr was not being read"' in said[0], said
    assert 'msg="after the reader came back"' in said[-1], said


def test_a_full_disk_costs_lines_counted_and_never_a_torn_one(tmp_path):
    """helper-73: a short write and then ENOSPC left half a line, the next glued to it
    (`target=pid:22ts=...`), and the lost lines were not counted. A 16 KiB tmpfs in a
    private mount namespace: filled, logged into, emptied, logged into again."""
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare: a tmpfs of its own")
    code = (
        "import os, sys\n"
        "from envdoctor import log\n"
        "d = sys.argv[1]\n"
        "filler = os.path.join(d, 'filler')\n"
        "with open(filler, 'wb') as f: f.write(b'\\0' * 8192)\n"
        "stream = open(os.path.join(d, 'err.log'), 'w')\n"
        "log.configure('info', stream)\n"
        "for i in range(400): log.event('info', 'target appeared', target=f'pid:{i}', comm='python3')\n"
        "os.remove(filler)\n"
        "log.event('info', 'after the disk had room')\n"
        "print(open(os.path.join(d, 'err.log')).read(), end='')\n")
    script = f'mount -t tmpfs -o size=16k tmpfs "$1" && exec "{sys.executable}" -c "$2" "$1"'
    out = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(tmp_path), code],
                         capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    if out.returncode != 0 and "unshare" in out.stderr:
        pytest.skip(f"no mount namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines and all(line.startswith("ts=") and line.count(" level=") == 1 for line in lines), lines
    lost = [line for line in lines if 'msg="log lines dropped"' in line]
    assert len(lost) == 1 and 'reason="No space left on device"' in lost[0], lines[-3:]
    kept = sum('msg="target appeared"' in line for line in lines)
    assert kept + int(lost[0].split("count=")[1].split()[0]) == 400
    assert lines[-1].endswith('msg="after the disk had room"')


def test_a_copy_someone_else_closed_is_forgotten_never_written_through_nor_closed(tmp_path):
    """helper-77: a program may close descriptors it did not open (a daemon's closerange); the
    log's copy number then named the program's next file, and log lines went into it, or
    changing stderr closed it; with the number not reused, logging went silent for good."""
    import subprocess
    import sys

    victim = tmp_path / "victim.txt"
    code = textwrap.dedent(f"""
        import os
        from envdoctor import log
        read, write = os.pipe(); os.dup2(write, 2); os.close(write)
        log.event("info", "one")
        os.close(log._copy[1])                       # closed by the program...
        victim = os.open({str(victim)!r}, os.O_WRONLY | os.O_CREAT, 0o644)   # ...and its number reused
        log.event("info", "two")
        os.set_blocking(read, False)
        said = os.read(read, 65536).decode()
        os.close(log._copy[1])                       # closed again, not reused; then stderr changes
        again, write = os.pipe(); os.dup2(write, 2); os.close(write)
        log.event("info", "three")
        os.set_blocking(again, False)
        os.write(victim, b"")                        # still open: the log did not close it
        print(said.count("ts="), os.read(again, 65536).decode().count("msg=three"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "1"], out.stdout
    assert victim.read_text() == ""


def test_exec_waits_for_a_slow_reader_before_the_job_starts(tmp_path):
    """helper-77: with a stderr pipe full and its reader 2 s behind, exec dropped its verdict
    and its `starting` line after 0.25 s and became the job: nothing could say so later.
    exec's lines wait up to entrypoint.LOG_PATIENCE_SECONDS."""
    import subprocess
    import sys
    import time

    read, write = _small_pipe()
    os.write(write, b"x" * 4096)  # full before exec says anything
    job = subprocess.Popen([sys.executable, "-m", "envdoctor", "exec", "--only", "cpu.threads", "--",
                            sys.executable, "-c", "import sys; sys.stderr.write('job ran\\n')"],
                           stdout=subprocess.DEVNULL, stderr=write,
                           env={**os.environ, "OMP_NUM_THREADS": "abc", "ENVDOCTOR_CONFIG": ""})
    os.close(write)
    try:
        time.sleep(2)  # the reader comes back late
        said = b""
        while chunk := os.read(read, 65536):
            said += chunk
        assert job.wait(timeout=60) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        os.close(read)
    text = said[4096:].decode()
    assert "fail cpu.threads" in text and "starting" in text and text.rstrip().endswith("job ran"), text


def test_a_socket_nobody_reads_drops_lines_and_never_blocks(monkeypatch):
    """systemd's StandardError=journal makes stderr a stream socket to journald: a stuck
    journald fills it, and a write to it blocks like a pipe's would."""
    import socket

    from envdoctor import log

    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = os.fdopen(os.dup(ours.fileno()), "w")
    monkeypatch.setattr(log, "STALL_SECONDS", 0.05)
    log.configure("info", stream)
    try:
        _flood(20000)
        assert log._dropped > 0
        theirs.setblocking(False)
        while True:
            try:
                if not theirs.recv(1 << 16):
                    break
            except BlockingIOError:
                break
        log.event("info", "after the reader came back")
        time.sleep(0.1)
        said = theirs.recv(1 << 16).decode()
    finally:
        log.configure("info", None)
        stream.close()
        ours.close()
        theirs.close()
    assert 'msg="log lines dropped"' in said and 'msg="after the reader came back"' in said, said
