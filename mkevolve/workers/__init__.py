"""Processes that run jobs away from the caller: the pool of trusted workers, the executors over it, GPU
sharing between them, and the hardened one-shot process that runs a candidate's code."""
