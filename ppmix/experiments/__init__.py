"""Paper reproductions behind ``ppmix reproduce NAME`` (one module each, registered on import).

A module registers ``run(out_dir, quick) -> dict`` with
:func:`ppmix.experiments.registry.register`; the result dict (also written as JSON with a
figure into ``out_dir``) prints the paper's numbers beside ours.
"""
