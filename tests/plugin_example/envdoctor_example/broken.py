"""A plug-in module that cannot be imported."""

import envdoctor_example_missing_dependency  # noqa: F401  (does not exist)
