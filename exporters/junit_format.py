"""JUnit XML, so a CI system shows each check as a test case.

One testcase per result. `fail` is a <failure>, `error` an <error>, `skip` a
<skipped> with the reason. JUnit has no "warning": a `warn` is a <failure> when the
run fails on warnings (--fail-on warn), and otherwise a passing case whose
<system-out> carries the warning and its fix, so it is visible but not red.
System facts go in <properties>.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from envdoctor.export import Exporter
from envdoctor.model import Report, Status


def render(report: Report, options) -> str:
    fail_on_warn = options.fail_on == "warn"
    counts = report.counts()
    failures = counts["fail"] + (counts["warn"] if fail_on_warn else 0)
    suites = ET.Element("testsuites", name="envdoctor", tests=str(len(report.results)), failures=str(failures),
                        errors=str(counts["error"]), skipped=str(counts["skip"]), time=f"{report.duration_seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=f"envdoctor {report.target}", tests=str(len(report.results)),
                          failures=str(failures), errors=str(counts["error"]), skipped=str(counts["skip"]),
                          time=f"{report.duration_seconds:.3f}", timestamp=report.started_at, hostname=report.host)
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="envdoctor.version", value=report.version)
    for key, value in report.system.items():
        if value is None or value == {} or value == []:
            continue  # nothing known: no property, rather than value="null"
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        ET.SubElement(properties, "property", name=key, value=text)
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname=f"envdoctor.{r.check.split('.')[0]}", name=r.check,
                             time=f"{r.duration_seconds:.3f}")
        details = r.summary + (f"\nFix: {r.remediation}" if r.remediation else "")
        if r.status is Status.FAIL or (r.status is Status.WARN and fail_on_warn):
            ET.SubElement(case, "failure", message=r.summary, type=r.status.value).text = details
        elif r.status is Status.ERROR:
            ET.SubElement(case, "error", message=r.summary, type="error").text = details
        elif r.status is Status.SKIP:
            ET.SubElement(case, "skipped", message=r.summary)
        elif r.status is Status.WARN:
            ET.SubElement(case, "system-out").text = f"WARN: {details}"
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


EXPORTER = Exporter(name="junit", render=render, content_type="application/xml", extension="xml",
                    help="JUnit XML, one testcase per result (CI dashboards)")
