"""Built-in checks, one file per check id; installed as envdoctor.checks."""
