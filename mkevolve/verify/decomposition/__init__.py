"""Decomposition checks: structure, top-level purity, standalone subproblems, equivalence, shape/init coverage.

The static checks read the files; everything that executes them runs in a worker (`run_checks`). Each
failure carries a reason written for the model that produced the decomposition.

    results        the checks' names, CheckResult and CheckReport
    orchestration  check_decomposition: runs the checks in a worker and reads back the report
    static         structure_problems and top_level_violations: what the files show without running them
    worker         run_checks: imports and runs the problem, the subproblems and the top-level
    signatures     arguments bound to a signature, described by shape/dtype or value
    recording      what the top-level builds and calls, recorded while it runs
    coverage       whether each subproblem's own inputs cover every instantiation and call
"""
