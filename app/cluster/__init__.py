"""Multi-worker runs: the cluster from TF_CONFIG or an Indexed Job, the worker's server and
the host-side collectives between workers."""
