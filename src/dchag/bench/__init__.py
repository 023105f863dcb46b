"""The benchmarks' library (benchmarks/*.py are thin scripts over it, and the tests run it):

* :mod:`.timing`: steps timed after a warm-up, interleaved medians, the peak memory of a step,
  the slowest rank's seconds per step;
* :mod:`.procs`: a `dchag` job under GNU time (its peak RSS), torchrun commands, a worker
  killed once and resumed, a part's JSON lines as they come;
* :mod:`.results`: the machine, the exact command, results written as JSON and Markdown;
* :mod:`.stores`: synthetic ERA5 per-year and split stores through the real writers;
* :mod:`.era5jobs`: the preprocessing jobs as the pipeline's rules call them;
* :mod:`.nodes`: the nodes and the step the cost model predicts (the read side's demand);
* :mod:`.fits`: the constants fitted to the committed results (fits.json, read by the package).
"""
