"""Sweeps past one machine: shards from the environment balanced by estimated cell cost
(:mod:`.shards`), claim mode on a shared output folder (:mod:`.claims`) and a Ray backend for drift
(:mod:`.ray_backend`), the fuzz and the bench (:mod:`.ray_jobs`).  Each drift mode runs cells
through :func:`replayssm.validators.jobs.drift.sweep.run_cell`, so a cell's result, checkpoints and provenance
are those of a serial run, and the report built from the cell files is the serial report byte for
byte (docs/scaleout.md)."""
