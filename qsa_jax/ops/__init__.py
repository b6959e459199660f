"""One folder per operator: ``api.py`` (entry point), ``base.py`` (checks and
shared pieces), then one module per implementation (``xla.py``, ``pallas.py``,
``triton.py``)."""
