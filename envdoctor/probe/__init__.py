"""The torch probe: runs in the target interpreter, never in envdoctor's own process."""
