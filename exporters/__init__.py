"""Output forms, one file per format; installed as envdoctor.exporters."""
