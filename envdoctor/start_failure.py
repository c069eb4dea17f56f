"""When envdoctor cannot run because a module of the job's has taken a name it imports.

The job's PYTHONPATH is envdoctor's interpreter's too (so is the working directory under
`python -m`), and a `json.py` or `signal.py` in the job's folder is imported in place of
the standard library's: envdoctor broke with a traceback and exec never started the job
(helper-117). Such a failure is said in one line naming the file; `exec` then starts its
command unchecked, as when the pre-flight cannot finish in time (`--strict`: 78), and any
other command leaves with 70 (EX_SOFTWARE).

Only a failure a shadowing module caused is taken here: any other exception is envdoctor's
own bug, and keeps its traceback (helper-119: a daemon's failure hours in was called
"cannot start"). What runs here imports nothing but builtin modules, which a folder on the
path cannot replace: the module that broke envdoctor may be any one of the others.
"""

from __future__ import annotations

import os
import sys

EXIT_SOFTWARE = 70  # sysexits.h: an internal software error
EXIT_STRICT = 78
EXIT_USAGE = 2
EXIT_NOT_FOUND, EXIT_CANNOT_EXECUTE = 127, 126
# what envdoctor imports besides the standard library (its dependencies, by import name)
DEPENDENCIES = frozenset(("typer", "click", "rich", "psutil", "pynvml", "prometheus_client", "bcrypt", "yaml",
                          "shellingham", "typing_extensions", "markdown_it", "mdurl", "pygments", "onnx", "onnxruntime",
                          "numpy", "torch"))
# Python's C locale coercion (PEP 538): what it writes into LC_CTYPE when none was set
_COERCED_LOCALES = ("C.UTF-8", "C.utf8", "UTF-8")


def shadowing_module(exc: BaseException) -> str | None:
    """'FILE, in FOLDER' for the module that took a name envdoctor imports, when `exc` is
    its doing (it raised, or is in sys.modules under that name); else None."""
    early = _folders_before_the_standard_library()
    if not early:
        return None
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = []
    named = getattr(exc, "obj", None)  # AttributeError: module 'json' has no attribute 'dumps'
    if isinstance(exc, AttributeError) and isinstance(getattr(named, "__file__", None), str):
        files.append(named.__file__)
    if isinstance(exc, ImportError) and isinstance(exc.path, str):  # cannot import name 'warn' from 'warnings' (PATH)
        files.append(exc.path)
    seen, pending = set(), [exc]
    while pending:  # the exception, and what it was raised from or during
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            files.append(tb.tb_frame.f_code.co_filename)
            tb = tb.tb_next
        filename = getattr(e, "filename", None)  # a SyntaxError in the module
        if isinstance(filename, str):
            files.append(filename)
        pending.extend((e.__cause__, e.__context__))
    # imported, then failing on a missing name (json.dumps); not for a SystemExit, which a
    # command's own end raises: only one the module itself raised (above) is its doing
    loaded = () if isinstance(exc, SystemExit) else (*sys.stdlib_module_names, *DEPENDENCIES)
    for name in loaded:
        module = sys.modules.get(name)
        filename = getattr(module, "__file__", None) if module is not None else None
        if isinstance(filename, str):
            files.append(filename)
    for filename in files:
        found = _shadow(os.path.abspath(filename), early, own)
        if found is not None:
            return found
    return None


def _folders_before_the_standard_library() -> list[str]:
    """The path's folders searched before the standard library's: where a module can take its names."""
    stdlib = os.path.dirname(os.path.abspath(os.__file__))
    early = []
    for entry in sys.path:
        folder = os.path.abspath(entry or os.curdir)
        if folder == stdlib or folder.endswith(".zip"):
            break
        early.append(folder)
    return early


def _shadow(filename: str, early: list[str], own: str) -> str | None:
    """'FILE, in FOLDER' when `filename` is a top-level module (FOLDER/NAME.py, or a package's
    FOLDER/NAME/__init__.py) of one of `early`, named as one envdoctor imports."""
    folder, base = os.path.split(filename)
    name = base[:-3] if base.endswith(".py") else None
    if base == "__init__.py":
        folder, name = os.path.split(folder)
    if name is None or folder not in early or os.path.join(folder, name) == os.path.join(own, "envdoctor"):
        return None
    import _imp  # builtin

    if name in sys.builtin_module_names or _imp.is_frozen(name):
        return None  # found before any folder is searched: a file of that name replaces nothing
    if name in sys.stdlib_module_names or (name in DEPENDENCIES and _found_after(name, folder)):
        return f"{filename}, in {folder}"
    return None


def _found_after(name: str, folder: str) -> bool:
    """Whether a later folder of the path holds `name` too: a dependency installed on
    PYTHONPATH (pip --target) is the dependency itself, not a module that took its name."""
    later = False
    for entry in sys.path:
        here = os.path.abspath(entry or os.curdir)
        if later and (os.path.isfile(os.path.join(here, name + ".py"))
                      or os.path.isfile(os.path.join(here, name, "__init__.py"))):
            return True
        later = later or here == folder
    return False


