"""qsa-jax benchmark: originals (torch + Triton) vs each qsa_jax implementation vs the torch shim.

Run ``python -m bench.run --help``. ``bench.summarize`` renders the README summary table
from a results JSON. See bench/README.md for the method and the byte model.
"""
