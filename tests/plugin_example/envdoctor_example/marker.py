"""example.marker_file: the file named by `path` must exist on the target.

A site might require, say, a mounted dataset's marker file before a run starts.
Fix: mount the volume that provides it.
"""

from envdoctor.check import Check, Metric
from envdoctor.model import fail, ok, warn


def run(ctx):
    path = ctx.config["path"]
    if not path:
        return warn("example.marker_file has no path configured", 'set [check."example.marker_file"] path = "/data/READY"')
    where = ctx.target_path(path)
    if where.exists():
        return ok(f"{path} is present", present=1, size_bytes=where.stat().st_size)
    return fail(f"{path} is missing on {ctx.target.label}", f"mount the volume that provides {path}", present=0)


CHECK = Check(
    id="example.marker_file",
    title="A marker file that must exist before training starts",
    run=run,
    explain=__doc__,
    config={"path": ""},
    metrics=(Metric("example_marker_present", "present", "1 when the marker file exists."),),
)