def leave(exc: BaseException) -> int | None:
    """The exit status for `exc`, said in one line, when a shadowing module caused it (for
    `exec`, after starting its command unchecked: then never returns); None otherwise (the
    caller raises it again)."""
    shadow = shadowing_module(exc)
    if shadow is None:
        return None
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    reason += f" (from {shadow}: a module named like one envdoctor imports)"
    args = sys.argv[1:]
    line = exec_line(args)
    _end_what_was_started()
    if line is None:
        _say(f"envdoctor: cannot run: {reason}")
        return EXIT_SOFTWARE
    strict, job = line
    if not job:
        _say(f"envdoctor: cannot run: {reason}; and exec was given no command")
        return EXIT_USAGE
    if strict:
        _say(f"envdoctor: cannot run: {reason}; --strict: not starting {job[0]} unchecked")
        return EXIT_STRICT
    _say(f"envdoctor: cannot run: {reason}; starting {job[0]} unchecked")
    return _become(job)


def exec_line(args: list[str]) -> tuple[bool, list[str]] | None:
    """(--strict given, the command) of an `exec` line (with or without `--`), or None for
    any other command and for `exec --help`."""
    if args[:1] != ["exec"]:
        return None
    try:
        from envdoctor.plain_argv import EXEC, FLAG
    except Exception:  # noqa: BLE001 - the fallback must not break: every option is then taken as a flag
        EXEC, FLAG = {}, "flag"
    strict, i = False, 1
    while i < len(args):
        word = args[i]
        if word == "--":
            return strict, args[i + 1:]
        if word in ("-h", "--help"):
            return None
        if not word.startswith("-") or word == "-":
            return strict, args[i:]
        strict = strict or word == "--strict"
        if "=" not in word and word in EXEC and EXEC[word][1] != FLAG:
            i += 1  # its value
        i += 1
    return strict, []


def _end_what_was_started() -> None:
    """The pre-flight child (exec's head start) and any probe: killed and reaped, so none
    is left beside the job, or as a zombie under it."""
    stopping = sys.modules.get("envdoctor.stopping")
    headstart = sys.modules.get("envdoctor.exec_headstart")
    try:
        if headstart is not None:
            headstart.abandon()
        # stopping's kill imports envdoctor.forked, and an import now could run the job's
        # module a second time (it failed, so it is not in sys.modules): only if already there
        if stopping is not None and "envdoctor.forked" in sys.modules:
            ours = [pid for pid in stopping.children_of(os.getpid()) if pid not in (stopping.inherited_children or ())]
            stopping.kill_everything_started()
            for pid in ours:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
    except BaseException:  # noqa: B036 - a module of ours broken too, or its SystemExit: nothing of it was started
        pass


def _become(job: list[str]) -> int:
    """execve `job` with the environment envdoctor was given; the status when it cannot be."""
    import _signal  # builtin: no folder can replace it

    for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores them; the job gets the defaults, as exec gives them
        if hasattr(_signal, name):
            _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
    path = _resolve(job[0])
    if path is None:
        _say(f"envdoctor: {job[0]}: command not found")
        return EXIT_NOT_FOUND
    from envdoctor.program import flush_standard_streams

    flush_standard_streams()
    try:
        os.execve(path, job, _as_invoked(dict(os.environ)))
    except OSError as err:
        _say(f"envdoctor: cannot run {path}: {err.strerror or err}")
        return EXIT_NOT_FOUND if err.errno == 2 else EXIT_CANNOT_EXECUTE
    return EXIT_CANNOT_EXECUTE  # not reached: execve returns only by raising


def _resolve(name: str) -> str | None:
    if "/" in name:
        return name
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or os.curdir, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _as_invoked(env: dict[str, str]) -> dict[str, str]:
    """Without the LC_CTYPE Python's own start wrote (entrypoint._as_invoked, said again here
    with builtins only): the job gets the locale its invoker gave, or none."""
    if env.get("LC_CTYPE") not in _COERCED_LOCALES:
        return env
    try:
        fd = os.open("/proc/self/environ", os.O_RDONLY)
        try:
            data = b""
            while chunk := os.read(fd, 1 << 16):
                data += chunk
        finally:
            os.close(fd)
    except OSError:
        return env
    given = [entry[len(b"LC_CTYPE="):] for entry in data.split(b"\0") if entry.startswith(b"LC_CTYPE=")]
    if not given:
        env.pop("LC_CTYPE", None)
    else:
        env["LC_CTYPE"] = os.fsdecode(given[0])
    return env


def _say(line: str) -> None:
    """One line: a newline in a folder's name or a message is written as \\n."""
    try:
        sys.stderr.write(line.replace("\r", "\\r").replace("\n", "\\n") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # stderr closed or None
        pass
