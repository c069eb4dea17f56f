"""An example envdoctor plug-in: how a third party adds checks."""
